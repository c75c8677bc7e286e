//! Model-level test problems and the finite-difference machinery the gradient tests share:
//! one batch's basis inputs with its labels and parameters, random parameters of the site
//! form, and an analytic gradient paired entry by entry with finite differences.

use faer::Mat;
use fsgp::model::bound::objective::{bound_and_grads, BoundAndGrads, BoundOptions};
use fsgp::model::bound::terms::TermSet;
use fsgp::model::kernel::{BasisInputs, KernelKind, KernelParams};
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::likelihood::multiclass::{ClassLikelihood, Classes};
use fsgp::model::params::{flat_entry, flat_len, Block, Params, QForm, QParams};
use fsgp::model::scratch::Scratch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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
            kxx_b: self.kxx.as_ref().into(),
            sq_norms: &self.norms,
            k_tilde: self.kt.as_ref().into(),
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

/// A general positive definite basis Gram K_X̃ = I + W Wᵀ [R×R], W's entries in ±0.3 drawn
/// from `u` (the SVD basis gives ≈ I; this exercises the subspace path's factor of K_X̃).
pub fn random_gram(u: &mut impl FnMut(f64) -> f64, r: usize) -> Mat<f64> {
    let w = Mat::from_fn(r, r, |_, _| u(0.6));
    Mat::<f64>::identity(r, r) + &w * w.transpose()
}

/// `p` random lower-triangular factors [m×m] with diagonals of either sign, away from 0.
pub fn random_factors(rng: &mut ChaCha8Rng, m: usize, p: usize) -> Vec<Mat<f64>> {
    (0..p)
        .map(|_| {
            Mat::from_fn(m, m, |i, j| {
                let x: f64 = rng.random::<f64>() - 0.5;
                match i.cmp(&j) {
                    std::cmp::Ordering::Less => 0.0,
                    std::cmp::Ordering::Equal => (0.6 + x.abs()) * x.signum(),
                    std::cmp::Ordering::Greater => 0.6 * x,
                }
            })
        })
        .collect()
}

/// `p` random lower-triangular factors [m×m] drawn from `u`: diagonals 0.7 ± 0.2, entries
/// below it in ±`below`/2.
pub fn positive_factors(
    u: &mut impl FnMut(f64) -> f64,
    m: usize,
    p: usize,
    below: f64,
) -> Vec<Mat<f64>> {
    (0..p)
        .map(|_| {
            Mat::from_fn(m, m, |i, j| match i.cmp(&j) {
                std::cmp::Ordering::Less => 0.0,
                std::cmp::Ordering::Equal => 0.7 + u(0.4),
                std::cmp::Ordering::Greater => u(below),
            })
        })
        .collect()
}

/// Φ [K×P] row-major: the identity (K = P) or a general random matrix.
pub fn random_phi(rng: &mut ChaCha8Rng, k: usize, p: usize, identity: bool) -> Vec<f64> {
    (0..k * p)
        .map(|j| match identity {
            true => f64::from(u8::from(j / p == j % p)),
            false => (rng.random::<f64>() - 0.5) * 2.0,
        })
        .collect()
}

/// Labels of the binary gradient problems ([`labelled_problem`]).
pub const LABELS: usize = 7;

/// The problem of the binary gradient tests (tests/it/elbo_gradients.rs,
/// tests/it/kernel_gradients.rs): M = 5 > R = 3 (a singular linear K_Z, as in real runs),
/// B = 4 rows with positives among K = [`LABELS`], P = 2, site parameters, and a general
/// K_X̃ ([`random_gram`]), all drawn from seed `seed`; `more` draws further parameters
/// from the same stream after the site parameters and before K_X̃.
pub fn labelled_problem(
    seed: u64,
    more: impl FnOnce(&mut dyn FnMut(f64) -> f64, &mut Params),
) -> Problem {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (m, r, b, p) = (5, 3, 4, 2);
    let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
    let (kxx, norms) = random_rows(&mut u, b, r, 1.0);
    let mut params = random_site_params(&mut u, (m, r, p, LABELS));
    more(&mut u, &mut params);
    let kt = random_gram(&mut u, r);
    Problem {
        kxx,
        norms,
        kt,
        positives: vec![vec![0, 3], vec![], vec![6], vec![1, 2, 5]],
        params,
    }
}

/// A minibatch of `b` rows for the multi-class bound tests (tests/it/multiclass_gradients.rs,
/// tests/it/augment_reduce.rs), drawn from `u`: K_XX̃ with entries in ±`scale`/2, a general
/// K_X̃, and site parameters for K classes and P latent GPs (`kp`), Φ = I when `identity`;
/// the paper's q(u) with M = 5 > R = 3 (a singular linear K_Z, as in real runs) or, for the
/// whitened form, M = 4 and R = 5, whose factors are the caller's to draw and set
/// (`Params::set_full`).
/// Also returns the rows' classes, (7i + 1) mod K.
pub fn class_problem(
    u: &mut impl FnMut(f64) -> f64,
    (form, identity): (QForm, bool),
    (k, p): (usize, usize),
    b: usize,
    scale: f64,
) -> (Problem, Vec<u32>) {
    let (m, r) = if form == QForm::Whitened {
        (4, 5)
    } else {
        (5, 3)
    };
    let (kxx, norms) = random_rows(u, b, r, scale);
    let kt = random_gram(u, r);
    let mut params = random_site_params(u, (m, r, p, k));
    if identity {
        params.phi = Mat::identity(k, p);
    }
    let classes = (0..b).map(|i| ((i * 7 + 1) % k) as u32).collect();
    let problem = Problem {
        kxx,
        norms,
        kt,
        positives: vec![Vec::new(); b],
        params,
    };
    (problem, classes)
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

/// The value and every flat entry of `e`'s gradient, as bits.
pub fn eval_bits(e: &BoundAndGrads) -> Vec<u64> {
    let mut g = e.grads.clone();
    let mut out = vec![e.value.to_bits()];
    for idx in 0..flat_len(&e.grads) {
        out.push(flat_entry(&mut g, idx).1.to_bits());
    }
    out
}

/// The largest [`rel_error`] (with `floor`) between `a` and `b` over the value and every
/// gradient entry; entries equal in both (log ℓ of the linear kernel, exactly 0) agree.
pub fn max_rel_diff(a: &BoundAndGrads, b: &BoundAndGrads, floor: f64) -> f64 {
    let (mut ga, mut gb) = (a.grads.clone(), b.grads.clone());
    let mut worst = rel_error(a.value, b.value, floor);
    for idx in 0..flat_len(&a.grads) {
        let x = *flat_entry(&mut ga, idx).1;
        let y = *flat_entry(&mut gb, idx).1;
        if x != y {
            worst = worst.max(rel_error(x, y, floor));
        }
    }
    worst
}

/// The blocks of the site form's parameters in flat order under kernel `kind`: A, μ, ρ, Φ,
/// b, log σ_f², log ℓ, and log σ_lin² for the SE + linear kernel.
pub fn site_blocks(kind: KernelKind) -> Vec<Block> {
    let mut blocks = vec![
        Block::A,
        Block::Mu,
        Block::Rho,
        Block::Phi,
        Block::Bias,
        Block::LogSf2,
        Block::LogEll,
    ];
    if kind == KernelKind::SePlusLinear {
        blocks.push(Block::LogLin2);
    }
    blocks
}

/// |a − b| / max(|a|, |b|, floor): relative, except for entries below `floor`.
pub fn rel_error(a: f64, b: f64, floor: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(floor)
}

/// The largest difference between two matrices, relative to the larger's largest entry.
pub fn mat_rel(a: &Mat<f64>, b: &Mat<f64>) -> f64 {
    let scale = a.norm_max().max(b.norm_max()).max(1e-12);
    (a - b).norm_max() / scale
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
