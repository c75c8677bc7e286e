//! Error types shared by the stages.
//!
//! Input problems are reported as `file:line: what was found, what was expected`, the
//! convention of compilers and ripgrep, so an editor can jump to the offending line.

use std::fmt;
use std::path::{Path, PathBuf};

/// A problem with an input file, located at a 1-based line (0 when the whole file is at fault).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    pub file: PathBuf,
    pub line: u64,
    pub msg: String,
}

impl InputError {
    pub fn new(file: &Path, line: u64, msg: impl Into<String>) -> Self {
        InputError {
            file: file.to_path_buf(),
            line,
            msg: msg.into(),
        }
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.msg)
        } else {
            write!(f, "{}:{}: {}", self.file.display(), self.line, self.msg)
        }
    }
}

impl std::error::Error for InputError {}

/// A problem found on one line, before the file it belongs to is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub line: u64,
    pub msg: String,
}

impl LineError {
    pub fn new(line: u64, msg: impl Into<String>) -> Self {
        LineError {
            line,
            msg: msg.into(),
        }
    }

    pub fn in_file(self, file: &Path) -> InputError {
        InputError::new(file, self.line, self.msg)
    }
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for LineError {}
