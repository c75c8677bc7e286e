//! What the label frequencies alone score, with no model: the floor a trained model must
//! clear before its figures mean anything. `pipeline fit` prints it beside its candidates,
//! because a model that learned nothing from the features (features on the wrong scale, a
//! budget too small) reproduces exactly this ranking and still prints plausible figures.

use std::collections::HashMap;

/// P@1 and P@3 on `validation` of one ranking for every row: the labels by their count in
/// `train`, most frequent first (ties: the smaller id). Rows are label-id lists; a row
/// without labels counts, scoring zero, as evaluate counts it.
pub fn frequency_ranking(train: &[Vec<u32>], validation: &[Vec<u32>]) -> (f64, f64) {
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for &l in train.iter().flatten() {
        *counts.entry(l).or_default() += 1;
    }
    let mut ranked: Vec<(u32, u64)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let top: Vec<u32> = ranked.iter().take(3).map(|r| r.0).collect();
    let precision = |k: usize| {
        if validation.is_empty() {
            return 0.0;
        }
        let hits: usize = validation
            .iter()
            .map(|row| top.iter().take(k).filter(|l| row.contains(l)).count())
            .sum();
        hits as f64 / (k * validation.len()) as f64
    };
    (precision(1), precision(3))
}

/// Accuracy and NLP on `validation` of predicting every row's class with the classes'
/// shares in `train` (classes 0..k, each share add-one smoothed so that a class never
/// seen in training has a finite NLP): the majority class's accuracy, and the NLP of the
/// class frequencies.
pub fn class_shares(train: &[u32], validation: &[u32], k: usize) -> (f64, f64) {
    let mut counts = vec![0u64; k];
    for &c in train {
        counts[c as usize] += 1;
    }
    let total = (train.len() + k) as f64;
    let share = |c: u32| (counts[c as usize] + 1) as f64 / total;
    let majority = (0..k as u32)
        .max_by_key(|&c| (counts[c as usize], std::cmp::Reverse(c)))
        .unwrap_or(0);
    if validation.is_empty() {
        return (0.0, 0.0);
    }
    let n = validation.len() as f64;
    let correct = validation.iter().filter(|&&c| c == majority).count();
    let nlp = validation.iter().map(|&c| -share(c).ln()).sum::<f64>() / n;
    (correct as f64 / n, nlp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frequency_ranking_scores_as_worked_by_hand() {
        // Counts in train: 2 → 3, 0 → 2, 1 → 2, 5 → 1. Ranking: 2, 0, 1 (0 before 1: tie).
        let train = vec![vec![2, 0], vec![2, 1], vec![2, 0, 1], vec![5]];
        // Row 1 holds 2 (P@1 hit, 1 of 3 in the top 3); row 2 holds 0 and 1 (2 of 3);
        // row 3 has no label; row 4 holds 5 only.
        let validation = vec![vec![2], vec![0, 1], vec![], vec![5]];
        let (p1, p3) = frequency_ranking(&train, &validation);
        assert_eq!(p1, 1.0 / 4.0);
        assert_eq!(p3, 3.0 / 12.0);
        // A tie at the top goes to the smaller id: 3 and 4 both seen twice, 3 ranks first.
        let tied = vec![vec![4, 3], vec![3, 4]];
        assert_eq!(frequency_ranking(&tied, &[vec![3]]).0, 1.0);
        assert_eq!(frequency_ranking(&tied, &[vec![4]]).0, 0.0);
    }

    #[test]
    fn class_shares_score_as_worked_by_hand() {
        // Train: class 0 ×3, class 1 ×1, class 2 never: shares (3+1)/7, (1+1)/7, 1/7.
        let train = [0, 0, 0, 1];
        let validation = [0, 1, 2, 0];
        let (accuracy, nlp) = class_shares(&train, &validation, 3);
        assert_eq!(accuracy, 0.5);
        let want = -((4.0f64 / 7.0).ln() * 2.0 + (2.0f64 / 7.0).ln() + (1.0f64 / 7.0).ln()) / 4.0;
        assert!((nlp - want).abs() < 1e-15, "{nlp} vs {want}");
    }
}
