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
