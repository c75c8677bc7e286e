//! The C allocator's tunables, set for the kind of work a process phase does (glibc only;
//! a no-op elsewhere).
//!
//! - [`for_streaming`], at start and when ingest or svd starts: glibc raises its mmap
//!   threshold each time a large block is freed, after which the many short-lived multi-MB
//!   buffers of a streaming stage (ingest's text blocks, svd's passes) are carved from
//!   per-thread heaps that fragment and never shrink, so RSS creeps up with the input size. A fixed 1 MiB threshold keeps large
//!   buffers in their own mappings, returned to the OS on free.
//! - [`for_recurring_steps`], when training starts: a training step allocates the same
//!   buffers every step (the minibatch's dense rows, K_bZ, the per-GP products). Each block
//!   over the mmap threshold is then a fresh mapping whose pages fault in zeroed and are
//!   unmapped on free, and each heap block above the trim threshold is given back by
//!   `madvise` and faulted in again the next step: on MNIST odd/even (M = 200) that was a
//!   third of a step's time in the kernel (`docs/experiments/time-to-accuracy.md`). Blocks up
//!   to 32 MiB therefore come from the heap, which keeps up to 64 MiB of free top: the
//!   same sizes recur, so the heap stops growing after the first steps (peak RSS on
//!   Delicious 346 → 412 MB, MNIST 99 → 105 MB). Ranking rows (`predict`, `serve`,
//!   fit's scoring) is the same kind of work: blocks of scores of one size, one after
//!   another (`crate::scoring`), and takes the same setting.
//!
//! glibc itself moves the mmap threshold at run time from whichever thread frees a block,
//! so changing these values while other threads allocate is within its own practice.

/// The streaming phases' setting (see the module documentation): at the process's start,
/// and again when ingest or svd starts, since a process may have trained before (`fit`
/// trains its candidates, then ingests the whole file).
pub fn for_streaming() {
    set(1 << 20, None);
}

/// The training loop's setting (see the module documentation).
pub fn for_recurring_steps() {
    set(32 << 20, Some(64 << 20));
}

fn set(mmap_threshold: i32, trim_threshold: Option<i32>) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tunables (see the module documentation).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, mmap_threshold);
        if let Some(trim) = trim_threshold {
            libc::mallopt(libc::M_TRIM_THRESHOLD, trim);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (mmap_threshold, trim_threshold);
}
