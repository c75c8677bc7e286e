//! ARD over the D input features (`--ard features`, `src/model/kernel/feature_ard.rs`) in the whole
//! bound: every block's analytic gradient, ∂F/∂log w included, against central finite
//! differences for each kernel and q(u) form; unit weights give the model without ARD bit
//! for bit; and, independently of the transform's code, the bound equals the plain model's
//! on explicitly scaled dense inputs x ↦ W^{1/2}x.

use crate::common;
use common::model::*;
use faer::Mat;
use fsgp::model::bound::objective::{
    bound_and_grads, bound_and_grads_feature_ard, expected_loglik, kl_total, BoundAndGrads,
    BoundOptions,
};
use fsgp::model::bound::terms::{terms_all, terms_sampled, TermSet};
use fsgp::model::kernel::feature_ard::{FeatureInputs, FeatureRows, FeatureWarp};
use fsgp::model::kernel::{BasisInputs, KernelKind};
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::params::{flat_entry, flat_len, Block, Params, QForm};
use fsgp::model::qu::cholesky::pack_factors;
use fsgp::model::qu::conditional::Factorisation;
use fsgp::model::scratch::Scratch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const K: usize = 7;
const KINDS: [KernelKind; 3] = [
    KernelKind::Linear,
    KernelKind::SquaredExponential,
    KernelKind::SePlusLinear,
];

/// M = 5 inducing inputs, a basis of R = 3 rows over D = 6 features (not orthonormal),
/// B = 4 sparse rows, P = 2 latent GPs, K = 7 labels, and random feature weights.
struct FeatureProblem {
    rows: FeatureRows,
    basis: Mat<f64>,
    positives: Vec<Vec<u32>>,
    params: Params,
}

impl FeatureProblem {
    fn fx(&self) -> FeatureInputs<'_> {
        FeatureInputs {
            rows: &self.rows,
            basis: self.basis.as_ref(),
        }
    }
}

fn problem(seed: u64, kind: KernelKind, weights: bool) -> FeatureProblem {
    let (m, r, b, p, d) = (5, 3, 4, 2, 6);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rows = FeatureRows::new();
    for i in 0..b {
        // Row i holds about half the features, and at least one.
        let ids: Vec<u32> = (0..d as u32)
            .filter(|&j| j as usize == i || rng.random::<f64>() < 0.5)
            .collect();
        let vals: Vec<f64> = ids.iter().map(|_| rng.random::<f64>() - 0.5).collect();
        rows.push_row(&ids, vals);
    }
    let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
    let basis = Mat::from_fn(r, d, |_, _| u(1.4));
    let mut params = random_site_params(&mut u, (m, r, p, K));
    params.kernel.log_lin2 = (kind == KernelKind::SePlusLinear).then(|| u(0.5) - 0.3);
    params.kernel.log_features = (0..d).map(|_| if weights { u(1.6) } else { 0.0 }).collect();
    FeatureProblem {
        rows,
        basis,
        positives: vec![vec![0, 3], vec![], vec![6], vec![1, 2, 5]],
        params,
    }
}

fn lik() -> BernoulliLogistic {
    BernoulliLogistic::new(20).unwrap()
}

fn eval_features(
    kind: KernelKind,
    pr: &FeatureProblem,
    params: &Params,
    terms: &TermSet<'_>,
) -> BoundAndGrads {
    let opts = BoundOptions::default();
    bound_and_grads_feature_ard(
        kind,
        params,
        &pr.fx(),
        terms,
        &lik(),
        &opts,
        &Scratch::new(),
    )
    .unwrap()
}

/// The plain model (no feature weights) at given inputs, through C_p.
fn eval_plain(
    kind: KernelKind,
    params: &Params,
    x: &BasisInputs<'_>,
    terms: &TermSet<'_>,
) -> BoundAndGrads {
    let opts = BoundOptions {
        factorisation: Factorisation::Inducing,
        ..BoundOptions::default()
    };
    bound_and_grads(kind, params, x, terms, &lik(), &opts, &Scratch::new()).unwrap()
}

#[test]
fn every_block_matches_central_differences_under_feature_ard() {
    for kind in KINDS {
        for sampled in [false, true] {
            let pr = problem(11 + sampled as u64, kind, true);
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            let terms = match sampled {
                true => terms_sampled(&pr.positives, K, 2, 3.0, &mut rng),
                false => terms_all(&pr.positives, K, 3.0),
            };
            let set = TermSet::List(&terms);
            let grads = eval_features(kind, &pr, &pr.params, &set).grads;
            let h = 1e-3;
            let fds =
                five_point_differences(&pr.params, h, |q| eval_features(kind, &pr, q, &set).value);
            let label = format!("{kind:?} features sampled={sampled}");
            let linear = kind == KernelKind::Linear;
            let (worst, seen) = assert_gradient_matches(&grads, &fds, linear, (1e-4, 1e-6), &label);
            eprintln!(
                "{label}: worst relative error {:.1e} ({})",
                worst.0, worst.1
            );
            let mut expected = site_blocks(kind);
            expected.push(Block::LogFeatures);
            assert_eq!(seen, expected, "{label}");
        }
    }
}

/// ∂F/∂log w with plain central differences (truncation ∝ h²) on its own, as the brief
/// states it: ≤ 1e-6 relative for every kernel.
#[test]
fn feature_weight_gradient_matches_plain_central_differences() {
    for kind in KINDS {
        let pr = problem(3, kind, true);
        let dense = TermSet::AllLabels {
            positives: &pr.positives,
            scale: 2.0,
        };
        let g = eval_features(kind, &pr, &pr.params, &dense)
            .grads
            .kernel
            .log_features;
        let h = 1e-5;
        let mut worst = 0.0f64;
        for (d, &analytic) in g.iter().enumerate() {
            let at = |step: f64| {
                let mut q = pr.params.clone();
                q.kernel.log_features[d] += step;
                eval_features(kind, &pr, &q, &dense).value
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let rel = rel_error(analytic, fd, 1e-4);
            worst = worst.max(rel);
            assert!(
                rel <= 1e-6,
                "{kind:?} log w[{d}]: {analytic} vs {fd} ({rel:.1e})"
            );
        }
        eprintln!("{kind:?}: ∂F/∂log w worst relative error {worst:.1e}");
    }
}

/// At w = 1 the bound and every shared gradient block equal the model without ARD given
/// the same rows projected onto the same basis, bit for bit.
#[test]
fn unit_feature_weights_equal_the_model_without_ard_bitwise() {
    for kind in KINDS {
        let pr = problem(7, kind, false);
        let dense = TermSet::AllLabels {
            positives: &pr.positives,
            scale: 1.5,
        };
        let ard = eval_features(kind, &pr, &pr.params, &dense);
        let kxx = pr.rows.project(pr.basis.as_ref());
        let norms = pr.rows.weighted_sq_norms(None);
        let kt = &pr.basis * pr.basis.transpose();
        let x = BasisInputs {
            kxx_b: kxx.as_ref().into(),
            sq_norms: &norms,
            k_tilde: kt.as_ref().into(),
        };
        let plain_params = pr.params.without_feature_weights();
        let plain = eval_plain(kind, &plain_params, &x, &dense);
        assert_eq!(ard.value.to_bits(), plain.value.to_bits(), "{kind:?}");
        let (mut g, mut p) = (ard.grads.clone(), plain.grads.clone());
        for idx in 0..flat_len(&plain.grads) {
            let (block, v) = flat_entry(&mut g, idx);
            let v = *v;
            assert_eq!(
                v.to_bits(),
                flat_entry(&mut p, idx).1.to_bits(),
                "{kind:?} {block}[{idx}]"
            );
        }
        assert_eq!(ard.grads.kernel.log_features.len(), 6);
        assert!(ard.grads.kernel.log_features.iter().all(|v| v.is_finite()));
    }
}

/// The bound with feature ARD equals the plain model's at explicitly scaled dense inputs
/// (X_b W^{1/2} and X̃ W^{1/2}, products by dense GEMMs, not the sparse code), and so do the
/// gradients of every shared block; the forward-only pieces of the exact bound at the
/// weighted inputs give the same value.
#[test]
fn feature_ard_is_the_plain_kernel_on_explicitly_scaled_inputs() {
    for kind in KINDS {
        let pr = problem(19, kind, true);
        let dense = TermSet::AllLabels {
            positives: &pr.positives,
            scale: 1.5,
        };
        let ard = eval_features(kind, &pr, &pr.params, &dense);
        let d = pr.basis.ncols();
        let lw = &pr.params.kernel.log_features;
        let sqrt_w = Mat::from_fn(d, d, |i, j| if i == j { (0.5 * lw[i]).exp() } else { 0.0 });
        let mut xd = Mat::<f64>::zeros(pr.rows.len(), d);
        for i in 0..pr.rows.len() {
            for (j, v) in pr.rows.row(i) {
                xd[(i, j)] = v;
            }
        }
        let xs = &xd * &sqrt_w;
        let bs = &pr.basis * &sqrt_w;
        let kxx = &xs * bs.transpose();
        let kt = &bs * bs.transpose();
        let norms: Vec<f64> = (0..xs.nrows())
            .map(|i| xs.row(i).iter().map(|v| v * v).sum())
            .collect();
        let x = BasisInputs {
            kxx_b: kxx.as_ref().into(),
            sq_norms: &norms,
            k_tilde: kt.as_ref().into(),
        };
        let plain_params = pr.params.without_feature_weights();
        let plain = eval_plain(kind, &plain_params, &x, &dense);
        let rel = (ard.value - plain.value).abs() / plain.value.abs();
        eprintln!("{kind:?}: bound vs explicitly scaled inputs, relative {rel:.1e}");
        assert!(
            rel <= 1e-9,
            "{kind:?}: {} vs {} ({rel:.1e})",
            ard.value,
            plain.value
        );
        let (mut g, mut p) = (ard.grads.clone(), plain.grads.clone());
        for idx in 0..flat_len(&plain.grads) {
            let (block, v) = flat_entry(&mut g, idx);
            let (v, q) = (*v, *flat_entry(&mut p, idx).1);
            assert!(
                rel_error(v, q, 1e-6) <= 1e-9,
                "{kind:?} {block}[{idx}]: {v} vs {q}"
            );
        }
        // The exact bound's pieces (forward only) at the weighted inputs.
        let warp = FeatureWarp::new(lw, &pr.fx());
        let scratch = Scratch::new();
        let e = expected_loglik(
            kind,
            &plain_params,
            &warp.inputs(),
            &dense,
            &lik(),
            &scratch,
        )
        .unwrap();
        let kl = kl_total(kind, &plain_params, warp.k_tilde.as_ref(), &scratch).unwrap();
        let rel = ((e - kl) - ard.value).abs() / ard.value.abs();
        assert!(
            rel <= 1e-12,
            "{kind:?}: exact pieces {} vs {}",
            e - kl,
            ard.value
        );
    }
}

/// The conditional refuses parameters that still carry feature weights: they must go
/// through the weighted inputs, not be silently ignored.
#[test]
fn plain_paths_refuse_parameters_with_feature_weights() {
    let pr = problem(2, KernelKind::Linear, true);
    let kxx = pr.rows.project(pr.basis.as_ref());
    let norms = pr.rows.weighted_sq_norms(None);
    let kt = &pr.basis * pr.basis.transpose();
    let x = BasisInputs {
        kxx_b: kxx.as_ref().into(),
        sq_norms: &norms,
        k_tilde: kt.as_ref().into(),
    };
    let dense = TermSet::AllLabels {
        positives: &pr.positives,
        scale: 1.0,
    };
    let opts = BoundOptions::default();
    let err = bound_and_grads(
        KernelKind::Linear,
        &pr.params,
        &x,
        &dense,
        &lik(),
        &opts,
        &Scratch::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("feature ARD weights"), "{err}");
    // And the subspace factorisation is refused with feature ARD.
    let sub = BoundOptions {
        factorisation: Factorisation::LowRank,
        ..BoundOptions::default()
    };
    let err = bound_and_grads_feature_ard(
        KernelKind::Linear,
        &pr.params,
        &pr.fx(),
        &dense,
        &lik(),
        &sub,
        &Scratch::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("C_p"), "{err}");
}

/// The full-Cholesky q(u) forms under feature ARD (SE kernel, whose K_Z is non-singular):
/// every block, the packed factors L and ∂F/∂log w included, against central differences.
#[test]
fn full_cholesky_forms_match_central_differences_under_feature_ard() {
    let kind = KernelKind::SquaredExponential;
    for form in [QForm::Whitened, QForm::Cholesky] {
        let mut pr = problem(23, kind, true);
        let (m, p) = (pr.params.q.mu().nrows(), pr.params.q.mu().ncols());
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let factors = random_factors(&mut rng, m, p);
        pr.params
            .set_full(pack_factors(&factors, form == QForm::Whitened));
        let dense = TermSet::AllLabels {
            positives: &pr.positives,
            scale: 2.0,
        };
        let grads = eval_features(kind, &pr, &pr.params, &dense).grads;
        let fds = five_point_differences(&pr.params, 1e-3, |q| {
            eval_features(kind, &pr, q, &dense).value
        });
        let label = format!("{form:?} SE features");
        let (worst, seen) = assert_gradient_matches(&grads, &fds, false, (1e-4, 1e-6), &label);
        eprintln!(
            "{label}: worst relative error {:.1e} ({})",
            worst.0, worst.1
        );
        assert_eq!(
            seen,
            vec![
                Block::A,
                Block::Mu,
                Block::CholFactor,
                Block::Phi,
                Block::Bias,
                Block::LogSf2,
                Block::LogEll,
                Block::LogFeatures,
            ],
            "{label}"
        );
    }
}
