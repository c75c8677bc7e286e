//! Split layout (EUR-Lex style): one `*_data.txt` file (`N D L` + rows `l1,l2 f:v ...`)
//! holding all rows, and `*_trSplit.txt` / `*_tstSplit.txt` files of 1-based row numbers,
//! one column per split, saying which rows are train and which are test.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};

use crate::error::InputError;
use crate::ingest::input::{InputLayout, OpenedInput, Route, RowStream};
use crate::ingest::stream::RowInput;
use crate::store::catalog::Split;
use crate::text::header::{read_header, to_u32};
use crate::text::parse::{parse_u64, LineSyntax};
use crate::text::source::{LineSource, SourceInfo};

#[derive(Debug, Clone)]
pub struct XcSplit {
    pub data: PathBuf,
    pub train_split: PathBuf,
    pub test_split: Option<PathBuf>,
    /// Which column of the split files to use (0 = the first).
    pub column: usize,
}

/// Marks in the row assignment table (0: in no split).
const TRAIN: u8 = 1;
const TEST: u8 = 2;

impl InputLayout for XcSplit {
    fn format(&self) -> &'static str {
        "xc-split"
    }

    fn sources(&self) -> Vec<(&'static str, PathBuf)> {
        let mut v = vec![
            ("data", self.data.clone()),
            ("train-split", self.train_split.clone()),
        ];
        v.extend(self.test_split.clone().map(|t| ("test-split", t)));
        v
    }

    fn split_column(&self) -> Option<usize> {
        Some(self.column)
    }

    /// Reads the data header, then both split files into the row assignment table.
    fn open(&self, lenient: bool) -> Result<OpenedInput> {
        let mut data_src = LineSource::open(&self.data)?;
        let header = read_header(&mut data_src, &["N", "D", "L"])?;
        let (d, l) = (
            to_u32(header[1], "D", &self.data)?,
            to_u32(header[2], "L", &self.data)?,
        );
        let declared = header[0];
        // One byte per data row: N bytes, far below the data.
        let mut assign = vec![0u8; usize::try_from(declared)?];
        let mut read_sources = vec![(
            "train-split",
            read_split_file(&self.train_split, self.column, lenient, TRAIN, &mut assign)?,
        )];
        let mut splits = vec![Split::Train];
        if let Some(ts) = &self.test_split {
            read_sources.push((
                "test-split",
                read_split_file(ts, self.column, lenient, TEST, &mut assign)?,
            ));
            splits.push(Split::Test);
        }
        let stream = RowStream {
            path: self.data.clone(),
            input: RowInput::Lines {
                source: data_src,
                syntax: LineSyntax::LabelsFeatures,
            },
            declared_rows: Some(declared),
            first_data_line: 2,
            roles: vec!["data"],
            route: Route::ByRow { splits, assign },
        };
        Ok(OpenedInput {
            n_features: d,
            n_labels: l,
            streams: vec![stream],
            read_sources,
        })
    }
}

/// Marks the rows listed in column `column` of a split file with `mark` in `assign`.
fn read_split_file(
    path: &Path,
    column: usize,
    lenient: bool,
    mark: u8,
    assign: &mut [u8],
) -> Result<SourceInfo> {
    let mut src = LineSource::open(path)?;
    let n = assign.len() as u64;
    let mut line = Vec::new();
    let mut any = false;
    let fail = |line_no: u64, msg: String| anyhow!(InputError::new(path, line_no, msg));
    while let Some(terminated) = src.read_line(&mut line)? {
        let line_no = src.lines_read();
        any = true;
        if !terminated && !lenient {
            return Err(fail(
                line_no,
                "found the last line without a '\\n' line end, expected every line to end with \
                 '\\n' (the file may be truncated; pass --lenient to accept it)"
                    .into(),
            ));
        }
        let text = match line.strip_suffix(b"\r") {
            Some(t) if lenient => t,
            Some(_) => {
                return Err(fail(
                    line_no,
                    "found a CRLF line ending (\"\\r\\n\"), expected \"\\n\" (strip the '\\r' \
                     characters, or pass --lenient to accept them)"
                        .into(),
                ))
            }
            None => &line[..],
        };
        let cols: Vec<&[u8]> = text
            .split(|&b| b == b' ' || b == b'\t')
            .filter(|t| !t.is_empty())
            .collect();
        let Some(token) = cols.get(column) else {
            return Err(fail(
                line_no,
                format!(
                    "found {} column(s), expected at least {} (--split-column {column})",
                    cols.len(),
                    column + 1
                ),
            ));
        };
        let row = parse_u64(token).filter(|r| (1..=n).contains(r)).ok_or_else(|| {
            fail(
                line_no,
                format!(
                    "found row number '{}', expected a 1-based row number in 1..={n} (N of the data file)",
                    String::from_utf8_lossy(token)
                ),
            )
        })?;
        let slot = &mut assign[(row - 1) as usize];
        if *slot == mark {
            return Err(fail(
                line_no,
                format!("found row {row} a second time, expected each row once"),
            ));
        }
        if *slot != 0 {
            return Err(fail(
                line_no,
                format!("found row {row}, which the training split already holds, expected disjoint splits"),
            ));
        }
        *slot = mark;
    }
    if !any {
        return Err(fail(
            1,
            "found an empty file, expected one line of row numbers per row".into(),
        ));
    }
    src.finish()
}
