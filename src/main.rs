//! The `pipeline` binary: the command line of [`fsgp::cli`], nothing else.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(fsgp::cli::main_from(std::env::args_os()))
}
