//! The names of the figures the catalog records (`metrics` rows, `pipeline status --run N`),
//! defined once: train, elbo and evaluate write them, report and status read them. The texts
//! are stored in workspaces and printed in tables, so they must never change; a new figure
//! is a new variant here.
//!
//! Two kinds: a ranking measure recorded at each k as `{prefix}@{k}` ([`AtK`]: `P@1`,
//! `nDCG@3`, ...), and figures recorded under one name ([`Figure`]: `epoch_elbo`,
//! `accuracy`, ...); the multi-class top-k accuracy is `top{k}_accuracy`
//! ([`top_k_accuracy`]).

use crate::choice::choice_enum;

choice_enum! {
    /// A ranking measure of a multi-label evaluation, one value per k (`docs/metrics.md`),
    /// named before `@k`; the table's order is the tables'.
    pub enum AtK("ranking measure") {
        /// Precision P@k.
        P = "P",
        /// nDCG@k.
        Ndcg = "nDCG",
        /// Propensity-scored precision PSP@k.
        Psp = "PSP",
        /// Propensity-scored nDCG PSnDCG@k.
        Psndcg = "PSnDCG",
        /// The share of the test truth's labels predicted correctly in some row's top k.
        Coverage = "coverage",
    }
}

impl AtK {
    /// The measure's name, before `@k`.
    pub fn prefix(self) -> &'static str {
        self.name()
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

choice_enum! {
    /// A figure recorded under one name.
    pub enum Figure("figure") {
        /// Train, per epoch: the mean minibatch bound.
        EpochElbo = "epoch_elbo",
        /// Train, per epoch: wall seconds.
        EpochSeconds = "epoch_seconds",
        /// Train, per epoch: the share of the epoch the trainer waited on the prefetch queue.
        EpochQueueWait = "epoch_queue_wait",
        /// Train, at the last step: wall seconds of the run.
        TrainSeconds = "train_seconds",
        /// Train (unless `--no-final-elbo`) and `pipeline elbo`: the exact full-data bound.
        ElboExact = "elbo_exact",
        /// Binary and multi-class evaluations, and held-out epochs of such runs.
        Accuracy = "accuracy",
        /// Multi-class evaluations: the share of the classes with a true positive (the
        /// same word as the ranking measure `coverage@k`).
        Coverage = "coverage",
        /// Mean negative log predictive probability.
        Nlp = "nlp",
        Brier = "brier",
        /// Expected calibration error.
        Ece = "ece",
        /// Maximum calibration error.
        Mce = "mce",
        /// Binary evaluations with both classes present.
        Auc = "auc",
        /// Train with `--early-stopping`, at each evaluation (its step an optimiser step):
        /// the `--stop-metric` on the validation split.
        EarlyStoppingScore = "early_stopping_score",
    }
}

impl Figure {
    /// The figure recorded as `name`, if one is.
    pub fn of(name: &str) -> Option<Figure> {
        name.parse().ok()
    }

    /// Whether tables show it as it is rather than in percent: the mean negative log
    /// probability, the Brier score, the AUC, and early stopping's score (a fraction or an
    /// NLP, by its metric).
    pub fn unitless(self) -> bool {
        matches!(
            self,
            Figure::Nlp | Figure::Brier | Figure::Auc | Figure::EarlyStoppingScore
        )
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
                "auc",
                "early_stopping_score"
            ]
        );
        let at_1: Vec<String> = AtK::ALL.iter().map(|m| m.at(1)).collect();
        assert_eq!(at_1, ["P@1", "nDCG@1", "PSP@1", "PSnDCG@1", "coverage@1"]);
        assert_eq!(top_k_accuracy(3), "top3_accuracy");
        for &f in Figure::ALL {
            assert_eq!(Figure::of(f.name()), Some(f));
            assert!(!is_at_k(f.name()), "{f:?}");
        }
        assert_eq!(Figure::of("P@1"), None);
        for &m in AtK::ALL {
            assert_eq!(split_at_k(&m.at(5)), Some((m.prefix(), 5)));
            assert!(is_at_k(&m.at(5)));
        }
        assert_eq!(split_at_k("P@0"), None);
        assert_eq!(split_at_k("accuracy"), None);
    }
}
