//! Label kinds and class maps: when the ingest assigns the label ids (LIBSVM files, whose
//! labels are class values and which declare neither D nor the classes; `--first-label` on
//! any layout), a scan pass over every input file, train and test together, collects the
//! distinct label values, the labels per row and the largest feature index, and
//! [`decide`] turns them into the dataset's [`LabelKind`], [`ClassMap`] and D before the
//! rows are parsed again and written (`docs/formats.md`, "LIBSVM files").
//!
//! The scan streams like the ingest itself: memory is the parser's bounded blocks plus the
//! set of distinct label values, which is bounded by the number of classes, not by N.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};

use super::config::IngestConfig;
use super::input::{Route, UNDECLARED};
use super::stream::stream_rows;
use super::validation::CARVED_FROM;
use crate::progress::Progress;
use crate::stop::StopToken;
use crate::store::catalog::{ClassMap, LabelKind, Split};
use crate::store::classes::UnseenClasses;
use crate::text::parse::{LabelRules, LabelScan};
use crate::transform::Transform;

/// What the scan decided.
#[derive(Debug, Clone)]
pub struct LabelPlan {
    pub kind: LabelKind,
    pub classes: Arc<ClassMap>,
    /// D of the dataset: `--features`, a header's D, or the largest index seen + 1.
    pub n_features: u32,
    /// Rows must have exactly one label (binary, and multi-class without `--first-label`).
    pub exactly_one: bool,
    /// `qid:` tokens ignored over all files.
    pub qid_tokens: u64,
}

impl LabelPlan {
    /// The parser's label rules of the writing pass.
    pub fn label_rules(&self, first_label: bool) -> LabelRules {
        LabelRules {
            first_label,
            classes: Some(Arc::clone(&self.classes)),
            exactly_one: self.exactly_one,
            unlabeled_ok: false,
            unknown_left_out: false,
        }
    }
}

/// The scan's findings over all files, with the files the first odd rows are in.
#[derive(Debug, Default)]
struct Scanned {
    all: LabelScan,
    /// The distinct label values of each split fed by a whole stream, in stream order
    /// (`--class-map train` numbers those of `train` only).
    by_split: Vec<(Split, BTreeSet<i64>)>,
    first_unlabeled: Option<(PathBuf, u64)>,
    first_multi_label: Option<(PathBuf, u64)>,
    qid_tokens: u64,
}

impl Scanned {
    fn add(&mut self, path: &Path, scan: LabelScan) {
        if let (None, Some(line)) = (&self.first_unlabeled, scan.first_unlabeled) {
            self.first_unlabeled = Some((path.to_path_buf(), line));
        }
        if let (None, Some(line)) = (&self.first_multi_label, scan.first_multi_label) {
            self.first_multi_label = Some((path.to_path_buf(), line));
        }
        self.all.merge(scan);
    }
}

/// Scans every input file of `config` (bad rows are errors, or skipped under `--lenient`
/// exactly as the writing pass skips them) and decides the labels; prints what it found.
/// `progress` counts the input bytes read.
pub fn scan(
    config: &IngestConfig,
    threads: usize,
    progress: &Progress,
    stop: &StopToken,
) -> Result<LabelPlan> {
    let opened = config.layout.open(config.lenient)?;
    let declared_d = if config.layout.declares_sizes() {
        Some(opened.n_features)
    } else {
        config.features
    };
    let labels = LabelRules {
        first_label: config.first_label,
        classes: None,
        exactly_one: false,
        unlabeled_ok: false,
        unknown_left_out: false,
    };
    let rules = config.row_rules(
        declared_d.unwrap_or(UNDECLARED),
        opened.n_labels,
        labels,
        Transform::None,
    );
    let mut scanned = Scanned::default();
    for stream in opened.streams {
        let path = stream.path.clone();
        match (&stream.route, config.class_map_from_train) {
            (Route::Whole(split), _) => scanned.by_split.push((*split, BTreeSet::new())),
            (Route::ByRow { .. }, true) => bail!(
                "--class-map train: {} feeds several splits through a row table; it needs \
                 the training rows in files of their own (--train/--test)",
                path.display()
            ),
            (Route::ByRow { .. }, false) => {}
        }
        let mut scan = LabelScan::default();
        stream_rows(
            stream.input,
            &rules,
            threads,
            progress,
            stop,
            &mut |parsed| {
                scanned.qid_tokens += parsed.block.qid_tokens;
                scan.merge(parsed.block.scan);
                Ok(())
            },
        )?;
        if let (Route::Whole(_), Some((_, values))) = (&stream.route, scanned.by_split.last_mut()) {
            values.extend(scan.values.iter().copied());
        }
        scanned.add(&path, scan);
    }
    let plan = decide(config, &scanned, declared_d)?;
    report(config, &scanned, &plan);
    Ok(plan)
}

/// The label kind, class map and D from the scan.
fn decide(config: &IngestConfig, s: &Scanned, declared_d: Option<u32>) -> Result<LabelPlan> {
    let files = sources_text(config);
    let n_features = match declared_d {
        Some(d) => d,
        None => s.all.max_feature.map(|m| m + 1).ok_or_else(|| {
            anyhow!(
                "{files}: found no feature index in any row, expected 'idx:val' tokens (or \
                 pass --features D)"
            )
        })?,
    };
    let values: Vec<i64> = match config.class_map_from_train {
        true => training_values(s).into_iter().collect(),
        false => s.all.values.iter().copied().collect(),
    };
    if values.is_empty() {
        bail!(
            "{files}: found no label in any of {} rows, expected class labels",
            s.all.rows
        );
    }
    let kind = match (config.first_label, config.label_kind) {
        (true, _) => LabelKind::Multiclass,
        (false, Some(kind)) => kind,
        (false, None) => detect(s, &values, &files)?,
    };
    let mut classes = match kind {
        LabelKind::Binary => binary_map(&values)?,
        _ => ClassMap::new(values, None)?,
    };
    if config.class_map_from_train {
        classes.unseen = unseen_classes(s);
    }
    Ok(LabelPlan {
        kind,
        classes: Arc::new(classes),
        n_features,
        exactly_one: kind != LabelKind::Multilabel && !config.first_label,
        qid_tokens: s.qid_tokens,
    })
}

/// The label values of the training rows (`--class-map train`).
fn training_values(s: &Scanned) -> BTreeSet<i64> {
    s.by_split
        .iter()
        .filter(|(split, _)| *split == CARVED_FROM)
        .flat_map(|(_, values)| values.iter().copied())
        .collect()
}

/// Per split other than train, its label values that no training row has (row counts 0:
/// the writing pass counts the rows).
fn unseen_classes(s: &Scanned) -> Vec<UnseenClasses> {
    let train = training_values(s);
    let mut out: Vec<UnseenClasses> = Vec::new();
    for (split, values) in s.by_split.iter().filter(|(split, _)| *split != CARVED_FROM) {
        let missing = values.iter().filter(|v| !train.contains(v)).copied();
        match out.iter_mut().find(|u| u.split == *split) {
            Some(u) => {
                let merged: BTreeSet<i64> = u.values.iter().copied().chain(missing).collect();
                u.values = merged.into_iter().collect();
            }
            None => out.push(UnseenClasses {
                split: *split,
                values: missing.collect(),
                rows: 0,
            }),
        }
    }
    out.retain(|u| !u.values.is_empty());
    out
}

/// The kind the rows show: multi-label when a row has no label or several; else binary
/// when the values are {−1, +1} or {0, 1}; else multi-class.
fn detect(s: &Scanned, values: &[i64], files: &str) -> Result<LabelKind> {
    if s.all.multi_label_rows > 0 || s.all.unlabeled_rows > 0 {
        return Ok(LabelKind::Multilabel);
    }
    match values {
        [-1, 1] | [0, 1] => Ok(LabelKind::Binary),
        [single] => bail!(
            "{files}: found the same label {single} in all {} rows, expected at least two \
             classes; pass --label-kind binary (if {single} is one of -1/+1 or 0/1) or \
             --label-kind multiclass to ingest it anyway",
            s.all.rows
        ),
        _ => Ok(LabelKind::Multiclass),
    }
}

/// Binary: label id 0 is the positive class (+1 / 1); the negative (−1 / 0) has no id.
fn binary_map(values: &[i64]) -> Result<ClassMap> {
    let negative = match values {
        [-1, 1] | [-1] => Some(-1),
        [0, 1] | [0] => Some(0),
        [1] => None,
        _ => bail!(
            "--label-kind binary: found label values {}, expected -1 and +1, or 0 and 1 (or \
             one of them)",
            list(values)
        ),
    };
    ClassMap::new(vec![1], negative)
}

/// Prints the detected kind, L, the class map (its first entries) and the `qid:` count.
fn report(config: &IngestConfig, s: &Scanned, plan: &LabelPlan) {
    let how = match (config.first_label, config.label_kind) {
        (true, _) if config.class_map_from_train => {
            "--first-label, classes of the training rows".to_string()
        }
        (true, _) => "--first-label".to_string(),
        (false, Some(_)) => "--label-kind".to_string(),
        (false, None) => match (&s.first_multi_label, &s.first_unlabeled) {
            (Some((p, line)), _) => format!("detected: {}:{line} has several labels", p.display()),
            (None, Some((p, line))) => format!("detected: {}:{line} has no label", p.display()),
            (None, None) => format!(
                "detected: one label per row, values {}",
                list(&s.all.values.iter().copied().collect::<Vec<_>>())
            ),
        },
    };
    let map = &plan.classes;
    let shown: Vec<String> = map
        .values
        .iter()
        .enumerate()
        .take(12)
        .map(|(id, v)| format!("{id} → {v}"))
        .collect();
    let more = if map.len() > 12 { ", ..." } else { "" };
    let negative = map.negative.map_or(String::new(), |n| {
        format!("; label {n}: the negative class, no label id")
    });
    crate::progress::note(format!(
        "labels: {} ({how}); L = {}, D = {}; class map id → label: {}{more}{negative}",
        plan.kind,
        map.len(),
        plan.n_features,
        shown.join(", ")
    ));
    for u in &map.unseen {
        crate::progress::note(format!(
            "labels: {} classes of split '{}' are not among the training rows' (their rows \
             are kept without a class and scored as wrong)",
            u.values.len(),
            u.split
        ));
    }
    if plan.qid_tokens > 0 {
        crate::progress::warning(format!(
            "ignored {} 'qid:' tokens (SVMlight query ids; fsgp does not rank \
             within queries)",
            plan.qid_tokens
        ));
    }
}

fn sources_text(config: &IngestConfig) -> String {
    let sources = config.layout.source_params().unwrap_or_default();
    let shown: Vec<String> = sources.into_iter().map(|(_, source)| source).collect();
    shown.join(", ")
}

/// `{a, b, c}`, at most 10 values.
fn list(values: &[i64]) -> String {
    let mut shown: Vec<String> = values.iter().take(10).map(|v| v.to_string()).collect();
    if values.len() > 10 {
        shown.push("...".into());
    }
    format!("{{{}}}", shown.join(", "))
}
