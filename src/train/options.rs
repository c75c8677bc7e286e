//! What a caller asks of `pipeline train` (the command line, or a spec's `[train]` table):
//! the options that become a run's [`TrainConfig`] and those that only steer how it runs.

use anyhow::{bail, ensure, Context, Result};

use super::batches::MAX_EPOCHS;
use super::declare::{define_train_options, join_epochs, train_option_table};
use super::early::DEFAULT_PATIENCE;
use super::{budget, early};
use crate::choice::Choice;
use crate::error::InvalidOptions;
use crate::model::optim::AdamConfig;
use crate::stage::threads_or_all;
use crate::store::catalog::{DatasetRow, Split, StageKind};
use crate::store::npy::NpyMap;
use crate::store::workspace::Workspace;
use crate::trained::{
    newest_svd_run, ArdChoice, EarlyStopping, InducingInputs, KernelChoice, LatentChoice,
    LikelihoodChoice, LrDecay, Negatives, QForm, Retention, Steering, StopMetric, SvdFiles, Task,
    TrainConfig, WarmStart,
};

/// `--prior-variance`'s bounds: six orders of magnitude either way of the default, 1, which
/// keep log σ_f² and Φ's entries far from overflow while covering every scale a
/// regulariser's search would try.
pub const MIN_PRIOR_VARIANCE: f64 = 1e-6;
pub const MAX_PRIOR_VARIANCE: f64 = 1e6;

/// `--lr-decay`'s default γ: each decay divides η by 10.
pub const DEFAULT_LR_DECAY: f64 = 0.1;

/// P of the factor model when `--factors` is not given, before it is held to the L labels:
/// the paper's P = 30 (Delicious, L = 983). Each GP costs its own M×M work a step, while
/// with the GPs' shared kernel the prior of f = Φg + b is reached in full at P = L (Φ Φᵀ
/// of rank ≤ L is any coregionalisation of L outputs), so the default stops at L.
pub const DEFAULT_FACTORS: usize = 30;

train_option_table!(define_train_options);

impl TrainFlag {
    /// The flag of a command-line argument id (`max_steps`).
    pub fn of_arg_id(id: &str) -> Result<TrainFlag, String> {
        id.replace('_', "-").parse()
    }

    /// The command line's argument id of this flag (`max_steps`).
    pub fn arg_id(self) -> String {
        self.name().replace('-', "_")
    }
}

impl TrainOptions {
    /// The configuration of a new run: the dataset's current ingest, its newest svd run
    /// unless one is named, M from that run's `a_init.npy` and P from the labels unless
    /// given. Prints the sizes it decided and where each came from ([`Sizes`]).
    pub fn config(&self, ws: &Workspace) -> Result<TrainConfig> {
        let name = self.dataset.as_deref().context("--dataset is required")?;
        let dataset = ws.dataset_named(name)?;
        let svd_run = match self.svd {
            Some(id) => ws.run_numbered(id, StageKind::Svd)?.id,
            None => newest_svd_run(ws, &dataset)?,
        };
        let a_init = SvdFiles::of_run(ws, svd_run)?.a_init;
        let (a_rows, rank) = NpyMap::open_registered(&a_init)?.view2::<f32>()?.dim();
        let n_labels = dataset.n_labels as usize;
        let factors = self.latent_functions(n_labels)?;
        let mut config = TrainConfig {
            dataset: dataset.name.clone(),
            dataset_checksum: dataset.checksum.clone(),
            svd_run,
            kernel: self.kernel,
            // Axes: one inducing feature per input feature, M = D.
            inducing: match self.inducing_inputs {
                InducingInputs::Axes => usize::try_from(dataset.n_features)?,
                _ => self.inducing.unwrap_or(a_rows),
            },
            factors,
            batch: self.batch,
            epochs: self.epochs,
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: AdamConfig::default().eps,
            negatives: self.negatives,
            quadrature: self.quadrature,
            seed: self.seed,
            threads: threads_or_all(self.threads),
            freeze_a: self.a_frozen(),
            freeze_hyper: self.freeze_hyper,
            shuffle_chunks: self.shuffle_chunks,
            checkpoint_every: self.checkpoint_every,
            max_steps: self.max_steps,
            steps: self.steps,
            ard: self.ard,
            release_hyper_after: self.release_hyper_after,
            q_form: self.q_form,
            warm_start: self.warm_start,
            natural_step: self.natural_step,
            inducing_inputs: self.stored_inducing_inputs(),
            likelihood: self.likelihood,
            task: self.task,
            latent: self.latent,
            robust_max_epsilon: self.stored_epsilon(),
            mc_pairs: self.stored_pairs(),
            amortiser_hidden: self.stored_hidden(),
            class_samples: self.class_samples,
            learn_epsilon: self.learn_epsilon,
            lr_decay: self.stored_lr_decay(),
            early_stopping: None,
            prior_variance: self.stored_prior_variance(),
            frequent_negatives: self.frequent_negatives,
        };
        check_task(&config, name, &dataset)?;
        let planner = budget::planner_of(ws, &dataset, &config)?;
        let explicit_epochs = self.given.contains(&TrainFlag::Epochs);
        if let Some(note) = budget::settle(&mut config, &planner, explicit_epochs)? {
            crate::progress::note(note.to_string());
        }
        check_lr_decay_reached(&config)?;
        config.early_stopping = self.early_stopping(&config, &planner, &dataset)?;
        check_limits(&config)?;
        let train_rows = dataset.split(Split::Train).map_or(0, |s| s.n_rows);
        check_inducing_count(&config, (svd_run, a_rows), train_rows)?;
        check_q_form(&config, rank)?;
        check_warm_start(&config)?;
        check_natural_step(&config)?;
        let sizes = Sizes {
            options: self,
            svd_run,
            rank,
            n_labels,
            n_features: dataset.n_features,
        };
        crate::progress::note(format!(
            "train on '{}': {}",
            dataset.name,
            sizes.describe(&config)
        ));
        Ok(config)
    }

    /// P, the number of latent GPs: `--factors`, else min([`DEFAULT_FACTORS`], L) for the
    /// factor model; with `--latent independent` the K labels (`--factors` may then only be
    /// left out or equal K). A `--factors` above L is the user's choice and is kept: the
    /// model is well defined (its q(u) family grows with P), and it costs P GPs' work, which
    /// the memory estimate checks; [`Sizes::describe`] says so.
    fn latent_functions(&self, n_labels: usize) -> Result<usize> {
        match (self.latent, self.factors) {
            (LatentChoice::Factor, Some(p)) => Ok(p),
            (LatentChoice::Factor, None) => Ok(DEFAULT_FACTORS.min(n_labels).max(1)),
            (LatentChoice::Independent, p) => {
                ensure!(
                    p.is_none_or(|p| p == n_labels),
                    "--factors {} with --latent independent: that is one GP per label, P = K = \
                     {n_labels} for this dataset; leave --factors out (or give {n_labels}), or \
                     use --latent factor",
                    p.unwrap_or(0)
                );
                Ok(n_labels)
            }
        }
    }

    /// `--early-stopping` as the configuration stores it: the metric (the task's unless
    /// given), the patience, and the period (a fiftieth of the budget unless given). Refused
    /// for a dataset without a validation split, naming the ingest option that carves one.
    fn early_stopping(
        &self,
        config: &TrainConfig,
        planner: &super::batches::Planner,
        dataset: &DatasetRow,
    ) -> Result<Option<EarlyStopping>> {
        if !self.early_stopping {
            return Ok(None);
        }
        ensure!(
            dataset.split(Split::Validation).is_some(),
            "--early-stopping scores the validation split, and dataset '{}' has none; carve \
             one from the training rows with 'pipeline ingest ... --validation-fraction 0.2 \
             --replace' (in a spec: [ingest] validation_fraction = 0.2)",
            dataset.name
        );
        let budget = budget::budget_steps(config, planner)
            .context("the budget's steps (more epochs than the limit)")?;
        let every = self.validate_every.unwrap_or(early::default_every(budget));
        ensure!(
            every <= budget,
            "--validate-every {every}: the budget is {budget} steps, so early stopping would \
             never score the validation split; give at most {budget}"
        );
        Ok(Some(EarlyStopping {
            metric: self.stop_metric.unwrap_or(StopMetric::of_task(config.task)),
            patience: self.patience,
            every,
        }))
    }

    /// Whether the inducing inputs stay at their initial value: `--freeze-a`, or an
    /// `--inducing-inputs` that fixes them.
    pub fn a_frozen(&self) -> bool {
        self.freeze_a
            || matches!(
                self.inducing_inputs,
                InducingInputs::FixedSubspace | InducingInputs::FixedRows
            )
    }

    /// `--inducing-inputs` as a configuration stores it: `fixed-subspace` is `subspace`
    /// with A frozen, the configuration `--freeze-a` has always written.
    pub fn stored_inducing_inputs(&self) -> InducingInputs {
        match self.inducing_inputs {
            InducingInputs::FixedSubspace => InducingInputs::Subspace,
            other => other,
        }
    }

    /// `--lr-decay-at` and `--lr-decay` as a configuration stores them: only with a decay
    /// epoch listed.
    pub fn stored_lr_decay(&self) -> Option<LrDecay> {
        (!self.lr_decay_at.is_empty()).then(|| LrDecay {
            after: self.lr_decay_at.clone(),
            factor: self.lr_decay,
        })
    }

    /// `--prior-variance` as a configuration stores it: only when not the default, 1, so
    /// runs from before the option keep their identity.
    pub fn stored_prior_variance(&self) -> Option<f64> {
        self.prior_variance.filter(|&v| v != 1.0)
    }

    /// `--robust-max-epsilon` as a configuration stores it: only for a robust-max run, and
    /// only when not the default.
    pub fn stored_epsilon(&self) -> Option<f64> {
        (self.likelihood == LikelihoodChoice::RobustMax
            && self.robust_max_epsilon
                != crate::model::likelihood::multiclass::robust_max::DEFAULT_EPSILON)
            .then_some(self.robust_max_epsilon)
    }

    /// `--mc-pairs` as a configuration stores it: only for a softmax or one-vs-each run,
    /// and only when not the default.
    pub fn stored_pairs(&self) -> Option<usize> {
        (self.likelihood.has_mc_pairs()
            && self.mc_pairs != crate::model::likelihood::multiclass::softmax_mc::DEFAULT_PAIRS)
            .then_some(self.mc_pairs)
    }

    /// `--amortiser-hidden` as a configuration stores it: only for an augment-and-reduce
    /// run, and only when not the default.
    pub fn stored_hidden(&self) -> Option<usize> {
        (self.likelihood.is_amortised()
            && self.amortiser_hidden
                != crate::model::likelihood::multiclass::amortiser::DEFAULT_HIDDEN)
            .then_some(self.amortiser_hidden)
    }

    /// The steering options these options ask for.
    pub fn steering(&self) -> Steering {
        Steering {
            keep_checkpoints: self.keep_checkpoints,
            prefetch: self.prefetch,
            eval_every: self.eval_every,
            eval_split: self.eval_split,
            final_elbo: self.final_elbo,
        }
    }

    /// Checks the values no type rules out; `run` and `pipeline run`'s spec check call it.
    pub fn validate(&self) -> Result<(), InvalidOptions> {
        let mut c = InvalidOptions::new("");
        let at_least_1 = || "must be at least 1".to_string();
        c.check(self.inducing != Some(0), "inducing", at_least_1);
        c.check(self.factors != Some(0), "factors", at_least_1);
        c.check(self.batch >= 1, "batch", at_least_1);
        c.check(self.epochs <= MAX_EPOCHS, "epochs", || {
            epochs_problem(self.epochs)
        });
        c.check(self.max_steps != Some(0), "max-steps", || {
            "must be ≥ 1".into()
        });
        c.check(self.steps != Some(0), "steps", || "must be ≥ 1".into());
        c.check(
            !(self.steps.is_some() && self.given.contains(&TrainFlag::Epochs)),
            "steps",
            || "and --epochs are two budgets: give one".into(),
        );
        self.check_early_stopping(&mut c);
        c.check(self.lr.is_finite(), "lr", || {
            format!("must be finite, not {}", self.lr)
        });
        c.check(!self.lr.is_finite() || self.lr > 0.0, "lr", || {
            "must be > 0".into()
        });
        self.check_lr_decay(&mut c);
        for (option, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            c.check((0.0..1.0).contains(&beta), option, || {
                format!("must be in [0, 1), not {beta}")
            });
        }
        c.check(self.quadrature >= 1, "quadrature", at_least_1);
        c.check(
            !(self.freeze_a && self.inducing_inputs == InducingInputs::Free),
            "inducing-inputs",
            || {
                "free trains Z, --freeze-a fixes it: give one (fixed-rows keeps training rows \
                 fixed, fixed-subspace the k-means inducing inputs)"
                    .into()
            },
        );
        self.check_axes(&mut c);
        c.check(
            !(self.ard == ArdChoice::Features && self.inducing_inputs.in_features()),
            "ard",
            || {
                format!(
                    "features with --inducing-inputs {}: the basis is the identity there, so \
                     --ard subspace already learns exactly one weight per input feature; use \
                     --ard subspace",
                    self.inducing_inputs.name()
                )
            },
        );
        self.check_class_options(&mut c);
        c.check(
            !(self.task == Task::Binary && self.negatives != Negatives::All),
            "negatives",
            || {
                format!(
                    "{} with --task binary: a binary problem has one label, so every row is \
                     one term (positive or negative) and --negatives all is the only choice",
                    self.negatives
                )
            },
        );
        c.check(
            self.frequent_negatives.is_none() || matches!(self.negatives, Negatives::Sample(_)),
            "frequent-negatives",
            || {
                format!(
                    "needs --negatives COUNT (found --negatives {}): with every negative in the \
                     bound there is nothing to sample around the frequent labels",
                    self.negatives
                )
            },
        );
        c.check(self.checkpoint_every >= 1, "checkpoint-every", || {
            "must be ≥ 1".into()
        });
        c.check(
            self.release_hyper_after != Some(0),
            "release-hyper-after",
            || "must be ≥ 1 (epochs with the hyperparameters frozen)".into(),
        );
        c.check(
            self.release_hyper_after.is_none_or(|e| e <= MAX_EPOCHS),
            "release-hyper-after",
            || epochs_problem(self.release_hyper_after.unwrap_or(0)),
        );
        c.check(
            self.natural_step.is_none_or(|g| g > 0.0 && g <= 1.0),
            "natural-step",
            || "must be in (0, 1] (the natural-gradient step size γ)".into(),
        );
        c.check(
            self.prior_variance
                .is_none_or(|v| (MIN_PRIOR_VARIANCE..=MAX_PRIOR_VARIANCE).contains(&v)),
            "prior-variance",
            || format!("must be in [{MIN_PRIOR_VARIANCE}, {MAX_PRIOR_VARIANCE}]"),
        );
        c.check(
            !(self.freeze_hyper && self.release_hyper_after.is_some()),
            "release-hyper-after",
            || "cannot be combined with --freeze-hyper (which never releases them)".into(),
        );
        c.into_result()
    }
}

impl TrainOptions {
    /// `--inducing-inputs axes` is the linear kernel's weights (`model/qu/axes.rs`): the
    /// linear kernel without ARD, the paper's q(u) form, and M = D, so no `--inducing`.
    fn check_axes(&self, c: &mut InvalidOptions) {
        if self.inducing_inputs != InducingInputs::Axes {
            return;
        }
        c.check(self.kernel == KernelChoice::Linear, "kernel", || {
            format!(
                "{} with --inducing-inputs axes: the axes are the linear kernel's weights; use --kernel linear",
                self.kernel
            )
        });
        c.check(self.q_form == QForm::SiteDiagonal, "q-form", || {
            format!(
                "{} with --inducing-inputs axes, whose q(u) is the paper's form with a diagonal K_Z; use --q-form sites",
                self.q_form
            )
        });
        c.check(self.ard == ArdChoice::None, "ard", || {
            format!(
                "{} with --inducing-inputs axes: the prior there is one variance for every feature; leave out --ard",
                self.ard
            )
        });
        c.check(self.inducing.is_none(), "inducing", || {
            "with --inducing-inputs axes, which has one inducing feature per input feature (M = D); leave out --inducing"
                .into()
        });
        c.check(!self.freeze_a, "freeze-a", || {
            "with --inducing-inputs axes, which has no inducing inputs to train or fix".into()
        });
    }

    /// `--patience`, `--validate-every` and `--stop-metric`: ≥ 1, and only with
    /// `--early-stopping` (for a new run; on resume the run's values are compared,
    /// `resume.rs`); the metric must be one the task's held-out evaluation measures.
    fn check_early_stopping(&self, c: &mut InvalidOptions) {
        c.check(self.patience >= 1, "patience", || {
            "must be at least 1".into()
        });
        c.check(self.validate_every != Some(0), "validate-every", || {
            "must be at least 1".into()
        });
        let new_run = self.resume.is_none();
        for (flag, given) in [
            (
                TrainFlag::Patience,
                self.given.contains(&TrainFlag::Patience),
            ),
            (TrainFlag::ValidateEvery, self.validate_every.is_some()),
            (TrainFlag::StopMetric, self.stop_metric.is_some()),
        ] {
            c.check(
                !new_run || self.early_stopping || !given,
                flag.name(),
                || "is an option of early stopping: give --early-stopping too".into(),
            );
        }
        if let Some(metric) = self.stop_metric {
            c.check(!new_run || metric.suits(self.task), "stop-metric", || {
                format!(
                    "{metric} is not measured for --task {}: give {}",
                    self.task,
                    StopMetric::listed(|m| m.suits(self.task))
                )
            });
        }
    }

    /// `--lr-decay-at`: strictly increasing epoch counts, each ≥ 1 and, for a new run, below
    /// the budget's epochs (a decay after the last epoch would change nothing); `--lr-decay`:
    /// finite and > 0, and only with `--lr-decay-at`.
    fn check_lr_decay(&self, c: &mut InvalidOptions) {
        let at = &self.lr_decay_at;
        c.check(at.first() != Some(&0), "lr-decay-at", || {
            "must be ≥ 1 (epochs trained before each decay)".into()
        });
        c.check(at.windows(2).all(|w| w[0] < w[1]), "lr-decay-at", || {
            format!("must increase strictly, not {}", join_epochs(at))
        });
        // Against an explicit --epochs here; against any budget once it is settled
        // (`check_lr_decay_reached`: the default epochs may be raised, --steps reaches some).
        let explicit_epochs = self.given.contains(&TrainFlag::Epochs) && self.steps.is_none();
        c.check(
            self.resume.is_some() || !explicit_epochs || decay_reached(at, self.epochs).is_ok(),
            "lr-decay-at",
            || decay_reached(at, self.epochs).unwrap_err(),
        );
        let gamma = self.lr_decay;
        c.check(gamma.is_finite() && gamma > 0.0, "lr-decay", || {
            format!("must be finite and > 0, not {gamma}")
        });
        c.check(
            self.resume.is_some() || !at.is_empty() || gamma == DEFAULT_LR_DECAY,
            "lr-decay",
            || format!("{gamma} is the factor of --lr-decay-at's decays; give the epochs too"),
        );
    }

    /// The likelihood must suit the task (a Bernoulli link for binary and multi-label, a
    /// class likelihood for multi-class), and the options of one likelihood are refused
    /// with another.
    fn check_class_options(&self, c: &mut InvalidOptions) {
        let lik = self.likelihood;
        // On resume the likelihood and task not given are the run's, which the resume rules
        // compare (`resume.rs`); only the values themselves are checked here then.
        let new_run = self.resume.is_none();
        c.check(
            !new_run || self.task != Task::Multiclass || lik.is_multiclass(),
            "likelihood",
            || {
                format!(
                    "{} with --task multiclass: give a likelihood of one class among K, \
                     --likelihood {}",
                    lik.name(),
                    LikelihoodChoice::listed_by(|t| t.multiclass)
                )
            },
        );
        c.check(
            !new_run || self.task == Task::Multiclass || !lik.is_multiclass(),
            "likelihood",
            || {
                format!(
                    "{} is a likelihood of one class among K: it needs --task multiclass \
                     (--task {} takes {})",
                    lik.name(),
                    self.task,
                    LikelihoodChoice::listed_by(|t| !t.multiclass)
                )
            },
        );
        c.check(
            self.task != Task::Multiclass || self.negatives == Negatives::All,
            "negatives",
            || {
                format!(
                    "{} with --task multiclass: every row is one term (its class), so \
                     --negatives all is the only choice",
                    self.negatives
                )
            },
        );
        let eps = self.robust_max_epsilon;
        c.check(eps > 0.0 && eps < 1.0, "robust-max-epsilon", || {
            format!("must lie in (0, 1), not {eps}")
        });
        c.check(
            !new_run
                || lik == LikelihoodChoice::RobustMax
                || eps == crate::model::likelihood::multiclass::robust_max::DEFAULT_EPSILON,
            "robust-max-epsilon",
            || format!("{eps} is robust-max's ε; the likelihood is {}", lik.name()),
        );
        c.check(
            !new_run || !self.learn_epsilon || lik == LikelihoodChoice::RobustMax,
            "learn-epsilon",
            || format!("trains robust-max's ε; the likelihood is {}", lik.name()),
        );
        c.check(self.mc_pairs >= 1, "mc-pairs", || {
            "must be at least 1".into()
        });
        c.check(
            !new_run
                || lik.has_mc_pairs()
                || self.mc_pairs == crate::model::likelihood::multiclass::softmax_mc::DEFAULT_PAIRS,
            "mc-pairs",
            || {
                format!(
                    "{} are the softmax's Monte Carlo pairs (--likelihood {}); the likelihood \
                     is {}",
                    self.mc_pairs,
                    LikelihoodChoice::listed_by(|t| t.mc_pairs),
                    lik.name()
                )
            },
        );
        self.check_augment_options(c);
    }

    /// `--amortiser-hidden` and `--class-samples`: positive, and only with the likelihoods
    /// that have them; an amortised likelihood reads the rows as the model sees them, which
    /// `--ard features` reweights every step.
    fn check_augment_options(&self, c: &mut InvalidOptions) {
        let (lik, new_run) = (self.likelihood, self.resume.is_none());
        let hidden = self.amortiser_hidden;
        c.check(hidden >= 1, "amortiser-hidden", || {
            "must be at least 1".into()
        });
        c.check(
            !new_run
                || lik.is_amortised()
                || hidden == crate::model::likelihood::multiclass::amortiser::DEFAULT_HIDDEN,
            "amortiser-hidden",
            || {
                format!(
                    "{hidden} is the width of the augment-and-reduce likelihoods' amortisation \
                     network (--likelihood {}); the likelihood is {}",
                    LikelihoodChoice::listed_by(|t| t.amortised),
                    lik.name()
                )
            },
        );
        c.check(self.class_samples != Some(0), "class-samples", || {
            "must be at least 1".into()
        });
        c.check(
            !new_run || self.class_samples.is_none() || lik.samples_classes(),
            "class-samples",
            || {
                format!(
                    "class subsampling needs a bound that is a sum over the negative classes \
                     (--likelihood {}); the likelihood is {}",
                    LikelihoodChoice::listed_by(|t| t.samples_classes),
                    lik.name()
                )
            },
        );
        c.check(
            !(lik.is_amortised() && self.ard == ArdChoice::Features),
            "ard",
            || {
                format!(
                    "features with --likelihood {}: the amortisation network reads the rows as \
                     the model sees them, which feature ARD reweights every step; use --ard \
                     subspace or none",
                    lik.name()
                )
            },
        );
    }
}

/// What decided a new run's M, P and R, for the line `pipeline train` prints before it
/// starts (the values themselves are recorded in its configuration, which `status` shows).
struct Sizes<'a> {
    options: &'a TrainOptions,
    svd_run: i64,
    /// The svd run's R (the columns of its `a_init.npy`).
    rank: usize,
    n_labels: usize,
    n_features: u64,
}

impl Sizes<'_> {
    /// `M = 16 (a_init.npy of svd run 2), P = 6 (--factors left out: min(30, L = 6)), R = 8
    /// (svd run 2)`, with a note when a given value exceeds what the data holds.
    fn describe(&self, config: &TrainConfig) -> String {
        let o = self.options;
        let (svd, l) = (self.svd_run, self.n_labels);
        let m = match (o.inducing, config.inducing_inputs) {
            (_, InducingInputs::Axes) => "--inducing-inputs axes: one per feature, M = D".into(),
            (Some(_), _) => "--inducing".to_string(),
            (None, InducingInputs::FixedRows) => format!(
                "--inducing left out: the rows of svd run {svd}'s a_init.npy; fixed-rows draws \
                 that many training rows"
            ),
            (None, _) => format!("--inducing left out: the k-means centroids of svd run {svd}"),
        };
        let p = match (config.latent, o.factors) {
            (LatentChoice::Independent, _) => format!("--latent independent: P = K = {l}"),
            (LatentChoice::Factor, Some(p)) if p > l => format!(
                "--factors, above L = {l}: the prior of f = Φg + b is whole at P = L, the GPs \
                 beyond it add their M×M work a step"
            ),
            (LatentChoice::Factor, Some(_)) => "--factors".to_string(),
            (LatentChoice::Factor, None) => {
                format!("--factors left out: min({DEFAULT_FACTORS}, L = {l})")
            }
        };
        let r = match config.inducing_inputs.in_features() {
            true => format!(
                "R = D = {} (inducing inputs in input space; their start from svd run {svd}, \
                 R = {})",
                self.n_features, self.rank
            ),
            false => format!("R = {} (svd run {svd})", self.rank),
        };
        let negatives = match config.negatives {
            Negatives::Sample(s) if s >= l => format!(
                "; --negatives {s} ≥ L = {l} takes every negative label of every row, the \
                 bound of --negatives all computed term by term"
            ),
            _ => String::new(),
        };
        format!(
            "M = {} ({m}), P = {} ({p}), {r}{negatives}",
            config.inducing, config.factors
        )
    }
}

/// M against where the inducing inputs come from, before anything is allocated for them
/// (M×M per GP): `fixed-rows` takes M distinct training rows, so M ≤ N; the other kinds
/// start at the first M k-means centroids of the svd run's `a_init.npy` (the run's id and
/// that file's row count are given), so M ≤ those rows, and k-means of N rows has at most N distinct
/// centroids, so M ≤ N too.
fn check_inducing_count(
    config: &TrainConfig,
    (svd_run, a_rows): (i64, usize),
    train_rows: u64,
) -> Result<()> {
    if config.inducing_inputs == InducingInputs::Axes {
        // M = D inducing features, none of them a row or a centroid.
        return Ok(());
    }
    let (m, kind) = (config.inducing as u64, config.inducing_inputs.name());
    ensure!(
        m <= train_rows,
        "--inducing {m} with --inducing-inputs {kind}: the inducing inputs are {} of the \
         N = {train_rows} training rows of '{}', so M can be at most N = {train_rows}; give \
         --inducing ≤ {train_rows}",
        match config.inducing_inputs {
            InducingInputs::FixedRows => "M distinct rows",
            _ => "k-means centroids",
        },
        config.dataset
    );
    ensure!(
        config.inducing_inputs == InducingInputs::FixedRows || m <= a_rows as u64,
        "--inducing {m} with --inducing-inputs {kind}: the inducing inputs start at the \
         k-means centroids of svd run {svd_run}, which initialised {a_rows}; give --inducing \
         ≤ {a_rows}, or rerun `pipeline svd --inducing {m}`"
    );
    Ok(())
}

/// The checks of a configuration's step options (of a new run, or after a resume changed them).
/// The unwhitened full-Cholesky form needs a non-singular K_Z: its KL holds K_Z⁻¹, so
/// with the linear kernel, whose K_Z = σ_f² A K_X̃ Aᵀ has rank ≤ R, M inducing inputs in a
/// basis of rank R < M would make every step's KL blow up (`docs/model.md`, "Full-Cholesky
/// q(u)"). The whitened form has no K_Z⁻¹ and runs there.
fn check_q_form(config: &TrainConfig, rank: usize) -> Result<()> {
    ensure!(
        !(config.q_form == QForm::Cholesky
            && config.kernel == KernelChoice::Linear
            && config.inducing > rank),
        "--q-form cholesky with --kernel linear needs --inducing ≤ the basis rank R = {rank} \
         (K_Z has rank ≤ R, and the unwhitened form's KL holds K_Z⁻¹); got --inducing {}. \
         Use --q-form whitened, or --kernel se",
        config.inducing
    );
    Ok(())
}

/// `--warm-start ridge` is one Newton step of the logistic likelihood through the sites
/// q(u)'s mean K_xZ μ Φᵀ of dense or basis rows (`train::warm`): other likelihoods, q(u)
/// forms, Φ = I and rows the minibatches carry sparse have no such step here.
fn check_warm_start(config: &TrainConfig) -> Result<()> {
    if config.warm_start == WarmStart::None {
        return Ok(());
    }
    let problem = ridge_start_problem(
        config.likelihood,
        config.task,
        config.q_form,
        config.latent,
        config.ard,
        config.inducing_inputs,
    );
    match problem {
        Some(needs) => bail!("--warm-start {} needs {needs}", config.warm_start),
        None => Ok(()),
    }
}

/// What the ridge start needs that these options lack, if anything.
fn ridge_start_problem(
    likelihood: LikelihoodChoice,
    task: Task,
    q_form: QForm,
    latent: LatentChoice,
    ard: ArdChoice,
    inducing_inputs: InducingInputs,
) -> Option<String> {
    if likelihood != LikelihoodChoice::Logistic || task == Task::Multiclass {
        Some(format!(
            "the logistic likelihood of a multi-label or binary task (got --likelihood \
             {likelihood} --task {task})"
        ))
    } else if q_form != QForm::SiteDiagonal {
        Some(format!("--q-form sites (got {q_form})"))
    } else if latent != LatentChoice::Factor {
        Some("--latent factor (Φ is trained)".to_string())
    } else if ard == ArdChoice::Features {
        Some("rows the minibatches carry dense (not --ard features)".to_string())
    } else if inducing_inputs == InducingInputs::Axes {
        Some("inducing inputs with an M×M K_Z (not --inducing-inputs axes)".to_string())
    } else {
        None
    }
}

impl TrainOptions {
    /// Whether `--warm-start ridge` can start a run of these options (what a new run's
    /// check refuses otherwise): `pipeline fit` drops its ridge start from a candidate
    /// whose options a `--set` made one it cannot start.
    pub fn ridge_start_fits(&self) -> bool {
        ridge_start_problem(
            self.likelihood,
            self.task,
            self.q_form,
            self.latent,
            self.ard,
            self.inducing_inputs,
        )
        .is_none()
    }
}

/// `--natural-step` steps the natural parameters of a Gaussian q(u) with a free covariance
/// (`model::natgrad`): the full-Cholesky forms. The paper's sites form constrains the
/// precision to K_Z⁻¹ + diagonal, on which the natural gradient needs an M×M Fisher solve
/// (½ S∘S) per GP and step (`docs/model.md`, "Natural gradients").
fn check_natural_step(config: &TrainConfig) -> Result<()> {
    if config.natural_step.is_some() && config.q_form == QForm::SiteDiagonal {
        bail!(
            "--natural-step needs a full-Cholesky q(u): --q-form cholesky or whitened (got {})",
            config.q_form
        );
    }
    Ok(())
}

/// `--task binary` is a dataset with one label (L = 1: label 0 the positive class, the
/// rows without it the negative class), every row a term. `--task multiclass` is a dataset
/// of K ≥ 2 classes recorded as multi-class, or any other dataset but a binary one whose
/// every training row turns out to hold exactly one label (checked row by row as the
/// minibatches are formed; a row that does not stops the run naming it).
fn check_task(config: &TrainConfig, dataset: &str, row: &DatasetRow) -> Result<()> {
    let n_labels = row.n_labels;
    match config.task {
        Task::Binary => {
            ensure!(
                n_labels == 1,
                "--task binary needs a dataset with one label (L = 1: label 0 the positive \
                 class, rows without it negative); dataset '{dataset}' has {n_labels} labels. \
                 Use --task multilabel, or ingest the binary problem (a LIBSVM file of ±1 \
                 labels)"
            );
            ensure!(
                config.negatives == Negatives::All,
                "--negatives {} with --task binary: every row is one term, use --negatives all",
                config.negatives
            );
        }
        Task::Multiclass => {
            ensure!(
                row.label_kind() != Task::Binary && n_labels >= 2,
                "--task multiclass needs a dataset of K ≥ 2 classes, one label per row; \
                 dataset '{dataset}' is {} with {n_labels} label(s). Use --task binary",
                row.label_kind()
            );
            ensure!(
                config.likelihood.is_multiclass(),
                "--likelihood {} with --task multiclass: use {}",
                config.likelihood.name(),
                LikelihoodChoice::listed_by(|t| t.multiclass)
            );
        }
        Task::Multilabel => ensure!(
            !config.likelihood.is_multiclass(),
            "--likelihood {} needs --task multiclass",
            config.likelihood.name()
        ),
    }
    Ok(())
}

/// Refuses a decay at or after the last of `epochs` epochs: it would never take effect.
fn decay_reached(at: &[u64], epochs: u64) -> Result<(), String> {
    match at.last() {
        Some(&last) if last >= epochs => Err(format!(
            "{}: a decay after epoch {epochs} or later never takes effect in a run of {epochs} \
             epochs",
            join_epochs(at),
        )),
        _ => Ok(()),
    }
}

/// `--lr-decay-at` against a new run's settled budget (its epochs, or the epochs its steps
/// reach).
fn check_lr_decay_reached(config: &TrainConfig) -> Result<()> {
    let Some(decay) = &config.lr_decay else {
        return Ok(());
    };
    decay_reached(&decay.after, config.epochs).map_err(|problem| {
        let budget = match config.steps {
            Some(steps) => format!(" (--steps {steps})"),
            None => String::new(),
        };
        anyhow::anyhow!("--lr-decay-at {problem}{budget}")
    })
}

/// Why an epoch count is refused ([`MAX_EPOCHS`]).
fn epochs_problem(epochs: u64) -> String {
    format!(
        "must be at most {MAX_EPOCHS}, not {epochs}: an epoch is a full pass over the training \
         rows and runs here converge within a few hundred; give fewer (--max-steps ends a run \
         after a number of steps)"
    )
}

pub fn check_limits(config: &TrainConfig) -> Result<()> {
    ensure!(
        config.checkpoint_every >= 1,
        "--checkpoint-every must be ≥ 1"
    );
    ensure!(
        config.epochs <= MAX_EPOCHS,
        "--epochs {}",
        epochs_problem(config.epochs)
    );
    ensure!(config.max_steps != Some(0), "--max-steps must be ≥ 1");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequent_negatives_need_a_sample_of_the_others() {
        let mut o = TrainOptions {
            frequent_negatives: Some(5),
            ..TrainOptions::default()
        };
        let e = o.validate().unwrap_err().to_string();
        assert!(
            e.contains("frequent-negatives") && e.contains("needs --negatives COUNT"),
            "{e}"
        );
        o.negatives = Negatives::Sample(3);
        assert!(o.validate().is_ok());
    }

    #[test]
    fn likelihood_options_are_stored_only_for_their_likelihood_and_off_the_default() {
        let mut o = TrainOptions {
            task: Task::Multiclass,
            likelihood: LikelihoodChoice::RobustMax,
            ..TrainOptions::default()
        };
        assert_eq!((o.stored_epsilon(), o.stored_pairs()), (None, None));
        o.robust_max_epsilon = 0.01;
        assert_eq!(o.stored_epsilon(), Some(0.01));
        assert!(o.validate().is_ok());
        o.likelihood = LikelihoodChoice::Softmax;
        assert_eq!(o.stored_epsilon(), None);
        let e = o.validate().unwrap_err().to_string();
        assert!(
            e.contains("robust-max's ε; the likelihood is softmax"),
            "{e}"
        );
        o.robust_max_epsilon = crate::model::likelihood::multiclass::robust_max::DEFAULT_EPSILON;
        o.mc_pairs = 4;
        assert_eq!(o.stored_pairs(), Some(4));
        assert!(o.validate().is_ok());
        // On resume the run's likelihood decides (resume.rs compares what is given).
        o.likelihood = LikelihoodChoice::Logistic;
        assert!(o.validate().is_err());
        o.resume = Some(3);
        o.task = Task::Multilabel;
        assert!(o.validate().is_ok());
    }
}
