//! Ranking metrics (`fsgp::metrics`): hand-worked cases, an independent dense
//! re-implementation on random data, exact chunking/merge invariance, propensities.

use std::sync::Arc;

use fsgp::metrics::{
    inverse_propensity, ranking_metrics, LabellessRows, Metrics, MetricsAccumulator,
    PropensityParams,
};
use proptest::prelude::*;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "{what}@{}: got {g:.17}, want {w:.17}",
            k + 1
        );
    }
}

/// d2 = 1/log2(3): the DCG discount of rank 2 (rank 1: 1, rank 3: 1/log2(4) = 1/2).
const D2: f64 = 0.630_929_753_571_457_5;
/// IDCG@2 = 1 + 1/log2(3).
const I2: f64 = 1.0 + D2;

/// Three rows, k_max = 3, inverse propensities w = [2, 1, 4, 4, 1] (labels 2 and 3 tie).
///
/// Row A: truth {2, 0}, pred [0, 1, 2]: hits at ranks 1 and 3.
///   hits@k = 1, 1, 2; DCG@k = 1, 1, 1.5; IDCG (|y| = 2) = 1, I2, I2.
///   PS numerator Σ w·y = 2, 2, 6; best (weights sorted 4, 2) = 4, 6, 6.
///   PSDCG = 2, 2, 2 + 4/2 = 4; best PSDCG = 4, 4 + 2·d2, 4 + 2·d2.
/// Row B: truth {3, 2} (tied weights 4, 4), pred [3] (shorter than k): hit at rank 1.
///   hits@k = 1, 1, 1; DCG = 1, 1, 1; IDCG = 1, I2, I2.
///   PS numerator = 4, 4, 4; best = 4, 8, 8; PSDCG = 4, 4, 4; best = 4, 4 + 4·d2, same.
/// Row C: no true label, pred [1, 2].
fn hand_rows() -> Vec<(Vec<u32>, Vec<u32>)> {
    vec![
        (vec![0, 1, 2], vec![2, 0]),
        (vec![3], vec![3, 2]),
        (vec![1, 2], vec![]),
    ]
}

fn hand_metrics(policy: LabellessRows) -> Metrics {
    let rows = hand_rows();
    ranking_metrics(
        3,
        vec![2.0, 1.0, 4.0, 4.0, 1.0],
        policy,
        rows.iter().map(|(p, t)| (p.as_slice(), t.as_slice())),
    )
    .unwrap()
}

#[test]
fn hand_worked_count_as_zero() {
    let m = hand_metrics(LabellessRows::CountAsZero);
    assert_eq!((m.rows, m.labelless_rows, m.test_labels), (3, 1, 3));
    // P@k = Σ hits@k / (k·3): 2/3, 2/6, 3/9.
    close(&m.p_at, &[2.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0], 1e-15, "P");
    // nDCG@1 = (1 + 1 + 0)/3; @2 = (1/I2 + 1/I2 + 0)/3; @3 = (1.5/I2 + 1/I2 + 0)/3.
    close(
        &m.ndcg_at,
        &[2.0 / 3.0, 2.0 / I2 / 3.0, 2.5 / I2 / 3.0],
        1e-15,
        "nDCG",
    );
    // PSP: ratio of sums over rows (pyxclib), not a mean of per-row ratios:
    // @1 (2+4)/(4+4) = 3/4; @2 (2+4)/(6+8) = 3/7; @3 (6+4)/(6+8) = 5/7.
    // (A mean of row ratios would give 5/12 at k = 2.)
    close(&m.psp_at, &[0.75, 3.0 / 7.0, 5.0 / 7.0], 1e-15, "PSP");
    // PSnDCG: Σ PSDCG/IDCG over Σ bestPSDCG/IDCG; both rows have the same IDCG here:
    // @1 (2+4)/(4+4); @2 (2+4)/(4+2·d2 + 4+4·d2); @3 (4+4)/(8 + 6·d2).
    close(
        &m.psndcg_at,
        &[0.75, 6.0 / (8.0 + 6.0 * D2), 8.0 / (8.0 + 6.0 * D2)],
        1e-15,
        "PSnDCG",
    );
    // Test labels {0, 2, 3}; label 0 hit at rank 1 (row A), 3 at rank 1 (row B),
    // 2 at rank 3 (row A).
    assert_eq!(m.covered_labels_at, vec![2, 2, 3]);
    close(
        &m.coverage_at,
        &[2.0 / 3.0, 2.0 / 3.0, 1.0],
        1e-15,
        "coverage",
    );
}

#[test]
fn hand_worked_skip() {
    let m = hand_metrics(LabellessRows::Skip);
    assert_eq!((m.rows, m.labelless_rows, m.test_labels), (3, 1, 3));
    assert_eq!(m.policy, LabellessRows::Skip);
    // Means over the 2 labelled rows: P = 2/2, 2/4, 3/6.
    close(&m.p_at, &[1.0, 0.5, 0.5], 1e-15, "P");
    close(&m.ndcg_at, &[1.0, 1.0 / I2, 1.25 / I2], 1e-15, "nDCG");
    // Ratios of sums: the label-less row adds 0 to numerator and denominator.
    let zero = hand_metrics(LabellessRows::CountAsZero);
    assert_eq!(m.psp_at, zero.psp_at);
    assert_eq!(m.psndcg_at, zero.psndcg_at);
    assert_eq!(m.covered_labels_at, zero.covered_labels_at);
}

#[test]
fn only_labelless_rows() {
    let rows: Vec<(Vec<u32>, Vec<u32>)> = vec![(vec![0, 1], vec![]), (vec![], vec![])];
    for policy in [LabellessRows::CountAsZero, LabellessRows::Skip] {
        let m = ranking_metrics(
            2,
            vec![1.0; 3],
            policy,
            rows.iter().map(|(p, t)| (p.as_slice(), t.as_slice())),
        )
        .unwrap();
        assert_eq!((m.rows, m.labelless_rows, m.test_labels), (2, 2, 0));
        for v in [&m.p_at, &m.ndcg_at, &m.psp_at, &m.psndcg_at, &m.coverage_at] {
            assert_eq!(v, &vec![0.0, 0.0], "{policy:?}");
        }
    }
}

#[test]
fn fewer_positives_than_k() {
    // One true label, found at rank 2 of 4; k_max = 4, unit weights.
    // P@k = 0, 1/2, 1/3, 1/4. DCG@k = 0, d2, d2, d2; IDCG = IDCG@min(k, 1) = 1.
    // PSP@k = (0, 1, 1, 1) / best (1, 1, 1, 1).
    let m = ranking_metrics(
        4,
        vec![1.0; 10],
        LabellessRows::CountAsZero,
        [(&[5u32, 7, 1, 2][..], &[7u32][..])],
    )
    .unwrap();
    close(&m.p_at, &[0.0, 0.5, 1.0 / 3.0, 0.25], 1e-15, "P");
    close(&m.ndcg_at, &[0.0, D2, D2, D2], 1e-15, "nDCG");
    close(&m.psp_at, &[0.0, 1.0, 1.0, 1.0], 1e-15, "PSP");
    close(&m.psndcg_at, &[0.0, D2, D2, D2], 1e-15, "PSnDCG");
    assert_eq!(m.covered_labels_at, vec![0, 1, 1, 1]);
}

#[test]
fn predictions_shorter_than_k_are_misses() {
    // Truth {1, 2, 3}; only one prediction (a hit). P@3 = 1/3, not 1.
    // nDCG@3 = 1 / (1 + d2 + 1/2).
    let m = ranking_metrics(
        3,
        vec![1.0; 4],
        LabellessRows::CountAsZero,
        [(&[2u32][..], &[3u32, 1, 2][..])],
    )
    .unwrap();
    close(&m.p_at, &[1.0, 0.5, 1.0 / 3.0], 1e-15, "P");
    close(
        &m.ndcg_at,
        &[1.0, 1.0 / I2, 1.0 / (I2 + 0.5)],
        1e-15,
        "nDCG",
    );
    // No predictions at all.
    let m = ranking_metrics(
        2,
        vec![1.0; 4],
        LabellessRows::CountAsZero,
        [(&[][..], &[3u32][..])],
    )
    .unwrap();
    assert_eq!(m.p_at, vec![0.0, 0.0]);
    assert_eq!(m.covered_labels_at, vec![0, 0]);
    assert_eq!(m.test_labels, 1);
}

#[test]
fn labels_never_seen_in_training() {
    // counts = [5, 0, 3], N = 10, generic A = 0.55, B = 1.5:
    // C = (ln 10 − 1)·2.5^0.55 = 1.302585…·1.655268… = 2.156120895719132;
    // w(5) = 1 + C·6.5^−0.55, w(0) = 1 + C·1.5^−0.55 = 2.7251343234120733 (finite),
    // w(3) = 1 + C·4.5^−0.55.
    let params = PropensityParams::GENERIC;
    let w = params.inverse_propensity(&[5, 0, 3], 10);
    close(
        &w,
        &[1.7701419182205265, 2.7251343234120733, 1.9427710237221416],
        1e-14,
        "w",
    );
    let w0 = params.unseen_inverse_propensity(10);
    assert_eq!(w0, w[1]);

    // Label 7 is beyond the table: a hit when it is in the truth, weighted w(0).
    // Row: truth {7, 0}, pred [7, 9]: label 9 (also unknown) is a miss.
    // PSP@1 = w0 / max(w0, w(5)) = 1; PSP@2 = w0 / (w0 + w(5)).
    let mut acc = MetricsAccumulator::new(2, w.clone(), LabellessRows::CountAsZero)
        .unwrap()
        .with_unseen_inv_prop(w0)
        .unwrap();
    acc.add_row(&[7, 9], &[7, 0]).unwrap();
    let m = acc.finish();
    close(&m.p_at, &[1.0, 0.5], 1e-15, "P");
    close(&m.psp_at, &[1.0, w0 / (w0 + w[0])], 1e-15, "PSP");
    assert_eq!(m.test_labels, 2);
    assert_eq!(m.covered_labels_at, vec![1, 1]);

    // A different weight for unseen ids changes PSP: it is really used.
    let mut acc = MetricsAccumulator::new(2, w.clone(), LabellessRows::CountAsZero)
        .unwrap()
        .with_unseen_inv_prop(1.0)
        .unwrap();
    acc.add_row(&[7, 9], &[7, 0]).unwrap();
    // best@1 = w(5) = 1.77 > 1: PSP@1 = 1/w(5).
    close(
        &acc.finish().psp_at,
        &[1.0 / w[0], 1.0 / (1.0 + w[0])],
        1e-15,
        "PSP",
    );

    // Default for ids beyond the table: the largest entry, here w(0).
    let mut acc = MetricsAccumulator::new(2, w.clone(), LabellessRows::CountAsZero).unwrap();
    acc.add_row(&[7, 9], &[7, 0]).unwrap();
    assert_eq!(acc.finish(), m);
}

#[test]
fn inverse_propensity_hand_computed() {
    // A = 1, B = 1, N = 20: C = (ln 20 − 1)·2; w(n) = 1 + C/(n + 1).
    // ln 20 = 2.995732273553991 ⇒ w(0) = 2·ln 20 − 1, w(1) = ln 20, w(3) = 1 + C/4.
    let w = inverse_propensity(&[0, 1, 3], 20, 1.0, 1.0);
    close(
        &w,
        &[4.991464547107982, 2.995732273553991, 1.9978661367769954],
        1e-15,
        "w",
    );
    // Presets.
    assert_eq!(
        PropensityParams::GENERIC,
        PropensityParams { a: 0.55, b: 1.5 }
    );
    assert_eq!(
        PropensityParams::AMAZON,
        PropensityParams { a: 0.6, b: 2.6 }
    );
    assert_eq!(
        PropensityParams::WIKIPEDIA,
        PropensityParams { a: 0.5, b: 0.4 }
    );
    // Wikipedia, N = 100, n = 4: C = (ln 100 − 1)·1.4^0.5, w = 1 + C/√4.4.
    let c = (100f64.ln() - 1.0) * 1.4f64.sqrt();
    let w = PropensityParams::WIKIPEDIA.inverse_propensity(&[4], 100);
    close(&w, &[1.0 + c / 4.4f64.sqrt()], 1e-15, "wikipedia");
    // Rarer labels weigh more.
    let w = PropensityParams::AMAZON.inverse_propensity(&[0, 1, 10, 1000], 100_000);
    assert!(w.windows(2).all(|p| p[0] > p[1]) && w[3] > 1.0);
}

#[test]
fn duplicates_rejected_and_state_unchanged() {
    let mut acc = MetricsAccumulator::new(3, vec![1.0; 5], LabellessRows::CountAsZero).unwrap();
    acc.add_row(&[0, 1], &[1]).unwrap();
    let before = acc.finish();
    let err = acc.add_row(&[0, 1], &[3, 1, 3]).unwrap_err();
    assert!(
        err.to_string().contains("true label 3 appears twice"),
        "{err}"
    );
    let err = acc.add_row(&[1, 2, 1], &[1]).unwrap_err();
    assert!(err.to_string().contains("predicted label 1"), "{err}");
    // Duplicates past k_max are never read.
    acc.add_row(&[1, 2, 3, 1], &[1]).unwrap();
    let mut again = MetricsAccumulator::new(3, vec![1.0; 5], LabellessRows::CountAsZero).unwrap();
    again.add_row(&[0, 1], &[1]).unwrap();
    assert_eq!(again.finish(), before);
    again.add_row(&[1, 2, 3], &[1]).unwrap();
    assert_eq!(again.finish(), acc.finish());
    // evaluate names the row.
    let err = ranking_metrics(
        1,
        vec![1.0],
        LabellessRows::Skip,
        [(&[0u32][..], &[0u32][..]), (&[0u32][..], &[0u32, 0][..])],
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("test row 1"), "{err:#}");
}

#[test]
fn bad_configuration_rejected() {
    assert!(MetricsAccumulator::new(0, vec![1.0], LabellessRows::Skip).is_err());
    assert!(MetricsAccumulator::new(255, vec![1.0], LabellessRows::Skip).is_err());
    assert!(MetricsAccumulator::new(254, vec![1.0], LabellessRows::Skip).is_ok());
    assert!(MetricsAccumulator::new(2, vec![1.0, f64::NAN], LabellessRows::Skip).is_err());
    assert!(MetricsAccumulator::new(2, vec![0.0], LabellessRows::Skip).is_err());
    let a = MetricsAccumulator::new(2, vec![1.0, 2.0], LabellessRows::Skip).unwrap();
    let mut b = MetricsAccumulator::new(3, vec![1.0, 2.0], LabellessRows::Skip).unwrap();
    assert!(b.merge(&a).is_err());
    let mut c = MetricsAccumulator::new(2, vec![1.0, 2.5], LabellessRows::Skip).unwrap();
    assert!(c.merge(&a).is_err());
    let mut d = MetricsAccumulator::new(2, vec![1.0, 2.0], LabellessRows::CountAsZero).unwrap();
    assert!(d.merge(&a).is_err());
    // Same values in a different allocation merge fine.
    let mut e = MetricsAccumulator::new(2, vec![1.0, 2.0], LabellessRows::Skip).unwrap();
    e.merge(&a).unwrap();
}

#[test]
fn json_and_table() {
    let m = hand_metrics(LabellessRows::CountAsZero);
    let v: serde_json::Value = serde_json::from_str(&m.to_json()).unwrap();
    assert_eq!(v["rows"], 3);
    assert_eq!(v["policy"], "CountAsZero");
    assert_eq!(v["covered_labels_at"], serde_json::json!([2, 2, 3]));
    assert_eq!(v["p_at"][0].as_f64().unwrap(), m.p_at[0]);
    let t = m.to_table();
    assert_eq!(t, m.to_string());
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 7, "{t}");
    assert!(lines[1].contains("@1") && lines[1].contains("@3"), "{t}");
    // P: 66.67, 33.33, 33.33 %; PSP 75.00, 42.86, 71.43 %.
    assert!(
        lines[2].starts_with("P ") && lines[2].ends_with("66.67   33.33   33.33"),
        "{t}"
    );
    assert!(lines[4].ends_with("75.00   42.86   71.43"), "{t}");
    // Fixed width: every metric line has the same length.
    assert!(lines[2..].iter().all(|l| l.len() == lines[1].len()), "{t}");
}

// ---------------------------------------------------------------------------------------
// Independent re-implementation: dense vectors, direct formulas, no shared code.

struct Reference {
    p: Vec<f64>,
    ndcg: Vec<f64>,
    psp: Vec<f64>,
    psndcg: Vec<f64>,
    covered: Vec<u64>,
    test_labels: u64,
}

fn reference(
    k_max: usize,
    weights_dense: &[f64],
    policy: LabellessRows,
    rows: &[(Vec<u32>, Vec<u32>)],
) -> Reference {
    let n_labels = weights_dense.len();
    let mut p = vec![0.0; k_max];
    let mut ndcg = vec![0.0; k_max];
    let mut psp_num = vec![0.0; k_max];
    let mut psp_den = vec![0.0; k_max];
    let mut psn_num = vec![0.0; k_max];
    let mut psn_den = vec![0.0; k_max];
    let mut in_test = vec![false; n_labels];
    let mut hit_at = vec![vec![false; n_labels]; k_max];
    let mut counted = 0usize;
    for (pred, truth) in rows {
        let mut y = vec![0.0; n_labels];
        for &l in truth {
            y[l as usize] = 1.0;
            in_test[l as usize] = true;
        }
        let n_pos = truth.len();
        if n_pos > 0 || policy == LabellessRows::CountAsZero {
            counted += 1;
        }
        let mut best: Vec<f64> = (0..n_labels).map(|l| y[l] * weights_dense[l]).collect();
        best.sort_by(|a, b| b.partial_cmp(a).unwrap());
        for k in 1..=k_max {
            let top = &pred[..pred.len().min(k)];
            let hits: f64 = top.iter().map(|&l| y[l as usize]).sum();
            p[k - 1] += hits / k as f64;
            let dcg: f64 = top
                .iter()
                .enumerate()
                .map(|(i, &l)| y[l as usize] / ((i + 2) as f64).log2())
                .sum();
            let idcg: f64 = (1..=k.min(n_pos))
                .map(|r| 1.0 / ((r + 1) as f64).log2())
                .sum();
            let psdcg: f64 = top
                .iter()
                .enumerate()
                .map(|(i, &l)| y[l as usize] * weights_dense[l as usize] / ((i + 2) as f64).log2())
                .sum();
            let best_k = &best[..k.min(n_labels)];
            let best_dcg: f64 = best_k
                .iter()
                .enumerate()
                .map(|(i, &v)| v / ((i + 2) as f64).log2())
                .sum();
            psp_num[k - 1] += top
                .iter()
                .map(|&l| y[l as usize] * weights_dense[l as usize])
                .sum::<f64>();
            psp_den[k - 1] += best_k.iter().sum::<f64>();
            if n_pos > 0 {
                ndcg[k - 1] += dcg / idcg;
                psn_num[k - 1] += psdcg / idcg;
                psn_den[k - 1] += best_dcg / idcg;
            }
            for &l in top {
                if y[l as usize] == 1.0 {
                    hit_at[k - 1][l as usize] = true;
                }
            }
        }
    }
    let div = |a: f64, b: f64| if b == 0.0 { 0.0 } else { a / b };
    Reference {
        p: p.iter().map(|v| div(*v, counted as f64)).collect(),
        ndcg: ndcg.iter().map(|v| div(*v, counted as f64)).collect(),
        psp: psp_num
            .iter()
            .zip(&psp_den)
            .map(|(a, b)| div(*a, *b))
            .collect(),
        psndcg: psn_num
            .iter()
            .zip(&psn_den)
            .map(|(a, b)| div(*a, *b))
            .collect(),
        covered: hit_at
            .iter()
            .map(|h| h.iter().filter(|&&x| x).count() as u64)
            .collect(),
        test_labels: in_test.iter().filter(|&&x| x).count() as u64,
    }
}

/// Random rows over `n_labels` ids, of which only the first `n_known` have a propensity;
/// truth of 0..=max_true distinct labels, predictions of 0..=k_max+2 distinct labels.
fn random_rows(
    rng: &mut ChaCha8Rng,
    n_rows: usize,
    n_labels: u32,
    max_true: usize,
    k_max: usize,
) -> Vec<(Vec<u32>, Vec<u32>)> {
    let ids: Vec<u32> = (0..n_labels).collect();
    (0..n_rows)
        .map(|_| {
            let n_true = rng.random_range(0..=max_true);
            let truth: Vec<u32> = ids.choose_multiple(rng, n_true).copied().collect();
            let n_pred = rng.random_range(0..=k_max + 2).min(n_labels as usize);
            // Bias predictions towards the truth so that hits are common.
            let mut pred: Vec<u32> = Vec::new();
            while pred.len() < n_pred {
                let l = if !truth.is_empty() && rng.random_bool(0.5) {
                    truth[rng.random_range(0..truth.len())]
                } else {
                    rng.random_range(0..n_labels)
                };
                if !pred.contains(&l) {
                    pred.push(l);
                }
            }
            (pred, truth)
        })
        .collect()
}

#[test]
fn matches_dense_reference_on_random_data() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0001);
    for trial in 0..20 {
        let k_max = rng.random_range(1..=9);
        let n_labels = rng.random_range(5..40u32);
        let n_known = rng.random_range(1..=n_labels as usize);
        // Small counts: many ties in propensity.
        let counts: Vec<u64> = (0..n_known).map(|_| rng.random_range(0..6)).collect();
        let n_train = rng.random_range(20..500);
        let params = [
            PropensityParams::GENERIC,
            PropensityParams::AMAZON,
            PropensityParams::WIKIPEDIA,
        ][trial % 3];
        let w = params.inverse_propensity(&counts, n_train);
        let w_unseen = params.unseen_inverse_propensity(n_train);
        let mut dense = w.clone();
        dense.resize(n_labels as usize, w_unseen);
        let n_rows = rng.random_range(0..150);
        let rows = random_rows(&mut rng, n_rows, n_labels, 7, k_max);
        for policy in [LabellessRows::CountAsZero, LabellessRows::Skip] {
            let mut acc = MetricsAccumulator::new(k_max, w.clone(), policy)
                .unwrap()
                .with_unseen_inv_prop(w_unseen)
                .unwrap();
            for (p, t) in &rows {
                acc.add_row(p, t).unwrap();
            }
            let m = acc.finish();
            let r = reference(k_max, &dense, policy, &rows);
            let what = format!("trial {trial} {policy:?}");
            close(&m.p_at, &r.p, 1e-12, &format!("{what} P"));
            close(&m.ndcg_at, &r.ndcg, 1e-12, &format!("{what} nDCG"));
            close(&m.psp_at, &r.psp, 1e-12, &format!("{what} PSP"));
            close(&m.psndcg_at, &r.psndcg, 1e-12, &format!("{what} PSnDCG"));
            assert_eq!(m.covered_labels_at, r.covered, "{what}");
            assert_eq!(m.test_labels, r.test_labels, "{what}");
            let cov: Vec<f64> = r
                .covered
                .iter()
                .map(|&c| {
                    if r.test_labels == 0 {
                        0.0
                    } else {
                        c as f64 / r.test_labels as f64
                    }
                })
                .collect();
            close(&m.coverage_at, &cov, 1e-15, &format!("{what} coverage"));
            assert_eq!(m.rows, rows.len() as u64);
            assert_eq!(
                m.labelless_rows,
                rows.iter().filter(|(_, t)| t.is_empty()).count() as u64
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Chunking and merging: bit-identical results.

fn bits(m: &Metrics) -> Vec<u64> {
    let mut v = vec![m.k_max as u64, m.rows, m.labelless_rows, m.test_labels];
    for x in [&m.p_at, &m.ndcg_at, &m.psp_at, &m.psndcg_at, &m.coverage_at] {
        v.extend(x.iter().map(|f| f.to_bits()));
    }
    v.extend(&m.covered_labels_at);
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn chunking_and_merge_order_are_bit_identical(
        seed in any::<u64>(),
        cuts in prop::collection::vec(0usize..400, 0..12),
        k_max in 1usize..8,
        policy in prop_oneof![Just(LabellessRows::CountAsZero), Just(LabellessRows::Skip)],
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n_known = 25usize;
        let counts: Vec<u64> = (0..n_known).map(|_| rng.random_range(0..50)).collect();
        let w: Arc<[f64]> = PropensityParams::GENERIC.inverse_propensity(&counts, 1000).into();
        let rows = random_rows(&mut rng, 400, 30, 6, k_max);

        let mut whole = MetricsAccumulator::new(k_max, Arc::clone(&w), policy).unwrap();
        for (p, t) in &rows {
            whole.add_row(p, t).unwrap();
        }
        let want = bits(&whole.finish());

        // Chunks at the random cut points.
        let mut cuts = cuts;
        cuts.push(0);
        cuts.push(rows.len());
        cuts.sort_unstable();
        let chunks: Vec<MetricsAccumulator> = cuts
            .windows(2)
            .map(|c| {
                let mut a = whole.empty_like();
                for (p, t) in &rows[c[0]..c[1]] {
                    a.add_row(p, t).unwrap();
                }
                a
            })
            .collect();

        // Left to right.
        let mut left = whole.empty_like();
        for c in &chunks {
            left.merge(c).unwrap();
        }
        prop_assert_eq!(&bits(&left.finish()), &want);

        // Right to left.
        let mut right = whole.empty_like();
        for c in chunks.iter().rev() {
            right.merge(c).unwrap();
        }
        prop_assert_eq!(&bits(&right.finish()), &want);

        // Pairwise tree.
        let mut level = chunks.clone();
        while level.len() > 1 {
            level = level
                .chunks(2)
                .map(|pair| {
                    let mut a = pair[0].clone();
                    if let Some(b) = pair.get(1) {
                        a.merge(b).unwrap();
                    }
                    a
                })
                .collect();
        }
        prop_assert_eq!(&bits(&level[0].finish()), &want);

        // A freshly built accumulator with equal propensities (another allocation).
        let mut fresh = MetricsAccumulator::new(k_max, w.to_vec(), policy).unwrap();
        fresh.merge(&left).unwrap();
        prop_assert_eq!(&bits(&fresh.finish()), &want);
    }
}
