//! Classification and calibration metrics (`fsgp::metrics::{binary, multiclass,
//! calibration, nlp}`): hand-worked cases, an independent O(n²) AUC, the f32 floor of NLP,
//! bit-identical merges in any grouping, the JSON of each kind read back.

use fsgp::metrics::binary::{auc, BinaryAccumulator};
use fsgp::metrics::calibration::{bin_of, CalibrationAccumulator, CALIBRATION_BINS};
use fsgp::metrics::evaluation::Evaluation;
use fsgp::metrics::multiclass::MulticlassAccumulator;
use fsgp::metrics::nlp::{NlpAccumulator, NLP_FLOOR};
use fsgp::metrics::{ranking_metrics, LabellessRows};
use fsgp::store::catalog::Split;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-15,
        "{what}: got {got:.17}, want {want:.17}"
    );
}

/// Four rows (p, y), every p exact in f32:
///
/// | p     | y | predicted (p > 0.5) | right | confidence | p(y)  | (p − y)²  | bin (M = 15) |
/// |-------|---|---------------------|-------|------------|-------|-----------|--------------|
/// | 0.875 | 1 | 1                   | yes   | 0.875      | 0.875 | 0.015625  | ⌈13.125⌉ − 1 = 13 |
/// | 0.25  | 0 | 0                   | yes   | 0.75       | 0.75  | 0.0625    | ⌈11.25⌉ − 1 = 11 |
/// | 0.625 | 0 | 1                   | no    | 0.625      | 0.375 | 0.390625  | ⌈9.375⌉ − 1 = 9 |
/// | 0.5   | 1 | 0 (0.5 is negative) | no    | 0.5        | 0.5   | 0.25      | ⌈7.5⌉ − 1 = 7 |
///
/// accuracy 2/4; Brier 0.71875 / 4; one row per bin, so ECE = (|1 − .875| + |1 − .75| +
/// |0 − .625| + |0 − .5|) / 4 = 1.5 / 4 and MCE = 0.625. AUC: positives {.875, .5} against
/// negatives {.25, .625}: .875 beats both, .5 beats .25 only: 3 of 4 pairs.
const BINARY_ROWS: [(f32, bool); 4] = [(0.875, true), (0.25, false), (0.625, false), (0.5, true)];

#[test]
fn binary_hand_worked() {
    let mut acc = BinaryAccumulator::new();
    for (p, y) in BINARY_ROWS {
        acc.add_row(p, y).unwrap();
    }
    let m = acc.finish();
    assert_eq!((m.rows, m.positives, m.nlp_floored_rows), (4, 2, 0));
    close(m.accuracy, 0.5, "accuracy");
    let nlp = -(0.875f64.ln() + 0.75f64.ln() + 0.375f64.ln() + 0.5f64.ln()) / 4.0;
    assert!((m.nlp - nlp).abs() < 1e-15, "nlp {} vs {nlp}", m.nlp);
    close(m.brier, 0.71875 / 4.0, "brier");
    close(m.ece, 0.375, "ece");
    close(m.mce, 0.625, "mce");
    assert_eq!(m.auc, Some(0.75));
    let c = &m.calibration;
    assert_eq!((c.bins, c.count), (CALIBRATION_BINS, 4));
    for (b, bin) in c.reliability.iter().enumerate() {
        let want = match b {
            13 => Some((0.875, 1.0)),
            11 => Some((0.75, 1.0)),
            9 => Some((0.625, 0.0)),
            7 => Some((0.5, 0.0)),
            _ => None,
        };
        assert_eq!(bin.count, u64::from(want.is_some()), "bin {b}");
        assert_eq!(bin.mean_confidence.zip(bin.accuracy), want, "bin {b}");
    }
}

/// Average ranks for ties: positives {.5, .5}, negatives {.5, .25}. All four scores ranked:
/// .25 → 1, the three .5s → (2 + 3 + 4) / 3 = 3 each; positives' rank sum 6,
/// U = 6 − 2·3/2 = 3, AUC = 3 / (2·2) = 0.75 (pairwise: two ties at ½, two wins).
#[test]
fn auc_ties_take_average_ranks() {
    assert_eq!(auc(&[0.5, 0.5], &[0.5, 0.25]), Some(0.75));
    // All tied: ½.
    assert_eq!(auc(&[0.3; 3], &[0.3; 5]), Some(0.5));
    // Perfect and reversed separation.
    assert_eq!(auc(&[0.9, 0.8], &[0.1, 0.2, 0.7]), Some(1.0));
    assert_eq!(auc(&[0.1], &[0.2, 0.7]), Some(0.0));
    // −0 and 0 are the same score.
    assert_eq!(auc(&[-0.0], &[0.0]), Some(0.5));
}

/// A single class makes the AUC undefined: None, which the JSON writes as null and the
/// catalog leaves out; the other metrics are still defined.
#[test]
fn auc_of_one_class_is_undefined() {
    assert_eq!(auc(&[0.2, 0.9], &[]), None);
    assert_eq!(auc(&[], &[0.2]), None);
    let mut acc = BinaryAccumulator::new();
    acc.add_row(0.75, true).unwrap();
    acc.add_row(0.25, true).unwrap();
    let e = Evaluation::Binary(acc.finish());
    let json: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
    assert!(json["auc"].is_null(), "{json}");
    let names: Vec<String> = e
        .metric_rows(None, Some(Split::Test))
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["accuracy", "nlp", "ece", "mce", "brier"]);
    assert!(
        e.to_table().contains("undefined (one class only)"),
        "{}",
        e.to_table()
    );
    // Empty: every count 0, no AUC, no NaN.
    let m = BinaryAccumulator::new().finish();
    assert_eq!((m.rows, m.auc), (0, None));
    assert!([m.accuracy, m.nlp, m.brier, m.ece, m.mce]
        .iter()
        .all(|v| *v == 0.0));
}

/// The AUC against the pairwise definition on random scores with many ties.
#[test]
fn auc_matches_pairwise_count() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..20 {
        let draw = |rng: &mut ChaCha8Rng, n| -> Vec<f32> {
            (0..n)
                .map(|_| rng.random_range(0..12) as f32 / 11.0)
                .collect()
        };
        let n1 = rng.random_range(1..40);
        let n0 = rng.random_range(1..40);
        let (pos, neg) = (draw(&mut rng, n1), draw(&mut rng, n0));
        let mut twice = 0u64;
        for p in &pos {
            for n in &neg {
                twice += if p > n {
                    2
                } else if p == n {
                    1
                } else {
                    0
                };
            }
        }
        let want = twice as f64 / (2 * n1 * n0) as f64;
        assert_eq!(auc(&pos, &neg), Some(want));
    }
}

/// f32 probabilities at the ends: p(y) below 2⁻²⁴ is raised to it and counted, on either
/// side of 0.5, so swapping the classes (p ↔ 1 − p, y ↔ 1 − y) gives the same NLP.
#[test]
fn nlp_floors_f32_probabilities_symmetrically() {
    let cap = 24.0 * std::f64::consts::LN_2;
    // p = 1 for a negative row, p = 0 for a positive one: p(y) = 0 → floored.
    let one_minus_ulp = 1.0 - f32::EPSILON / 2.0; // 1 − 2⁻²⁴, the f32 just below 1
    assert_eq!(f64::from(one_minus_ulp), 1.0 - NLP_FLOOR);
    let cases: [(f32, bool, f64, u64); 5] = [
        (1.0, false, cap, 1),
        (0.0, true, cap, 1),
        (1e-30, true, cap, 1),
        // p(y) = 2⁻²⁴ exactly: not floored, the same cost.
        (one_minus_ulp, false, cap, 0),
        (NLP_FLOOR as f32, true, cap, 0),
    ];
    for (p, y, want, floored) in cases {
        let mut acc = BinaryAccumulator::new();
        acc.add_row(p, y).unwrap();
        let m = acc.finish();
        close(m.nlp, want, &format!("nlp of p = {p:e}, y = {y}"));
        assert_eq!(m.nlp_floored_rows, floored, "p = {p:e}, y = {y}");
        // The same row with the classes swapped.
        let mut swapped = BinaryAccumulator::new();
        swapped.add_row(1.0 - p, !y).unwrap();
        if (1.0 - p) as f64 == 1.0 - f64::from(p) {
            close(swapped.finish().nlp, want, "swapped");
        }
    }
    let mut nlp = NlpAccumulator::default();
    nlp.add(0.0).unwrap();
    nlp.add(1.0).unwrap();
    close(nlp.mean(), cap / 2.0, "mean of a floored and a certain row");
    assert_eq!((nlp.rows(), nlp.floored()), (2, 1));
}

#[test]
fn probabilities_outside_zero_one_are_errors() {
    let mut acc = BinaryAccumulator::new();
    for p in [f32::NAN, -0.5, 1.5, f32::INFINITY] {
        let e = acc.add_row(p, true).unwrap_err();
        assert!(e.to_string().contains("not in [0, 1]"), "{e}");
    }
    assert_eq!(acc.finish().rows, 0, "a refused row changes nothing");
    let mut cal = CalibrationAccumulator::new();
    assert!(cal.add(1.0000001, true).is_err());
    assert_eq!(cal.count(), 0);
}

/// Bins are (m/15, (m+1)/15], 0 in the first.
#[test]
fn bin_edges() {
    assert_eq!(bin_of(0.0), 0);
    assert_eq!(bin_of(1e-300), 0);
    assert_eq!(bin_of(0.5), 7);
    assert_eq!(bin_of(1.0), CALIBRATION_BINS - 1);
    // 1/3 = 5/15 is the upper edge of bin 4 (c·15 rounds to exactly 5 in f64).
    assert_eq!((1.0f64 / 3.0) * 15.0, 5.0);
    assert_eq!(bin_of(1.0 / 3.0), 4);
    assert_eq!(bin_of(1.0 / 3.0 + 1e-9), 5);
}

/// Four rows, K = 4 classes, k_max = 2:
///
/// | truth | predicted (probabilities)   | top-1 | top-2 | conf | p(y)     |
/// |-------|-----------------------------|-------|-------|------|----------|
/// | 0     | 0 (.75), 1 (.125)           | yes   | yes   | .75  | .75      |
/// | 1     | 2 (.5), 1 (.25)             | no    | yes   | .5   | .25      |
/// | 1     | 1 (.625), 3 (.25)           | yes   | yes   | .625 | .625     |
/// | 3     | 0 (.5), 2 (.375)            | no    | no    | .5   | unlisted |
///
/// accuracy 2/4, top-2 3/4. Coverage (eq. 18): test classes {0, 1, 3}, with a true positive
/// {0, 1}: 2/3 (class 2 is predicted but absent from the truth: it does not count).
/// Brier of the top-1 confidence: (.25² + .5² + .375² + .5²)/4 = .703125/4. Bins: .75 → 11,
/// .625 → 9, and both .5s → 7 (two wrong rows, mean confidence .5). ECE =
/// (|1 − .75| + |0 − 1.0| + |1 − .625|)/4 = 1.625/4; MCE = max(.25, .5, .375) = .5.
/// NLP: unknown, the last row's class is unlisted; without that row,
/// −(ln .75 + ln .25 + ln .625)/3.
#[test]
fn multiclass_hand_worked() {
    type Row = (&'static [u32], &'static [f32], u32);
    let rows: [Row; 4] = [
        (&[0, 1], &[0.75, 0.125], 0),
        (&[2, 1], &[0.5, 0.25], 1),
        (&[1, 3], &[0.625, 0.25], 1),
        (&[0, 2], &[0.5, 0.375], 3),
    ];
    let mut acc = MulticlassAccumulator::new(4, 2).unwrap();
    for (pred, probs, class) in rows {
        acc.add_row(pred, probs, &[class]).unwrap();
    }
    let m = acc.finish();
    assert_eq!(
        (m.rows, m.classes, m.test_classes, m.covered_classes),
        (4, 4, 3, 2)
    );
    close(m.accuracy, 0.5, "accuracy");
    assert_eq!(m.top_k_accuracy, vec![0.5, 0.75]);
    close(m.coverage, 2.0 / 3.0, "coverage");
    assert_eq!((m.nlp, m.nlp_unlisted_rows), (None, 1));
    close(m.brier, 0.703125 / 4.0, "brier");
    close(m.ece, 1.625 / 4.0, "ece");
    close(m.mce, 0.5, "mce");
    assert_eq!(m.calibration.reliability[7].count, 2);
    let e = Evaluation::Multiclass(m);
    let names: Vec<String> = e
        .metric_rows(None, Some(Split::Test))
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(
        names,
        [
            "accuracy",
            "top2_accuracy",
            "coverage",
            "ece",
            "mce",
            "brier"
        ]
    );

    let mut listed = MulticlassAccumulator::new(4, 2).unwrap();
    for (pred, probs, class) in &rows[..3] {
        listed.add_row(pred, probs, &[*class]).unwrap();
    }
    let nlp = -(0.75f64.ln() + 0.25f64.ln() + 0.625f64.ln()) / 3.0;
    let got = listed.finish().nlp.expect("every class listed");
    assert!((got - nlp).abs() < 1e-15, "{got} vs {nlp}");
}

/// The four rows of [`multiclass_hand_worked`] with their true class's probability recorded
/// as `predict` writes it (the last row's class 3, unlisted, at .0625): NLP is known,
/// −(ln .75 + ln .25 + ln .625 + ln .0625)/4, and every other figure is the same. A recorded
/// value that contradicts the listed one, or a missing one, is refused and changes nothing.
#[test]
fn multiclass_nlp_of_recorded_true_class_probabilities_is_known_when_unlisted() {
    type Row = (&'static [u32], &'static [f32], u32, f32);
    let rows: [Row; 4] = [
        (&[0, 1], &[0.75, 0.125], 0, 0.75),
        (&[2, 1], &[0.5, 0.25], 1, 0.25),
        (&[1, 3], &[0.625, 0.25], 1, 0.625),
        (&[0, 2], &[0.5, 0.375], 3, 0.0625),
    ];
    let (mut recorded, mut listed) = (
        MulticlassAccumulator::new(4, 2).unwrap(),
        MulticlassAccumulator::new(4, 2).unwrap(),
    );
    for (pred, probs, class, p_true) in rows {
        recorded
            .add_row_knowing(pred, probs, &[class], Some(p_true))
            .unwrap();
        listed.add_row(pred, probs, &[class]).unwrap();
    }
    let e = recorded
        .add_row_knowing(&[0, 1], &[0.75, 0.125], &[1], Some(0.25))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("listed with probability 0.125 but its recorded probability is 0.25"),
        "{e}"
    );
    let e = recorded
        .add_row_knowing(&[0, 1], &[0.75, 0.125], &[2], None)
        .unwrap_err();
    assert!(
        e.to_string().contains("no probability of its true class 2"),
        "{e}"
    );
    let (m, old) = (recorded.finish(), listed.finish());
    let nlp = -(0.75f64.ln() + 0.25f64.ln() + 0.625f64.ln() + 0.0625f64.ln()) / 4.0;
    let got = m.nlp.expect("every true class's probability recorded");
    assert!((got - nlp).abs() < 1e-15, "{got} vs {nlp}");
    assert_eq!(m.nlp_unlisted_rows, 0);
    let without_nlp = |m: &fsgp::metrics::multiclass::MulticlassMetrics| {
        let mut m = m.clone();
        (m.nlp, m.nlp_unlisted_rows) = (None, 0);
        m
    };
    assert_eq!(without_nlp(&m), without_nlp(&old));
    assert_eq!((old.nlp, old.nlp_unlisted_rows), (None, 1));
}

/// `ingest --class-map train`: a row of a class the training rows lack is wrong at every k,
/// a wrong top-1 in the calibration, not in the NLP; its classes join K*, uncovered.
#[test]
fn unseen_class_rows_are_wrong_and_their_classes_join_k_star() {
    let mut acc = MulticlassAccumulator::new(3, 2).unwrap();
    acc.add_unseen_classes(2);
    acc.add_row(&[0, 1], &[0.75, 0.25], &[0]).unwrap();
    acc.add_row(&[1, 0], &[0.5, 0.5], &[1]).unwrap();
    acc.add_unseen_row(&[0.5, 0.25]).unwrap();
    acc.add_unseen_row(&[0.25, 0.25]).unwrap();
    assert!(acc.add_unseen_row(&[1.5]).is_err());
    let m = acc.finish();
    assert_eq!((m.rows, m.unseen_rows, m.unseen_classes), (4, 2, 2));
    // K* = {0, 1} seen plus 2 unseen; K_TP = {0, 1}.
    assert_eq!((m.test_classes, m.covered_classes), (4, 2));
    close(m.accuracy, 0.5, "accuracy");
    assert_eq!(m.top_k_accuracy, vec![0.5, 0.5]);
    close(m.coverage, 0.5, "coverage");
    let nlp = -(0.75f64.ln() + 0.5f64.ln()) / 2.0;
    assert!((m.nlp.unwrap() - nlp).abs() < 1e-15);
    // Brier over the top-1 confidences: (0.25² + 0.5² + 0.5² + 0.25²) / 4.
    close(m.brier, 0.625 / 4.0, "brier");
    let json = serde_json::to_value(&m).unwrap();
    assert_eq!(
        (
            json["unseen_rows"].as_u64(),
            json["unseen_classes"].as_u64()
        ),
        (Some(2), Some(2))
    );
    // Without unseen rows the JSON has neither key (metrics files stay as they were).
    let mut plain = MulticlassAccumulator::new(3, 2).unwrap();
    plain.add_row(&[0], &[0.5], &[0]).unwrap();
    let json = serde_json::to_value(plain.finish()).unwrap();
    assert!(json.get("unseen_rows").is_none() && json.get("unseen_classes").is_none());
}

#[test]
fn multiclass_rows_must_have_one_class() {
    let mut acc = MulticlassAccumulator::new(3, 2).unwrap();
    for (truth, msg) in [
        (&[][..], "exactly one true label; this one has 0"),
        (&[0, 1][..], "exactly one true label; this one has 2"),
        (
            &[3][..],
            "true class 3 is not below the number of classes 3",
        ),
    ] {
        let e = acc.add_row(&[0], &[0.5], truth).unwrap_err();
        assert!(e.to_string().contains(msg), "{e}");
    }
    let e = acc.add_row(&[1, 1], &[0.5, 0.5], &[1]).unwrap_err();
    assert!(e.to_string().contains("appears twice"), "{e}");
    assert_eq!(acc.finish().rows, 0);
}

/// Random rows split into chunks in several ways and merged in several groupings: the
/// metrics (and their JSON) are bit for bit those of one pass.
#[test]
fn merges_are_bit_identical_in_any_grouping() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let n = 500;
    let binary: Vec<(f32, bool)> = (0..n)
        .map(|_| (rng.random::<f32>(), rng.random_bool(0.4)))
        .collect();
    type McRow = (Vec<u32>, Vec<f32>, u32);
    let multiclass: Vec<McRow> = (0..n)
        .map(|_| {
            let mut pred: Vec<u32> = (0..6).collect();
            for i in (1..6).rev() {
                pred.swap(i, rng.random_range(0..=i));
            }
            let probs = (0..3).map(|_| rng.random::<f32>()).collect();
            pred.truncate(3);
            (pred, probs, rng.random_range(0..6))
        })
        .collect();
    let one_pass_binary = {
        let mut a = BinaryAccumulator::new();
        binary.iter().for_each(|&(p, y)| a.add_row(p, y).unwrap());
        Evaluation::Binary(a.finish()).to_json()
    };
    let one_pass_mc = {
        let mut a = MulticlassAccumulator::new(6, 3).unwrap();
        for (pred, probs, c) in &multiclass {
            a.add_row(pred, probs, &[*c]).unwrap();
        }
        Evaluation::Multiclass(a.finish()).to_json()
    };
    for chunk in [1, 7, 64, 499] {
        // Chunks merged left to right, right to left, and as a balanced tree.
        let bin_chunks: Vec<BinaryAccumulator> = binary
            .chunks(chunk)
            .map(|rows| {
                let mut a = BinaryAccumulator::new();
                rows.iter().for_each(|&(p, y)| a.add_row(p, y).unwrap());
                a
            })
            .collect();
        let mc_chunks: Vec<MulticlassAccumulator> = multiclass
            .chunks(chunk)
            .map(|rows| {
                let mut a = MulticlassAccumulator::new(6, 3).unwrap();
                for (pred, probs, c) in rows {
                    a.add_row(pred, probs, &[*c]).unwrap();
                }
                a
            })
            .collect();
        for order in groupings(bin_chunks.len()) {
            let b = merged(&bin_chunks, &order, |a, b| a.merge(b).unwrap());
            assert_eq!(Evaluation::Binary(b.finish()).to_json(), one_pass_binary);
            let m = merged(&mc_chunks, &order, |a, b| a.merge(b).unwrap());
            assert_eq!(Evaluation::Multiclass(m.finish()).to_json(), one_pass_mc);
        }
    }
}

/// Merge orders of `n` chunks: each a list of chunk indices merged in turn into the first.
fn groupings(n: usize) -> Vec<Vec<usize>> {
    let forward: Vec<usize> = (0..n).collect();
    let backward: Vec<usize> = (0..n).rev().collect();
    let interleaved: Vec<usize> = (0..n).step_by(2).chain((1..n).step_by(2)).collect();
    vec![forward, backward, interleaved]
}

/// Pairwise (tree) merging in the given order: adjacent pairs merged until one is left.
fn merged<T: Clone>(chunks: &[T], order: &[usize], merge: impl Fn(&mut T, &T)) -> T {
    let mut level: Vec<T> = order.iter().map(|&i| chunks[i].clone()).collect();
    while level.len() > 1 {
        let mut next = Vec::new();
        for pair in level.chunks(2) {
            let mut a = pair[0].clone();
            if let Some(b) = pair.get(1) {
                merge(&mut a, b);
            }
            next.push(a);
        }
        level = next;
    }
    level.pop().unwrap()
}

/// Calibration of (row, label) pairs (multi-label): hand-worked, and merged in any grouping.
///
/// Pairs (p, label true): (.9375, yes), (.9375, no), (.0625, no), (0, no), (1, yes).
/// Bins: .9375·15 = 14.0625 → 14, 1 → 14; .0625·15 = .9375 → 0, 0 → 0. Bin 14: 3 pairs,
/// Σc = 2.875, 2 true: |2 − 2.875| = .875. Bin 0: 2 pairs, Σc = .0625, none true: .0625.
/// ECE = (.875 + .0625)/5 = .1875; MCE = max(.875/3, .0625/2) = .875/3.
/// Brier = (.0625² + .9375² + .0625² + 0 + 0)/5 = (2·.00390625 + .87890625)/5.
#[test]
fn pair_calibration_hand_worked() {
    let pairs = [
        (0.9375, true),
        (0.9375, false),
        (0.0625, false),
        (0.0, false),
        (1.0, true),
    ];
    let mut cal = CalibrationAccumulator::new();
    for (c, o) in pairs {
        cal.add(c, o).unwrap();
    }
    let c = cal.finish();
    close(c.ece, 0.1875, "ece");
    close(c.mce, 0.875 / 3.0, "mce");
    close(c.brier, (2.0 * 0.00390625 + 0.87890625) / 5.0, "brier");
    assert_eq!(c.reliability[14].count, 3);
    assert_eq!(c.reliability[14].accuracy, Some(2.0 / 3.0));
    assert_eq!(c.reliability[0].mean_confidence, Some(0.03125));
    let mut split = CalibrationAccumulator::new();
    let mut rest = CalibrationAccumulator::new();
    for (i, (c, o)) in pairs.into_iter().enumerate() {
        if i % 2 == 0 { &mut split } else { &mut rest }
            .add(c, o)
            .unwrap();
    }
    rest.merge(&split).unwrap();
    assert_eq!(rest.finish(), c);
}

/// A multi-label evaluation's JSON is the ranking metrics' exactly when it has no
/// calibration (probability-less predictions), and every kind reads back (the values here
/// are short decimals or dyadic, which serde_json parses back exactly).
#[test]
fn evaluation_json_round_trips() {
    let rows = [(vec![0u32, 1], vec![1u32]), (vec![2, 0], vec![0, 2])];
    let m = ranking_metrics(
        2,
        vec![1.0; 3],
        LabellessRows::CountAsZero,
        rows.iter().map(|(p, t)| (p.as_slice(), t.as_slice())),
    )
    .unwrap();
    let plain = Evaluation::Ranking(m.clone());
    assert_eq!(plain.to_json(), m.to_json());
    assert!(!plain.to_json().contains("calibration"));
    assert_eq!(
        serde_json::to_string_pretty(&plain).unwrap(),
        m.to_json(),
        "untagged: the same JSON when serialised inside a larger record"
    );
    let mut with_cal = m.clone();
    let mut cal = CalibrationAccumulator::new();
    cal.add(0.75, true).unwrap();
    with_cal.calibration = Some(cal.finish());
    let mut bin = BinaryAccumulator::new();
    BINARY_ROWS
        .iter()
        .for_each(|&(p, y)| bin.add_row(p, y).unwrap());
    let mut mc = MulticlassAccumulator::new(3, 2).unwrap();
    mc.add_row(&[2, 0], &[0.5, 0.25], &[0]).unwrap();
    for e in [
        plain,
        Evaluation::Ranking(with_cal),
        Evaluation::Binary(bin.finish()),
        Evaluation::Multiclass(mc.finish()),
    ] {
        let back = Evaluation::from_json(e.to_json().as_bytes()).unwrap();
        assert_eq!(back, e);
    }
}
