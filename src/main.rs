use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = fsgp::cli::Cli::parse();
    match fsgp::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
