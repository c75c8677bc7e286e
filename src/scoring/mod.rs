//! Scoring rows under a trained model: projection onto the training basis, predictive
//! moments, partial selection of each row's best labels. Shared by the predict stage and
//! the trainer's held-out evaluation; [`ranking`] is the one way every prediction path
//! ranks rows under a loaded model.

pub mod ranking;

use anyhow::{ensure, Context, Result};
use faer::Mat;

use crate::model::bound::class_phase::class_probabilities;
use crate::model::kernel::feature_ard::FeatureRows;
use crate::model::kernel::{BasisInputs, Gram, KernelKind, Rows};
use crate::model::likelihood::multiclass::ClassLikelihood;
use crate::model::params::Params;
use crate::model::predictive::{MeanUtilities, Predictor, ProbabilityRule};
use crate::projection::{basis_gram, weighted_basis_gram, ChunkInputs, RowInputs};
use crate::store::chunks::CsrChunk;
use crate::store::npy::NpyMap;
use crate::store::predictions::PredictionBlock;
use crate::topk;

/// How a trained model sees a split's rows (`in_features`: the identity basis), its
/// K_X̃ [R×R], and, with ARD over the features, the parameters without their weights: the
/// rows are then projected onto the weighted basis X̃W with norms Σ_d w_d x_id² and
/// K'_X̃ = X̃WX̃ᵀ, and the model without the weights at those inputs is the model with them
/// (`docs/model.md`, "ARD over the D features"). `basis` is the svd run's `basis.npy`.
pub fn model_inputs(
    basis: &NpyMap,
    n_features: u64,
    in_features: bool,
    params: &Params,
) -> Result<(RowInputs, Gram, Option<Params>)> {
    let log_w = &params.kernel.log_features;
    if log_w.is_empty() {
        let inputs = RowInputs::open(basis, n_features, in_features)?;
        let k_tilde = gram_of(&inputs, basis)?;
        return Ok((inputs, k_tilde, None));
    }
    let inputs =
        RowInputs::open_weighted(basis, n_features, log_w.iter().map(|l| l.exp()).collect())?;
    let k_tilde = gram_of(&inputs, basis)?;
    Ok((inputs, k_tilde, Some(params.without_feature_weights())))
}

/// The Gram K_X̃ of a view: `basis_gram` of `basis` (the file the view was opened from),
/// I_D (a marker, never materialised), or the weighted Gram X̃WX̃ᵀ.
fn gram_of(inputs: &RowInputs, basis: &NpyMap) -> Result<Gram> {
    Ok(match inputs {
        RowInputs::Basis { .. } => Gram::Dense(basis_gram(basis)?),
        RowInputs::Features { n_features } => Gram::Identity(*n_features),
        RowInputs::Weighted { weights, .. } => Gram::Dense(weighted_basis_gram(basis, weights)?),
    })
}

/// A block of a chunk's rows in a model's view, owned: their basis coordinates in f64, or
/// their sparse features (each id checked against D).
#[derive(Debug, Clone, PartialEq)]
enum BlockRows {
    Dense(Mat<f64>),
    Sparse { rows: FeatureRows, width: usize },
}

impl BlockRows {
    /// Rows `start..end` of `chunk`.
    fn of(chunk: &ChunkInputs<'_>, start: usize, end: usize) -> Result<Self> {
        match chunk {
            ChunkInputs::Projected(projected) => Ok(BlockRows::Dense(Mat::from_fn(
                end - start,
                projected.ncols(),
                |i, j| projected[(start + i, j)] as f64,
            ))),
            ChunkInputs::Sparse { chunk, n_features } => {
                let mut rows = FeatureRows::new();
                for i in start..end {
                    let row = chunk.row(i);
                    rows.push_checked(row.row_id, row.indices, row.values, *n_features)?;
                }
                Ok(BlockRows::Sparse {
                    rows,
                    width: *n_features,
                })
            }
        }
    }

    /// The rows as the kernel reads them.
    fn rows(&self) -> Rows<'_> {
        match self {
            BlockRows::Dense(m) => Rows::Dense(m.as_ref()),
            BlockRows::Sparse { rows, width } => Rows::Sparse {
                rows,
                width: *width,
            },
        }
    }
}

/// Scores rows of a split under one model and keeps each row's best labels: projection onto
/// the training basis, predictive moments, partial selection.
pub struct Ranker<'p> {
    /// How the model sees a row (basis coordinates, or dense features).
    inputs: RowInputs,
    /// K_X̃ [R×R] (the identity's marker for inducing inputs in input space).
    k_tilde: Gram,
    /// Present when probabilities are wanted (it factorises q(u) once: P·M³/3).
    predictor: Option<Predictor<'p>>,
    /// The means alone, when no probabilities are wanted (weights computed once).
    means: Option<MeanUtilities<'p>>,
    /// How probabilities are computed from the predictive moments.
    rule: ProbabilityRule,
    /// Labels (or classes) a row is scored on: K of the scores' [rows×K] blocks.
    labels: usize,
}

/// Scores a block of rows holds at most, per matrix of its scores (means, variances):
/// 3 Mi f64, 24 MiB. Asked-for blocks of 1 024 rows at 50 000 labels were 410 MB a
/// matrix, each on fresh pages the kernel zeroed (a third of a prediction's time); blocks
/// under the training loop's allocator threshold (`crate::alloc`) reuse the same memory.
/// Up to 3 072 labels the default 1 024 rows are within it.
const BLOCK_SCORES: usize = 3 << 20;

/// The rows a block is scored in: `asked`, or fewer, so that its [rows×`labels`] scores
/// stay within [`BLOCK_SCORES`]; at least one. A row's scores do not depend on the rows
/// scored beside it.
fn rows_per_block(asked: usize, labels: usize) -> usize {
    asked.min(BLOCK_SCORES / labels.max(1)).max(1)
}

impl<'p> Ranker<'p> {
    /// `inputs` and `k_tilde` [R×R] are the rows' view the model was trained with and its
    /// Gram K_X̃ ([`RowInputs::open`]).
    pub fn open(
        inputs: RowInputs,
        k_tilde: Gram,
        kind: KernelKind,
        params: &'p Params,
        probabilities: bool,
    ) -> Result<Self> {
        Self::open_for(
            inputs,
            k_tilde,
            kind,
            params,
            (!probabilities, probabilities),
        )
    }

    /// [`Ranker::open`] for both kinds of request, as a server takes them: ranked by the
    /// means alone ([`MeanUtilities`], the bits `open(…, false)` ranks with) or with the
    /// predictive moments and probabilities ([`Predictor`], those of `open(…, true)`).
    pub fn open_both(
        inputs: RowInputs,
        k_tilde: Gram,
        kind: KernelKind,
        params: &'p Params,
    ) -> Result<Self> {
        Self::open_for(inputs, k_tilde, kind, params, (true, true))
    }

    fn open_for(
        inputs: RowInputs,
        k_tilde: Gram,
        kind: KernelKind,
        params: &'p Params,
        (with_means, probabilities): (bool, bool),
    ) -> Result<Self> {
        let means = match with_means {
            false => None,
            true => Some(MeanUtilities::new(kind, params, &k_tilde)?),
        };
        let predictor = if probabilities {
            let p = Predictor::new(kind, params, &k_tilde)?;
            if p.jitter > 0.0 {
                crate::progress::note(format!(
                    "note: {} needed jitter {:.3e} on the diagonal",
                    params.q_form().factorised(),
                    p.jitter
                ));
            }
            Some(p)
        } else {
            None
        };
        Ok(Ranker {
            inputs,
            k_tilde,
            predictor,
            means,
            rule: ProbabilityRule::LogisticProbitApproximation,
            labels: params.phi.nrows(),
        })
    }

    /// The same ranker writing probabilities by `rule` (by default the probit approximation
    /// of E[σ(f)], [`ProbabilityRule::LogisticProbitApproximation`]).
    pub fn with_probability_rule(self, rule: ProbabilityRule) -> Self {
        Ranker { rule, ..self }
    }

    /// The top-k labels of every row of `chunk`, in blocks of `block_rows` rows: (first row
    /// of the block within the chunk, the block's predictions). Uses the current rayon pool.
    pub fn rank_chunk(
        &self,
        chunk: &CsrChunk,
        top_k: usize,
        block_rows: usize,
    ) -> Result<Vec<(usize, PredictionBlock)>> {
        let probabilities = self.predictor.is_some();
        self.rank_chunk_as(chunk, (top_k, block_rows), probabilities)
    }

    /// [`Ranker::rank_chunk`] with the probabilities column or without, as asked: with
    /// them, by the predictive moments (a ranker opened with probabilities); without, by
    /// the means alone when the ranker has them ([`Ranker::open_both`]), so each gives the
    /// bits of a ranker opened for it alone.
    pub fn rank_chunk_as(
        &self,
        chunk: &CsrChunk,
        (top_k, block_rows): (usize, usize),
        probabilities: bool,
    ) -> Result<Vec<(usize, PredictionBlock)>> {
        ensure!(
            !probabilities || self.predictor.is_some(),
            "internal: probabilities of a ranker opened without them"
        );
        self.per_block(chunk, block_rows, |x, start, end| {
            self.rank_block(x, &chunk.row_ids[start..end], top_k, probabilities)
        })
    }

    /// `f(inputs, start, end)` for each block [start, end) of `block_rows` rows of `chunk`,
    /// with the block's K_XX̃ rows and squared norms: (start, result) per block, in order.
    fn per_block<T>(
        &self,
        chunk: &CsrChunk,
        block_rows: usize,
        f: impl Fn(&BasisInputs<'_>, usize, usize) -> Result<T>,
    ) -> Result<Vec<(usize, T)>> {
        let rows = self.inputs.of_chunk(chunk);
        let block_rows = rows_per_block(block_rows, self.labels);
        (0..chunk.len())
            .step_by(block_rows)
            .map(|start| {
                let end = (start + block_rows).min(chunk.len());
                let block = BlockRows::of(&rows, start, end)?;
                let sq = self.inputs.sq_norms(chunk, start, end);
                let x = BasisInputs {
                    kxx_b: block.rows(),
                    sq_norms: &sq,
                    k_tilde: self.k_tilde.as_ref(),
                };
                Ok((start, f(&x, start, end)?))
            })
            .collect()
    }

    /// The rule the ranker turns predictive moments into probabilities with.
    pub fn probability_rule(&self) -> &ProbabilityRule {
        &self.rule
    }

    /// The predictive moments (f̄, v) of `label` at every row of `chunk`; needs a ranker
    /// opened with probabilities. Uses the current rayon pool.
    pub fn label_moments(
        &self,
        chunk: &CsrChunk,
        label: usize,
        block_rows: usize,
    ) -> Result<Vec<(f64, f64)>> {
        let predictor = self
            .predictor
            .as_ref()
            .context("internal: probabilities of a ranker opened without them")?;
        let blocks = self.per_block(chunk, block_rows, |x, start, end| {
            let (mean, var) = predictor.mean_and_variance(x);
            Ok((0..end - start)
                .map(|i| (mean[(i, label)], var[(i, label)]))
                .collect::<Vec<_>>())
        })?;
        Ok(blocks
            .into_iter()
            .flat_map(|(_, moments)| moments)
            .collect())
    }

    /// p(y = 1) of `label` at every row of `chunk` by the ranker's rule, in f64: the values
    /// [`Ranker::rank_chunk`] writes (as f32) into the probabilities column for the same
    /// rows. Needs a ranker opened with probabilities; `pipeline report` evaluates a binary
    /// run over a grid of points with it.
    pub fn label_probabilities(
        &self,
        chunk: &CsrChunk,
        label: usize,
        block_rows: usize,
    ) -> Result<Vec<f64>> {
        let moments = self.label_moments(chunk, label, block_rows)?;
        Ok(moments
            .into_iter()
            .map(|(mean, var)| self.rule.probability(mean, var))
            .collect())
    }

    /// The predictive class probabilities [rows×K] of every row of `chunk` under a
    /// multi-class likelihood, in blocks of `block_rows` rows: (first row of the block within
    /// the chunk, its probabilities). Row r's Monte Carlo noise (sampling likelihoods) is
    /// drawn from `seed` and the stream of its row id, so it does not depend on the blocks
    /// nor on the other rows of the chunk (a served batch holds several requests' rows,
    /// each numbered from 0 within its request).
    /// Needs a ranker opened with probabilities; uses the current rayon pool.
    pub fn class_probabilities(
        &self,
        chunk: &CsrChunk,
        lik: &dyn ClassLikelihood,
        seed: u64,
        block_rows: usize,
    ) -> Result<Vec<(usize, Mat<f64>)>> {
        let predictor = self
            .predictor
            .as_ref()
            .context("internal: class probabilities of a ranker opened without them")?;
        self.per_block(chunk, block_rows, |x, start, end| {
            let (m, s) = predictor.marginals(x);
            let streams = &chunk.row_ids[start..end];
            let probs = class_probabilities(
                lik,
                predictor.params(),
                m.as_ref(),
                s.as_ref(),
                seed,
                streams,
            );
            Ok(probs)
        })
    }

    /// The top-k classes of every row of `chunk` by their predictive probabilities under a
    /// multi-class likelihood (`(top_k, block_rows)`): the scores written are those
    /// probabilities (as f32), and with `probabilities` the same values fill the
    /// probabilities column. Every block carries each row's probability of its true class
    /// ([`true_class_probabilities`]), whatever k, so that its NLP never depends on it.
    /// Ties go to the lower class id (`topk::top_k`).
    pub fn rank_chunk_classes(
        &self,
        chunk: &CsrChunk,
        lik: &dyn ClassLikelihood,
        seed: u64,
        (top_k, block_rows): (usize, usize),
        probabilities: bool,
    ) -> Result<Vec<(usize, PredictionBlock)>> {
        let blocks = self.class_probabilities(chunk, lik, seed, block_rows)?;
        Ok(blocks
            .into_iter()
            .map(|(start, probs)| {
                let best = best_of_rows(&probs, top_k);
                let mut block = match probabilities {
                    true => PredictionBlock::with_probabilities(),
                    false => PredictionBlock::new(),
                };
                for (i, (labels, scores)) in best.iter().enumerate() {
                    let id = chunk.row_ids[start + i];
                    match probabilities {
                        true => block.push_with_probabilities(id, labels, scores, scores),
                        false => block.push(id, labels, scores),
                    }
                }
                block.true_class = Some(true_class_probabilities(chunk, start, &probs));
                (start, block)
            })
            .collect())
    }

    /// The top-k labels (and probabilities, if wanted) of the rows of `x`.
    fn rank_block(
        &self,
        x: &BasisInputs<'_>,
        row_ids: &[u64],
        top_k: usize,
        probabilities: bool,
    ) -> Result<PredictionBlock> {
        let (scores, variances) = match (&self.predictor, &self.means) {
            (Some(p), _) if probabilities => {
                let (mean, var) = p.mean_and_variance(x);
                (mean, Some(var))
            }
            (_, Some(means)) => (means.at(x), None),
            (Some(p), None) => (p.mean_and_variance(x).0, None),
            (None, None) => unreachable!("a ranker is opened with means or moments"),
        };
        let best = best_of_rows(&scores, top_k);
        let mut block = match variances {
            Some(_) => PredictionBlock::with_probabilities(),
            None => PredictionBlock::new(),
        };
        for (i, (labels, s)) in best.iter().enumerate() {
            match &variances {
                Some(var) => {
                    let probs: Vec<f32> = labels
                        .iter()
                        .map(|&k| {
                            let k = k as usize;
                            self.rule.probability(scores[(i, k)], var[(i, k)]) as f32
                        })
                        .collect();
                    block.push_with_probabilities(row_ids[i], labels, s, &probs);
                }
                None => block.push(row_ids[i], labels, s),
            }
        }
        Ok(block)
    }
}

/// The `top_k` best columns of each row of `scores` [B×K] with their values, in parallel
/// over blocks of rows (`topk::top_k_of_rows`: ties to the lower id).
fn best_of_rows(scores: &Mat<f64>, top_k: usize) -> Vec<(Vec<u32>, Vec<f32>)> {
    topk::top_k_of_rows(scores.as_ref(), top_k)
}

/// p(c_r | x_r) of the true class c_r of each row r = `start` + i of `chunk`, read from the
/// block's class probabilities `probs` [rows×K] (row i) and cast to f32 like the scores, so
/// a listed true class has the same value in both; None for a row without exactly one
/// class < K (a class the training rows lack, stored without one, or a malformed row that
/// evaluate refuses, naming it).
fn true_class_probabilities(chunk: &CsrChunk, start: usize, probs: &Mat<f64>) -> Vec<Option<f32>> {
    (0..probs.nrows())
        .map(|i| {
            let r = start + i;
            let truth =
                &chunk.labels[chunk.label_offsets[r] as usize..chunk.label_offsets[r + 1] as usize];
            match truth {
                &[c] if (c as usize) < probs.ncols() => Some(probs[(i, c as usize)] as f32),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::chunks::RowRef;

    /// Blocks of the asked rows while their scores fit [`BLOCK_SCORES`], fewer beyond.
    #[test]
    fn blocks_hold_a_bounded_number_of_scores() {
        assert_eq!(rows_per_block(1024, 983), 1024);
        assert_eq!(rows_per_block(1024, 3072), 1024);
        assert_eq!(rows_per_block(1024, 50_000), 62);
        assert_eq!(rows_per_block(1024, 0), 1024);
        assert_eq!(rows_per_block(7, 1), 7);
        assert_eq!(rows_per_block(1024, usize::MAX), 1);
        assert_eq!(rows_per_block(0, 10), 1);
    }

    #[test]
    fn a_block_is_the_rows_projected_or_kept_sparse() {
        let mut chunk = CsrChunk::default();
        for (id, indices, values) in [(0, &[0u32, 2][..], &[1.0f32, 2.0][..]), (1, &[1], &[-3.0])] {
            chunk.push_row(RowRef {
                row_id: id,
                labels: &[],
                indices,
                values,
                sq_norm: values.iter().map(|v| v * v).sum(),
            });
        }
        let sparse = RowInputs::Features { n_features: 3 }.of_chunk(&chunk);
        let block = BlockRows::of(&sparse, 0, 2).unwrap();
        assert_eq!(
            block.rows().to_dense(),
            Mat::from_fn(2, 3, |i, j| [[1.0, 0.0, 2.0], [0.0, -3.0, 0.0]][i][j])
        );
        // A feature id outside the dataset's features is refused, naming the row.
        let narrow = RowInputs::Features { n_features: 2 }.of_chunk(&chunk);
        let err = BlockRows::of(&narrow, 0, 2).unwrap_err().to_string();
        assert_eq!(err, "row 0: feature 2 is outside the dataset's 2 features");
        // Basis X̃ [2×3] = rows (1, 1, 0) and (0, 0, 1): X X̃ᵀ.
        let basis_t = ndarray::array![[1.0f32, 0.0], [1.0, 0.0], [0.0, 1.0]];
        let projected = RowInputs::Basis { basis_t }.of_chunk(&chunk);
        assert_eq!(
            BlockRows::of(&projected, 1, 2).unwrap(),
            BlockRows::Dense(Mat::from_fn(1, 2, |_, j| [-3.0, 0.0][j]))
        );
    }
}
