//! The objective: the stochastic evidence lower bound of MLGPF on one minibatch (Panos,
//! Dellaportas & Titsias, *Fully Scalable Gaussian Processes using Subspace Inducing
//! Inputs*, eq. 23) and its exact analytic gradient with respect to every parameter block,
//! and the forward-only pieces of the exact full-data bound (`docs/model.md`).
//!
//! F = Σ_{(i,k,y,w) ∈ terms} w · E_q[log p(y | f_ik)] − Σ_p KL_p, with
//! f̄_ik = Σ_p Φ_kp m_ip + b_k and v_ik = Σ_p Φ_kp² s_ip.
//!
//! The caller chooses the terms (`bound/terms.rs`): every label of every row (exact bound on the
//! rows), or the positives plus a uniform sample of negatives reweighted by |N_i|/|L_i|; the
//! N/|B| scaling is part of each term's weight.

use std::time::Instant;

use anyhow::{bail, ensure, Result};
use faer::{Mat, MatRef};

use crate::model::bound::expected::likelihood_part;
use crate::model::bound::terms::{Term, TermSet};
use crate::model::kernel::feature_ard::{FeatureInputs, FeatureWarp};
use crate::model::kernel::{BasisInputs, GramRef, InputGrads, KernelKind, Rows};
use crate::model::likelihood::multiclass::Classes;
use crate::model::likelihood::Likelihood;
use crate::model::params::{CholFactors, Grads, Params, QParams};
use crate::model::qu::axes;
use crate::model::qu::conditional::{Conditional, Factorisation};
use crate::model::scratch::Scratch;

/// What [`bound_and_grads`] computes besides the bound.
#[derive(Debug, Clone, Copy)]
pub struct BoundOptions {
    /// Gradients with respect to A and the kernel hyperparameters. When false (A and the kernel
    /// hyperparameters frozen), the backward pass through K_Z and K_bZ, O(M³) per latent
    /// GP, is skipped and those gradients are returned as zeros.
    pub kernel_grads: bool,
    /// Which factorisation the per-GP work goes through (`docs/model.md`).
    pub factorisation: Factorisation,
}

impl Default for BoundOptions {
    fn default() -> Self {
        BoundOptions {
            kernel_grads: true,
            factorisation: Factorisation::Auto,
        }
    }
}

/// Wall-clock seconds spent in each phase of one evaluation.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseTimes {
    /// K_Z, K_bZ, k_ii.
    pub kernel_fwd: f64,
    /// Cholesky factors, marginals m and s, KL.
    pub variational_fwd: f64,
    /// Utilities f̄ and v, quadrature, and the gradients with respect to m, s, Φ and b.
    pub likelihood: f64,
    /// Gradients with respect to μ, ρ, K_Z, K_bZ and k_ii.
    pub variational_bwd: f64,
    /// Chain rule to A, log σ_f², log ℓ.
    pub kernel_bwd: f64,
}

impl PhaseTimes {
    pub fn total(&self) -> f64 {
        self.kernel_fwd
            + self.variational_fwd
            + self.likelihood
            + self.variational_bwd
            + self.kernel_bwd
    }
}

/// Value of the bound and its gradient.
#[derive(Debug, Clone)]
pub struct BoundAndGrads {
    pub value: f64,
    /// Σ_p KL_p (part of `value`, reported separately).
    pub kl: f64,
    /// Diagonal jitter the Cholesky factorisations needed (0 when none).
    pub jitter: f64,
    pub grads: Grads,
    pub times: PhaseTimes,
}

impl BoundAndGrads {
    /// Hands back to `scratch` the gradient matrices the next evaluation can reuse (Φ's
    /// [K×P], and the axes form's [D×P] blocks, `qu::axes::forward`); a caller stepping
    /// repeatedly calls this once it is done with the gradients.
    pub fn recycle(self, scratch: &Scratch) {
        let mut grads = self.grads;
        scratch.give_labels(std::mem::replace(&mut grads.phi, Mat::new()));
        axes::recycle_grads(grads, scratch);
    }
}

/// Every term's row and label inside the `b`×`k_count` minibatch.
fn check_list(list: &[Term], b: usize, k_count: usize) -> Result<()> {
    for t in list {
        let (i, k) = (t.row as usize, t.label as usize);
        ensure!(
            i < b && k < k_count,
            "term ({i}, {k}) outside the {b}×{k_count} minibatch"
        );
    }
    Ok(())
}

/// One row of positives per minibatch row, each label below `k_count`.
fn check_positives(positives: &[Vec<u32>], b: usize, k_count: usize) -> Result<()> {
    ensure!(
        positives.len() == b,
        "{} rows of labels for a minibatch of {b} rows",
        positives.len()
    );
    for pos in positives {
        for &k in pos {
            ensure!(
                (k as usize) < k_count,
                "label {k} outside the {k_count} labels"
            );
        }
    }
    Ok(())
}

fn check_shapes(params: &Params, x: &BasisInputs<'_>, terms: &TermSet<'_>) -> Result<()> {
    let (p_count, k_count) = (params.q.mu().ncols(), params.phi.nrows());
    ensure!(
        params.phi.ncols() == p_count && params.bias.len() == k_count,
        "Φ, b and μ disagree in shape"
    );
    let b = x.kxx_b.nrows();
    match terms {
        TermSet::List(list) => check_list(list, b, k_count)?,
        TermSet::AllLabels { positives, .. } => check_positives(positives, b, k_count)?,
        TermSet::Stratified {
            frequent,
            positives,
            rest,
            ..
        } => {
            check_list(rest, b, k_count)?;
            check_positives(positives, b, k_count)?;
            ensure!(
                frequent.windows(2).all(|w| w[0] < w[1])
                    && frequent.last().is_none_or(|&k| (k as usize) < k_count),
                "the frequent labels are not distinct sorted ids below {k_count}"
            );
        }
        TermSet::Classes(classes) => {
            ensure!(
                k_count >= 2,
                "the {} likelihood needs at least 2 classes, the model has {k_count}",
                classes.lik.name()
            );
            ensure!(
                classes.class.len() == b,
                "{} classes for a minibatch of {b} rows",
                classes.class.len()
            );
            if let Some(&c) = classes.class.iter().find(|&&c| c as usize >= k_count) {
                bail!("class {c} outside the {k_count} classes");
            }
            check_amortiser(params, x, classes)?;
        }
    }
    Ok(())
}

/// A likelihood with amortised local parameters needs the network, with as many inputs as
/// the minibatch's rows have columns and as many outputs as it reads; the others none.
fn check_amortiser(params: &Params, x: &BasisInputs<'_>, classes: &Classes<'_>) -> Result<()> {
    let outputs = classes.lik.local_init(params.phi.nrows()).len();
    match (&params.amortiser, outputs) {
        (None, 0) => Ok(()),
        (Some(_), 0) => bail!(
            "the parameters carry an amortisation network the {} likelihood does not use",
            classes.lik.name()
        ),
        (None, _) => bail!(
            "the {} likelihood needs an amortisation network; the parameters have none",
            classes.lik.name()
        ),
        (Some(net), o) => {
            ensure!(
                net.shapes_agree() && net.outputs() == o && net.inputs() == x.kxx_b.ncols(),
                "the amortisation network maps {} inputs to {} outputs; the {} likelihood \
                 reads {o} outputs from rows of {} columns",
                net.inputs(),
                net.outputs(),
                classes.lik.name(),
                x.kxx_b.ncols()
            );
            Ok(())
        }
    }
}

/// Evaluates F and ∂F on a minibatch: `x` holds its Kxx rows and squared norms. A one-off
/// evaluation with its own [`Scratch`] (repeated evaluations use [`bound_and_grads`] with one
/// arena).
pub fn bound_and_grads_once(
    kind: KernelKind,
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &[Term],
    lik: &dyn Likelihood,
) -> Result<BoundAndGrads> {
    bound_and_grads(
        kind,
        params,
        x,
        &TermSet::List(terms),
        lik,
        &BoundOptions::default(),
        &Scratch::new(),
    )
}

/// Evaluates F and ∂F on a minibatch for any [`TermSet`] (`docs/model.md`, "Algorithm as
/// implemented"), with work buffers from `scratch`. Runs in the current rayon pool; the
/// result does not depend on its size.
pub fn bound_and_grads(
    kind: KernelKind,
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &TermSet<'_>,
    lik: &dyn Likelihood,
    opts: &BoundOptions,
    scratch: &Scratch,
) -> Result<BoundAndGrads> {
    Ok(bound_and_grads_inner(kind, params, x, terms, lik, opts, false, scratch)?.0)
}

/// The bound and its gradient with ARD over the D input features (`kernel/feature_ard.rs`,
/// `docs/model.md`, "ARD over the D features"): `params` carries the weights log w [D],
/// `fx` the minibatch's sparse rows and the basis X̃ [R×D]. The kernel runs on the weighted
/// inputs Kxx'_b, n', K'_X̃ through C_p (the linear kernel's subspace path holds the
/// Cholesky factor of K_X̃ fixed, which K'_X̃ is not), and ∂F/∂log w comes from the kernel's
/// input gradients. Without `opts.kernel_grads` ∂F/∂log w is zero like the other kernel
/// blocks.
pub fn bound_and_grads_feature_ard(
    kind: KernelKind,
    params: &Params,
    fx: &FeatureInputs<'_>,
    terms: &TermSet<'_>,
    lik: &dyn Likelihood,
    opts: &BoundOptions,
    scratch: &Scratch,
) -> Result<BoundAndGrads> {
    let log_w = &params.kernel.log_features;
    fx.check(log_w)?;
    ensure!(
        opts.factorisation != Factorisation::LowRank,
        "ARD over the features runs through C_p, not the subspace factorisation"
    );
    ensure!(
        params.kernel.log_ard.is_empty(),
        "ARD over the features and subspace ARD exclude each other"
    );
    ensure!(
        params.amortiser.is_none(),
        "ARD over the features reweights the rows the amortisation network reads; the two \
         exclude each other"
    );
    let warp = FeatureWarp::new(log_w, fx);
    let plain = params.without_feature_weights();
    let opts = BoundOptions {
        factorisation: Factorisation::Inducing,
        ..*opts
    };
    let x = warp.inputs();
    let (mut ev, input_grads) =
        bound_and_grads_inner(kind, &plain, &x, terms, lik, &opts, true, scratch)?;
    let clock = Instant::now();
    ev.grads.kernel.log_features = match input_grads {
        Some(g) => warp.backward(fx, &g),
        None => vec![0.0; log_w.len()],
    };
    ev.times.kernel_bwd += clock.elapsed().as_secs_f64();
    Ok(ev)
}

/// [`bound_and_grads`], and with `want_inputs` (and kernel gradients) the kernel's gradients
/// with respect to its data inputs.
#[allow(clippy::too_many_arguments)]
fn bound_and_grads_inner(
    kind: KernelKind,
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &TermSet<'_>,
    lik: &dyn Likelihood,
    opts: &BoundOptions,
    want_inputs: bool,
    scratch: &Scratch,
) -> Result<(BoundAndGrads, Option<InputGrads>)> {
    check_shapes(params, x, terms)?;
    let mut times = PhaseTimes::default();
    let clock = Instant::now();
    let cond = Conditional::new(kind, params, x, opts.factorisation)?;
    times.kernel_fwd = lap(&clock, 0.0);
    let mut vf = cond.forward(params, scratch)?;
    times.variational_fwd = lap(&clock, times.total());
    let rows = NetworkRows::of(params, x);
    let lg = likelihood_part(
        params,
        (vf.mean(), vf.var()),
        rows.view(),
        terms,
        lik,
        scratch,
    );
    times.likelihood = lap(&clock, times.total());
    let vg = cond.backward(
        &mut vf,
        params,
        lg.mean.as_ref(),
        lg.var.as_ref(),
        opts.kernel_grads,
        scratch,
    );
    let (kl, jitter) = (vf.kl(), vf.jitter());
    vf.recycle(scratch);
    times.variational_bwd = lap(&clock, times.total());
    let input_grads = match want_inputs && opts.kernel_grads {
        true => Some(cond.input_grads(params, &vg)?),
        false => None,
    };
    let (g_a, g_kernel) = if opts.kernel_grads {
        cond.kernel_backward(params, x, &vg)
    } else {
        (
            Mat::zeros(params.a.nrows(), params.a.ncols()),
            params.kernel.zeros_like(),
        )
    };
    times.kernel_bwd = lap(&clock, times.total());
    let ev = BoundAndGrads {
        value: lg.expected - kl,
        kl,
        jitter,
        grads: Params {
            // 0 when the class likelihood does not use it (it then does not change F).
            logit_epsilon: params.logit_epsilon.map(|_| lg.lik_param.unwrap_or(0.0)),
            a: g_a,
            q: match &params.q {
                QParams::Sites { .. } => QParams::Sites {
                    mu: vg.mu,
                    rho: vg.rho,
                },
                QParams::Full { chol, .. } => QParams::Full {
                    mu: vg.mu,
                    chol: CholFactors {
                        whitened: chol.whitened,
                        packed: vg.chol,
                    },
                },
            },
            phi: lg.phi,
            bias: lg.bias,
            kernel: g_kernel,
            amortiser: lg.amortiser,
        },
        times,
    };
    Ok((ev, input_grads))
}

/// The minibatch's rows as the amortisation network of a multi-class likelihood reads them
/// [B×R]: dense rows as they are; sparse rows (the identity basis) densified when the
/// parameters carry a network, which reads whole rows, and otherwise none [B×0].
enum NetworkRows<'x> {
    Dense(MatRef<'x, f64>),
    Densified(Mat<f64>),
}

impl<'x> NetworkRows<'x> {
    fn of(params: &Params, x: &BasisInputs<'x>) -> Self {
        match (x.kxx_b, &params.amortiser) {
            (Rows::Dense(m), _) => NetworkRows::Dense(m),
            (sparse, Some(_)) => NetworkRows::Densified(sparse.to_dense()),
            (sparse, None) => NetworkRows::Densified(Mat::zeros(sparse.nrows(), 0)),
        }
    }

    fn view(&self) -> MatRef<'_, f64> {
        match self {
            NetworkRows::Dense(m) => *m,
            NetworkRows::Densified(m) => m.as_ref(),
        }
    }
}

/// Seconds since `clock` minus what earlier phases already took.
fn lap(clock: &Instant, before: f64) -> f64 {
    clock.elapsed().as_secs_f64() - before
}

/// Σ_terms w E only (no KL, no gradients): one batch's share of the exact bound. Costs the
/// kernels, a Cholesky and a triangular solve per GP, and the quadrature.
pub fn expected_loglik(
    kind: KernelKind,
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &TermSet<'_>,
    lik: &dyn Likelihood,
    scratch: &Scratch,
) -> Result<f64> {
    check_shapes(params, x, terms)?;
    let marginals =
        Conditional::new(kind, params, x, Factorisation::Auto)?.marginals(params, scratch)?;
    let lg = likelihood_part(
        params,
        (marginals.mean.as_ref(), marginals.var.as_ref()),
        NetworkRows::of(params, x).view(),
        terms,
        lik,
        scratch,
    );
    Ok(lg.expected)
}

/// Σ_p KL_p, which depends on the data only through K_X̃ [R×R]: computed once for a
/// full-data bound, on the path [`bound_and_grads`] takes by default.
pub fn kl_total<'g>(
    kind: KernelKind,
    params: &Params,
    k_tilde: impl Into<GramRef<'g>>,
    scratch: &Scratch,
) -> Result<f64> {
    let x = BasisInputs::without_rows(k_tilde.into());
    Conditional::new(kind, params, &x, Factorisation::Auto)?.kl_total(params, scratch)
}
