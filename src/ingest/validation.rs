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

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::store::catalog::Split;

/// The split a carved validation split ([`Split::Validation`]) is taken from.
pub const CARVED_FROM: Split = Split::Train;

/// A seeded, deterministic selection of training rows for the validation split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValidationSplit {
    /// Expected share of the training rows that go to validation, in (0, 1).
    pub fraction: f64,
    /// Seed of the row hash.
    pub seed: u64,
}

impl ValidationSplit {
    /// ⌊F · 2⁶⁴⌋: hashes below it select a row (F in (0, 1), so it fits a u64).
    fn threshold(&self) -> u64 {
        (self.fraction * 18_446_744_073_709_551_616.0) as u64
    }

    /// Whether the training row with 0-based data-row index `index` goes to validation.
    pub fn selects(&self, index: u64) -> bool {
        xxh3_64_with_seed(&index.to_le_bytes(), self.seed) < self.threshold()
    }

    /// Whether `fraction` is one this split accepts: a finite number strictly between 0
    /// and 1 (0 would carve nothing and 1 would leave no training rows).
    pub fn fraction_ok(fraction: f64) -> bool {
        fraction.is_finite() && fraction > 0.0 && fraction < 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selection_is_a_function_of_seed_fraction_and_index() {
        let a = ValidationSplit {
            fraction: 0.2,
            seed: 0,
        };
        let picked: Vec<u64> = (0..10_000).filter(|&i| a.selects(i)).collect();
        let again: Vec<u64> = (0..10_000).filter(|&i| a.selects(i)).collect();
        assert_eq!(picked, again);
        // Another seed picks other rows; a larger fraction picks a superset (same hashes,
        // a higher threshold).
        let other_seed = ValidationSplit { seed: 1, ..a };
        let by_other: Vec<u64> = (0..10_000).filter(|&i| other_seed.selects(i)).collect();
        assert_ne!(picked, by_other);
        let larger = ValidationSplit { fraction: 0.3, ..a };
        assert!(picked.iter().all(|&i| larger.selects(i)));
        // Binomial(10 000, 0.2): standard deviation 40 rows; 5 of them is 200.
        assert!((picked.len() as i64 - 2000).abs() < 200, "{}", picked.len());
    }

    #[test]
    fn the_threshold_is_f_times_two_to_the_64() {
        let half = ValidationSplit {
            fraction: 0.5,
            seed: 7,
        };
        assert_eq!(half.threshold(), 1u64 << 63);
        let quarter = ValidationSplit {
            fraction: 0.25,
            ..half
        };
        assert_eq!(quarter.threshold(), 1u64 << 62);
        for bad in [0.0, 1.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
            assert!(!ValidationSplit::fraction_ok(bad), "{bad}");
        }
        assert!(ValidationSplit::fraction_ok(1e-9) && ValidationSplit::fraction_ok(0.999));
    }
}
