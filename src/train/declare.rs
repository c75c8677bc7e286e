//! Every option of `pipeline train`, declared once: [`train_option_table!`] holds one row per
//! option, and everything that lists the options is generated from it:
//!
//! - [`TrainFlag`](super::TrainFlag), the option's name (its flag without `--`), in the
//!   table's order (its `Ord`, so the order of every `BTreeSet<TrainFlag>`);
//! - the field of [`TrainOptions`](super::TrainOptions), its default, and
//!   [`TrainValue`](super::TrainValue), one option with its value (`TrainOptions::set`,
//!   `with`, `value`);
//! - the command line's argument (`src/cli/args.rs`, `TrainFlags`): the row's doc comment is
//!   its help, its `#[arg(…)]` its clap attributes, and a row's `= DEFAULT` its
//!   `default_value_t`;
//! - what the option does on resume (`src/train/resume.rs`, `TrainFlag::on_resume`).
//!
//! # Adding a train option
//!
//! Add one row to the table, then use the field where the option takes effect (for an
//! option that changes the model: [`TrainConfig`](crate::trained::TrainConfig), which
//! `TrainOptions::config` fills, and a check in `TrainOptions::validate` if a value can be
//! wrong in a way its parser cannot see). Then regenerate `docs/options.md` (its `--help`
//! part): `FSGP_BLESS=1 cargo test --test it options_doc`.
//!
//! A row reads
//!
//! ```text
//! /// The help of --flag-name (and the field's doc).
//! #[arg(long, value_parser = …)]                    // clap's attributes
//! Variant = "flag-name" { field: Type = DEFAULT }
//!     [listed after OtherVariant]
//!     on resume RULE;
//! ```
//!
//! - `= DEFAULT` is the default, which `--help` shows. Without it the option is absent by
//!   default (the type's `Default`: `None`, `false`, an empty list) and the help shows none.
//! - The rule is `Control` (picks the run to resume, no option of it), `Changes(Changeable::X)`
//!   (applied to the resumed run and recorded; `Changeable` in `resume.rs` says how) or
//!   `Fixed(|config, options| (run's value, given value))`: refused on resume unless the two
//!   texts are equal.
//! - `listed after V` shows the flag in `--help` right after `V`'s, where the table's order
//!   (which is `TrainFlag`'s, and so the order of given options in specs `fit` writes) puts it
//!   elsewhere.
//!
//! - A switch that clears its option names the flag and the clap id itself:
//!   `#[arg(id = "no_final_elbo", long = "no-final-elbo", action = ArgAction::SetFalse)]`
//!   on `final_elbo: bool = true`.
//!
//! Three macros read the rows, each matching this grammar: `define_train_options` (here,
//! expanded in `options.rs`), `define_on_resume` (`resume.rs`) and `define_train_flags`
//! (`src/cli/args.rs`). A row that does not follow it fails to compile.
//!
//! Names in a row resolve where the row is expanded: clap's attributes (`one_of`, `int_in`,
//! the `MAX_*` bounds, the help functions) in `src/cli/args.rs`, the defaults there and in
//! `options.rs`, the resume rules in `resume.rs`. Keeping them unqualified keeps the command
//! line's names out of this layer.

use crate::choice::Choice;
use crate::trained::{Negatives, Retention};

/// Epoch counts as the command line writes them: `40,50`.
pub fn join_epochs(at: &[u64]) -> String {
    at.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// The table of train options. `train_option_table!(m)` calls macro `m` with every row
/// (the module doc says how a row reads).
macro_rules! train_option_table {
    ($generate:ident) => {
        $generate! {
            /// Dataset (as named at ingest); required unless --resume.
            #[arg(long, required_unless_present = "resume")]
            Dataset = "dataset" { dataset: Option<String> }
                on resume Fixed(|c, o| (c.dataset.clone(), or_none(o.dataset.clone())));

            /// SVD run whose factors to use (default: the newest one of the dataset).
            #[arg(long, value_parser = run_id())]
            Svd = "svd" { svd: Option<i64> }
                on resume Fixed(|c, o| (c.svd_run.to_string(), or_none(o.svd.map(|s| s.to_string()))));

            /// The GP kernel (docs/model.md).
            #[arg(long, value_parser = one_of::<KernelChoice>())]
            Kernel = "kernel" { kernel: KernelChoice = KernelChoice::Linear }
                on resume Fixed(|c, o| (c.kernel.name().into(), o.kernel.name().into()));

            /// Automatic relevance determination of the kernel's inputs.
            #[arg(long, value_parser = one_of::<ArdChoice>())]
            Ard = "ard" { ard: ArdChoice = ArdChoice::None }
                on resume Fixed(|c, o| (c.ard.name().into(), o.ard.name().into()));

            /// The form of q(u), the variational distribution of the inducing outputs
            /// (docs/model.md).
            #[arg(long, value_parser = one_of::<QForm>())]
            QForm = "q-form" { q_form: QForm = QForm::SiteDiagonal }
                on resume Fixed(|c, o| (c.q_form.name().into(), o.q_form.name().into()));

            /// The likelihood: logistic or probit for the binary and multilabel tasks, one of the
            /// others for multiclass (docs/likelihood.md).
            #[arg(long, value_parser = one_of::<LikelihoodChoice>())]
            Likelihood = "likelihood" { likelihood: LikelihoodChoice = LikelihoodChoice::Logistic }
                on resume Fixed(|c, o| (c.likelihood.name().into(), o.likelihood.name().into()));

            /// The task: multilabel, binary (a dataset with one label, label 0 the positive
            /// class; every row is a term, so --negatives stays all) or multiclass (one label per
            /// row among K ≥ 2 classes; --likelihood ove, robust-max, softmax, hl, ar-softmax or
            /// ar-logit).
            #[arg(long, value_parser = one_of::<Task>())]
            Task = "task" { task: Task = Task::Multilabel }
                on resume Fixed(|c, o| (c.task.name().into(), o.task.name().into()));

            /// The latent functions (with independent, leave --factors out).
            #[arg(long, value_parser = one_of::<LatentChoice>())]
            Latent = "latent" { latent: LatentChoice = LatentChoice::Factor }
                on resume Fixed(|c, o| (c.latent.name().into(), o.latent.name().into()));

            /// Robust-max's ε in (0, 1): the probability mass spread evenly over the K classes
            /// (--likelihood robust-max only).
            #[arg(long, value_name = "EPS", value_parser = open_fraction())]
            RobustMaxEpsilon = "robust-max-epsilon" {
                robust_max_epsilon: f64 =
                    crate::model::likelihood::multiclass::robust_max::DEFAULT_EPSILON
            }
                on resume Fixed(|c, o| (c.epsilon().to_string(), o.robust_max_epsilon.to_string()));

            /// Train robust-max's ε (as logit ε, from --robust-max-epsilon) with the other
            /// parameters (--likelihood robust-max only; GPflow's RobustMax with ε trainable).
            #[arg(long)]
            LearnEpsilon = "learn-epsilon" { learn_epsilon: bool }
                on resume Fixed(|c, o| (c.learn_epsilon.to_string(), o.learn_epsilon.to_string()));

            /// Antithetic Monte Carlo pairs of the softmax: per row and step with --likelihood
            /// softmax, per row for the predictive class probabilities of softmax, ove and
            /// augment-and-reduce runs, and ar-logit's ε rule of 2S points.
            #[arg(long, value_name = "S", value_parser = int_in::<usize>(1, MAX_MC_PAIRS))]
            McPairs = "mc-pairs" {
                mc_pairs: usize = crate::model::likelihood::multiclass::softmax_mc::DEFAULT_PAIRS
            }
                on resume Fixed(|c, o| (c.pairs().to_string(), o.mc_pairs.to_string()));

            /// Width H of the amortisation network's two hidden layers, which maps each row to its
            /// local variational parameters (--likelihood ar-softmax or ar-logit only).
            #[arg(long, value_name = "H", value_parser = int_in::<usize>(1, MAX_HIDDEN))]
            AmortiserHidden = "amortiser-hidden" {
                amortiser_hidden: usize =
                    crate::model::likelihood::multiclass::amortiser::DEFAULT_HIDDEN
            }
                on resume Fixed(|c, o| (c.amortiser_width().to_string(), o.amortiser_hidden.to_string()));

            /// S negative classes per row and step, drawn uniformly, their sum scaled by (K − 1)/S
            /// (--likelihood ove, ar-softmax or ar-logit; default: all K − 1).
            #[arg(long, value_name = "S", value_parser = int_in::<usize>(1, MAX_IDS.into()))]
            ClassSamples = "class-samples" { class_samples: Option<usize> }
                on resume Fixed(|c, o| {
                    (
                        or_none(c.class_samples.map(|s| s.to_string())),
                        or_none(o.class_samples.map(|s| s.to_string())),
                    )
                });

            /// M: inducing inputs (at most the rows of the svd run's a_init.npy, or with
            /// --inducing-inputs fixed-rows the training rows; default: a_init.npy's rows, which
            /// svd holds to N).
            #[arg(long, value_parser = int_in::<usize>(1, MAX_IDS.into()))]
            Inducing = "inducing" { inducing: Option<usize> }
                on resume Fixed(|c, o| (c.inducing.to_string(), or_none(o.inducing.map(|m| m.to_string()))));

            // P: latent GPs (None: min(DEFAULT_FACTORS, L) for the factor model, K with
            // --latent independent). Its help is `factors_help`'s, which states that rule
            // with the number of its constant.
            #[arg(long, help = factors_help(), value_parser = int_in::<usize>(1, MAX_IDS.into()))]
            Factors = "factors" { factors: Option<usize> }
                on resume Fixed(|c, o| (c.factors.to_string(), or_none(o.factors.map(|p| p.to_string()))));

            /// B: rows per minibatch.
            #[arg(long, value_parser = int_in::<usize>(1, MAX_BLOCK_ROWS))]
            Batch = "batch" { batch: usize = 500 }
                on resume Fixed(|c, o| (c.batch.to_string(), o.batch.to_string()));

            // The budget in passes over the training rows (when `steps` is None). Left at its
            // default (not in `given`), it is raised to `budget::DEFAULT_MIN_STEPS` steps on
            // data too small to give that many (`train::budget`). Help: `epochs_help`, which
            // names the limits from their constants.
            #[arg(long, conflicts_with = "steps", value_parser = int_in::<u64>(1, MAX_EPOCHS),
                  help = epochs_help())]
            Epochs = "epochs" { epochs: u64 = 10 }
                on resume Changes(Changeable::Epochs);

            /// The budget in optimiser steps instead of epochs: S steps in all, counted from step 0,
            /// through as many epochs as they take (the last one possibly cut short).
            #[arg(long, value_name = "S", value_parser = int_in::<u64>(1, MAX_STEPS))]
            Steps = "steps" { steps: Option<u64> }
                on resume Changes(Changeable::Steps);

            /// Stop after S optimiser steps in all, counted from step 0 (or at the end of the budget
            /// if sooner); an epoch cut short is recorded like the others, over the steps it ran.
            #[arg(long, value_name = "S", value_parser = int_in::<u64>(1, MAX_STEPS))]
            MaxSteps = "max-steps" { max_steps: Option<u64> }
                on resume Changes(Changeable::MaxSteps);

            /// Adam's learning rate η.
            #[arg(long, value_parser = positive_finite())]
            Lr = "lr" { lr: f64 = 0.01 }
                on resume Fixed(|c, o| (c.lr.to_string(), o.lr.to_string()));

            /// Multiply η by --lr-decay after each of these epoch counts (multi-step decay):
            /// `--lr-decay-at 40,50` trains epochs 1–40 with η, 41–50 with γη and the rest with γ²η.
            #[arg(long, value_name = "E1,E2,…", value_delimiter = ',',
                  value_parser = int_in::<u64>(1, MAX_EPOCHS))]
            LrDecayAt = "lr-decay-at" { lr_decay_at: Vec<u64> }
                on resume Fixed(|c, o| {
                    (
                        or_none(c.lr_decay.as_ref().map(|d| join_epochs(&d.after))),
                        or_none(Some(join_epochs(&o.lr_decay_at)).filter(|s| !s.is_empty())),
                    )
                });

            /// γ, the factor of each --lr-decay-at decay.
            #[arg(long, value_name = "γ", value_parser = positive_finite())]
            LrDecay = "lr-decay" { lr_decay: f64 = DEFAULT_LR_DECAY }
                on resume Fixed(|c, o| (decay_factor(c, o), o.lr_decay.to_string()));

            #[arg(long, value_parser = real_in(Included(0.0), Excluded(1.0)))]
            Beta1 = "beta1" { beta1: f64 = 0.9 }
                on resume Fixed(|c, o| (c.beta1.to_string(), o.beta1.to_string()));

            #[arg(long, value_parser = real_in(Included(0.0), Excluded(1.0)))]
            Beta2 = "beta2" { beta2: f64 = 0.999 }
                on resume Fixed(|c, o| (c.beta2.to_string(), o.beta2.to_string()));

            /// Negative labels per row: all, or a uniform sample of COUNT reweighted to stay unbiased.
            #[arg(long, value_parser = |s: &str| s.parse::<Negatives>())]
            Negatives = "negatives" { negatives: Negatives = Negatives::All }
                on resume Fixed(|c, o| (c.negatives.to_string(), o.negatives.to_string()));

            /// With --negatives COUNT: the F labels most frequent among the training rows'
            /// positives are in every row's bound exactly, and the COUNT negatives are sampled
            /// from the other labels (a stratified sample: unbiased, and without sampling noise
            /// on the labels that compete most often for a row's top ranks).
            #[arg(long, value_name = "F", value_parser = int_in::<usize>(1, MAX_IDS.into()))]
            FrequentNegatives = "frequent-negatives" { frequent_negatives: Option<usize> }
                on resume Fixed(|c, o| {
                    (
                        or_none(c.frequent_negatives.map(|f| f.to_string())),
                        or_none(o.frequent_negatives.map(|f| f.to_string())),
                    )
                });

            /// Gauss–Hermite points of the likelihood expectations.
            #[arg(long, value_parser = int_in::<usize>(1, MAX_QUADRATURE))]
            Quadrature = "quadrature" { quadrature: usize = crate::model::likelihood::DEFAULT_POINTS }
                on resume Fixed(|c, o| (c.quadrature.to_string(), o.quadrature.to_string()));

            #[arg(long, value_parser = seed())]
            Seed = "seed" { seed: u64 = 0 }
                on resume Fixed(|c, o| (c.seed.to_string(), o.seed.to_string()));

            /// Worker threads (default: all cores; at most 4 per core, which still matches a run
            /// made on a machine with a few times the cores). Results are bitwise reproducible for
            /// a fixed thread count.
            // Part of the configuration, since results are reproducible for one count only.
            #[arg(long, value_parser = threads())]
            Threads = "threads" { threads: Option<usize> }
                on resume Changes(Changeable::Threads);

            /// Continue an interrupted or failed run from its last checkpoint. Options not given
            /// are taken from the run; --epochs, --steps, --max-steps, --checkpoint-every,
            /// --keep-checkpoints, --threads, --prefetch, --eval-every, --eval-split and
            /// --no-final-elbo may be given to change them (each change is printed and recorded);
            /// any other option that differs from the run's is refused. A finished run goes on only
            /// if --max-steps cut it, with a larger --max-steps.
            #[arg(long, value_parser = run_id())]
            Resume = "resume" { resume: Option<i64> }
                on resume Control;

            /// Start a new run even when an interrupted run with exactly this configuration exists
            /// (by default that run is resumed).
            #[arg(long, conflicts_with = "resume")]
            Fresh = "fresh" { fresh: bool }
                on resume Control;

            /// Write a checkpoint every this many steps (and always at the end).
            #[arg(long, value_parser = int_in::<u64>(1, MAX_STEPS))]
            CheckpointEvery = "checkpoint-every" { checkpoint_every: u64 = 500 }
                on resume Changes(Changeable::CheckpointEvery);

            /// Keep the inducing inputs A at their initial value (the paper's "sf-" variants); the
            /// same as --inducing-inputs fixed-subspace.
            // Kept for old commands and specs; the two store the same configuration.
            #[arg(long)]
            FreezeA = "freeze-a" { freeze_a: bool }
                on resume Fixed(|c, o| (c.freeze_a.to_string(), o.freeze_a.to_string()));

            /// Where the inducing inputs Z live and whether they are trained. free and fixed-rows
            /// need M×D to fit in memory (checked first; FSGP_INPUTS_MEMORY_MIB raises the limit).
            #[arg(long, value_parser = one_of::<InducingInputs>())]
            InducingInputs = "inducing-inputs" {
                inducing_inputs: InducingInputs = InducingInputs::Subspace
            }
                on resume Fixed(|c, o| (c.inducing_choice().name().into(), o.inducing_inputs.name().into()));

            /// Keep the kernel hyperparameters (σ's, ℓ, ARD weights) at their initial values.
            #[arg(long)]
            FreezeHyper = "freeze-hyper" { freeze_hyper: bool }
                on resume Fixed(|c, o| (c.freeze_hyper.to_string(), o.freeze_hyper.to_string()));

            /// Keep the kernel hyperparameters at their initial values for the first E0 epochs,
            /// then train them (Hensman, Matthews & Ghahramani, Scalable Variational Gaussian
            /// Process Classification, §5).
            #[arg(long, value_name = "E0", value_parser = int_in::<u64>(1, MAX_EPOCHS))]
            ReleaseHyperAfter = "release-hyper-after" { release_hyper_after: Option<u64> }
                on resume Fixed(|c, o| {
                    (
                        or_none(c.release_hyper_after.map(|e| e.to_string())),
                        or_none(o.release_hyper_after.map(|e| e.to_string())),
                    )
                });

            /// Minibatches the prefetch queue holds.
            #[arg(long, value_parser = int_in::<usize>(1, MAX_PREFETCH))]
            Prefetch = "prefetch" { prefetch: usize = 4 }
                on resume Changes(Changeable::Prefetch);

            /// Chunks whose rows are shuffled together.
            #[arg(long, value_parser = int_in::<usize>(1, MAX_PREFETCH))]
            ShuffleChunks = "shuffle-chunks" { shuffle_chunks: usize = 2 }
                on resume Fixed(|c, o| (c.shuffle_chunks.to_string(), o.shuffle_chunks.to_string()));

            /// Skip the exact full-data bound at the end (a full pass over all rows and labels).
            // The flag clears the option: `final_elbo` is true unless --no-final-elbo is given.
            #[arg(id = "no_final_elbo", long = "no-final-elbo", action = ArgAction::SetFalse)]
            NoFinalElbo = "no-final-elbo" { final_elbo: bool = true }
                on resume Changes(Changeable::NoFinalElbo);

            /// Every this many epochs (and after the last), rank the rows of --eval-split and
            /// record P@k, nDCG@k, PSP@k, PSnDCG@k (k ≤ 5) per epoch; 0 = never. It reads the
            /// parameters only, so the trained numbers do not depend on it.
            #[arg(long, value_parser = int_in::<u64>(0, MAX_EPOCHS))]
            EvalEvery = "eval-every" { eval_every: u64 = 0 }
                on resume Changes(Changeable::EvalEvery);

            /// The held-out split --eval-every ranks.
            #[arg(long, value_parser = one_of::<Split>())]
            EvalSplit = "eval-split" { eval_split: Split = Split::Test }
                on resume Changes(Changeable::EvalSplit);

            /// Keep the last N checkpoints plus the final one (while the run goes on: the newest,
            /// which it resumes from), and with --early-stopping the best; older ones are deleted.
            /// `all` keeps every one. The default
            /// bounds a run's disk use whatever its length: a 200-epoch run on AmazonCat-13K writes
            /// about 950 checkpoints of ~13 MB.
            #[arg(long, value_name = "N|all", value_parser = |s: &str| s.parse::<Retention>())]
            KeepCheckpoints = "keep-checkpoints" { keep_checkpoints: Retention = Retention::DEFAULT }
                on resume Changes(Changeable::KeepCheckpoints);

            /// Score the validation split (ingest --validation-fraction) every --validate-every
            /// steps by --stop-metric; keep the checkpoint of the best score (never deleted by
            /// --keep-checkpoints; predict and evaluate read it by default) and end the run once
            /// --patience scores in a row have not improved on it. Why the run ended is recorded and
            /// shown by `pipeline status`.
            #[arg(long)]
            EarlyStopping = "early-stopping" { early_stopping: bool }
                on resume Fixed(|c, o| (c.early_stopping.is_some().to_string(), o.early_stopping.to_string()));

            /// With --early-stopping: scores in a row without improvement on the best before the
            /// run stops.
            #[arg(long, value_name = "N", value_parser = int_in::<u64>(1, MAX_STEPS))]
            Patience = "patience" { patience: u64 = DEFAULT_PATIENCE }
                on resume Fixed(|c, o| {
                    (
                        or_none(c.early_stopping.map(|e| e.patience.to_string())),
                        o.patience.to_string(),
                    )
                });

            // With --early-stopping: steps between two scores (None: a fiftieth of the budget,
            // `early::default_every`). Help: `validate_every_help`.
            #[arg(long, value_name = "S", help = validate_every_help(),
                  value_parser = int_in::<u64>(1, MAX_STEPS))]
            ValidateEvery = "validate-every" { validate_every: Option<u64> }
                on resume Fixed(|c, o| {
                    (
                        or_none(c.early_stopping.map(|e| e.every.to_string())),
                        or_none(o.validate_every.map(|e| e.to_string())),
                    )
                });

            /// With --early-stopping: the validation figure watched (default: P@1 for multilabel,
            /// nlp for binary and multiclass).
            #[arg(long, value_name = "METRIC", value_parser = one_of::<StopMetric>())]
            StopMetric = "stop-metric" { stop_metric: Option<StopMetric> }
                on resume Fixed(|c, o| {
                    (
                        or_none(c.early_stopping.map(|e| e.metric.name().to_string())),
                        or_none(o.stop_metric.map(|m| m.name().to_string())),
                    )
                });

            /// How μ and Φ start: at the biases alone, or from one closed-form Newton step over one
            /// pass of the training rows (docs/model.md, "Warm start")
            #[arg(long, value_parser = one_of::<WarmStart>())]
            WarmStart = "warm-start" { warm_start: WarmStart = WarmStart::None }
                listed after QForm
                on resume Fixed(|c, o| (c.warm_start.name().into(), o.warm_start.name().into()));

            /// Train q(u) by natural-gradient steps of size γ in (0, 1] (Adam trains the rest);
            /// γ follows --lr-decay's schedule. Needs --q-form cholesky or whitened (docs/model.md,
            /// "Natural gradients").
            #[arg(long, value_name = "GAMMA", value_parser = real_in(Excluded(0.0), Included(1.0)))]
            NaturalStep = "natural-step" { natural_step: Option<f64> }
                listed after WarmStart
                on resume Fixed(|c, o| {
                    (
                        or_none(c.natural_step.map(|g| g.to_string())),
                        or_none(o.natural_step.map(|g| g.to_string())),
                    )
                });

            /// Each label's utility's prior variance at the start of training, σ_f² E‖Φ_k‖²
            /// for a row with k(x, x) = 1: Φ's entries start with variance V/P up to 1 (V =
            /// P), the kernel's variance takes the rest; both are trained from there
            /// (docs/model.md, "Initialisation"). Default 1.
            #[arg(long, value_name = "V",
                  value_parser = real_in(Included(MIN_PRIOR_VARIANCE), Included(MAX_PRIOR_VARIANCE)))]
            PriorVariance = "prior-variance" { prior_variance: Option<f64> }
                listed after NaturalStep
                on resume Fixed(|c, o| {
                    let start = |v: Option<f64>| v.unwrap_or(1.0).to_string();
                    (start(c.prior_variance), start(o.prior_variance))
                });
        }
    };
}

pub(crate) use train_option_table;

/// The default of a row: its `= DEFAULT`, or the type's empty value when it has none.
macro_rules! default_or_empty {
    () => {
        ::std::default::Default::default()
    };
    ($default:expr) => {
        $default
    };
}

pub(crate) use default_or_empty;

/// Generates, from [`train_option_table!`], the types of `train::options`: [`TrainFlag`],
/// [`TrainOptions`] with its `Default`, and [`TrainValue`] with `TrainOptions::{set, with,
/// value}`.
///
/// [`TrainFlag`]: super::TrainFlag
/// [`TrainOptions`]: super::TrainOptions
/// [`TrainValue`]: super::TrainValue
macro_rules! define_train_options {
    ($(
        $(#[doc = $doc:literal])*
        #[arg($($arg:tt)*)]
        $variant:ident = $name:literal { $field:ident: $ty:ty $(= $default:expr)? }
        $(listed after $anchor:ident)?
        on resume $rule:expr;
    )+) => {
        $crate::choice::choice_enum! {
            /// Every option of `pipeline train`, named as its flag without `--` (the command
            /// line's argument ids are these with `_` for `-`), in the order of
            /// `train_option_table!` (`train::declare`). Which were given explicitly is
            /// [`TrainOptions::given`]; what each does on resume is `TrainFlag::on_resume`
            /// (`train::resume`).
            #[derive(PartialOrd, Ord)]
            pub enum TrainFlag("train option") {
                $($variant = $name),+
            }
        }

        /// Options of a training run, one field per row of `train_option_table!`
        /// (`train::declare`), whose defaults ([`TrainOptions::default`]) the command line and
        /// specs read too.
        #[derive(Debug, Clone, PartialEq)]
        pub struct TrainOptions {
            $(
                $(#[doc = $doc])*
                pub $field: $ty,
            )+
            /// The options the caller set explicitly. On resume these are applied or refused;
            /// the others come from the run. Empty: everything comes from the run.
            /// [`TrainOptions::set`] sets an option and adds it here.
            pub given: ::std::collections::BTreeSet<TrainFlag>,
        }

        impl Default for TrainOptions {
            fn default() -> Self {
                TrainOptions {
                    $($field: $crate::train::declare::default_or_empty!($($default)?),)+
                    given: ::std::collections::BTreeSet::new(),
                }
            }
        }

        /// One train option with its value, `TrainValue::Kernel(KernelChoice::Se)`: what
        /// [`TrainOptions::set`] and [`TrainOptions::with`] take and [`TrainOptions::value`]
        /// gives.
        #[derive(Debug, Clone, PartialEq)]
        pub enum TrainValue {
            $($variant($ty)),+
        }

        impl TrainValue {
            /// The option this value is of.
            pub fn flag(&self) -> TrainFlag {
                match self {
                    $(TrainValue::$variant(_) => TrainFlag::$variant),+
                }
            }

            /// The value as its flag takes it on the command line (`--flag TEXT`): empty for
            /// a switch and for an option left out (`None`).
            pub fn flag_text(&self) -> String {
                use $crate::train::declare::FlagText;
                match self {
                    $(TrainValue::$variant(value) => value.flag_text()),+
                }
            }
        }

        impl TrainOptions {
            /// Sets one option and records it as given.
            pub fn set(&mut self, value: TrainValue) {
                self.given.insert(value.flag());
                match value {
                    $(TrainValue::$variant(value) => self.$field = value),+
                }
            }

            /// These options with one more set and given: a Rust caller's options in one
            /// expression.
            ///
            /// ```
            /// use fsgp::train::{TrainFlag, TrainOptions, TrainValue};
            /// use fsgp::trained::KernelChoice;
            ///
            /// let options = TrainOptions::default()
            ///     .with(TrainValue::Kernel(KernelChoice::Se))
            ///     .with(TrainValue::Inducing(Some(200)));
            /// assert_eq!((options.kernel, options.inducing), (KernelChoice::Se, Some(200)));
            /// assert_eq!(options.given, [TrainFlag::Kernel, TrainFlag::Inducing].into());
            /// ```
            #[must_use]
            pub fn with(mut self, value: TrainValue) -> Self {
                self.set(value);
                self
            }

            /// Option `flag`'s value here, given or not.
            pub fn value(&self, flag: TrainFlag) -> TrainValue {
                match flag {
                    $(TrainFlag::$variant => TrainValue::$variant(self.$field.clone())),+
                }
            }
        }
    };
}

pub(crate) use define_train_options;

/// A value as its flag takes it on the command line: what `pipeline fit` writes in a spec's
/// `[train]` table and shows in its outcome. A switch (`bool`) and an absent option (`None`)
/// are empty: the flag alone, or no flag.
pub trait FlagText {
    fn flag_text(&self) -> String;
}

impl FlagText for bool {
    fn flag_text(&self) -> String {
        String::new()
    }
}

impl<T: FlagText> FlagText for Option<T> {
    fn flag_text(&self) -> String {
        self.as_ref().map_or(String::new(), T::flag_text)
    }
}

/// A list as `--lr-decay-at` takes it: `40,50`.
impl FlagText for Vec<u64> {
    fn flag_text(&self) -> String {
        join_epochs(self)
    }
}

impl<T: Choice> FlagText for T {
    fn flag_text(&self) -> String {
        self.name().to_string()
    }
}

/// The types whose `Display` is their flag's text.
macro_rules! flag_text_is_display {
    ($($ty:ty),+) => {
        $(impl FlagText for $ty {
            fn flag_text(&self) -> String {
                self.to_string()
            }
        })+
    };
}

flag_text_is_display!(String, i64, u64, usize, f64, Negatives, Retention);

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use crate::train::{TrainFlag, TrainOptions, TrainValue};
    use crate::trained::{KernelChoice, Negatives, Retention, StopMetric};

    fn options() -> TrainOptions {
        TrainOptions {
            dataset: Some("d".into()),
            kernel: KernelChoice::Se,
            negatives: Negatives::Sample(100),
            final_elbo: false,
            fresh: true,
            lr_decay_at: vec![40, 50],
            natural_step: Some(0.5),
            keep_checkpoints: Retention::All,
            stop_metric: Some(StopMetric::P3),
            ..TrainOptions::default()
        }
    }

    /// Every option's value goes out through [`TrainValue`] and back in unchanged, and
    /// setting it marks it given.
    #[test]
    fn every_option_is_read_and_set_through_its_value() {
        let from = options();
        let mut onto = TrainOptions::default();
        for &flag in TrainFlag::ALL {
            let value = from.value(flag);
            assert_eq!(value.flag(), flag);
            onto.set(value);
            assert!(onto.given.contains(&flag), "{flag}");
        }
        assert_eq!(onto.given.len(), TrainFlag::ALL.len());
        onto.given = BTreeSet::new();
        assert_eq!(onto, from);
    }

    /// A value's text is what its flag takes; a switch and an absent option have none.
    #[test]
    fn flag_text_is_what_the_flag_takes() {
        let o = options();
        let text = |flag| o.value(flag).flag_text();
        assert_eq!(text(TrainFlag::Dataset), "d");
        assert_eq!(text(TrainFlag::Kernel), "se");
        assert_eq!(text(TrainFlag::Negatives), "100");
        assert_eq!(text(TrainFlag::LrDecayAt), "40,50");
        assert_eq!(text(TrainFlag::NaturalStep), "0.5");
        assert_eq!(text(TrainFlag::KeepCheckpoints), "all");
        assert_eq!(text(TrainFlag::StopMetric), "P@3");
        assert_eq!(text(TrainFlag::EvalSplit), "test");
        assert_eq!(text(TrainFlag::Lr), "0.01");
        assert_eq!(text(TrainFlag::Svd), "");
        assert_eq!(text(TrainFlag::Fresh), "");
        assert_eq!(text(TrainFlag::NoFinalElbo), "");
        assert_eq!(
            TrainValue::Inducing(Some(7)),
            TrainOptions::default()
                .with(TrainValue::Inducing(Some(7)))
                .value(TrainFlag::Inducing)
        );
    }
}
