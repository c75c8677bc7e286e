//! Fault injection for the crash, disk-full and concurrency tests.
//!
//! `FSGP_FAILPOINT=NAME:ARG` arms one point: `NAME` is where (`stage-computed`,
//! `checkpoint-written`, ...), `ARG` which occurrence (a stage, `svd`; a step, `21`). The
//! variable is read here and nowhere else, at the moment a point is reached, so no state is
//! kept between points. Unset, every point is a no-op. Four effects:
//!
//! - [`kill_at`]: the process sends itself SIGKILL, like `kill -9`: no destructor, no
//!   cleanup, no catalog update, which is what a crash or a killed job leaves behind;
//! - [`interrupt_at`]: the process sends itself SIGINT, as a terminal's Ctrl-C does (the
//!   stop request of `crate::stop`);
//! - [`enospc_at`]: the write about to happen fails with "No space left on device";
//! - [`pause_at`]: the process stops at the point until a file appears, so a test can run a
//!   second process against a first one that is known to be at that point.

use std::fmt::Display;
use std::path::Path;
use std::time::{Duration, Instant};

/// The environment variable that arms a failpoint.
pub const FAILPOINT: &str = "FSGP_FAILPOINT";

/// File a paused process creates in its directory once it is paused (it holds its pid).
pub const PAUSED_FILE: &str = "paused";
/// File a paused process waits for before it goes on.
pub const RESUME_FILE: &str = "resume";
/// A paused process goes on by itself after this long, so a test that died cannot leave it
/// waiting forever.
const PAUSE_LIMIT: Duration = Duration::from_secs(120);

/// Whether `FSGP_FAILPOINT` is exactly `name:arg`.
fn armed(name: &str, arg: &dyn Display) -> bool {
    std::env::var(FAILPOINT).is_ok_and(|spec| spec == format!("{name}:{arg}"))
}

/// Whether `name:arg` is armed, for an effect the caller applies itself (training's
/// `train-perturb-rank<R>:STEP` nudges one rank's parameters); says so when it is.
pub fn fires(name: &str, arg: impl Display) -> bool {
    let armed = armed(name, &arg);
    if armed {
        eprintln!("failpoint {name}:{arg}: firing");
    }
    armed
}

/// Kills this process with SIGKILL when `name:arg` is armed.
pub fn kill_at(name: &str, arg: impl Display) {
    if armed(name, &arg) {
        eprintln!("failpoint {name}:{arg}: killing this process (SIGKILL)");
        // SAFETY: kill(2) on our own pid with a valid signal number has no memory effects.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        // SIGKILL to oneself is delivered before kill(2) returns; this is not reached.
        std::process::abort();
    }
}

/// Raises SIGINT in this process `times` times when `name:arg` is armed, as pressing Ctrl-C
/// that often would. `raise(3)` runs the handler before it returns, so the caller's next
/// check sees the request.
pub fn interrupt_at(name: &str, arg: impl Display, times: usize) {
    if armed(name, &arg) {
        eprintln!("failpoint {name}:{arg}: SIGINT × {times}");
        for _ in 0..times {
            // SAFETY: raise(3) with a valid signal number has no memory effects.
            unsafe {
                libc::raise(libc::SIGINT);
            }
        }
    }
}

/// Fails with the operating system's ENOSPC ("No space left on device", as a full disk
/// would) when `name:arg` is armed.
pub fn enospc_at(name: &str, arg: impl Display) -> std::io::Result<()> {
    if armed(name, &arg) {
        return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
    }
    Ok(())
}

/// When `name:arg` is armed: writes `dir/paused` (holding this process's pid) and waits
/// until `dir/resume` exists (at most two minutes), then goes on.
pub fn pause_at(name: &str, arg: impl Display, dir: &Path) {
    if !armed(name, &arg) {
        return;
    }
    let resume = dir.join(RESUME_FILE);
    eprintln!(
        "failpoint {name}:{arg}: paused until {} exists",
        resume.display()
    );
    if let Err(e) = std::fs::write(dir.join(PAUSED_FILE), std::process::id().to_string()) {
        eprintln!("failpoint {name}:{arg}: cannot write {PAUSED_FILE}: {e}");
    }
    let started = Instant::now();
    while !resume.exists() && started.elapsed() < PAUSE_LIMIT {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The two files must not be published with the stage's outputs.
    let _ = std::fs::remove_file(&resume);
    let _ = std::fs::remove_file(dir.join(PAUSED_FILE));
}
