//! `--eval-every`: ranking a held-out split during training and recording its metrics.
//! It reads the parameters only, so the trained numbers do not depend on it.

use std::sync::Arc;

use anyhow::{ensure, Result};

use super::setup::Setup;
use crate::metrics::{LabellessRows, Metrics, MetricsAccumulator, PropensityParams};
use crate::model::likelihood::multiclass::ClassLikelihood;
use crate::model::params::Params;
use crate::projection::RowInputs;
use crate::scoring::{model_inputs, Ranker};
use crate::store::catalog::Split;
use crate::store::chunks::read_registered_chunk;
use crate::store::integrity::Registered;
use crate::store::npy::NpyMap;
use crate::store::workspace::Workspace;
use crate::trained::SvdFiles;

/// Metrics at k = 1..HELD_OUT_K during training.
const HELD_OUT_K: usize = 5;

/// What `--eval-every` records for a binary or multi-class run: the share of rows classified right and the
/// mean negative log predictive probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BinaryFigures {
    pub accuracy: f64,
    pub nlp: f64,
}

/// The held-out split `--eval-every` ranks, with the inverse propensities of the labels.
pub struct HeldOut {
    pub every: u64,
    pub split: Split,
    files: Vec<Registered>,
    /// X̃ [R×D], mapped and checked once.
    basis: NpyMap,
    n_features: u64,
    /// Rows densified (the identity basis) rather than projected onto X̃.
    in_features: bool,
    inv_prop: Arc<[f64]>,
}

impl HeldOut {
    pub fn open(ws: &Workspace, setup: &Setup, every: u64, split: Split) -> Result<Self> {
        let dataset = setup.config.dataset_row(ws)?;
        let files = ws
            .split_chunks(&dataset, split)?
            .into_iter()
            .map(|c| c.0)
            .collect();
        let counts = setup.label_counts()?;
        let inv_prop = PropensityParams::GENERIC.inverse_propensity(counts, setup.n_rows);
        Ok(HeldOut {
            every,
            split,
            files,
            basis: NpyMap::open_registered(&SvdFiles::of_run(ws, setup.config.svd_run)?.basis)?,
            n_features: dataset.n_features,
            in_features: setup.config.inducing_inputs.in_features(),
            inv_prop: inv_prop.into(),
        })
    }

    /// A binary run's held-out figures under `params`: accuracy (p(y = 1) > ½ against the
    /// class) and the mean negative log predictive probability −log p(y_i), p by the run's
    /// likelihood and task (`TrainConfig::probability_rule`), in f64. A row with
    /// p(y) = ½ exactly counts as wrong.
    pub fn binary_figures(&self, setup: &Setup, params: &Params) -> Result<BinaryFigures> {
        let (inputs, k_tilde, unweighted) =
            model_inputs(&self.basis, self.n_features, self.in_features, params)?;
        let ranker = Ranker::open(
            inputs,
            k_tilde,
            setup.kind,
            unweighted.as_ref().unwrap_or(params),
            true,
        )?
        .with_probability_rule(setup.config.probability_rule()?);
        let (mut right, mut nlp_sum, mut rows) = (0u64, 0.0, 0u64);
        for file in &self.files {
            let chunk = read_registered_chunk(file)?;
            let moments = ranker.label_moments(&chunk, 0, 1024)?;
            for (r, &(mean, var)) in moments.iter().enumerate() {
                let positive = chunk.label_offsets[r + 1] > chunk.label_offsets[r];
                // p(y) = rule(y f̄, v): every rule is symmetric (1 − E[σ(f)] = E[σ(−f)],
                // 1 − Φ(t) = Φ(−t)), and this keeps p(y = −1) accurate where p(y = 1) ≈ 1.
                let y = if positive { 1.0 } else { -1.0 };
                let p = ranker.probability_rule().probability(y * mean, var);
                right += u64::from(p > 0.5);
                nlp_sum -= p.ln();
                rows += 1;
            }
        }
        let n = rows.max(1) as f64;
        Ok(BinaryFigures {
            accuracy: right as f64 / n,
            nlp: nlp_sum / n,
        })
    }

    /// A multi-class run's held-out figures under `params`: accuracy (the class of highest
    /// predictive probability against the row's class; ties go to the lower class id) and
    /// the mean negative log predictive probability −log p(c_i | x_i), the probabilities by
    /// the run's class likelihood (`class_phase::class_probabilities`). A row of the split
    /// without exactly one label is an error naming it.
    pub fn multiclass_figures(
        &self,
        setup: &Setup,
        params: &Params,
        lik: &dyn ClassLikelihood,
    ) -> Result<BinaryFigures> {
        let (inputs, k_tilde, unweighted) =
            model_inputs(&self.basis, self.n_features, self.in_features, params)?;
        let ranker = Ranker::open(
            inputs,
            k_tilde,
            setup.kind,
            unweighted.as_ref().unwrap_or(params),
            true,
        )?;
        let seed = setup.config.predictive_seed();
        let (mut right, mut nlp_sum, mut rows) = (0u64, 0.0, 0u64);
        for file in &self.files {
            let chunk = read_registered_chunk(file)?;
            for (start, probs) in ranker.class_probabilities(&chunk, lik, seed, 1024)? {
                for i in 0..probs.nrows() {
                    let r = start + i;
                    let truth = &chunk.labels
                        [chunk.label_offsets[r] as usize..chunk.label_offsets[r + 1] as usize];
                    ensure!(
                        truth.len() == 1,
                        "'{}' row {}: {} labels, a multi-class row has exactly one",
                        self.split,
                        chunk.row_ids[r],
                        truth.len()
                    );
                    let row: Vec<f64> = probs.row(i).iter().copied().collect();
                    let best = (0..row.len()).fold(0, |b, k| if row[k] > row[b] { k } else { b });
                    right += u64::from(best == truth[0] as usize);
                    nlp_sum -= row[truth[0] as usize].ln();
                    rows += 1;
                }
            }
        }
        let n = rows.max(1) as f64;
        Ok(BinaryFigures {
            accuracy: right as f64 / n,
            nlp: nlp_sum / n,
        })
    }

    /// Ranks every held-out row under `params` and returns the metrics.
    pub fn ranking_metrics(&self, setup: &Setup, params: &Params) -> Result<Metrics> {
        if params.kernel.log_features.is_empty() {
            let inputs = RowInputs::open(&self.basis, self.n_features, self.in_features)?;
            let ranker = Ranker::open(inputs, setup.k_tilde.clone(), setup.kind, params, false)?;
            return self.rank_all(ranker);
        }
        // ARD over the features: the weighted view, K'_X̃ of these weights, and the
        // parameters without them.
        let (inputs, k_tilde, unweighted) =
            model_inputs(&self.basis, self.n_features, self.in_features, params)?;
        let unweighted = unweighted.expect("feature weights are taken out");
        self.rank_all(Ranker::open(
            inputs,
            k_tilde,
            setup.kind,
            &unweighted,
            false,
        )?)
    }

    /// Ranks every held-out row with `ranker` and returns the metrics.
    fn rank_all(&self, ranker: Ranker<'_>) -> Result<Metrics> {
        let mut acc =
            MetricsAccumulator::new(HELD_OUT_K, self.inv_prop.clone(), LabellessRows::default())?;
        for file in &self.files {
            let chunk = read_registered_chunk(file)?;
            for (start, block) in ranker.rank_chunk(&chunk, HELD_OUT_K, 1024)? {
                for i in 0..block.len() {
                    let r = start + i;
                    let truth = &chunk.labels
                        [chunk.label_offsets[r] as usize..chunk.label_offsets[r + 1] as usize];
                    acc.add_row(block.labels(i), truth)?;
                }
            }
        }
        Ok(acc.finish())
    }
}
