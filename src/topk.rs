//! Partial selection of the k best labels of a row: one pass over the K scores keeping a
//! sorted buffer of k, O(K·k) in the worst case and O(K) in practice, instead of sorting K.

/// The k largest scores and their label ids, best first. Ties go to the smaller label id;
/// a NaN score ranks below every number.
pub fn top_k(scores: &[f64], k: usize) -> (Vec<u32>, Vec<f32>) {
    let key = |s: f64| if s.is_nan() { f64::NEG_INFINITY } else { s };
    // (score, label) sorted best first; labels arrive in increasing order, so an equal
    // score never displaces an earlier label.
    let mut best: Vec<(f64, u32)> = Vec::with_capacity(k + 1);
    for (label, &s) in scores.iter().enumerate() {
        let s = key(s);
        if best.len() == k && best.last().is_some_and(|&(worst, _)| s <= worst) {
            continue;
        }
        let at = best.partition_point(|&(b, _)| b >= s);
        best.insert(at, (s, label as u32));
        best.truncate(k);
    }
    best.into_iter().map(|(s, l)| (l, s as f32)).unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_worked_with_ties_and_nan() {
        let s = [0.5, 2.0, f64::NAN, 2.0, -1.0, 0.5, 3.0];
        assert_eq!(top_k(&s, 3), (vec![6, 1, 3], vec![3.0, 2.0, 2.0]));
        assert_eq!(top_k(&s, 5).0, vec![6, 1, 3, 0, 5]);
        assert_eq!(top_k(&s, 7).0, vec![6, 1, 3, 0, 5, 4, 2]);
        assert_eq!(top_k(&s, 0).0, Vec::<u32>::new());
        assert_eq!(top_k(&[1.0, 2.0], 5).0, vec![1, 0]);
    }
}
