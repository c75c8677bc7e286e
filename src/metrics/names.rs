//! The names of the figures the catalog records (`metrics` rows, `pipeline status --run N`),
//! defined once: train, elbo and evaluate write them, report and status read them. The texts
//! are stored in workspaces and printed in tables, so they must never change; a new figure
//! is a new variant here.
//!
//! Two kinds: a ranking measure recorded at each k as `{prefix}@{k}` ([`AtK`]: `P@1`,
//! `nDCG@3`, ...), and figures recorded under one name ([`Figure`]: `epoch_elbo`,
//! `accuracy`, ...); the multi-class top-k accuracy is `top{k}_accuracy`
//! ([`top_k_accuracy`]).

/// A ranking measure of a multi-label evaluation, one value per k (`docs/metrics.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtK {
    /// Precision P@k.
    P,
    /// nDCG@k.
    Ndcg,
    /// Propensity-scored precision PSP@k.
    Psp,
    /// Propensity-scored nDCG PSnDCG@k.
    Psndcg,
    /// The share of the test truth's labels predicted correctly in some row's top k.
    Coverage,
}

impl AtK {
    /// Every measure, in the order the tables list them.
    pub const ALL: [AtK; 5] = [AtK::P, AtK::Ndcg, AtK::Psp, AtK::Psndcg, AtK::Coverage];

    /// The measure's name, before `@k`.
    pub fn prefix(self) -> &'static str {
        match self {
            AtK::P => "P",
            AtK::Ndcg => "nDCG",
            AtK::Psp => "PSP",
            AtK::Psndcg => "PSnDCG",
            AtK::Coverage => COVERAGE,
        }
    }

    /// The name of the measure at `k` (`P@1`).
    pub fn at(self, k: usize) -> String {
        format!("{}@{k}", self.prefix())
    }
}

/// `(measure, k)` of a name `MEASURE@k` with k ≥ 1, whatever the measure; None for a name
/// without `@k`.
pub fn split_at_k(name: &str) -> Option<(&str, usize)> {
    let (measure, k) = name.rsplit_once('@')?;
    Some((measure, k.parse().ok().filter(|&k| k >= 1)?))
}

/// Whether a name is a measure at some k (`P@1`), not a single figure (`accuracy`).
pub fn is_at_k(name: &str) -> bool {
    name.contains('@')
}

/// `coverage`: the prefix of `coverage@k` and the multi-class share of classes covered.
const COVERAGE: &str = "coverage";

/// A figure recorded under one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    /// Train, per epoch: the mean minibatch bound.
    EpochElbo,
    /// Train, per epoch: wall seconds.
    EpochSeconds,
    /// Train, per epoch: the share of the epoch the trainer waited on the prefetch queue.
    EpochQueueWait,
    /// Train, at the last step: wall seconds of the run.
    TrainSeconds,
    /// Train (unless `--no-final-elbo`) and `pipeline elbo`: the exact full-data bound.
    ElboExact,
    /// Binary and multi-class evaluations, and held-out epochs of such runs.
    Accuracy,
    /// Multi-class evaluations: the share of the classes with a true positive.
    Coverage,
    /// Mean negative log predictive probability.
    Nlp,
    Brier,
    /// Expected calibration error.
    Ece,
    /// Maximum calibration error.
    Mce,
    /// Binary evaluations with both classes present.
    Auc,
}

impl Figure {
    /// Every figure.
    pub const ALL: [Figure; 12] = [
        Figure::EpochElbo,
        Figure::EpochSeconds,
        Figure::EpochQueueWait,
        Figure::TrainSeconds,
        Figure::ElboExact,
        Figure::Accuracy,
        Figure::Coverage,
        Figure::Nlp,
        Figure::Brier,
        Figure::Ece,
        Figure::Mce,
        Figure::Auc,
    ];

    /// The name the catalog records.
    pub fn name(self) -> &'static str {
        match self {
            Figure::EpochElbo => "epoch_elbo",
            Figure::EpochSeconds => "epoch_seconds",
            Figure::EpochQueueWait => "epoch_queue_wait",
            Figure::TrainSeconds => "train_seconds",
            Figure::ElboExact => "elbo_exact",
            Figure::Accuracy => "accuracy",
            Figure::Coverage => COVERAGE,
            Figure::Nlp => "nlp",
            Figure::Brier => "brier",
            Figure::Ece => "ece",
            Figure::Mce => "mce",
            Figure::Auc => "auc",
        }
    }

    /// The figure recorded as `name`, if one is.
    pub fn of(name: &str) -> Option<Figure> {
        Figure::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Whether tables show it as it is rather than in percent: the mean negative log
    /// probability, the Brier score and the AUC.
    pub fn unitless(self) -> bool {
        matches!(self, Figure::Nlp | Figure::Brier | Figure::Auc)
    }
}

/// The multi-class top-k accuracy (k ≥ 2; k = 1 is [`Figure::Accuracy`]).
pub fn top_k_accuracy(k: usize) -> String {
    format!("top{k}_{}", Figure::Accuracy.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_are_the_recorded_texts_and_distinct() {
        // The texts workspaces hold: changing one loses every recorded figure of its kind.
        let figures: Vec<&str> = Figure::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(
            figures,
            [
                "epoch_elbo",
                "epoch_seconds",
                "epoch_queue_wait",
                "train_seconds",
                "elbo_exact",
                "accuracy",
                "coverage",
                "nlp",
                "brier",
                "ece",
                "mce",
                "auc"
            ]
        );
        let at_1: Vec<String> = AtK::ALL.iter().map(|m| m.at(1)).collect();
        assert_eq!(at_1, ["P@1", "nDCG@1", "PSP@1", "PSnDCG@1", "coverage@1"]);
        assert_eq!(top_k_accuracy(3), "top3_accuracy");
        for f in Figure::ALL {
            assert_eq!(Figure::of(f.name()), Some(f));
            assert!(!is_at_k(f.name()), "{f:?}");
        }
        assert_eq!(Figure::of("P@1"), None);
        for m in AtK::ALL {
            assert_eq!(split_at_k(&m.at(5)), Some((m.prefix(), 5)));
            assert!(is_at_k(&m.at(5)));
        }
        assert_eq!(split_at_k("P@0"), None);
        assert_eq!(split_at_k("accuracy"), None);
    }
}
