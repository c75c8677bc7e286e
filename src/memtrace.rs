//! Opt-in memory trace: with `FSGP_TRACE_MEMORY=1` in the environment, [`mark`] prints the
//! process's resident anonymous memory (RssAnon from /proc/self/status) at named points of a
//! stage, so a peak can be attributed to the step that causes it. Costs nothing otherwise.

use std::sync::OnceLock;

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FSGP_TRACE_MEMORY").is_some_and(|v| v != "0"))
}

/// RssAnon in MiB (None where /proc is unavailable).
pub fn rss_anon_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Prints `memory: WHERE: RssAnon N MiB` to stderr when tracing is on.
pub fn mark(place: &str) {
    if enabled() {
        if let Some(mib) = rss_anon_mib() {
            eprintln!("memory: {place}: RssAnon {mib:.0} MiB");
        }
    }
}

/// Test hook: when set, its value (bytes) is taken as the machine's available memory
/// instead of /proc/meminfo's `MemAvailable` (as `FSGP_FREE_SPACE_BYTES` is for free disk
/// space, `store::space`). The memory-estimate tests use it; nothing else should.
pub const AVAILABLE_MEMORY_OVERRIDE: &str = "FSGP_AVAILABLE_MEMORY_BYTES";

/// Bytes of memory the kernel says a new allocation can get without swapping
/// (/proc/meminfo's `MemAvailable`: free memory plus the page cache and slabs it can
/// reclaim), or [`AVAILABLE_MEMORY_OVERRIDE`]'s value when set. None where /proc is
/// unavailable: a caller then has no figure to refuse against and does not refuse.
pub fn available_memory_bytes() -> anyhow::Result<Option<u64>> {
    use anyhow::Context;
    if let Ok(figure) = std::env::var(AVAILABLE_MEMORY_OVERRIDE) {
        return figure.trim().parse().map(Some).with_context(|| {
            format!("{AVAILABLE_MEMORY_OVERRIDE}={figure:?} is not a byte count")
        });
    }
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else {
        return Ok(None);
    };
    Ok(meminfo_available(&meminfo))
}

/// `MemAvailable:  12345 kB` of a /proc/meminfo text, in bytes.
fn meminfo_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_available(text), Some(20_000_000 * 1024));
        assert_eq!(meminfo_available("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn this_machine_reports_some_available_memory() {
        if std::env::var(AVAILABLE_MEMORY_OVERRIDE).is_err() {
            assert!(available_memory_bytes().unwrap().unwrap() > 0);
        }
    }
}
