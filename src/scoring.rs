//! Scoring rows under a trained model: projection onto the training basis, predictive
//! moments, partial selection of each row's best labels. Shared by the predict stage and
//! the trainer's held-out evaluation.

use anyhow::Result;
use faer::Mat;
use ndarray::Array2;
use rayon::prelude::*;

use crate::model::kernel::{BasisInputs, KernelKind};
use crate::model::params::Params;
use crate::model::predictive::{mean_utilities, probit_probability, Predictor};
use crate::projection::{load_basis_t, project_rows};
use crate::store::chunks::CsrChunk;
use crate::store::npy::NpyMap;
use crate::store::predictions::PredictionBlock;
use crate::topk;

/// Scores rows of a split under one model and keeps each row's best labels: projection onto
/// the training basis, predictive moments, partial selection.
pub struct Ranker<'p> {
    /// X̃ᵀ [D×R], contiguous for the sparse × dense projection.
    basis_t: Array2<f32>,
    /// K_X̃ [R×R].
    k_tilde: Mat<f64>,
    kind: KernelKind,
    params: &'p Params,
    /// Present when probabilities are wanted (it factorises K_Z + Σ_p once: P·M³/3).
    predictor: Option<Predictor<'p>>,
}

impl<'p> Ranker<'p> {
    /// `basis` is the svd run's `basis.npy` [R×D] the model was trained with (mapped) and
    /// `k_tilde` its Gram K_X̃ [R×R] ([`crate::projection::basis_gram`]).
    pub fn open(
        basis: &NpyMap,
        k_tilde: Mat<f64>,
        n_features: u64,
        kind: KernelKind,
        params: &'p Params,
        probabilities: bool,
    ) -> Result<Self> {
        let basis_t = load_basis_t(basis, n_features)?;
        let predictor = if probabilities {
            let p = Predictor::new(kind, params, k_tilde.as_ref())?;
            if p.jitter > 0.0 {
                eprintln!(
                    "note: K_Z + Σ needed jitter {:.3e} on the diagonal",
                    p.jitter
                );
            }
            Some(p)
        } else {
            None
        };
        Ok(Ranker {
            basis_t,
            k_tilde,
            kind,
            params,
            predictor,
        })
    }

    /// The top-k labels of every row of `chunk`, in blocks of `block_rows` rows: (first row
    /// of the block within the chunk, the block's predictions). Uses the current rayon pool.
    pub fn rank_chunk(
        &self,
        chunk: &CsrChunk,
        top_k: usize,
        block_rows: usize,
    ) -> Vec<(usize, PredictionBlock)> {
        let r = self.basis_t.ncols();
        let projected = project_rows(chunk, self.basis_t.view());
        (0..chunk.len())
            .step_by(block_rows.max(1))
            .map(|start| {
                let end = (start + block_rows).min(chunk.len());
                let kxx = Mat::from_fn(end - start, r, |i, j| projected[(start + i, j)] as f64);
                let sq: Vec<f64> = chunk.sq_norms[start..end]
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let x = BasisInputs {
                    kxx_b: kxx.as_ref(),
                    sq_norms: &sq,
                    k_tilde: self.k_tilde.as_ref(),
                };
                (
                    start,
                    self.rank_block(&x, &chunk.row_ids[start..end], top_k),
                )
            })
            .collect()
    }

    /// The top-k labels (and probabilities, if wanted) of the rows of `x`.
    fn rank_block(&self, x: &BasisInputs<'_>, row_ids: &[u64], top_k: usize) -> PredictionBlock {
        let (scores, variances) = match &self.predictor {
            Some(p) => {
                let (mean, var) = p.mean_and_variance(x);
                (mean, Some(var))
            }
            None => (mean_utilities(self.kind, self.params, x), None),
        };
        let best: Vec<(Vec<u32>, Vec<f32>)> = (0..row_ids.len())
            .into_par_iter()
            .map(|i| {
                let row: Vec<f64> = scores.row(i).iter().copied().collect();
                topk::top_k(&row, top_k)
            })
            .collect();
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
                            probit_probability(scores[(i, k)], var[(i, k)]) as f32
                        })
                        .collect();
                    block.push_with_probabilities(row_ids[i], labels, s, &probs);
                }
                None => block.push(row_ids[i], labels, s),
            }
        }
        block
    }
}
