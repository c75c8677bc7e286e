//! What a dataset's labels mean, which decides the metrics (`docs/metrics.md`).

use std::fmt;
use std::str::FromStr;

/// The task a model was trained for (a training run's `task`, multilabel when absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Any number of labels per row; ranking metrics (P@k, nDCG@k, ...).
    #[default]
    Multilabel,
    /// L = 1: label 0 is the positive class, a row without it is negative.
    Binary,
    /// L = K classes, exactly one true label per row.
    Multiclass,
}

impl Task {
    pub const NAMES: [&'static str; 3] = ["multilabel", "binary", "multiclass"];

    pub fn name(self) -> &'static str {
        match self {
            Task::Multilabel => "multilabel",
            Task::Binary => "binary",
            Task::Multiclass => "multiclass",
        }
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Task {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "multilabel" => Ok(Task::Multilabel),
            "binary" => Ok(Task::Binary),
            "multiclass" => Ok(Task::Multiclass),
            other => anyhow::bail!(
                "unknown task '{other}' (expected one of: {})",
                Task::NAMES.join(", ")
            ),
        }
    }
}
