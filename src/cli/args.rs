//! The command line's grammar: one clap struct per subcommand, each turned into the plain
//! options struct of its stage (clap lives in this layer only). `pipeline run` parses a
//! spec's tables with the same structs, so a spec means what the flags mean.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, FromArgMatches, Parser, Subcommand};

use std::ops::Bound::{Excluded, Included};

use super::bounds::{
    int_in, open_fraction, positive_at_most, positive_finite, real_in, run_id, seed, threads,
    MAX_BLOCK_ROWS, MAX_HIDDEN, MAX_KMEANS_ITERS, MAX_LISTED_RUNS, MAX_MC_PAIRS, MAX_PREFETCH,
    MAX_PROPENSITY, MAX_QUADRATURE, MAX_SPLIT_COLUMN, MAX_SYNTH_ROWS,
};
use super::progress::LogFormat;
use crate::choice::Choice;
use crate::evaluate::{EvaluateOptions, TaskChoice as EvaluateTask};
use crate::export::ExportOptions;
use crate::ingest::config::{IngestConfig, DEFAULT_CHUNK_MB};
use crate::ingest::input::InputLayout;
use crate::ingest::layouts::{Bow, Libsvm, XcSingle, XcSplit};
use crate::ingest::sink::{MAX_CHUNK_MB, MAX_CHUNK_ROWS};
use crate::ingest::validation::{ValidationSplit, MAX_FOLDS};
use crate::metrics::MAX_K;
use crate::metrics::{LabellessRows, PropensityParams};
use crate::predict::input::{InputOptions, StreamFormat};
use crate::predict::PredictOptions;
use crate::serve::{Limits, ServeOptions};
use crate::store::catalog::{LabelKind, Split};
use crate::store::verify::VerifyOptions;
use crate::svd::kmeans::InitMethod;
use crate::svd::{SvdOptions, DEFAULT_INDUCING, DEFAULT_RANK, MAX_OVERSAMPLE, MAX_POWER_ITERS};
use crate::synth::{self, Shape, SynthOptions};
use crate::text::parse::UnknownFeatures;
use crate::text::parse::MAX_IDS;
use crate::train::batches::{MAX_EPOCHS, MAX_STEPS};
use crate::train::budget::DEFAULT_MIN_STEPS;
use crate::train::declare::train_option_table;
use crate::train::early::{DEFAULT_PATIENCE, EVALUATIONS_PER_BUDGET};
use crate::train::{
    ElboOptions, TrainFlag, TrainOptions, DEFAULT_FACTORS, DEFAULT_LR_DECAY, MAX_PRIOR_VARIANCE,
    MIN_PRIOR_VARIANCE,
};
use crate::trained::{
    ArdChoice, InducingInputs, KernelChoice, LatentChoice, LikelihoodChoice, Negatives, QForm,
    Retention, StopMetric, Task, WarmStart,
};
use crate::transform::TransformChoice;

/// The parser of a [`Choice`]: clap lists its table's names with their help and checks
/// them; the table turns the checked text into the value.
fn one_of<T: Choice + Send + Sync>() -> impl TypedValueParser<Value = T> {
    let values = T::TABLE.iter().map(|e| match e.help {
        "" => PossibleValue::new(e.name),
        help => PossibleValue::new(e.name).help(help),
    });
    PossibleValuesParser::new(values).map(|s| T::parse_name(&s).expect("a listed name parses"))
}

/// [`one_of`] without each value's help: the names alone, for an option whose own help
/// says what they mean (clap's short help layout then stays).
fn names_of<T: Choice + Send + Sync>() -> impl TypedValueParser<Value = T> {
    let values = T::TABLE.iter().map(|e| PossibleValue::new(e.name));
    PossibleValuesParser::new(values).map(|s| T::parse_name(&s).expect("a listed name parses"))
}

/// `--epochs`' help, with its limit and the default budget's floor from their constants.
fn epochs_help() -> String {
    format!(
        "The budget in passes over the training rows, at most {MAX_EPOCHS}. Left out (with \
         --steps too), the default is raised to {DEFAULT_MIN_STEPS} optimiser steps on data \
         whose default epochs hold fewer (docs/options.md, \"Budgets and early stopping\")"
    )
}

/// `--validate-every`'s help, with its default from the constant it derives from.
fn validate_every_help() -> String {
    format!(
        "With --early-stopping: optimiser steps between two scores of the validation split \
         (default: the budget's steps / {EVALUATIONS_PER_BUDGET}, rounded up)"
    )
}

#[derive(Parser, Debug)]
#[command(
    name = "pipeline",
    version,
    about = "fsgp: fully scalable Gaussian processes for extreme multi-label classification",
    after_help = examples::PIPELINE
)]
pub struct Cli {
    /// Workspace directory holding the catalog and every stage's output.
    #[arg(
        long,
        global = true,
        env = "FSGP_WORKSPACE",
        default_value = "fsgp-workspace"
    )]
    pub workspace: PathBuf,
    /// How progress is shown on standard error: auto (bars on a terminal, text otherwise),
    /// text (a line per epoch, score and note), jsonl (a JSON object per event), bars
    /// (docs/progress.md)
    #[arg(long, global = true, default_value = "auto", value_parser = names_of::<LogFormat>())]
    pub log_format: LogFormat,
    /// Print only results (tables, metrics, status) and warnings: no progress and no notes
    #[arg(long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate Extreme Classification Repository text files with a planted structure.
    Synth(SynthArgs),
    /// Read XML-repository text files into Parquet CSR chunks and register the dataset.
    #[command(after_help = examples::INGEST)]
    Ingest(IngestArgs),
    /// Out-of-core truncated SVD of a dataset's training matrix, K_XX̃ and A's initialisation.
    #[command(after_help = examples::SVD)]
    Svd(SvdArgs),
    /// Fit MLGPF by stochastic variational inference on a dataset's SVD factors.
    #[command(after_help = examples::TRAIN)]
    Train(TrainArgs),
    /// Exact full-data evidence lower bound of a training checkpoint.
    Elbo(ElboArgs),
    /// Top-k labels of every row of a split under a training checkpoint (Parquet), or of
    /// new rows from a file or standard input (--input).
    #[command(after_help = examples::PREDICT)]
    Predict(PredictArgs),
    /// P@k, nDCG@k, PSP@k, PSnDCG@k and coverage@k of predictions against the true labels.
    #[command(after_help = examples::EVALUATE)]
    Evaluate(EvaluateArgs),
    /// A whole run from a TOML spec: (synth →) ingest → svd → train → predict → evaluate.
    #[command(after_help = examples::RUN)]
    Run(RunArgs),
    /// From a training file to a chosen model within a time budget: ingest, candidates
    /// scored on a validation split, the winner retrained on every training row, the test
    /// metrics, and a spec that reproduces it (docs/fit.md).
    #[command(after_help = examples::FIT)]
    Fit(FitArgs),
    /// One training checkpoint as a self-contained, versioned model file: configuration,
    /// dataset facts and transform, basis, parameters, checksums and provenance
    /// (docs/formats.md, "Model files").
    #[command(after_help = examples::EXPORT)]
    Export(ExportArgs),
    /// Serve a model file's predictions over HTTP/1.1 JSON: POST /v1/predict, GET
    /// /v1/model, GET /healthz (docs/serve.md). Needs no workspace; stops on SIGTERM after
    /// the requests in flight (at most --shutdown-timeout).
    #[command(after_help = examples::SERVE)]
    Serve(ServeArgs),
    /// Charts (PNG, SVG) and a Markdown summary of a training run.
    #[command(after_help = examples::REPORT)]
    Report(ReportArgs),
    /// Show what the workspace holds: datasets, artifacts, training runs, stage runs.
    #[command(after_help = examples::STATUS)]
    Status(StatusArgs),
    /// Check the workspace (fsck): every file against its checksum, every run's inputs,
    /// orphan files, the catalog's integrity; --repair makes the next run recompute what
    /// was damaged.
    Verify(VerifyArgs),
}

/// Arguments of `pipeline synth`. `--shape` gives defaults; explicit flags override.
#[derive(clap::Args, Debug, Clone)]
pub struct SynthArgs {
    /// Output directory (created if missing); receives train.txt and test.txt, and other
    /// files in it are left alone.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace a train.txt or test.txt already in --out (refused otherwise, before
    /// anything is generated); never a directory or a device.
    #[arg(long)]
    pub force: bool,
    /// Number of training rows N.
    #[arg(long, value_parser = int_in::<u64>(1, MAX_SYNTH_ROWS))]
    pub rows: Option<u64>,
    /// Number of test rows (default: the preset's test/train ratio, or rows/4).
    #[arg(long = "test-rows", value_parser = int_in::<u64>(0, MAX_SYNTH_ROWS))]
    pub test_rows: Option<u64>,
    /// Number of features D.
    #[arg(long, value_parser = int_in::<u32>(1, synth::MAX_FEATURES.into()))]
    pub features: Option<u32>,
    /// Number of labels K (L).
    #[arg(long, value_parser = int_in::<u32>(1, synth::MAX_LABELS.into()))]
    pub labels: Option<u32>,
    /// Mean number of non-zero features per row (default 20 without --shape).
    #[arg(long = "nnz-per-row",
          value_parser = real_in(Included(1.0), Included(synth::MAX_FEATURES.into())))]
    pub nnz_per_row: Option<f64>,
    /// Mean number of labels per row (default 3 without --shape).
    #[arg(long = "labels-per-row",
          value_parser = real_in(Included(0.0), Included(synth::MAX_LABELS.into())))]
    pub labels_per_row: Option<f64>,
    /// Number of planted topics (rank of the planted structure; default clamp(2*sqrt(K), 8, 256)).
    #[arg(long, value_parser = int_in::<u32>(1, synth::MAX_TOPICS.into()))]
    pub topics: Option<u32>,
    /// Take defaults from one of the paper's data sets (Table 1).
    #[arg(long, value_parser = one_of::<Shape>())]
    pub shape: Option<Shape>,
    /// Random seed; the output bytes are a function of the configuration and the seed only.
    #[arg(long, default_value_t = 0, value_parser = seed())]
    pub seed: u64,
    /// Worker threads (default: all available cores; at most 4 per core). Does not change
    /// the output.
    #[arg(long, value_parser = threads())]
    pub threads: Option<usize>,
}

impl SynthArgs {
    pub fn options(&self) -> SynthOptions {
        SynthOptions {
            out: self.out.clone(),
            force: self.force,
            rows: self.rows,
            test_rows: self.test_rows,
            features: self.features,
            labels: self.labels,
            nnz_per_row: self.nnz_per_row,
            labels_per_row: self.labels_per_row,
            topics: self.topics,
            shape: self.shape,
            seed: self.seed,
            threads: self.threads,
        }
    }
}

/// Arguments of `pipeline ingest`.
#[derive(clap::Args, Debug, Clone)]
pub struct IngestArgs {
    /// Name of the dataset in the workspace.
    #[arg(long)]
    pub name: String,
    /// Single-file layout: training file (`N D L` header, rows `l1,l2 f:v ...`).
    #[arg(long, conflicts_with_all = ["data", "train_features"])]
    pub train: Option<PathBuf>,
    /// Single-file layout: test file with the same D and L.
    #[arg(long, requires = "train")]
    pub test: Option<PathBuf>,
    /// Split layout: the `*_data.txt` file holding all rows.
    #[arg(long, requires = "train_split", conflicts_with = "train_features")]
    pub data: Option<PathBuf>,
    /// Split layout: file of 1-based row numbers of the training rows, one column per split.
    #[arg(long, requires = "data")]
    pub train_split: Option<PathBuf>,
    /// Split layout: file of 1-based row numbers of the test rows.
    #[arg(long, requires = "data")]
    pub test_split: Option<PathBuf>,
    /// Split layout: which column of the split files to use (0 = the first).
    #[arg(long, default_value_t = 0, value_parser = int_in::<usize>(0, MAX_SPLIT_COLUMN))]
    pub split_column: usize,
    /// BoW layout: training feature file (`N D` header, rows `f:v ...`).
    #[arg(long, requires = "train_labels")]
    pub train_features: Option<PathBuf>,
    /// BoW layout: training label file (`N L` header, rows `l:v ...`).
    #[arg(long, requires = "train_features")]
    pub train_labels: Option<PathBuf>,
    /// BoW layout: test feature file.
    #[arg(long, requires_all = ["test_labels", "train_features"])]
    pub test_features: Option<PathBuf>,
    /// BoW layout: test label file.
    #[arg(long, requires = "test_features")]
    pub test_labels: Option<PathBuf>,
    /// What is done to the feature values before they are stored: fitted on the training
    /// split, recorded with the dataset, the same for every split (docs/transforms.md).
    #[arg(long, value_parser = one_of::<TransformChoice>(),
          default_value_t = TransformChoice::default(), conflicts_with = "no_normalize")]
    pub transform: TransformChoice,
    /// The same as --transform none (kept from before transforms had a name).
    #[arg(long)]
    pub no_normalize: bool,
    /// Smallest feature and label id used in the files (0 or 1); default 0, and 1 with
    /// --format libsvm (whose labels are class values, not ids).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1))]
    pub index_base: Option<u32>,
    /// Drop rows without labels (they are always counted).
    #[arg(long)]
    pub drop_unlabeled: bool,
    /// Skip malformed rows (counting them) and accept CRLF line ends and a missing final
    /// newline; file-level problems (headers, row counts, split files) stay errors.
    #[arg(long)]
    pub lenient: bool,
    /// Rows per chunk file (default: sized so a chunk holds about --chunk-mb of data).
    #[arg(long, value_parser = int_in::<usize>(1, MAX_CHUNK_ROWS as u64))]
    pub chunk_rows: Option<usize>,
    /// Target uncompressed size of a chunk in MiB when --chunk-rows is not given.
    #[arg(long, default_value_t = DEFAULT_CHUNK_MB,
          value_parser = int_in::<usize>(1, MAX_CHUNK_MB as u64))]
    pub chunk_mb: usize,
    /// Worker threads (default: all cores; at most 4 per core).
    #[arg(long, value_parser = threads())]
    pub threads: Option<usize>,
    /// Replace an existing dataset of this name whose inputs or options differ.
    #[arg(long)]
    pub replace: bool,
    /// Carve a validation split out of the training rows: each goes to `validation` with
    /// this probability, decided by a seeded hash of its row index (in (0, 1), e.g. 0.2).
    #[arg(long, value_parser = open_fraction(), group = "carve")]
    pub validation_fraction: Option<f64>,
    /// Carve fold --validation-fold of K as the validation split instead (2 to 100): the K
    /// folds of one seed are disjoint and together hold every training row once.
    #[arg(long, value_name = "K", requires = "validation_fold", group = "carve",
          value_parser = int_in::<u32>(2, MAX_FOLDS.into()))]
    pub validation_folds: Option<u32>,
    /// Which fold of --validation-folds K is the validation split (1 to K).
    #[arg(long, value_name = "I", requires = "validation_folds",
          value_parser = int_in::<u32>(1, MAX_FOLDS.into()))]
    pub validation_fold: Option<u32>,
    /// Seed of the validation carve's row hash.
    #[arg(long, requires = "carve", default_value_t = 0, value_parser = seed())]
    pub validation_seed: u64,
    /// Input format: `libsvm` reads --train [--test] as LIBSVM / SVMlight files (`label
    /// idx:val ...`, no header); `xc`, `xc-split`, `bow` are the Extreme Classification
    /// layouts. Default: the XC layout the file flags select.
    #[arg(long, value_parser = PossibleValuesParser::new(FORMATS))]
    pub format: Option<String>,
    /// LIBSVM: the label kind (binary | multiclass | multilabel) instead of the detected one.
    #[arg(long, value_parser = one_of::<LabelKind>())]
    pub label_kind: Option<LabelKind>,
    /// Keep only each row's first listed label, drop rows without labels and number the
    /// distinct first labels: a multi-class dataset from a multi-label one (any format).
    #[arg(long)]
    pub first_label: bool,
    /// LIBSVM: the number of features D (default: the largest index in the files);
    /// indices beyond it are errors.
    #[arg(long, value_name = "D", value_parser = int_in::<u32>(1, MAX_IDS.into()))]
    pub features: Option<u32>,
    /// With --first-label: number the classes of every split's rows (all, the default) or of
    /// the training rows only (train); a test row whose class no training row has is then
    /// kept without a class, counted, and scored as wrong (docs/formats.md).
    #[arg(long, default_value = "all",
          value_parser = PossibleValuesParser::new(["all", Split::Train.name()]))]
    pub class_map: String,
}

/// The values of `pipeline ingest --format`.
const FORMATS: [&str; 4] = ["xc", "xc-split", "bow", "libsvm"];

impl IngestArgs {
    /// The configuration these flags ask for, checked.
    pub fn config(&self) -> Result<IngestConfig> {
        let config = IngestConfig {
            name: self.name.clone(),
            layout: self.layout()?,
            transform: match self.no_normalize {
                true => TransformChoice::None,
                false => self.transform,
            },
            index_base: self.index_base.unwrap_or(match self.format.as_deref() {
                Some("libsvm") => 1,
                _ => 0,
            }),
            drop_unlabeled: self.drop_unlabeled,
            lenient: self.lenient,
            chunk_rows: self.chunk_rows,
            chunk_mb: self.chunk_mb,
            threads: self.threads,
            replace: self.replace,
            validation: self.validation(),
            label_kind: self.label_kind,
            first_label: self.first_label,
            features: self.features,
            class_map_from_train: self.class_map == Split::Train.name(),
        };
        config.validate()?;
        config.check_input_files()?;
        Ok(config)
    }

    /// The validation carve the flags ask for: a fraction, or a fold (clap makes them
    /// exclusive and requires both fold flags together).
    fn validation(&self) -> Option<ValidationSplit> {
        let seed = self.validation_seed;
        let fraction = self
            .validation_fraction
            .map(|f| ValidationSplit::fraction(f, seed));
        let fold = match (self.validation_fold, self.validation_folds) {
            (Some(fold), Some(folds)) => Some(ValidationSplit::fold(fold, folds, seed)),
            _ => None,
        };
        fraction.or(fold)
    }

    /// The input layout the given file flags select (clap rules out mixing layouts), which
    /// `--format`, when given, must agree with.
    fn layout(&self) -> Result<Box<dyn InputLayout>> {
        let layout = self.inferred_layout()?;
        if let Some(format) = self.format.as_deref() {
            if format == "libsvm" {
                let Some(train) = &self.train else {
                    bail!(
                        "--format libsvm reads --train FILE [--test FILE], found the '{}' \
                         layout's flags",
                        layout.format()
                    );
                };
                return Ok(Box::new(Libsvm {
                    train: train.clone(),
                    test: self.test.clone(),
                }));
            }
            if format != layout.format() {
                bail!(
                    "--format {format}: the given files are the '{}' layout's, expected {}",
                    layout.format(),
                    match format {
                        "xc" => "--train FILE [--test FILE]",
                        "xc-split" => "--data FILE --train-split FILE [--test-split FILE]",
                        _ => "--train-features FILE --train-labels FILE [--test-features ...]",
                    }
                );
            }
        }
        Ok(layout)
    }

    /// The XC layout the file flags select.
    fn inferred_layout(&self) -> Result<Box<dyn InputLayout>> {
        if let Some(train) = &self.train {
            return Ok(Box::new(XcSingle {
                train: train.clone(),
                test: self.test.clone(),
            }));
        }
        if let (Some(data), Some(train_split)) = (&self.data, &self.train_split) {
            return Ok(Box::new(XcSplit {
                data: data.clone(),
                train_split: train_split.clone(),
                test_split: self.test_split.clone(),
                column: self.split_column,
            }));
        }
        if let (Some(f), Some(l)) = (&self.train_features, &self.train_labels) {
            return Ok(Box::new(Bow {
                train: (f.clone(), l.clone()),
                test: self.test_features.clone().zip(self.test_labels.clone()),
            }));
        }
        bail!(
            "no input given: pass --train FILE [--test FILE], or --data FILE --train-split FILE \
             [--test-split FILE], or --train-features FILE --train-labels FILE \
             [--test-features FILE --test-labels FILE]"
        )
    }
}

/// The defaults of `pipeline svd`: the library's ([`SvdOptions::new`]).
fn svd_default() -> SvdOptions {
    SvdOptions::new("")
}

/// `svd --rank`'s help: the rule of its default, with the number of its constant.
fn rank_help() -> String {
    format!(
        "R: number of singular vectors kept, at most min(N, D) of the training split. Default: \
         min({DEFAULT_RANK}, N, D), printed and recorded with the run; at R = D the basis spans \
         the whole input space, so inducing inputs in input space (train --inducing-inputs \
         free) start at k-means centroids of the rows themselves"
    )
}

/// `svd --inducing`'s help: the rule of its default, with the number of its constant.
fn svd_inducing_help() -> String {
    format!(
        "M: number of inducing inputs initialised (rows of a_init.npy), k-means centroids of at \
         most min(N, --kmeans-max-rows) rows, so at most that many. Default: \
         min({DEFAULT_INDUCING}, N, --kmeans-max-rows), printed and recorded with the run"
    )
}

/// Arguments of `pipeline svd`.
#[derive(clap::Args, Debug, Clone)]
pub struct SvdArgs {
    /// Dataset (as named at ingest) whose training split is factorised.
    #[arg(long)]
    pub dataset: String,
    // Its help is `rank_help`'s, which states the default rule from its constant.
    #[arg(long, help = rank_help(), value_parser = int_in::<usize>(1, MAX_IDS.into()))]
    pub rank: Option<usize>,
    /// p: extra random directions beyond R (accuracy of the last singular values).
    #[arg(long, default_value_t = svd_default().oversample,
          value_parser = int_in::<usize>(0, MAX_OVERSAMPLE as u64))]
    pub oversample: usize,
    /// q: power iterations (each is one more pass over the data).
    #[arg(long, default_value_t = svd_default().power_iters,
          value_parser = int_in::<usize>(0, MAX_POWER_ITERS as u64))]
    pub power_iters: usize,
    // Its help is `svd_inducing_help`'s, which states the default rule from its constant.
    #[arg(long, help = svd_inducing_help(), value_parser = int_in::<usize>(1, MAX_IDS.into()))]
    pub inducing: Option<usize>,
    /// How A is initialised.
    #[arg(long, default_value_t = svd_default().init,
          value_parser = one_of::<InitMethod>())]
    pub init: InitMethod,
    /// Lloyd iterations of the k-means initialisation.
    #[arg(long, default_value_t = svd_default().kmeans_iters,
          value_parser = int_in::<usize>(0, MAX_KMEANS_ITERS))]
    pub kmeans_iters: usize,
    /// Run k-means on a uniform sample of at most this many rows of K_XX̃.
    #[arg(long, default_value_t = svd_default().kmeans_max_rows,
          value_parser = int_in::<usize>(1, MAX_IDS.into()))]
    pub kmeans_max_rows: usize,
    #[arg(long, default_value_t = svd_default().seed, value_parser = seed())]
    pub seed: u64,
    /// Worker threads (default: all cores; at most 4 per core).
    #[arg(long, value_parser = threads())]
    pub threads: Option<usize>,
}

impl SvdArgs {
    pub fn options(&self) -> SvdOptions {
        SvdOptions {
            dataset: self.dataset.clone(),
            rank: self.rank,
            oversample: self.oversample,
            power_iters: self.power_iters,
            inducing: self.inducing,
            init: self.init,
            kmeans_iters: self.kmeans_iters,
            kmeans_max_rows: self.kmeans_max_rows,
            seed: self.seed,
            threads: self.threads,
        }
    }
}

/// `train --factors`'s help: the rule of its default, with the number of its constant.
fn factors_help() -> String {
    format!(
        "P: latent GPs. Default: min({DEFAULT_FACTORS}, L) for the factor model (a P above L \
         is kept when given, and noted), K with --latent independent; printed and recorded \
         with the run"
    )
}

/// Arguments of `pipeline train`: its flags, and which of them the command line (or the
/// spec) gave, since on resume those are applied or refused and the others come from the
/// run.
#[derive(Debug, Clone)]
pub struct TrainArgs {
    pub flags: TrainFlags,
    /// The flags given, not filled in by a default.
    pub given: BTreeSet<TrainFlag>,
}

impl TrainArgs {
    /// `m`'s train flags whose value came from the command line.
    fn given_in(m: &ArgMatches) -> Result<BTreeSet<TrainFlag>, clap::Error> {
        let own = TrainFlags::augment_args(clap::Command::new("train"));
        own.get_arguments()
            .map(|a| a.get_id().as_str())
            .filter(|id| m.value_source(id) == Some(ValueSource::CommandLine))
            .map(|id| {
                TrainFlag::of_arg_id(id)
                    .map_err(|e| clap::Error::raw(clap::error::ErrorKind::UnknownArgument, e))
            })
            .collect()
    }

    pub fn options(&self) -> TrainOptions {
        TrainOptions {
            given: self.given.clone(),
            ..self.flags.options()
        }
    }
}

impl FromArgMatches for TrainArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(TrainArgs {
            flags: TrainFlags::from_arg_matches(m)?,
            given: Self::given_in(m)?,
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        self.flags.update_from_arg_matches(m)?;
        self.given.extend(Self::given_in(m)?);
        Ok(())
    }
}

impl Args for TrainArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        TrainFlags::in_help_order(TrainFlags::augment_args(cmd))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        TrainFlags::in_help_order(TrainFlags::augment_args_for_update(cmd))
    }
}

/// `TrainFlags`, the flags of `pipeline train`: one per row of `train_option_table!`
/// (`train::declare`), with its doc comment as help, its `#[arg(…)]`, and its default
/// (`= DEFAULT`) as `default_value_t`.
macro_rules! define_train_flags {
    ($(
        $(#[doc = $doc:literal])*
        #[arg($($arg:tt)*)]
        $variant:ident = $name:literal { $field:ident: $ty:ty $(= $default:expr)? }
        $(listed after $anchor:ident)?
        on resume $rule:expr;
    )+) => {
        /// The flags of `pipeline train`.
        #[derive(clap::Args, Debug, Clone)]
        pub struct TrainFlags {
            $(
                $(#[doc = $doc])*
                #[arg($($arg)*)]
                $(#[arg(default_value_t = $default)])?
                pub $field: $ty,
            )+
        }

        impl TrainFlags {
            /// The options these flags ask for, as if none had been given explicitly.
            pub fn options(&self) -> TrainOptions {
                TrainOptions {
                    $($field: self.$field.clone(),)+
                    given: BTreeSet::new(),
                }
            }

            /// The flags `--help` lists right after another than the table's order puts
            /// them after: (the flag, the one it follows).
            const LISTED_AFTER: &[(TrainFlag, TrainFlag)] =
                &[$($((TrainFlag::$variant, TrainFlag::$anchor),)?)+];
        }
    };
}

train_option_table!(define_train_flags);

impl TrainFlags {
    /// The flags in the order `--help` lists them: the table's, but for the rows
    /// [`Self::LISTED_AFTER`] moves after another.
    fn help_order() -> Vec<TrainFlag> {
        let moved = |flag: &TrainFlag| Self::LISTED_AFTER.iter().any(|(f, _)| f == flag);
        let mut order = Vec::new();
        for &flag in TrainFlag::ALL.iter().filter(|f| !moved(f)) {
            let mut last = flag;
            order.push(flag);
            while let Some(&(next, _)) = Self::LISTED_AFTER.iter().find(|(_, a)| *a == last) {
                order.push(next);
                last = next;
            }
        }
        order
    }

    /// `cmd` with the train flags ordered in its help as [`Self::help_order`] says (clap
    /// otherwise lists them in the struct's order, which is the table's).
    fn in_help_order(cmd: clap::Command) -> clap::Command {
        Self::help_order()
            .into_iter()
            .enumerate()
            .fold(cmd, |cmd, (position, flag)| {
                cmd.mut_arg(flag.arg_id(), |arg| arg.display_order(position))
            })
    }
}

/// Arguments of `pipeline elbo`.
#[derive(clap::Args, Debug, Clone)]
pub struct ElboArgs {
    /// Training run.
    #[arg(long, value_parser = run_id())]
    pub run: i64,
    /// Checkpoint step (default: the run's best with --early-stopping, else its last).
    #[arg(long, value_parser = int_in::<u64>(0, MAX_STEPS))]
    pub checkpoint: Option<u64>,
    /// Split whose bound is computed (only the training split has K_XX̃ factors).
    #[arg(long, default_value_t = Split::Train, value_parser = one_of::<Split>())]
    pub split: Split,
    /// Worker threads (default: the training run's count; at most 4 per core).
    #[arg(long, value_parser = threads())]
    pub threads: Option<usize>,
}

impl ElboArgs {
    pub fn options(&self) -> ElboOptions {
        ElboOptions {
            run: self.run,
            checkpoint: self.checkpoint,
            split: self.split,
            threads: self.threads,
        }
    }
}

/// `predict --top-k`'s help: the rule of its default ([`crate::predict::default_top_k`]),
/// with the numbers of its constants.
fn top_k_help() -> String {
    use crate::predict::{DEFAULT_TOP_K, EVERY_CLASS_UP_TO};
    format!(
        "Labels kept per row. Default: every class of a multi-class run with K ≤ \
         {EVERY_CLASS_UP_TO} classes, otherwise {DEFAULT_TOP_K} (every label when there are \
         fewer); a binary run keeps its one \
         label whatever is given. A multi-class run also records each row's probability of \
         its true class, so its NLP is known whatever k"
    )
}

/// Arguments of `pipeline predict`.
#[derive(clap::Args, Debug, Clone)]
pub struct PredictArgs {
    /// Training run.
    #[arg(long, required_unless_present = "model", value_parser = run_id())]
    pub run: Option<i64>,
    /// With --input: score under this model file (`pipeline export`) instead of a run; no
    /// workspace is read
    #[arg(long, value_name = "MODEL", requires = "input", conflicts_with_all = ["run", "checkpoint"])]
    pub model: Option<PathBuf>,
    /// Checkpoint step (default: the run's best with --early-stopping, else its last).
    #[arg(long, value_parser = int_in::<u64>(0, MAX_STEPS))]
    pub checkpoint: Option<u64>,
    #[arg(long, default_value_t = Split::Test, value_parser = one_of::<Split>())]
    pub split: Split,
    // Its help is `top_k_help`'s, which states the default rule from its constants.
    #[arg(long, help = top_k_help(), value_parser = int_in::<usize>(1, MAX_IDS.into()))]
    pub top_k: Option<usize>,
    /// Rows scored together, at most (memory: rows × labels f64 scores; with many labels
    /// blocks are made smaller, so that their scores stay bounded).
    #[arg(long, default_value_t = 1024, value_parser = int_in::<usize>(1, MAX_BLOCK_ROWS))]
    pub block_rows: usize,
    /// Also write E_q[σ(f_k)] of the kept labels (variance-aware; probit approximation).
    /// Labels stay ranked by the mean f̄, so the probabilities need not decrease along a row.
    #[arg(long)]
    pub probabilities: bool,
    /// Worker threads (default: the training run's count; with --model, the run's as
    /// exported; at most 4 per core)
    #[arg(long, value_parser = threads())]
    pub threads: Option<usize>,
    /// Score the rows of this file instead of a split: text as the run's dataset was
    /// ingested (XML-repository rows with or without their header, or LIBSVM; plain, gzip
    /// or zstd), through its transform; `-` reads standard input. Only reads the workspace
    /// (docs/predict-input.md)
    #[arg(long, value_name = "FILE|-", conflicts_with = "split")]
    pub input: Option<PathBuf>,
    /// With --input: write the predictions to this Parquet file (predict's schema; row_id =
    /// the row's position in the input) instead of printing them
    #[arg(long, value_name = "FILE", requires = "input")]
    pub output: Option<PathBuf>,
    /// With --output: replace an existing file (refused otherwise, before any row is read)
    #[arg(long, requires = "output")]
    pub force: bool,
    /// With --input and no --output: how the rows are printed on standard output
    #[arg(long, default_value_t = StreamFormat::Jsonl, value_parser = one_of::<StreamFormat>(),
          requires = "input", conflicts_with = "output")]
    pub format: StreamFormat,
    /// With --input: a feature id the run's dataset does not have (≥ its D)
    #[arg(long, default_value_t = UnknownFeatures::Refuse,
          value_parser = one_of::<UnknownFeatures>(), requires = "input")]
    pub unknown_features: UnknownFeatures,
}

impl PredictArgs {
    pub fn options(&self) -> PredictOptions {
        PredictOptions {
            // Only `--model` leaves it out, and a model file's predictions read no run.
            run: self.run.unwrap_or_default(),
            checkpoint: self.checkpoint,
            split: self.split,
            top_k: self.top_k,
            block_rows: self.block_rows,
            probabilities: self.probabilities,
            threads: self.threads,
        }
    }

    /// With `--input`: the rows to score and where the predictions go.
    pub fn input_options(&self) -> Option<InputOptions> {
        self.input.as_ref().map(|rows| InputOptions {
            rows: rows.clone(),
            output: self.output.clone(),
            force: self.force,
            format: self.format,
            unknown_features: self.unknown_features,
        })
    }
}

/// Arguments of `pipeline serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// The model file (`pipeline export`).
    #[arg(long, value_name = "MODEL")]
    pub model: PathBuf,
    /// Address and port to listen on (port 0: any free one, printed on standard error).
    /// Loopback by default: put a proxy in front to serve other hosts
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: std::net::SocketAddr,
    /// Scoring threads (default: every core; at most 4 per core)
    #[arg(long, value_parser = threads())]
    pub threads: Option<usize>,
    /// Largest request body in bytes (413 beyond)
    #[arg(long, default_value_t = Limits::default().max_body_bytes,
          value_parser = int_in::<usize>(1, Limits::MOST_BODY_BYTES as u64))]
    pub max_body: usize,
    /// Most rows in one request (413 beyond)
    #[arg(long, default_value_t = Limits::default().max_rows,
          value_parser = int_in::<usize>(1, Limits::MOST_ROWS as u64))]
    pub max_rows: usize,
    /// Seconds from a request's arrival to its answer (408 while its body is arriving,
    /// 503 while it waits to be scored)
    #[arg(long, value_name = "SECONDS", default_value_t = Seconds(Limits::default().timeout),
          value_parser = serve_seconds())]
    pub request_timeout: Seconds,
    /// Most rows scored together: concurrent requests are batched up to it
    #[arg(long, default_value_t = Limits::default().max_block_rows,
          value_parser = int_in::<usize>(1, Limits::MOST_BLOCK_ROWS as u64))]
    pub max_block_rows: usize,
    /// Most requests waiting to be scored (503 beyond)
    #[arg(long, default_value_t = Limits::default().queue,
          value_parser = int_in::<usize>(1, Limits::MOST_QUEUED as u64))]
    pub queue: usize,
    /// Seconds from a request head's first byte to its last; a connection slower is closed
    #[arg(long, value_name = "SECONDS",
          default_value_t = Seconds(Limits::default().header_timeout), value_parser = serve_seconds())]
    pub header_timeout: Seconds,
    /// Seconds a connection with no request in flight stays open
    #[arg(long, value_name = "SECONDS",
          default_value_t = Seconds(Limits::default().idle_timeout), value_parser = serve_seconds())]
    pub idle_timeout: Seconds,
    /// Most connections open at once; one more is answered 503 and closed (lowered to fit
    /// the open-files limit, ulimit -n)
    #[arg(long, default_value_t = Limits::default().max_connections,
          value_parser = int_in::<usize>(1, Limits::MOST_CONNECTIONS as u64))]
    pub max_connections: usize,
    /// Seconds after SIGTERM or SIGINT at which the connections still open are closed
    #[arg(long, value_name = "SECONDS",
          default_value_t = Seconds(Limits::default().shutdown_timeout), value_parser = serve_seconds())]
    pub shutdown_timeout: Seconds,
    /// A feature id the model's dataset does not have (≥ its D): refuse the request (422),
    /// or drop the feature
    #[arg(long, default_value_t = UnknownFeatures::Refuse, value_parser = one_of::<UnknownFeatures>())]
    pub unknown_features: UnknownFeatures,
}

impl ServeArgs {
    /// Every value was range-checked as it was parsed.
    pub fn options(&self) -> anyhow::Result<ServeOptions> {
        Ok(ServeOptions {
            model: self.model.clone(),
            addr: self.addr,
            threads: self.threads,
            limits: Limits {
                max_body_bytes: self.max_body,
                max_rows: self.max_rows,
                timeout: self.request_timeout.0,
                max_block_rows: self.max_block_rows,
                queue: self.queue,
                header_timeout: self.header_timeout.0,
                idle_timeout: self.idle_timeout.0,
                max_connections: self.max_connections,
                shutdown_timeout: self.shutdown_timeout.0,
            },
            unknown_features: self.unknown_features,
        })
    }
}

/// A time limit of `pipeline serve` as written on its command line: seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seconds(pub std::time::Duration);

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.as_secs_f64())
    }
}

/// Seconds from [`Limits::SHORTEST_WAIT`] to [`Limits::LONGEST_WAIT`] (finite: not NaN,
/// not inf), so the conversion to a duration cannot overflow.
fn serve_seconds() -> impl clap::builder::TypedValueParser<Value = Seconds> {
    use std::ops::Bound::Included;
    let (shortest, longest) = (Limits::SHORTEST_WAIT, Limits::LONGEST_WAIT);
    real_in(
        Included(shortest.as_secs_f64()),
        Included(longest.as_secs_f64()),
    )
    .map(|seconds| Seconds(std::time::Duration::from_secs_f64(seconds)))
}

/// Arguments of `pipeline export`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExportArgs {
    /// Training run.
    #[arg(long, value_parser = run_id())]
    pub run: i64,
    /// Checkpoint step (default: the run's best with --early-stopping, else its last).
    #[arg(long, value_parser = int_in::<u64>(0, MAX_STEPS))]
    pub checkpoint: Option<u64>,
    /// The model file to write (written beside it under a temporary name, then renamed).
    #[arg(long, value_name = "MODEL")]
    pub out: PathBuf,
    /// Replace an existing file at --out (refused otherwise).
    #[arg(long)]
    pub force: bool,
}

impl ExportArgs {
    pub fn options(&self) -> ExportOptions {
        ExportOptions {
            run: self.run,
            checkpoint: self.checkpoint,
            out: self.out.clone(),
            force: self.force,
        }
    }
}

/// Arguments of `pipeline evaluate`.
#[derive(clap::Args, Debug, Clone)]
pub struct EvaluateArgs {
    /// A predictions file (workspace-relative or absolute), as written by `pipeline predict`.
    #[arg(long, required_unless_present = "run", conflicts_with = "run")]
    pub predictions: Option<String>,
    /// A training run: evaluates its predictions on --split (predicting first if needed).
    #[arg(long, value_parser = run_id())]
    pub run: Option<i64>,
    /// With --run: the checkpoint step (default: the run's last).
    #[arg(long, requires = "run", value_parser = int_in::<u64>(0, MAX_STEPS))]
    pub checkpoint: Option<u64>,
    /// With --run: the split to predict and evaluate.
    #[arg(long, default_value_t = Split::Test, requires = "run",
          value_parser = one_of::<Split>())]
    pub split: Split,
    /// Metrics at k = 1..K.
    #[arg(long, default_value_t = 5, value_parser = int_in::<usize>(1, MAX_K as u64))]
    pub k: usize,
    /// Propensity model parameter A (0.55 generic, 0.6 Amazon, 0.5 Wikipedia).
    #[arg(long, default_value_t = PropensityParams::GENERIC.a,
          value_parser = positive_at_most(MAX_PROPENSITY))]
    pub propensity_a: f64,
    /// Propensity model parameter B (1.5 generic, 2.6 Amazon, 0.4 Wikipedia).
    #[arg(long, default_value_t = PropensityParams::GENERIC.b,
          value_parser = real_in(Included(0.0), Included(MAX_PROPENSITY)))]
    pub propensity_b: f64,
    /// Test rows without labels: count them (every metric 0 on them, as pyxclib does) or
    /// leave them out.
    #[arg(long, default_value = "count-as-zero",
          value_parser = PossibleValuesParser::new(["count-as-zero", "skip"]).map(|s| {
              if s == "skip" { LabellessRows::Skip } else { LabellessRows::CountAsZero }
          }))]
    pub labelless: LabellessRows,
    /// Which metrics: `auto` is the training run's task (multilabel when it recorded none);
    /// `binary` and `multiclass` need predictions with probabilities (docs/metrics.md).
    #[arg(long, default_value = "auto",
          value_parser = PossibleValuesParser::new(EvaluateTask::names())
              .try_map(|s| EvaluateTask::parse(&s)))]
    pub task: EvaluateTask,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl EvaluateArgs {
    /// The options for a predictions file (given, or made by predicting `--run` first).
    pub fn options(&self, predictions: String) -> EvaluateOptions {
        EvaluateOptions {
            predictions,
            k: self.k,
            propensity: PropensityParams {
                a: self.propensity_a,
                b: self.propensity_b,
            },
            labelless: self.labelless,
            task: self.task,
        }
    }

    /// With `--run`: the predictions to make first (the top `--k` labels of `--split`).
    pub fn predict_first(&self) -> Option<PredictOptions> {
        self.run.map(|run| PredictOptions {
            checkpoint: self.checkpoint,
            split: self.split,
            top_k: Some(self.k),
            ..PredictOptions::new(run)
        })
    }
}

/// Arguments of `pipeline run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// The TOML spec of the run (see `pipelines/`).
    pub spec: PathBuf,
    /// Print the final metrics as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `pipeline fit`.
#[derive(clap::Args, Debug, Clone)]
pub struct FitArgs {
    /// The training file (XML-repository text with its `N D L` header, or LIBSVM; gzip or
    /// zstd by extension).
    #[arg(long)]
    pub train: PathBuf,
    /// The test file, scored once by the final model.
    #[arg(long)]
    pub test: Option<PathBuf>,
    /// The layout of the files (default: `xc` when the first line is an `N D L` header,
    /// else `libsvm`).
    #[arg(long, value_parser = PossibleValuesParser::new(["xc", "libsvm"]))]
    pub format: Option<String>,
    /// The task (default: the label kind ingest detects).
    #[arg(long, value_parser = one_of::<LabelKind>())]
    pub task: Option<LabelKind>,
    /// LIBSVM: the number of features D, as ingest's --features (default: the largest
    /// index in the files, which misses features zero in every training row).
    #[arg(long, value_parser = int_in::<u32>(1, MAX_IDS.into()))]
    pub features: Option<u32>,
    /// Wall-clock budget of the whole fit, e.g. 90s, 5m, 1h.
    #[arg(long, default_value = "5m", value_parser = parse_budget)]
    pub budget: f64,
    /// Name of the dataset (default: the training file's name up to its first '.'); the
    /// selection data is NAME-select.
    #[arg(long)]
    pub name: Option<String>,
    /// Seed of the validation carve, the svd and every training run.
    #[arg(long, default_value_t = 0, value_parser = seed())]
    pub seed: u64,
    /// Share of the training rows carved out for choosing the model.
    #[arg(long, default_value_t = crate::fit::DEFAULT_VALIDATION_FRACTION,
          value_parser = open_fraction())]
    pub validation_fraction: f64,
    /// Where to write the spec of the final model (default: a new file in the workspace,
    /// fits/NAME-fit.toml or NAME-fit-K.toml, whose path fit prints).
    #[arg(long)]
    pub spec_out: Option<PathBuf>,
    /// Train every candidate for its whole share instead of stopping it once its validation
    /// score stops improving (train's --early-stopping, fit's default); the
    /// final model then trains a candidate's whole steps, not its best step's.
    #[arg(long)]
    pub no_early_stopping: bool,
    /// Choose on the one validation carve even when it holds fewer than 500 rows, instead
    /// of every candidate's mean over k folds (docs/fit.md, "Small data: k folds").
    #[arg(long)]
    pub no_folds: bool,
    /// A train option every candidate takes, overriding the candidate's own: FLAG=VALUE,
    /// or FLAG alone for a switch (repeatable; e.g. `--set kernel=linear --set inducing=200`).
    /// Candidates it makes equal are tried once; `inducing` also sets the svd's count of
    /// k-means inducing rows. The options fit decides itself are refused.
    #[arg(long = "set", value_name = "FLAG=VALUE", value_parser = parse_setting)]
    pub set: Vec<Setting>,
    /// Also write the final model's file here, as `pipeline export` writes it (for
    /// `predict --model`, `serve` and the Python package); an existing file is refused
    /// before anything runs.
    #[arg(long)]
    pub model_out: Option<PathBuf>,
    /// Replace an existing file at the spec's path or --model-out (refused otherwise,
    /// before anything runs); never a directory or a device.
    #[arg(long)]
    pub force: bool,
    /// Print what fit did as one JSON object on standard output (every candidate's options
    /// and validation figures, the choice, the final runs and their metrics, the spec and
    /// model files) instead of the final model's metrics table; the progress and the
    /// table still go to standard error.
    #[arg(long)]
    pub json: bool,
}

/// One `fit --set`: a train option and its value (empty for a switch).
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    pub flag: TrainFlag,
    pub value: String,
}

/// The train options `pipeline fit` decides itself, which `--set` refuses: the data and
/// svd each run reads, its task and seed (fit's own `--task`, `--seed`), its length and
/// stopping (and so a schedule counted in its epochs), and the run bookkeeping.
pub const FIT_DECIDES: &[TrainFlag] = &[
    TrainFlag::LrDecayAt,
    TrainFlag::Dataset,
    TrainFlag::Svd,
    TrainFlag::Task,
    TrainFlag::Seed,
    TrainFlag::Epochs,
    TrainFlag::Steps,
    TrainFlag::MaxSteps,
    TrainFlag::Resume,
    TrainFlag::Fresh,
    TrainFlag::EarlyStopping,
    TrainFlag::EvalSplit,
];

/// `FLAG=VALUE` or `FLAG` (a switch) for `fit --set`, FLAG a train option (without `--`).
pub fn parse_setting(text: &str) -> Result<Setting, String> {
    let (name, value) = text.split_once('=').unwrap_or((text, ""));
    let flag: TrainFlag = name.trim().trim_start_matches("--").parse()?;
    if flag == TrainFlag::LrDecayAt {
        return Err(format!(
            "fit decides how long each run trains (its probe takes 50 steps), so a schedule \
             in epochs cannot be fixed (--{flag}); train a spec with `pipeline run` for one"
        ));
    }
    if FIT_DECIDES.contains(&flag) {
        return Err(format!(
            "fit decides --{flag} itself (for the task and seed: fit's own --task and --seed)"
        ));
    }
    Ok(Setting {
        flag,
        value: value.trim().to_string(),
    })
}

/// A budget such as `90s`, `5m`, `1h` or `300` (seconds), in seconds.
pub fn parse_budget(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (number, unit) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit {
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown unit '{other}' in '{text}' (expected s, m or h, e.g. 90s, 5m, 1h)"
            ))
        }
    };
    match number.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * scale <= MAX_BUDGET_SECONDS => Ok(v * scale),
        _ => Err(format!(
            "'{text}' is not a positive duration of at most {} days (e.g. 90s, 5m, 1h)",
            MAX_BUDGET_SECONDS / 86_400.0
        )),
    }
}

/// The longest `fit --budget`: thirty days, beyond which a budget is a typo.
pub const MAX_BUDGET_SECONDS: f64 = 30.0 * 86_400.0;

/// Arguments of `pipeline report`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReportArgs {
    /// Training run.
    #[arg(long, value_parser = run_id())]
    pub run: i64,
    /// Output directory, created if missing (default: `<workspace>/reports/train-run<RUN>`,
    /// where an earlier report's files are replaced). Only the report's own files are
    /// written there; other files are left alone. Not inside the workspace but under its
    /// `reports/`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace files of the report's names (`README.md`, `elbo.png`, ...) already in --out
    /// (refused otherwise, before anything is drawn); never a directory or a device.
    #[arg(long, requires = "out")]
    pub force: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Print JSON for machines instead of tables.
    #[arg(long)]
    pub json: bool,
    /// How many recent stage runs (and training runs) to list.
    #[arg(long, default_value_t = 20, value_parser = int_in::<usize>(1, MAX_LISTED_RUNS))]
    pub runs: usize,
    /// Show one run in full: parameters, status, times, error, artifacts with the key–value
    /// metadata of their Parquet files, checkpoints, metrics.
    #[arg(long, value_name = "N", value_parser = run_id())]
    pub run: Option<i64>,
}

/// The examples `--help` prints after the options (clap `after_help`).
mod examples {
    pub const PIPELINE: &str = "\
Examples:
  pipeline run pipelines/quickstart.toml      # a small generated dataset, text to metrics
  pipeline ingest --name delicious --train train.txt --test test.txt
  pipeline svd --dataset delicious --rank 250 --inducing 500
  pipeline train --dataset delicious --inducing 500 --factors 30 --epochs 200 --eval-every 20
  pipeline evaluate --run 3 --split test      # predicts first if needed
  pipeline report --run 3                     # charts and a summary of training run 3
  pipeline status                             # what the workspace holds; --run N: one run

Every command takes --workspace DIR (default ./fsgp-workspace, or $FSGP_WORKSPACE).
'pipeline COMMAND --help' shows a command's options and examples.";

    pub const INGEST: &str = "\
Examples:
  pipeline ingest --name delicious --train Delicious/train.txt --test Delicious/test.txt
  pipeline ingest --name eurlex --data Eurlex_data.txt --train-split eurlex_trSplit.txt \\
      --test-split eurlex_tstSplit.txt --split-column 0
  pipeline ingest --name amazoncat --train-features trn_X.txt.gz --train-labels trn_Y.txt.gz \\
      --test-features tst_X.txt.gz --test-labels tst_Y.txt.gz
  pipeline ingest --name delicious-val --train Delicious/train.txt --test Delicious/test.txt \\
      --validation-fraction 0.2 --validation-seed 0    # + a 'validation' split for selection
  pipeline ingest --name mnist --format libsvm --train mnist/train.txt.gz --test mnist/test.txt.gz
  pipeline ingest --name delicious-first --train Delicious/train.txt --test Delicious/test.txt \\
      --first-label                                    # multi-class: each row's first label
Rerunning with the same files and options does nothing; other ones need --replace.";

    pub const SVD: &str = "\
Examples:
  pipeline svd --dataset delicious --rank 250 --inducing 500
  pipeline svd --dataset eurlex --rank 300 --inducing 1000 --power-iters 3 --seed 1
  pipeline svd --dataset banana     # R and M from the data: on D = 2, N = 400, R = 2, M = 400";

    pub const TRAIN: &str = "\
Examples:
  # The paper's s-LINEAR settings on Delicious (prints the run id):
  pipeline train --dataset delicious --kernel linear --inducing 500 --factors 30 --batch 500 \\
      --epochs 200 --lr 0.01 --negatives all --seed 0 --eval-every 20
  pipeline train --dataset delicious --max-steps 1000      # a short run
  pipeline train --dataset yeast --steps 3000 --early-stopping   # the ingest carved a validation split
  pipeline train --resume 3                                # continue an interrupted run
'pipeline status' lists training runs with their progress; 'pipeline report --run N' charts one.";

    pub const PREDICT: &str = "\
Examples:
  pipeline predict --run 3 --split test --top-k 5
  pipeline predict --run 3 --checkpoint 2600 --probabilities
  pipeline predict --run 3 --input new.txt --output new.parquet   # rows never ingested
  pipeline predict --model delicious.model.parquet --input new.txt  # no workspace needed
  zcat new.svm.gz | pipeline predict --run 7 --input - --probabilities --format tsv";

    pub const EVALUATE: &str = "\
Examples:
  pipeline evaluate --run 3 --split test          # predicts the top --k labels first if needed
  pipeline evaluate --predictions predictions/delicious-test.run4/predictions.parquet --json
  pipeline evaluate --run 3 --propensity-a 0.6 --propensity-b 2.6   # Amazon's propensities
  pipeline evaluate --run 7 --k 1 --task binary   # accuracy, NLP, Brier, ECE, AUC (L = 1)";

    pub const RUN: &str = "\
Examples:
  pipeline run pipelines/quickstart.toml
  pipeline run pipelines/delicious.toml --json
A second invocation skips every stage already done and resumes one that was cut.";

    pub const FIT: &str = "\
Examples:
  pipeline fit --train train.txt.gz --test test.txt.gz                # 5 minutes
  pipeline fit --train spam.svm --test spam-test.svm --budget 90s --name spam
It prints the validation table, the choice and the test metrics, and writes a spec into the
workspace (fits/NAME-fit.toml; --spec-out to choose): `pipeline run SPEC` reproduces the
final model. --json prints all of it as one JSON object.";

    pub const EXPORT: &str = "\
Examples:
  pipeline export --run 3 --out delicious.model.parquet   # the run's model (best, else last)
  pipeline export --run 3 --checkpoint 2600 --out delicious.model.parquet --force
The file needs no workspace: it holds the configuration, the dataset's transform and class
map, the basis, the parameters and their checksums (docs/formats.md, \"Model files\").";

    pub const SERVE: &str = "\
Examples:
  pipeline serve --model delicious.model.parquet                  # on 127.0.0.1:8080
  curl -s localhost:8080/v1/predict -d '{\"rows\": [{\"features\": {\"12\": 0.5}}], \"top_k\": 3}'
  curl -s localhost:8080/v1/predict -d '{\"rows\": [\"12:0.5 40:1\"], \"probabilities\": true}'
Each answer row is the line `predict --model MODEL --input` prints for the same row
(docs/serve.md).";

    pub const REPORT: &str = "\
Examples:
  pipeline report --run 3                         # into <workspace>/reports/train-run3/
  pipeline report --run 3 --out /tmp/run3-report";

    pub const STATUS: &str = "\
Examples:
  pipeline status                 # datasets, derived artifacts, training runs, recent runs
  pipeline status --json          # the same for machines
  pipeline status --run 3         # one run in full, with its Parquet files' metadata";
}

/// Arguments of `pipeline verify`.
#[derive(clap::Args, Debug, Clone)]
pub struct VerifyArgs {
    /// Mark runs with damaged files failed and drop their rows and files, remove orphan
    /// files: the next `pipeline run` recomputes exactly what was lost.
    #[arg(long)]
    pub repair: bool,
    /// Build a new catalog from the rows each run directory carries in its marker, for a
    /// workspace whose catalog is lost (missing or empty; move a wrong or older one out
    /// first), then check the workspace as without it (docs/reliability.md).
    #[arg(long, conflicts_with = "repair")]
    pub rebuild_catalog: bool,
    /// Print the report as JSON (on stdout) instead of lines.
    #[arg(long)]
    pub json: bool,
}

impl VerifyArgs {
    pub fn options(&self) -> VerifyOptions {
        VerifyOptions {
            repair: self.repair,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(argv: &[&str]) -> TrainArgs {
        let cli = Cli::try_parse_from(["pipeline", "train"].iter().chain(argv)).unwrap();
        let Command::Train(args) = cli.command else {
            panic!("not train")
        };
        args
    }

    fn given(args: &TrainArgs) -> Vec<&str> {
        let mut names: Vec<&str> = args.given.iter().map(|f| f.name()).collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn train_knows_which_flags_were_given() {
        let args = train(&[
            "--resume",
            "3",
            "--max-steps",
            "180",
            "--lr",
            "0.01",
            "--no-final-elbo",
            "--keep-checkpoints",
            "all",
        ]);
        assert_eq!(
            given(&args),
            [
                "keep-checkpoints",
                "lr",
                "max-steps",
                "no-final-elbo",
                "resume"
            ]
        );
        let opts = args.options();
        assert_eq!(opts.given, args.given);
        assert_eq!(
            (opts.max_steps, opts.keep_checkpoints, opts.final_elbo),
            (Some(180), Retention::All, false)
        );
        // Values filled in by a default are not given; nor is the global --workspace.
        let args = train(&["--dataset", "d", "--workspace", "w"]);
        assert_eq!(given(&args), ["dataset"]);
        assert_eq!(args.options().keep_checkpoints, Retention::DEFAULT);
        assert_eq!(args.options().epochs, TrainOptions::default().epochs);
        assert!(Cli::try_parse_from(["pipeline", "train", "--keep-checkpoints", "-1"]).is_err());
    }

    /// Every default of the command line is the library's: flags left out give
    /// `TrainOptions::default()` field for field.
    #[test]
    fn train_defaults_are_the_library_defaults() {
        let args = train(&["--dataset", "d"]);
        let expected = TrainOptions {
            dataset: Some("d".into()),
            given: [TrainFlag::Dataset].into(),
            ..TrainOptions::default()
        };
        assert_eq!(args.options(), expected);
    }

    /// `--help` lists the train flags in the table's order, but for the rows placed
    /// after another (`listed after`): each flag once.
    #[test]
    fn help_lists_the_train_flags_once_with_the_moved_rows_in_place() {
        let order = TrainFlags::help_order();
        let listed: BTreeSet<TrainFlag> = order.iter().copied().collect();
        assert_eq!(
            (order.len(), listed.len()),
            (TrainFlag::ALL.len(), TrainFlag::ALL.len())
        );
        let at = |flag| order.iter().position(|&f| f == flag).unwrap();
        let q_form = at(TrainFlag::QForm);
        assert_eq!(
            [
                at(TrainFlag::WarmStart),
                at(TrainFlag::NaturalStep),
                at(TrainFlag::PriorVariance),
                at(TrainFlag::Likelihood)
            ],
            [q_form + 1, q_form + 2, q_form + 3, q_form + 4]
        );
        assert_eq!(order.last(), Some(&TrainFlag::StopMetric));
    }

    /// The train flags and [`TrainFlag`] are the same set: every argument of `pipeline
    /// train` has a variant (so it has a resume rule), and every variant an argument.
    #[test]
    fn every_train_argument_is_a_train_flag() {
        let cmd = TrainFlags::augment_args(clap::Command::new("train"));
        let ids: BTreeSet<TrainFlag> = cmd
            .get_arguments()
            .map(|a| TrainFlag::of_arg_id(a.get_id().as_str()).unwrap())
            .collect();
        assert_eq!(ids, TrainFlag::ALL.iter().copied().collect());
        assert_eq!(cmd.get_arguments().count(), TrainFlag::ALL.len());
    }
}
