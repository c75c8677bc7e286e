//! LIBSVM / SVMlight layout: a train file and optionally a test file of rows
//! `label[,label...] [qid:N] idx:val ... [# comment]`, without a header. D and the label ids
//! are decided by the scan pass over both files ([`crate::ingest::labels`]).

use std::path::PathBuf;

use anyhow::Result;

use crate::ingest::input::{InputLayout, OpenedInput, Route, RowStream, UNDECLARED};
use crate::ingest::stream::RowInput;
use crate::store::catalog::Split;
use crate::text::parse::LineSyntax;
use crate::text::source::LineSource;

#[derive(Debug, Clone)]
pub struct Libsvm {
    pub train: PathBuf,
    pub test: Option<PathBuf>,
}

impl InputLayout for Libsvm {
    fn format(&self) -> &'static str {
        "libsvm"
    }

    fn sources(&self) -> Vec<(&'static str, PathBuf)> {
        // A file holding a whole split has the split's name as its role.
        let mut v = vec![(Split::Train.name(), self.train.clone())];
        v.extend(self.test.clone().map(|t| (Split::Test.name(), t)));
        v
    }

    fn declares_sizes(&self) -> bool {
        false
    }

    /// Opens the files; there is no header to read or cross-check.
    fn open(&self, _lenient: bool) -> Result<OpenedInput> {
        let mut streams = vec![split_stream(Split::Train, LineSource::open(&self.train)?)];
        if let Some(path) = &self.test {
            streams.push(split_stream(Split::Test, LineSource::open(path)?));
        }
        Ok(OpenedInput {
            n_features: UNDECLARED,
            n_labels: UNDECLARED,
            streams,
            read_sources: Vec::new(),
        })
    }
}

/// The whole file `source` as split `split`; its rows start at line 1.
fn split_stream(split: Split, source: LineSource) -> RowStream {
    RowStream {
        path: source.path().to_path_buf(),
        input: RowInput::Lines {
            source,
            syntax: LineSyntax::Libsvm,
        },
        declared_rows: None,
        first_data_line: 1,
        roles: vec![split.name()],
        route: Route::Whole(split),
    }
}
