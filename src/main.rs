use clap::Parser;

fn main() -> std::process::ExitCode {
    fsgp::cli::allocator_for_streaming();
    restore_sigpipe();
    let cli = fsgp::cli::args::Cli::parse();
    match fsgp::cli::run_with_signals(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // Ctrl-C honoured: what was kept is in the message; 130 is a shell's status for it.
        Err(e) if fsgp::cli::is_stop(&e) => {
            eprintln!("{e:#}");
            std::process::ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
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
