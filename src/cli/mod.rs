//! The `pipeline` command line, the one layer that knows clap: it parses the arguments
//! ([`args`]), opens the workspace once, turns each subcommand's flags into its stage's
//! options and runs the stage. `pipeline run` ([`spec`]) does the same from a TOML spec.

pub mod args;
pub mod bounds;
pub mod fit;
pub mod progress;
pub mod spec;
mod status;
mod verify;

use anyhow::{bail, Context, Result};

/// The allocator's setting for the process's start (`alloc::for_streaming`), for `main`.
pub use crate::alloc::for_streaming as allocator_for_streaming;

use crate::comm::Comm;
use crate::stop::StopToken;
use crate::store::workspace::{NoWorkspace, Workspace};
use args::{Cli, Command, EvaluateArgs, PredictArgs, VerifyArgs};

/// The whole `pipeline` command for a process whose job is to run it (the binary, and the
/// `pipeline` command `pip install` puts beside the Python package): parses `argv` (its
/// first item the program's name), runs the command with Ctrl-C handled as
/// [`run_with_signals`] says, prints an error as `error: …` and returns the exit status:
/// 0, 1 for a failure, 2 for a command line clap refused (its usage message printed), 130
/// for a stop request honoured. Standard output and error are flushed before it returns,
/// since a Python host exits through its own runtime, not Rust's.
pub fn main_from<I, T>(argv: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::Parser;
    allocator_for_streaming();
    restore_sigpipe();
    let status = match Cli::try_parse_from(argv) {
        // `--help` and `--version` are "errors" of exit status 0, printed to stdout.
        Err(e) => {
            let _ = e.print();
            u8::try_from(e.exit_code()).unwrap_or(2)
        }
        Ok(cli) => match run_with_signals(cli) {
            Ok(()) => 0,
            // Ctrl-C honoured: what was kept is in the message; 130 is a shell's status for it.
            Err(e) if is_stop(&e) => {
                eprintln!("{e:#}");
                130
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                1
            }
        },
    };
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    status
}

/// `argv` (its first item the program's name) parsed by the command line's own definition,
/// for a host that runs `pipeline` commands in its process (the Python package's
/// `run_pipeline`); a refusal is clap's message as the binary prints it.
pub fn parse<I, T>(argv: I) -> std::result::Result<Cli, String>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::Parser;
    Cli::try_parse_from(argv).map_err(|e| e.render().to_string().trim_end().to_string())
}

/// Rust ignores SIGPIPE (and so does a Python host), so `pipeline status | head` would
/// fail on the closed pipe; a command-line tool should simply stop, as `cat` does.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: resetting a signal disposition to its default, before the command starts its
    // threads; nothing in this process relies on SIGPIPE being ignored.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Runs one parsed command line: in one process, or, built with the `mpi` feature, on
/// every rank of the MPI job (MPI is initialised here, once; one process without
/// `mpirun` is a job of one rank). A rank that fails aborts the whole job, so no rank
/// waits forever in a collective for it. The stages poll `stop` (`crate::stop`): an
/// embedding program (the Python package) sets it to stop them whole.
pub fn run(cli: Cli, stop: &StopToken) -> Result<()> {
    run_job(cli, |_, _| Ok(stop.clone()))
}

/// [`run`] for the `pipeline` binary: SIGINT (Ctrl-C) and SIGTERM become a stop request
/// for the commands that honour one ([`honours_stop`]) in a job of one process; a second
/// signal ends the process at once (exit status 130), as do signals to every other command.
pub fn run_with_signals(cli: Cli) -> Result<()> {
    run_job(cli, |command, ranks| {
        match ranks == 1 && honours_stop(command) {
            true => stop_on_signals(),
            false => Ok(StopToken::new()),
        }
    })
}

/// Whether an error is a stop request honoured (`crate::stop`), not a failure: the binary
/// exits with status 130 for it, as a shell reports a Ctrl-C.
pub fn is_stop(error: &anyhow::Error) -> bool {
    crate::stop::is_stopped(error)
}

/// The commands whose stages poll the stop request: the long ones, which write as they go.
fn honours_stop(command: &Command) -> bool {
    matches!(
        command,
        Command::Ingest(_)
            | Command::Svd(_)
            | Command::Train(_)
            | Command::Run(_)
            | Command::Fit(_)
    )
}

/// A token that SIGINT and SIGTERM set; once it is set, the next of them ends the process
/// with status 130 (`signal_hook::flag`: the conditional exit is registered first, so the
/// first signal only sets the flag).
fn stop_on_signals() -> Result<StopToken> {
    let stop = StopToken::new();
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(signal, 130, stop.flag())
            .and_then(|_| signal_hook::flag::register(signal, stop.flag()))
            .context("installing the Ctrl-C handler")?;
    }
    Ok(stop)
}

/// [`run`] with the stop request `stop_for(command, ranks)` makes once the job's size is
/// known.
///
/// The progress sink `--log-format` and `--quiet` ask for is installed for the command's
/// duration (`crate::progress`).
fn run_job(cli: Cli, stop_for: impl FnOnce(&Command, usize) -> Result<StopToken>) -> Result<()> {
    let _progress = progress::install(cli.log_format, cli.quiet);
    #[cfg(feature = "mpi")]
    {
        let job = crate::comm::MpiJob::start()?;
        let comm = job.comm();
        let result = stop_for(&cli.command, comm.size()).and_then(|stop| run_on(cli, comm, &stop));
        if let Err(e) = &result {
            if comm.size() > 1 {
                eprintln!(
                    "error on MPI rank {} of {}: {e:#}",
                    comm.rank(),
                    comm.size()
                );
                job.abort(1);
            }
        }
        result
    }
    #[cfg(not(feature = "mpi"))]
    {
        let stop = stop_for(&cli.command, 1)?;
        run_on(cli, &crate::comm::Single, &stop)
    }
}

/// Which commands run over MPI ranks; the others are refused under `mpirun -n K > 1`.
fn runs_on_ranks(command: &Command) -> bool {
    matches!(
        command,
        Command::Svd(_) | Command::Train(_) | Command::Predict(_) | Command::Evaluate(_)
    )
}

/// [`run`] on the ranks of `comm`.
fn run_on(cli: Cli, comm: &dyn Comm, stop: &StopToken) -> Result<()> {
    if comm.size() > 1 && !runs_on_ranks(&cli.command) {
        bail!(
            "this command does not run over MPI ranks (started with {} ranks); 'pipeline svd', \
             'train', 'predict' and 'evaluate' do so far (docs/scale-out.md): run it without \
             mpirun",
            comm.size()
        );
    }
    if let Command::Synth(args) = &cli.command {
        // The one command without a workspace.
        return crate::synth::run(&args.options());
    }
    if let Command::Verify(args) = &cli.command {
        // Checks the catalog before opening the workspace trusts it.
        return verify(&cli.workspace, args);
    }
    // The commands that only read: the workspace is opened read-only (nothing created,
    // written or deleted; a read-only workspace is read as it is).
    match &cli.command {
        Command::Status(args) => {
            return match Workspace::open_read_only(&cli.workspace) {
                Ok(ws) => status::print(&ws, args),
                // Nothing has been run there: an empty status, not an error.
                Err(e) if e.is::<NoWorkspace>() => status::print_empty(&cli.workspace, args),
                Err(e) => Err(e),
            };
        }
        Command::Report(args) => {
            let ws = Workspace::open_read_only(&cli.workspace)?;
            return crate::report::run(&ws, args.run, args.out.as_deref(), args.force).map(|_| ());
        }
        // New rows from a file: nothing is registered, so the workspace is only read
        // (docs/predict-input.md, "The catalog").
        Command::Predict(args) if args.input.is_some() => return predict_input(&cli, args, comm),
        Command::Serve(args) => return crate::serve::run(&args.options()?),
        Command::Export(args) => {
            // Reads the workspace only; the model file is written outside it.
            let ws = Workspace::open_read_only(&cli.workspace)?;
            return crate::export::run(&ws, &args.options()).map(|_| ());
        }
        _ => {}
    }
    // Flags that name missing input files fail before the workspace is created.
    let ingest = match &cli.command {
        Command::Ingest(args) => Some(args.config()?),
        _ => None,
    };
    // So does a spec with mistakes: it is checked whole before anything is touched.
    let run_spec = match &cli.command {
        Command::Run(args) => Some(spec::Spec::read(&args.spec)?),
        _ => None,
    };
    let ws = open_workspace(&cli.workspace, comm)?.with_stop(stop.clone());
    match cli.command {
        Command::Synth(_) => unreachable!("handled above"),
        Command::Ingest(_) => {
            let config = ingest.expect("made above");
            crate::ingest::run(&ws, &config).map(|_| ())
        }
        Command::Svd(args) => crate::svd::run_on(&ws, comm, &args.options()).map(|_| ()),
        Command::Train(args) => crate::train::run_on(&ws, comm, &args.options()).map(|_| ()),
        Command::Elbo(args) => crate::train::elbo(&ws, &args.options()).map(|_| ()),
        Command::Predict(args) => crate::predict::run_on(&ws, comm, &args.options()).map(|_| ()),
        Command::Evaluate(args) => evaluate_command(&ws, comm, &args),
        Command::Run(args) => spec::run(&ws, &run_spec.expect("read above"), &args).map(drop),
        Command::Fit(args) => fit::run_command(&ws, &args),
        Command::Report(_)
        | Command::Status(_)
        | Command::Verify(_)
        | Command::Export(_)
        | Command::Serve(_) => {
            unreachable!("handled above")
        }
    }
}

/// The workspace, opened (and tidied) by rank 0 first, then by the other ranks without
/// tidying: rank 0 owns it ([`crate::stage`]).
fn open_workspace(root: &std::path::Path, comm: &dyn Comm) -> Result<Workspace> {
    if comm.size() == 1 {
        return Workspace::open(root);
    }
    if comm.is_root() {
        let ws = Workspace::open(root)?;
        comm.barrier()?;
        Ok(ws)
    } else {
        comm.barrier()?;
        Workspace::open_as_follower(root)
    }
}

/// `pipeline predict --input`: in one process, on a workspace opened read-only.
fn predict_input(cli: &Cli, args: &PredictArgs, comm: &dyn Comm) -> Result<()> {
    if comm.size() > 1 {
        bail!(
            "predict --input runs in one process (started with {} ranks): run it without \
             mpirun",
            comm.size()
        );
    }
    let input = args.input_options().expect("--input was given");
    if let Some(model) = &args.model {
        return crate::predict::input::run_model(model, &args.options(), &input).map(|_| ());
    }
    let ws = Workspace::open_read_only(&cli.workspace)?;
    crate::predict::input::run(&ws, &args.options(), &input).map(|_| ())
}

/// `pipeline verify`: the report, then an error (exit status 1) if anything was wrong.
fn verify(root: &std::path::Path, args: &VerifyArgs) -> Result<()> {
    let report = verify::run(root, args)?;
    verify::print(&report, args.json)?;
    verify::outcome(&report, args.repair)
}

/// `pipeline evaluate`: with `--run`, the run's predictions are made (or found) first.
/// Over MPI ranks the predictions are made on every rank and the metrics computed by rank
/// 0 from the one file, which holds what one process writes byte for byte: the metrics are
/// the one process's, bit for bit.
fn evaluate_command(ws: &Workspace, comm: &dyn Comm, args: &EvaluateArgs) -> Result<()> {
    let predictions = match (&args.predictions, args.predict_first()) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(mut predict)) => {
            // Binary and multi-class metrics are of probabilities: predict them (binary
            // data has one label, so its top 1 whatever --k, also for `--task binary` of a
            // run trained as multi-label).
            use crate::metrics::task::Task;
            let task = args.task.resolve(ws, Some(predict.run))?;
            predict.probabilities = task != Task::Multilabel;
            if task == Task::Binary {
                predict.top_k = Some(1);
            }
            crate::predict::run_on(ws, comm, &predict)?
                .value
                .map(|p| p.path)
        }
        (None, None) => anyhow::bail!("give --predictions FILE or --run RUN"),
    };
    let Some(predictions) = predictions.filter(|_| comm.is_root()) else {
        return Ok(());
    };
    let out = crate::evaluate::run(ws, &args.options(predictions))?;
    if args.json {
        println!("{}", out.value.to_json());
    } else {
        println!("{}", out.value.to_table());
    }
    Ok(())
}
