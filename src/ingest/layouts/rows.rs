//! Rows in memory ([`MemoryRows`]) as the training split: LIBSVM's rows without the text.
//! Their labels are class values, numbered by the scan pass as a LIBSVM file's are, and D
//! is the ingest's `features` (the rows' own D). The dataset is a LIBSVM one (its format
//! and index base say how new rows of it are written as text, for `predict --input` and a
//! model file's users); its source is the rows' checksum instead of a file.

use std::path::PathBuf;

use anyhow::Result;

use crate::ingest::input::{InputLayout, OpenedInput, Route, RowStream, UNDECLARED};
use crate::ingest::rows::MemoryRows;
use crate::ingest::stream::RowInput;
use crate::store::catalog::Split;

#[derive(Debug, Clone)]
pub struct Rows {
    pub rows: MemoryRows,
}

impl InputLayout for Rows {
    fn format(&self) -> &'static str {
        "libsvm"
    }

    /// No file: the rows are recorded by their checksum ([`InputLayout::source_params`]).
    fn sources(&self) -> Vec<(&'static str, PathBuf)> {
        Vec::new()
    }

    fn source_params(&self) -> Result<Vec<(&'static str, String)>> {
        Ok(vec![(Split::Train.name(), self.rows.describe())])
    }

    fn input_bytes(&self) -> Result<u64> {
        Ok(self.rows.bytes())
    }

    fn declares_sizes(&self) -> bool {
        false
    }

    fn open(&self, _lenient: bool) -> Result<OpenedInput> {
        let stream = RowStream {
            path: PathBuf::from(self.rows.describe()),
            input: RowInput::Rows(self.rows.clone()),
            declared_rows: None,
            first_data_line: 1,
            roles: vec![Split::Train.name()],
            route: Route::Whole(Split::Train),
        };
        Ok(OpenedInput {
            n_features: UNDECLARED,
            n_labels: UNDECLARED,
            streams: vec![stream],
            read_sources: Vec::new(),
        })
    }
}
