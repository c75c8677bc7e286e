//! The svd rank R and the inducing count M that fit gives its candidates, from the
//! selection data's sizes and the memory R costs (`docs/svd.md`, "Sizes for `pipeline
//! fit`", has the measurements behind each constant).

use crate::svd::SvdMemory;

/// R's floor where D allows it: the paper's R for Delicious (D = 500), and the rank fit
/// used whatever D was before it measured the text sets.
pub const MIN_RANK: u64 = 250;

/// R's ceiling: the paper's R for RCV1 (D = 47 236) and AmazonCat (D = 203 882).
pub const MAX_RANK: u64 = 2000;

/// M of the multi-label linear models. The paper used 500 for every set; on the
/// validation splits of the four text sets (stackex_chess, yahoo_business, rcv1sub2,
/// Delicious) M = 200 scored the same P@1 as 500 at equal steps, within the splits' noise,
/// at a fraction of the step (0.16 against 2.6 s on rcv1sub2, 0.30 against 0.57 on
/// stackex_chess; the step costs about 5⅓M³ a latent GP), and fit's budget buys steps,
/// which stackex_chess's final model lacked (docs/experiments/text-quality.md). Free
/// inducing inputs in input space hold M × D, so 200 also takes 2.5 times less memory.
pub const LINEAR_INDUCING: u64 = 200;

/// Extra random directions of fit's svd runs (svd's `--oversample` default, which fit
/// does not change): they enter the memory of the passes.
const OVERSAMPLE: u64 = 20;

/// Seconds an svd run of fit takes per unit of D·(R + 20)², the flops of its
/// orthonormalisation, which dominate on text: R = 2 000 on yahoo_business's training
/// split (D = 21 924) took 50 s with its passes and k-means on the project's 2-core VM
/// (release build, quiet; docs/svd.md, "Sizes for `pipeline fit`"). A faster machine
/// makes the bound below conservative.
pub const SVD_SECONDS_PER_UNIT: f64 = 5.6e-10;

/// The share of fit's budget its two svd runs of the subspace's R (the selection's and the
/// final model's, which ingests the whole file) may take together. A tenth: at equal steps
/// R = 2 000 gained half a point of validation P@1 over R = 250 on the text sets while its
/// svd cost 16–20 times as much and its step 2.5–2.8 times, so time spent on R beyond
/// this buys less than the steps it takes away.
pub const SVD_BUDGET_SHARE: f64 = 0.1;

/// Seconds one svd run of fit may take within a budget of `budget` seconds.
pub fn svd_seconds(budget: f64) -> f64 {
    budget * SVD_BUDGET_SHARE / 2.0
}

/// The memory an svd run of fit may hold, when the system gives no figure: the limit
/// train assumes for inducing inputs in input space.
const UNKNOWN_MEMORY: u64 = 4 << 30;

/// The bytes fit lets its svd runs' passes hold: half of what the system says a new
/// allocation can get now (`MemAvailable`, or `FSGP_AVAILABLE_MEMORY_BYTES`), so that the
/// runs beside fit on a shared machine can grow by as much again before the svd's own
/// check, against all of it, refuses.
pub fn svd_memory() -> anyhow::Result<u64> {
    Ok(crate::memtrace::available_memory_bytes()?.map_or(UNKNOWN_MEMORY, |bytes| bytes / 2))
}

/// What fit's svd runs and linear candidates are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubspaceSizes {
    /// R of the subspace inducing inputs.
    pub rank: u64,
    /// R of an svd run that only starts free inducing inputs (k-means in its projection):
    /// at most [`MIN_RANK`], which is R = D − 1 up to D = 251 (all but one direction).
    pub start_rank: u64,
    /// M of the linear models (subspace and free Z), at most N.
    pub linear_inducing: u64,
}

/// R and M for a training split of `n` rows and `d` features, when the svd's passes may
/// hold at most `memory` bytes and an svd run may take `seconds` ([`svd_seconds`]).
///
/// R is half of D (the paper chose R "close to half of the dimensionality" of its
/// small sets), at least [`MIN_RANK`] and at most [`MAX_RANK`]; then at most D − 1 and
/// N − 1 (the basis spans at most min(N, D) directions), and at most what the passes'
/// Q and B (16·D·(R + 20) bytes, [`SvdMemory::passes_bytes`]) fit in `memory`. Nothing
/// else a run holds grows as fast with R: K_XX̃ (4·N·R bytes) is a memory-mapped file, and
/// the training step's R-sized parts (A with its Adam copies, the queued rows in the
/// basis) are a few hundred MB at R = 2 000 and M = 500. And R above [`MIN_RANK`] is at
/// most what an svd run predicted at [`SVD_SECONDS_PER_UNIT`] affords in `seconds`
/// (never below [`MIN_RANK`], the rank fit used before it sized R: a short budget gets
/// what it got then).
///
/// Neither the rows' non-zeros nor L enter: on sparse text the svd's time is its
/// orthonormalisation's D·(R + 20)² flops, far above the passes' nnz(X)·(R + 20) (84 times
/// at yahoo_business's shape), and L reaches the step through P, which train decides.
pub fn sizes_for(n: u64, d: u64, memory: u64, seconds: f64) -> SubspaceSizes {
    let wanted = (d / 2)
        .clamp(MIN_RANK, MAX_RANK)
        .min(rank_in_time(d, seconds).max(MIN_RANK));
    let spanned = d.saturating_sub(1).min(n.saturating_sub(1));
    let in_memory = rank_in_memory(d, memory);
    SubspaceSizes {
        rank: wanted.min(spanned).min(in_memory).max(1),
        start_rank: MIN_RANK.min(spanned).min(in_memory).max(1),
        linear_inducing: LINEAR_INDUCING.min(n).max(1),
    }
}

/// The largest R whose svd at D = `d` is predicted to take at most `seconds` (any R for
/// an unbounded time).
fn rank_in_time(d: u64, seconds: f64) -> u64 {
    let directions = (seconds / (SVD_SECONDS_PER_UNIT * d.max(1) as f64)).sqrt();
    match directions.is_finite() {
        true => (directions.max(0.0).floor() as u64).saturating_sub(OVERSAMPLE),
        false => u64::MAX,
    }
}

/// The largest R whose passes fit in `memory` bytes at D = `d` (0 when none does).
fn rank_in_memory(d: u64, memory: u64) -> u64 {
    let per_direction = SvdMemory::passes_bytes(d, 1, 0).max(1);
    (memory / per_direction).saturating_sub(OVERSAMPLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn small_feature_counts_bound_the_rank() {
        // D = 2: one direction below D; D = 200: D − 1 (below the floor of 250).
        assert_eq!(sizes_for(60, 2, 8 * GIB, f64::INFINITY).rank, 1);
        assert_eq!(sizes_for(10_000, 200, 8 * GIB, f64::INFINITY).rank, 199);
        // Delicious (D = 500): the floor, the paper's 250.
        assert_eq!(sizes_for(10_355, 500, 8 * GIB, f64::INFINITY).rank, 250);
        // A start for free Z: at most 250 whatever D.
        assert_eq!(sizes_for(60, 2, 8 * GIB, f64::INFINITY).start_rank, 1);
        assert_eq!(
            sizes_for(50_000, 784, 8 * GIB, f64::INFINITY).start_rank,
            250
        );
        assert_eq!(sizes_for(50_000, 784, 8 * GIB, f64::INFINITY).rank, 392);
        // Bibtex-like D = 1 836: half of D (the paper: 1 000).
        assert_eq!(sizes_for(5_000, 1_836, 8 * GIB, f64::INFINITY).rank, 918);
    }

    #[test]
    fn tens_of_thousands_of_features_get_the_papers_rank_when_memory_allows() {
        // yahoo_business and rcv1sub2's shapes: 16·D·2 020 bytes is 0.7 and 1.5 GB.
        assert_eq!(sizes_for(7_153, 21_924, 4 * GIB, f64::INFINITY).rank, 2_000);
        assert_eq!(sizes_for(3_825, 47_236, 4 * GIB, f64::INFINITY).rank, 2_000);
        // AmazonCat's D = 203 882 needs 6.6 GB of passes at R = 2 000: at 4 GiB, less.
        let r = sizes_for(1_000_000, 203_882, 4 * GIB, f64::INFINITY).rank;
        assert_eq!(r, 4 * GIB / (16 * 203_882) - 20);
        assert!(SvdMemory::passes_bytes(203_882, r, 20) <= 4 * GIB);
        assert!(SvdMemory::passes_bytes(203_882, r + 1, 20) > 4 * GIB);
        assert_eq!(
            sizes_for(1_000_000, 203_882, 8 * GIB, f64::INFINITY).rank,
            2_000
        );
    }

    #[test]
    fn the_rows_bound_the_rank_and_m() {
        let s = sizes_for(150, 47_236, 4 * GIB, f64::INFINITY);
        assert_eq!(s.rank, 149, "R < N");
        assert_eq!(s.linear_inducing, 150, "M ≤ N");
        assert_eq!(sizes_for(1, 47_236, 4 * GIB, f64::INFINITY).rank, 1);
        assert_eq!(
            sizes_for(10_000, 47_236, 4 * GIB, f64::INFINITY).linear_inducing,
            LINEAR_INDUCING
        );
    }

    /// Two svd runs may take a tenth of the budget: R = 2 000 at yahoo_business's D took
    /// 50 s, so five minutes afford about 1 085 and one minute the floor's neighbourhood;
    /// a short budget never goes below 250, and a long one reaches the data's R.
    #[test]
    fn the_budget_bounds_the_rank_above_the_floor() {
        let at = |d: u64, budget: f64| sizes_for(7_153, d, 4 * GIB, svd_seconds(budget)).rank;
        let five_minutes = at(21_924, 300.0);
        assert!((1_000..1_200).contains(&five_minutes), "{five_minutes}");
        let seconds = SVD_SECONDS_PER_UNIT * 21_924.0 * ((five_minutes + 20) as f64).powi(2);
        assert!(seconds <= svd_seconds(300.0), "{seconds}");
        let one_more = SVD_SECONDS_PER_UNIT * 21_924.0 * ((five_minutes + 21) as f64).powi(2);
        assert!(one_more > svd_seconds(300.0), "{one_more}");
        assert_eq!(at(21_924, 60.0), 474);
        assert_eq!(at(21_924, 5.0), MIN_RANK, "never below the floor");
        assert_eq!(at(21_924, 3600.0), MAX_RANK);
        assert_eq!(at(500, 5.0), 250, "Delicious keeps the paper's R");
        assert_eq!(at(21_924, f64::INFINITY), MAX_RANK);
    }

    #[test]
    fn no_memory_still_gives_one_direction() {
        // svd's own memory check then refuses the run, naming what it needs.
        assert_eq!(sizes_for(10_000, 47_236, 0, f64::INFINITY).rank, 1);
    }
}
