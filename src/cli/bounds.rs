//! The parse-time bounds of the numeric options: one value parser per kind of bound, so a
//! value outside its option's range is refused by clap (exit 2) with the option and the
//! bound in the message, before anything is opened or allocated. `pipeline run`'s specs and
//! `fit --set` go through the same parsers. The bounds keep allocations and loops sane; a
//! real user never meets them (docs/options.md, "Limits of the numeric options").

use std::ops::Bound;

use clap::builder::{NonEmptyStringValueParser, RangedU64ValueParser, TypedValueParser};

// The bounds no library type holds already (the others are the library's own constants:
// `MAX_EPOCHS`, `MAX_STEPS`, `MAX_IDS`, `MAX_CHUNK_ROWS`, …). Each is far above any real
// run and far below what would overflow a size or run for days.

/// `synth --rows`, `--test-rows`: a billion rows is hundreds of GB of text.
pub const MAX_SYNTH_ROWS: u64 = 1_000_000_000;
/// `ingest --split-column`: split files have a column per random split (ten in the
/// repository's).
pub const MAX_SPLIT_COLUMN: u64 = 1_000;
/// `svd --kmeans-iters`: Lloyd's iterations converge in tens.
pub const MAX_KMEANS_ITERS: u64 = 10_000;
/// `train --batch`, `predict --block-rows`: rows held together in memory.
pub const MAX_BLOCK_ROWS: u64 = 1 << 24;
/// `train --quadrature`: Gauss–Hermite points (20 by default; the weights underflow long
/// before this many).
pub const MAX_QUADRATURE: u64 = 256;
/// `train --mc-pairs`: Monte Carlo pairs per row and step.
pub const MAX_MC_PAIRS: u64 = 100_000;
/// `train --amortiser-hidden`: the width of the amortisation network's layers.
pub const MAX_HIDDEN: u64 = 65_536;
/// `train --prefetch`, `--shuffle-chunks`: minibatches and chunks held in memory at once.
pub const MAX_PREFETCH: u64 = 4_096;
/// `evaluate --propensity-a` and `--propensity-b`: the published values are below 3.
pub const MAX_PROPENSITY: f64 = 100.0;
/// `status --runs`: rows listed.
pub const MAX_LISTED_RUNS: u64 = 1_000_000;

/// An integer option in `lo..=hi` (clap's message names the range: "0 is not in 1..=64").
pub fn int_in<T>(lo: u64, hi: u64) -> RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: std::error::Error + Send + Sync + 'static,
{
    RangedU64ValueParser::<T>::new().range(lo..=hi)
}

/// The id of a run in the catalog: at least 1 (ids count from 1).
pub fn run_id() -> impl TypedValueParser<Value = i64> {
    clap::value_parser!(i64).range(1..)
}

/// `--threads`: 1 to [`crate::stage::max_threads`] (a few per core of this machine).
pub fn threads() -> RangedU64ValueParser<usize> {
    let most = crate::stage::max_threads();
    int_in(1, most as u64)
}

/// A seed: any integer a spec can hold too (TOML's integers are signed 64-bit, and `fit`
/// writes the spec that reproduces its model), so 0 to 2⁶³ − 1.
pub fn seed() -> RangedU64ValueParser<u64> {
    int_in(0, i64::MAX as u64)
}

/// A real option in the interval from `lo` to `hi` (each bound open or closed), finite.
pub fn real_in(lo: Bound<f64>, hi: Bound<f64>) -> impl TypedValueParser<Value = f64> {
    NonEmptyStringValueParser::new().try_map(move |text| parse_real(&text, lo, hi))
}

/// A fraction strictly between 0 and 1.
pub fn open_fraction() -> impl TypedValueParser<Value = f64> {
    real_in(Bound::Excluded(0.0), Bound::Excluded(1.0))
}

/// A positive finite real: a step size, whose too large values the training catches as
/// they blow up (it stops at its last finite checkpoint, naming the option).
pub fn positive_finite() -> impl TypedValueParser<Value = f64> {
    real_in(Bound::Excluded(0.0), Bound::Unbounded)
}

/// A positive real, at most `most`.
pub fn positive_at_most(most: f64) -> impl TypedValueParser<Value = f64> {
    real_in(Bound::Excluded(0.0), Bound::Included(most))
}

/// `text` as a finite number within the bounds, or the message naming them.
fn parse_real(text: &str, lo: Bound<f64>, hi: Bound<f64>) -> Result<f64, String> {
    let interval = interval(lo, hi);
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("expected a number in {interval}"))?;
    let above_lo = match lo {
        Bound::Included(l) => value >= l,
        Bound::Excluded(l) => value > l,
        Bound::Unbounded => true,
    };
    let below_hi = match hi {
        Bound::Included(h) => value <= h,
        Bound::Excluded(h) => value < h,
        Bound::Unbounded => true,
    };
    // NaN fails every comparison, so it is refused with the others.
    if value.is_finite() && above_lo && below_hi {
        Ok(value)
    } else {
        Err(format!("{text} is not in {interval}"))
    }
}

/// `(0, 1]`, `[0, 1)`, … as a mathematician writes it.
fn interval(lo: Bound<f64>, hi: Bound<f64>) -> String {
    let lo = match lo {
        Bound::Included(l) => format!("[{l}"),
        Bound::Excluded(l) => format!("({l}"),
        Bound::Unbounded => "(-∞".into(),
    };
    let hi = match hi {
        Bound::Included(h) => format!("{h}]"),
        Bound::Excluded(h) => format!("{h})"),
        Bound::Unbounded => "∞)".into(),
    };
    format!("{lo}, {hi}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reals_outside_their_interval_are_refused_naming_it() {
        let open = (Bound::Excluded(0.0), Bound::Excluded(1.0));
        assert_eq!(parse_real("0.2", open.0, open.1), Ok(0.2));
        for bad in ["0", "1", "NaN", "inf", "-1", "1e300"] {
            let e = parse_real(bad, open.0, open.1).unwrap_err();
            assert_eq!(e, format!("{bad} is not in (0, 1)"));
        }
        assert_eq!(
            parse_real("x", Bound::Included(0.0), Bound::Unbounded).unwrap_err(),
            "expected a number in [0, ∞)"
        );
        // Finite, even without an upper bound.
        assert!(parse_real("1e400", Bound::Unbounded, Bound::Unbounded).is_err());
    }
}
