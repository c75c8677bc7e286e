//! The likelihood terms of a bound: which (row, label, y, weight) enter it. Every label of
//! every row gives the bound with all negatives; the positives plus a uniform sample of
//! negatives reweighted by |N_i|/|L_i| give an unbiased estimate of it (`docs/model.md`,
//! "Utilities and the stochastic bound"). The N/|B| scaling is part of each term's weight.

use rand::Rng;

use crate::model::likelihood::multiclass::Classes;

/// One likelihood term: row i (position in the minibatch), label k, y = ±1, weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Term {
    pub row: u32,
    pub label: u32,
    pub y: f64,
    pub weight: f64,
}

/// Terms for every label of every row: the bound with all negatives.
/// `scale` is N/|B| (1 for the whole training set).
pub fn terms_all(positives: &[Vec<u32>], n_labels: usize, scale: f64) -> Vec<Term> {
    let mut out = Vec::with_capacity(positives.len() * n_labels);
    for (i, pos) in positives.iter().enumerate() {
        let mut is_pos = vec![false; n_labels];
        for &k in pos {
            is_pos[k as usize] = true;
        }
        for (k, &p) in is_pos.iter().enumerate() {
            out.push(Term {
                row: i as u32,
                label: k as u32,
                y: if p { 1.0 } else { -1.0 },
                weight: scale,
            });
        }
    }
    out
}

/// Positives exactly plus `count` negatives per row sampled uniformly without replacement,
/// each weighted |N_i| / |L_i| so the expectation over samples is the all-negatives bound.
pub fn terms_sampled(
    positives: &[Vec<u32>],
    n_labels: usize,
    count: usize,
    scale: f64,
    rng: &mut impl Rng,
) -> Vec<Term> {
    terms_stratified(positives, n_labels, &[], count, scale, rng)
}

/// A stratified sample of the negatives: positives exactly, every label of `frequent`
/// (sorted ids) that is not a positive exactly (weight `scale`), and `count` of the row's
/// other negatives R_i sampled uniformly without replacement, each weighted |R_i| / |S_i|.
/// The expectation over samples is the all-negatives bound, as for [`terms_sampled`]
/// (which is this with no frequent labels); only the sampled stratum varies.
pub fn terms_stratified(
    positives: &[Vec<u32>],
    n_labels: usize,
    frequent: &[u32],
    count: usize,
    scale: f64,
    rng: &mut impl Rng,
) -> Vec<Term> {
    stratified(positives, n_labels, (frequent, true), count, scale, rng)
}

/// The terms of [`terms_stratified`] (the same sample, for the same `rng`) whose label is not
/// in `frequent`: the row's other positives and its sampled negatives. With
/// [`TermSet::Stratified`] they are the bound's list part; its frequent labels, every row's
/// exactly, are its dense part.
pub fn terms_stratified_rest(
    positives: &[Vec<u32>],
    n_labels: usize,
    frequent: &[u32],
    count: usize,
    scale: f64,
    rng: &mut impl Rng,
) -> Vec<Term> {
    stratified(positives, n_labels, (frequent, false), count, scale, rng)
}

/// [`terms_stratified`], with the frequent labels' terms (positives among them included)
/// left out unless `with_frequent`.
///
/// A row's sampled stratum is drawn from `others` (every label outside `frequent`, built
/// once) less the row's positives there: rank r of that set is `others[r + c]`, c the
/// number of those positives at or below it, found by a binary search of the row's few
/// positives. A row costs O(|P_i| log F + count log |P_i|) whatever L and F are, where a
/// walk over the union of the frequent labels and the positives cost O(F) a row (1 000
/// labels: most of a step's term sampling at 30 000 labels).
fn stratified(
    positives: &[Vec<u32>],
    n_labels: usize,
    (frequent, with_frequent): (&[u32], bool),
    count: usize,
    scale: f64,
    rng: &mut impl Rng,
) -> Vec<Term> {
    debug_assert!(frequent.windows(2).all(|w| w[0] < w[1]));
    // A row takes at most every label: a COUNT above L (the option allows up to 2³¹ − 1)
    // must not size the buffers.
    let count = count.min(n_labels);
    let mut out = Vec::with_capacity(positives.len() * (frequent.len() + count + 8));
    let others = complement(frequent, n_labels);
    let mut draw = RankDraw::new(n_labels);
    let mut ranks = Vec::with_capacity(count);
    // The row's positives outside `frequent`, as positions in `others` less the number of
    // such positives before them: nondecreasing, so rank r of the rest has c = the count
    // of entries ≤ r.
    let mut shifts = Vec::new();
    for (i, pos) in positives.iter().enumerate() {
        let mut sorted = pos.clone();
        sorted.sort_unstable();
        debug_assert!(
            sorted.windows(2).all(|w| w[0] < w[1]),
            "a row's labels repeat"
        );
        shifts.clear();
        for &k in &sorted {
            let in_frequent = frequent.binary_search(&k);
            if let Err(frequent_below) = in_frequent {
                shifts.push(k as usize - frequent_below - shifts.len());
            }
            if in_frequent.is_err() || with_frequent {
                out.push(Term {
                    row: i as u32,
                    label: k,
                    y: 1.0,
                    weight: scale,
                });
            }
        }
        if with_frequent {
            // The frequent labels that are negatives here enter exactly: one merge with the
            // sorted positives.
            let mut j = 0;
            for &k in frequent {
                while j < sorted.len() && sorted[j] < k {
                    j += 1;
                }
                if sorted.get(j) != Some(&k) {
                    out.push(Term {
                        row: i as u32,
                        label: k,
                        y: -1.0,
                        weight: scale,
                    });
                }
            }
        }
        let n_neg = others.len() - shifts.len();
        let take = count.min(n_neg);
        if take == 0 {
            continue;
        }
        let weight = scale * n_neg as f64 / take as f64;
        draw.sample(n_neg, take, rng, &mut ranks);
        for &r in &ranks {
            let r = r as usize;
            let below = shifts.partition_point(|&s| s <= r);
            out.push(Term {
                row: i as u32,
                label: others[r + below],
                y: -1.0,
                weight,
            });
        }
    }
    out
}

/// The labels 0..n_labels not in `sorted` (ascending, distinct), ascending.
fn complement(sorted: &[u32], n_labels: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(n_labels.saturating_sub(sorted.len()));
    let mut next = sorted.iter().peekable();
    for k in 0..n_labels as u32 {
        if next.next_if_eq(&&k).is_none() {
            out.push(k);
        }
    }
    out
}

/// Uniform draws of `take` of the ranks 0..n without replacement, for every row of a step
/// from one buffer: a partial Fisher–Yates shuffle of the identity 0..n_labels that is
/// undone after each draw, so a row costs O(take) whatever n is. (A general-purpose sampler
/// allocates a fresh index vector per row when take is a sizeable share of n: 200 KB a row
/// at 50 000 labels, each a fresh mapping whose pages the kernel clears; that clearing fell
/// from 17.6 % to 10.7 % of a step's CPU samples with this draw, `docs/model.md`.)
struct RankDraw {
    /// The identity permutation between draws.
    identity: Vec<u32>,
    /// The positions swapped by the current draw, to undo it.
    swaps: Vec<u32>,
}

impl RankDraw {
    fn new(n_labels: usize) -> Self {
        RankDraw {
            identity: (0..n_labels as u32).collect(),
            swaps: Vec::new(),
        }
    }

    /// `take` distinct ranks of 0..n (n ≤ n_labels) into `out`, in the order drawn.
    fn sample(&mut self, n: usize, take: usize, rng: &mut impl Rng, out: &mut Vec<u32>) {
        debug_assert!(take <= n && n <= self.identity.len());
        let perm = &mut self.identity[..n];
        self.swaps.clear();
        out.clear();
        for i in 0..take {
            let j = rng.random_range(i..n);
            perm.swap(i, j);
            self.swaps.push(j as u32);
            out.push(perm[i]);
        }
        // Undo the swaps in reverse: the buffer is the identity again.
        for (i, &j) in self.swaps.iter().enumerate().rev() {
            perm.swap(i, j as usize);
        }
    }
}

/// The likelihood terms of a bound.
#[derive(Debug, Clone, Copy)]
pub enum TermSet<'a> {
    /// Explicit terms (sampled negatives, or any subset).
    List(&'a [Term]),
    /// Every label of every row, weight `scale` (N/|B|; 1 for the exact bound): y = +1 for
    /// the row's `positives`, −1 for all other labels. Evaluated densely with GEMMs; equal
    /// to `List(&terms_all(positives, K, scale))` up to summation order.
    AllLabels {
        positives: &'a [Vec<u32>],
        scale: f64,
    },
    /// A stratified sample of the negatives ([`terms_stratified`]) in two parts: every
    /// label of `frequent` (sorted ids) for every row, weight `scale`, y = +1 for the row's
    /// `positives`, evaluated densely like [`TermSet::AllLabels`] on those labels' rows of
    /// Φ; and `rest` ([`terms_stratified_rest`]), the list of the other labels' terms.
    /// Equal to `List(&terms_stratified(…))` of the same sample up to summation order.
    Stratified {
        frequent: &'a [u32],
        positives: &'a [Vec<u32>],
        scale: f64,
        rest: &'a [Term],
    },
    /// One true class per row and a likelihood that couples the row's K utilities
    /// (`likelihood/multiclass/mod.rs`): the bound's data part is scale · Σ_i E_q[log p(c_i | f_i)]. The
    /// per-term likelihood argument of the objective is not used for it.
    Classes(Classes<'a>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn a_stratified_sample_holds_the_frequent_labels_exactly_and_samples_the_rest() {
        // 10 labels; row 0's positives {2, 5}, row 1's {7}; the frequent labels {1, 2, 7}.
        let positives = vec![vec![5, 2], vec![7]];
        let frequent = [1, 2, 7];
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..200 {
            let terms = terms_stratified(&positives, 10, &frequent, 3, 2.0, &mut rng);
            let of = |row: u32, y: f64| -> Vec<(u32, f64)> {
                let mut v: Vec<(u32, f64)> = terms
                    .iter()
                    .filter(|t| t.row == row && t.y == y)
                    .map(|t| (t.label, t.weight))
                    .collect();
                v.sort_by_key(|t| t.0);
                v
            };
            assert_eq!(of(0, 1.0), [(2, 2.0), (5, 2.0)]);
            assert_eq!(of(1, 1.0), [(7, 2.0)]);
            for (row, exact, rest) in [(0, vec![1, 7], 6.0), (1, vec![1, 2], 7.0)] {
                let negatives = of(row, -1.0);
                // The frequent labels that are not positives, exactly, at the batch weight.
                let exact_terms: Vec<(u32, f64)> = negatives
                    .iter()
                    .copied()
                    .filter(|(_, w)| *w == 2.0)
                    .collect();
                assert_eq!(
                    exact_terms,
                    exact.iter().map(|&k| (k, 2.0)).collect::<Vec<_>>()
                );
                // Three of the other negatives, distinct, each weighted |rest| / 3.
                let sampled: Vec<u32> = negatives
                    .iter()
                    .filter(|(_, w)| *w == 2.0 * rest / 3.0)
                    .map(|(k, _)| *k)
                    .collect();
                assert_eq!(sampled.len(), 3, "{negatives:?}");
                assert_eq!(negatives.len(), exact.len() + 3);
                assert!(sampled.windows(2).all(|w| w[0] < w[1]));
                assert!(sampled
                    .iter()
                    .all(|k| !frequent.contains(k) && !positives[row as usize].contains(k)));
            }
        }
    }

    #[test]
    fn a_count_above_the_labels_takes_every_negative_without_sizing_for_the_count() {
        let positives = vec![vec![1], vec![0, 2]];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let terms = terms_stratified(&positives, 4, &[3], i32::MAX as usize, 1.0, &mut rng);
        assert_eq!(terms.len(), 8, "every label of both rows, once");
        assert!(terms.iter().all(|t| t.weight == 1.0));
    }

    #[test]
    fn without_frequent_labels_the_stratified_sample_is_the_uniform_one() {
        let positives = vec![vec![1, 4], vec![], vec![0, 9]];
        let uniform = terms_sampled(&positives, 12, 4, 1.5, &mut ChaCha8Rng::seed_from_u64(5));
        let stratified = terms_stratified(
            &positives,
            12,
            &[],
            4,
            1.5,
            &mut ChaCha8Rng::seed_from_u64(5),
        );
        assert_eq!(uniform, stratified);
    }

    #[test]
    fn a_draw_leaves_the_identity_behind() {
        let mut draw = RankDraw::new(50);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut out = Vec::new();
        for (n, take) in [(50, 50), (50, 7), (31, 30), (1, 1), (20, 0)] {
            draw.sample(n, take, &mut rng, &mut out);
            assert_eq!(out.len(), take);
            let mut sorted = out.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), take, "distinct");
            assert!(out.iter().all(|&r| (r as usize) < n));
            assert!(draw
                .identity
                .iter()
                .enumerate()
                .all(|(i, &v)| v as usize == i));
        }
    }

    /// Every rank is drawn with probability take/n: the counts over many draws stay within
    /// five binomial standard deviations of it, and every ordered pair turns up (a draw
    /// of 2 from 6: 15 pairs, each 1/15).
    #[test]
    fn draws_are_uniform_over_ranks_and_pairs() {
        let (n, take, reps) = (40usize, 12usize, 20_000usize);
        let mut draw = RankDraw::new(64);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let mut out = Vec::new();
        let mut counts = vec![0usize; n];
        for _ in 0..reps {
            draw.sample(n, take, &mut rng, &mut out);
            for &r in &out {
                counts[r as usize] += 1;
            }
        }
        let p = take as f64 / n as f64;
        let (mean, sd) = (reps as f64 * p, (reps as f64 * p * (1.0 - p)).sqrt());
        for (r, &c) in counts.iter().enumerate() {
            assert!(
                (c as f64 - mean).abs() < 5.0 * sd,
                "rank {r}: {c} vs {mean}"
            );
        }
        let mut pairs = std::collections::HashMap::new();
        for _ in 0..15_000 {
            draw.sample(6, 2, &mut rng, &mut out);
            let (a, b) = (out[0].min(out[1]), out[0].max(out[1]));
            *pairs.entry((a, b)).or_insert(0usize) += 1;
        }
        assert_eq!(pairs.len(), 15);
        for (pair, &c) in &pairs {
            assert!(
                (c as f64 - 1000.0).abs() < 5.0 * (1000.0f64 * 14.0 / 15.0).sqrt(),
                "{pair:?}: {c}"
            );
        }
    }

    /// The rank-to-label walk the sampler had before it searched the row's positives: the
    /// sorted ranks mapped through the sorted union of the frequent labels and the row's
    /// positives, O(F) a row. The reference for the same draws.
    fn walked_sample(
        positives: &[Vec<u32>],
        n_labels: usize,
        frequent: &[u32],
        count: usize,
        rng: &mut ChaCha8Rng,
    ) -> Vec<(u32, u32, f64)> {
        let mut draw = RankDraw::new(n_labels);
        let mut out = Vec::new();
        let mut ranks = Vec::new();
        for (i, pos) in positives.iter().enumerate() {
            let mut skip: Vec<u32> = pos.iter().chain(frequent).copied().collect();
            skip.sort_unstable();
            skip.dedup();
            let n_neg = n_labels - skip.len();
            let take = count.min(n_labels).min(n_neg);
            if take == 0 {
                continue;
            }
            draw.sample(n_neg, take, rng, &mut ranks);
            ranks.sort_unstable();
            let (mut p, mut skipped) = (0usize, 0usize);
            for &r in &ranks {
                let r = r as usize;
                while p < skip.len() && (skip[p] as usize) <= r + skipped {
                    p += 1;
                    skipped += 1;
                }
                out.push((i as u32, (r + skipped) as u32, n_neg as f64 / take as f64));
            }
        }
        out.sort_by_key(|t| (t.0, t.1));
        out
    }

    #[test]
    fn the_sample_is_the_walks_sample_for_the_same_draws() {
        let mut gen = ChaCha8Rng::seed_from_u64(11);
        for case in 0..300 {
            let n_labels = gen.random_range(1..60usize);
            let mut frequent: Vec<u32> = (0..n_labels as u32)
                .filter(|_| gen.random_bool(if case % 3 == 0 { 0.0 } else { 0.4 }))
                .collect();
            frequent.dedup();
            let positives: Vec<Vec<u32>> = (0..gen.random_range(1..6))
                .map(|_| {
                    // Unsorted, some inside the frequent labels, sometimes every label.
                    let all = gen.random_bool(0.05);
                    let mut row: Vec<u32> = (0..n_labels as u32)
                        .filter(|_| all || gen.random_bool(0.2))
                        .collect();
                    row.reverse();
                    row
                })
                .collect();
            let count = gen.random_range(0..n_labels + 3);
            let seed = gen.random::<u64>();
            let terms = terms_stratified_rest(
                &positives,
                n_labels,
                &frequent,
                count,
                1.0,
                &mut ChaCha8Rng::seed_from_u64(seed),
            );
            let mut sampled: Vec<(u32, u32, f64)> = terms
                .iter()
                .filter(|t| t.y < 0.0)
                .map(|t| (t.row, t.label, t.weight))
                .collect();
            sampled.sort_by_key(|t| (t.0, t.1));
            let walked = walked_sample(
                &positives,
                n_labels,
                &frequent,
                count,
                &mut ChaCha8Rng::seed_from_u64(seed),
            );
            assert_eq!(sampled, walked, "case {case}");
            // The rest holds every positive outside the frequent labels, once.
            for (i, pos) in positives.iter().enumerate() {
                let mut got: Vec<u32> = terms
                    .iter()
                    .filter(|t| t.row == i as u32 && t.y > 0.0)
                    .map(|t| t.label)
                    .collect();
                got.sort_unstable();
                let mut want: Vec<u32> = pos
                    .iter()
                    .copied()
                    .filter(|k| frequent.binary_search(k).is_err())
                    .collect();
                want.sort_unstable();
                assert_eq!(got, want, "case {case}, row {i}");
            }
        }
    }
}
