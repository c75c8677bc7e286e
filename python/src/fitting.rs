//! The estimators' fit as typed calls of `fsgp::fit::run` (docs/python.md):
//!
//! - [`FitParams`] checks every parameter when it is made (the budget, the validation
//!   fraction, the task, the train settings through train's own parser and
//!   `TrainOptions::validate`), so a bad one is an `OptionError` before any data moves;
//! - [`fit_dense`] and [`fit_csr`] fit rows in memory: the engine reads them block by block
//!   (`fsgp::ingest::rows`), taking the GIL for each block, so no text file is written and
//!   no copy of the whole matrix is made; [`fit_file`] fits a file;
//! - each returns the fit's outcome (`pipeline fit --json`'s) as a dict.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::anyhow;
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::errors::{option_error, ShapeError};
use crate::logging::Logger;
use crate::{check_offsets, run_engine};
use fsgp::cli::args::{parse_budget, parse_setting, Setting};
use fsgp::fit::FitRequest;
use fsgp::ingest::rows::{MemoryRows, RowBlock, RowSource};
use fsgp::ingest::validation::ValidationSplit;
use fsgp::store::catalog::LabelKind;
use fsgp::store::workspace::Workspace;

/// A fit's parameters, checked: what `pipeline fit`'s flags say, without the data.
#[pyclass(frozen, module = "fsgp._fsgp")]
pub struct FitParams {
    workspace: PathBuf,
    request: FitRequest,
}

#[pymethods]
impl FitParams {
    /// `budget`: "90s", "5m", "1h" or seconds; `settings`: train options as `fit --set`
    /// takes them ("kernel=linear", "ard"); `task`: "binary", "multiclass", "multilabel"
    /// or None (the label kind ingest detects). Raises `OptionError` naming what is wrong.
    #[new]
    #[pyo3(signature = (workspace, *, budget="5m", seed=0, validation_fraction=None,
        early_stopping=true, folds=true, settings=Vec::new(), task=None, model_out=None,
        spec_out=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        workspace: PathBuf,
        budget: &str,
        seed: u64,
        validation_fraction: Option<f64>,
        early_stopping: bool,
        folds: bool,
        settings: Vec<String>,
        task: Option<&str>,
        model_out: Option<PathBuf>,
        spec_out: Option<PathBuf>,
    ) -> PyResult<Self> {
        let mut request = FitRequest::new("rows");
        request.budget_seconds = parse_budget(budget)
            .map_err(|e| option_error(format!("budget: {e}"), vec!["budget".into()]))?;
        if let Some(fraction) = validation_fraction {
            if !ValidationSplit::fraction_ok(fraction) {
                return Err(option_error(
                    format!("validation_fraction: found {fraction}, expected a number in (0, 1)"),
                    vec!["validation_fraction".into()],
                ));
            }
            request.validation_fraction = fraction;
        }
        request.task = task
            .map(str::parse::<LabelKind>)
            .transpose()
            .map_err(|e| option_error(format!("task: {e}"), vec!["task".into()]))?;
        request.overrides = overrides(&settings)?;
        (request.seed, request.early_stopping, request.folds) = (seed, early_stopping, folds);
        (request.model_out, request.spec_out) = (model_out, spec_out);
        request
            .check()
            .map_err(|e| option_error(format!("{e:#}"), Vec::new()))?;
        Ok(FitParams { workspace, request })
    }

    /// The budget in seconds, as parsed.
    #[getter]
    fn budget_seconds(&self) -> f64 {
        self.request.budget_seconds
    }
}

/// The train options `settings` give every candidate, typed and checked by train's own
/// parser and `TrainOptions::validate` (an `OptionError` naming the option otherwise).
fn overrides(settings: &[String]) -> PyResult<fsgp::train::TrainOptions> {
    let sets = settings
        .iter()
        .map(|s| {
            parse_setting(s).map_err(|e| option_error(format!("settings: {e}"), vec![s.clone()]))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let typed = |sets: &[Setting]| fsgp::cli::fit::overrides(sets);
    let options = typed(&sets).map_err(|e| {
        // The parser's message names the flag; `.options` names each setting refused alone.
        let refused = sets
            .iter()
            .filter(|s| typed(std::slice::from_ref(s)).is_err());
        option_error(
            format!("settings: {e:#}"),
            refused.map(|s| s.flag.to_string()).collect(),
        )
    })?;
    options.validate().map_err(|e| {
        let named = e.problems.iter().map(|p| p.option.to_string()).collect();
        option_error(format!("settings: {e}"), named)
    })?;
    Ok(options)
}

/// Each row's class values: `values[indptr[i]..indptr[i + 1]]`.
struct Labels {
    indptr: Py<PyArray1<i64>>,
    values: Py<PyArray1<i64>>,
}

impl Labels {
    /// Checks that `indptr` cuts `values` into `rows` rows (a `ShapeError` otherwise).
    fn new(
        rows: usize,
        indptr: Bound<'_, PyArray1<i64>>,
        values: Bound<'_, PyArray1<i64>>,
    ) -> PyResult<Self> {
        if indptr.len() != rows + 1 {
            return Err(ShapeError::new_err(format!(
                "found label offsets for {} rows, expected {rows} (one row of labels per row \
                 of X)",
                indptr.len().saturating_sub(1)
            )));
        }
        check_offsets(indptr.readonly().as_slice()?, values.len(), "label")?;
        Ok(Labels {
            indptr: indptr.unbind(),
            values: values.unbind(),
        })
    }

    /// Row `i`'s class values.
    fn of_row<'a>(indptr: &[i64], values: &'a [i64], i: usize) -> &'a [i64] {
        &values[indptr[i] as usize..indptr[i + 1] as usize]
    }
}

/// Runs `read` (one block of rows read from the arrays) with the GIL taken.
fn with_gil<T>(read: impl FnOnce(Python<'_>) -> PyResult<T>) -> anyhow::Result<T> {
    Python::attach(|py| read(py).map_err(|e| anyhow!("reading the rows: {e}")))
}

/// A dense (n, D) float64 array: each row's nonzero entries, as SciPy's CSR of it holds
/// them.
struct DenseRows {
    x: Py<PyArray2<f64>>,
    labels: Labels,
    shape: (usize, u32),
}

impl RowSource for DenseRows {
    fn n_rows(&self) -> u64 {
        self.shape.0 as u64
    }

    fn n_features(&self) -> u32 {
        self.shape.1
    }

    fn read(&self, rows: Range<u64>, out: &mut RowBlock) -> anyhow::Result<()> {
        with_gil(|py| {
            let x = self.x.bind(py).try_readonly()?;
            let x = x.as_array();
            let indptr = self.labels.indptr.bind(py).try_readonly()?;
            let values = self.labels.values.bind(py).try_readonly()?;
            let (indptr, values) = (indptr.as_slice()?, values.as_slice()?);
            for i in rows.start as usize..rows.end as usize {
                let nonzero = x.row(i).into_iter().enumerate().filter(|(_, v)| **v != 0.0);
                out.push_row(
                    Labels::of_row(indptr, values, i).iter().copied(),
                    nonzero.map(|(j, &v)| (j as u64, v)),
                );
            }
            Ok(())
        })
    }
}

/// CSR arrays (int64 indices, float64 values, explicit zeros as given).
struct SparseRows {
    indptr: Py<PyArray1<i64>>,
    indices: Py<PyArray1<i64>>,
    data: Py<PyArray1<f64>>,
    labels: Labels,
    shape: (usize, u32),
}

impl RowSource for SparseRows {
    fn n_rows(&self) -> u64 {
        self.shape.0 as u64
    }

    fn n_features(&self) -> u32 {
        self.shape.1
    }

    fn read(&self, rows: Range<u64>, out: &mut RowBlock) -> anyhow::Result<()> {
        with_gil(|py| {
            let indptr = self.indptr.bind(py).try_readonly()?;
            let indices = self.indices.bind(py).try_readonly()?;
            let data = self.data.bind(py).try_readonly()?;
            let (indptr, indices, data) =
                (indptr.as_slice()?, indices.as_slice()?, data.as_slice()?);
            let label_indptr = self.labels.indptr.bind(py).try_readonly()?;
            let values = self.labels.values.bind(py).try_readonly()?;
            let (label_indptr, values) = (label_indptr.as_slice()?, values.as_slice()?);
            for i in rows.start as usize..rows.end as usize {
                let cut = indptr[i] as usize..indptr[i + 1] as usize;
                let pairs = indices[cut.clone()].iter().zip(&data[cut]);
                out.push_row(
                    Labels::of_row(label_indptr, values, i).iter().copied(),
                    pairs.map(|(&j, &v)| (j as u64, v)),
                );
            }
            Ok(())
        })
    }
}

/// D as the engine holds it (a `ShapeError` beyond the most features a dataset may have).
fn features_of(columns: usize) -> PyResult<u32> {
    let max = fsgp::text::parse::MAX_IDS;
    u32::try_from(columns)
        .ok()
        .filter(|&d| (1..=max).contains(&d))
        .ok_or_else(|| {
            ShapeError::new_err(format!(
                "found {columns} columns, expected 1 to {max} features"
            ))
        })
}

/// Fits rows X (a dense (n, D) float64 array) with labels `labels[label_indptr[i]..
/// label_indptr[i + 1]]` per row (class values, as a LIBSVM file's label field).
#[pyfunction]
fn fit_dense<'py>(
    py: Python<'py>,
    params: &FitParams,
    x: Bound<'py, PyArray2<f64>>,
    label_indptr: Bound<'py, PyArray1<i64>>,
    labels: Bound<'py, PyArray1<i64>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (n, d) = (x.shape()[0], features_of(x.shape()[1])?);
    let source = DenseRows {
        labels: Labels::new(n, label_indptr, labels)?,
        x: x.unbind(),
        shape: (n, d),
    };
    fit_rows(py, params, Arc::new(source))
}

/// Fits CSR rows (int64 `indptr` and `indices`, float64 `data`, D = `n_features`) with
/// labels as [`fit_dense`] takes them.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn fit_csr<'py>(
    py: Python<'py>,
    params: &FitParams,
    indptr: Bound<'py, PyArray1<i64>>,
    indices: Bound<'py, PyArray1<i64>>,
    data: Bound<'py, PyArray1<f64>>,
    n_features: usize,
    label_indptr: Bound<'py, PyArray1<i64>>,
    labels: Bound<'py, PyArray1<i64>>,
) -> PyResult<Bound<'py, PyAny>> {
    crate::check_csr(
        indptr.readonly().as_slice()?,
        indices.readonly().as_slice()?,
        data.len(),
    )?;
    let n = indptr.len() - 1;
    let source = SparseRows {
        labels: Labels::new(n, label_indptr, labels)?,
        indptr: indptr.unbind(),
        indices: indices.unbind(),
        data: data.unbind(),
        shape: (n, features_of(n_features)?),
    };
    fit_rows(py, params, Arc::new(source))
}

/// Fits the training file `train` (XML-repository text or LIBSVM, as `pipeline fit
/// --train` reads it).
#[pyfunction]
fn fit_file<'py>(
    py: Python<'py>,
    params: &FitParams,
    train: PathBuf,
) -> PyResult<Bound<'py, PyAny>> {
    let request = FitRequest {
        train,
        ..params.request.clone()
    };
    run_fit(py, &params.workspace, move || Ok(request))
}

fn fit_rows<'py>(
    py: Python<'py>,
    params: &FitParams,
    source: Arc<dyn RowSource>,
) -> PyResult<Bound<'py, PyAny>> {
    let request = params.request.clone();
    run_fit(py, &params.workspace, move || {
        Ok(request.with_rows(MemoryRows::new(source)?))
    })
}

/// Runs the fit `request` makes (on the engine's thread: reading rows for their checksum
/// is the engine's work) in `workspace`, its progress to the `fsgp` logger; returns the
/// outcome as a dict.
fn run_fit<'py>(
    py: Python<'py>,
    workspace: &std::path::Path,
    request: impl FnOnce() -> anyhow::Result<FitRequest> + Send,
) -> PyResult<Bound<'py, PyAny>> {
    let logger = Logger::get(py)?;
    let outcome = run_engine(py, |stop| {
        let _sink = logger.install();
        let request = request()?;
        let ws = Workspace::open(workspace)?.with_stop(stop.clone());
        fsgp::fit::run(&ws, &request, &mut logger.clone())
    })?;
    let json = serde_json::to_string(&outcome)
        .map_err(|e| crate::errors::FsgpError::new_err(format!("the fit's outcome: {e}")))?;
    py.import("json")?.call_method1("loads", (json,))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FitParams>()?;
    m.add_function(wrap_pyfunction!(fit_dense, m)?)?;
    m.add_function(wrap_pyfunction!(fit_csr, m)?)?;
    m.add_function(wrap_pyfunction!(fit_file, m)?)?;
    Ok(())
}
