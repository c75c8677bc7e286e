//! Exact sums shared by every metric accumulator: real per-row contributions rounded once
//! to a fixed-point grid of 2⁻⁶⁴ and summed in `i128`, so that integer addition (which is
//! associative) makes any split of the rows into chunks, merged in any grouping, give
//! bit-identical sums (`docs/metrics.md`, "Exactness and chunking").

use anyhow::{ensure, Result};

/// Fixed-point scale of the exact sums: 2⁶⁴ (per-row contributions rounded to 2⁻⁶⁴).
const SCALE: f64 = 18_446_744_073_709_551_616.0;
/// Per-row contributions must stay below 2⁶² so that i128 sums have room for 2⁶⁴ of them.
const MAX_CONTRIBUTION: f64 = 4_611_686_018_427_387_904.0;

/// `v` rounded to the 2⁻⁶⁴ grid; an error when it is not finite or not below 2⁶² in size.
pub(super) fn to_fixed(v: f64) -> Result<i128> {
    ensure!(
        v.is_finite() && v.abs() < MAX_CONTRIBUTION,
        "metric contribution {v} out of the fixed-point range"
    );
    Ok((v * SCALE).round() as i128)
}

/// The real value of a fixed-point sum.
pub(super) fn from_fixed(s: i128) -> f64 {
    s as f64 / SCALE
}

pub(super) fn ratio(num: f64, den: f64) -> f64 {
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

/// Adds `row` into `acc` element-wise, or changes nothing and fails on overflow.
pub(super) fn add_all_i128(acc: &mut [i128], row: &[i128]) -> Result<()> {
    ensure!(
        acc.iter()
            .zip(row)
            .all(|(a, r)| a.checked_add(*r).is_some()),
        "fixed-point metric sum overflow"
    );
    for (a, r) in acc.iter_mut().zip(row) {
        *a += *r;
    }
    Ok(())
}
