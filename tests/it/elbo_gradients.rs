//! The minibatch bound's analytic gradient against central finite differences, for both
//! kernels, all and sampled negatives, every parameter; the dense all-labels path against
//! the list of all terms; skipped kernel gradients; the forward-only bound; independence
//! from the thread count; and unbiasedness of the sampled bound.

use crate::common;
use common::model::*;
use faer::Mat;
use fsgp::model::bound::objective::{
    bound_and_grads, expected_loglik, kl_total, BoundAndGrads, BoundOptions,
};
use fsgp::model::bound::terms::{
    terms_all, terms_sampled, terms_stratified, terms_stratified_rest, Term, TermSet,
};
use fsgp::model::kernel::{BasisInputs, KernelKind, KernelParams};
use fsgp::model::likelihood::logistic::BernoulliLogistic;
use fsgp::model::params::{Params, QParams};
use fsgp::model::qu::conditional::Factorisation;
use fsgp::model::scratch::Scratch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const K: usize = LABELS;

/// The binary gradient problem of seed `seed` ([`labelled_problem`]) as it is.
fn problem(seed: u64) -> Problem {
    labelled_problem(seed, |_, _| {})
}

/// Every (kernel, factorisation) pair the model supports: the linear kernel through C_p and
/// through the subspace J_p, the squared exponential through C_p.
const SETUPS: [(KernelKind, Factorisation); 3] = [
    (KernelKind::Linear, Factorisation::Inducing),
    (KernelKind::Linear, Factorisation::LowRank),
    (KernelKind::SquaredExponential, Factorisation::Inducing),
];

fn opts_for(factorisation: Factorisation) -> BoundOptions {
    BoundOptions {
        factorisation,
        ..BoundOptions::default()
    }
}

fn value(
    (kind, fact): (KernelKind, Factorisation),
    pr: &Problem,
    params: &Params,
    terms: &[Term],
    lik: &BernoulliLogistic,
) -> f64 {
    bound_and_grads(
        kind,
        params,
        &pr.x(),
        &TermSet::List(terms),
        lik,
        &opts_for(fact),
        &Scratch::new(),
    )
    .unwrap()
    .value
}

#[test]
fn analytic_gradient_matches_central_differences_for_every_parameter() {
    let lik = BernoulliLogistic::new(20).unwrap();
    for setup in SETUPS {
        let (kind, fact) = setup;
        for sampled in [false, true] {
            let pr = problem(if sampled { 11 } else { 12 });
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            let terms = if sampled {
                terms_sampled(&pr.positives, K, 2, 3.0, &mut rng)
            } else {
                terms_all(&pr.positives, K, 3.0)
            };
            let grads = bound_and_grads(
                kind,
                &pr.params,
                &pr.x(),
                &TermSet::List(&terms),
                &lik,
                &opts_for(fact),
                &Scratch::new(),
            )
            .unwrap()
            .grads;
            // h balances truncation (∝ h²) against the rounding of F (∝ ε|F|/h).
            let h = 2e-5;
            let fds = central_differences(&pr.params, h, |q| value(setup, &pr, q, &terms, &lik));
            let label = format!("{kind:?} {fact:?} sampled={sampled}");
            let linear = kind == KernelKind::Linear;
            let (worst, _) = assert_gradient_matches(&grads, &fds, linear, (1e-4, 1e-6), &label);
            eprintln!(
                "{kind:?} {fact:?} sampled={sampled}: worst relative error {:.2e} ({})",
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

/// The mean of 40 000 draws of a sampled bound on the linear kernel's test problem lies
/// within 4 standard errors of the all-negatives bound (and the draws vary).
fn assert_unbiased(
    name: &str,
    seed: u64,
    draw: impl Fn(&[Vec<u32>], &mut ChaCha8Rng) -> Vec<Term>,
) {
    let lik = BernoulliLogistic::new(20).unwrap();
    let pr = problem(21);
    let kind = (KernelKind::Linear, Factorisation::Auto);
    let exact = value(
        kind,
        &pr,
        &pr.params,
        &terms_all(&pr.positives, K, 1.0),
        &lik,
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = 40000;
    let samples: Vec<f64> = (0..n)
        .map(|_| value(kind, &pr, &pr.params, &draw(&pr.positives, &mut rng), &lik))
        .collect();
    let mean = samples.iter().sum::<f64>() / n as f64;
    let sd = (samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
    let se = sd / (n as f64).sqrt();
    eprintln!("exact {exact:.6}, {name} mean {mean:.6} ± {se:.6} (sd {sd:.4})");
    assert!(sd > 0.0, "sampling must vary the bound");
    assert!(
        (mean - exact).abs() < 4.0 * se,
        "{name}: mean {mean} vs exact {exact} (se {se})"
    );
}

#[test]
fn sampled_bound_is_unbiased() {
    assert_unbiased("sampled", 8, |pos, rng| terms_sampled(pos, K, 2, 1.0, rng));
}

/// The stratified sample (`--frequent-negatives`): two labels in every row's bound exactly
/// and two of the others sampled.
#[test]
fn stratified_bound_is_unbiased() {
    assert_unbiased("stratified", 9, |pos, rng| {
        terms_stratified(pos, K, &[0, 3], 2, 1.0, rng)
    });
}

fn dense(pr: &Problem, scale: f64) -> TermSet<'_> {
    TermSet::AllLabels {
        positives: &pr.positives,
        scale,
    }
}

/// The bound and gradients of `pr`'s parameters on `terms` (a 20-point logistic quadrature,
/// a fresh scratch).
fn evaluated(
    kind: KernelKind,
    pr: &Problem,
    x: &BasisInputs<'_>,
    terms: &TermSet<'_>,
    opts: &BoundOptions,
) -> BoundAndGrads {
    let lik = BernoulliLogistic::new(20).unwrap();
    bound_and_grads(kind, &pr.params, x, terms, &lik, opts, &Scratch::new()).unwrap()
}

#[test]
fn dense_all_labels_path_equals_the_list_of_all_terms() {
    for kind in [KernelKind::Linear, KernelKind::SquaredExponential] {
        for seed in [12, 13] {
            let pr = problem(seed);
            let x = pr.x();
            let list = terms_all(&pr.positives, K, 3.0);
            let opts = BoundOptions::default();
            let a = evaluated(kind, &pr, &x, &TermSet::List(&list), &opts);
            let b = evaluated(kind, &pr, &x, &dense(&pr, 3.0), &opts);
            let d = max_rel_diff(&a, &b, 1e-300);
            assert!(
                d <= 1e-12,
                "{kind:?} seed {seed}: relative difference {d:e}"
            );
        }
    }
}

/// The stratified sample in two parts (the frequent labels of every row by the dense path,
/// the rest as a list) against the one list of the same sample: the same bound and
/// gradients, for every kernel and factorisation.
#[test]
fn stratified_dense_part_plus_its_rest_equals_the_list_of_the_same_sample() {
    let frequent = [0u32, 3];
    for (kind, fact) in SETUPS {
        for seed in [14, 15] {
            let pr = problem(seed);
            let x = pr.x();
            assert!(
                pr.positives.iter().flatten().any(|k| frequent.contains(k)),
                "a frequent label is some row's positive"
            );
            let rng = || ChaCha8Rng::seed_from_u64(seed);
            let list = terms_stratified(&pr.positives, K, &frequent, 2, 3.0, &mut rng());
            let rest = terms_stratified_rest(&pr.positives, K, &frequent, 2, 3.0, &mut rng());
            assert!(rest.iter().all(|t| !frequent.contains(&t.label)));
            let opts = opts_for(fact);
            let a = evaluated(kind, &pr, &x, &TermSet::List(&list), &opts);
            let split = TermSet::Stratified {
                frequent: &frequent,
                positives: &pr.positives,
                scale: 3.0,
                rest: &rest,
            };
            let b = evaluated(kind, &pr, &x, &split, &opts);
            let d = max_rel_diff(&a, &b, 1e-300);
            assert!(
                d <= 1e-12,
                "{kind:?} {fact:?} seed {seed}: relative difference {d:e}"
            );
        }
    }
}

#[test]
fn dense_all_labels_gradient_matches_central_differences() {
    let lik = BernoulliLogistic::new(20).unwrap();
    for (kind, fact) in SETUPS {
        let pr = problem(14);
        let opts = opts_for(fact);
        let eval = |params: &Params| {
            bound_and_grads(
                kind,
                params,
                &pr.x(),
                &dense(&pr, 2.0),
                &lik,
                &opts,
                &Scratch::new(),
            )
            .unwrap()
        };
        let grads = eval(&pr.params).grads;
        let h = 2e-5;
        let fds = central_differences(&pr.params, h, |q| eval(q).value);
        let label = format!("{kind:?} {fact:?} dense");
        let linear = kind == KernelKind::Linear;
        assert_gradient_matches(&grads, &fds, linear, (1e-4, 1e-6), &label);
    }
}

#[test]
fn skipping_kernel_gradients_leaves_the_other_blocks_unchanged() {
    let lik = BernoulliLogistic::new(20).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for (kind, fact) in SETUPS {
        let pr = problem(15);
        let x = pr.x();
        let sampled = terms_sampled(&pr.positives, K, 2, 3.0, &mut rng);
        for terms in [dense(&pr, 3.0), TermSet::List(&sampled)] {
            let full = bound_and_grads(
                kind,
                &pr.params,
                &x,
                &terms,
                &lik,
                &opts_for(fact),
                &Scratch::new(),
            )
            .unwrap();
            let skip = BoundOptions {
                kernel_grads: false,
                factorisation: fact,
            };
            let part = bound_and_grads(kind, &pr.params, &x, &terms, &lik, &skip, &Scratch::new())
                .unwrap();
            assert_eq!(part.value, full.value);
            assert_eq!(part.grads.q, full.grads.q);
            assert_eq!(part.grads.phi, full.grads.phi);
            assert_eq!(part.grads.bias, full.grads.bias);
            assert!(part.grads.a.norm_max() == 0.0 && full.grads.a.norm_max() > 0.0);
            assert_eq!(part.grads.kernel.log_sf2, 0.0);
            assert_eq!(part.grads.kernel.log_ell, 0.0);
        }
    }
}

#[test]
fn forward_only_bound_plus_kl_equals_the_evaluated_bound() {
    let lik = BernoulliLogistic::new(20).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for kind in [KernelKind::Linear, KernelKind::SquaredExponential] {
        let pr = problem(16);
        let x = pr.x();
        let sampled = terms_sampled(&pr.positives, K, 3, 1.5, &mut rng);
        for terms in [dense(&pr, 1.0), TermSet::List(&sampled)] {
            let ev = bound_and_grads(
                kind,
                &pr.params,
                &x,
                &terms,
                &lik,
                &BoundOptions::default(),
                &Scratch::new(),
            )
            .unwrap();
            let expected =
                expected_loglik(kind, &pr.params, &x, &terms, &lik, &Scratch::new()).unwrap();
            let kl = kl_total(kind, &pr.params, pr.kt.as_ref(), &Scratch::new()).unwrap();
            assert_eq!(kl, ev.kl, "{kind:?}: the KL is computed in the same order");
            let value = expected - kl;
            assert!(
                (value - ev.value).abs() <= 1e-12 * ev.value.abs(),
                "{kind:?}: {value} vs {}",
                ev.value
            );
        }
    }
}

/// A problem large enough for several GP chunks and multi-threaded GEMMs.
fn larger_problem() -> Problem {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let (m, r, b, p, k) = (96, 40, 80, 8, 300);
    let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
    let (kxx, norms) = random_rows(&mut u, b, r, 0.4);
    let params = Params {
        logit_epsilon: None,
        a: Mat::from_fn(m, r, |_, _| u(0.4)),
        q: QParams::Sites {
            mu: Mat::from_fn(m, p, |_, _| u(1.0)),
            rho: Mat::from_fn(m, p, |_, _| u(2.0)),
        },
        phi: Mat::from_fn(k, p, |_, _| u(1.0)),
        bias: (0..k).map(|_| u(1.0) - 2.0).collect(),
        kernel: KernelParams::new(u(0.5), u(0.5) + 0.5),
        amortiser: None,
    };
    let positives = (0..b)
        .map(|i| {
            let mut v: Vec<u32> = (0..(i % 6) as u32)
                .map(|j| (j * 37 + i as u32) % k as u32)
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    Problem {
        kxx,
        norms,
        kt: Mat::identity(r, r),
        positives,
        params,
    }
}

/// The bound and its gradients of `pr` at its parameters on a pool of `threads` threads.
fn on_threads(
    threads: usize,
    (kind, fact): (KernelKind, Factorisation),
    pr: &Problem,
    x: &BasisInputs<'_>,
    terms: &TermSet<'_>,
    lik: &BernoulliLogistic,
) -> BoundAndGrads {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        bound_and_grads(
            kind,
            &pr.params,
            x,
            terms,
            lik,
            &opts_for(fact),
            &Scratch::new(),
        )
        .unwrap()
    })
}

#[test]
fn results_are_bitwise_identical_for_one_and_two_threads() {
    let lik = BernoulliLogistic::new(20).unwrap();
    let pr = larger_problem();
    let x = pr.x();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let k = pr.params.phi.nrows();
    let sampled = terms_sampled(&pr.positives, k, 20, 2.0, &mut rng);
    let frequent = [1u32, 4, 6];
    let rest = terms_stratified_rest(&pr.positives, k, &frequent, 20, 2.0, &mut rng);
    let stratified = TermSet::Stratified {
        frequent: &frequent,
        positives: &pr.positives,
        scale: 2.0,
        rest: &rest,
    };
    for (kind, fact) in SETUPS {
        for terms in [dense(&pr, 2.0), TermSet::List(&sampled), stratified] {
            let run = |threads| on_threads(threads, (kind, fact), &pr, &x, &terms, &lik);
            let (one, two) = (run(1), run(2));
            assert_eq!(
                one.value.to_bits(),
                two.value.to_bits(),
                "{kind:?} {fact:?}"
            );
            assert_eq!(one.grads, two.grads, "{kind:?} {fact:?}");
        }
    }
}

/// Every term of [`larger_problem`] listed four times at a quarter of the weight: 96 000
/// terms, so the list path accumulates its gradients in several segments of whole labels
/// (each label's four copies fall in one). The sum is the dense path's to rounding, and the
/// same bits on one thread and two. (The dense path sums each term once, the list four
/// quarters: 1e-10 relative allows their rounding.)
#[test]
fn list_path_segments_sum_to_the_dense_path_on_any_thread_count() {
    let lik = BernoulliLogistic::new(20).unwrap();
    let pr = larger_problem();
    let x = pr.x();
    let k = pr.params.phi.nrows();
    let once = terms_all(&pr.positives, k, 3.0 / 4.0);
    let terms: Vec<Term> = (0..4).flat_map(|_| once.iter().copied()).collect();
    assert!(terms.len() > 2 * 32_768, "{} terms", terms.len());
    for (kind, fact) in SETUPS {
        let run =
            |threads, set: &TermSet<'_>| on_threads(threads, (kind, fact), &pr, &x, set, &lik);
        let list = TermSet::List(&terms);
        let (one, two) = (run(1, &list), run(2, &list));
        assert_eq!(
            one.value.to_bits(),
            two.value.to_bits(),
            "{kind:?} {fact:?}"
        );
        assert_eq!(one.grads, two.grads, "{kind:?} {fact:?}");
        let dense_bound = run(2, &dense(&pr, 3.0));
        let d = max_rel_diff(&two, &dense_bound, 1e-300);
        assert!(d <= 1e-10, "{kind:?} {fact:?}: relative difference {d:e}");
    }
}

#[test]
fn subspace_and_inducing_paths_give_the_same_bound_and_gradients() {
    let lik = BernoulliLogistic::new(20).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    for (name, pr) in [("small", problem(17)), ("larger", larger_problem())] {
        let x = pr.x();
        let k = pr.params.phi.nrows();
        let sampled = terms_sampled(&pr.positives, k, 3, 2.0, &mut rng);
        for terms in [dense(&pr, 2.0), TermSet::List(&sampled)] {
            let eval = |fact| {
                bound_and_grads(
                    KernelKind::Linear,
                    &pr.params,
                    &x,
                    &terms,
                    &lik,
                    &opts_for(fact),
                    &Scratch::new(),
                )
                .unwrap()
            };
            let (c, j) = (eval(Factorisation::Inducing), eval(Factorisation::LowRank));
            let d = max_rel_diff(&c, &j, 1e-300);
            assert!(d <= 1e-8, "{name}: relative difference {d:e}");
            assert!((c.kl - j.kl).abs() <= 1e-10 * c.kl.abs());
            // Auto takes the subspace path here (R ≤ ¾M), bit for bit.
            let auto = eval(Factorisation::Auto);
            assert_eq!(auto.value.to_bits(), j.value.to_bits(), "{name}");
            assert_eq!(auto.grads, j.grads, "{name}");
        }
    }
}

#[test]
fn subspace_path_is_refused_where_it_does_not_apply() {
    let lik = BernoulliLogistic::new(20).unwrap();
    let mut pr = problem(18);
    let x = pr.x();
    let terms = dense(&pr, 1.0);
    let se = bound_and_grads(
        KernelKind::SquaredExponential,
        &pr.params,
        &x,
        &terms,
        &lik,
        &opts_for(Factorisation::LowRank),
        &Scratch::new(),
    );
    assert!(format!("{:#}", se.unwrap_err()).contains("linear kernel"));
    // A singular K_X̃: refused when forced, the inducing path under Auto.
    let r = pr.kt.nrows();
    pr.kt = Mat::from_fn(
        r,
        r,
        |i, j| if i == 0 || j == 0 { 0.0 } else { pr.kt[(i, j)] },
    );
    let x = pr.x();
    let terms = dense(&pr, 1.0);
    let lin = |fact| {
        bound_and_grads(
            KernelKind::Linear,
            &pr.params,
            &x,
            &terms,
            &lik,
            &opts_for(fact),
            &Scratch::new(),
        )
    };
    assert!(format!("{:#}", lin(Factorisation::LowRank).unwrap_err()).contains("K_X̃"));
    let (auto, inducing) = (
        lin(Factorisation::Auto).unwrap(),
        lin(Factorisation::Inducing).unwrap(),
    );
    assert_eq!(auto.value.to_bits(), inducing.value.to_bits());
}

#[test]
fn one_scratch_reused_across_shapes_gives_the_same_bits_as_fresh_ones() {
    // The arena hands out buffers with stale contents from earlier calls (of other shapes
    // too, and the gradients a caller recycled); every user overwrites what it reads, so
    // reuse must not change a bit.
    let lik = BernoulliLogistic::new(20).unwrap();
    let shared = Scratch::new();
    let (small, large) = (problem(19), larger_problem());
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    for round in 0..2 {
        for pr in [&small, &large] {
            let x = pr.x();
            let k = pr.params.phi.nrows();
            let sampled = terms_sampled(&pr.positives, k, 3, 2.0, &mut rng);
            for (kind, fact) in SETUPS {
                // The list twice: the second takes the first's buffers.
                let list = TermSet::List(&sampled);
                for terms in [dense(pr, 2.0), list, list] {
                    let opts = opts_for(fact);
                    let eval = |scratch: &Scratch| {
                        bound_and_grads(kind, &pr.params, &x, &terms, &lik, &opts, scratch).unwrap()
                    };
                    let (reused, fresh) = (eval(&shared), eval(&Scratch::new()));
                    assert_eq!(
                        reused.value.to_bits(),
                        fresh.value.to_bits(),
                        "round {round}"
                    );
                    assert_eq!(reused.grads, fresh.grads, "{kind:?} {fact:?} round {round}");
                    // Its gradient matrices go back to the arena as a stepping caller's do:
                    // the next evaluation of this shape writes into them (Φ's [K×P] with
                    // the last one's values in it).
                    reused.recycle(&shared);
                    let el = |scratch: &Scratch| {
                        expected_loglik(kind, &pr.params, &x, &terms, &lik, scratch).unwrap()
                    };
                    assert_eq!(el(&shared).to_bits(), el(&Scratch::new()).to_bits());
                }
            }
        }
    }
}
