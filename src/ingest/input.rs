//! What an input layout is to the ingest pipeline: a set of files that, once opened, yield
//! streams of rows routed into named splits.
//!
//! A layout (one module under [`super::layouts`]) knows its files and their headers; the
//! pipeline ([`super::pipeline`]) knows how to parse, count and write rows. Adding a layout
//! means one new type implementing [`InputLayout`], and the flags that construct it.

use std::fmt::Debug;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};

use super::stream::RowInput;
use crate::error::InputError;
use crate::store::catalog::Split;
use crate::text::source::SourceInfo;

/// One way the input files of a dataset are laid out.
pub trait InputLayout: Debug + Send + Sync {
    /// The dataset's `format` in the catalog (e.g. `"xc"`).
    fn format(&self) -> &'static str;

    /// (role, path) of every input file, in the order the catalog records them.
    fn sources(&self) -> Vec<(&'static str, PathBuf)>;

    /// (role, what the dataset's parameters record) of every input: the absolute path of
    /// each file ([`InputLayout::sources`]), or what names rows that are no file.
    fn source_params(&self) -> Result<Vec<(&'static str, String)>> {
        self.sources()
            .into_iter()
            .map(|(role, path)| Ok((role, absolute(&path)?.display().to_string())))
            .collect()
    }

    /// The inputs' size as ingest's progress counts it: the files' sizes on disk
    /// (compressed).
    fn input_bytes(&self) -> Result<u64> {
        self.sources()
            .iter()
            .map(|(_, p)| absolute(p).and_then(|p| Ok(std::fs::metadata(&p)?.len())))
            .sum()
    }

    /// Column of the split index files, for the layout that has them (recorded in the params).
    fn split_column(&self) -> Option<usize> {
        None
    }

    /// Whether the files' headers declare D and L (LIBSVM files have no header).
    fn declares_sizes(&self) -> bool {
        true
    }

    /// Opens the files, reads and cross-checks their headers and reads any index files, so
    /// that every file-level error is raised before a row is parsed. `lenient` is
    /// `--lenient` (line-end leniency also applies to index files).
    fn open(&self, lenient: bool) -> Result<OpenedInput>;
}

/// An opened input, ready to stream.
pub struct OpenedInput {
    /// D from the headers; [`UNDECLARED`] for a layout without headers (LIBSVM), whose D
    /// the scan pass decides ([`super::labels`]).
    pub n_features: u32,
    /// L from the headers; [`UNDECLARED`] without headers.
    pub n_labels: u32,
    /// Streamed one after the other, in order.
    pub streams: Vec<RowStream>,
    /// Files read completely by [`InputLayout::open`] (split index files), recorded after
    /// the streamed files.
    pub read_sources: Vec<(&'static str, SourceInfo)>,
}

/// D or L of a layout whose files declare none.
pub const UNDECLARED: u32 = u32::MAX;

/// One stream of rows (its header already read) and where its rows go.
pub struct RowStream {
    pub input: RowInput,
    /// N from the header: the stream must hold exactly this many rows (None: no header).
    pub declared_rows: Option<u64>,
    /// The source line of the first data row (2 after a header line, else 1): row index
    /// i (0-based, for the split tables and the validation carve) is at this line + i.
    pub first_data_line: u64,
    /// The file that row-count errors and skipped-row reasons name.
    pub path: PathBuf,
    /// Catalog role of each file read through, in the order [`RowInput`] lists them.
    pub roles: Vec<&'static str>,
    pub route: Route,
}

/// Which split each row of a stream goes to.
pub enum Route {
    /// Every row goes to this split.
    Whole(Split),
    /// Rows are assigned by a table over the stream's rows.
    ByRow {
        /// Splits fed by this stream; skipped rows are counted against the first.
        splits: Vec<Split>,
        /// One entry per data row (row r at `assign[r - 1]`): 0 for none, else the
        /// 1-based position of its split in `splits`.
        assign: Vec<u8>,
    },
}

impl Route {
    /// The splits this stream feeds, in order.
    pub fn splits(&self) -> Vec<Split> {
        match self {
            Route::Whole(split) => vec![*split],
            Route::ByRow { splits, .. } => splits.clone(),
        }
    }
}

/// Absolute form of an input path, so the catalog records where data came from.
pub fn absolute(path: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(path).map_err(|e| {
        anyhow!(InputError::new(
            path,
            0,
            format!("cannot open ({e}), expected an existing readable file")
        ))
    })
}
