//! The multi-class task's minibatch terms (`docs/model.md`, "Tasks and latent functions"):
//! each row's one class, and the seed of a step's Monte Carlo noise.

use anyhow::{ensure, Result};

use super::batches::{stream_seed, streams};

/// The step index the exact bound's Monte Carlo noise is drawn for: no training step has
/// it, so the bound's noise is its own, the same for every checkpoint of a run.
pub const EXACT_BOUND_STEP: u64 = u64::MAX;

/// The class c_i of every row of a minibatch [B], from its labels: exactly one per row.
/// `rows` are the rows' global training-row ids (for the error).
pub fn class_ids(positives: &[Vec<u32>], rows: &[u64]) -> Result<Vec<u32>> {
    positives
        .iter()
        .zip(rows)
        .map(|(labels, &row)| {
            ensure!(
                labels.len() == 1,
                "--task multiclass: training row {row} (0-based, in file order) has {} labels \
                 ({:?}); every row needs exactly one class (ingest with --first-label to keep \
                 the first of several)",
                labels.len(),
                labels
            );
            Ok(labels[0])
        })
        .collect()
}

/// The seed of the Monte Carlo noise of step `step` (0-based) of a run with seed `seed`: a
/// function of the two alone, so a resumed run draws the noise an uninterrupted one draws.
pub fn noise_seed(seed: u64, step: u64) -> u64 {
    stream_seed(seed, streams::CLASSES, &[step])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_label_per_row_is_the_class_and_any_other_count_names_the_row() {
        assert_eq!(
            class_ids(&[vec![2], vec![0]], &[10, 11]).unwrap(),
            vec![2, 0]
        );
        let e = class_ids(&[vec![1], vec![0, 3]], &[4, 5])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("training row 5") && e.contains("2 labels"),
            "{e}"
        );
        let e = class_ids(&[vec![]], &[7]).unwrap_err().to_string();
        assert!(
            e.contains("training row 7") && e.contains("0 labels"),
            "{e}"
        );
    }

    #[test]
    fn the_noise_seed_depends_on_the_run_seed_and_the_step() {
        assert_eq!(noise_seed(3, 9), noise_seed(3, 9));
        assert_ne!(noise_seed(3, 9), noise_seed(3, 10));
        assert_ne!(noise_seed(3, 9), noise_seed(4, 9));
        assert_ne!(noise_seed(3, EXACT_BOUND_STEP), noise_seed(3, 0));
    }
}
