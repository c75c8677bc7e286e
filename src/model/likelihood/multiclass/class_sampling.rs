//! Class subsampling for the bounds that are sums over the K − 1 negative classes of a row
//! (one-vs-each, augment-and-reduce; Titsias, *One-vs-Each Approximation to Softmax for
//! Scalable Estimation of Probabilities*, and Ruiz, Titsias, Dieng & Blei, *Augment and
//! Reduce*): S of the K − 1 negatives drawn uniformly without replacement, their sum
//! scaled by (K − 1)/S, an unbiased estimate of the full sum (`docs/likelihood.md`, "Class
//! subsampling").
//!
//! The draw is a function of the step's seed and the row's stream alone (ChaCha8 seeded by
//! the seed, stream = the row), so a step's estimate is a deterministic function of the
//! parameters, the same for any thread count and after a resume.

use anyhow::{ensure, Result};
use rand::seq::index::sample;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// S negatives per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassSampler {
    samples: usize,
}

impl ClassSampler {
    /// Errors for S = 0.
    pub fn new(samples: usize) -> Result<Self> {
        ensure!(
            samples > 0,
            "class subsampling needs at least one negative class"
        );
        Ok(ClassSampler { samples })
    }

    pub fn samples(&self) -> usize {
        self.samples
    }

    /// The negatives of a row of class `class` among `classes` classes into `out`
    /// (increasing), drawn from (`seed`, `stream`), and the weight (K − 1)/S of each; every
    /// negative with weight 1 when S ≥ K − 1.
    pub fn negatives(
        &self,
        classes: usize,
        class: usize,
        (seed, stream): (u64, u64),
        out: &mut Vec<usize>,
    ) -> f64 {
        out.clear();
        let n_neg = classes - 1;
        if self.samples >= n_neg {
            out.extend((0..classes).filter(|&k| k != class));
            return 1.0;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        out.extend(sample(&mut rng, n_neg, self.samples));
        out.sort_unstable();
        // Rank r among the negatives is class r, or r + 1 from the true class on.
        for k in out.iter_mut() {
            if *k >= class {
                *k += 1;
            }
        }
        n_neg as f64 / self.samples as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_distinct_negatives_deterministically_and_uniformly() {
        let sampler = ClassSampler::new(2).unwrap();
        let mut out = Vec::new();
        let mut counts = [0usize; 5];
        for stream in 0..4000 {
            let w = sampler.negatives(5, 3, (17, stream), &mut out);
            assert_eq!(w, 2.0);
            assert_eq!(out.len(), 2);
            assert!(out[0] < out[1] && !out.contains(&3), "{out:?}");
            for &k in &out {
                counts[k] += 1;
            }
            let mut again = Vec::new();
            sampler.negatives(5, 3, (17, stream), &mut again);
            assert_eq!(out, again);
        }
        assert_eq!(counts[3], 0);
        // Each negative is drawn with probability S/(K − 1) = 1/2: 2000 ± 4 sd.
        for (k, &c) in counts.iter().enumerate().filter(|(k, _)| *k != 3) {
            assert!((c as f64 - 2000.0).abs() < 130.0, "class {k}: {c}");
        }
    }

    #[test]
    fn enough_samples_give_every_negative_with_weight_one() {
        let mut out = Vec::new();
        let w = ClassSampler::new(9)
            .unwrap()
            .negatives(4, 0, (1, 2), &mut out);
        assert_eq!((w, out), (1.0, vec![1, 2, 3]));
        assert!(ClassSampler::new(0).is_err());
    }
}
