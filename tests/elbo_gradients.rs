//! The minibatch bound's analytic gradient against central finite differences, for both
//! kernels, all and sampled negatives, every parameter; and unbiasedness of the sampled
//! bound.

use faer::Mat;
use fsgp::model::elbo::{evaluate, flat_entry, flat_len, terms_all, terms_sampled, Params, Term};
use fsgp::model::kernel::{BasisInputs, KernelKind, KernelParams};
use fsgp::model::likelihood::BernoulliLogistic;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Problem {
    kxx: Mat<f64>,
    norms: Vec<f64>,
    kt: Mat<f64>,
    positives: Vec<Vec<u32>>,
    params: Params,
}

const K: usize = 7;

fn problem(seed: u64) -> Problem {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // R < M, so the linear K_Z is singular as in real runs.
    let (m, r, b, p) = (5, 3, 4, 2);
    let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
    let kxx = Mat::from_fn(b, r, |_, _| u(1.0));
    let norms = (0..b)
        .map(|i| (0..r).map(|k| kxx[(i, k)].powi(2)).sum::<f64>() + 0.2)
        .collect();
    let params = Params {
        a: Mat::from_fn(m, r, |_, _| u(1.0)),
        mu: Mat::from_fn(m, p, |_, _| u(1.0)),
        rho: Mat::from_fn(m, p, |_, _| u(2.0)),
        phi: Mat::from_fn(K, p, |_, _| u(1.5)),
        bias: (0..K).map(|_| u(1.0)).collect(),
        kernel: KernelParams {
            log_sf2: u(0.5),
            log_ell: u(0.5),
        },
    };
    let positives = vec![vec![0, 3], vec![], vec![6], vec![1, 2, 5]];
    Problem {
        kxx,
        norms,
        kt: Mat::identity(r, r),
        positives,
        params,
    }
}

fn value(
    kind: KernelKind,
    pr: &Problem,
    params: &Params,
    terms: &[Term],
    lik: &BernoulliLogistic,
) -> f64 {
    let x = BasisInputs {
        kxx_b: pr.kxx.as_ref(),
        sq_norms: &pr.norms,
        k_tilde: pr.kt.as_ref(),
    };
    evaluate(kind, params, &x, terms, lik).unwrap().value
}

#[test]
fn analytic_gradient_matches_central_differences_for_every_parameter() {
    let lik = BernoulliLogistic::new(20).unwrap();
    for kind in [KernelKind::Linear, KernelKind::SquaredExponential] {
        for sampled in [false, true] {
            let pr = problem(if sampled { 11 } else { 12 });
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            let terms = if sampled {
                terms_sampled(&pr.positives, K, 2, 3.0, &mut rng)
            } else {
                terms_all(&pr.positives, K, 3.0)
            };
            let x = BasisInputs {
                kxx_b: pr.kxx.as_ref(),
                sq_norms: &pr.norms,
                k_tilde: pr.kt.as_ref(),
            };
            let mut grads = evaluate(kind, &pr.params, &x, &terms, &lik).unwrap().grads;
            // h balances truncation (∝ h²) against the rounding of F (∝ ε|F|/h).
            let h = 2e-5;
            let mut worst = (0.0f64, "");
            for idx in 0..flat_len(&pr.params) {
                let (name, g) = flat_entry(&mut grads, idx);
                let analytic = *g;
                if kind == KernelKind::Linear && name == "log ℓ" {
                    assert_eq!(analytic, 0.0);
                    continue;
                }
                let (mut up, mut dn) = (pr.params.clone(), pr.params.clone());
                *flat_entry(&mut up, idx).1 += h;
                *flat_entry(&mut dn, idx).1 -= h;
                let fd = (value(kind, &pr, &up, &terms, &lik)
                    - value(kind, &pr, &dn, &terms, &lik))
                    / (2.0 * h);
                let rel = (analytic - fd).abs() / analytic.abs().max(fd.abs()).max(1e-4);
                if rel > worst.0 {
                    worst = (rel, name);
                }
                assert!(
                    rel <= 1e-6,
                    "{kind:?} sampled={sampled} {name}[{idx}]: analytic {analytic} vs fd {fd}"
                );
            }
            eprintln!(
                "{kind:?} sampled={sampled}: worst relative error {:.2e} ({})",
                worst.0, worst.1
            );
        }
    }
}

#[test]
fn sampled_terms_are_distinct_negatives_with_the_right_weight() {
    let positives = vec![vec![1, 4, 5], vec![], vec![0, 9]];
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..200 {
        let terms = terms_sampled(&positives, 10, 4, 2.0, &mut rng);
        for (i, pos) in positives.iter().enumerate() {
            let negs: Vec<&Term> = terms
                .iter()
                .filter(|t| t.row as usize == i && t.y < 0.0)
                .collect();
            assert_eq!(negs.len(), 4);
            let mut labels: Vec<u32> = negs.iter().map(|t| t.label).collect();
            labels.dedup();
            assert_eq!(labels.len(), 4, "distinct and sorted");
            assert!(labels.iter().all(|l| !pos.contains(l) && *l < 10));
            let n_neg = 10 - pos.len();
            assert!(negs
                .iter()
                .all(|t| (t.weight - 2.0 * n_neg as f64 / 4.0).abs() < 1e-12));
            assert_eq!(
                terms
                    .iter()
                    .filter(|t| t.row as usize == i && t.y > 0.0)
                    .count(),
                pos.len()
            );
        }
    }
    // Every negative is reachable.
    let mut seen = [false; 10];
    for _ in 0..500 {
        for t in terms_sampled(&positives, 10, 1, 1.0, &mut rng) {
            if t.row == 0 && t.y < 0.0 {
                seen[t.label as usize] = true;
            }
        }
    }
    assert_eq!(
        seen,
        [true, false, true, true, false, false, true, true, true, true]
    );
}

#[test]
fn sampled_bound_is_unbiased() {
    let lik = BernoulliLogistic::new(20).unwrap();
    let pr = problem(21);
    let exact = value(
        KernelKind::Linear,
        &pr,
        &pr.params,
        &terms_all(&pr.positives, K, 1.0),
        &lik,
    );
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let n = 40000;
    let samples: Vec<f64> = (0..n)
        .map(|_| {
            value(
                KernelKind::Linear,
                &pr,
                &pr.params,
                &terms_sampled(&pr.positives, K, 2, 1.0, &mut rng),
                &lik,
            )
        })
        .collect();
    let mean = samples.iter().sum::<f64>() / n as f64;
    let sd = (samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
    let se = sd / (n as f64).sqrt();
    eprintln!("exact {exact:.6}, sampled mean {mean:.6} ± {se:.6} (sd {sd:.4})");
    assert!(sd > 0.0, "sampling must vary the bound");
    assert!(
        (mean - exact).abs() < 4.0 * se,
        "mean {mean} vs exact {exact} (se {se})"
    );
}
