//! The exact full-data bound: every training row, every label (weight 1), minus Σ_p KL_p;
//! of a multi-class run, every row's class term (weight 1) minus Σ_p KL_p.
//! Computed at the end of a run and by `pipeline elbo` for any checkpoint.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Result};

use super::batches::{Order, Prefetcher, Span};
use super::classes::{class_ids, noise_seed, EXACT_BOUND_STEP};
use super::setup::{thread_pool, Setup};
use crate::metrics::names::Figure;
use crate::model::bound::objective::{expected_loglik, kl_total};
use crate::model::bound::terms::TermSet;
use crate::model::kernel::feature_ard::{weighted_gram, FeatureInputs, FeatureWarp};
use crate::model::kernel::BasisInputs;
use crate::model::likelihood::multiclass::Classes;
use crate::model::params::Params;
use crate::model::scratch::Scratch;
use crate::store::catalog::{MetricRow, Split};
use crate::store::workspace::Workspace;
use crate::trained::load_run_checkpoint;

/// Streams the rows in file order through the prefetch queue; each batch costs only the
/// forward pass, and the KL is computed once.
pub fn exact_bound(
    setup: &Setup,
    params: &Params,
    prefetch: usize,
    scratch: &Scratch,
) -> Result<f64> {
    let planner = Arc::new(setup.planner(Order::Sequential));
    let mut queue = Prefetcher::spawn(
        setup.source.clone(),
        planner,
        Span {
            epoch: 0,
            skip: 0,
            end_epoch: 1,
            max_batches: u64::MAX,
        },
        prefetch,
    );
    // ARD over the features: the model without the weights at the weighted inputs.
    let weighted = setup.feature_basis.as_ref().map(|basis| {
        let log_w = &params.kernel.log_features;
        (
            params.without_feature_weights(),
            basis,
            weighted_gram(log_w, basis.as_ref()),
        )
    });
    // The exact bound sums every negative class, whatever `--class-samples` the steps use.
    let bound_lik = match &setup.class_lik {
        Some(_) => Some(setup.config.bound_likelihood()?),
        None => None,
    };
    let mut expected = 0.0;
    while let Some(batch) = queue.next_batch() {
        let batch = batch?;
        let class_ids = match &bound_lik {
            Some(_) => class_ids(&batch.positives, &batch.rows)?,
            None => Vec::new(),
        };
        let terms = match &bound_lik {
            // A sampling likelihood's noise: one seed for the whole bound, row i of each
            // minibatch its stream i (the batches of the sequential order are fixed).
            Some(lik) => TermSet::Classes(Classes {
                class: &class_ids,
                scale: 1.0,
                lik: &**lik,
                seed: noise_seed(setup.config.seed, EXACT_BOUND_STEP),
                first_stream: 0,
            }),
            None => TermSet::AllLabels {
                positives: &batch.positives,
                scale: 1.0,
            },
        };
        expected += match (&weighted, &batch.features) {
            (Some((plain, basis, _)), Some(rows)) => {
                let fx = FeatureInputs {
                    rows,
                    basis: basis.as_ref(),
                };
                fx.check(&params.kernel.log_features)?;
                let warp = FeatureWarp::new(&params.kernel.log_features, &fx);
                let x = warp.inputs();
                expected_loglik(setup.kind, plain, &x, &terms, &*setup.lik, scratch)?
            }
            _ => {
                let x = BasisInputs {
                    kxx_b: setup.source.rows_of(&batch),
                    sq_norms: &batch.sq_norms,
                    k_tilde: setup.k_tilde.as_ref(),
                };
                expected_loglik(setup.kind, params, &x, &terms, &*setup.lik, scratch)?
            }
        };
    }
    let kl = match &weighted {
        Some((plain, _, gram)) => kl_total(setup.kind, plain, gram.as_ref(), scratch)?,
        None => kl_total(setup.kind, params, setup.k_tilde.as_ref(), scratch)?,
    };
    Ok(expected - kl)
}

/// Minibatches `pipeline elbo` queues ahead.
const EXACT_PREFETCH: usize = 4;

/// What `pipeline elbo` computes.
#[derive(Debug, Clone, PartialEq)]
pub struct ElboOptions {
    /// Training run.
    pub run: i64,
    /// Checkpoint step (None: the run's last checkpoint).
    pub checkpoint: Option<u64>,
    /// Split whose bound is computed (only the training split has K_XX̃ factors).
    pub split: Split,
    /// Worker threads (None: the run's own count).
    pub threads: Option<usize>,
}

/// Runs `pipeline elbo`: the exact full-data bound of a checkpoint, recorded as a metric of
/// the training run.
pub fn elbo(ws: &Workspace, opts: &ElboOptions) -> Result<f64> {
    ensure!(
        opts.split == Split::Train,
        "--split {}: only the training split has K_XX̃ factors (the bound is defined on the \
         data the model was fitted to)",
        opts.split
    );
    let (config, ckpt_row, ckpt) = load_run_checkpoint(ws, opts.run, opts.checkpoint)?;
    let setup = Setup::open(ws, config, EXACT_PREFETCH)?;
    let pool = thread_pool(opts.threads.unwrap_or(setup.config.threads))?;
    let t = Instant::now();
    let value =
        pool.install(|| exact_bound(&setup, &ckpt.params, EXACT_PREFETCH, &Scratch::new()))?;
    ws.catalog.record_metrics(
        opts.run,
        &[MetricRow {
            name: Figure::ElboExact.name().into(),
            value,
            step: Some(ckpt_row.step as i64),
            split: Some(Split::Train),
        }],
    )?;
    println!(
        "run {} step {}: exact bound {value:.10e} on {} rows × {} labels ({:.1} s)",
        opts.run,
        ckpt_row.step,
        setup.n_rows,
        setup.n_labels,
        t.elapsed().as_secs_f64()
    );
    Ok(value)
}
