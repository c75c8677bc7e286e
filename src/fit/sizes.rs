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

/// Seconds an svd run of fit takes per unit of D·(R + 20)², its orthonormalisation of the
/// feature-side basis, which dominates on text of a few thousand rows. This and the two
/// rates below are a least-squares fit (relative errors) to twelve svd runs of fit on the
/// project's 2-core VM (release build, quiet): yahoo_business, rcv1sub2, stackex_chess,
/// Delicious, MNIST and synthetic sets of 14 000 to 949 000 rows; predicted within
/// −16 % to +19 % of the measured seconds above one second (docs/svd.md, "Sizes for
/// `pipeline fit`"). A faster machine makes the bound below conservative.
pub const SVD_SECONDS_PER_UNIT: f64 = 4.8e-10;
/// Seconds an svd run takes per unit of nnz(X)·(R + 20): its passes' sparse products.
pub const SVD_SECONDS_PER_NONZERO: f64 = 1.25e-9;
/// Seconds an svd run takes per unit of N·(R + 20): the row-side blocks each pass writes
/// and reads (and K_XX̃), which dominate at hundreds of thousands of rows: 111.6 of an
/// svd run's seconds at R = 342 on 949 000 rows, where the D·(R + 20)² term predicts 13.
pub const SVD_SECONDS_PER_ROW: f64 = 2.6e-7;

/// The seconds an svd run of rank `rank` is predicted to take on `n` rows of `d` features
/// holding `nnz` non-zeros.
pub fn svd_run_seconds(n: u64, d: u64, nnz: u64, rank: u64) -> f64 {
    let k = (rank + OVERSAMPLE) as f64;
    SVD_SECONDS_PER_UNIT * d as f64 * k * k
        + (SVD_SECONDS_PER_NONZERO * nnz as f64 + SVD_SECONDS_PER_ROW * n as f64) * k
}

/// How much longer than its share ([`svd_seconds`]) the subspace's svd run at its rank may
/// be predicted to take before the exact weights, which need no basis, go first where the
/// subspace would (above `rule::MANY_LABELS`): five times, when the two runs (the
/// selection's and the final model's) would take half the budget and leave too little to
/// train. On AmazonCat's shape (949 000 selection rows, D = 203 882) even R = 250 is
/// predicted at 96 s a run, and a five-minute fit with the subspace first spent 112 s on
/// its first svd run alone; on 240 000 rows (30 s a run) the subspace first still ended
/// within the budget.
pub const SUBSPACE_SVD_STRETCH: f64 = 5.0;

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
    /// Whether an svd run of `rank` is predicted to take at most [`SUBSPACE_SVD_STRETCH`]
    /// times the time an svd run may take: when not, the subspace does not lead the list.
    pub subspace_in_time: bool,
}

/// R and M for a training split of `n` rows and `d` features holding `nnz` non-zeros, when
/// the svd's passes may hold at most `memory` bytes and an svd run may take `seconds`
/// ([`svd_seconds`]).
///
/// R is half of D (the paper chose R "close to half of the dimensionality" of its
/// small sets), at least [`MIN_RANK`] and at most [`MAX_RANK`]; then at most D − 1 and
/// N − 1 (the basis spans at most min(N, D) directions), and at most what the passes'
/// Q and B (16·D·(R + 20) bytes, [`SvdMemory::passes_bytes`]) fit in `memory`. Nothing
/// else a run holds grows as fast with R: K_XX̃ (4·N·R bytes) is a memory-mapped file, and
/// the training step's R-sized parts (A with its Adam copies, the queued rows in the
/// basis) are a few hundred MB at R = 2 000 and M = 500. And R above [`MIN_RANK`] is at
/// most what an svd run predicted by [`svd_run_seconds`] affords in `seconds` (never below
/// [`MIN_RANK`], the rank fit used before it sized R: a short budget gets what it got
/// then; [`SubspaceSizes::subspace_in_time`] says when even that is far past the time).
///
/// L does not enter: it reaches the step through P, which train decides.
pub fn sizes_for(n: u64, d: u64, nnz: u64, memory: u64, seconds: f64) -> SubspaceSizes {
    let wanted = (d / 2)
        .clamp(MIN_RANK, MAX_RANK)
        .min(rank_in_time(n, d, nnz, seconds).max(MIN_RANK));
    let spanned = d.saturating_sub(1).min(n.saturating_sub(1));
    let in_memory = rank_in_memory(d, memory);
    let rank = wanted.min(spanned).min(in_memory).max(1);
    SubspaceSizes {
        rank,
        start_rank: MIN_RANK.min(spanned).min(in_memory).max(1),
        linear_inducing: LINEAR_INDUCING.min(n).max(1),
        subspace_in_time: svd_run_seconds(n, d, nnz, rank) <= SUBSPACE_SVD_STRETCH * seconds,
    }
}

/// The largest R whose svd run on `n` rows, `d` features and `nnz` non-zeros is predicted
/// to take at most `seconds` ([`svd_run_seconds`], a quadratic in R + 20; any R for an
/// unbounded time).
fn rank_in_time(n: u64, d: u64, nnz: u64, seconds: f64) -> u64 {
    let quadratic = SVD_SECONDS_PER_UNIT * d as f64;
    let linear = SVD_SECONDS_PER_NONZERO * nnz as f64 + SVD_SECONDS_PER_ROW * n as f64;
    let directions = match quadratic > 0.0 {
        true => ((linear * linear + 4.0 * quadratic * seconds).sqrt() - linear) / (2.0 * quadratic),
        false => seconds / linear,
    };
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
        assert_eq!(sizes_for(60, 2, 0, 8 * GIB, f64::INFINITY).rank, 1);
        assert_eq!(sizes_for(10_000, 200, 0, 8 * GIB, f64::INFINITY).rank, 199);
        // Delicious (D = 500): the floor, the paper's 250.
        assert_eq!(sizes_for(10_355, 500, 0, 8 * GIB, f64::INFINITY).rank, 250);
        // A start for free Z: at most 250 whatever D.
        assert_eq!(sizes_for(60, 2, 0, 8 * GIB, f64::INFINITY).start_rank, 1);
        assert_eq!(
            sizes_for(50_000, 784, 0, 8 * GIB, f64::INFINITY).start_rank,
            250
        );
        assert_eq!(sizes_for(50_000, 784, 0, 8 * GIB, f64::INFINITY).rank, 392);
        // Bibtex-like D = 1 836: half of D (the paper: 1 000).
        assert_eq!(sizes_for(5_000, 1_836, 0, 8 * GIB, f64::INFINITY).rank, 918);
    }

    #[test]
    fn tens_of_thousands_of_features_get_the_papers_rank_when_memory_allows() {
        // yahoo_business and rcv1sub2's shapes: 16·D·2 020 bytes is 0.7 and 1.5 GB.
        assert_eq!(
            sizes_for(7_153, 21_924, 0, 4 * GIB, f64::INFINITY).rank,
            2_000
        );
        assert_eq!(
            sizes_for(3_825, 47_236, 0, 4 * GIB, f64::INFINITY).rank,
            2_000
        );
        // AmazonCat's D = 203 882 needs 6.6 GB of passes at R = 2 000: at 4 GiB, less.
        let r = sizes_for(1_000_000, 203_882, 0, 4 * GIB, f64::INFINITY).rank;
        assert_eq!(r, 4 * GIB / (16 * 203_882) - 20);
        assert!(SvdMemory::passes_bytes(203_882, r, 20) <= 4 * GIB);
        assert!(SvdMemory::passes_bytes(203_882, r + 1, 20) > 4 * GIB);
        assert_eq!(
            sizes_for(1_000_000, 203_882, 0, 8 * GIB, f64::INFINITY).rank,
            2_000
        );
    }

    #[test]
    fn the_rows_bound_the_rank_and_m() {
        let s = sizes_for(150, 47_236, 0, 4 * GIB, f64::INFINITY);
        assert_eq!(s.rank, 149, "R < N");
        assert_eq!(s.linear_inducing, 150, "M ≤ N");
        assert_eq!(sizes_for(1, 47_236, 0, 4 * GIB, f64::INFINITY).rank, 1);
        assert_eq!(
            sizes_for(10_000, 47_236, 0, 4 * GIB, f64::INFINITY).linear_inducing,
            LINEAR_INDUCING
        );
    }

    /// Two svd runs may take a tenth of the budget: the rank is the largest whose predicted
    /// run fits a twentieth, above the floor; a short budget never goes below 250, and a
    /// long one reaches the data's R.
    #[test]
    fn the_budget_bounds_the_rank_above_the_floor() {
        // yahoo_business's selection split: 7 153 rows, 738 611 non-zeros.
        let (n, d, nnz) = (7_153, 21_924, 738_611);
        let at = |budget: f64| sizes_for(n, d, nnz, 4 * GIB, svd_seconds(budget)).rank;
        let five_minutes = at(300.0);
        assert!((900..1_200).contains(&five_minutes), "{five_minutes}");
        assert!(svd_run_seconds(n, d, nnz, five_minutes) <= svd_seconds(300.0));
        assert!(svd_run_seconds(n, d, nnz, five_minutes + 1) > svd_seconds(300.0));
        let one_minute = at(60.0);
        assert!(
            (MIN_RANK..five_minutes).contains(&one_minute),
            "{one_minute}"
        );
        assert_eq!(at(5.0), MIN_RANK, "never below the floor");
        assert_eq!(at(3600.0), MAX_RANK);
        assert_eq!(at(f64::INFINITY), MAX_RANK);
        assert_eq!(
            sizes_for(10_355, 500, 187_597, 4 * GIB, svd_seconds(5.0)).rank,
            250,
            "Delicious keeps the paper's R"
        );
    }

    /// The prediction against a hand-worked case of each term, and the rows' terms
    /// bounding R where the orthonormalisation alone would not.
    #[test]
    fn the_rows_and_their_non_zeros_enter_the_svd_time() {
        // k = 80: 4.8e-10·1 000·6 400 + (1.25e-9·1e6 + 2.6e-7·1e4)·80.
        let hand = 4.8e-10 * 1_000.0 * 6_400.0 + (1.25e-9 * 1e6 + 2.6e-7 * 1e4) * 80.0;
        assert!((svd_run_seconds(10_000, 1_000, 1_000_000, 60) - hand).abs() < 1e-12);
        // 240 000 rows of 71 non-zeros at D = 203 882, five minutes: the rows' terms hold
        // R at the floor (predicted at 30 s, twice its share), and the subspace still
        // leads.
        let (n, d, nnz) = (239_936, 203_882, 17_019_248);
        let rows = sizes_for(n, d, nnz, 8 * GIB, svd_seconds(300.0));
        assert_eq!(rows.rank, MIN_RANK);
        assert!(svd_run_seconds(n, d, nnz, MIN_RANK) > svd_seconds(300.0));
        assert!(rows.subspace_in_time);
        // 949 000 rows: R = 250 is predicted past five times the share.
        let big = sizes_for(949_294, d, 67_350_000, 8 * GIB, svd_seconds(300.0));
        assert_eq!(big.rank, MIN_RANK);
        assert!(!big.subspace_in_time);
        // A long budget affords it again.
        assert!(sizes_for(949_294, d, 67_350_000, 8 * GIB, svd_seconds(3600.0)).subspace_in_time);
        // Text of a few thousand rows is in time at one minute.
        assert!(sizes_for(3_825, 47_236, 297_177, 4 * GIB, svd_seconds(60.0)).subspace_in_time);
    }

    #[test]
    fn no_memory_still_gives_one_direction() {
        // svd's own memory check then refuses the run, naming what it needs.
        assert_eq!(sizes_for(10_000, 47_236, 0, 0, f64::INFINITY).rank, 1);
    }
}
