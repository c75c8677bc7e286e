//! What one evaluation measured, by task: ranking metrics for multi-label predictions (with
//! calibration over (row, label) pairs when probabilities were stored), or the binary or
//! multi-class metrics. One type for `metrics.json`, the catalog rows and the printed table.

use std::fmt::Write as _;

use anyhow::{Context, Result};

use super::binary::BinaryMetrics;
use super::calibration::Calibration;
use super::multiclass::MulticlassMetrics;
use super::names::{top_k_accuracy, Figure};
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
                let _ = writeln!(
                    s,
                    "{:<12}{:>12.2} %",
                    Figure::Accuracy.name(),
                    100.0 * b.accuracy
                );
                let _ = writeln!(s, "{:<12}{:>12.5}", Figure::Nlp.name(), b.nlp);
                let _ = writeln!(s, "{:<12}{:>12.5}", Figure::Brier.name(), b.brier);
                let _ = writeln!(s, "{:<12}{:>12.2} %", Figure::Ece.name(), 100.0 * b.ece);
                let _ = writeln!(s, "{:<12}{:>12.2} %", Figure::Mce.name(), 100.0 * b.mce);
                let _ = writeln!(s, "{:<12}{auc:>12}", Figure::Auc.name());
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
    let _ = writeln!(
        s,
        "{:<16}{:>12.2} %",
        Figure::Accuracy.name(),
        100.0 * m.accuracy
    );
    for (k, a) in m.top_k_accuracy.iter().enumerate().skip(1) {
        let _ = writeln!(s, "{:<16}{:>12.2} %", top_k_accuracy(k + 1), 100.0 * a);
    }
    let _ = writeln!(
        s,
        "{:<16}{:>12.2} %",
        Figure::Coverage.name(),
        100.0 * m.coverage
    );
    let _ = writeln!(s, "{:<16}{nlp:>12}", Figure::Nlp.name());
    let _ = writeln!(s, "{:<16}{:>12.5}", Figure::Brier.name(), m.brier);
    let _ = writeln!(s, "{:<16}{:>12.2} %", Figure::Ece.name(), 100.0 * m.ece);
    let _ = writeln!(s, "{:<16}{:>12.2} %", Figure::Mce.name(), 100.0 * m.mce);
    s
}

fn calibration_pairs(c: &Calibration) -> Vec<(String, f64)> {
    vec![
        (Figure::Ece.name().into(), c.ece),
        (Figure::Mce.name().into(), c.mce),
        (Figure::Brier.name().into(), c.brier),
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
            rows.push((Figure::Accuracy.name().into(), b.accuracy));
            rows.push((Figure::Nlp.name().into(), b.nlp));
            rows.extend(calibration_pairs(&b.calibration));
            rows.extend(b.auc.map(|a| (Figure::Auc.name().into(), a)));
        }
        Evaluation::Multiclass(m) => {
            rows.push((Figure::Accuracy.name().into(), m.accuracy));
            for (k, a) in m.top_k_accuracy.iter().enumerate().skip(1) {
                rows.push((top_k_accuracy(k + 1), *a));
            }
            rows.push((Figure::Coverage.name().into(), m.coverage));
            rows.extend(m.nlp.map(|v| (Figure::Nlp.name().into(), v)));
            rows.extend(calibration_pairs(&m.calibration));
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::binary::BinaryAccumulator;
    use crate::metrics::calibration::CalibrationAccumulator;
    use crate::metrics::multiclass::MulticlassAccumulator;
    use crate::metrics::names::{split_at_k, top_k_accuracy, AtK};
    use crate::metrics::{LabellessRows, MetricsAccumulator};

    /// One evaluation of each task, every optional figure present.
    fn evaluations() -> Vec<Evaluation> {
        let mut ranking = MetricsAccumulator::new(3, vec![1.0; 4], LabellessRows::CountAsZero)
            .unwrap()
            .finish();
        let mut pairs = CalibrationAccumulator::new();
        pairs.add(0.8, true).unwrap();
        ranking.calibration = Some(pairs.finish());
        let mut binary = BinaryAccumulator::new();
        binary.add_row(0.75, true).unwrap();
        binary.add_row(0.25, false).unwrap();
        let mut multiclass = MulticlassAccumulator::new(3, 2).unwrap();
        multiclass.add_row(&[0, 1], &[0.6, 0.3], &[0]).unwrap();
        multiclass.add_row(&[2, 1], &[0.5, 0.4], &[1]).unwrap();
        vec![
            Evaluation::Ranking(ranking),
            Evaluation::Binary(binary.finish()),
            Evaluation::Multiclass(multiclass.finish()),
        ]
    }

    #[test]
    fn every_recorded_metric_is_named_in_the_one_list_and_is_a_key_of_the_json() {
        for e in evaluations() {
            let rows = e.metric_rows(Some(4), Some(Split::Test));
            let json: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
            assert!(!rows.is_empty(), "{:?}", e.task());
            for r in &rows {
                assert_eq!((r.step, r.split), (Some(4), Some(Split::Test)));
                if let Some((measure, k)) = split_at_k(&r.name) {
                    let m = AtK::ALL.iter().copied().find(|m| m.prefix() == measure);
                    assert_eq!(m.map(|m| m.at(k)).as_ref(), Some(&r.name), "{}", r.name);
                    continue;
                }
                let top_k = (2..=e.ranking().map_or(3, |m| m.k_max)).map(top_k_accuracy);
                if top_k.clone().any(|n| n == r.name) {
                    continue;
                }
                let figure = Figure::of(&r.name).unwrap_or_else(|| panic!("{} unnamed", r.name));
                // Classification figures are the metrics file's keys of the same name
                // (a ranking evaluation's calibration sits under `calibration`).
                let holder = match &e {
                    Evaluation::Ranking(_) => &json["calibration"],
                    _ => &json,
                };
                assert!(
                    holder.get(figure.name()).is_some(),
                    "{} not in {json}",
                    r.name
                );
            }
        }
    }
}
