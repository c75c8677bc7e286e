//! `pipeline fit` on small data: every candidate is trained and scored on each of k folds
//! of the training rows and chosen by its mean validation figure (docs/fit.md, "Small
//! data: k folds"). One carve of a few hundred rows measures accuracy with a standard error
//! of points, several times the half-point tie of the rule; k folds score every training
//! row once, so the mean's error is √k smaller.
//!
//! The folds are datasets of their own, `NAME-fold1` … `NAME-foldK`, each the training file
//! ingested with `--validation-folds K --validation-fold I` (`crate::ingest::validation`):
//! disjoint validation splits that together hold every training row.

use std::time::Instant;

use anyhow::Result;

use super::budget::candidate_outcome;
use super::budget::{is_candidates_own, Row};
use super::inputs::Inputs;
use super::observe::{FitEvent, FitObserver, FoldRow, FoldTable};
use super::plan::Plan;
use super::rule::{
    finish, frequency_floor, probe, selection_seconds, Candidate, Scored, STEP_SHARE,
};
use crate::ingest::config::IngestConfig;
use crate::ingest::validation::ValidationSplit;
use crate::metrics::evaluation::Evaluation;
use crate::store::catalog::Split;
use crate::store::workspace::Workspace;

/// Folds replace the one carve when it holds fewer validation rows than this. On 500 rows
/// an accuracy near 90 % has a standard error of 1.3 points, 2.7 times the rule's
/// half-point tie; k folds score all 5 × 500 rows of a 0.2 carve, 0.6 points. Above it one
/// carve's error keeps shrinking while k folds cost k times the runs (docs/fit.md).
pub const FOLDS_BELOW_ROWS: u64 = 500;

/// At most this many folds, whatever the validation fraction (a fold is a dataset, an
/// svd and a run per candidate).
const MAX_FOLD_COUNT: u32 = 10;

/// What the fold selection needs of `run`.
pub(super) struct Selection<'a> {
    pub inputs: &'a Inputs,
    /// Whether folds may be chosen at all (the caller may ask for the one carve).
    pub folds: bool,
    /// The validation fraction of the one carve (it sets the number of folds).
    pub fraction: f64,
    /// The dataset's name; the folds are `NAME-fold1` ….
    pub name: &'a str,
    /// The one carve's dataset (its first candidate's probe measures the step time).
    pub select: &'a str,
    /// Rows of the one carve's validation split.
    pub validation_rows: u64,
    /// The one carve's plan: task, seed, budget, the seconds left for the selection and
    /// the final model as `run` counts them, the step cap, early stopping.
    pub plan: &'a Plan,
}

/// The number of folds for a validation fraction F: the carve's own share, 1/F rounded
/// (5 for the default 0.2: each fold trains on as many rows as the one carve does), 2 to
/// [`MAX_FOLD_COUNT`].
pub fn fold_count(fraction: f64) -> u32 {
    ((1.0 / fraction).round() as u32).clamp(2, MAX_FOLD_COUNT)
}

/// The seconds `folds` capped runs of each candidate take: per candidate, from its probe on
/// the carve, its `overhead` (svd and probe) and `cap` steps at its `step_seconds`, the
/// steps being [`STEP_SHARE`] of a run's time as everywhere in the plan.
pub fn capped_runs_seconds(folds: u32, probes: &[(f64, f64)], cap: u64) -> f64 {
    let one_of_each: f64 = probes
        .iter()
        .map(|&(overhead, step_seconds)| overhead + cap as f64 * step_seconds / STEP_SHARE)
        .sum();
    f64::from(folds) * one_of_each
}

/// Every candidate's figures over the folds, and the label frequencies' mean figures.
pub(super) type Folded = (Vec<Row>, (f64, f64));

/// Chooses among `list` by k folds when the one carve's validation split is small and the
/// budget affords every candidate's capped run k times; returns every candidate's mean
/// figures over the folds (its steps the median of its folds' runs) and the label
/// frequencies' mean figures, after printing the table. None: the one carve decides, as
/// for larger data.
pub(super) fn select(
    ws: &Workspace,
    s: &Selection<'_>,
    list: &[Candidate],
    observer: &mut dyn FitObserver,
) -> Result<Option<Folded>> {
    if !s.folds || s.validation_rows >= FOLDS_BELOW_ROWS || list.is_empty() {
        return Ok(None);
    }
    let started = Instant::now();
    let k = fold_count(s.fraction);
    // The one carve's training split is as large as each fold's (1 − 1/k of the rows), so
    // each candidate's probe on it prices that candidate's fold runs; the candidates'
    // step times differ by an order of magnitude (the axes' against free Z's), so each is
    // probed, not only the first. The one-carve path reuses these probes. A candidate that
    // cannot run costs the folds nothing (it fails on them too, and is left out); when none
    // can, the one carve decides, and its table shows the failures.
    let mut probes = Vec::new();
    for c in list {
        match probe(
            ws,
            s.select,
            s.plan.kind,
            c,
            s.plan.seed,
            s.plan.budget,
            observer,
        ) {
            Ok(p) => probes.push((p.seconds(), p.step_seconds)),
            Err(e) if is_candidates_own(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    if probes.is_empty() {
        return Ok(None);
    }
    let selection = selection_seconds(s.plan.left, list.len()) - started.elapsed().as_secs_f64();
    let needed = capped_runs_seconds(k, &probes, s.plan.cap);
    if needed > selection {
        observer.event(FitEvent::FoldsDeclined {
            validation_rows: s.validation_rows,
            folds: k,
            candidates: list.len(),
            needed_seconds: needed,
            seconds: selection.max(0.0),
        });
        return Ok(None);
    }
    observer.event(FitEvent::FoldsChosen {
        validation_rows: s.validation_rows,
        below_rows: FOLDS_BELOW_ROWS,
        folds: k,
    });
    let folds = (1..=k)
        .map(|fold| ingest_fold(ws, s, fold, k))
        .collect::<Result<Vec<String>>>()?;
    // Per candidate in list order: its fold runs, or its failed row.
    let mut results: Vec<std::result::Result<Vec<Scored>, Row>> = Vec::new();
    for c in list {
        let on_folds = |observer: &mut dyn FitObserver| -> Result<Vec<Scored>> {
            let mut scored = Vec::new();
            for fold in &folds {
                let rows = ws
                    .dataset_named(fold)?
                    .split(Split::Train)
                    .map_or(0, |t| t.n_rows);
                let on_fold = within_rows(c, rows);
                let probed = probe(
                    ws,
                    fold,
                    s.plan.kind,
                    &on_fold,
                    s.plan.seed,
                    s.plan.budget,
                    observer,
                )?;
                // The folds were chosen because every run's cap fits the budget at the
                // probe's step time: each run is given its cap, not a share of what the
                // clock says is left, so that the choice and the final model's steps (the
                // folds' median) are the same bits on a busy machine as on a quiet one.
                let mut fold_scored = finish(ws, s.plan, probed, f64::INFINITY)?;
                // The choice and the final model (every row) take the candidate as listed.
                fold_scored.candidate = c.clone();
                scored.push(fold_scored);
            }
            Ok(scored)
        };
        // As on the one carve: a candidate that fails for a reason of its own is left
        // out (and said), anything else ends the fit.
        match on_folds(observer) {
            Ok(scored) => results.push(Ok(scored)),
            Err(e) if is_candidates_own(&e) => {
                observer.event(FitEvent::CandidateFailed {
                    name: &c.name,
                    error: &e,
                });
                results.push(Err(Row::failed(c, &e)));
            }
            Err(e) => return Err(e),
        }
    }
    let per_candidate: Vec<&Vec<Scored>> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    anyhow::ensure!(
        !per_candidate.is_empty(),
        "every candidate failed on the folds (the lines above say why); nothing was chosen"
    );
    let mut floors = Vec::new();
    for fold in &folds {
        floors.push(frequency_floor(ws, &ws.dataset_named(fold)?, s.plan.kind)?);
    }
    let floor = (
        mean(floors.iter().map(|f| f.0)),
        mean(floors.iter().map(|f| f.1)),
    );
    observer.event(FitEvent::FoldTable(&fold_table(&per_candidate, floor)));
    let rows: Vec<Row> = results
        .into_iter()
        .map(|r| match r {
            Ok(folds) => Row::Scored(Box::new(combined(folds))),
            Err(failed) => failed,
        })
        .collect();
    let ranking = s.plan.kind == crate::store::catalog::LabelKind::Multilabel;
    for row in &rows {
        observer.event(FitEvent::CandidateDone(&candidate_outcome(row, ranking)));
    }
    Ok(Some((rows, floor)))
}

/// `c` with its svd's R and M, and its M, within a fold's `rows` training rows: they were
/// sized from the one carve's rows, and a fold's training split can hold a few fewer
/// (R ≤ N − 1, M ≤ N, as the rule sizes them).
fn within_rows(c: &Candidate, rows: u64) -> Candidate {
    let mut c = c.clone();
    let rows = usize::try_from(rows).unwrap_or(usize::MAX);
    let within = |v: &mut Option<usize>, most: usize| *v = v.map(|v| v.min(most));
    within(&mut c.svd.rank, rows.saturating_sub(1).max(1));
    within(&mut c.svd.inducing, rows.max(1));
    within(&mut c.train.inducing, rows.max(1));
    c
}

/// Ingests the training file (and test file) as fold `fold` of `folds`.
fn ingest_fold(ws: &Workspace, s: &Selection<'_>, fold: u32, folds: u32) -> Result<String> {
    let config = fold_config(s.inputs, s.name, fold, folds, s.plan.seed)?;
    crate::ingest::run(ws, &config)?;
    Ok(config.name)
}

/// The ingest of fold `fold` of `folds` of the training file, as dataset `NAME-foldI`.
pub(super) fn fold_config(
    inputs: &Inputs,
    name: &str,
    fold: u32,
    folds: u32,
    seed: u64,
) -> Result<IngestConfig> {
    let carve = ValidationSplit::fold(fold, folds, seed);
    inputs.config(&format!("{name}-fold{fold}"), Some(carve))
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
    sum / f64::from(n.max(1))
}

/// The sample standard deviation (0 for fewer than two values).
fn spread(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let m = mean(values.iter().copied());
    let squares: f64 = values.iter().map(|v| (v - m) * (v - m)).sum();
    (squares / (values.len() - 1) as f64).sqrt()
}

/// The median of `values` (the lower middle of an even count): steps are counts, and one
/// fold whose run went to the cap should not pull the final model's steps.
fn median(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0)
}

/// One candidate's folds as one [`Scored`]: the mean of each figure the rule reads, the
/// median of the steps its runs planned and trained (the final model trains that many),
/// the sums of their seconds.
fn combined(folds: Vec<Scored>) -> Scored {
    let keys: Vec<(f64, f64)> = folds.iter().map(Scored::key).collect();
    let key = (
        mean(keys.iter().map(|k| k.0)),
        mean(keys.iter().map(|k| k.1)),
    );
    let planned = median(folds.iter().map(|f| f.planned).collect());
    let steps = median(folds.iter().map(|f| f.steps).collect());
    let seconds = folds.iter().map(|f| f.seconds).sum();
    let step_seconds = mean(folds.iter().map(|f| f.step_seconds));
    let converged = folds.iter().all(|f| f.converged);
    let svd_seconds = mean(folds.iter().map(|f| f.svd_seconds));
    let scoring_seconds = mean(folds.iter().map(|f| f.scoring_seconds));
    let run_seconds = mean(folds.iter().map(|f| f.run_seconds));
    let first = folds.into_iter().next().expect("at least one fold");
    Scored {
        metrics: with_key(first.metrics, key),
        candidate: first.candidate,
        step_seconds,
        planned,
        steps,
        final_steps: None,
        seconds,
        // The folds' runs are not trained on: the final model trains the median steps.
        run: first.run,
        every: first.every,
        converged,
        // Each fold's plateau is in its key, whose mean `metrics` now holds.
        plateau: None,
        open: false,
        restart: None,
        unreserved: false,
        final_is_probe: false,
        svd_seconds,
        scoring_seconds,
        run_seconds,
    }
}

/// `e` with the figures [`Scored::key`] reads set to `key`.
fn with_key(mut e: Evaluation, (primary, secondary): (f64, f64)) -> Evaluation {
    match &mut e {
        Evaluation::Ranking(m) => {
            if let Some(p1) = m.p_at.first_mut() {
                *p1 = primary;
            }
            if let Some(p3) = m.p_at.get_mut(2) {
                *p3 = secondary;
            }
        }
        Evaluation::Binary(b) => {
            b.accuracy = primary;
            b.nlp = -secondary;
        }
        Evaluation::Multiclass(m) => {
            m.accuracy = primary;
            m.nlp = Some(-secondary);
        }
    }
    e
}

/// The fold table of `per_candidate`'s runs and the label frequencies' mean figures.
fn fold_table(per_candidate: &[&Vec<Scored>], floor: (f64, f64)) -> FoldTable {
    let ranking = matches!(
        per_candidate
            .first()
            .and_then(|f| f.first())
            .map(|s| &s.metrics),
        Some(Evaluation::Ranking(_))
    );
    let rows = per_candidate
        .iter()
        .map(|runs| {
            let keys: Vec<(f64, f64)> = runs.iter().map(Scored::key).collect();
            let a: Vec<f64> = keys.iter().map(|k| k.0).collect();
            let b: Vec<f64> = keys.iter().map(|k| k.1).collect();
            FoldRow {
                name: runs[0].candidate.name.clone(),
                step_ms: 1e3 * mean(runs.iter().map(|r| r.step_seconds)),
                steps: runs.iter().map(|r| r.steps).collect(),
                median_steps: median(runs.iter().map(|r| r.steps).collect()),
                seconds: runs.iter().map(|r| r.seconds).sum::<f64>(),
                primary: (mean(a.iter().copied()), spread(&a)),
                secondary: (mean(b.iter().copied()), spread(&b)),
            }
        })
        .collect();
    FoldTable {
        folds: per_candidate.first().map_or(0, |f| f.len()),
        ranking,
        rows,
        baseline: floor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fold_count_is_the_carves_share() {
        assert_eq!(fold_count(0.2), 5);
        assert_eq!(fold_count(0.25), 4);
        assert_eq!(fold_count(0.3), 3);
        assert_eq!(fold_count(0.5), 2);
        assert_eq!(fold_count(0.9), 2);
        assert_eq!(fold_count(0.01), MAX_FOLD_COUNT);
        assert_eq!(fold_count(1e-300), MAX_FOLD_COUNT);
    }

    #[test]
    fn capped_runs_are_priced_at_each_candidates_own_step() {
        // Four candidates at 1 s of svd and probe and 2 ms a step, 5 folds, a cap of 3 000:
        // each run 1 + 3 000 · 0.002 / 0.7 = 9.571 s, 20 runs 191.4 s.
        let same = [(1.0, 0.002); 4];
        assert!((capped_runs_seconds(5, &same, 3000) - 191.428_571).abs() < 1e-3);
        // One candidate ten times dearer a step (free Z beside the axes) costs what the
        // other three do together and more: the first probe alone would price it at 2 ms.
        let mixed = [(1.0, 0.002), (1.0, 0.02), (1.0, 0.002), (1.0, 0.002)];
        let priced = capped_runs_seconds(5, &mixed, 3000);
        assert!((priced - (191.428_571 + 5.0 * 3000.0 * 0.018 / STEP_SHARE)).abs() < 1e-3);
        assert_eq!(capped_runs_seconds(5, &[], 3000), 0.0);
    }

    #[test]
    fn steps_are_the_median_and_figures_the_mean() {
        assert_eq!(median(vec![600, 3000, 900, 720, 660]), 720);
        assert_eq!(median(vec![4, 1]), 1);
        assert_eq!(median(Vec::new()), 0);
        assert!((spread(&[1.0, 3.0]) - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(spread(&[5.0]), 0.0);
        let mut acc = crate::metrics::binary::BinaryAccumulator::new();
        acc.add_row(0.9, true).unwrap();
        let e = Evaluation::Binary(acc.finish());
        let fold = |accuracy: f64, nlp: f64, steps: u64| Scored {
            candidate: Candidate {
                name: "c".into(),
                svd: crate::svd::SvdOptions::new(""),
                train: crate::train::TrainOptions::default(),
            },
            step_seconds: 0.01,
            planned: 3000,
            steps,
            final_steps: None,
            seconds: 2.0,
            metrics: with_key(e.clone(), (accuracy, -nlp)),
            run: 1,
            every: 0,
            converged: false,
            plateau: None,
            open: true,
            restart: None,
            unreserved: false,
            final_is_probe: false,
            svd_seconds: 0.5,
            scoring_seconds: 0.25,
            run_seconds: 0.75,
        };
        let c = combined(vec![
            fold(0.90, 0.30, 600),
            fold(0.80, 0.40, 3000),
            fold(0.85, 0.20, 900),
        ]);
        assert!((c.key().0 - 0.85).abs() < 1e-12 && (c.key().1 + 0.30).abs() < 1e-12);
        assert_eq!((c.steps, c.planned, c.seconds), (900, 3000, 6.0));
    }
}
