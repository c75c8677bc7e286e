//! The SE + linear kernel and subspace ARD in the whole bound: every parameter block's
//! analytic gradient against central finite differences for each kernel × ARD mode through
//! every factorisation path that applies; the subspace and inducing paths agree under ARD;
//! ARD with all ω = 1 is the model without ARD; the exact bound's pieces and prediction
//! accept every kernel and ARD mode.

use crate::common;
use common::model::*;
use fsgp::model::bound::objective::{
    bound_and_grads, expected_loglik, kl_total, BoundAndGrads, BoundOptions,
};
use fsgp::model::bound::terms::{terms_all, terms_sampled, Term, TermSet};
use fsgp::model::kernel::KernelKind;
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::params::{flat_entry, flat_len, Block, Params};
use fsgp::model::predictive::Predictor;
use fsgp::model::qu::conditional::Factorisation;
use fsgp::model::scratch::Scratch;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const K: usize = LABELS;

/// The binary gradient problem of seed `seed` ([`labelled_problem`]), with log σ_lin² for the
/// SE + linear kernel and ARD's log ω over the R columns when `ard` drawn after the site
/// parameters: M = 5 > R = 3 (a singular linear K_Z, as in real runs) and a general
/// positive definite K_X̃, so ARD's map and the subspace path's L_X̃ are both exercised in
/// full.
fn problem(seed: u64, kind: KernelKind, ard: bool) -> Problem {
    labelled_problem(seed, |u, params| {
        params.kernel.log_lin2 = (kind == KernelKind::SePlusLinear).then(|| u(0.5) - 0.3);
        if ard {
            params.kernel.log_ard = (0..params.a.ncols()).map(|_| u(1.2)).collect();
        }
    })
}

fn eval(
    kind: KernelKind,
    fact: Factorisation,
    pr: &Problem,
    params: &Params,
    terms: &TermSet<'_>,
) -> BoundAndGrads {
    let lik = BernoulliLogistic::new(20).unwrap();
    let opts = BoundOptions {
        factorisation: fact,
        ..BoundOptions::default()
    };
    bound_and_grads(kind, params, &pr.x(), terms, &lik, &opts, &Scratch::new()).unwrap()
}

/// Every (kernel, factorisation) pair: the subspace path applies to the linear kernel only.
const SETUPS: [(KernelKind, Factorisation); 4] = [
    (KernelKind::Linear, Factorisation::Inducing),
    (KernelKind::Linear, Factorisation::LowRank),
    (KernelKind::SquaredExponential, Factorisation::Inducing),
    (KernelKind::SePlusLinear, Factorisation::Inducing),
];

fn check_gradients(kind: KernelKind, fact: Factorisation, ard: bool, terms: &[Term], seed: u64) {
    let pr = problem(seed, kind, ard);
    let set = TermSet::List(terms);
    let grads = eval(kind, fact, &pr, &pr.params, &set).grads;
    // The five-point stencil (truncation ∝ h⁴) at h = 10⁻³ keeps the rounding of F
    // (∝ ε|F|/h, |F| ≈ 60 here) two orders below the tolerance on entries as small as 10⁻⁵.
    let h = 1e-3;
    let fds = five_point_differences(&pr.params, h, |q| eval(kind, fact, &pr, q, &set).value);
    let label = format!("{kind:?} {fact:?} ard={ard}");
    let linear = kind == KernelKind::Linear;
    let (worst, seen) = assert_gradient_matches(&grads, &fds, linear, (1e-4, 1e-6), &label);
    eprintln!(
        "{kind:?} {fact:?} ard={ard}: worst relative error {:.1e} ({})",
        worst.0, worst.1
    );
    // Every block the model has was checked.
    let mut expected = site_blocks(kind);
    if ard {
        expected.push(Block::LogArd);
    }
    assert_eq!(seen, expected);
}

#[test]
fn every_block_matches_central_differences_for_every_kernel_and_ard_mode() {
    for (kind, fact) in SETUPS {
        for ard in [false, true] {
            for sampled in [false, true] {
                let pr = problem(0, kind, ard);
                let mut rng = ChaCha8Rng::seed_from_u64(5);
                let terms = if sampled {
                    terms_sampled(&pr.positives, K, 2, 3.0, &mut rng)
                } else {
                    terms_all(&pr.positives, K, 3.0)
                };
                check_gradients(kind, fact, ard, &terms, 21 + sampled as u64);
            }
        }
    }
}

#[test]
fn subspace_and_inducing_paths_agree_under_ard() {
    for seed in [3, 4] {
        let pr = problem(seed, KernelKind::Linear, true);
        let dense = TermSet::AllLabels {
            positives: &pr.positives,
            scale: 2.0,
        };
        let c = eval(
            KernelKind::Linear,
            Factorisation::Inducing,
            &pr,
            &pr.params,
            &dense,
        );
        let j = eval(
            KernelKind::Linear,
            Factorisation::LowRank,
            &pr,
            &pr.params,
            &dense,
        );
        let d = max_rel_diff(&c, &j, 1e-3);
        assert!(d <= 1e-8, "relative difference {d:e}");
        // Auto still takes the subspace path under ARD (R ≤ ¾M), bit for bit.
        let auto = eval(
            KernelKind::Linear,
            Factorisation::Auto,
            &pr,
            &pr.params,
            &dense,
        );
        assert_eq!(auto.value.to_bits(), j.value.to_bits());
        assert_eq!(auto.grads, j.grads);
    }
}

#[test]
fn unit_ard_weights_equal_the_model_without_ard() {
    for (kind, fact) in SETUPS {
        let pr = problem(7, kind, false);
        let dense = TermSet::AllLabels {
            positives: &pr.positives,
            scale: 1.5,
        };
        let plain = eval(kind, fact, &pr, &pr.params, &dense);
        let mut with_ard = pr.params.clone();
        with_ard.kernel.log_ard = vec![0.0; pr.params.a.ncols()];
        let ard = eval(kind, fact, &pr, &with_ard, &dense);
        assert_eq!(
            ard.value.to_bits(),
            plain.value.to_bits(),
            "{kind:?} {fact:?}"
        );
        let (mut g, mut p) = (ard.grads.clone(), plain.grads.clone());
        // Every shared block bit for bit; the ARD weights add their own gradient.
        for idx in 0..flat_len(&plain.grads) {
            let (block, x) = flat_entry(&mut g, idx);
            let x = *x;
            assert_eq!(
                x.to_bits(),
                flat_entry(&mut p, idx).1.to_bits(),
                "{kind:?} {fact:?} {block}[{idx}]"
            );
        }
        assert_eq!(ard.grads.kernel.log_ard.len(), pr.params.a.ncols());
        assert!(ard.grads.kernel.log_ard.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn exact_bound_pieces_and_prediction_serve_every_kernel_and_ard_mode() {
    let lik = BernoulliLogistic::new(20).unwrap();
    for kind in [
        KernelKind::Linear,
        KernelKind::SquaredExponential,
        KernelKind::SePlusLinear,
    ] {
        for ard in [false, true] {
            let pr = problem(9, kind, ard);
            let x = pr.x();
            let dense = TermSet::AllLabels {
                positives: &pr.positives,
                scale: 1.0,
            };
            let scratch = Scratch::new();
            let full = eval(kind, Factorisation::Auto, &pr, &pr.params, &dense);
            let expected = expected_loglik(kind, &pr.params, &x, &dense, &lik, &scratch).unwrap();
            let kl = kl_total(kind, &pr.params, pr.kt.as_ref(), &scratch).unwrap();
            let bound = expected - kl;
            assert!(
                (bound - full.value).abs() <= 1e-10 * full.value.abs(),
                "{kind:?} ard={ard}: {bound} vs {}",
                full.value
            );
            // Prediction's means are the bound's utilities: f̄ of the predictor against the
            // ranking-only mean, and variances non-negative.
            let predictor = Predictor::new(kind, &pr.params, pr.kt.as_ref()).unwrap();
            let (mean, var) = predictor.mean_and_variance(&x);
            let plain = fsgp::model::predictive::mean_utilities(kind, &pr.params, &x).unwrap();
            assert!((&mean - &plain).norm_max() <= 1e-12 * (1.0 + plain.norm_max()));
            assert!((0..var.ncols()).all(|j| var.col(j).iter().all(|v| *v >= 0.0)));
        }
    }
    // Parameters without σ_lin² are refused for SE + linear, with a message.
    let mut pr = problem(9, KernelKind::SePlusLinear, false);
    pr.params.kernel.log_lin2 = None;
    let e = Predictor::new(KernelKind::SePlusLinear, &pr.params, pr.kt.as_ref())
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("σ_lin²"), "{e:#}");
}
