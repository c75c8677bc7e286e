//! BoW layout (AmazonCat style): separate feature (`N D`, rows `f:v ...`) and label
//! (`N L`, rows `l:v ...`) files, read in lockstep; a train pair and optionally a test pair.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::error::InputError;
use crate::ingest::input::{InputLayout, OpenedInput, Route, RowStream};
use crate::ingest::stream::RowInput;
use crate::store::catalog::Split;
use crate::text::header::{read_header, to_u32};
use crate::text::source::LineSource;

/// A (features, labels) file pair.
pub type BowPair = (PathBuf, PathBuf);

#[derive(Debug, Clone)]
pub struct Bow {
    pub train: BowPair,
    pub test: Option<BowPair>,
}

impl InputLayout for Bow {
    fn format(&self) -> &'static str {
        "bow"
    }

    fn sources(&self) -> Vec<(&'static str, PathBuf)> {
        let mut v = vec![
            ("train-features", self.train.0.clone()),
            ("train-labels", self.train.1.clone()),
        ];
        if let Some((f, l)) = &self.test {
            v.push(("test-features", f.clone()));
            v.push(("test-labels", l.clone()));
        }
        v
    }

    /// Reads all headers; the test pair must agree with the train pair on D and L.
    fn open(&self, _lenient: bool) -> Result<OpenedInput> {
        let (tf, tl, tn, d, l) = open_pair(&self.train)?;
        let mut streams = vec![pair_stream(Split::Train, tf, tl, tn)];
        if let Some(pair) = &self.test {
            let (f, lab, n, d2, l2) = open_pair(pair)?;
            if (d2, l2) != (d, l) {
                bail!(InputError::new(
                    &pair.0,
                    1,
                    format!(
                        "found D = {d2} (and L = {l2} in {}), expected D = {d}, L = {l} as in \
                         the training files",
                        pair.1.display()
                    )
                ));
            }
            streams.push(pair_stream(Split::Test, f, lab, n));
        }
        Ok(OpenedInput {
            n_features: d,
            n_labels: l,
            streams,
            read_sources: Vec::new(),
        })
    }
}

/// Opens a BoW pair and checks that the two headers agree on N: (features, labels, N, D, L).
fn open_pair(pair: &BowPair) -> Result<(LineSource, LineSource, u64, u32, u32)> {
    let mut features = LineSource::open(&pair.0)?;
    let fh = read_header(&mut features, &["N", "D"])?;
    let mut labels = LineSource::open(&pair.1)?;
    let lh = read_header(&mut labels, &["N", "L"])?;
    if fh[0] != lh[0] {
        bail!(InputError::new(
            &pair.1,
            1,
            format!(
                "found N = {} in the header, expected N = {} as in {}",
                lh[0],
                fh[0],
                pair.0.display()
            )
        ));
    }
    Ok((
        features,
        labels,
        fh[0],
        to_u32(fh[1], "D", &pair.0)?,
        to_u32(lh[1], "L", &pair.1)?,
    ))
}

/// The pair as split `split`; rows are located in the feature file.
fn pair_stream(split: Split, features: LineSource, labels: LineSource, declared: u64) -> RowStream {
    let roles = if split == Split::Train {
        vec!["train-features", "train-labels"]
    } else {
        vec!["test-features", "test-labels"]
    };
    RowStream {
        path: features.path().to_path_buf(),
        input: RowInput::Bow { features, labels },
        declared_rows: Some(declared),
        first_data_line: 2,
        roles,
        route: Route::Whole(split),
    }
}
