//! Header lines (`N D L`, `N D`, `N L`): reading them, and holding a file to its N.

use std::path::Path;

use anyhow::{anyhow, Result};

use super::parse::{parse_header, MAX_IDS};
use super::source::{Compression, LineSource};
use crate::error::InputError;

/// Reads a header line (its first field N, the number of rows), checking it is there,
/// well-formed, and that the file can hold N rows: N may size a table before the rows are
/// read (the split layout's row assignment), so an absurd N is refused here.
pub fn read_header(source: &mut LineSource, names: &[&str]) -> Result<Vec<u64>> {
    let mut line = Vec::new();
    let path = source.path().to_path_buf();
    let fail = |msg: String| anyhow!(InputError::new(&path, 1, msg));
    if source.read_line(&mut line)?.is_none() {
        return Err(fail(format!(
            "found an empty file, expected a header '{}'",
            names.join(" ")
        )));
    }
    let values = parse_header(&line, names).map_err(fail)?;
    debug_assert_eq!(names[0], "N");
    if values[0] > source.max_lines() {
        return Err(fail(format!(
            "found N = {} in the header, expected at most {} rows: {}, and every row takes at \
             least one byte (its '\\n')",
            values[0],
            source.max_lines(),
            match source.compression() {
                Compression::None => format!("the file has {} bytes", source.raw_len()),
                c => format!(
                    "the file's {} {} bytes decompress to at most {}",
                    source.raw_len(),
                    c.name(),
                    source.max_lines()
                ),
            }
        )));
    }
    Ok(values)
}

/// A header count (D or L) as the u32 the parser works with, at most [`MAX_IDS`].
pub fn to_u32(value: u64, what: &str, path: &Path) -> Result<u32> {
    u32::try_from(value)
        .ok()
        .filter(|&v| v <= MAX_IDS)
        .ok_or_else(|| {
            anyhow!(InputError::new(
                path,
                1,
                format!(
                    "found {what} = {value} in the header, expected at most {MAX_IDS} (D and L \
                     are at most 2^31 - 1; docs/formats.md, \"Limits\")"
                )
            ))
        })
}

/// Checks rows against the header's N as blocks arrive: `lines` counts data lines so far,
/// `block_lines` those of the block that arrived.
pub fn check_row_count(
    path: &Path,
    declared: u64,
    lines: &mut u64,
    block_lines: u64,
) -> Result<()> {
    *lines += block_lines;
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
