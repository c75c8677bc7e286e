//! Partial selection of the k best labels of a row: one pass over the K scores keeping a
//! sorted buffer of k, O(K·k) in the worst case and O(K) in practice, instead of sorting K.
//!
//! A block of rows' scores is a column-major matrix [B×K] (one column per label), so a
//! row's scores lie `B` apart. [`top_k_of_rows`] reads them column by column, each row
//! keeping its own buffer, instead of gathering each row: at K = 50 000 labels a row's
//! gather touched 50 000 cache lines (and as many pages) per row.

use faer::MatRef;
use rayon::prelude::*;

/// Rows whose buffers one task fills, scanning every label's column over them: their
/// scores in a column are contiguous (64 rows are 512 bytes), and their thresholds fit
/// in L1.
const ROWS_PER_TASK: usize = 64;

/// The k best (score, label) pairs seen so far, best first. Ties go to the smaller label:
/// labels arrive in increasing order, so an equal score never displaces an earlier one.
/// A NaN score ranks below every number.
struct Best {
    k: usize,
    kept: Vec<(f64, u32)>,
}

impl Best {
    fn new(k: usize) -> Self {
        Best {
            k,
            kept: Vec::with_capacity(k + 1),
        }
    }

    /// The score a new label must beat to be kept: the worst kept once k are, else NaN
    /// (which no comparison passes, so that every score, −∞ too, is kept).
    fn threshold(&self) -> f64 {
        match self.kept.len() == self.k {
            true => self.kept.last().map_or(f64::INFINITY, |&(worst, _)| worst),
            false => f64::NAN,
        }
    }

    /// Offers `label` with score `s` (NaN read as −∞), keeping the k best.
    fn offer(&mut self, label: u32, s: f64) {
        let s = if s.is_nan() { f64::NEG_INFINITY } else { s };
        if s <= self.threshold() {
            return;
        }
        let at = self.kept.partition_point(|&(b, _)| b >= s);
        self.kept.insert(at, (s, label));
        self.kept.truncate(self.k);
    }

    fn finish(self) -> (Vec<u32>, Vec<f32>) {
        self.kept.into_iter().map(|(s, l)| (l, s as f32)).unzip()
    }
}

/// The k largest scores and their label ids, best first. Ties go to the smaller label id;
/// a NaN score ranks below every number.
pub fn top_k(scores: &[f64], k: usize) -> (Vec<u32>, Vec<f32>) {
    let mut best = Best::new(k);
    for (label, &s) in scores.iter().enumerate() {
        best.offer(label as u32, s);
    }
    best.finish()
}

/// [`top_k`] of every row of `scores` [B×K] (a label per column), in parallel over blocks
/// of rows; each row's result is the one [`top_k`] gives for it.
pub fn top_k_of_rows(scores: MatRef<'_, f64>, k: usize) -> Vec<(Vec<u32>, Vec<f32>)> {
    let rows = scores.nrows();
    (0..rows.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .flat_map_iter(|task| {
            let start = task * ROWS_PER_TASK;
            let end = (start + ROWS_PER_TASK).min(rows);
            let block = scores.subrows(start, end - start);
            let mut best: Vec<Best> = (start..end).map(|_| Best::new(k)).collect();
            // The thresholds side by side: most scores fail theirs, and the test then
            // reads no buffer.
            let mut threshold: Vec<f64> = best.iter().map(Best::threshold).collect();
            for label in 0..block.ncols() {
                let column = block.col(label);
                for ((b, t), &s) in best.iter_mut().zip(&mut threshold).zip(column.iter()) {
                    // A NaN is −∞ to `offer`; a threshold of NaN takes every score.
                    if !s.is_nan() && s <= *t {
                        continue;
                    }
                    b.offer(label as u32, s);
                    *t = b.threshold();
                }
            }
            best.into_iter().map(Best::finish)
        })
        .collect()
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
        // A NaN is −∞: kept below a −∞ seen before it, and never above a number.
        let low = [f64::NEG_INFINITY, f64::NAN, -1e300];
        assert_eq!(top_k(&low, 3).0, vec![2, 0, 1]);
        assert_eq!(top_k(&low, 2).0, vec![2, 0]);
    }

    /// Every row's labels and scores from the column scan are those of [`top_k`] on the row
    /// alone, bit for bit: for rows of ties, NaNs and infinities, every k from none to more
    /// than the labels, and row counts on both sides of a task's block.
    #[test]
    fn the_column_scan_gives_each_rows_own_top_k() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for (rows, labels) in [(1, 1), (3, 7), (64, 5), (65, 40), (200, 33)] {
            let scores = faer::Mat::from_fn(rows, labels, |_, _| match next() % 16 {
                0 => f64::NAN,
                1 => f64::NEG_INFINITY,
                2 => f64::INFINITY,
                // Few distinct values: many ties.
                r => (r % 5) as f64 - 2.0 + ((next() % 3) as f64) * 0.25,
            });
            for k in [0, 1, 2, 5, labels, labels + 3] {
                let scanned = top_k_of_rows(scores.as_ref(), k);
                assert_eq!(scanned.len(), rows);
                for (i, got) in scanned.iter().enumerate() {
                    let row: Vec<f64> = scores.row(i).iter().copied().collect();
                    let want = top_k(&row, k);
                    assert_eq!(
                        got.0, want.0,
                        "rows {rows}, labels {labels}, k {k}, row {i}"
                    );
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got.1), bits(&want.1), "row {i}, k {k}");
                }
            }
        }
    }
}
