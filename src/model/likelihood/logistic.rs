//! The likelihoods of a label given its utility, through their variational expectations.
//! [`Likelihood`] is what the bound needs from one; [`BernoulliLogistic`] is the paper's
//! (Panos, Dellaportas & Titsias, *Fully Scalable Gaussian Processes using Subspace Inducing
//! Inputs*, §2.3 and appendix A): for a label y ∈ {−1, +1} and a Gaussian marginal
//! q(f) = N(m, v),
//!
//! E(y, m, v) = E_{f ~ N(m, v)}[ log σ(y f) ],   σ(t) = 1 / (1 + e^{−t}),
//!
//! computed by Gauss–Hermite quadrature of order Q, together with ∂E/∂m and ∂E/∂v. The
//! derivatives are the exact derivatives of the quadrature sum that is returned as the value,
//! so finite differences of the ELBO agree with the analytic gradient to rounding error
//! (`docs/likelihood.md` has the derivation, the v → 0 limit and measured errors).
//!
//! Pure math: no files, no allocation on the hot path. [`BernoulliLogistic::expect_lanes`]
//! evaluates many (m, v) pairs at once with SIMD-friendly exp/log1p.

use anyhow::Result;

use super::{Expectation, Likelihood, VAR_FLOOR};
use crate::model::quadrature::{GaussHermite, SymmetricRule};

impl Likelihood for BernoulliLogistic {
    fn expect_lanes(&self, y: &[f64], mean: &mut [f64], var: &mut [f64], value: &mut [f64]) {
        BernoulliLogistic::expect_lanes(self, y, mean, var, value)
    }
}

/// (log σ(z), σ(z), σ(−z)) from one exponential e^{−|z|}.
#[inline(always)]
fn node_terms(z: f64) -> (f64, f64, f64) {
    let e = (-z.abs()).exp();
    let r = 1.0 / (1.0 + e);
    let log_sig = z.min(0.0) - e.ln_1p();
    if z >= 0.0 {
        (log_sig, r, e * r)
    } else {
        (log_sig, e * r, r)
    }
}

/// The terms of a symmetric node pair z₊, z₋ given e± = e^{−|z±|}: returns
/// (log σ(z₊) + log σ(z₋), σ(z₊), σ(−z₊), σ(z₋), σ(−z₋)) with one log1p and one division:
/// log(1 + e₊) + log(1 + e₋) = log1p(e₊ + e₋ + e₊e₋) (positive terms, so no cancellation)
/// and 1/(1 + e±) = (1 + e∓) / ((1 + e₊)(1 + e₋)).
#[inline(always)]
fn pair_terms(zp: f64, zm: f64, ep: f64, em: f64) -> (f64, f64, f64, f64, f64) {
    let log_sum = pair_log(zp, zm, ep, em);
    let inv = 1.0 / ((1.0 + ep) * (1.0 + em));
    let rp = (1.0 + em) * inv; // 1/(1 + e₊)
    let rm = (1.0 + ep) * inv; // 1/(1 + e₋)
    let (sp, snp) = if zp >= 0.0 {
        (rp, ep * rp)
    } else {
        (ep * rp, rp)
    };
    let (sm, snm) = if zm >= 0.0 {
        (rm, em * rm)
    } else {
        (em * rm, rm)
    };
    (log_sum, sp, snp, sm, snm)
}

/// log σ(z₊) + log σ(z₋) given e± = e^{−|z±|}: one log1p (as in [`pair_terms`]).
#[inline(always)]
fn pair_log(zp: f64, zm: f64, ep: f64, em: f64) -> f64 {
    zp.min(0.0) + zm.min(0.0) - (ep + em + ep * em).ln_1p()
}

/// log σ(z) alone: one exponential, one log1p.
#[inline(always)]
fn node_log(z: f64) -> f64 {
    z.min(0.0) - (-z.abs()).exp().ln_1p()
}

/// E_{f~N(m,v)}[log σ(y f)] by Gauss–Hermite quadrature with precomputed scaled nodes.
///
/// The rule is symmetric, so it is stored as pairs ±x_k (x_k = √2 t_k > 0) with weights
/// u_k = w_k / √π, plus the weight of the node at 0 when Q is odd:
/// E ≈ u_0 log σ(c) + Σ_k u_k [log σ(c + b x_k) + log σ(c − b x_k)], c = y m, b = y √v.
#[derive(Debug, Clone)]
pub struct BernoulliLogistic {
    rule: GaussHermite,
    /// √2 t_k for the positive nodes, ascending.
    half_nodes: Vec<f64>,
    /// w_k / √π for the positive nodes.
    half_weights: Vec<f64>,
    /// w / √π of the node at 0 (odd Q), else 0.
    centre_weight: f64,
}

impl BernoulliLogistic {
    /// The expectation with a `points`-point Gauss–Hermite rule; errors for 0 points.
    pub fn new(points: usize) -> Result<Self> {
        let rule = GaussHermite::new(points)?;
        let SymmetricRule {
            half_nodes,
            half_weights,
            centre_weight,
        } = rule.symmetric();
        Ok(Self {
            rule,
            half_nodes,
            half_weights,
            centre_weight,
        })
    }

    /// The number of quadrature points Q.
    pub fn points(&self) -> usize {
        self.rule.len()
    }

    /// The underlying Gauss–Hermite rule.
    pub fn rule(&self) -> &GaussHermite {
        &self.rule
    }

    /// E(y, m, v) and its partial derivatives. y must be +1.0 or −1.0; v ≥ 0.
    ///
    /// For v > [`VAR_FLOOR`], `d_var` is the exact derivative of the returned quadrature
    /// value: Σ_j (w_j/√π) y σ(−y f_j) t_j / √(2v), f_j = m + √(2v) t_j. At or below it,
    /// the Price form −½ Σ_j (w_j/√π) σ(f_j) σ(−f_j) (limit −½ σ(m) σ(−m) at v = 0).
    /// A NaN input gives a NaN result.
    #[inline]
    pub fn expect(&self, y: f64, mean: f64, var: f64) -> Expectation {
        debug_assert!(y == 1.0 || y == -1.0, "label must be ±1, got {y}");
        debug_assert!(
            var >= 0.0 || var.is_nan(),
            "variance must be ≥ 0, got {var}"
        );
        if var.is_nan() {
            return Expectation {
                value: f64::NAN,
                d_mean: f64::NAN,
                d_var: f64::NAN,
            };
        }
        let c = y * mean;
        let mut value = 0.0;
        let mut sum_sig_neg = 0.0; // Σ u σ(−z)
        let (log_c, sig_c, sig_neg_c) = if self.centre_weight != 0.0 {
            node_terms(c)
        } else {
            (0.0, 0.0, 0.0)
        };
        value += self.centre_weight * log_c;
        sum_sig_neg += self.centre_weight * sig_neg_c;

        let d_var = if var > VAR_FLOOR {
            let s = var.sqrt();
            let b = y * s;
            // Σ u x (σ(−z₊) − σ(−z₋)); the difference is formed from whichever of σ(±z) is
            // small near the centre (σ(−z₊) − σ(−z₋) = σ(z₋) − σ(z₊)), keeping it accurate
            // when both values are close to 1.
            let upper = c >= 0.0;
            let mut moment = 0.0;
            for (&x, &u) in self.half_nodes.iter().zip(&self.half_weights) {
                let (zp, zm) = (c + b * x, c - b * x);
                let (ep, em) = ((-zp.abs()).exp(), (-zm.abs()).exp());
                let (log_sum, sp, snp, sm, snm) = pair_terms(zp, zm, ep, em);
                value += u * log_sum;
                sum_sig_neg += u * (snp + snm);
                let diff = if upper { snp - snm } else { sm - sp };
                moment += u * x * diff;
            }
            y * moment / (2.0 * s)
        } else {
            let b = y * var.max(0.0).sqrt();
            let mut curvature = self.centre_weight * sig_c * sig_neg_c;
            for (&x, &u) in self.half_nodes.iter().zip(&self.half_weights) {
                let (zp, zm) = (c + b * x, c - b * x);
                let (ep, em) = ((-zp.abs()).exp(), (-zm.abs()).exp());
                let (log_sum, sp, snp, sm, snm) = pair_terms(zp, zm, ep, em);
                value += u * log_sum;
                sum_sig_neg += u * (snp + snm);
                curvature += u * (sp * snp + sm * snm);
            }
            -0.5 * curvature
        };
        Expectation {
            value,
            // Σ u = 1 only to rounding: keep |∂E/∂m| ≤ 1 exactly (and NaN as NaN).
            d_mean: y * if sum_sig_neg > 1.0 { 1.0 } else { sum_sig_neg },
            d_var,
        }
    }

    /// Only the value E(y, m, v) (cheaper; used for the ELBO report). Same sum as
    /// [`Self::expect`]'s `value`, bit for bit.
    #[inline]
    pub fn expect_value(&self, y: f64, mean: f64, var: f64) -> f64 {
        debug_assert!(y == 1.0 || y == -1.0, "label must be ±1, got {y}");
        debug_assert!(
            var >= 0.0 || var.is_nan(),
            "variance must be ≥ 0, got {var}"
        );
        if var.is_nan() {
            return f64::NAN;
        }
        let c = y * mean;
        let b = y * var.max(0.0).sqrt();
        let mut value = if self.centre_weight != 0.0 {
            self.centre_weight * node_log(c)
        } else {
            0.0
        };
        for (&x, &u) in self.half_nodes.iter().zip(&self.half_weights) {
            let (zp, zm) = (c + b * x, c - b * x);
            let (ep, em) = ((-zp.abs()).exp(), (-zm.abs()).exp());
            value += u * pair_log(zp, zm, ep, em);
        }
        value
    }
}

/// Width of the blocks [`BernoulliLogistic::expect_lanes`] works on: eight f64, one AVX-512
/// register (two AVX2 registers).
pub const LANES: usize = 8;

/// ln 2 split so that n · LN2_HI is exact for |n| < 2¹¹ (the low 32 bits of LN2_HI are 0)
/// and LN2_HI + LN2_LO = ln 2 to about 2⁻⁹⁰ (fdlibm's split, given by its bits).
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// 1.5 · 2⁵²: adding and subtracting it rounds to the nearest integer (|x| < 2⁵¹).
const ROUND_SHIFT: f64 = 6_755_399_441_055_744.0;

/// 2ⁿ for an integer n ≥ −1074 − 1022, as a product of two normal powers so subnormal and
/// zero results come out right without a branch.
/// Integer arithmetic is written with wrapping operations (it cannot overflow here): the
/// overflow checks of debug and test builds would otherwise add branches that stop the
/// lanes from vectorising.
#[inline(always)]
fn pow2(n: i64) -> f64 {
    let n1 = n >> 1;
    let n2 = n.wrapping_sub(n1);
    let s1 = f64::from_bits((n1.wrapping_add(1023) as u64) << 52);
    let s2 = f64::from_bits((n2.wrapping_add(1023) as u64) << 52);
    s1 * s2
}

/// e^x for x ≤ 0 in plain arithmetic (no libm call), so that a loop over lanes compiles to
/// SIMD. x = n ln 2 + r with |r| ≤ ln2/2, e^r by its Taylor polynomial of degree 13 in
/// Horner form with fused multiply-adds (the remainder is below 4e-18 relative), then
/// scaled by 2ⁿ. Results below the smallest
/// subnormal flush to 0. Accurate to about 1 ulp.
#[inline(always)]
fn exp_nonpositive(x: f64) -> f64 {
    let x = x.max(-746.0);
    let t = x * std::f64::consts::LOG2_E + ROUND_SHIFT;
    let n = t - ROUND_SHIFT;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Horner on 1/k! coefficients, highest first.
    let mut p: f64 = 1.0 / 6_227_020_800.0; // 1/13!
    for c in [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p.mul_add(r, c);
    }
    let n_int = (t.to_bits() as i64).wrapping_sub(ROUND_SHIFT.to_bits() as i64);
    p * pow2(n_int)
}

/// log(1 + x) for 0 ≤ x ≤ 3 in plain arithmetic (SIMD-friendly), given `inv_u` ≈ 1/(1 + x)
/// (which the callers have anyway; it only scales a rounding correction, so a few ulps of
/// error in it do not matter). u = 1 + x is split as 2ᵏ m with m ∈ [√½, √2);
/// log m = 2 atanh(s), s = (m−1)/(m+1), |s| ≤ 0.172, by its series to s²¹ (remainder below
/// 3e-17 relative); the rounding of 1 + x is put back as (x − (u − 1))/u, which keeps full
/// relative accuracy for tiny x.
#[inline(always)]
fn log1p_small(x: f64, inv_u: f64) -> f64 {
    let u = 1.0 + x;
    let correction = (x - (u - 1.0)) * inv_u;
    let bits = u.to_bits();
    let mut k = (((bits >> 52) & 0x7ff) as i64).wrapping_sub(1023);
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    let big = m > std::f64::consts::SQRT_2;
    m = if big { 0.5 * m } else { m };
    k = k.wrapping_add(big as i64);
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let mut series: f64 = 1.0 / 21.0;
    for c in [
        1.0 / 19.0,
        1.0 / 17.0,
        1.0 / 15.0,
        1.0 / 13.0,
        1.0 / 11.0,
        1.0 / 9.0,
        1.0 / 7.0,
        1.0 / 5.0,
        1.0 / 3.0,
    ] {
        series = series.mul_add(z, c);
    }
    let log_m = 2.0 * s + 2.0 * s * (z * series);
    let kf = k as f64;
    kf * LN2_HI + (log_m + (correction + kf * LN2_LO))
}

/// One block of [`LANES`] expectations: the arithmetic of [`BernoulliLogistic::expect`] with
/// every branch turned into a per-lane select, and exp/log1p from the polynomial forms above.
/// On entry `mean` and `var` hold (m, v); on exit `mean` holds ∂E/∂m, `var` ∂E/∂v and
/// `value` E.
#[inline(always)]
fn expect_block(
    lik: &BernoulliLogistic,
    y: &[f64; LANES],
    mean: &mut [f64; LANES],
    var: &mut [f64; LANES],
    value: &mut [f64; LANES],
) {
    let mut c = [0.0; LANES];
    let mut b = [0.0; LANES];
    let mut s = [0.0; LANES];
    let mut val = [0.0; LANES];
    let mut sum_sig_neg = [0.0; LANES];
    let mut moment = [0.0; LANES];
    let mut curvature = [0.0; LANES];
    for l in 0..LANES {
        c[l] = y[l] * mean[l];
        s[l] = var[l].max(0.0).sqrt();
        b[l] = y[l] * s[l];
    }
    let cw = lik.centre_weight;
    if cw != 0.0 {
        // The node at 0 (odd Q only).
        for l in 0..LANES {
            let e = exp_nonpositive(-c[l].abs());
            let r = 1.0 / (1.0 + e);
            let (sig, sig_neg) = if c[l] >= 0.0 { (r, e * r) } else { (e * r, r) };
            val[l] = cw * (c[l].min(0.0) - log1p_small(e, r));
            sum_sig_neg[l] = cw * sig_neg;
            curvature[l] = cw * sig * sig_neg;
        }
    }
    for (&x, &u) in lik.half_nodes.iter().zip(&lik.half_weights) {
        for l in 0..LANES {
            let (zp, zm) = (c[l] + b[l] * x, c[l] - b[l] * x);
            let (ep, em) = (exp_nonpositive(-zp.abs()), exp_nonpositive(-zm.abs()));
            // log(1 + e₊) + log(1 + e₋) = log1p(e₊ + e₋ + e₊e₋), one log1p per pair.
            let inv = 1.0 / ((1.0 + ep) * (1.0 + em));
            let log_sum = zp.min(0.0) + zm.min(0.0) - log1p_small(ep + em + ep * em, inv);
            let rp = (1.0 + em) * inv;
            let rm = (1.0 + ep) * inv;
            let (sp, snp) = if zp >= 0.0 {
                (rp, ep * rp)
            } else {
                (ep * rp, rp)
            };
            let (sm, snm) = if zm >= 0.0 {
                (rm, em * rm)
            } else {
                (em * rm, rm)
            };
            val[l] += u * log_sum;
            sum_sig_neg[l] += u * (snp + snm);
            let diff = if c[l] >= 0.0 { snp - snm } else { sm - sp };
            moment[l] += u * x * diff;
            curvature[l] += u * (sp * snp + sm * snm);
        }
    }
    for l in 0..LANES {
        let v = var[l];
        let d_var = if v > VAR_FLOOR {
            y[l] * moment[l] / (2.0 * s[l])
        } else {
            -0.5 * curvature[l]
        };
        let d_mean = y[l]
            * if sum_sig_neg[l] > 1.0 {
                1.0
            } else {
                sum_sig_neg[l]
            };
        // exp_nonpositive's clamp (f64::max) would turn a NaN into a number: restore it.
        let nan = v.is_nan() || c[l].is_nan();
        value[l] = if nan { f64::NAN } else { val[l] };
        mean[l] = if nan { f64::NAN } else { d_mean };
        var[l] = if nan { f64::NAN } else { d_var };
    }
}

/// The loop over blocks; compiled once per instruction set by the dispatch below.
#[inline(always)]
fn expect_slices(
    lik: &BernoulliLogistic,
    y: &[f64],
    mean: &mut [f64],
    var: &mut [f64],
    value: &mut [f64],
) {
    let n = y.len();
    let full = n - n % LANES;
    for start in (0..full).step_by(LANES) {
        let end = start + LANES;
        expect_block(
            lik,
            y[start..end].try_into().expect("block of LANES"),
            (&mut mean[start..end]).try_into().expect("block of LANES"),
            (&mut var[start..end]).try_into().expect("block of LANES"),
            (&mut value[start..end]).try_into().expect("block of LANES"),
        );
    }
    if full < n {
        // The tail, padded with harmless (y, m, v) = (1, 0, 0).
        let rest = n - full;
        let mut yb = [1.0; LANES];
        let (mut mb, mut vb, mut eb) = ([0.0; LANES], [0.0; LANES], [0.0; LANES]);
        yb[..rest].copy_from_slice(&y[full..]);
        mb[..rest].copy_from_slice(&mean[full..]);
        vb[..rest].copy_from_slice(&var[full..]);
        expect_block(lik, &yb, &mut mb, &mut vb, &mut eb);
        mean[full..].copy_from_slice(&mb[..rest]);
        var[full..].copy_from_slice(&vb[..rest]);
        value[full..].copy_from_slice(&eb[..rest]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
unsafe fn expect_slices_avx512(
    lik: &BernoulliLogistic,
    y: &[f64],
    mean: &mut [f64],
    var: &mut [f64],
    value: &mut [f64],
) {
    expect_slices(lik, y, mean, var, value)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn expect_slices_avx2(
    lik: &BernoulliLogistic,
    y: &[f64],
    mean: &mut [f64],
    var: &mut [f64],
    value: &mut [f64],
) {
    expect_slices(lik, y, mean, var, value)
}

impl BernoulliLogistic {
    /// Many expectations at once, in place: on entry `mean[j]`, `var[j]` hold (m_j, v_j) with
    /// labels `y[j]` = ±1; on exit `mean[j]` = ∂E/∂m, `var[j]` = ∂E/∂v and `value[j]` = E.
    ///
    /// Same quadrature sums and branches as [`Self::expect`], evaluated [`LANES`] pairs at a
    /// time with exp and log1p written as polynomials so the compiler vectorises them; the
    /// results agree with `expect` to about 1e-15 relative (`tests/it/likelihood.rs`). The
    /// arithmetic is IEEE with explicit fused multiply-adds in the polynomials (`mul_add`:
    /// one instruction with FMA, the exact libm `fma` without), so the results are bit for
    /// bit the same whichever instruction set the runtime dispatch picks.
    pub fn expect_lanes(&self, y: &[f64], mean: &mut [f64], var: &mut [f64], value: &mut [f64]) {
        let n = y.len();
        assert!(
            mean.len() == n && var.len() == n && value.len() == n,
            "expect_lanes: slices of different lengths"
        );
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
            {
                // SAFETY: the features the function is compiled for were just detected.
                unsafe { expect_slices_avx512(self, y, mean, var, value) };
                return;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: as above.
                unsafe { expect_slices_avx2(self, y, mean, var, value) };
                return;
            }
        }
        expect_slices(self, y, mean, var, value)
    }
}

/// Numerically stable log σ(t) = −log(1 + e^{−t}) for all t (no overflow for |t| large).
#[inline]
pub fn log_sigmoid(t: f64) -> f64 {
    node_log(t)
}

/// softplus(t) = log(1 + e^t), stable for either sign (the augment-and-reduce likelihoods'
/// positive parameters).
#[inline]
pub fn softplus(t: f64) -> f64 {
    t.max(0.0) + (-t.abs()).exp().ln_1p()
}

/// Numerically stable σ(t) = 1 / (1 + e^{−t}).
#[inline]
pub fn sigmoid(t: f64) -> f64 {
    let e = (-t.abs()).exp();
    if t >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_and_even_rules_store_pairs() {
        for q in [1, 2, 3, 20, 21] {
            let lik = BernoulliLogistic::new(q).unwrap();
            assert_eq!(lik.points(), q);
            assert_eq!(lik.half_nodes.len(), q / 2);
            assert_eq!(lik.centre_weight != 0.0, q % 2 == 1);
            let total = lik.centre_weight + 2.0 * lik.half_weights.iter().sum::<f64>();
            assert!((total - 1.0).abs() < 1e-14, "q={q}: {total}");
            assert!(lik.half_nodes.iter().all(|&x| x > 0.0));
        }
    }

    #[test]
    fn pair_terms_consistent() {
        let zs: [f64; 9] = [-800.0, -30.0, -1.5, -1e-20, 0.0, 1e-20, 2.0, 40.0, 800.0];
        for zp in zs {
            for zm in zs {
                let (ep, em) = ((-zp.abs()).exp(), (-zm.abs()).exp());
                let (l, sp, snp, sm, snm) = pair_terms(zp, zm, ep, em);
                assert_eq!(l, pair_log(zp, zm, ep, em));
                let l_ref = log_sigmoid(zp) + log_sigmoid(zm);
                assert!(
                    (l - l_ref).abs() <= 4.0 * f64::EPSILON * l_ref.abs(),
                    "{zp} {zm}"
                );
                for (got, want) in [
                    (sp, sigmoid(zp)),
                    (snp, sigmoid(-zp)),
                    (sm, sigmoid(zm)),
                    (snm, sigmoid(-zm)),
                ] {
                    assert!((got - want).abs() <= 4.0 * f64::EPSILON * want, "{zp} {zm}");
                }
            }
        }
    }

    #[test]
    fn node_terms_consistent() {
        for z in [-800.0, -30.0, -1.5, -1e-20, 0.0, 1e-20, 2.0, 40.0, 800.0] {
            let (l, s, sn) = node_terms(z);
            assert_eq!(l, log_sigmoid(z));
            assert_eq!(s, sigmoid(z));
            assert_eq!(sn, sigmoid(-z));
        }
    }
}
