use clap::Parser;

fn main() -> std::process::ExitCode {
    tame_malloc();
    restore_sigpipe();
    let cli = fsgp::cli::args::Cli::parse();
    match fsgp::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// glibc raises its mmap threshold each time a large block is freed, after which the
/// pipeline's many short-lived multi-MB buffers are carved from per-thread heaps that
/// fragment and never shrink, so RSS creeps up with the input size. A fixed threshold
/// keeps large buffers in their own mappings, returned to the OS on free.
fn tame_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tunables; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Rust ignores SIGPIPE, so `pipeline status | head` would panic on the closed pipe; a
/// command-line tool should simply stop, as `cat` does.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: resetting a signal disposition to its default before other threads start.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
