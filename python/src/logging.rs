//! The engine's progress as Python `logging` records on the `fsgp` logger: a progress sink
//! (`fsgp::progress`) installed for the duration of a call, and a fit observer. Lines are
//! the command line's (`fsgp::cli::progress::text_line`); nothing is written to the
//! process's standard streams, and its file descriptors are left alone.
//!
//! Events come from the engine's threads: each record is logged with the GIL taken for it.

use std::sync::Arc;

use pyo3::prelude::*;

use fsgp::fit::{FitEvent, FitObserver, Weight};
use fsgp::progress::{Event, Installed, Level, Sink};

/// `logging`'s levels.
const DEBUG: u8 = 10;
const INFO: u8 = 20;
const WARNING: u8 = 30;

/// The `fsgp` logger, with the level below which it drops records.
#[derive(Clone)]
pub struct Logger {
    logger: Arc<Py<PyAny>>,
    /// Its effective level when the call began: records below it are dropped without
    /// taking the GIL, so a fit nobody listens to at INFO or DEBUG is not slowed by its
    /// progress (fit's plan converts measured step times into steps).
    enabled_from: u8,
}

impl Logger {
    pub fn get(py: Python<'_>) -> PyResult<Self> {
        let logger = py.import("logging")?.call_method1("getLogger", ("fsgp",))?;
        let enabled_from = logger.call_method0("getEffectiveLevel")?.extract()?;
        Ok(Logger {
            logger: Arc::new(logger.unbind()),
            enabled_from,
        })
    }

    /// Logs `line()` at `level` when the logger takes that level. A handler's own failure
    /// is `logging`'s to report (it prints it and goes on); the engine is not stopped by it.
    fn log(&self, level: u8, line: impl FnOnce() -> String) {
        if level < self.enabled_from {
            return;
        }
        Python::attach(|py| {
            if let Err(e) = self.logger.bind(py).call_method1("log", (level, line())) {
                e.write_unraisable(py, None);
            }
        });
    }

    /// Installs this logger as the engine's progress sink until the guard is dropped.
    pub fn install(&self) -> Installed {
        fsgp::progress::install(Arc::new(self.clone()))
    }
}

impl Sink for Logger {
    fn event(&self, event: &Event) {
        // A run's epochs and scores are many lines (a bar's worth): DEBUG; what a stage
        // found or wrote is INFO.
        let level = match event {
            Event::Note {
                level: Level::Warning,
                ..
            } => WARNING,
            Event::Epoch { .. } | Event::Validation { .. } => DEBUG,
            _ => INFO,
        };
        // Steps and task boundaries make no line (a bar would show them).
        if let Some(line) = fsgp::cli::progress::text_line(event) {
            self.log(level, || line);
        }
    }
}

impl FitObserver for Logger {
    fn event(&mut self, event: FitEvent<'_>) {
        if let Some((level, line)) = fit_line(&event) {
            self.log(level, || format!("fit: {line}"));
        }
    }
}

/// The record of a fit's event, if it makes one: its line as every caller words it, at
/// the level of its weight (the command line's tables are its own rendering; a candidate's
/// line stands for its row).
fn fit_line(event: &FitEvent<'_>) -> Option<(u8, String)> {
    let (weight, line) = event.describe()?;
    let level = match weight {
        Weight::Warning => WARNING,
        Weight::Progress | Weight::Result => INFO,
    };
    Some((level, line))
}
