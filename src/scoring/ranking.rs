//! Ranking rows under one trained model, whichever way the model was loaded (a run of the
//! workspace, or a model file) and wherever the rows come from (a split's chunks, a file
//! of new rows, a request): `predict --split`, `predict --input` and `serve` all rank
//! through [`with_ranking`], so a row gets the same bits on every path.

use anyhow::{Context, Result};

use super::{model_inputs, Ranker};
use crate::model::likelihood::multiclass::ClassLikelihood;
use crate::model::params::Params;
use crate::store::chunks::CsrChunk;
use crate::store::npy::NpyMap;
use crate::store::predictions::PredictionBlock;
use crate::trained::{Task, TrainConfig};

/// Labels a multi-label prediction keeps per row when `--top-k` is not given (and a
/// multi-class one with more than [`EVERY_CLASS_UP_TO`] classes).
pub const DEFAULT_TOP_K: usize = 5;

/// A multi-class run with at most this many classes lists every class of every row when
/// `--top-k` is not given. Its NLP needs no listing (the file holds each row's probability
/// of its true class whatever k), so the bound is one of size: a listed class costs 8 bytes
/// per row (its id and probability; 12 with `--probabilities`) in the file and in the
/// whole-file read of `evaluate`, so N rows of K ≤ 20 classes cost at most 4× the default
/// top-5 (about 260 against 80 bytes a row with probabilities, 260 MB per million rows).
pub const EVERY_CLASS_UP_TO: u64 = 4 * DEFAULT_TOP_K as u64;

/// `--top-k` when it is not given, for a run of `task` on `n_labels` labels (L, or K
/// classes): 1 for a binary run (its one label), every class of a multi-class run with
/// K ≤ [`EVERY_CLASS_UP_TO`], and [`DEFAULT_TOP_K`] otherwise, or every label when there
/// are fewer (a default must hold for data with four labels as for data with a thousand).
pub fn default_top_k(task: Task, n_labels: u64) -> usize {
    match task {
        Task::Binary => 1,
        Task::Multiclass if n_labels <= EVERY_CLASS_UP_TO => n_labels as usize,
        Task::Multiclass | Task::Multilabel => {
            DEFAULT_TOP_K.min(usize::try_from(n_labels).unwrap_or(usize::MAX).max(1))
        }
    }
}

/// The top-k a prediction with a run of `task` on `n_labels` labels keeps: the one label
/// of a binary run whatever was asked (L = 1), otherwise `--top-k` when given, else
/// [`default_top_k`].
pub fn resolved_top_k(task: Task, n_labels: u64, given: Option<usize>) -> usize {
    match (task, given) {
        (Task::Binary, _) | (_, None) => default_top_k(task, n_labels),
        (_, Some(k)) => k,
    }
}

/// [`resolved_top_k`], refused when it exceeds the `n_labels` labels (L, or K classes).
pub fn checked_top_k(task: Task, n_labels: u64, given: Option<usize>) -> Result<usize> {
    let top_k = resolved_top_k(task, n_labels, given);
    anyhow::ensure!(
        top_k as u64 <= n_labels,
        "--top-k {top_k} exceeds the {n_labels} labels"
    );
    Ok(top_k)
}

/// What ranking rows under a checkpoint needs of its training run.
pub struct Model<'a> {
    pub config: &'a TrainConfig,
    /// D of the run's dataset.
    pub n_features: u64,
    /// The checkpoint's parameters.
    pub params: &'a Params,
    /// X̃ [R×D] (the svd run's basis.npy, or a model file's; 0×D when the model never
    /// reads it).
    pub basis: &'a NpyMap,
}

/// How rows are ranked under one checkpoint: the [`Ranker`] opened with the run's view of
/// the rows and probability rule, and for a multi-class run its likelihood. `predict
/// --split` and `predict --input` both rank through it, so a new row is scored exactly as
/// the same row in a split is.
pub struct Ranking<'p> {
    ranker: Ranker<'p>,
    /// Multi-class runs: the classes are ranked by their predictive probabilities.
    class_lik: Option<Box<dyn ClassLikelihood>>,
    /// The Monte Carlo seed of the class probabilities (sampling likelihoods).
    seed: u64,
    top_k: usize,
    /// Rows scored together at most (memory: rows × labels f64 scores; fewer with many
    /// labels, `scoring::BLOCK_SCORES`).
    block_rows: usize,
    probabilities: bool,
}

impl Ranking<'_> {
    /// The predictions of `chunk`'s rows, one block per `block_rows` rows, in row order,
    /// with the top-k and probabilities it was opened with. The chunk's row ids seed each
    /// row's Monte Carlo noise (sampling likelihoods).
    pub fn rank(&self, chunk: &CsrChunk) -> Result<Vec<PredictionBlock>> {
        self.rank_as(chunk, self.top_k, self.probabilities)
    }

    /// [`Ranking::rank`] keeping `top_k` labels, with or without probabilities: what one
    /// served request asks for. A ranking opened for one kind of request only
    /// ([`with_ranking`]) refuses probabilities it was opened without.
    pub fn rank_as(
        &self,
        chunk: &CsrChunk,
        top_k: usize,
        probabilities: bool,
    ) -> Result<Vec<PredictionBlock>> {
        let blocks = match &self.class_lik {
            None => self
                .ranker
                .rank_chunk_as(chunk, (top_k, self.block_rows), probabilities),
            Some(lik) => self.ranker.rank_chunk_classes(
                chunk,
                &**lik,
                self.seed,
                (top_k, self.block_rows),
                probabilities,
            ),
        }?;
        Ok(blocks.into_iter().map(|(_, block)| block).collect())
    }
}

/// Opens the [`Ranking`] of `model` keeping `(top_k, block_rows, probabilities)` and calls
/// `f` with it (the ranker borrows parameters made here: ARD over the features ranks with
/// the weights folded into the basis). `what` names the rows for a failure to open it.
pub fn with_ranking<T>(
    model: &Model<'_>,
    (top_k, block_rows, probabilities): (usize, usize, bool),
    what: &dyn Fn() -> String,
    f: impl FnOnce(&Ranking<'_>) -> Result<T>,
) -> Result<T> {
    let opens = Opens::For(probabilities);
    open_ranking(model, (top_k, block_rows, probabilities), opens, what, f)
}

/// [`with_ranking`] for requests of either kind ([`Ranking::rank_as`]): with
/// probabilities or without, each ranked with the bits a ranking opened for it alone
/// gives. Its own top-k and probabilities are `top_k` and none.
pub fn with_serving_ranking<T>(
    model: &Model<'_>,
    (top_k, block_rows): (usize, usize),
    what: &dyn Fn() -> String,
    f: impl FnOnce(&Ranking<'_>) -> Result<T>,
) -> Result<T> {
    open_ranking(model, (top_k, block_rows, false), Opens::Both, what, f)
}

/// What a ranker is opened for: requests with probabilities or without, or both.
#[derive(Clone, Copy)]
enum Opens {
    For(bool),
    Both,
}

fn open_ranking<T>(
    model: &Model<'_>,
    (top_k, block_rows, probabilities): (usize, usize, bool),
    opens: Opens,
    what: &dyn Fn() -> String,
    f: impl FnOnce(&Ranking<'_>) -> Result<T>,
) -> Result<T> {
    let config = model.config;
    let (inputs, k_tilde, unweighted) = model_inputs(
        model.basis,
        model.n_features,
        config.inducing_inputs.in_features(),
        model.params,
    )?;
    let class_lik = match config.task {
        Task::Multiclass => Some(config.class_likelihood()?),
        _ => None,
    };
    let (kind, params) = (
        config.kernel.kind(),
        unweighted.as_ref().unwrap_or(model.params),
    );
    // Classes are always ranked by their predictive probabilities.
    let ranker = match (opens, class_lik.is_some()) {
        (Opens::Both, false) => Ranker::open_both(inputs, k_tilde, kind, params),
        (Opens::Both, true) => Ranker::open(inputs, k_tilde, kind, params, true),
        (Opens::For(p), classes) => Ranker::open(inputs, k_tilde, kind, params, p || classes),
    }
    .with_context(what)?;
    let ranker = match class_lik {
        Some(_) => ranker,
        None => ranker.with_probability_rule(config.probability_rule()?),
    };
    f(&Ranking {
        ranker,
        class_lik,
        seed: config.predictive_seed(),
        top_k,
        block_rows,
        probabilities,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default top-k: every class of a multi-class run up to K = 20, then 5, as for a
    /// multi-label run of L ≥ 5 (every label below); a binary run's one label whatever is asked; a given
    /// `--top-k` otherwise as given, even below K.
    #[test]
    fn every_class_is_kept_by_default_up_to_twenty_classes() {
        assert_eq!(EVERY_CLASS_UP_TO, 20);
        for (k, want) in [(2, 2), (6, 6), (10, 10), (20, 20), (21, 5), (355, 5)] {
            assert_eq!(default_top_k(Task::Multiclass, k), want, "K = {k}");
            assert_eq!(resolved_top_k(Task::Multiclass, k, None), want, "K = {k}");
        }
        for l in [5, 10, 983] {
            assert_eq!(default_top_k(Task::Multilabel, l), DEFAULT_TOP_K, "L = {l}");
        }
        // Fewer labels than the default: every label, which checked_top_k accepts.
        for l in [1, 3, 4] {
            assert_eq!(default_top_k(Task::Multilabel, l), l as usize, "L = {l}");
            assert!(checked_top_k(Task::Multilabel, l, None).is_ok(), "L = {l}");
        }
        assert!(checked_top_k(Task::Multilabel, 4, Some(5)).is_err());
        assert_eq!(resolved_top_k(Task::Multiclass, 10, Some(3)), 3);
        assert_eq!(resolved_top_k(Task::Multilabel, 983, Some(7)), 7);
        for given in [None, Some(1), Some(5)] {
            assert_eq!(resolved_top_k(Task::Binary, 1, given), 1, "{given:?}");
        }
    }
}
