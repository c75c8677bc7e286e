//! Header lines (`N D L`, `N D`, `N L`): reading them, and holding a file to its N.

use std::path::Path;

use anyhow::{anyhow, Result};

use super::parse::parse_header;
use super::source::LineSource;
use super::stream::Parsed;
use crate::error::InputError;

/// Reads a header line, checking it is there and well-formed.
pub fn read_header(source: &mut LineSource, names: &[&str]) -> Result<Vec<u64>> {
    let mut line = Vec::new();
    let path = source.path().to_path_buf();
    match source.read_line(&mut line)? {
        None => Err(anyhow!(InputError::new(
            &path,
            1,
            format!(
                "found an empty file, expected a header '{}'",
                names.join(" ")
            )
        ))),
        Some(_) => {
            parse_header(&line, names).map_err(|msg| anyhow!(InputError::new(&path, 1, msg)))
        }
    }
}

/// A header count (D or L) as the u32 the parser works with.
pub fn to_u32(value: u64, what: &str, path: &Path) -> Result<u32> {
    u32::try_from(value).map_err(|_| {
        anyhow!(InputError::new(
            path,
            1,
            format!(
                "found {what} = {value} in the header, expected at most {}",
                u32::MAX
            )
        ))
    })
}

/// Checks rows against the header's N as blocks arrive; `lines` counts data lines so far.
pub fn check_row_count(path: &Path, declared: u64, lines: &mut u64, parsed: &Parsed) -> Result<()> {
    *lines += parsed.n_lines;
    if *lines > declared {
        // Data lines start at line 2; the first surplus row is data line N+1.
        return Err(anyhow!(InputError::new(
            path,
            declared + 2,
            format!(
                "found more rows than the header's N = {declared}, expected the file to end \
                 after line {}",
                declared + 1
            )
        )));
    }
    Ok(())
}

/// Checks at the end of a file that it held the header's N rows.
pub fn check_row_total(path: &Path, declared: u64, lines: u64) -> Result<()> {
    if lines < declared {
        return Err(anyhow!(InputError::new(
            path,
            lines + 1,
            format!("found the end of the file after {lines} rows, expected N = {declared} rows (header)")
        )));
    }
    Ok(())
}
