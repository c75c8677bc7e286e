//! What one evaluation measured, by task: ranking metrics for multi-label predictions (with
//! calibration over (row, label) pairs when probabilities were stored), or the binary or
//! multi-class metrics. One type for `metrics.json`, the catalog rows and the printed table.

use std::fmt::Write as _;

use anyhow::{Context, Result};

use super::binary::BinaryMetrics;
use super::calibration::Calibration;
use super::multiclass::MulticlassMetrics;
use super::task::Task;
use super::{metric_rows, Metrics};
use crate::store::catalog::{MetricRow, Split};

/// The metrics of one evaluation. Serialised without a tag: a multi-label evaluation's
/// JSON is [`Metrics`]'s exactly, the others carry `"task"`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum Evaluation {
    Ranking(Metrics),
    Binary(BinaryMetrics),
    Multiclass(MulticlassMetrics),
}

impl Evaluation {
    pub fn task(&self) -> Task {
        match self {
            Evaluation::Ranking(_) => Task::Multilabel,
            Evaluation::Binary(_) => Task::Binary,
            Evaluation::Multiclass(_) => Task::Multiclass,
        }
    }

    /// The calibration bins, when the evaluation has them.
    pub fn calibration(&self) -> Option<&Calibration> {
        match self {
            Evaluation::Ranking(m) => m.calibration.as_ref(),
            Evaluation::Binary(b) => Some(&b.calibration),
            Evaluation::Multiclass(m) => Some(&m.calibration),
        }
    }

    /// The ranking metrics, for a multi-label evaluation.
    pub fn ranking(&self) -> Option<&Metrics> {
        match self {
            Evaluation::Ranking(m) => Some(m),
            _ => None,
        }
    }

    /// Pretty-printed JSON (a multi-label evaluation's is [`Metrics::to_json`]).
    pub fn to_json(&self) -> String {
        match self {
            Evaluation::Ranking(m) => m.to_json(),
            other => serde_json::to_string_pretty(other).expect("metrics serialise to JSON"),
        }
    }

    /// Reads a `metrics.json`: the `task` key tells the kinds apart (absent: multi-label).
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_slice(bytes)?;
        let task = match value.get("task").and_then(|t| t.as_str()) {
            None => Task::Multilabel,
            Some(name) => name.parse().map_err(anyhow::Error::msg)?,
        };
        let parsed = match task {
            Task::Multilabel => serde_json::from_value(value).map(Evaluation::Ranking),
            Task::Binary => serde_json::from_value(value).map(Evaluation::Binary),
            Task::Multiclass => serde_json::from_value(value).map(Evaluation::Multiclass),
        };
        parsed.with_context(|| format!("a {task} metrics file"))
    }

    /// The catalog rows: a multi-label evaluation's are [`metric_rows`]'s, then `ece`,
    /// `mce`, `brier` when it has calibration; see [`classification_rows`] for the others.
    pub fn metric_rows(&self, step: Option<i64>, split: Option<Split>) -> Vec<MetricRow> {
        let named = |pairs: Vec<(String, f64)>| {
            pairs
                .into_iter()
                .map(|(name, value)| MetricRow {
                    name,
                    value,
                    step,
                    split,
                })
                .collect::<Vec<_>>()
        };
        match self {
            Evaluation::Ranking(m) => {
                let mut rows = metric_rows(m, step, split);
                if let Some(c) = &m.calibration {
                    rows.extend(named(calibration_pairs(c)));
                }
                rows
            }
            other => named(classification_rows(other)),
        }
    }

    /// Fixed-width text: the ranking table, or one line per classification metric.
    pub fn to_table(&self) -> String {
        match self {
            Evaluation::Ranking(m) => {
                let mut s = m.to_table();
                if let Some(c) = &m.calibration {
                    let _ = writeln!(
                        s,
                        "calibration over {} (row, label) pairs of the top {}, {} bins: \
                         ECE {:.2} %, MCE {:.2} %, Brier {:.5}",
                        c.count,
                        m.k_max,
                        c.bins,
                        100.0 * c.ece,
                        100.0 * c.mce,
                        c.brier
                    );
                }
                s
            }
            Evaluation::Binary(b) => {
                let auc = b.auc.map_or("undefined (one class only)".to_string(), |a| {
                    format!("{a:.5}")
                });
                let mut s = format!(
                    "binary: rows {} (positive {}), NLP floored on {} rows\n",
                    b.rows, b.positives, b.nlp_floored_rows
                );
                let _ = writeln!(s, "{:<12}{:>12.2} %", "accuracy", 100.0 * b.accuracy);
                let _ = writeln!(s, "{:<12}{:>12.5}", "nlp", b.nlp);
                let _ = writeln!(s, "{:<12}{:>12.5}", "brier", b.brier);
                let _ = writeln!(s, "{:<12}{:>12.2} %", "ece", 100.0 * b.ece);
                let _ = writeln!(s, "{:<12}{:>12.2} %", "mce", 100.0 * b.mce);
                let _ = writeln!(s, "{:<12}{auc:>12}", "auc");
                s
            }
            Evaluation::Multiclass(m) => multiclass_table(m),
        }
    }
}

fn multiclass_table(m: &MulticlassMetrics) -> String {
    let nlp = m.nlp.map_or(
        format!(
            "unknown: true class unlisted in {} rows",
            m.nlp_unlisted_rows
        ),
        |v| format!("{v:.5}"),
    );
    let mut s = format!(
        "multiclass: rows {}, classes {} ({} in the test truth, {} with a true positive), \
         NLP floored on {} rows\n",
        m.rows, m.classes, m.test_classes, m.covered_classes, m.nlp_floored_rows
    );
    let _ = writeln!(s, "{:<16}{:>12.2} %", "accuracy", 100.0 * m.accuracy);
    for (k, a) in m.top_k_accuracy.iter().enumerate().skip(1) {
        let _ = writeln!(
            s,
            "{:<16}{:>12.2} %",
            format!("top{}_accuracy", k + 1),
            100.0 * a
        );
    }
    let _ = writeln!(s, "{:<16}{:>12.2} %", "coverage", 100.0 * m.coverage);
    let _ = writeln!(s, "{:<16}{nlp:>12}", "nlp");
    let _ = writeln!(s, "{:<16}{:>12.5}", "brier", m.brier);
    let _ = writeln!(s, "{:<16}{:>12.2} %", "ece", 100.0 * m.ece);
    let _ = writeln!(s, "{:<16}{:>12.2} %", "mce", 100.0 * m.mce);
    s
}

fn calibration_pairs(c: &Calibration) -> Vec<(String, f64)> {
    vec![
        ("ece".into(), c.ece),
        ("mce".into(), c.mce),
        ("brier".into(), c.brier),
    ]
}

/// (name, value) of a binary or multi-class evaluation, as the catalog records them:
/// `accuracy`, then multi-class `top{k}_accuracy` (k ≥ 2) and `coverage`, `nlp` (when
/// defined), `ece`, `mce`, `brier`, and binary `auc` (when defined).
pub fn classification_rows(e: &Evaluation) -> Vec<(String, f64)> {
    let mut rows = Vec::new();
    match e {
        Evaluation::Ranking(_) => {}
        Evaluation::Binary(b) => {
            rows.push(("accuracy".into(), b.accuracy));
            rows.push(("nlp".into(), b.nlp));
            rows.extend(calibration_pairs(&b.calibration));
            rows.extend(b.auc.map(|a| ("auc".to_string(), a)));
        }
        Evaluation::Multiclass(m) => {
            rows.push(("accuracy".into(), m.accuracy));
            for (k, a) in m.top_k_accuracy.iter().enumerate().skip(1) {
                rows.push((format!("top{}_accuracy", k + 1), *a));
            }
            rows.push(("coverage".into(), m.coverage));
            rows.extend(m.nlp.map(|v| ("nlp".to_string(), v)));
            rows.extend(calibration_pairs(&m.calibration));
        }
    }
    rows
}
