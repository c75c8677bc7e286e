//! `fsgp._fsgp`: the Python package's native module, a thin layer over the engine's public
//! functions (docs/python.md). Nothing here trains, parses or scores by itself:
//!
//! - [`FitParams`] and [`fit_dense`], [`fit_csr`], [`fit_file`] run `fsgp::fit::run` on
//!   rows in memory (read block by block, no text file) or on a file, with the
//!   parameters checked before any data moves;
//! - [`run_pipeline`] runs a `pipeline` command line in this process, parsed by the
//!   engine's own definition (`fsgp::cli::parse`);
//! - [`main`] is the `pipeline` command itself, for the console script of that name;
//! - [`Model`] holds a model file (`fsgp::portable::PortableModel`) and scores CSR rows
//!   under it (`fsgp::predict::input::score_pairs`), as `predict --model --input` scores
//!   the same rows written as text.
//!
//! Every call into the engine releases the GIL; Ctrl-C stops the engine at its next safe
//! point and raises `fsgp.Stopped` (a `KeyboardInterrupt`). Engine errors become the
//! typed exceptions of [`errors`]; the fit's progress goes to the `fsgp` logger
//! ([`logging`]).

mod errors;
mod fitting;
mod logging;

use std::path::PathBuf;
use std::time::Duration;

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::panic::PanicException;
use pyo3::prelude::*;

use errors::{engine_error, FsgpError, ShapeError};
use fsgp::portable::PortableModel;
use fsgp::predict::input::score_pairs;
use fsgp::predict::PredictOptions;
use fsgp::stop::StopToken;
use fsgp::text::parse::UnknownFeatures;

/// How often the waiting Python thread looks for a signal (Ctrl-C) while the engine runs.
const SIGNAL_POLL: Duration = Duration::from_millis(20);
/// The engine thread's stack: what the `pipeline` binary's main thread has.
const ENGINE_STACK: usize = 8 << 20;

/// Runs `work` on a thread of its own with the GIL released while this one waits, looking
/// for signals: on Ctrl-C it asks the engine to stop (`fsgp::stop`), waits until it has
/// stopped whole (a training run after its current step, with a checkpoint there), then
/// raises `fsgp.Stopped` carrying the engine's message. Other errors become the typed
/// exceptions of [`engine_error`].
fn run_engine<T: Send>(
    py: Python<'_>,
    work: impl FnOnce(&StopToken) -> anyhow::Result<T> + Send,
) -> PyResult<T> {
    let stop = StopToken::new();
    let engine_stop = stop.clone();
    let (result, interrupt) = std::thread::scope(|scope| {
        let engine = std::thread::Builder::new()
            .name("fsgp-engine".into())
            .stack_size(ENGINE_STACK)
            .spawn_scoped(scope, move || work(&engine_stop))
            .map_err(|e| FsgpError::new_err(format!("starting the engine's thread: {e}")))?;
        let mut interrupt = None;
        while !engine.is_finished() {
            py.detach(|| std::thread::sleep(SIGNAL_POLL));
            if interrupt.is_none() {
                if let Err(signal) = py.check_signals() {
                    stop.request();
                    interrupt = Some(signal);
                }
            }
        }
        let result = engine
            .join()
            .map_err(|_| PanicException::new_err("the fsgp engine panicked"))?;
        Ok::<_, PyErr>((result, interrupt))
    })?;
    match (result, interrupt) {
        (Err(e), Some(_)) if fsgp::cli::is_stop(&e) => Err(errors::stopped(&e)),
        // The signal came too late to stop anything (or its handler raised something
        // else): Python's own exception.
        (Ok(_), Some(signal)) => Err(signal),
        (result, _) => result.map_err(engine_error),
    }
}

/// Runs `pipeline ARGV...` in this process with the GIL released: the engine's command
/// line, parsed by its own definition (a bad flag is an `OptionError` with clap's
/// message). What the command prints goes to this process's standard output and error.
/// Ctrl-C stops it as [`run_engine`] says.
#[pyfunction]
fn run_pipeline(py: Python<'_>, argv: Vec<String>) -> PyResult<()> {
    let argv: Vec<String> = std::iter::once("pipeline".to_string())
        .chain(argv)
        .collect();
    let cli = fsgp::cli::parse(&argv).map_err(errors::OptionError::new_err)?;
    run_engine(py, move |stop| fsgp::cli::run(cli, stop))
}

/// The `pipeline` command itself, for the console script `pip install` makes
/// (`fsgp._cli:main`): `argv` is the whole command line, its first item the program's
/// name. It runs exactly as the binary does (the same parser, messages, Ctrl-C handling
/// and exit statuses: `fsgp::cli::main_from`) with the GIL released, and returns the exit
/// status for the script to exit with. Not for use inside a Python program: it installs
/// the process's signal handlers and prints to its standard streams; call the estimators
/// or `run_pipeline` there.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| fsgp::cli::main_from(argv))
}

/// CSR arrays as rows of (feature id, value) pairs: one buffer of every pair, cut by
/// `indptr`. Checks what the arrays' shapes must satisfy.
struct CsrRows {
    pairs: Vec<(u64, f64)>,
    indptr: Vec<usize>,
}

impl CsrRows {
    fn new(indptr: &[i64], indices: &[i64], data: &[f64]) -> PyResult<Self> {
        check_csr(indptr, indices, data.len())?;
        Ok(CsrRows {
            pairs: indices
                .iter()
                .zip(data)
                .map(|(&i, &v)| (i as u64, v))
                .collect(),
            indptr: indptr.iter().map(|&p| p as usize).collect(),
        })
    }

    fn rows(&self) -> impl Iterator<Item = &[(u64, f64)]> + Send + '_ {
        self.indptr.windows(2).map(|w| &self.pairs[w[0]..w[1]])
    }

    fn len(&self) -> usize {
        self.indptr.len() - 1
    }
}

/// Checks what CSR arrays' shapes must satisfy: as many indices as values, `indptr`
/// starting at 0, never decreasing and ending at the number of values, no negative index.
/// A violation is a `ShapeError`.
fn check_csr(indptr: &[i64], indices: &[i64], values: usize) -> PyResult<()> {
    if indices.len() != values {
        return Err(ShapeError::new_err(format!(
            "CSR arrays disagree: {} indices and {values} values",
            indices.len(),
        )));
    }
    check_offsets(indptr, values, "CSR")?;
    if let Some(i) = indices.iter().position(|&i| i < 0) {
        return Err(ShapeError::new_err(format!(
            "found feature index {} at position {i}, expected a non-negative index",
            indices[i]
        )));
    }
    Ok(())
}

/// Checks that offsets `indptr` cut `len` entries into rows: they start at 0, never
/// decrease and end at `len` (a `ShapeError` naming `what` otherwise).
fn check_offsets(indptr: &[i64], len: usize, what: &str) -> PyResult<()> {
    let ok = indptr.first() == Some(&0)
        && indptr.windows(2).all(|w| w[0] <= w[1])
        && indptr.last().is_some_and(|&n| n as usize == len);
    match ok {
        true => Ok(()),
        false => Err(ShapeError::new_err(format!(
            "{what} offsets must start at 0, never decrease and end at the number of \
             entries ({len})"
        ))),
    }
}

/// A trained model, from its model file (`pipeline export`, `fit --model-out`, `save`).
#[pyclass(frozen, module = "fsgp._fsgp")]
struct Model {
    file: PortableModel,
}

/// One row's kept labels, scores and probabilities, flattened over rows.
type Scored<'py> = (
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<f32>>,
    Option<Bound<'py, PyArray1<f32>>>,
    u64,
);

#[pymethods]
impl Model {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let file = py
            .detach(|| PortableModel::open(&path))
            .map_err(engine_error)?;
        Ok(Model { file })
    }

    /// The model file's path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.file.path.clone()
    }

    /// The task it was trained for: `binary`, `multiclass` or `multilabel`.
    #[getter]
    fn task(&self) -> &'static str {
        self.file.config.task.name()
    }

    /// D: the features a row may have.
    #[getter]
    fn n_features(&self) -> u64 {
        self.file.n_features()
    }

    /// L: label ids (1 for a binary model, K classes for a multi-class one).
    #[getter]
    fn n_labels(&self) -> u64 {
        self.file.dataset().n_labels
    }

    /// The original label of each label id when ingest assigned the ids (LIBSVM input),
    /// else None (label ids are the file's own).
    #[getter]
    fn label_values(&self) -> Option<Vec<i64>> {
        self.file.class_map().map(|c| c.values.clone())
    }

    /// A binary model's label of the negative class (None when unknown).
    #[getter]
    fn negative_label(&self) -> Option<i64> {
        self.file.class_map().and_then(|c| c.negative)
    }

    /// The transform ingest fitted to the training rows (`none`, `l2`, `standardize`,
    /// `scale`, `tfidf`).
    #[getter]
    fn transform(&self) -> String {
        self.file.dataset().transform.clone()
    }

    /// (train run, checkpoint step) of the workspace the model came from.
    #[getter]
    fn provenance(&self) -> (i64, u64) {
        let p = self.file.provenance();
        (p.train_run, p.checkpoint_step)
    }

    /// Scores CSR rows (0-based feature ids) under the model, as `predict --model --input`
    /// scores them: returns `(offsets, labels, scores, probabilities, dropped)`, row i's kept
    /// label ids being `labels[offsets[i]:offsets[i+1]]` best first, `probabilities` when
    /// asked for, and `dropped` the features dropped (`drop_unknown`: ids ≥ D are dropped
    /// and counted instead of refused).
    #[pyo3(signature = (indptr, indices, data, top_k=None, probabilities=false, drop_unknown=false, threads=None))]
    #[allow(clippy::too_many_arguments)]
    fn predict<'py>(
        &self,
        py: Python<'py>,
        indptr: PyReadonlyArray1<'py, i64>,
        indices: PyReadonlyArray1<'py, i64>,
        data: PyReadonlyArray1<'py, f64>,
        top_k: Option<usize>,
        probabilities: bool,
        drop_unknown: bool,
        threads: Option<usize>,
    ) -> PyResult<Scored<'py>> {
        let rows = CsrRows::new(indptr.as_slice()?, indices.as_slice()?, data.as_slice()?)?;
        let mut opts = PredictOptions::new(0);
        opts.top_k = top_k;
        opts.probabilities = probabilities;
        opts.threads = threads;
        let unknown = match drop_unknown {
            true => UnknownFeatures::Drop,
            false => UnknownFeatures::Refuse,
        };
        let file = &self.file;
        let scored = py
            .detach(|| score_pairs(file, rows.rows(), &opts, unknown))
            .map_err(engine_error)?;
        let mut offsets = Vec::with_capacity(rows.len() + 1);
        offsets.push(0i64);
        let (mut labels, mut scores) = (Vec::new(), Vec::new());
        let mut probs = probabilities.then(Vec::new);
        for block in &scored.blocks {
            for i in 0..block.len() {
                debug_assert_eq!(block.row_ids[i], offsets.len() as u64 - 1);
                labels.extend_from_slice(block.labels(i));
                scores.extend_from_slice(block.scores(i));
                if let (Some(p), Some(row)) = (probs.as_mut(), block.probabilities(i)) {
                    p.extend_from_slice(row);
                }
                offsets.push(labels.len() as i64);
            }
        }
        Ok((
            PyArray1::from_vec(py, offsets),
            PyArray1::from_vec(py, labels),
            PyArray1::from_vec(py, scores),
            probs.map(|p| PyArray1::from_vec(py, p)),
            scored.dropped.features,
        ))
    }
}

#[pymodule]
fn _fsgp(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run_pipeline, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_class::<Model>()?;
    fitting::register(m)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
