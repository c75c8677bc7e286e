//! Gauss–Hermite quadrature: the rule the likelihoods integrate their Gaussian expectations
//! with (`docs/likelihood.md`).

use anyhow::{bail, Context, Result};
use faer::{Mat, Side};

/// Gauss–Hermite rule of order q (physicists'): nodes ascending, weights; Σ w = √π.
///
/// ∫ e^{−t²} g(t) dt ≈ Σ_j w_j g(t_j), exact for polynomials g of degree ≤ 2q − 1.
#[derive(Debug, Clone, PartialEq)]
pub struct GaussHermite {
    pub nodes: Vec<f64>,
    pub weights: Vec<f64>,
}

/// The orthonormal Hermite polynomials p̃_k (∫ e^{−t²} p̃_j p̃_k dt = δ_jk) at `t`:
/// returns (p̃_q(t), p̃_{q−1}(t), Σ_{k<q} p̃_k(t)²).
///
/// Three-term recurrence t p̃_k = √((k+1)/2) p̃_{k+1} + √(k/2) p̃_{k−1}, p̃_0 = π^{−1/4}.
fn orthonormal_hermite(q: usize, t: f64) -> (f64, f64, f64) {
    let mut prev = 0.0;
    let mut cur = std::f64::consts::PI.powf(-0.25);
    let mut sum_sq = 0.0;
    for k in 0..q {
        sum_sq += cur * cur;
        let kf = k as f64;
        let next = (t * cur - (0.5 * kf).sqrt() * prev) / (0.5 * (kf + 1.0)).sqrt();
        prev = cur;
        cur = next;
    }
    (cur, prev, sum_sq)
}

impl GaussHermite {
    /// Computes the rule: Golub–Welsch (the eigenvalues of the symmetric tridiagonal Jacobi
    /// matrix with zero diagonal and off-diagonals √(k/2), k = 1..q−1, by faer's self-adjoint
    /// eigensolver) for the nodes, each then polished by Newton steps on the orthonormal
    /// Hermite recurrence; weights from the Christoffel function w_j = 1 / Σ_{k<q} p̃_k(t_j)²
    /// (a sum of positive terms, so small weights keep full relative accuracy); finally the
    /// rule is made exactly symmetric. Errors for q == 0, and for q > 370, where the
    /// outermost weights (about e^{−t²} with t ≈ √(2q)) underflow.
    pub fn new(q: usize) -> Result<Self> {
        if q == 0 {
            bail!("a Gauss–Hermite rule needs at least one point (got q = 0)");
        }
        let jacobi = Mat::from_fn(q, q, |i, j| {
            if i.abs_diff(j) == 1 {
                (0.5 * i.max(j) as f64).sqrt()
            } else {
                0.0
            }
        });
        let mut nodes = jacobi
            .self_adjoint_eigenvalues(Side::Lower)
            .ok()
            .context("eigenvalues of the Gauss–Hermite Jacobi matrix did not converge")?;
        nodes.sort_by(f64::total_cmp);

        let derivative_scale = (2.0 * q as f64).sqrt(); // p̃_q' = √(2q) p̃_{q−1}
        let mut weights = Vec::with_capacity(q);
        for t in &mut nodes {
            for _ in 0..10 {
                let (p, p_prev, _) = orthonormal_hermite(q, *t);
                let step = p / (derivative_scale * p_prev);
                if !step.is_finite() {
                    break;
                }
                *t -= step;
                if step.abs() <= 2.0 * f64::EPSILON * t.abs().max(1.0) {
                    break;
                }
            }
            let (_, _, sum_sq) = orthonormal_hermite(q, *t);
            weights.push(1.0 / sum_sq);
        }

        // Exact symmetry: t_{q−1−j} = −t_j, w_{q−1−j} = w_j, and t = 0 in the middle.
        for j in 0..q / 2 {
            let k = q - 1 - j;
            let t = 0.5 * (nodes[k] - nodes[j]);
            let w = 0.5 * (weights[k] + weights[j]);
            nodes[j] = -t;
            nodes[k] = t;
            weights[j] = w;
            weights[k] = w;
        }
        if q % 2 == 1 {
            nodes[q / 2] = 0.0;
        }

        let ascending = nodes.windows(2).all(|p| p[0] < p[1]);
        let finite = nodes.iter().all(|t| t.is_finite());
        let positive = weights.iter().all(|w| w.is_finite() && *w > 0.0);
        if !(ascending && finite && positive) {
            bail!("the Gauss–Hermite rule of order {q} is not representable in f64");
        }
        let total: f64 = weights.iter().sum();
        let sqrt_pi = std::f64::consts::PI.sqrt();
        if (total - sqrt_pi).abs() > 1e-12 * sqrt_pi {
            bail!("Gauss–Hermite rule of order {q}: weights sum to {total}, expected √π");
        }
        Ok(Self { nodes, weights })
    }

    /// The order q (number of nodes).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never true for a constructed rule (q ≥ 1).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The rule for Gaussian expectations, stored as its symmetric node pairs ±x_k (the
    /// likelihoods evaluate both members of a pair from one exponential):
    /// E_{f~N(m,v)}[g(f)] ≈ u_0 g(m) + Σ_k u_k (g(m + √v x_k) + g(m − √v x_k)).
    pub fn symmetric(&self) -> SymmetricRule {
        let points = self.len();
        let inv_sqrt_pi = 1.0 / std::f64::consts::PI.sqrt();
        let first_positive = points.div_ceil(2);
        SymmetricRule {
            half_nodes: self.nodes[first_positive..]
                .iter()
                .map(|t| std::f64::consts::SQRT_2 * t)
                .collect(),
            half_weights: self.weights[first_positive..]
                .iter()
                .map(|w| w * inv_sqrt_pi)
                .collect(),
            centre_weight: if points % 2 == 1 {
                self.weights[points / 2] * inv_sqrt_pi
            } else {
                0.0
            },
        }
    }
}

/// A Gauss–Hermite rule for expectations under N(m, v), as symmetric pairs
/// ([`GaussHermite::symmetric`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SymmetricRule {
    /// x_k = √2 t_k for the positive nodes, ascending.
    pub half_nodes: Vec<f64>,
    /// u_k = w_k / √π for the positive nodes.
    pub half_weights: Vec<f64>,
    /// u_0 = w / √π of the node at 0 (odd Q), else 0.
    pub centre_weight: f64,
}
