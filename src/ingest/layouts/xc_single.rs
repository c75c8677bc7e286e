//! Single-file layout: a train file and optionally a test file, each `N D L` + rows
//! `l1,l2 f:v ...`.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::error::InputError;
use crate::ingest::input::{InputLayout, OpenedInput, Route, RowStream};
use crate::ingest::stream::RowInput;
use crate::store::catalog::Split;
use crate::text::header::{read_header, to_u32};
use crate::text::parse::LineSyntax;
use crate::text::source::LineSource;

#[derive(Debug, Clone)]
pub struct XcSingle {
    pub train: PathBuf,
    pub test: Option<PathBuf>,
}

impl InputLayout for XcSingle {
    fn format(&self) -> &'static str {
        "xc"
    }

    fn sources(&self) -> Vec<(&'static str, PathBuf)> {
        // A file holding a whole split has the split's name as its role.
        let mut v = vec![(Split::Train.name(), self.train.clone())];
        v.extend(self.test.clone().map(|t| (Split::Test.name(), t)));
        v
    }

    /// Reads both headers; the test file must agree with the train file on D and L.
    fn open(&self, _lenient: bool) -> Result<OpenedInput> {
        let mut train_src = LineSource::open(&self.train)?;
        let header = read_header(&mut train_src, &["N", "D", "L"])?;
        let (d, l) = (
            to_u32(header[1], "D", &self.train)?,
            to_u32(header[2], "L", &self.train)?,
        );
        let mut streams = vec![split_stream(Split::Train, train_src, header[0])];
        if let Some(path) = &self.test {
            let mut src = LineSource::open(path)?;
            let h = read_header(&mut src, &["N", "D", "L"])?;
            if h[1] != header[1] || h[2] != header[2] {
                bail!(InputError::new(
                    path,
                    1,
                    format!(
                        "found D = {}, L = {} in the header, expected D = {}, L = {} as in {}",
                        h[1],
                        h[2],
                        header[1],
                        header[2],
                        self.train.display()
                    )
                ));
            }
            streams.push(split_stream(Split::Test, src, h[0]));
        }
        Ok(OpenedInput {
            n_features: d,
            n_labels: l,
            streams,
            read_sources: Vec::new(),
        })
    }
}

/// The whole file `source` (with `declared` rows) as split `split`.
fn split_stream(split: Split, source: LineSource, declared: u64) -> RowStream {
    RowStream {
        path: source.path().to_path_buf(),
        input: RowInput::Lines {
            source,
            syntax: LineSyntax::LabelsFeatures,
        },
        declared_rows: Some(declared),
        first_data_line: 2,
        roles: vec![split.name()],
        route: Route::Whole(split),
    }
}
