//! The feature transform's pass: when the transform needs the training split's statistics
//! (`standardize`, `scale`, or `auto` deciding), the training rows are parsed once before the
//! writing pass, exactly as that pass will parse them (same rules, same class map, the same
//! validation carve), and their per-feature statistics gathered ([`FeatureStats`]); then the
//! transform is fitted and, for `auto`, chosen (`docs/transforms.md`).
//!
//! Memory is the parser's bounded blocks plus four numbers per feature present; rows of other
//! splits are not even parsed.

use anyhow::Result;

use super::config::IngestConfig;
use super::input::Route;
use super::labels::LabelPlan;
use super::stream::stream_rows;
use super::validation::CARVED_FROM;
use crate::progress::Progress;
use crate::stop::StopToken;
use crate::text::parse::{LabelRules, RowRules};
use crate::transform::{decide_auto, FeatureStats, Transform, TransformChoice};

/// The transform the rows are written with, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct FittedTransform {
    pub transform: Transform,
    /// What `auto` found and chose; empty when the transform was asked for by name.
    pub reason: String,
    /// The training rows the statistics come from (0 when none were gathered).
    pub training_rows: u64,
}

/// Fits `config.transform` on the training rows (a pass over them when it needs
/// statistics); prints `auto`'s decision.
pub fn fit_transform(
    config: &IngestConfig,
    plan: Option<&LabelPlan>,
    threads: usize,
    progress: &Progress,
    stop: &StopToken,
) -> Result<FittedTransform> {
    if !config.transform.needs_statistics() {
        return Ok(FittedTransform {
            transform: Transform::fitted(config.transform, None),
            reason: String::new(),
            training_rows: 0,
        });
    }
    let stats = training_statistics(config, plan, threads, progress, stop)?;
    let (choice, reason) = match config.transform {
        TransformChoice::Auto => {
            let decision = decide_auto(&stats);
            progress.note(format!(
                "transform: {} (auto: {})",
                decision.choice, decision.reason
            ));
            (decision.choice, decision.reason)
        }
        named => (named, String::new()),
    };
    if choice == TransformChoice::Standardize && stats.density() < crate::transform::DENSE_SHARE {
        progress.note(format!(
            "note: standardize stores all D values of every row, and {:.1} % of the \
             training values are non-zero; --transform scale keeps the rows sparse",
            100.0 * stats.density()
        ));
    }
    Ok(FittedTransform {
        transform: Transform::fitted(choice, Some(&stats)),
        reason,
        training_rows: stats.rows(),
    })
}

/// The per-feature statistics of the rows the writing pass will put in the training split.
fn training_statistics(
    config: &IngestConfig,
    plan: Option<&LabelPlan>,
    threads: usize,
    progress: &Progress,
    stop: &StopToken,
) -> Result<FeatureStats> {
    let opened = config.layout.open(config.lenient)?;
    let (rules, _, _) = pass_rules(
        config,
        plan,
        opened.n_features,
        opened.n_labels,
        Transform::None,
    );
    let mut stats = FeatureStats::default();
    for stream in opened.streams {
        let feeds_training: Vec<bool> = stream
            .route
            .splits()
            .iter()
            .map(|&s| s == CARVED_FROM)
            .collect();
        if !feeds_training.contains(&true) {
            continue;
        }
        let (route, first_line) = (stream.route, stream.first_data_line);
        let is_training = |index: u64| {
            let position = match &route {
                Route::Whole(_) => 0,
                Route::ByRow { assign, .. } => match assign[index as usize] {
                    0 => return false,
                    m => usize::from(m - 1),
                },
            };
            feeds_training[position] && !config.validation.is_some_and(|v| v.selects(index))
        };
        stream_rows(
            stream.input,
            &rules,
            threads,
            progress,
            stop,
            &mut |parsed| {
                let rows = &parsed.block.rows;
                for i in 0..rows.len() {
                    let row = rows.row(i);
                    if is_training(row.row_id - first_line) {
                        stats.add_row(row.indices, row.values);
                    }
                }
                Ok(())
            },
        )?;
    }
    Ok(stats)
}

/// The parser's rules of a pass over the rows, with the dataset's D and L: ids checked
/// against the declared sizes (or the scan's D), labels through the scan's class map when
/// the ingest assigns them, values through `transform`.
pub(super) fn pass_rules(
    config: &IngestConfig,
    plan: Option<&LabelPlan>,
    d: u32,
    l: u32,
    transform: Transform,
) -> (RowRules, u32, u32) {
    match plan {
        None => (
            config.row_rules(d, l, LabelRules::default(), transform),
            d,
            l,
        ),
        Some(p) => {
            let check_d = if config.layout.declares_sizes() {
                d
            } else {
                p.n_features
            };
            let rules = config.row_rules(check_d, l, p.label_rules(config.first_label), transform);
            (rules, p.n_features, p.classes.len() as u32)
        }
    }
}
