//! Model-level test problems and the finite-difference machinery the gradient tests share:
//! one batch's basis inputs with its labels and parameters, random parameters of the site
//! form, and an analytic gradient paired entry by entry with finite differences.

use faer::Mat;
use fsgp::model::bound::objective::{bound_and_grads, BoundAndGrads, BoundOptions};
use fsgp::model::bound::terms::TermSet;
use fsgp::model::kernel::{BasisInputs, KernelKind, KernelParams};
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::likelihood::multiclass::{ClassLikelihood, Classes};
use fsgp::model::params::{flat_entry, flat_len, Block, Params, QParams};
use fsgp::model::scratch::Scratch;

/// One batch as the bound sees it: K_XX̃ [B×R], the rows' squared norms [B], the basis
/// Gram K_X̃ [R×R], each row's positive labels, and the parameters.
pub struct Problem {
    pub kxx: Mat<f64>,
    pub norms: Vec<f64>,
    pub kt: Mat<f64>,
    pub positives: Vec<Vec<u32>>,
    pub params: Params,
}

impl Problem {
    /// The batch's inputs.
    pub fn x(&self) -> BasisInputs<'_> {
        BasisInputs {
            kxx_b: self.kxx.as_ref(),
            sq_norms: &self.norms,
            k_tilde: self.kt.as_ref(),
        }
    }
}

/// Random K_XX̃ [B×R] with entries in ±s/2, and squared norms ‖K_XX̃ row‖² + 0.2 (a row's
/// norm exceeds that of its projection), drawn from `u` (u(s) uniform in ±s/2).
pub fn random_rows(
    u: &mut impl FnMut(f64) -> f64,
    b: usize,
    r: usize,
    s: f64,
) -> (Mat<f64>, Vec<f64>) {
    let kxx = Mat::from_fn(b, r, |_, _| u(s));
    let norms = (0..b)
        .map(|i| (0..r).map(|k| kxx[(i, k)].powi(2)).sum::<f64>() + 0.2)
        .collect();
    (kxx, norms)
}

/// Random parameters of the site form (ρ present, no Cholesky factors) for M inducing
/// inputs in R columns, P latent GPs and K labels, drawn from `u` in the order A, μ, ρ, Φ,
/// b, (log σ_f², log ℓ) with the scales the gradient tests have always used.
pub fn random_site_params(
    u: &mut impl FnMut(f64) -> f64,
    (m, r, p, k): (usize, usize, usize, usize),
) -> Params {
    Params {
        logit_epsilon: None,
        a: Mat::from_fn(m, r, |_, _| u(1.0)),
        q: QParams::Sites {
            mu: Mat::from_fn(m, p, |_, _| u(1.0)),
            rho: Mat::from_fn(m, p, |_, _| u(2.0)),
        },
        phi: Mat::from_fn(k, p, |_, _| u(1.5)),
        bias: (0..k).map(|_| u(1.0)).collect(),
        kernel: KernelParams::new(u(0.5), u(0.5)),
        amortiser: None,
    }
}

/// Every flat entry of `grads` (in `flat_entry` order) with its block.
pub fn flat_entries(grads: &Params) -> Vec<(Block, f64)> {
    let mut g = grads.clone();
    (0..flat_len(grads))
        .map(|idx| {
            let (block, v) = flat_entry(&mut g, idx);
            (block, *v)
        })
        .collect()
}

/// f(θ with flat entry `idx` moved by `step`).
fn moved(params: &Params, idx: usize, step: f64, f: &impl Fn(&Params) -> f64) -> f64 {
    let mut q = params.clone();
    *flat_entry(&mut q, idx).1 += step;
    f(&q)
}

/// ∂f/∂θ_i for every flat entry i of `params` by central differences,
/// (f(θ + h e_i) − f(θ − h e_i)) / 2h: truncation ∝ h², rounding ∝ ε|f|/h.
pub fn central_differences(params: &Params, h: f64, f: impl Fn(&Params) -> f64) -> Vec<f64> {
    (0..flat_len(params))
        .map(|idx| (moved(params, idx, h, &f) - moved(params, idx, -h, &f)) / (2.0 * h))
        .collect()
}

/// As [`central_differences`] by the five-point stencil
/// (8 (f(θ + h e_i) − f(θ − h e_i)) − (f(θ + 2h e_i) − f(θ − 2h e_i))) / 12h: truncation ∝ h⁴,
/// so a larger h keeps the rounding small.
pub fn five_point_differences(params: &Params, h: f64, f: impl Fn(&Params) -> f64) -> Vec<f64> {
    (0..flat_len(params))
        .map(|idx| {
            let at = |step: f64| moved(params, idx, step, &f);
            (8.0 * (at(h) - at(-h)) - (at(2.0 * h) - at(-2.0 * h))) / (12.0 * h)
        })
        .collect()
}

/// |a − b| / max(|a|, |b|, floor): relative, except for entries below `floor`.
pub fn rel_error(a: f64, b: f64, floor: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(floor)
}

/// Asserts that every entry of the analytic gradient `grads` is within relative `tol`
/// ([`rel_error`] with `floor`) of its finite difference in `fds`; log ℓ of the linear
/// kernel (`linear`), which the bound does not depend on, must be exactly 0 instead.
/// Returns the worst relative error with its block, and the blocks in order of appearance.
pub fn assert_gradient_matches(
    grads: &Params,
    fds: &[f64],
    linear: bool,
    (floor, tol): (f64, f64),
    label: &str,
) -> ((f64, Block), Vec<Block>) {
    let mut seen = Vec::new();
    let mut worst = (0.0f64, Block::A);
    for (idx, ((block, analytic), &fd)) in flat_entries(grads).into_iter().zip(fds).enumerate() {
        if !seen.contains(&block) {
            seen.push(block);
        }
        if linear && block == Block::LogEll {
            assert_eq!(analytic, 0.0, "{label}: log ℓ of the linear kernel");
            continue;
        }
        let rel = rel_error(analytic, fd, floor);
        if rel > worst.0 {
            worst = (rel, block);
        }
        assert!(
            rel <= tol,
            "{label} {block}[{idx}]: analytic {analytic} vs fd {fd} (rel {rel:.2e})"
        );
    }
    (worst, seen)
}

/// The class terms of the multi-class bound: every row a term of class `class[i]` under
/// `lik`, scaled by 2.5, Monte Carlo noise seed 17 (the gradient tests of every class
/// likelihood use this one set-up).
pub fn bound_classes<'a>(class: &'a [u32], lik: &'a dyn ClassLikelihood) -> Classes<'a> {
    Classes {
        class,
        scale: 2.5,
        lik,
        seed: 17,
        first_stream: 0,
    }
}

/// The bound of a multi-class problem with the terms of [`bound_classes`], or the error
/// `bound_and_grads` gives.
pub fn try_class_bound(
    kind: KernelKind,
    pr: &Problem,
    params: &Params,
    class: &[u32],
    lik: &dyn ClassLikelihood,
) -> anyhow::Result<BoundAndGrads> {
    // The per-term likelihood argument is not used by a class term set.
    let unused = BernoulliLogistic::new(2).unwrap();
    bound_and_grads(
        kind,
        params,
        &pr.x(),
        &TermSet::Classes(bound_classes(class, lik)),
        &unused,
        &BoundOptions::default(),
        &Scratch::new(),
    )
}

/// [`try_class_bound`], which must succeed.
pub fn class_bound(
    kind: KernelKind,
    pr: &Problem,
    params: &Params,
    class: &[u32],
    lik: &dyn ClassLikelihood,
) -> BoundAndGrads {
    try_class_bound(kind, pr, params, class, lik).unwrap()
}
