//! A trained model as the workspace records it: the configuration that fixes its numbers,
//! the svd run whose factors it was fitted on, and its checkpoints. Written by the train
//! stage, read by train (resume), predict and `pipeline elbo`.

use std::str::FromStr;

use anyhow::{ensure, Context, Result};
use serde::{Deserialize, Serialize};

use crate::choice::{choice_enum, Choice};
use crate::model::kernel::KernelKind;
use crate::model::likelihood::multiclass::amortiser::DEFAULT_HIDDEN;
use crate::model::likelihood::multiclass::ar_logit::ArLogit;
use crate::model::likelihood::multiclass::ar_softmax::ArSoftmax;
use crate::model::likelihood::multiclass::hernandez_lobato::HernandezLobato;
use crate::model::likelihood::multiclass::one_vs_each::OneVsEach;
use crate::model::likelihood::multiclass::robust_max::{RobustMax, DEFAULT_EPSILON};
use crate::model::likelihood::multiclass::softmax_mc::{SoftmaxMc, DEFAULT_PAIRS};
use crate::model::likelihood::multiclass::ClassLikelihood;
use crate::model::likelihood::probit::BernoulliProbit;
use crate::model::likelihood::{logistic::BernoulliLogistic, Likelihood};
use crate::model::optim::AdamConfig;
pub use crate::model::params::QForm;
use crate::model::predictive::{ProbabilityRule, LOGISTIC_PREDICTIVE_POINTS};
pub use crate::store::catalog::Task;
use crate::store::catalog::{
    ArtifactKind, CheckpointRow, DatasetRow, RunOptionsRow, Split, StageKind,
};
use crate::store::checkpoint::{
    read_registered_checkpoint, read_registered_model, Checkpoint, CheckpointModel,
};
use crate::store::integrity::Registered;
use crate::store::workspace::Workspace;

choice_enum! {
    /// The GP kernel a run trains with (`--kernel`, `docs/model.md`).
    pub enum KernelChoice("kernel") {
        Linear = "linear" => "k(x, x') = σ_f² xᵀx' (the paper's)",
        Se = "se" => "squared exponential, σ_f² exp(−‖x − x'‖² / 2ℓ²)",
        /// The SE + linear sum (two free variances, `docs/model.md`).
        SePlusLinear = "se+linear" => "the sum of the two, each with its own variance",
    }
}

impl KernelChoice {
    pub fn kind(self) -> KernelKind {
        match self {
            KernelChoice::Linear => KernelKind::Linear,
            KernelChoice::Se => KernelKind::SquaredExponential,
            KernelChoice::SePlusLinear => KernelKind::SePlusLinear,
        }
    }
}

choice_enum! {
    /// `--ard`: automatic relevance determination of the kernel's inputs.
    #[derive(Default)]
    pub enum ArdChoice("ARD") {
        #[default]
        None = "none" => "one lengthscale (or variance) for every input",
        /// One weight per direction of the svd basis X̃ (R weights).
        BasisDirections = "subspace"
            => "one trained weight per basis direction (R weights; docs/model.md, \"Subspace ARD\")",
        /// One weight per input feature (D weights; the minibatches then carry the rows'
        /// sparse features).
        Features = "features"
            => "one trained weight per input feature (D weights; \"ARD over the D features\")",
    }
}

impl ArdChoice {
    pub fn is_none(&self) -> bool {
        *self == ArdChoice::None
    }
}

choice_enum! {
    /// `--warm-start`: how μ and Φ start (`docs/model.md`, "Warm start").
    #[derive(Default)]
    pub enum WarmStart("warm start") {
        #[default]
        None = "none" => "μ = 0 and a random Φ: the model starts at its biases",
        /// One closed-form Newton step of the logistic likelihood under the GP prior,
        /// cut to rank P (`train::warm`).
        Ridge = "ridge"
            => "μ and Φ from one Newton step of the likelihood under the GP prior, in closed \
                form over one pass of the rows (logistic likelihood, sites q(u), factor model)",
    }
}

impl WarmStart {
    pub fn is_none(&self) -> bool {
        *self == WarmStart::None
    }
}

choice_enum! {
    /// `--inducing-inputs`: where the inducing inputs Z live and whether they are trained
    /// (`docs/model.md`, "Free inducing inputs: the identity basis").
    ///
    /// A configuration stores only `Subspace`, `Free`, `FixedRows` (with `freeze_a` true
    /// for `FixedRows`) and `Axes`; `FixedSubspace` is stored as `Subspace` with `freeze_a`,
    /// exactly what `--freeze-a` stores, so the two spellings are one run.
    #[derive(Default)]
    pub enum InducingInputs("kind of inducing inputs") {
        /// Z = A X̃ with A [M×R] trained (the paper's default).
        #[default]
        Subspace = "subspace" => "Z = A X̃, A [M×R] trained (the paper's)",
        /// Z [M×D] trained in input space (the identity basis), initialised at A_init X̃.
        Free = "free" => "Z [M×D] trained in input space, from the k-means centroids",
        /// Z = A X̃ with A kept at its k-means initialisation (the paper's "sf-" variants).
        FixedSubspace = "fixed-subspace" => "Z = A X̃ with A fixed (= --freeze-a)",
        /// Z = M distinct training rows drawn with the run seed, kept fixed (the identity
        /// basis).
        FixedRows = "fixed-rows" => "M training rows drawn with the seed, fixed",
        /// Z = I_D: one inducing feature per input feature, the weights of the linear
        /// kernel's functions (`model/qu/axes.rs`). Exact; M = D; a step costs
        /// O(nnz·P + D·P).
        Axes = "axes"
            => "Z = I_D, one per feature (linear kernel): exact, steps cost O(nnz·P + D·P)",
    }
}

impl InducingInputs {
    /// Whether the model sees rows as their raw features densified (the identity basis,
    /// X̃ = I_D) rather than as their coordinates in the svd basis.
    pub fn in_features(self) -> bool {
        matches!(
            self,
            InducingInputs::Free | InducingInputs::FixedRows | InducingInputs::Axes
        )
    }

    pub fn is_default(&self) -> bool {
        *self == InducingInputs::Subspace
    }
}

choice_enum! {
    /// `--likelihood`: for the binary and multi-label tasks the Bernoulli likelihood's
    /// link; for the multi-class task the likelihood of the row's class given its K
    /// utilities (`docs/likelihood.md`). What each can do is [`LikelihoodChoice::traits`].
    #[derive(Default)]
    pub enum LikelihoodChoice("likelihood") {
        #[default]
        Logistic = "logistic" => "p(y | f) = σ(y f) (the paper's)",
        Probit = "probit" => "p(y | f) = Φ(y f)",
        Ove = "ove" => "the one-vs-each bound on the softmax",
        RobustMax = "robust-max" => "the largest utility's class, ε spread over the K",
        Softmax = "softmax" => "the softmax, its expectation by Monte Carlo",
        Hl = "hl" => "Hernández-Lobato's: one-vs-each with the probit link",
        /// Augment and reduce (Ruiz, Titsias, Dieng & Blei): the softmax bound with
        /// amortised α.
        ArSoftmax = "ar-softmax"
            => "augment and reduce: the softmax bound with each row's α amortised",
        /// Augment and reduce with logistic noise: q(ε) amortised, pairs by Gauss–Hermite.
        ArLogit = "ar-logit"
            => "augment and reduce: the logit bound with each row's q(ε) amortised",
    }
}

/// What a likelihood can do: the one table the options' checks and their messages read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LikelihoodTraits {
    /// A likelihood of one class among K (the multi-class task's); otherwise a Bernoulli
    /// link of the binary and multi-label tasks.
    pub multiclass: bool,
    /// An augment-and-reduce likelihood, whose local parameters come from the amortisation
    /// network (`--amortiser-hidden`).
    pub amortised: bool,
    /// Its bound is a sum over the negative classes that `--class-samples` may subsample.
    pub samples_classes: bool,
    /// Its predictive probabilities are the Monte Carlo softmax's (`--mc-pairs`).
    pub mc_pairs: bool,
}

impl LikelihoodChoice {
    /// What this likelihood can do.
    pub fn traits(self) -> LikelihoodTraits {
        let (multiclass, amortised, samples_classes, mc_pairs) = match self {
            LikelihoodChoice::Logistic | LikelihoodChoice::Probit => (false, false, false, false),
            LikelihoodChoice::Ove => (true, false, true, true),
            LikelihoodChoice::RobustMax | LikelihoodChoice::Hl => (true, false, false, false),
            LikelihoodChoice::Softmax => (true, false, false, true),
            LikelihoodChoice::ArSoftmax | LikelihoodChoice::ArLogit => (true, true, true, true),
        };
        LikelihoodTraits {
            multiclass,
            amortised,
            samples_classes,
            mc_pairs,
        }
    }

    /// Whether this is the default (left out of a configuration's JSON).
    pub fn is_logistic(&self) -> bool {
        *self == LikelihoodChoice::Logistic
    }

    /// Whether this is a likelihood of one class among K (the multi-class task's).
    pub fn is_multiclass(self) -> bool {
        self.traits().multiclass
    }

    /// Whether this is an augment-and-reduce likelihood (`--amortiser-hidden`).
    pub fn is_amortised(self) -> bool {
        self.traits().amortised
    }

    /// Whether `--class-samples` may subsample the likelihood's bound.
    pub fn samples_classes(self) -> bool {
        self.traits().samples_classes
    }

    /// Whether the likelihood's predictive probabilities are the Monte Carlo softmax's
    /// (`--mc-pairs`).
    pub fn has_mc_pairs(self) -> bool {
        self.traits().mc_pairs
    }

    /// The names of the likelihoods that `has` selects, as a message lists them.
    pub fn listed_by(has: impl Fn(LikelihoodTraits) -> bool) -> String {
        <Self as Choice>::listed(|l| has(l.traits()))
    }

    /// The Bernoulli likelihood with a `points`-point Gauss–Hermite rule (every likelihood
    /// is named in this match and the two below, so a new one is placed by the compiler).
    /// A multi-class choice has none: its runs' minibatches carry their own likelihood
    /// ([`TrainConfig::class_likelihood`]), and this returns the logistic link, which their
    /// bound never evaluates.
    pub fn build(self, points: usize) -> Result<Box<dyn Likelihood>> {
        Ok(match self {
            LikelihoodChoice::Probit => Box::new(BernoulliProbit::new(points)?),
            LikelihoodChoice::Logistic
            | LikelihoodChoice::Ove
            | LikelihoodChoice::RobustMax
            | LikelihoodChoice::Softmax
            | LikelihoodChoice::Hl
            | LikelihoodChoice::ArSoftmax
            | LikelihoodChoice::ArLogit => Box::new(BernoulliLogistic::new(points)?),
        })
    }
}

choice_enum! {
    /// `--latent`: the utilities f = Φ g + b of P latent GPs with Φ [K×P] trained (the
    /// paper's factor model), or K independent GPs sharing the inducing inputs, P = K and
    /// Φ = I kept fixed (`docs/model.md`, "Tasks and latent functions").
    #[derive(Default)]
    pub enum LatentChoice("kind of latent functions") {
        #[default]
        Factor = "factor" => "f = Φ g + b with P GPs, Φ trained (the paper's)",
        Independent = "independent" => "one GP per label sharing Z: P = K, Φ = I fixed",
    }
}

impl LatentChoice {
    /// Whether this is the default (left out of a configuration's JSON).
    pub fn is_factor(&self) -> bool {
        *self == LatentChoice::Factor
    }
}

/// `--negatives all|COUNT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Negatives {
    All,
    Sample(usize),
}

impl FromStr for Negatives {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(Negatives::All);
        }
        // A sample of more negatives than a dataset can have labels is a typo: a file's ids
        // are at most 2³¹ − 1 (the parser's limit).
        let most = i32::MAX as usize;
        match s.parse::<usize>() {
            Ok(n) if (1..=most).contains(&n) => Ok(Negatives::Sample(n)),
            _ => Err(format!(
                "expected 'all' or a positive count of at most {most}, found {s:?}"
            )),
        }
    }
}

impl std::fmt::Display for Negatives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Negatives::All => f.write_str("all"),
            Negatives::Sample(count) => write!(f, "{count}"),
        }
    }
}

/// `--keep-checkpoints all|N`: which checkpoints of a training run stay on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Retention {
    /// Every checkpoint.
    All,
    /// The newest N + 1: the last N before the newest, and the newest, which is the final
    /// checkpoint once the run has ended and the one it resumes from while it runs.
    Last(u64),
}

impl Retention {
    /// Six checkpoints per run whatever its length. A 200-epoch run on AmazonCat-13K
    /// (B = 500, `--checkpoint-every 500`) writes about 950 checkpoints of ~13 MB (12 GB);
    /// kept, they would fill a small disk, while the last few are all that resuming,
    /// `pipeline elbo` on recent steps and a look back need.
    pub const DEFAULT: Retention = Retention::Last(5);

    /// How many of `count` checkpoints, the oldest, go.
    pub fn excess(self, count: usize) -> usize {
        match self {
            Retention::All => 0,
            Retention::Last(n) => {
                count.saturating_sub(usize::try_from(n).unwrap_or(usize::MAX).saturating_add(1))
            }
        }
    }
}

impl FromStr for Retention {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(Retention::All);
        }
        s.parse::<u64>()
            .map(Retention::Last)
            .map_err(|_| format!("expected 'all' or a count, found {s:?}"))
    }
}

impl std::fmt::Display for Retention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Retention::All => f.write_str("all"),
            Retention::Last(n) => write!(f, "{n}"),
        }
    }
}

/// How a training run is steered without changing its numbers. Recorded with the run
/// (`run_options.options`) and taken from there on resume unless given again; not part of
/// [`TrainConfig`], so it changes neither the run's identity nor its checkpoints' bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Steering {
    pub keep_checkpoints: Retention,
    /// Minibatches the prefetch queue holds.
    pub prefetch: usize,
    /// Rank `eval_split` every this many epochs (0: never).
    pub eval_every: u64,
    pub eval_split: Split,
    /// Compute the exact full-data bound at the end.
    pub final_elbo: bool,
}

/// One option changed when a run was resumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OptionChange {
    /// The step the run resumed from.
    pub step: u64,
    /// The command-line flag, e.g. `--max-steps`.
    pub option: String,
    pub old: String,
    pub new: String,
}

/// Everything that determines a run's numbers: stored in the catalog and in every
/// checkpoint. Nothing run-specific (ids, times, paths), so reruns write identical bytes.
/// The field order is the JSON's, which the catalog compares as text: do not reorder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub dataset: String,
    pub dataset_checksum: String,
    pub svd_run: i64,
    pub kernel: KernelChoice,
    pub inducing: usize,
    pub factors: usize,
    pub batch: usize,
    pub epochs: u64,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub negatives: Negatives,
    pub quadrature: usize,
    pub seed: u64,
    pub threads: usize,
    pub freeze_a: bool,
    pub freeze_hyper: bool,
    pub shuffle_chunks: usize,
    pub checkpoint_every: u64,
    /// `--max-steps`: the run stops after this many optimiser steps, counted from step 0
    /// (None: at the end of `epochs`). Absent from the JSON when None, so configurations
    /// (and checkpoints) from before the option read and compare as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// `--steps`: the budget in optimiser steps, counted from step 0, with `epochs` then the
    /// epochs those steps reach (`train::budget`); None: the budget is `epochs` epochs.
    /// Absent from the JSON when None, so configurations with an epoch budget read and
    /// compare as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// `--ard` (absent from the JSON when none).
    #[serde(default, skip_serializing_if = "ArdChoice::is_none")]
    pub ard: ArdChoice,
    /// `--warm-start` (absent from the JSON when none, so earlier runs are found).
    #[serde(default, skip_serializing_if = "WarmStart::is_none")]
    pub warm_start: WarmStart,
    /// `--natural-step γ`: q(u) is trained by natural-gradient steps of size γ (times the
    /// `lr_decay` multiplier of the epoch) instead of Adam; absent from the JSON when None.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub natural_step: Option<f64>,
    /// `--release-hyper-after E0`: the kernel hyperparameters stay at their initial values
    /// for the first E0 epochs, then train (absent from the JSON when None).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_hyper_after: Option<u64>,
    /// `--q-form`: absent from the JSON at the default (`sites`), so earlier
    /// configurations read and compare as they did.
    #[serde(default, skip_serializing_if = "QForm::is_sites")]
    pub q_form: QForm,
    /// `--inducing-inputs` as stored (never `FixedSubspace`, see [`InducingInputs`]);
    /// absent from the JSON at the default, `subspace`.
    #[serde(default, skip_serializing_if = "InducingInputs::is_default")]
    pub inducing_inputs: InducingInputs,
    /// `--likelihood`: absent from the JSON at the default, `logistic`.
    #[serde(default, skip_serializing_if = "LikelihoodChoice::is_logistic")]
    pub likelihood: LikelihoodChoice,
    /// `--task`: absent from the JSON at the default, `multilabel` (`evaluate` reads the
    /// key `task` of a training run's params to choose its metrics).
    #[serde(default, skip_serializing_if = "Task::is_multilabel")]
    pub task: Task,
    /// `--latent`: absent from the JSON at the default, `factor`.
    #[serde(default, skip_serializing_if = "LatentChoice::is_factor")]
    pub latent: LatentChoice,
    /// `--robust-max-epsilon` of a robust-max run, when not the default
    /// ([`DEFAULT_EPSILON`]); absent from the JSON otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robust_max_epsilon: Option<f64>,
    /// `--mc-pairs` of a softmax or one-vs-each run (antithetic Monte Carlo pairs of the
    /// softmax, and of the predictive class probabilities), when not the default
    /// ([`DEFAULT_PAIRS`]); absent from the JSON otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mc_pairs: Option<usize>,
    /// `--amortiser-hidden` of an augment-and-reduce run (the width H of the amortisation
    /// network's two hidden layers), when not the default ([`DEFAULT_HIDDEN`]); absent from
    /// the JSON otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amortiser_hidden: Option<usize>,
    /// `--class-samples`: S negative classes per row and step (one-vs-each and
    /// augment-and-reduce); absent from the JSON when not given (all negatives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_samples: Option<usize>,
    /// `--learn-epsilon` of a robust-max run: ε is trained as θ = logit ε
    /// (`Params::logit_epsilon`), starting at `robust_max_epsilon`; absent from the JSON
    /// when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub learn_epsilon: bool,
    /// `--lr-decay-at` and `--lr-decay`: Adam's step size η falls by a factor after given
    /// epochs; absent from the JSON when η stays constant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr_decay: Option<LrDecay>,
    /// `--early-stopping` with its metric, patience and period as resolved when the run
    /// started; absent from the JSON without early stopping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<EarlyStopping>,
    /// `--prior-variance V`: each utility's prior variance at the start
    /// (`train::init::prior_split`); absent from the JSON at the default, 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prior_variance: Option<f64>,
    /// `--frequent-negatives F`: the F most frequent labels enter every row's bound
    /// exactly and `negatives` are sampled from the rest; absent from the JSON when not
    /// given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequent_negatives: Option<usize>,
}

choice_enum! {
    /// `--stop-metric`: what early stopping watches on the validation split. Each suits
    /// some tasks ([`StopMetric::suits`]); the default is the task's
    /// ([`StopMetric::of_task`]).
    pub enum StopMetric("stopping metric") {
        P1 = "P@1" => "precision at 1 (multilabel; the default there)",
        P3 = "P@3" => "precision at 3 (multilabel)",
        P5 = "P@5" => "precision at 5 (multilabel)",
        Nlp = "nlp"
            => "mean negative log predictive probability (binary, multiclass; the default there)",
        Accuracy = "accuracy" => "share of the rows classified right (binary, multiclass)",
    }
}

impl StopMetric {
    /// The metric early stopping watches when `--stop-metric` is left out: P@1 for a
    /// multi-label run (the paper's headline figure), the NLP for a binary or multi-class
    /// run (a proper scoring rule: it moves with every row's probability, where accuracy
    /// moves by whole rows and plateaus).
    pub fn of_task(task: Task) -> StopMetric {
        match task {
            Task::Multilabel => StopMetric::P1,
            Task::Binary | Task::Multiclass => StopMetric::Nlp,
        }
    }

    /// Whether the held-out evaluation of a `task` run measures it: the ranking precisions
    /// for multi-label runs, accuracy and NLP for binary and multi-class runs.
    pub fn suits(self, task: Task) -> bool {
        match self {
            StopMetric::P1 | StopMetric::P3 | StopMetric::P5 => task == Task::Multilabel,
            StopMetric::Nlp | StopMetric::Accuracy => task != Task::Multilabel,
        }
    }

    /// Whether a larger value is better (precision, accuracy) rather than a smaller (NLP).
    pub fn higher_is_better(self) -> bool {
        !matches!(self, StopMetric::Nlp)
    }

    /// Whether `value` improves on `best` (None: nothing measured yet, so any value does):
    /// strictly, so a plateau counts against the patience.
    pub fn improves(self, value: f64, best: Option<f64>) -> bool {
        match best {
            None => true,
            Some(best) if self.higher_is_better() => value > best,
            Some(best) => value < best,
        }
    }
}

/// `--early-stopping`: every `every` optimiser steps the run scores the validation split
/// by `metric`; the checkpoint of the best score is kept
/// and marked, and the run stops once `patience` evaluations in a row have not improved on
/// it (`docs/options.md`, "Budgets and early stopping").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EarlyStopping {
    pub metric: StopMetric,
    pub patience: u64,
    pub every: u64,
}

choice_enum! {
    /// Why a training run ended, recorded with it (`run_options.stopped`).
    pub enum StopReason("stop reason") {
        Budget = "budget" => "every step of its budget (--epochs or --steps) ran",
        MaxSteps = "max-steps" => "--max-steps ended it before the end of its budget",
        NoImprovement = "no-improvement"
            => "early stopping: the validation metric did not improve for --patience evaluations",
    }
}

/// The best evaluation of an early-stopping run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BestEvaluation {
    pub metric: StopMetric,
    pub value: f64,
    /// The step evaluated, whose checkpoint is marked best.
    pub step: u64,
}

/// How a finished training run ended.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stopped {
    pub reason: StopReason,
    /// The last step trained.
    pub step: u64,
    /// Early-stopping runs: the best evaluation (None before the first one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<BestEvaluation>,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at step {}", self.reason.name(), self.step)?;
        if let Some(b) = &self.best {
            write!(f, "; best {} {:.6} at step {}", b.metric, b.value, b.step)?;
        }
        Ok(())
    }
}

/// A step-size schedule: η·γⁿ in an epoch after which n of the listed epoch counts have
/// passed (multi-step decay). `after` holds epoch counts, strictly increasing and ≥ 1:
/// `after = [45]` trains the first 45 epochs with η and the rest with γη.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LrDecay {
    pub after: Vec<u64>,
    pub factor: f64,
}

impl LrDecay {
    /// The multiplier of η in (0-based) `epoch`: γⁿ, n = the listed counts ≤ `epoch`.
    pub fn multiplier(&self, epoch: u64) -> f64 {
        let passed = self.after.iter().filter(|&&e| e <= epoch).count();
        (0..passed).fold(1.0, |m, _| m * self.factor)
    }
}

impl TrainConfig {
    /// Adam's settings for a step in (0-based) `epoch`: η as `--lr-decay` has it then.
    pub fn adam(&self, epoch: u64) -> AdamConfig {
        AdamConfig {
            lr: self.lr_in(epoch),
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
        }
    }

    /// The natural-gradient step size γ in (0-based) `epoch` (`--natural-step` times the
    /// decay of the epochs passed, as η); None when q(u) is trained by Adam.
    pub fn natural_step_in(&self, epoch: u64) -> Option<f64> {
        self.natural_step.map(|gamma| self.decayed(gamma, epoch))
    }

    /// η in (0-based) `epoch`: `--lr` times the decay of the epochs passed (exactly `--lr`
    /// without a schedule, so runs without one keep their bits).
    pub fn lr_in(&self, epoch: u64) -> f64 {
        self.decayed(self.lr, epoch)
    }

    /// `step` times the `--lr-decay` multiplier of `epoch` (exactly `step` without one).
    fn decayed(&self, step: f64, epoch: u64) -> f64 {
        match &self.lr_decay {
            Some(decay) => step * decay.multiplier(epoch),
            None => step,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serialises")
    }

    /// How `predict --probabilities` turns q(f) = N(f̄, v) into p(y = 1): exactly
    /// Φ(f̄/√(1 + v)) for the probit likelihood; E[σ(f)] by a 100-point Gauss–Hermite rule for
    /// a binary logistic run; the probit approximation of E[σ(f)] for a multi-label logistic
    /// run (what predict has always written there).
    pub fn probability_rule(&self) -> Result<ProbabilityRule> {
        Ok(match (self.likelihood, self.task) {
            (LikelihoodChoice::Probit, _) => ProbabilityRule::ProbitExact,
            (LikelihoodChoice::Logistic, Task::Binary) => {
                ProbabilityRule::logistic_quadrature(LOGISTIC_PREDICTIVE_POINTS)?
            }
            (LikelihoodChoice::Logistic, _) => ProbabilityRule::LogisticProbitApproximation,
            (
                multiclass @ (LikelihoodChoice::Ove
                | LikelihoodChoice::RobustMax
                | LikelihoodChoice::Softmax
                | LikelihoodChoice::Hl
                | LikelihoodChoice::ArSoftmax
                | LikelihoodChoice::ArLogit),
                _,
            ) => anyhow::bail!(
                "internal: the {} likelihood gives class probabilities, not a per-label rule",
                multiclass.name()
            ),
        })
    }

    /// The seed of the Monte Carlo noise of a multi-class run's predictive class
    /// probabilities (held-out figures and `predict`): row r of a split draws from this seed
    /// and the stream r, so its probabilities do not depend on how rows are grouped.
    pub fn predictive_seed(&self) -> u64 {
        // Any fixed function of the run seed: kept apart from the training steps' noise.
        self.seed ^ 0x9e37_79b9_7f4a_7c15
    }

    /// The run's ε of robust-max.
    pub fn epsilon(&self) -> f64 {
        self.robust_max_epsilon.unwrap_or(DEFAULT_EPSILON)
    }

    /// The run's antithetic Monte Carlo pairs of the softmax.
    pub fn pairs(&self) -> usize {
        self.mc_pairs.unwrap_or(DEFAULT_PAIRS)
    }

    /// The run's width H of the amortisation network's hidden layers.
    pub fn amortiser_width(&self) -> usize {
        self.amortiser_hidden.unwrap_or(DEFAULT_HIDDEN)
    }

    /// The class likelihood of a multi-class run's training steps: [`Self::bound_likelihood`]
    /// with the run's `--class-samples` negatives per row.
    /// The class likelihood of a multi-class run: one-vs-each (its K − 1 logistic
    /// expectations by `quadrature` Gauss–Hermite points, its predictive probabilities by
    /// the softmax with `mc_pairs` pairs), robust-max (ε, `quadrature` points) or the softmax
    /// by Monte Carlo (`mc_pairs` pairs), or Hernández-Lobato (`quadrature` points per probit
    /// expectation and per argmax quadrature).
    pub fn class_likelihood(&self) -> Result<Box<dyn ClassLikelihood>> {
        self.class_likelihood_sampling(self.class_samples)
    }

    /// The class likelihood of a multi-class run's exact bound: every negative class.
    pub fn bound_likelihood(&self) -> Result<Box<dyn ClassLikelihood>> {
        self.class_likelihood_sampling(None)
    }

    /// The class likelihood with `class_samples` negatives per row (None: all): one-vs-each
    /// (its K − 1 logistic expectations by `quadrature` Gauss–Hermite points, its predictive
    /// probabilities by the softmax with `mc_pairs` pairs), robust-max (ε, `quadrature`
    /// points), the softmax by Monte Carlo (`mc_pairs` pairs), or augment-and-reduce's
    /// softmax bound or logit bound (its ε rule of 2·`mc_pairs` points, its pairs by
    /// `quadrature` points), both with predictive probabilities by the softmax with
    /// `mc_pairs` pairs.
    fn class_likelihood_sampling(
        &self,
        class_samples: Option<usize>,
    ) -> Result<Box<dyn ClassLikelihood>> {
        Ok(match self.likelihood {
            LikelihoodChoice::Ove => Box::new(
                OneVsEach::new(self.quadrature, self.pairs())?.with_class_samples(class_samples)?,
            ),
            LikelihoodChoice::ArSoftmax => Box::new(ArSoftmax::new(self.pairs(), class_samples)?),
            LikelihoodChoice::ArLogit => {
                Box::new(ArLogit::new(self.quadrature, self.pairs(), class_samples)?)
            }
            LikelihoodChoice::RobustMax => {
                Box::new(RobustMax::new(self.epsilon(), self.quadrature)?)
            }
            LikelihoodChoice::Softmax => Box::new(SoftmaxMc::new(self.pairs())?),
            LikelihoodChoice::Hl => Box::new(HernandezLobato::new(self.quadrature)?),
            binary @ (LikelihoodChoice::Logistic | LikelihoodChoice::Probit) => anyhow::bail!(
                "the {} likelihood is a Bernoulli likelihood, not one of K classes",
                binary.name()
            ),
        })
    }

    /// The run's `--inducing-inputs`, with `fixed-subspace` for a subspace run with A frozen.
    pub fn inducing_choice(&self) -> InducingInputs {
        match self.inducing_inputs {
            InducingInputs::Subspace if self.freeze_a => InducingInputs::FixedSubspace,
            stored => stored,
        }
    }

    /// The configuration a train run was started with (its catalog parameters).
    pub fn of_run(ws: &Workspace, run: i64) -> Result<Self> {
        let row = ws.run_numbered(run, StageKind::Train)?;
        ensure!(
            row.stage == StageKind::Train,
            "run {run} is a {} run, not train",
            row.stage
        );
        serde_json::from_value(row.params)
            .with_context(|| format!("run {run}: unreadable configuration"))
    }

    /// The dataset the run trained on, checked to be the same ingest.
    pub fn dataset_row(&self, ws: &Workspace) -> Result<DatasetRow> {
        let dataset = ws
            .catalog
            .dataset(&self.dataset)?
            .with_context(|| format!("no dataset '{}' in the workspace", self.dataset))?;
        ensure!(
            dataset.checksum == self.dataset_checksum,
            "dataset '{}' was re-ingested since this run started (checksum {} ≠ {})",
            dataset.name,
            dataset.checksum,
            self.dataset_checksum
        );
        Ok(dataset)
    }
}

/// What the catalog records of a training run: the configuration it started with (its
/// `params`, never rewritten), the one in force now (with the changes made on resume), how
/// it is steered, and those changes.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub run_id: i64,
    pub started: TrainConfig,
    /// What checkpoints written from now on embed, and what lookups match the run on.
    pub in_force: TrainConfig,
    /// None for runs from before steering options were recorded.
    pub steering: Option<Steering>,
    pub changes: Vec<OptionChange>,
    /// False once a change made the run's numbers differ from an uninterrupted run with
    /// the configuration in force (a new thread count); such a run answers no lookup.
    pub reusable: bool,
    /// How the run ended (None while it runs, and for runs from before this was recorded).
    pub stopped: Option<Stopped>,
}

impl RunRecord {
    /// The record of a run just started with `config`.
    pub fn new(run_id: i64, config: TrainConfig, steering: Steering) -> Self {
        RunRecord {
            run_id,
            started: config.clone(),
            in_force: config,
            steering: Some(steering),
            changes: Vec::new(),
            reusable: true,
            stopped: None,
        }
    }

    pub fn of_run(ws: &Workspace, run: i64) -> Result<Self> {
        let started = TrainConfig::of_run(ws, run)?;
        let Some(row) = ws.catalog.run_options(run)? else {
            return Ok(RunRecord {
                run_id: run,
                in_force: started.clone(),
                started,
                steering: None,
                changes: Vec::new(),
                reusable: true,
                stopped: None,
            });
        };
        let unreadable = || format!("run {run}: unreadable run options");
        Ok(RunRecord {
            run_id: run,
            started,
            in_force: serde_json::from_value(row.params).with_context(unreadable)?,
            steering: Some(serde_json::from_value(row.options).with_context(unreadable)?),
            changes: serde_json::from_value(row.changes).with_context(unreadable)?,
            reusable: row.reusable,
            stopped: row
                .stopped
                .map(serde_json::from_value)
                .transpose()
                .with_context(unreadable)?,
        })
    }

    /// Writes the record to the catalog (replacing the previous one).
    pub fn save(&self, ws: &Workspace) -> Result<()> {
        let steering = self
            .steering
            .as_ref()
            .context("internal: a run record is saved with its steering options")?;
        ws.catalog.set_run_options(&RunOptionsRow {
            run_id: self.run_id,
            params: self.in_force.to_json(),
            options: serde_json::to_value(steering)?,
            changes: serde_json::to_value(&self.changes)?,
            reusable: self.reusable,
            stopped: self.stopped.map(serde_json::to_value).transpose()?,
        })
    }
}

/// The files of an svd run that training and prediction read, as registered (read them
/// through [`Registered::map_npy`], K_XX̃ through `Workspace::map_large`).
#[derive(Debug, Clone)]
pub struct SvdFiles {
    /// K_XX̃ [N×R] f32.
    pub kxx: Registered,
    /// ‖x_i‖² [N] f32.
    pub sq_norms: Registered,
    /// X̃ [R×D] f32.
    pub basis: Registered,
    /// A's initialisation [M×R] f32.
    pub a_init: Registered,
}

impl SvdFiles {
    pub fn of_run(ws: &Workspace, svd_run: i64) -> Result<Self> {
        let repaired = ws.catalog.damaged_since(svd_run)?;
        let find = |kind: ArtifactKind| -> Result<Registered> {
            ws.run_file(svd_run, kind)?
                .with_context(|| match &repaired {
                    Some(when) => format!(
                        "svd run {svd_run} was found damaged by 'pipeline verify --repair' \
                     ({when}); run the same 'pipeline svd' (or 'pipeline run') to recompute it"
                    ),
                    None => format!("svd run {svd_run} has no {kind} artifact"),
                })
        };
        Ok(SvdFiles {
            kxx: find(ArtifactKind::Kxx)?,
            sq_norms: find(ArtifactKind::SqNorms)?,
            basis: find(ArtifactKind::Basis)?,
            a_init: find(ArtifactKind::AInit)?,
        })
    }
}

/// The newest successful svd run of `d` (of its current ingest).
pub fn newest_svd_run(ws: &Workspace, d: &DatasetRow) -> Result<i64> {
    ws.catalog
        .newest_ok_run_of_dataset(StageKind::Svd, &d.name, &d.checksum)?
        .map(|r| r.id)
        .with_context(|| {
            format!(
                "dataset '{}' has no svd run; run `pipeline svd --dataset {}` first",
                d.name, d.name
            )
        })
}

/// A training run's configuration and the model of one of its checkpoints (its parameters
/// and configuration, not the optimiser's state), verified against the
/// catalog's checksum: the one at `step`, or by default the run's model ([`run_checkpoint`]).
pub fn load_run_checkpoint(
    ws: &Workspace,
    run: i64,
    step: Option<u64>,
) -> Result<(TrainConfig, CheckpointRow, CheckpointModel)> {
    let (config, ckpt_row) = run_checkpoint(ws, run, step)?;
    let model = read_registered_model(&ws.checkpoint_file(&ckpt_row)?)?;
    Ok((config, ckpt_row, model))
}

/// A training run's configuration and the catalog's row of one of its checkpoints, read
/// from the catalog alone (a caller checks what else it needs before reading the file):
/// the one at `step`, or by default the run's model — the checkpoint early stopping marked
/// best when there is one, else the last.
pub fn run_checkpoint(
    ws: &Workspace,
    run: i64,
    step: Option<u64>,
) -> Result<(TrainConfig, CheckpointRow)> {
    let config = TrainConfig::of_run(ws, run)?;
    let ckpts = ws.catalog.checkpoints(run)?;
    let ckpt_row = match step {
        Some(step) => ckpts.iter().find(|c| c.step == step).with_context(|| {
            format!(
                "run {run} has no checkpoint at step {step} (it has: {})",
                ckpts
                    .iter()
                    .map(|c| c.step.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?,
        None => ckpts
            .iter()
            .find(|c| c.best)
            .or(ckpts.last())
            .with_context(|| format!("run {run} has no checkpoint yet"))?,
    }
    .clone();
    Ok((config, ckpt_row))
}

/// Reads a registered checkpoint, verifying its size and checksum against the catalog.
pub fn load_checkpoint(ws: &Workspace, row: &CheckpointRow) -> Result<Checkpoint> {
    read_registered_checkpoint(&ws.checkpoint_file(row)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model file's stored-name rule for reading X̃ (`store::model_file::reads_basis`,
    /// which the store layer keeps by name) agrees with `in_features` for every choice.
    #[test]
    fn model_files_read_the_basis_exactly_for_the_inducing_inputs_not_in_features() {
        use crate::store::model_file::reads_basis;
        let params = crate::model::params::Params {
            logit_epsilon: None,
            a: faer::Mat::zeros(1, 1),
            q: crate::model::params::QParams::Sites {
                mu: faer::Mat::zeros(1, 1),
                rho: faer::Mat::zeros(1, 1),
            },
            phi: faer::Mat::zeros(1, 1),
            bias: vec![0.0],
            kernel: crate::model::kernel::KernelParams::new(0.0, 0.0),
            amortiser: None,
        };
        for choice in InducingInputs::ALL {
            let config = serde_json::json!({ "inducing_inputs": choice.name() });
            assert_eq!(
                reads_basis(&config, &params),
                !choice.in_features(),
                "{choice}"
            );
        }
    }

    fn config(max_steps: Option<u64>) -> TrainConfig {
        TrainConfig {
            dataset: "toy".into(),
            dataset_checksum: "0123".into(),
            svd_run: 2,
            kernel: KernelChoice::Linear,
            inducing: 16,
            factors: 3,
            batch: 64,
            epochs: 6,
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            negatives: Negatives::Sample(5),
            quadrature: 20,
            seed: 11,
            threads: 2,
            freeze_a: false,
            freeze_hyper: false,
            shuffle_chunks: 2,
            checkpoint_every: 7,
            max_steps,
            ard: ArdChoice::None,
            release_hyper_after: None,
            q_form: QForm::SiteDiagonal,
            warm_start: WarmStart::None,
            natural_step: None,
            inducing_inputs: InducingInputs::Subspace,
            likelihood: LikelihoodChoice::Logistic,
            task: Task::Multilabel,
            latent: LatentChoice::Factor,
            robust_max_epsilon: None,
            mc_pairs: None,
            amortiser_hidden: None,
            class_samples: None,
            learn_epsilon: false,
            lr_decay: None,
            steps: None,
            early_stopping: None,
            prior_variance: None,
            frequent_negatives: None,
        }
    }

    #[test]
    fn the_step_size_falls_by_the_factor_after_each_listed_epoch_count() {
        let c = config(None);
        assert!(c.to_json().get("lr_decay").is_none());
        assert_eq!((0..9).map(|e| c.lr_in(e)).collect::<Vec<_>>(), [0.01; 9]);
        let c = TrainConfig {
            lr_decay: Some(LrDecay {
                after: vec![2, 5],
                factor: 0.5,
            }),
            ..config(None)
        };
        let lr: Vec<f64> = (0..7).map(|e| c.lr_in(e)).collect();
        assert_eq!(lr, [0.01, 0.01, 0.005, 0.005, 0.005, 0.0025, 0.0025]);
        assert_eq!(c.adam(5).lr, 0.0025);
        let json = c.to_json();
        assert_eq!(json["lr_decay"]["after"], serde_json::json!([2, 5]));
        assert_eq!(json["lr_decay"]["factor"], 0.5);
        assert_eq!(serde_json::from_value::<TrainConfig>(json).unwrap(), c);
    }

    #[test]
    fn likelihood_task_and_latent_are_omitted_at_their_defaults_and_read_back() {
        let json = config(None).to_json();
        for key in [
            "likelihood",
            "task",
            "latent",
            "robust_max_epsilon",
            "mc_pairs",
            "learn_epsilon",
        ] {
            assert!(json.get(key).is_none(), "{key} in {json}");
        }
        let c = TrainConfig {
            likelihood: LikelihoodChoice::Probit,
            task: Task::Binary,
            latent: LatentChoice::Independent,
            ..config(None)
        };
        let json = c.to_json();
        assert_eq!(json["likelihood"], "probit");
        assert_eq!(json["task"], "binary");
        assert_eq!(json["latent"], "independent");
        let back: TrainConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, c);
        for name in LikelihoodChoice::NAMES {
            assert_eq!(name.parse::<LikelihoodChoice>().unwrap().name(), *name);
        }
        for name in Task::NAMES {
            assert_eq!(name.parse::<Task>().unwrap().name(), *name);
        }
        for name in LatentChoice::NAMES {
            assert_eq!(name.parse::<LatentChoice>().unwrap().name(), *name);
        }
        let err = "regression".parse::<Task>().unwrap_err();
        assert!(err.contains("multilabel, binary, multiclass"), "{err}");
        let c = TrainConfig {
            likelihood: LikelihoodChoice::RobustMax,
            task: Task::Multiclass,
            robust_max_epsilon: Some(0.01),
            mc_pairs: Some(4),
            ..config(None)
        };
        let json = c.to_json();
        assert_eq!(json["likelihood"], "robust-max");
        assert_eq!(json["task"], "multiclass");
        assert_eq!(json["robust_max_epsilon"], 0.01);
        assert_eq!(json["mc_pairs"], 4);
        for key in ["amortiser_hidden", "class_samples"] {
            assert!(json.get(key).is_none(), "{key} written at its default");
        }
        assert_eq!(serde_json::from_value::<TrainConfig>(json).unwrap(), c);
        let c = TrainConfig {
            likelihood: LikelihoodChoice::ArSoftmax,
            task: Task::Multiclass,
            amortiser_hidden: Some(8),
            class_samples: Some(3),
            ..config(None)
        };
        let json = c.to_json();
        assert_eq!(json["likelihood"], "ar-softmax");
        assert_eq!(
            (
                json["amortiser_hidden"].clone(),
                json["class_samples"].clone()
            ),
            (8.into(), 3.into())
        );
        assert_eq!(serde_json::from_value::<TrainConfig>(json).unwrap(), c);
        assert!("logit".parse::<LikelihoodChoice>().is_err());
        assert!("shared".parse::<LatentChoice>().is_err());
    }

    #[test]
    fn new_kernel_options_are_omitted_at_their_defaults() {
        let json = config(None).to_json();
        assert!(json.get("ard").is_none() && json.get("release_hyper_after").is_none());
        let mut c = config(None);
        c.kernel = KernelChoice::SePlusLinear;
        c.ard = ArdChoice::BasisDirections;
        c.release_hyper_after = Some(3);
        let json = c.to_json();
        assert_eq!(json["kernel"], "se+linear");
        assert_eq!(json["ard"], "subspace");
        assert_eq!(json["release_hyper_after"], 3);
        let back: TrainConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, c);
        for name in ArdChoice::NAMES {
            assert_eq!(name.parse::<ArdChoice>().unwrap().name(), *name);
        }
        assert!("feature".parse::<ArdChoice>().is_err());
        c.ard = ArdChoice::Features;
        assert_eq!(c.to_json()["ard"], "features");
        let back: TrainConfig = serde_json::from_value(c.to_json()).unwrap();
        assert_eq!(back.ard, ArdChoice::Features);
    }

    #[test]
    fn the_default_q_form_is_left_out_of_the_json_and_the_others_round_trip() {
        let json = config(None).to_json();
        assert!(json.get("q_form").is_none(), "{json}");
        for (choice, name) in [(QForm::Cholesky, "cholesky"), (QForm::Whitened, "whitened")] {
            let cfg = TrainConfig {
                q_form: choice,
                ..config(None)
            };
            let json = cfg.to_json();
            assert_eq!(json["q_form"], name);
            let back: TrainConfig = serde_json::from_value(json).unwrap();
            assert_eq!(back, cfg);
            assert_eq!(name.parse::<QForm>(), Ok(choice));
            assert_eq!(choice.name(), name);
        }
        assert_eq!("sites".parse::<QForm>(), Ok(QForm::SiteDiagonal));
        assert!("diagonal".parse::<QForm>().is_err());
    }

    #[test]
    fn configurations_without_max_steps_read_and_compare_as_before() {
        // Without a limit the field is left out, so the JSON is what it was before
        // --max-steps existed (catalog lookups compare it as text).
        let json = config(None).to_json();
        assert!(json.get("max_steps").is_none(), "{json}");
        // Configurations written before the option existed read as "no limit".
        let old: TrainConfig = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(old, config(None));
        assert_eq!(old.to_json().to_string(), json.to_string());
        // A limit is stored and read back.
        let limited = config(Some(21)).to_json();
        assert_eq!(limited["max_steps"], 21);
        let back: TrainConfig = serde_json::from_value(limited).unwrap();
        assert_eq!(back.max_steps, Some(21));
    }

    #[test]
    fn a_step_budget_and_early_stopping_are_stored_only_when_set() {
        let json = config(None).to_json();
        for key in ["steps", "early_stopping"] {
            assert!(json.get(key).is_none(), "{key} in {json}");
        }
        let c = TrainConfig {
            steps: Some(3000),
            early_stopping: Some(EarlyStopping {
                metric: StopMetric::P1,
                patience: 10,
                every: 60,
            }),
            ..config(None)
        };
        let json = c.to_json();
        assert_eq!(json["steps"], 3000);
        assert_eq!(
            json["early_stopping"],
            serde_json::json!({"metric": "P@1", "patience": 10, "every": 60})
        );
        assert_eq!(serde_json::from_value::<TrainConfig>(json).unwrap(), c);
        // The stopping metric suits the task its held-out evaluation measures.
        for task in [Task::Multilabel, Task::Binary, Task::Multiclass] {
            assert!(StopMetric::of_task(task).suits(task), "{task}");
        }
        assert!(!StopMetric::Nlp.suits(Task::Multilabel));
        assert!(!StopMetric::P1.suits(Task::Binary));
        let stopped = Stopped {
            reason: StopReason::NoImprovement,
            step: 1320,
            best: Some(BestEvaluation {
                metric: StopMetric::P1,
                value: 0.8125,
                step: 720,
            }),
        };
        let json = serde_json::to_value(stopped).unwrap();
        assert_eq!(json["reason"], "no-improvement");
        assert_eq!(serde_json::from_value::<Stopped>(json).unwrap(), stopped);
        assert_eq!(
            stopped.to_string(),
            "no-improvement at step 1320; best P@1 0.812500 at step 720"
        );
    }

    #[test]
    fn inducing_inputs_are_omitted_at_the_default_and_read_back() {
        let json = config(None).to_json();
        assert!(json.get("inducing_inputs").is_none(), "{json}");
        let mut free = config(None);
        free.inducing_inputs = InducingInputs::Free;
        let json = free.to_json();
        assert_eq!(json["inducing_inputs"], "free");
        let back: TrainConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, free);
        let mut rows = config(None);
        (rows.inducing_inputs, rows.freeze_a) = (InducingInputs::FixedRows, true);
        assert_eq!(rows.to_json()["inducing_inputs"], "fixed-rows");
        assert_eq!(rows.inducing_choice(), InducingInputs::FixedRows);
        // A frozen subspace run is fixed-subspace, however it was asked for.
        let mut frozen = config(None);
        frozen.freeze_a = true;
        assert_eq!(frozen.inducing_choice(), InducingInputs::FixedSubspace);
        for name in InducingInputs::NAMES {
            assert_eq!(name.parse::<InducingInputs>().unwrap().name(), *name);
        }
        let err = "fre".parse::<InducingInputs>().unwrap_err();
        assert!(
            err.contains("subspace, free, fixed-subspace, fixed-rows"),
            "{err}"
        );
    }

    #[test]
    fn option_values_parse_with_clear_errors() {
        assert_eq!("all".parse::<Negatives>(), Ok(Negatives::All));
        assert_eq!("100".parse::<Negatives>(), Ok(Negatives::Sample(100)));
        assert!("0"
            .parse::<Negatives>()
            .unwrap_err()
            .contains("positive count"));
        assert_eq!("se".parse::<KernelChoice>(), Ok(KernelChoice::Se));
        assert!("rbf".parse::<KernelChoice>().is_err());
        for name in KernelChoice::NAMES {
            assert_eq!(name.parse::<KernelChoice>().unwrap().name(), *name);
        }
    }
}
