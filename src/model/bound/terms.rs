//! The likelihood terms of a bound: which (row, label, y, weight) enter it. Every label of
//! every row gives the bound with all negatives; the positives plus a uniform sample of
//! negatives reweighted by |N_i|/|L_i| give an unbiased estimate of it (`docs/model.md`,
//! "Utilities and the stochastic bound"). The N/|B| scaling is part of each term's weight.

use rand::seq::index::sample;
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
    let mut out = Vec::new();
    for (i, pos) in positives.iter().enumerate() {
        let mut sorted = pos.clone();
        sorted.sort_unstable();
        for &k in &sorted {
            out.push(Term {
                row: i as u32,
                label: k,
                y: 1.0,
                weight: scale,
            });
        }
        let n_neg = n_labels - sorted.len();
        let take = count.min(n_neg);
        if take == 0 {
            continue;
        }
        let weight = scale * n_neg as f64 / take as f64;
        // Sample ranks among the negatives, then map rank → label id skipping positives.
        let mut ranks: Vec<usize> = sample(rng, n_neg, take).into_vec();
        ranks.sort_unstable();
        let (mut p, mut skipped) = (0usize, 0usize);
        for r in ranks {
            // The label with negative-rank r is r + (number of positives ≤ it).
            while p < sorted.len() && (sorted[p] as usize) <= r + skipped {
                p += 1;
                skipped += 1;
            }
            out.push(Term {
                row: i as u32,
                label: (r + skipped) as u32,
                y: -1.0,
                weight,
            });
        }
    }
    out
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
    /// One true class per row and a likelihood that couples the row's K utilities
    /// (`likelihood/multiclass/mod.rs`): the bound's data part is scale · Σ_i E_q[log p(c_i | f_i)]. The
    /// per-term likelihood argument of the objective is not used for it.
    Classes(Classes<'a>),
}
