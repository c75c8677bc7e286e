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

/// One option whose value no type rules out but the stage cannot use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionProblem {
    /// The option's command-line name without dashes (`checkpoint-every`).
    pub option: &'static str,
    /// What is wrong, to follow the option's name (`must be at least 1`).
    pub problem: String,
}

/// Every out-of-range option of one stage's options, found together so a caller can report
/// them all at once: the command line shows `--top-k must be at least 1`, a spec
/// `[predict] top_k must be at least 1`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InvalidOptions {
    /// Put before each problem on the command line (`synth: `).
    pub prefix: &'static str,
    pub problems: Vec<OptionProblem>,
}

impl InvalidOptions {
    pub fn new(prefix: &'static str) -> Self {
        InvalidOptions {
            prefix,
            problems: Vec::new(),
        }
    }

    /// Records `problem` of `option` unless `ok`.
    pub fn check(&mut self, ok: bool, option: &'static str, problem: impl FnOnce() -> String) {
        if !ok {
            self.problems.push(OptionProblem {
                option,
                problem: problem(),
            });
        }
    }

    /// Ok when no check failed.
    pub fn into_result(self) -> Result<(), InvalidOptions> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for InvalidOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}--{} {}", self.prefix, p.option, p.problem)?;
        }
        Ok(())
    }
}

impl std::error::Error for InvalidOptions {}

/// The candidate closest to `name` by Damerau–Levenshtein distance, when it is close enough
/// to be a slip of the keyboard: at most a third of the name's length is changed (at least
/// one edit is always allowed).
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let allowed = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(name, c), c))
        .filter(|&(d, c)| d <= allowed && c != name)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// `did you mean 'x'? ` when a candidate is close to `name`, else nothing; the start of a
/// not-found hint.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    closest(name, candidates).map_or(String::new(), |c| format!("did you mean '{c}'? "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_names_only_close_candidates() {
        let names = ["delicious", "eurlex", "mediamill"];
        assert_eq!(closest("delicous", names), Some("delicious"));
        assert_eq!(closest("eurlx", names), Some("eurlex"));
        assert_eq!(closest("bibtex", names), None);
        assert_eq!(closest("31", ["13", "7"]), Some("13"));
        assert_eq!(did_you_mean("top_kk", ["top_k"]), "did you mean 'top_k'? ");
        assert_eq!(did_you_mean("zzz", ["top_k"]), "");
    }

    #[test]
    fn invalid_options_list_every_problem() {
        let mut c = InvalidOptions::new("");
        c.check(false, "top-k", || "must be at least 1".into());
        c.check(true, "k", || unreachable!());
        c.check(false, "lr", || "must be > 0".into());
        let e = c.into_result().unwrap_err();
        assert_eq!(
            e.to_string(),
            "--top-k must be at least 1; --lr must be > 0"
        );
        assert!(InvalidOptions::new("").into_result().is_ok());
    }
}
