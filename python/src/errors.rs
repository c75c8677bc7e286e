//! The package's exceptions, and the engine's typed errors mapped onto them by looking
//! through the error's chain (docs/python.md, "Errors"):
//!
//! - `FsgpError` (a `ValueError`; `EngineError` is its old name): any engine error;
//! - `InputError`: bad rows or a bad file, with `.path`/`.line` (a file's, from 1) or
//!   `.row`/`.feature` (rows in memory, from 0 as NumPy counts);
//! - `ShapeError` (an `InputError`): arrays whose shapes disagree;
//! - `OptionError`: a parameter or option out of range (the budget among them), with
//!   `.options` naming them;
//! - `WorkspaceBusy`: another process holds the workspace's catalog or a stage's lock;
//! - `Stopped` (a `KeyboardInterrupt`, not an `FsgpError`): Ctrl-C honoured, the
//!   workspace whole.

use pyo3::create_exception;
use pyo3::exceptions::{PyFileNotFoundError, PyKeyboardInterrupt, PyValueError};
use pyo3::prelude::*;

use fsgp::error::{InputError as FileError, InvalidOptions};
use fsgp::ingest::rows::RowError;
use fsgp::store::catalog::Contended;

create_exception!(
    fsgp,
    FsgpError,
    PyValueError,
    "An error the fsgp engine reported; the message is the engine's."
);
create_exception!(
    fsgp,
    InputError,
    FsgpError,
    "Bad input: `.path` and `.line` locate it in a file (lines from 1), `.row` and \
     `.feature` in rows given in memory (from 0, as NumPy counts); the others are None."
);
create_exception!(
    fsgp,
    ShapeError,
    InputError,
    "Arrays whose shapes disagree (rows of X and of y, CSR arrays), found before anything \
     is ingested."
);
create_exception!(
    fsgp,
    OptionError,
    FsgpError,
    "A parameter or option the engine refuses (a budget, a train option out of range), \
     found before any data moves; `.options` names them."
);
create_exception!(
    fsgp,
    WorkspaceBusy,
    FsgpError,
    "Another process holds the workspace (its catalog's or a stage's lock); the same call \
     succeeds once it is done."
);
create_exception!(
    fsgp,
    Stopped,
    PyKeyboardInterrupt,
    "Ctrl-C was honoured: the engine stopped at a safe point and the workspace is whole \
     (a training run keeps a checkpoint; the same fit takes it up)."
);

/// An `InputError` with its location attributes (None where it has none).
fn input_error(
    message: String,
    file: Option<(String, Option<u64>)>,
    row: Option<(u64, Option<u64>)>,
) -> PyErr {
    let err = InputError::new_err(message);
    Python::attach(|py| {
        let value = err.value(py);
        let (path, line) = file.map_or((None, None), |(p, l)| (Some(p), l));
        let (row, feature) = row.map_or((None, None), |(r, f)| (Some(r), f));
        // Setting attributes on a fresh exception object cannot fail but for memory.
        let _ = value.setattr("path", path);
        let _ = value.setattr("line", line);
        let _ = value.setattr("row", row);
        let _ = value.setattr("feature", feature);
    });
    err
}

/// An `OptionError` naming `options` (the engine's option names, without dashes).
pub fn option_error(message: String, options: Vec<String>) -> PyErr {
    let err = OptionError::new_err(message);
    Python::attach(|py| {
        let _ = err.value(py).setattr("options", options);
    });
    err
}

/// The exception of the engine's error `e`: the first typed error in its chain decides the
/// class; the message is the whole chain.
pub fn engine_error(e: anyhow::Error) -> PyErr {
    let message = format!("{e:#}");
    let find = |want: fn(&(dyn std::error::Error + 'static)) -> bool| e.chain().any(want);
    if let Some(row) = e.chain().find_map(|c| c.downcast_ref::<RowError>()) {
        return input_error(message, None, Some((row.row, row.feature)));
    }
    if let Some(file) = e.chain().find_map(|c| c.downcast_ref::<FileError>()) {
        let line = (file.line > 0).then_some(file.line);
        return input_error(message, Some((file.file.display().to_string(), line)), None);
    }
    if let Some(invalid) = e.chain().find_map(|c| c.downcast_ref::<InvalidOptions>()) {
        let names = invalid.problems.iter().map(|p| p.option.to_string());
        return option_error(message, names.collect());
    }
    if find(|c| c.is::<Contended>()) {
        return WorkspaceBusy::new_err(message);
    }
    let missing = |c: &(dyn std::error::Error + 'static)| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
    };
    if find(missing) {
        return PyFileNotFoundError::new_err(message);
    }
    FsgpError::new_err(message)
}

/// `Stopped`, carrying the engine's message of where it stopped.
pub fn stopped(e: &anyhow::Error) -> PyErr {
    Stopped::new_err(format!("{e:#}"))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FsgpError", py.get_type::<FsgpError>())?;
    // The name engine errors had before the classes below.
    m.add("EngineError", py.get_type::<FsgpError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("ShapeError", py.get_type::<ShapeError>())?;
    m.add("OptionError", py.get_type::<OptionError>())?;
    m.add("WorkspaceBusy", py.get_type::<WorkspaceBusy>())?;
    m.add("Stopped", py.get_type::<Stopped>())?;
    Ok(())
}
