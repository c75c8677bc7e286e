//! `--validation-fraction F --validation-seed S`: a validation split carved out of the
//! training rows while they stream, for choosing a configuration without looking at the
//! test split.
//!
//! A training row goes to `validation` iff a seeded hash of its row index falls below F:
//!
//! ```text
//! validation(i)  ⇔  xxh3_64(i as 8 little-endian bytes, seed = S) < ⌊F · 2⁶⁴⌋
//! ```
//!
//! where i is the 0-based index of the row among the data rows of the file it is read from
//! (its source line number − 2, the header being line 1). The decision is a pure function
//! of (S, F, i): it needs no pass over the data, no count of the rows and no memory, and it
//! does not depend on the thread count, the parser's blocks or the chunk size, so the same
//! input, F and S give the same splits byte for byte. The price is that the split's size is
//! binomial rather than exact: n_validation ~ Binomial(N, F) over N training rows, standard
//! deviation √(N F (1 − F)) rows (56 rows for Delicious's 12 920 rows at F = 0.2). An exact
//! count (a seeded choice of ⌊F·N⌋ of N indices) would need N before the first row is
//! written, which a streaming ingest of a file larger than RAM does not have (headers can
//! lie, `--lenient` skips rows), and a second pass or a bitmap of N entries to apply it.
//!
//! `--validation-folds K --validation-fold I` (1 ≤ I ≤ K) carves fold I of K instead: the
//! row goes to validation iff its hash falls in the I-th of K equal parts of the hash range,
//!
//! ```text
//! fold(i) = I  ⇔  ⌊(I − 1)/K · 2⁶⁴⌋ ≤ xxh3_64(i, seed = S) < ⌊I/K · 2⁶⁴⌋   (the last: < 2⁶⁴)
//! ```
//!
//! so the K folds of one seed are disjoint and cover every training row (each row is
//! validated in exactly one of them), and fold 1 of K is the carve of fraction 1/K with the
//! same seed, row for row. `pipeline fit` chooses by them on small data (docs/fit.md).

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::store::catalog::Split;

/// The split a carved validation split ([`Split::Validation`]) is taken from.
pub const CARVED_FROM: Split = Split::Train;

/// The most folds `--validation-folds` takes: more would validate on folds of a handful
/// of rows each, and each fold is a dataset of its own.
pub const MAX_FOLDS: u32 = 100;

/// A seeded, deterministic selection of training rows for the validation split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValidationSplit {
    /// Which rows: a share of them, or one of K folds.
    pub rows: Carved,
    /// Seed of the row hash.
    pub seed: u64,
}

/// The rows a [`ValidationSplit`] takes, by where their hash falls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Carved {
    /// Expected share of the training rows that go to validation, in (0, 1)
    /// (`--validation-fraction`).
    Fraction(f64),
    /// Fold `fold` (1-based) of `folds` equal parts of the hash range (`--validation-fold`,
    /// `--validation-folds`): 1 ≤ fold ≤ folds, 2 ≤ folds ≤ [`MAX_FOLDS`].
    Fold { fold: u32, folds: u32 },
}

/// ⌊F · 2⁶⁴⌋ for F in [0, 1): the hash below which a share F of rows falls (fits a u64).
fn threshold(fraction: f64) -> u64 {
    (fraction * 18_446_744_073_709_551_616.0) as u64
}

impl ValidationSplit {
    /// The carve of `--validation-fraction fraction --validation-seed seed`.
    pub fn fraction(fraction: f64, seed: u64) -> Self {
        ValidationSplit {
            rows: Carved::Fraction(fraction),
            seed,
        }
    }

    /// The carve of `--validation-folds folds --validation-fold fold --validation-seed seed`.
    pub fn fold(fold: u32, folds: u32, seed: u64) -> Self {
        ValidationSplit {
            rows: Carved::Fold { fold, folds },
            seed,
        }
    }

    /// The ingest options that ask for this carve, as the catalog's parameters and a
    /// spec's `[ingest]` table name them: `validation_fraction`, or `validation_folds` and
    /// `validation_fold`; then `validation_seed`.
    pub fn keys(&self) -> Vec<(&'static str, serde_json::Value)> {
        let mut o = match self.rows {
            Carved::Fraction(f) => vec![("validation_fraction", serde_json::json!(f))],
            Carved::Fold { fold, folds } => vec![
                ("validation_folds", serde_json::json!(folds)),
                ("validation_fold", serde_json::json!(fold)),
            ],
        };
        o.push(("validation_seed", serde_json::json!(self.seed)));
        o
    }

    /// Whether the training row with 0-based data-row index `index` goes to validation.
    pub fn selects(&self, index: u64) -> bool {
        let hash = xxh3_64_with_seed(&index.to_le_bytes(), self.seed);
        match self.rows {
            Carved::Fraction(f) => hash < threshold(f),
            // The bounds as the fraction's threshold computes them, so that fold 1 of K is
            // the carve of fraction 1/K; the last fold has no upper bound (2⁶⁴ is no u64).
            Carved::Fold { fold, folds } => {
                let share = |i: u32| f64::from(i) / f64::from(folds);
                hash >= threshold(share(fold - 1))
                    && (fold == folds || hash < threshold(share(fold)))
            }
        }
    }

    /// The carve as its options read (`--validation-fraction 0.2 --validation-seed 0`), for
    /// messages.
    pub fn options(&self) -> String {
        let flags = self.keys().into_iter();
        let flags = flags.map(|(key, value)| format!("--{} {value}", key.replace('_', "-")));
        flags.collect::<Vec<_>>().join(" ")
    }

    /// Whether `fraction` is one this split accepts: a finite number strictly between 0
    /// and 1 (0 would carve nothing and 1 would leave no training rows).
    pub fn fraction_ok(fraction: f64) -> bool {
        fraction.is_finite() && fraction > 0.0 && fraction < 1.0
    }

    /// Whether fold `fold` of `folds` is one this split accepts: 2 to [`MAX_FOLDS`] folds
    /// (one fold would validate on every row and train on none), 1 ≤ fold ≤ folds.
    pub fn fold_ok(fold: u32, folds: u32) -> bool {
        (2..=MAX_FOLDS).contains(&folds) && (1..=folds).contains(&fold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The carve's options, spelt as flags for messages and as keys for the catalog and
    /// a spec, from one list.
    #[test]
    fn a_carve_names_its_options_once() {
        let fraction = ValidationSplit::fraction(0.2, 7);
        assert_eq!(
            fraction.options(),
            "--validation-fraction 0.2 --validation-seed 7"
        );
        let fold = ValidationSplit::fold(2, 5, 0);
        assert_eq!(
            fold.options(),
            "--validation-folds 5 --validation-fold 2 --validation-seed 0"
        );
        let keys: Vec<&str> = fold.keys().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            ["validation_folds", "validation_fold", "validation_seed"]
        );
    }

    #[test]
    fn the_selection_is_a_function_of_seed_fraction_and_index() {
        let a = ValidationSplit::fraction(0.2, 0);
        let picked: Vec<u64> = (0..10_000).filter(|&i| a.selects(i)).collect();
        let again: Vec<u64> = (0..10_000).filter(|&i| a.selects(i)).collect();
        assert_eq!(picked, again);
        // Another seed picks other rows; a larger fraction picks a superset (same hashes,
        // a higher threshold).
        let other_seed = ValidationSplit::fraction(0.2, 1);
        let by_other: Vec<u64> = (0..10_000).filter(|&i| other_seed.selects(i)).collect();
        assert_ne!(picked, by_other);
        let larger = ValidationSplit::fraction(0.3, 0);
        assert!(picked.iter().all(|&i| larger.selects(i)));
        // Binomial(10 000, 0.2): standard deviation 40 rows; 5 of them is 200.
        assert!((picked.len() as i64 - 2000).abs() < 200, "{}", picked.len());
    }

    #[test]
    fn the_threshold_is_f_times_two_to_the_64() {
        assert_eq!(threshold(0.5), 1u64 << 63);
        assert_eq!(threshold(0.25), 1u64 << 62);
        for bad in [0.0, 1.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
            assert!(!ValidationSplit::fraction_ok(bad), "{bad}");
        }
        assert!(ValidationSplit::fraction_ok(1e-9) && ValidationSplit::fraction_ok(0.999));
    }

    /// The fold of each of `n` rows under `folds` folds of `seed` (0 when none selects it),
    /// failing the test when two select the same row.
    fn fold_of_each(n: u64, folds: u32, seed: u64) -> Vec<u32> {
        (0..n)
            .map(|i| {
                let selecting: Vec<u32> = (1..=folds)
                    .filter(|&f| ValidationSplit::fold(f, folds, seed).selects(i))
                    .collect();
                assert!(selecting.len() <= 1, "row {i} in folds {selecting:?}");
                selecting.first().copied().unwrap_or(0)
            })
            .collect()
    }

    #[test]
    fn folds_are_disjoint_cover_every_row_and_follow_the_seed() {
        for folds in [2, 3, 5, 7, 10] {
            let of = fold_of_each(5_000, folds, 3);
            // Every row in exactly one fold (disjointness is checked as they are listed).
            assert!(of.iter().all(|&f| f >= 1), "{folds} folds leave a row out");
            // Each fold about a K-th: Binomial(5 000, 1/K) has sd ≤ 36 rows; 6 of them.
            for f in 1..=folds {
                let size = of.iter().filter(|&&x| x == f).count() as f64;
                let expected = 5_000.0 / f64::from(folds);
                assert!(
                    (size - expected).abs() < 216.0,
                    "fold {f} of {folds}: {size}"
                );
            }
            // Deterministic for a seed, different for another.
            assert_eq!(of, fold_of_each(5_000, folds, 3));
            assert_ne!(of, fold_of_each(5_000, folds, 4));
        }
    }

    #[test]
    fn fold_one_of_k_is_the_carve_of_fraction_one_over_k() {
        for (folds, fraction) in [(2, 0.5), (4, 0.25), (5, 0.2), (10, 0.1)] {
            let fold = ValidationSplit::fold(1, folds, 9);
            let carve = ValidationSplit::fraction(fraction, 9);
            assert!(
                (0..20_000).all(|i| fold.selects(i) == carve.selects(i)),
                "{folds}"
            );
        }
    }

    #[test]
    fn fold_numbers_outside_one_to_k_are_refused() {
        assert!(ValidationSplit::fold_ok(1, 2) && ValidationSplit::fold_ok(5, 5));
        assert!(ValidationSplit::fold_ok(MAX_FOLDS, MAX_FOLDS));
        for (fold, folds) in [(0, 5), (6, 5), (1, 1), (1, 0), (1, MAX_FOLDS + 1)] {
            assert!(!ValidationSplit::fold_ok(fold, folds), "{fold} of {folds}");
        }
    }
}
