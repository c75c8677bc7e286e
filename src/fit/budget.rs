//! How `pipeline fit` spends its budget (`docs/fit.md`, "The rule", step 3): a probe
//! bounded in time, early stopping whose patience is counted in passes over the data, the
//! time a converged or dropped candidate leaves going to the leader, then to the candidates
//! the first probe's cut dropped, and a candidate that cannot run kept as a line of the
//! table rather than ending the fit.
//!
//! The planning is pure (the functions take the seconds measured and return steps), so it is
//! tested without a clock; [`select`], [`train_on`] and [`run_dropped`] are the loops that
//! measure and run.

use std::collections::BTreeMap;

use anyhow::Result;

use super::observe::{FitEvent, FitObserver};
use super::options::given_values;
use super::outcome::{CandidateOutcome, CandidateResult, Figures};
use super::plan::{extension_floor, Plan};
use super::rule::{
    affordable, choose, finish, planned_steps, probe, score_probe, selection_seconds, share_steps,
    Candidate, Probed, Scored,
};
use crate::store::catalog::Contended;
use crate::store::identity::Refusal;
use crate::store::workspace::{NoWorkspace, Workspace};

/// What the budget's loops ([`select`], [`train_on`], [`run_dropped`], [`train_trailing`])
/// read besides the rows: the workspace their runs write to, the plan, the fit's seconds so
/// far (`spent`), and what the whole file's ingest will take (`ingest_seconds`), which with
/// a candidate's svd and scoring is its final model's time besides its steps
/// ([`final_seconds`]).
pub struct Spending<'a> {
    pub ws: &'a Workspace,
    pub plan: &'a Plan,
    pub spent: &'a dyn Fn() -> f64,
    pub ingest_seconds: f64,
}

/// Steps the leader may add with `spare` seconds (the budget less what was spent and less
/// the final model of the leader's current steps): each added step is paid twice, once now
/// and once more by the final model, which trains the leader's total. At most `room` (the
/// step cap less the steps trained).
pub fn extension_steps(spare: f64, step_seconds: f64, room: u64) -> u64 {
    planned_steps(spare / 2.0, step_seconds, room)
}

/// The seconds left to plan with once `spent` seconds have gone and `committed` more are
/// owed (the final model, a resumed run's setup): the budget less [`UNPLANNED_SHARE`]
/// ([`Plan::plannable`]), so that the final model's fixed costs, priced by the selection
/// data's, may come out that much dearer on the whole file and the fit still end within
/// its budget.
///
/// [`UNPLANNED_SHARE`]: super::plan::UNPLANNED_SHARE
pub fn spare_seconds(plan: &Plan, spent: f64, committed: f64) -> f64 {
    plan.plannable() - spent - committed
}

/// How much longer a final model's step takes than its candidate's probe measured: the
/// final run reads every training row (a quarter more than the selection's), checkpoints
/// and ends with the bound over all of them. On yahoo_business (2-core VM, release) the
/// final model's 351 steps took 190 ms each against the probe's 174 (1.09), and a
/// five-minute fit planned without the margin ended at 306 s.
pub const FINAL_STEP_MARGIN: f64 = 1.15;

/// The seconds the final model of `steps` steps is expected to take: `fixed` (the whole
/// file's ingest, the winner's svd and its scoring, as measured on the selection data)
/// and its steps at `step_seconds`, with [`FINAL_STEP_MARGIN`].
pub fn final_seconds(fixed: f64, steps: u64, step_seconds: f64) -> f64 {
    fixed + FINAL_STEP_MARGIN * steps as f64 * step_seconds
}

/// The index, in `rows`, of the candidate that trains on: the leader (the rule's choice among
/// the scored rows) when its run can go on, else the best of those whose runs can. None
/// when every run converged or reached the step cap.
pub fn to_train_on(rows: &[Row]) -> Option<usize> {
    best_open(rows, None)
}

/// The index, in `rows`, of the rule's choice among the scored rows whose runs can go on,
/// leaving out row `except`.
fn best_open(rows: &[Row], except: Option<usize>) -> Option<usize> {
    let open: Vec<(usize, &Scored)> = rows
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != except)
        .filter_map(|(i, r)| r.scored().map(|s| (i, s)))
        .filter(|(_, s)| s.can_go_on())
        .collect();
    best_of(&open)
}

/// The index (the first of each pair) of the rule's choice among `scored`.
fn best_of(scored: &[(usize, &Scored)]) -> Option<usize> {
    let refs: Vec<&Scored> = scored.iter().map(|(_, s)| *s).collect();
    choose(&refs).map(|best| scored[best].0)
}

/// The seconds the final model of `s` is expected to take: [`final_seconds`] of its fixed
/// costs (with the whole file's ingest, `ingest_seconds`) and its final steps.
pub fn final_seconds_of(s: &Scored, ingest_seconds: f64) -> f64 {
    final_seconds(
        s.final_fixed_seconds(ingest_seconds),
        s.final_steps(),
        s.step_seconds,
    )
}

/// Whether `s` may be chosen once `spent` seconds have gone: its final model's time was
/// kept for it whenever its run went on (the rule's reserve), or its final model still
/// fits the plannable seconds left. A run that went on in time reserved for another's
/// final model ([`train_trailing`]) is chosen only if the step early stopping found for it
/// can still be trained on every row within the budget.
pub fn fits_its_final(s: &Scored, plan: &Plan, spent: f64, ingest_seconds: f64) -> bool {
    !s.unreserved || spare_seconds(plan, spent, final_seconds_of(s, ingest_seconds)) >= 0.0
}

/// The rule's choice among the scored `rows` once `spent` seconds have gone, as indices
/// into `rows`: the best of those that [`fits_its_final`] (of them all when none does),
/// and the row it was chosen over, when the best of them all is one whose final model no
/// longer fits. None when no row was scored.
pub fn choice(
    rows: &[Row],
    plan: &Plan,
    spent: f64,
    ingest_seconds: f64,
) -> Option<(usize, Option<usize>)> {
    let scored = scored_rows(rows);
    let fits = |s: &Scored| fits_its_final(s, plan, spent, ingest_seconds);
    let best = best_of(&scored)?;
    let fitting: Vec<(usize, &Scored)> = scored.iter().copied().filter(|(_, s)| fits(s)).collect();
    Some(match best_of(&fitting) {
        // The best of them all is passed over exactly when it is not among those that fit.
        Some(chosen) => (chosen, (!fits(scored_at(rows, best))).then_some(best)),
        None => (best, None),
    })
}

/// The scored rows of `rows`, each with its index.
fn scored_rows(rows: &[Row]) -> Vec<(usize, &Scored)> {
    rows.iter()
        .enumerate()
        .filter_map(|(i, r)| r.scored().map(|s| (i, s)))
        .collect()
}

/// The scored row at `i` of `rows`.
fn scored_at(rows: &[Row], i: usize) -> &Scored {
    rows[i].scored().expect("an index of a scored row")
}

/// One line of fit's table: a candidate scored on validation, or one that could not run.
pub enum Row {
    Scored(Box<Scored>),
    /// A candidate whose svd, probe or run failed for a reason of its own, and the first
    /// line of the error.
    Failed {
        candidate: Box<Candidate>,
        reason: String,
    },
}

impl Row {
    pub fn scored(&self) -> Option<&Scored> {
        match self {
            Row::Scored(s) => Some(s),
            Row::Failed { .. } => None,
        }
    }

    /// The row of a candidate that failed with `error`: its first line, which names what
    /// was wrong (the rest is the context the stages add).
    pub fn failed(c: &Candidate, error: &anyhow::Error) -> Row {
        let text = format!("{error:#}");
        Row::Failed {
            candidate: Box::new(c.clone()),
            reason: text.lines().next().unwrap_or("").to_string(),
        }
    }
}

/// Whether `error` is a candidate's own failure (its memory estimate, options its data
/// refuses, a numerical failure), which costs the fit that candidate only. Not its own, and
/// so the end of the fit: an I/O error (the disk, the catalog), a stop asked for, another
/// process holding a lock, a workspace the catalog cannot vouch for.
pub fn is_candidates_own(error: &anyhow::Error) -> bool {
    !error.chain().any(|cause| {
        cause.is::<std::io::Error>()
            || cause.is::<rusqlite::Error>()
            || cause.is::<crate::stop::StoppedOnRequest>()
            || cause.is::<Contended>()
            || cause.is::<Refusal>()
            || cause.is::<NoWorkspace>()
    })
}

/// What the selection loop leaves: a row per candidate that ran, and what the budget's cut
/// decided.
pub struct Selection {
    pub rows: Vec<Row>,
    /// The candidates the cut dropped, in list order: [`run_dropped`] runs them with the
    /// time others leave.
    pub dropped: Vec<Candidate>,
    /// The first probe's seconds (its svd and probe) and seconds a step, by which the cut
    /// was made (None when no probe succeeded).
    pub first_probe: Option<(f64, f64)>,
}

/// Probes and trains each candidate of `list` in turn, as the rule says; the first probe
/// that succeeds decides how many the budget affords (the rest are set aside as
/// [`Selection::dropped`]). A candidate that fails for a reason of its own becomes a
/// [`Row::Failed`]; any other error ends the fit.
///
/// When the cut leaves one candidate and its share of the budget affords it fewer steps
/// than [`super::plan::MIN_EPOCHS`] epochs, it gets no selection run ([`takes_selection_run`]).
/// Its probe is scored on validation (the table's figures and the label frequencies'
/// check), and its final model is given the time left ([`no_selection_steps`]).
pub fn select(
    at: &Spending,
    mut list: Vec<Candidate>,
    observer: &mut dyn FitObserver,
) -> Result<Selection> {
    let (ws, plan) = (at.ws, at.plan);
    let selection_started = std::time::Instant::now();
    let mut selection = Selection {
        rows: Vec::new(),
        dropped: Vec::new(),
        first_probe: None,
    };
    let mut i = 0;
    while i < list.len() {
        let c = list[i].clone();
        let result = (|| -> Result<Scored> {
            let p = probe_in(ws, plan, &c, observer)?;
            if selection.first_probe.is_none() {
                selection.first_probe = Some((p.seconds(), p.step_seconds));
                let step_seconds = cut_step_seconds(p.step_seconds);
                selection.dropped =
                    cut_list(&mut list, i, (p.seconds(), step_seconds), plan, observer);
            }
            // An equal share of the selection time left when this candidate started.
            let in_selection = selection_started.elapsed().as_secs_f64() - p.seconds();
            let share = (selection_seconds(plan.left, list.len()) - in_selection).max(0.0)
                / (list.len() - i) as f64;
            let afforded = share_afforded(share_steps(plan, &p, share).0);
            if !takes_selection_run(list.len(), afforded, plan) {
                return no_selection_run(at, p, afforded, observer);
            }
            finish(ws, plan, p, share)
        })();
        selection.rows.push(row_of(&c, result, plan, observer)?);
        i += 1;
    }
    Ok(selection)
}

/// Whether a candidate whose share affords `afforded` steps, one of `candidates` left in
/// the list, trains a selection run. Always with others to choose between or with fixed
/// steps; a lone candidate only when its share affords [`Plan::needed`] steps
/// ([`super::plan::MIN_EPOCHS`] epochs, or the cap), as every candidate the cut keeps
/// does: a shorter selection run has nothing to choose, is unlikely to converge (its best
/// score and then the patience's epochs), and each of its steps would be paid twice, there
/// and again by the final model. (A lone candidate can fall short of them when the cut
/// kept it as the one that always runs, or when the candidates before it left it less.)
pub fn takes_selection_run(candidates: usize, afforded: u64, plan: &Plan) -> bool {
    candidates > 1 || plan.fixed || afforded >= plan.needed
}

/// The steps a final model may train in `spare` seconds (the budget's plannable seconds
/// less what was spent and the final model's fixed costs) at `step_seconds` a step, with
/// the final step's margin ([`FINAL_STEP_MARGIN`]); at most `ceiling`.
pub fn no_selection_steps(spare: f64, step_seconds: f64, ceiling: u64) -> u64 {
    let steps = (spare / (FINAL_STEP_MARGIN * step_seconds.max(1e-9))).floor();
    (steps.max(0.0) as u64).min(ceiling)
}

/// Gives the time left to the final model of a lone candidate (the only one scored) whose
/// selection run did not converge, and says whether it did. Such a run was still rising on
/// validation when its share ran out: the steps it took are not a step count early
/// stopping found, and going on in selection would pay each step twice (there and in the
/// final model) for nothing else to choose between. Its final model trains the steps the
/// time left affords (at least the run's), as one without a selection run does, and goes
/// on if its steps come out faster. Without this, a share just above the line of
/// [`super::plan::MIN_EPOCHS`] trained about half the final steps of one just below it.
/// With the failpoint `fit-lone-unconverged:1` armed, a lone run that converged counts as
/// one that did not, so that a test on small data sees this path.
pub fn lone_takes_the_time_left(
    at: &Spending,
    rows: &mut [Row],
    observer: &mut dyn FitObserver,
) -> bool {
    let plan = at.plan;
    let mut scored = rows.iter_mut().filter_map(|r| match r {
        Row::Scored(s) => Some(s),
        Row::Failed { .. } => None,
    });
    let (Some(s), None) = (scored.next(), scored.next()) else {
        return false;
    };
    let unconverged =
        s.can_go_on() || (s.every > 0 && crate::failpoint::fires("fit-lone-unconverged", 1));
    if plan.fixed || !unconverged {
        return false;
    }
    let steps = final_steps_of_the_time_left(s, at, s.step_seconds, observer);
    observer.event(FitEvent::LoneTimeLeft {
        name: &s.candidate.name,
        steps: s.steps,
        final_steps: steps,
    });
    true
}

/// Gives `s`'s final model the steps the time left affords at `step_seconds` a step, at
/// least the steps its run took: the plannable seconds less what was spent, a run's setup
/// and the final model's fixed costs ([`no_selection_steps`]). Sets them as its
/// `final_steps` and returns them. When those fixed costs and the steps already taken do
/// not fit the time left (a budget smaller than the data's ingest and scoring), a probe
/// whose steps the time left cannot add to becomes the final model itself
/// ([`Scored::final_is_probe`]); otherwise says where the fit is expected to end
/// ([`FitEvent::PastTheBudget`]) instead of ending silently past it.
fn final_steps_of_the_time_left(
    s: &mut Scored,
    at: &Spending,
    step_seconds: f64,
    observer: &mut dyn FitObserver,
) -> u64 {
    let fixed = final_fixed_seconds(s.final_fixed_seconds(at.ingest_seconds));
    let spent = (at.spent)();
    let spare = spare_seconds(at.plan, spent, s.run_seconds + fixed);
    let steps = no_selection_steps(spare, step_seconds, at.plan.time_left_ceiling()).max(s.steps);
    s.final_steps = Some(steps);
    let final_run = final_seconds(s.run_seconds + fixed, steps, step_seconds);
    let overruns = spent + final_run > at.plan.budget;
    // Its probe scored with no selection run, and the time left buys no step more: the
    // final model would repeat the probe's steps on every row (at the probe's own rate,
    // whatever the planning's), past the budget. The probe's run is the final model
    // instead; what remains is scoring it.
    let repeated = final_seconds(s.run_seconds + fixed, s.steps, s.step_seconds);
    let repeats_past_the_budget = steps == s.steps && spent + repeated > at.plan.budget;
    if repeats_past_the_budget && s.every == 0 && !at.plan.fixed {
        s.final_is_probe = true;
        observer.event(FitEvent::FinalIsProbe {
            name: &s.candidate.name,
            steps,
            fixed_seconds: fixed,
            left_seconds: (at.plan.budget - spent).max(0.0),
        });
    } else if overruns {
        observer.event(FitEvent::PastTheBudget {
            fixed_seconds: fixed,
            left_seconds: (at.plan.budget - spent).max(0.0),
            expected_end: spent + final_run,
            budget_seconds: at.plan.budget,
        });
    }
    steps
}

/// Steps the final model of a candidate without a selection run adds once the steps it was
/// planned are trained and the clock says time is left: `spare` seconds (the plannable
/// seconds less what was spent, its scoring still to come and a resume's setup) at
/// `step_seconds`, the final run's own rate so far, with the final step's margin
/// ([`FINAL_STEP_MARGIN`]). Its steps were planned at its probe's rate, with that margin; a
/// probe taken while the machine was slower (on a 53 000-label set one measured 171 ms a
/// step where the final run's averaged 128) leaves a quarter of the budget unspent. The
/// margin is for the VM's own drift: one final run's steps averaged 140.8 ms, the 569
/// steps that priced at them without a margin ran at 166 ms, and the fit ended at 308 s
/// of 300; what the margin leaves goes to the next extension (`FinalModel::go_on` prices
/// again until less than an epoch is left). None when fewer than `floor` (an epoch's
/// steps: a resume pays its setup again); at most `room` (the time left's ceiling,
/// [`Plan::time_left_ceiling`], less the steps trained).
pub fn final_extension_steps(spare: f64, step_seconds: f64, room: u64, floor: u64) -> u64 {
    let steps = no_selection_steps(spare, step_seconds, u64::MAX);
    match steps >= floor.max(1) {
        true => steps.min(room),
        false => 0,
    }
}

/// Probed candidate `p` without a selection run (see [`select`]): its probe scored on
/// validation, and the steps the time left affords its final model.
fn no_selection_run(
    at: &Spending,
    p: Probed,
    afforded: u64,
    observer: &mut dyn FitObserver,
) -> Result<Scored> {
    let mut s = score_probe(at.ws, at.plan, p)?;
    let step_seconds = final_step_seconds(s.step_seconds);
    let steps = final_steps_of_the_time_left(&mut s, at, step_seconds, observer);
    observer.event(FitEvent::NoSelectionRun {
        name: &s.candidate.name,
        afforded,
        needed: at.plan.needed,
        floor: at.plan.floor,
        final_steps: steps,
    });
    Ok(s)
}

/// The steps a share affords, as the choice of a selection run sees them: `afforded`, or
/// with the failpoint `fit-share-slower:1000` armed, a thousandth of it, so that a test
/// sees a candidate whose share cannot buy a lone candidate's epochs on data small enough to
/// run in seconds (the final model's steps are priced by the true step time). The
/// failpoints that price such a final model (`fit-lone-slower`, `fit-fixed-dearer`) make
/// the share short too, as does `fit-final-short-extension` ([`extension_taken`]).
fn share_afforded(afforded: u64) -> u64 {
    let slower = crate::failpoint::fires("fit-share-slower", 1000)
        || crate::failpoint::fires("fit-lone-slower", 1000)
        || crate::failpoint::fires("fit-final-stalled", 1)
        || crate::failpoint::fires("fit-final-short-extension", 1)
        || crate::failpoint::fires("fit-fixed-dearer", 1000);
    match slower {
        true => afforded / 1000,
        false => afforded,
    }
}

/// The step time a final model without a selection run is planned by: its probe's
/// `step_seconds`, or with the failpoint `fit-lone-slower:1000` armed (which also makes
/// the share short of a selection run, [`share_afforded`]), 1 000 times that, so that a
/// test sees a final model planned far short of its time go on
/// ([`final_extension_steps`]).
fn final_step_seconds(step_seconds: f64) -> f64 {
    match crate::failpoint::fires("fit-lone-slower", 1000) {
        true => 1000.0 * step_seconds,
        false => step_seconds,
    }
}

/// The seconds a step of the final run took, as its going on prices them: `measured`, or
/// with the failpoint `fit-final-stalled:1` armed (which also makes the share short of a
/// selection run, [`share_afforded`]), no end, so that a test sees a final model end at its
/// first leg ([`first_leg`]).
pub fn final_run_step_seconds(measured: f64) -> f64 {
    match crate::failpoint::fires("fit-final-stalled", 1) {
        true => f64::INFINITY,
        false => measured,
    }
}

/// The steps the `extension`-th extension of a final model trains (`FinalModel::go_on`), of
/// the `more` the time left affords: all of them, or with the failpoint
/// `fit-final-short-extension:N` armed, half of them at the N-th (which also makes the
/// share short of a selection run, [`share_afforded`]), so that a test sees the clock read
/// again after an extension that left time.
pub fn extension_taken(more: u64, extension: u32) -> u64 {
    match crate::failpoint::fires("fit-final-short-extension", extension) {
        true => more.div_ceil(2),
        false => more,
    }
}

/// The share of its planned steps a final model trained for the time left trains before
/// the clock is read again ([`first_leg`]).
pub const FIRST_LEG_SHARE: f64 = 0.75;

/// The steps of a final model trained for the time left, `planned` in all, that it trains
/// before its own rate re-prices the rest (`FinalModel::go_on`, [`final_extension_steps`]):
/// [`FIRST_LEG_SHARE`] of them, or all when the rest would be less than an epoch's
/// `epoch_steps` (a resume pays its setup again). Its steps are planned at its probe's
/// rate, and on this VM a final model's steps ran 1.26 times slower than its probe's and
/// the fit ended at 318 s of 300; with a first leg of three quarters, steps up to 1.33
/// times slower than planned end within the budget, and faster ones go on as before.
pub fn first_leg(planned: u64, epoch_steps: u64) -> u64 {
    let leg = (FIRST_LEG_SHARE * planned as f64).ceil() as u64;
    match planned.saturating_sub(leg) >= epoch_steps.max(1) {
        true => leg,
        false => planned,
    }
}

/// The fixed costs a final model without a selection run is planned with: `fixed`, or with
/// the failpoint `fit-fixed-dearer:1000` armed, 1 000 times that, so that a test sees a
/// budget the data's ingest and scoring alone overrun ([`FitEvent::PastTheBudget`]).
fn final_fixed_seconds(fixed: f64) -> f64 {
    match crate::failpoint::fires("fit-fixed-dearer", 1000) {
        true => 1000.0 * fixed,
        false => fixed,
    }
}

/// The step time the cut is made by: the first probe's `step_seconds`, or with the
/// failpoint `fit-cut-slower:1000` armed, 1 000 times that, so that the tests of
/// readmission see the cut drop candidates whose time then comes back (the readmission
/// itself is priced by the true probe).
fn cut_step_seconds(step_seconds: f64) -> f64 {
    match crate::failpoint::fires("fit-cut-slower", 1000) {
        true => 1000.0 * step_seconds,
        false => step_seconds,
    }
}

/// Candidate `c`'s svd and probe on the plan's selection data.
fn probe_in(
    ws: &Workspace,
    plan: &Plan,
    c: &Candidate,
    observer: &mut dyn FitObserver,
) -> Result<Probed> {
    probe(
        ws,
        &plan.dataset,
        plan.kind,
        c,
        plan.seed,
        plan.budget,
        observer,
    )
}

/// The table's row of candidate `c` from its probe and run's `result`, said to the
/// observer; an error not the candidate's own is returned, ending the fit.
fn row_of(
    c: &Candidate,
    result: Result<Scored>,
    plan: &Plan,
    observer: &mut dyn FitObserver,
) -> Result<Row> {
    let row = match result {
        Ok(s) => Row::Scored(Box::new(s)),
        Err(e) if is_candidates_own(&e) => {
            observer.event(FitEvent::CandidateFailed {
                name: &c.name,
                error: &e,
            });
            Row::failed(c, &e)
        }
        Err(e) => return Err(e),
    };
    let ranking = plan.kind == crate::store::catalog::LabelKind::Multilabel;
    observer.event(FitEvent::CandidateDone(&candidate_outcome(&row, ranking)));
    Ok(row)
}

/// Cuts `list` to the candidates the budget affords after candidate `at`'s probe (the first
/// that ran), which took `probe_seconds` (its svd and probe) and measured `step_seconds`;
/// says which were dropped and returns them.
fn cut_list(
    list: &mut Vec<Candidate>,
    at: usize,
    (probe_seconds, step_seconds): (f64, f64),
    plan: &Plan,
    observer: &mut dyn FitObserver,
) -> Vec<Candidate> {
    let k = at
        + affordable(
            plan.left,
            list.len() - at,
            probe_seconds,
            step_seconds,
            plan.needed,
        );
    if k < list.len() {
        observer.event(FitEvent::Dropped {
            step_ms: 1e3 * step_seconds,
            needed_steps: plan.needed,
            min_epochs: super::plan::MIN_EPOCHS,
            floor: plan.floor,
            kept: k - at,
            dropped: list[k..].iter().map(|c| c.name.as_str()).collect(),
        });
    }
    list.split_off(k.min(list.len()))
}

/// The seconds a dropped candidate may spend (its svd, probe and run) out of `spare`, the
/// budget less what was spent and less the leader's final model, whose steps take
/// `leader_steps_seconds`. If the candidate is chosen, the final model trains its steps
/// instead of the leader's: each of its seconds is paid twice (now and by the final model),
/// against the spare time and the leader's steps it would free. Never more than `spare`,
/// so that a candidate that is not chosen leaves the leader's final model its time.
pub fn dropped_share(spare: f64, leader_steps_seconds: f64) -> f64 {
    spare.min((spare + leader_steps_seconds.max(0.0)) / 2.0)
}

/// Whether `share` seconds afford a dropped candidate what the cut asked of those it kept:
/// its svd and probe (`overhead`, as long as the first candidate's) and `needed` steps at
/// the first probe's `step_seconds`.
pub fn affords_dropped(share: f64, overhead: f64, step_seconds: f64, needed: u64) -> bool {
    planned_steps(share - overhead, step_seconds, u64::MAX) >= needed.max(1)
}

/// Runs the candidates the cut dropped, in list order, while the time left affords each
/// ([`dropped_share`], [`affords_dropped`]), once no run can train on ([`train_on`] has
/// spent what it could): a fit whose runs converged early goes on to the candidates it had
/// no time for when it started rather than ending early. After each, [`train_on`] again
/// (the new candidate may lead, with a run that can go on).
pub fn run_dropped(
    at: &Spending,
    selection: &mut Selection,
    observer: &mut dyn FitObserver,
) -> Result<()> {
    let (ws, plan, spent, ingest_seconds) = (at.ws, at.plan, at.spent, at.ingest_seconds);
    let Some((overhead, step_seconds)) = selection.first_probe else {
        return Ok(());
    };
    let dropped = std::mem::take(&mut selection.dropped);
    let mut waiting = dropped.into_iter();
    for c in waiting.by_ref() {
        let (fixed, leader_steps) = match leader(&selection.rows) {
            Some(s) => (
                s.final_fixed_seconds(ingest_seconds),
                final_seconds(0.0, s.final_steps(), s.step_seconds),
            ),
            None => (ingest_seconds, 0.0),
        };
        let spare = spare_seconds(plan, spent(), fixed + leader_steps);
        let share = dropped_share(spare, leader_steps);
        if !affords_dropped(share, overhead, step_seconds, plan.needed) {
            selection.dropped.push(c);
            break;
        }
        observer.event(FitEvent::Readmitted {
            left_seconds: plan.budget - spent(),
            name: &c.name,
            share_seconds: share,
        });
        let result = probe_in(ws, plan, &c, observer).and_then(|p| finish(ws, plan, p, share));
        selection.rows.push(row_of(&c, result, plan, observer)?);
        train_on(at, &mut selection.rows, observer)?;
    }
    selection.dropped.extend(waiting);
    Ok(())
}

/// Spends what the selection left of the budget, in the rule's order: on the leader's run
/// (or the best that can go on) with its own final model reserved ([`train_on`]), then on
/// the candidates the cut dropped ([`run_dropped`]), then on the runs still rising behind
/// the leader with only the leader's final model reserved ([`train_trailing`]).
pub fn spend_the_time_left(
    at: &Spending,
    selection: &mut Selection,
    observer: &mut dyn FitObserver,
) -> Result<()> {
    train_on(at, &mut selection.rows, observer)?;
    run_dropped(at, selection, observer)?;
    train_trailing(at, &mut selection.rows, observer)
}

/// The rule's choice among the scored rows so far.
fn leader(rows: &[Row]) -> Option<&Scored> {
    let scored: Vec<&Scored> = rows.iter().filter_map(Row::scored).collect();
    choose(&scored).map(|i| scored[i])
}

/// Trains on, with the time left, the candidate [`to_train_on`] names: its run goes on from
/// its last checkpoint for the steps the time affords (paid twice: now and by the final
/// model), and is scored again on validation; then again, until the time affords less than
/// one more score's worth of steps or no run can go on.
pub fn train_on(at: &Spending, rows: &mut [Row], observer: &mut dyn FitObserver) -> Result<()> {
    let (plan, spent, ingest_seconds) = (at.plan, at.spent, at.ingest_seconds);
    while let Some(i) = to_train_on(rows) {
        let behind = best_of(&scored_rows(rows)) != Some(i);
        let Row::Scored(s) = &mut rows[i] else {
            unreachable!("to_train_on names a scored row")
        };
        let fixed = s.final_fixed_seconds(ingest_seconds);
        let final_step = reserve_step_seconds(s.step_seconds, behind);
        // The resumed run pays its setup and last checkpoint again.
        let committed = s.run_seconds + final_seconds(fixed, s.steps, final_step);
        let spare = spare_seconds(plan, spent(), committed);
        let step = (scored_step_seconds(s) + s.step_seconds) / 2.0;
        let Some(more) = steps_going_on(s, plan, |room| extension_steps(spare, step, room)) else {
            break;
        };
        observer.event(FitEvent::Extending {
            left_seconds: plan.budget - spent(),
            name: &s.candidate.name,
            more,
            from: s.steps,
            anew: s.restart.is_some(),
        });
        let to = s.steps + more;
        go_on_or_fail(at, rows, i, to, observer)?;
    }
    Ok(())
}

/// The steps `s`'s run goes on by, when `afforded(room)` is what the time affords a run
/// that may train `room` more steps; None when fewer than are worth it. A run resumes from
/// its last checkpoint, up to the step cap, by at least [`extension_floor`]. A run held at
/// its probe begins its selection run anew ([`Scored::go_on`]): the time pays for the
/// probe's steps again, and it goes on by what is left, at least an epoch's steps (it pays
/// a run's setup, and with fewer its early stopping could not score it twice).
pub fn steps_going_on(s: &Scored, plan: &Plan, afforded: impl Fn(u64) -> u64) -> Option<u64> {
    let (more, floor) = match s.restart {
        Some(_) => (
            afforded(plan.cap).saturating_sub(s.steps),
            plan.epoch_steps.max(1),
        ),
        None => (
            afforded(plan.cap.saturating_sub(s.steps)),
            extension_floor(s.every, s.planned, plan.epoch_steps),
        ),
    };
    (more >= floor).then_some(more)
}

/// The step time a run's own final model is priced at when [`train_on`] extends it:
/// `step_seconds`, or with the failpoint `fit-behind-dearer:1000` armed and the run behind
/// the leader, 1 000 times that, so that a test sees the runs behind a converged leader
/// left to [`train_trailing`] on data small enough to run in seconds.
fn reserve_step_seconds(step_seconds: f64, behind: bool) -> f64 {
    match behind && crate::failpoint::fires("fit-behind-dearer", 1000) {
        true => 1000.0 * step_seconds,
        false => step_seconds,
    }
}

/// Seconds a step of `s`'s run takes as it goes on: its step, and its share of a
/// validation score every `every` steps (the final model trains without them). A run held
/// at its probe has no period yet: the selection run it begins plans its scores within
/// [`SCORING_SHARE`] of its time (`plan::affordable_scores`), so a step costs at most its
/// own over the rest (pricing one whole score a step, as `every` = 0 would, planned such
/// a run a tenth of the steps its time afforded).
///
/// [`SCORING_SHARE`]: super::plan::SCORING_SHARE
fn scored_step_seconds(s: &Scored) -> f64 {
    match s.restart {
        Some(_) => s.step_seconds / (1.0 - super::plan::SCORING_SHARE),
        None => s.step_seconds + s.scoring_seconds / s.every.max(1) as f64,
    }
}

/// Trains the run of scored row `i` on to step `to` ([`Scored::go_on`]); a failure of the
/// candidate's own makes the row a failed one, any other ends the fit.
fn go_on_or_fail(
    at: &Spending,
    rows: &mut [Row],
    i: usize,
    to: u64,
    observer: &mut dyn FitObserver,
) -> Result<()> {
    let Row::Scored(s) = &mut rows[i] else {
        unreachable!("only a scored row goes on")
    };
    match s.go_on(at.ws, at.plan, to) {
        Ok(()) => Ok(()),
        Err(e) if is_candidates_own(&e) => {
            observer.event(FitEvent::CandidateFailed {
                name: &s.candidate.name,
                error: &e,
            });
            rows[i] = Row::failed(&s.candidate.clone(), &e);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Steps a run behind the leader may add with `spare` seconds (the plannable seconds less
/// what was spent, a resume's setup and the leader's final model) at `scored_step` seconds
/// a step with its scores, planned at [`super::rule::STEP_SHARE`] as every run is: paid
/// once, since the final model trains the leader's steps unless this run overtakes it with
/// a final model that still fits ([`fits_its_final`]). At most `room`.
pub fn trailing_steps(spare: f64, scored_step: f64, room: u64) -> u64 {
    planned_steps(spare, scored_step, room)
}

/// Gives the time the leader's final model leaves to the runs behind it that can still
/// go on, once [`train_on`] and [`run_dropped`] have spent what they could. Those price
/// each added step as if the run would be chosen (paid twice, its own final model
/// reserved), so a run behind a leader with a cheap final model stops well before the
/// budget's end: on yahoo_business a free-Z run behind the converged axes kept 60 s for a
/// final model of its own that was never trained, and the fit ended at 78 % of its
/// budget. Here the best of the open runs other than the leader trains on with only the
/// leader's final model reserved, until it converges (the time then goes to the next) or
/// the time affords less than a score's worth of steps, and is marked
/// [`Scored::unreserved`]: should it overtake the leader, it is chosen only if its own
/// final model still fits ([`choice`]). So a fit ends near its budget unless every run
/// converged.
pub fn train_trailing(
    at: &Spending,
    rows: &mut [Row],
    observer: &mut dyn FitObserver,
) -> Result<()> {
    let (plan, spent, ingest_seconds) = (at.plan, at.spent, at.ingest_seconds);
    loop {
        let now = spent();
        let Some((lead, _)) = choice(rows, plan, now, ingest_seconds) else {
            return Ok(());
        };
        let leader = scored_at(rows, lead);
        let (leader_name, leader_final) = (
            leader.candidate.name.clone(),
            final_seconds_of(leader, ingest_seconds),
        );
        let Some(i) = best_open(rows, Some(lead)) else {
            return Ok(());
        };
        let Row::Scored(s) = &mut rows[i] else {
            unreachable!("best_open names a scored row")
        };
        let spare = spare_seconds(plan, now, s.run_seconds + leader_final);
        let step = scored_step_seconds(s);
        let Some(more) = steps_going_on(s, plan, |room| trailing_steps(spare, step, room)) else {
            return Ok(());
        };
        observer.event(FitEvent::TrailingExtending {
            left_seconds: plan.budget - now,
            name: &s.candidate.name,
            leader: &leader_name,
            more,
            from: s.steps,
            anew: s.restart.is_some(),
        });
        s.unreserved = true;
        let to = s.steps + more;
        go_on_or_fail(at, rows, i, to, observer)?;
    }
}

/// The outcome's line of `row`.
pub fn candidate_outcome(row: &Row, ranking: bool) -> CandidateOutcome {
    let options = |c: &Candidate| {
        let map = |o: Vec<(&str, String)>| {
            o.into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<BTreeMap<_, _>>()
        };
        (
            c.name.clone(),
            map(c.svd_pairs()),
            map(given_values(&c.train)),
        )
    };
    let (name, svd, train, result) = match row {
        Row::Scored(s) => {
            let (name, svd, train) = options(&s.candidate);
            let result = CandidateResult::Scored {
                step_ms: 1e3 * s.step_seconds,
                planned_steps: s.planned,
                trained_steps: s.steps,
                seconds: s.seconds,
                converged: s.converged,
                validation: Figures::of_key(s.key(), ranking),
                selection_run: s.run,
            };
            (name, svd, train, result)
        }
        Row::Failed { candidate, reason } => {
            let (name, svd, train) = options(candidate);
            let result = CandidateResult::Failed {
                reason: reason.clone(),
            };
            (name, svd, train, result)
        }
    };
    CandidateOutcome {
        name,
        svd,
        train,
        result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit::plan::{
        affordable_scores, probe_steps, scores_within, stopping, FIRST_STEPS, PROBE_STEPS,
    };

    #[test]
    fn the_probe_is_bounded_by_a_share_of_the_budget() {
        // 10 ms a step: 50 steps are 0.5 s, well inside 5 % of 300 s.
        assert_eq!(probe_steps(0.01, 300.0), PROBE_STEPS);
        // 6 s a step (53 000 labels): 5 % of 300 s is 15 s, two steps; the three first
        // steps were taken already.
        assert_eq!(probe_steps(6.0, 300.0), FIRST_STEPS);
        // 0.8 s a step, a 2-minute budget: 6 s buy 7 steps.
        assert_eq!(probe_steps(0.8, 120.0), 7);
        assert_eq!(probe_steps(0.0, 120.0), PROBE_STEPS);
    }

    #[test]
    fn patience_covers_passes_over_the_data() {
        // Yahoo business: 15 steps an epoch, 150 steps planned: train's default period of
        // 3 steps and ten scores would be 30 steps, two epochs; five epochs are 25 scores.
        // (Scores as cheap as there: 2 s of scoring room, 0.02 s a score.)
        let cheap = |planned, epoch| stopping(planned, epoch, scores_within(2.0, 0.02));
        assert_eq!(cheap(150, 15), (3, 25));
        // Small data: an epoch of 1 step, 3 000 planned: train's own defaults, 60 and 10.
        assert_eq!(cheap(3000, 1), (60, 10));
        // Delicious: 21 steps an epoch, 300 planned: 6 steps a score, 105 steps of
        // patience are 18 scores.
        assert_eq!(cheap(300, 21), (6, 18));
        assert_eq!(cheap(1, 0), (1, 10));
    }

    #[test]
    fn a_run_extends_by_a_period_or_by_an_epoch_where_scores_are_rare() {
        // Train's period (a fiftieth of 1 492 steps): a period, however short the epoch.
        assert_eq!(extension_floor(30, 1492, 1), 30);
        // Scored once in 119 steps (dear scores): an epoch of 48 steps is enough.
        assert_eq!(extension_floor(119, 119, 48), 48);
        assert_eq!(extension_floor(0, 0, 0), 1);
    }

    #[test]
    fn scores_that_cost_steps_are_held_to_a_share_of_the_run() {
        // 50 000 labels (measured): 4.3 s a score, a run of 150 s left. Train's fifty scores
        // would be 215 s; a tenth of the run, 15 s, affords 3 of them.
        let scores = affordable_scores(150.0, 4.3);
        assert_eq!(scores, 3);
        let (every, _) = stopping(146, 48, scores);
        assert_eq!(every, 49, "146 steps in 3 scores");
        // Cheap scores keep train's fifty.
        assert_eq!(affordable_scores(150.0, 0.02), 50);
        assert_eq!(stopping(146, 48, 50).0, 3);
        // A score dearer than the whole share: one score (at the run's end).
        assert_eq!(affordable_scores(150.0, 30.0), 1);
        assert_eq!(stopping(100, 10, 1).0, 100);
        assert_eq!(affordable_scores(150.0, 0.0), 50, "unmeasured: train's own");
    }

    #[test]
    fn the_period_does_not_turn_on_a_scores_rounding() {
        // Whatever a cheap score measured, a 3 000-step run of an ample share is scored
        // train's fifty times, every 60 steps. (Dividing fifty scores' seconds by one
        // score's again gave 49 for about one time in eleven: a period of 62.)
        for k in 0..2000 {
            let score_seconds = 1e-3 * (1.0 + f64::from(k) / 997.0);
            let scores = affordable_scores(1000.0, score_seconds);
            assert_eq!(stopping(3000, 1, scores), (60, 10), "{score_seconds}");
        }
    }

    #[test]
    fn the_leader_extends_by_what_the_spare_time_pays_twice() {
        // 100 s spare at 0.5 s a step: 50 s of selection, 70 % of it as steps: 70 steps.
        assert_eq!(extension_steps(100.0, 0.5, 10_000), 70);
        assert_eq!(extension_steps(100.0, 0.5, 40), 40, "the cap");
        assert_eq!(extension_steps(-5.0, 0.5, 40), 0, "no time left");
        assert!((final_seconds(20.0, 100, 0.5) - (20.0 + 1.15 * 50.0)).abs() < 1e-12);
    }

    #[test]
    fn a_run_held_at_its_probe_begins_anew_and_pays_for_the_probe_s_steps_again() {
        let plan = Plan {
            cap: 1_000,
            epoch_steps: 20,
            ..plan_of(300.0)
        };
        let mut acc = crate::metrics::binary::BinaryAccumulator::new();
        acc.add_row(0.9, true).unwrap();
        let binary = crate::metrics::evaluation::Evaluation::Binary(acc.finish());
        let mut s = crate::fit::rule::tests::scored("c", binary);
        (s.steps, s.planned, s.every, s.open) = (50, 50, 0, true);
        // The time affords 400 steps of whatever room it is given.
        let afforded = |room: u64| room.min(400);
        // Resumed: 400 more, from step 50 (room 950).
        assert_eq!(steps_going_on(&s, &plan, afforded), Some(400));
        assert_eq!(
            steps_going_on(&s, &plan, |room| room.min(10_000)),
            Some(950)
        );
        s.restart = Some(Box::new(crate::fit::rule::Restart {
            train_opts: crate::train::TrainOptions::default(),
            score_seconds: 0.1,
        }));
        // Begun anew: 400 steps from step 0, 350 past the probe; at most the cap in all.
        assert_eq!(steps_going_on(&s, &plan, afforded), Some(350));
        assert_eq!(
            steps_going_on(&s, &plan, |room| room.min(10_000)),
            Some(950)
        );
        // Worth it from an epoch's steps past the probe (20), not below.
        assert_eq!(steps_going_on(&s, &plan, |room| room.min(70)), Some(20));
        assert_eq!(steps_going_on(&s, &plan, |room| room.min(69)), None);
        assert_eq!(steps_going_on(&s, &plan, |room| room.min(30)), None);
    }

    /// Records which of the two final-model events a fit said, by name.
    struct Said(Vec<&'static str>);

    impl FitObserver for Said {
        fn event(&mut self, event: FitEvent<'_>) {
            match event {
                FitEvent::FinalIsProbe { .. } => self.0.push("probe"),
                FitEvent::PastTheBudget { .. } => self.0.push("past"),
                _ => {}
            }
        }
    }

    /// A candidate scored after `steps` steps of `step_seconds`, whose run's setup took
    /// `run_seconds`, scored every `every` steps (0: its probe), with an svd of 3 s and a
    /// validation score of 5 s.
    fn probe_scored(steps: u64, step_seconds: f64, run_seconds: f64, every: u64) -> Scored {
        use crate::fit::rule::tests::{binary, scored};
        let mut s = scored("probe", binary(0.8, 0.3));
        (s.steps, s.step_seconds, s.run_seconds, s.every) =
            (steps, step_seconds, run_seconds, every);
        (s.svd_seconds, s.scoring_seconds) = (3.0, 5.0);
        s
    }

    /// The steps [`final_steps_of_the_time_left`] gives `s` at its own step time, `spent`
    /// seconds into `plan`, with the whole file's ingest at 2 s; and the final-model events
    /// it said.
    fn time_left_of(
        ws: &Workspace,
        plan: &Plan,
        spent: f64,
        s: &mut Scored,
    ) -> (u64, Vec<&'static str>) {
        let spent_now = move || spent;
        let at = Spending {
            ws,
            plan,
            spent: &spent_now,
            ingest_seconds: 2.0,
        };
        let mut said = Said(Vec::new());
        let step_seconds = s.step_seconds;
        let steps = final_steps_of_the_time_left(s, &at, step_seconds, &mut said);
        (steps, said.0)
    }

    /// A probe whose steps, trained again on every row with the final model's fixed
    /// costs, would end past the budget is the final model itself; a selection run in the
    /// same place (a run with early stopping, not a spec's fixed steps) is trained again
    /// and the overrun said; where they fit, neither.
    #[test]
    fn a_probe_that_cannot_be_repeated_in_the_time_left_is_the_final_model() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let plan = plan_of(60.0);
        // 40 s spent; the probe's 3 steps at 3 s, a run's setup of 5 s, svd 3 s and
        // scoring 5 s, and the whole file's ingest 2 s: 10 s of fixed costs and 9 s of
        // steps against the 20 s left less the plan's 2 % (18.8 s).
        let ended = |spent: f64, every: u64| {
            let mut s = probe_scored(3, 3.0, 5.0, every);
            let (steps, said) = time_left_of(&ws, &plan, spent, &mut s);
            (steps, s.final_is_probe, said)
        };
        assert_eq!(ended(40.0, 0), (3, true, vec!["probe"]));
        assert_eq!(ended(40.0, 7), (3, false, vec!["past"]));
        // 20 s spent: the same steps and more fit.
        let (steps, probe, said) = ended(20.0, 0);
        assert!(
            steps > 3 && !probe && said.is_empty(),
            "{steps} {probe} {said:?}"
        );
    }

    /// A plan of `budget` seconds with nothing else set (the spare time reads the budget).
    fn plan_of(budget: f64) -> Plan {
        Plan {
            dataset: String::new(),
            kind: crate::store::catalog::LabelKind::Multilabel,
            seed: 0,
            budget,
            left: budget,
            cap: u64::MAX,
            needed: 1,
            floor: 0,
            epoch_steps: 1,
            fixed: false,
        }
    }

    #[test]
    fn a_selection_run_needs_twenty_epochs_lone_or_not() {
        use crate::fit::plan::needed_steps;
        // 50 000 rows in minibatches of 500: 100-step epochs, 2 000 steps of twenty.
        assert_eq!(needed_steps(50_000, 500, 6_000, 0), 2_000);
        assert_eq!(
            needed_steps(50_001, 500, 6_000, 0),
            2_020,
            "a last, short minibatch"
        );
        assert_eq!(
            needed_steps(50_000, 500, 1_500, 0),
            1_500,
            "the cap, on small data"
        );
        let plan = Plan {
            needed: needed_steps(50_000, 500, 6_000, 0),
            epoch_steps: 100,
            cap: 6_000,
            ..plan_of(300.0)
        };
        // The 53 000-label case: a share of 15 epochs is short of them.
        assert!(!takes_selection_run(1, 1_500, &plan));
        assert!(!takes_selection_run(1, 1_999, &plan));
        assert!(takes_selection_run(1, 2_000, &plan));
        // Others to choose between, or fixed steps: always a selection run.
        assert!(takes_selection_run(2, 10, &plan));
        assert!(takes_selection_run(
            1,
            10,
            &Plan {
                fixed: true,
                ..plan
            }
        ));
    }

    #[test]
    fn above_many_labels_a_selection_run_needs_its_floor_of_steps_when_epochs_are_short() {
        use crate::fit::plan::{needed_steps, MANY_LABELS_MIN_STEPS};
        use crate::fit::rule::{selection_floor, MANY_LABELS};
        use crate::store::catalog::LabelKind;
        assert_eq!(
            selection_floor(LabelKind::Multilabel, MANY_LABELS),
            0,
            "4 000 labels: the dense path"
        );
        assert_eq!(
            selection_floor(LabelKind::Multilabel, MANY_LABELS + 1),
            MANY_LABELS_MIN_STEPS
        );
        assert_eq!(
            selection_floor(LabelKind::Multiclass, 30_938),
            0,
            "no label side to climb"
        );
        let floor = selection_floor(LabelKind::Multilabel, 30_938);
        // The Wiki10-shaped selection split: 11 317 rows, 23 steps an epoch, 460 of twenty;
        // its cap is 3 000 steps.
        assert_eq!(needed_steps(11_317, 500, 3_000, 0), 460);
        assert_eq!(needed_steps(11_317, 500, 3_000, floor), 1_500);
        // Many rows: twenty epochs are more than the floor, which then changes nothing.
        assert_eq!(needed_steps(80_000, 500, 9_600, floor), 3_200);
        // The cap bounds the floor as it bounds the epochs.
        assert_eq!(needed_steps(11_317, 500, 1_000, floor), 1_000);
        // The 84 ms probe of the Wiki10-shaped fit: its two shares of 639 steps were above
        // the line of twenty epochs and are below the floor, and a lone candidate's 980
        // steps are short of it too.
        let plan = Plan {
            needed: needed_steps(11_317, 500, 3_000, floor),
            epoch_steps: 23,
            cap: 3_000,
            ..plan_of(300.0)
        };
        assert!(!takes_selection_run(1, 980, &plan));
        assert!(takes_selection_run(1, 1_500, &plan));
    }

    /// A final model trained for the time left takes what the clock affords past the step
    /// cap, up to [`Plan::time_left_ceiling`]: on a faster VM two five-minute fits whose
    /// final models stopped at the cap ended at 223 and 244 s.
    #[test]
    fn a_final_model_trained_for_the_time_left_goes_past_the_step_cap() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let plan = Plan {
            cap: 3_000,
            ..plan_of(300.0)
        };
        assert_eq!(plan.time_left_ceiling(), 12_000);
        let steps_at = |step_seconds: f64| {
            let mut s = probe_scored(50, step_seconds, 2.0, 0);
            time_left_of(&ws, &plan, 60.0, &mut s).0
        };
        // The s50 seed-1 fit's probe: 61.9 ms a step; 294 s plannable less 60 spent and
        // 12 s of setup and fixed costs afford some 3 100 steps with the final step's margin.
        let steps = steps_at(0.0619);
        assert!((3_001..4_000).contains(&steps), "{steps}");
        // A step of a millisecond: the ceiling.
        assert_eq!(steps_at(0.001), 12_000);
        // Going on from the cap, the room is the ceiling's: the clock's steps past the cap,
        // up to the ceiling.
        let room = plan.time_left_ceiling() - 3_000;
        assert_eq!(final_extension_steps(60.0, 0.05, room, 48), 1_043);
        assert_eq!(final_extension_steps(600.0, 0.05, room, 48), 9_000);
    }

    #[test]
    fn a_final_model_trains_three_quarters_of_its_plan_unless_the_rest_is_short_of_an_epoch() {
        assert_eq!(first_leg(2_634, 29), 1_976);
        assert_eq!(first_leg(400, 100), 300, "the rest is one epoch");
        assert_eq!(first_leg(400, 101), 400, "the rest is short of an epoch");
        assert_eq!(first_leg(73, 29), 73);
        assert_eq!(first_leg(0, 29), 0);
        assert_eq!(first_leg(10, 0), 8, "an epoch of no steps counts as one");
    }

    #[test]
    fn the_leaders_extension_leaves_the_unplanned_share_for_a_dearer_final_model() {
        use crate::fit::plan::UNPLANNED_SHARE;
        // Figures of the five-minute fit at 50 000 labels (docs/fit.md, "Many labels"): 123
        // ms a step, a 2 s resume, a final model whose fixed costs were priced at 40 s; the
        // leader at any point of the selection.
        let plan = plan_of(300.0);
        let (resume, fixed, step) = (2.0, 40.0, 0.1234);
        for (spent, steps) in [(60.0, 100), (120.0, 482), (150.0, 600), (150.0, 732)] {
            let committed = resume + final_seconds(fixed, steps, step);
            let spare = spare_seconds(&plan, spent, committed);
            let more = extension_steps(spare, step, u64::MAX);
            let end =
                spent + resume + more as f64 * step + final_seconds(fixed, steps + more, step);
            if spare <= 0.0 {
                // Past the plannable seconds already: nothing is added.
                assert_eq!(more, 0, "{spent}");
                continue;
            }
            // The extension is planned within the plannable seconds, so a final model whose
            // fixed costs come out the unplanned share dearer still ends within the budget.
            assert!(more > 0 && end <= plan.plannable(), "{spent}: {more} {end}");
            assert!(
                end + UNPLANNED_SHARE * plan.budget <= plan.budget,
                "{spent}: {end}"
            );
        }
        // The dropped candidates' time reads the same reserve.
        let left = spare_seconds(&plan, 100.0, 50.0);
        assert!((left - (300.0 * (1.0 - UNPLANNED_SHARE) - 150.0)).abs() < 1e-9);
    }

    #[test]
    fn without_a_selection_run_the_final_model_takes_the_time_left() {
        // The one-minute fit at 50 000 labels (docs/fit.md, "Many labels"): 40 s left to
        // plan with after the probe and the final model's fixed costs, 138 ms a step.
        let steps = no_selection_steps(40.0, 0.138, u64::MAX);
        assert_eq!(steps, (40.0 / (FINAL_STEP_MARGIN * 0.138)).floor() as u64);
        // Those steps and the fixed costs fit the spare time they were planned from.
        assert!(steps as f64 * FINAL_STEP_MARGIN * 0.138 <= 40.0);
        assert_eq!(no_selection_steps(40.0, 0.138, 100), 100, "the cap");
        assert_eq!(no_selection_steps(-3.0, 0.138, 100), 0, "no time left");
    }

    #[test]
    fn a_final_model_trained_for_the_time_left_goes_on_when_its_steps_ran_faster() {
        // The 53 000-label fit: planned at the probe's 170.8 ms with the final margin, its
        // 1 150 steps took 128 ms each and 80 s of the plannable seconds were left, less a
        // 7 s scoring and a 2 s resume.
        let more = final_extension_steps(80.0 - 7.0 - 2.0, 0.128, 3_000, 28);
        assert_eq!(more, (71.0 / (FINAL_STEP_MARGIN * 0.128)).floor() as u64);
        // Priced with the margin: steps up to 1.15 times slower still end within the time.
        assert!(more as f64 * FINAL_STEP_MARGIN * 0.128 <= 71.0);
        assert!((more + 1) as f64 * FINAL_STEP_MARGIN * 0.128 > 71.0);
        assert_eq!(final_extension_steps(71.0, 0.128, 300, 28), 300, "the room");
        assert_eq!(
            final_extension_steps(4.0, 0.128, 3_000, 28),
            0,
            "less than an epoch with the margin"
        );
        assert_eq!(final_extension_steps(4.2, 0.128, 3_000, 28), 28);
        assert_eq!(
            final_extension_steps(-4.0, 0.128, 3_000, 28),
            0,
            "over the plan"
        );
        assert_eq!(
            final_extension_steps(71.0, 0.128, 0, 28),
            0,
            "at the cap already"
        );
    }

    #[test]
    fn a_dropped_candidate_runs_when_the_time_left_pays_for_it_twice() {
        // yahoo_business at one minute (measured): the leader converged with about 21 s
        // spare besides its final model, whose 190 steps at 53 ms take 11.6 s; the first
        // candidate's svd and probe took about 5 s; ten epochs are 140 steps.
        let share = dropped_share(21.0, 11.6);
        assert!((share - 16.3).abs() < 1e-9);
        assert!(affords_dropped(share, 5.0, 0.053, 140));
        // Half the spare time would not have paid for it: the leader's steps it frees count.
        assert!(!affords_dropped(21.0 / 2.0, 5.0, 0.053, 140));
        // Never more than the spare time, so that the leader's final model keeps its own.
        assert_eq!(dropped_share(10.0, 100.0), 10.0);
        assert!(!affords_dropped(dropped_share(-3.0, 20.0), 0.0, 0.01, 1));
        // Chosen, a candidate's share and its final model's steps fit in the spare time and
        // the leader's final steps it replaces (its steps are planned from its share).
        for spare in [1.0, 10.0, 60.0, 250.0] {
            for leader in [0.0, 5.0, 40.0, 400.0] {
                let share = dropped_share(spare, leader);
                let steps = planned_steps(share, 0.02, u64::MAX);
                let chosen = share + final_seconds(0.0, steps, 0.02);
                assert!(
                    chosen <= spare + leader + 1e-9,
                    "{spare} {leader}: {chosen}"
                );
            }
        }
    }

    #[test]
    fn a_run_behind_the_leader_is_paid_once_against_the_leaders_final_model() {
        // The five-minute yahoo_business fit (docs/fit.md): the converged axes' final model,
        // 600 steps at 30 ms and 10 s of fixed costs; free Z behind them, still rising at
        // 173 ms a step, scored in 1 s every 14 steps, a 2 s resume; 234 s spent.
        let plan = plan_of(300.0);
        let leader_final = final_seconds(10.0, 600, 0.030);
        let (resume, scored_step) = (2.0, 0.173 + 1.0 / 14.0);
        let spent = 234.0;
        let spare = spare_seconds(&plan, spent, resume + leader_final);
        let more = trailing_steps(spare, scored_step, u64::MAX);
        // Paid once: the steps the spare time buys at the run's rate, as every run plans.
        assert_eq!(more, planned_steps(spare, scored_step, u64::MAX));
        assert!(more > 0, "{spare}");
        // Trained, they and the leader's final model end within the plannable seconds.
        let end = spent + resume + more as f64 * scored_step + leader_final;
        assert!(end <= plan.plannable(), "{end}");
        // Priced as if chosen (twice, against its own final model of 400 steps), the same
        // time buys nothing: what the fit left unspent.
        let own = spare_seconds(&plan, spent, resume + final_seconds(10.0, 400, 0.173));
        assert_eq!(extension_steps(own, scored_step, u64::MAX), 0, "{own}");
        assert_eq!(trailing_steps(-1.0, scored_step, 100), 0, "no time left");
        assert_eq!(trailing_steps(spare, scored_step, 7), 7, "the cap");
    }

    #[test]
    fn a_run_that_went_on_unreserved_is_chosen_only_if_its_final_model_fits() {
        use crate::fit::rule::tests::{binary, scored};
        let plan = plan_of(300.0);
        let row = |name: &str, accuracy: f64, steps: u64, unreserved: bool| {
            let mut s = scored(name, binary(accuracy, 0.3));
            (s.steps, s.step_seconds, s.svd_seconds) = (steps, 0.1, 5.0);
            s.unreserved = unreserved;
            Row::Scored(Box::new(s))
        };
        // b leads by five points but went on unreserved; its final model of 400 steps
        // costs 5 + 46 s, a's of 100 steps 5 + 11.5 s.
        let rows = [row("a", 0.90, 100, false), row("b", 0.95, 400, true)];
        let fits_at = plan.plannable() - final_seconds(5.0, 400, 0.1);
        assert_eq!(choice(&rows, &plan, fits_at - 1.0, 0.0), Some((1, None)));
        assert_eq!(choice(&rows, &plan, fits_at + 1.0, 0.0), Some((0, Some(1))));
        // A reserved leader is chosen whatever the clock says (its time was kept).
        let reserved = [row("a", 0.90, 100, false), row("b", 0.95, 400, false)];
        assert_eq!(choice(&reserved, &plan, 299.0, 0.0), Some((1, None)));
        // When no final model fits, the rule's choice among them all.
        let none = [row("a", 0.90, 100, true), row("b", 0.95, 400, true)];
        assert_eq!(choice(&none, &plan, 299.0, 0.0), Some((1, None)));
        // A run behind that went on unreserved and does not fit is no concern of the choice.
        let behind = [row("a", 0.95, 100, false), row("b", 0.90, 400, true)];
        assert_eq!(choice(&behind, &plan, 299.0, 0.0), Some((0, None)));
        assert_eq!(choice(&[], &plan, 0.0, 0.0), None);
    }

    #[test]
    fn a_candidates_own_failure_is_told_from_the_workspaces() {
        let own = anyhow::anyhow!("--inducing-inputs free needs about 30 MiB");
        assert!(is_candidates_own(&own.context("train")));
        let io = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(!is_candidates_own(&io.context("checkpoint")));
        let stop = anyhow::Error::new(crate::stop::StoppedOnRequest { at: "x".into() });
        assert!(!is_candidates_own(&stop));
        let busy = anyhow::Error::new(Contended("catalog busy".into()));
        assert!(!is_candidates_own(&busy.context("svd")));
    }
}
