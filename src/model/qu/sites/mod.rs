//! The paper's q(u) over all latent GPs (Panos, Dellaportas & Titsias, *Fully Scalable
//! Gaussian Processes using Subspace Inducing Inputs*): q(u_p) = N(K_Z μ_p, (K_Z⁻¹ + Σ_p⁻¹)⁻¹)
//! with Σ_p = diag(softplus(ρ_p) + 10⁻⁶). Marginals of h_p at a set of rows, the KL terms,
//! and their gradients (`docs/model.md`, sections "q(u) and marginals", "Gradients" and
//! "Algorithm as implemented").
//!
//! The per-GP algebra takes one of two paths: through C_p = K_Z + Σ_p [M×M]
//! (`qu/sites/inducing.rs`, any kernel) or through J_p = I + Fᵀ Σ_p⁻¹ F [R×R] (`qu/sites/low_rank.rs`, the
//! linear kernel); this file runs either over all GPs and assembles the results.
//!
//! The P latent GPs are independent given K_Z and K_bZ: they are processed by rayon in
//! fixed chunks of [`GP_CHUNK`] GPs, each chunk sequential inside (faer `Par::Seq`), and the
//! chunks' results are summed in chunk order. The chunking does not depend on the number of
//! threads, so neither do the results, bit for bit.
//!
//! Shapes: K_Z [M×M], K_bZ [B×M], k_ii [B], μ and ρ [M×P], marginal means and variances
//! [B×P].

pub(crate) mod inducing;
pub(crate) mod kl;
pub mod low_rank;

use anyhow::Result;
use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, MatRef, Par};
use rayon::prelude::*;

use crate::linalg::mirror_lower;
use crate::model::qu::gp_factor::{GpForward, PerGp};
use crate::model::scratch::Scratch;
use kl::quad_mu;
use low_rank::LowRankFactors;

/// Latent GPs per parallel task. Fixed (not derived from the thread count) so that the
/// order of every floating-point reduction, hence every result, is the same for any number
/// of threads. Three GPs give ten tasks at P = 30: enough to balance two to eight cores,
/// and large enough that the chunk's concatenated product (see [`backward`]) is an
/// efficient GEMM.
pub const GP_CHUNK: usize = 3;

/// Forward results.
#[derive(Debug, Clone)]
pub struct VariationalForward {
    /// m = K_bZ μ [B×P].
    pub mean: Mat<f64>,
    /// s_ip = k_ii − k_iᵀ C_p⁻¹ k_i = k_ii − ‖V_p e_i‖² [B×P].
    pub var: Mat<f64>,
    /// Σ_p KL_p.
    pub kl: f64,
    /// Largest diagonal jitter that had to be added to some C_p (0 when none).
    pub jitter: f64,
    per_gp: Vec<PerGp>,
    /// Whether the per-GP factors are the subspace path's (J_p rather than C_p).
    low_rank: bool,
}

impl VariationalForward {
    /// Hands the per-GP factors back to `scratch` for reuse by later steps.
    pub fn recycle(self, scratch: &Scratch) {
        for gp in self.per_gp {
            scratch.give_mat(gp.l_inv);
            scratch.give_mat(gp.v);
        }
    }
}

/// Gradients of F = ⟨G_m, m⟩ + ⟨G_s, s⟩ − Σ_p KL_p. The kernel blocks (`k_z`, `k_bz`,
/// `k_diag`) are empty when [`backward`] is asked not to compute them.
#[derive(Debug, Clone)]
pub struct VariationalGrads {
    pub mu: Mat<f64>,
    pub rho: Mat<f64>,
    pub k_z: Mat<f64>,
    pub k_bz: Mat<f64>,
    pub k_diag: Vec<f64>,
    /// On the subspace path, ∂/∂F [M×R] and ∂/∂G [R×B] of the [`LowRankFactors`] factors (the
    /// μ terms still go through `k_z` and `k_bz`); empty otherwise.
    pub f: Mat<f64>,
    pub g: Mat<f64>,
    /// ∂F/∂L packed [M(M+1)/2 × P] for the full-Cholesky forms (`qu/cholesky.rs`); empty
    /// for the paper's form.
    pub chol: Mat<f64>,
    /// ∂F/∂log σ² taken directly by the axes form (`qu/axes.rs`), which forms no kernel
    /// matrix; 0 for every other form (their σ² gradient goes through the kernel blocks).
    pub log_sf2: f64,
}

impl VariationalGrads {
    /// ∂μ and ∂ρ only: the kernel blocks empty (A and the hyperparameters frozen).
    pub(crate) fn without_kernel(mu: Mat<f64>, rho: Mat<f64>) -> Self {
        VariationalGrads {
            mu,
            rho,
            k_z: Mat::new(),
            k_bz: Mat::new(),
            k_diag: Vec::new(),
            f: Mat::new(),
            g: Mat::new(),
            chol: Mat::new(),
            log_sf2: 0.0,
        }
    }
}

/// The GP indices of chunk `c` of P GPs.
pub(crate) fn chunk_range(c: usize, p_count: usize) -> std::ops::Range<usize> {
    c * GP_CHUNK..((c + 1) * GP_CHUNK).min(p_count)
}

pub(crate) fn chunk_count(p_count: usize) -> usize {
    p_count.div_ceil(GP_CHUNK)
}

/// Runs `inducing::forward_one` (or the subspace path's, given `sub`) over all GPs in
/// parallel chunks; results in GP order.
#[allow(clippy::too_many_arguments)]
fn forward_all(
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    k_diag: &[f64],
    rho: MatRef<'_, f64>,
    quad: Option<&[f64]>,
    keep: bool,
    sub: Option<&LowRankFactors>,
    scratch: &Scratch,
) -> Result<Vec<GpForward>> {
    let p_count = rho.ncols();
    let k_bz_t = match sub {
        Some(_) => Mat::new(),
        None => k_bz.transpose().to_owned(),
    };
    let chunks: Vec<Result<Vec<GpForward>>> = (0..chunk_count(p_count))
        .into_par_iter()
        .map(|c| {
            chunk_range(c, p_count)
                .map(|p| match sub {
                    Some(sub) => {
                        low_rank::forward_one(sub, rho, p, quad.map(|q| q[p]), keep, scratch)
                    }
                    None => inducing::forward_one(
                        k_z,
                        k_bz_t.as_ref(),
                        k_diag,
                        rho,
                        p,
                        quad.map(|q| q[p]),
                        keep,
                        scratch,
                    ),
                })
                .collect()
        })
        .collect();
    let mut out = Vec::with_capacity(p_count);
    for c in chunks {
        out.extend(c?);
    }
    Ok(out)
}

/// Computes the marginals and the KL terms, keeping the per-GP factors for [`backward`].
/// Given `sub` (the linear kernel's subspace factors of the same K_Z and K_bZ), the per-GP
/// work runs in R×R matrices (`qu/sites/low_rank.rs`); the results agree to rounding.
pub fn forward(
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    k_diag: &[f64],
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    sub: Option<&LowRankFactors>,
    scratch: &Scratch,
) -> Result<VariationalForward> {
    let (p_count, b) = (mu.ncols(), k_bz.nrows());
    let mean = k_bz * mu;
    let quad = quad_mu(k_z, mu);
    let gps = forward_all(k_z, k_bz, k_diag, rho, Some(&quad), true, sub, scratch)?;
    let mut var = Mat::<f64>::zeros(b, p_count);
    let mut kl = 0.0;
    let mut jitter = 0.0f64;
    let mut per_gp = Vec::with_capacity(p_count);
    for (p, g) in gps.into_iter().enumerate() {
        for (i, s) in g.var.iter().enumerate() {
            var[(i, p)] = *s;
        }
        kl += g.kl;
        jitter = jitter.max(g.jitter);
        per_gp.push(g.state.expect("kept"));
    }
    Ok(VariationalForward {
        mean,
        var,
        kl,
        jitter,
        per_gp,
        low_rank: sub.is_some(),
    })
}

/// Marginal means and variances only ([B×P] each) and the jitter: no KL, nothing kept
/// (M³/3 + M²B flops per GP; MR² + R³/3 + R²B given `sub`). For bounds evaluated without
/// gradients.
pub fn marginals(
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    k_diag: &[f64],
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    sub: Option<&LowRankFactors>,
    scratch: &Scratch,
) -> Result<(Mat<f64>, Mat<f64>, f64)> {
    let (p_count, b) = (mu.ncols(), k_bz.nrows());
    let mean = k_bz * mu;
    let gps = forward_all(k_z, k_bz, k_diag, rho, None, false, sub, scratch)?;
    let mut var = Mat::<f64>::zeros(b, p_count);
    let mut jitter = 0.0f64;
    for (p, g) in gps.iter().enumerate() {
        for (i, s) in g.var.iter().enumerate() {
            var[(i, p)] = *s;
        }
        jitter = jitter.max(g.jitter);
    }
    Ok((mean, var, jitter))
}

/// Σ_p KL_p alone (needs only K_Z; 2M³/3 flops per GP, or the subspace factors of a
/// minibatch of no rows), in the same chunk order as [`forward`], so the two agree bit for
/// bit when they take the same path.
pub fn kl_total(
    k_z: MatRef<'_, f64>,
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    sub: Option<&LowRankFactors>,
    scratch: &Scratch,
) -> Result<f64> {
    let m = k_z.nrows();
    let empty_t = Mat::<f64>::zeros(m, 0);
    let quad = quad_mu(k_z, mu);
    let gps = forward_all(
        k_z,
        empty_t.transpose(),
        &[],
        rho,
        Some(&quad),
        false,
        sub,
        scratch,
    )?;
    Ok(gps.iter().map(|g| g.kl).sum())
}

/// The Cholesky factors L_p of every C_p = K_Z + Σ_p, for the marginals at many sets of
/// rows under the same parameters: prediction factorises once per run (P·M³/3 flops).
#[derive(Debug, Clone)]
pub struct Factors {
    /// L_p [M×M], one per latent GP.
    l: Vec<Mat<f64>>,
    /// Largest diagonal jitter a factorisation needed (0 when none).
    pub jitter: f64,
}

impl Factors {
    /// Factorises C_p for every column p of ρ [M×P], in parallel chunks of GPs.
    pub fn new(k_z: MatRef<'_, f64>, rho: MatRef<'_, f64>, scratch: &Scratch) -> Result<Self> {
        let p_count = rho.ncols();
        // (L_p, jitter) per GP, in chunks.
        type Chunk = Result<Vec<(Mat<f64>, f64)>>;
        let chunks: Vec<Chunk> = (0..chunk_count(p_count))
            .into_par_iter()
            .map(|c| {
                chunk_range(c, p_count)
                    .map(|p| inducing::factor(k_z, rho, p, scratch))
                    .collect()
            })
            .collect();
        let (mut l, mut jitter) = (Vec::with_capacity(p_count), 0.0f64);
        for c in chunks {
            for (factor, j) in c? {
                jitter = jitter.max(j);
                l.push(factor);
            }
        }
        Ok(Factors { l, jitter })
    }

    /// Marginal means m = K_bZ μ and variances s_ip = k_ii − ‖L_p⁻¹ k_i‖² [B×P] (not
    /// clamped at 0) at the rows of K_bZ [B×M] and k_ii [B].
    pub fn marginals(
        &self,
        k_bz: MatRef<'_, f64>,
        k_diag: &[f64],
        mu: MatRef<'_, f64>,
        scratch: &Scratch,
    ) -> (Mat<f64>, Mat<f64>) {
        let (p_count, b) = (self.l.len(), k_bz.nrows());
        let mean = k_bz * mu;
        let k_bz_t = k_bz.transpose().to_owned();
        let chunks: Vec<Vec<Vec<f64>>> = (0..chunk_count(p_count))
            .into_par_iter()
            .map(|c| {
                chunk_range(c, p_count)
                    .map(|p| {
                        inducing::variances_given_factor(
                            self.l[p].as_ref(),
                            k_bz_t.as_ref(),
                            k_diag,
                            scratch,
                        )
                    })
                    .collect()
            })
            .collect();
        let mut var = Mat::<f64>::zeros(b, p_count);
        for (p, col) in chunks.into_iter().flatten().enumerate() {
            for (i, s) in col.into_iter().enumerate() {
                var[(i, p)] = s;
            }
        }
        (mean, var)
    }
}

/// Gradients of F = ⟨g_mean, m⟩ + ⟨g_var, s⟩ − Σ_p KL_p. Without `kernel_grads` the
/// gradients with respect to K_Z, K_bZ and k_ii are left empty and their O(M³) and
/// O(M²B) products skipped. `sub` must be the subspace factors `fwd` was computed with
/// (None if it took the inducing-point path).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    fwd: &VariationalForward,
    k_z: MatRef<'_, f64>,
    k_bz: MatRef<'_, f64>,
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    g_mean: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
    kernel_grads: bool,
    sub: Option<&LowRankFactors>,
    scratch: &Scratch,
) -> VariationalGrads {
    assert_eq!(
        fwd.low_rank,
        sub.is_some(),
        "backward must take the forward pass's path"
    );
    let (m, p_count) = (k_z.nrows(), mu.ncols());
    // ∂F/∂μ = K_bZᵀ G_m − K_Z μ.
    let mut g_mu = Mat::<f64>::zeros(m, p_count);
    matmul(
        g_mu.as_mut(),
        Accum::Replace,
        k_bz.transpose(),
        g_mean,
        1.0,
        Par::rayon(0),
    );
    matmul(g_mu.as_mut(), Accum::Add, k_z, mu, -1.0, Par::rayon(0));
    if let Some(sub) = sub {
        return backward_low_rank(
            fwd,
            sub,
            mu,
            rho,
            g_mean,
            g_var,
            kernel_grads,
            g_mu,
            scratch,
        );
    }
    let chunks: Vec<inducing::ChunkGrads> = (0..chunk_count(p_count))
        .into_par_iter()
        .map(|c| {
            let r = chunk_range(c, p_count);
            inducing::backward_chunk(
                &fwd.per_gp[r.clone()],
                r.start,
                rho,
                g_var,
                kernel_grads,
                scratch,
            )
        })
        .collect();
    let g_rho = gather_rho(chunks.iter().map(|ch| &ch.rho), m, p_count);
    if !kernel_grads {
        return VariationalGrads::without_kernel(g_mu, g_rho);
    }
    // ∂F/∂K_bZ = G_m μᵀ − 2 Σ_p D_p W_pᵀ; ∂F/∂K_Z = −½ μμᵀ + Σ_p (…), summed in chunk order.
    let (mut g_kbz, mut g_kz) = mu_kernel_grads(mu, g_mean);
    for ch in &chunks {
        g_kbz += ch.k_bz_t.transpose();
        for j in 0..m {
            for i in j..m {
                g_kz[(i, j)] += ch.k_z[(i, j)];
            }
        }
    }
    // The chunks formed lower triangles: mirror them.
    mirror_lower(g_kz.as_mut());
    VariationalGrads {
        mu: g_mu,
        rho: g_rho,
        k_z: g_kz,
        k_bz: g_kbz,
        k_diag: k_diag_grad(g_var),
        f: Mat::new(),
        g: Mat::new(),
        chol: Mat::new(),
        log_sf2: 0.0,
    }
}

/// ∂F/∂ρ [M×P] from the chunks' per-GP columns, in chunk order.
fn gather_rho<'a>(
    chunks: impl Iterator<Item = &'a Vec<Vec<f64>>>,
    m: usize,
    p_count: usize,
) -> Mat<f64> {
    let mut g_rho = Mat::<f64>::zeros(m, p_count);
    for (c, cols) in chunks.enumerate() {
        for (q, col) in cols.iter().enumerate() {
            for (j, v) in col.iter().enumerate() {
                g_rho[(j, c * GP_CHUNK + q)] = *v;
            }
        }
    }
    g_rho
}

/// The μ terms' share of the kernel gradients: ∂F/∂K_bZ ∋ G_m μᵀ [B×M] (through m = K_bZ μ)
/// and ∂F/∂K_Z ∋ −½ μμᵀ [M×M] (through −½ μᵀ K_Z μ in the KL).
fn mu_kernel_grads(mu: MatRef<'_, f64>, g_mean: MatRef<'_, f64>) -> (Mat<f64>, Mat<f64>) {
    let (m, b) = (mu.nrows(), g_mean.nrows());
    let mut g_kbz = Mat::<f64>::zeros(b, m);
    matmul(
        g_kbz.as_mut(),
        Accum::Replace,
        g_mean,
        mu.transpose(),
        1.0,
        Par::rayon(0),
    );
    let mut g_kz = Mat::<f64>::zeros(m, m);
    matmul(
        g_kz.as_mut(),
        Accum::Replace,
        mu,
        mu.transpose(),
        -0.5,
        Par::rayon(0),
    );
    (g_kbz, g_kz)
}

/// ∂F/∂k_ii = Σ_p G_s,ip [B] (s_ip = k_ii − …).
fn k_diag_grad(g_var: MatRef<'_, f64>) -> Vec<f64> {
    (0..g_var.nrows())
        .map(|i| (0..g_var.ncols()).map(|p| g_var[(i, p)]).sum())
        .collect()
}

/// [`backward`] on the subspace path (`qu/sites/low_rank.rs`): per-GP work in R×R matrices, the
/// kernel gradients split into the μ terms (through K_Z and K_bZ) and ∂F, ∂G.
#[allow(clippy::too_many_arguments)]
fn backward_low_rank(
    fwd: &VariationalForward,
    sub: &LowRankFactors,
    mu: MatRef<'_, f64>,
    rho: MatRef<'_, f64>,
    g_mean: MatRef<'_, f64>,
    g_var: MatRef<'_, f64>,
    kernel_grads: bool,
    g_mu: Mat<f64>,
    scratch: &Scratch,
) -> VariationalGrads {
    let (m, p_count) = (mu.nrows(), mu.ncols());
    let chunks: Vec<low_rank::ChunkGrads> = (0..chunk_count(p_count))
        .into_par_iter()
        .map(|c| {
            let r = chunk_range(c, p_count);
            low_rank::backward_chunk(
                sub,
                &fwd.per_gp[r.clone()],
                r.start,
                rho,
                g_var,
                kernel_grads,
                scratch,
            )
        })
        .collect();
    let g_rho = gather_rho(chunks.iter().map(|ch| &ch.rho), m, p_count);
    if !kernel_grads {
        return VariationalGrads::without_kernel(g_mu, g_rho);
    }
    let (g_kbz, g_kz) = mu_kernel_grads(mu, g_mean);
    let k_diag = k_diag_grad(g_var);
    let mut g_f = Mat::<f64>::zeros(sub.f.nrows(), sub.f.ncols());
    let mut g_g = Mat::<f64>::zeros(sub.g.nrows(), sub.g.ncols());
    for ch in &chunks {
        g_f += &ch.f;
        g_g += &ch.g;
    }
    // c_i = k_ii − ‖g_i‖²: ∂G ∋ −2 g_i Σ_p G_s,ip.
    for (i, &gs) in k_diag.iter().enumerate() {
        let (dst, src) = (g_g.col_mut(i), sub.g.col(i));
        for (o, x) in dst.iter_mut().zip(src.iter()) {
            *o -= 2.0 * gs * x;
        }
    }
    VariationalGrads {
        mu: g_mu,
        rho: g_rho,
        k_z: g_kz,
        k_bz: g_kbz,
        k_diag,
        f: g_f,
        g: g_g,
        chol: Mat::new(),
        log_sf2: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernel::{BasisInputs, KernelKind, KernelParams};
    use crate::model::qu::gp_factor::sigma_of;
    use faer::linalg::solvers::DenseSolveCore;
    use faer::Side;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn rand_mat(rng: &mut ChaCha8Rng, r: usize, c: usize, s: f64) -> Mat<f64> {
        Mat::from_fn(r, c, |_, _| (rng.random::<f64>() - 0.5) * s)
    }

    #[test]
    fn kl_equals_the_textbook_gaussian_kl() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (m, p) = (6, 3);
        let w = rand_mat(&mut rng, m, m, 1.0);
        let k_z = &w * w.transpose() + Mat::<f64>::identity(m, m) * faer::Scale(0.1);
        let mu = rand_mat(&mut rng, m, p, 2.0);
        let rho = rand_mat(&mut rng, m, p, 3.0);
        let fwd = forward(
            k_z.as_ref(),
            Mat::<f64>::zeros(0, m).as_ref(),
            &[],
            mu.as_ref(),
            rho.as_ref(),
            None,
            &Scratch::new(),
        )
        .unwrap();
        let k_inv = k_z.llt(Side::Lower).unwrap().inverse();
        let logdet = |a: &Mat<f64>| {
            2.0 * (0..m)
                .map(|i| a.llt(Side::Lower).unwrap().L()[(i, i)].ln())
                .sum::<f64>()
        };
        let mut expected = 0.0;
        for q in 0..p {
            // S = (K⁻¹ + Σ⁻¹)⁻¹, mean K μ; KL(N(mean, S) ‖ N(0, K)).
            let sig_inv = Mat::from_fn(m, m, |i, j| {
                if i == j {
                    1.0 / sigma_of(rho[(i, q)])
                } else {
                    0.0
                }
            });
            let s = (&k_inv + &sig_inv).llt(Side::Lower).unwrap().inverse();
            let mean = &k_z * mu.col(q);
            let quad: f64 = (0..m)
                .map(|i| {
                    (0..m)
                        .map(|j| mean[i] * k_inv[(i, j)] * mean[j])
                        .sum::<f64>()
                })
                .sum();
            let tr: f64 = (0..m)
                .map(|i| (0..m).map(|j| k_inv[(i, j)] * s[(j, i)]).sum::<f64>())
                .sum();
            expected += 0.5 * (tr + quad - m as f64 + logdet(&k_z) - logdet(&s));
        }
        assert!(
            (fwd.kl - expected).abs() < 1e-9 * expected.abs().max(1.0),
            "{} vs {expected}",
            fwd.kl
        );
    }

    /// F(A, μ, ρ, log σ_f², log ℓ) = ⟨R_m, m⟩ + ⟨R_s, s⟩ − KL through a real kernel, so
    /// K_Z stays symmetric under every perturbation.
    struct Setup {
        kxx: Mat<f64>,
        norms: Vec<f64>,
        kt: Mat<f64>,
        r_m: Mat<f64>,
        r_s: Mat<f64>,
    }

    fn objective(
        s: &Setup,
        kind: KernelKind,
        kp: &KernelParams,
        a: &Mat<f64>,
        mu: &Mat<f64>,
        rho: &Mat<f64>,
    ) -> f64 {
        let x = BasisInputs {
            kxx_b: s.kxx.as_ref().into(),
            sq_norms: &s.norms,
            k_tilde: s.kt.as_ref().into(),
        };
        let kf = kind.forward(kp, a.as_ref(), &x);
        let f = forward(
            kf.k_z.as_ref(),
            kf.k_bz.as_ref(),
            &kf.k_diag,
            mu.as_ref(),
            rho.as_ref(),
            None,
            &Scratch::new(),
        )
        .unwrap();
        let dot = |x: &Mat<f64>, y: &Mat<f64>| {
            (0..x.nrows())
                .map(|i| (0..x.ncols()).map(|j| x[(i, j)] * y[(i, j)]).sum::<f64>())
                .sum::<f64>()
        };
        dot(&s.r_m, &f.mean) + dot(&s.r_s, &f.var) - f.kl
    }

    #[test]
    fn gradients_match_central_differences_through_both_kernels() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        // R < M: K_Z is singular for the linear kernel, as in real runs.
        let (m, r, b, p) = (6, 4, 5, 2);
        let kxx = rand_mat(&mut rng, b, r, 1.0);
        let norms: Vec<f64> = (0..b)
            .map(|i| (0..r).map(|k| kxx[(i, k)].powi(2)).sum::<f64>() + 0.2)
            .collect();
        let kt = Mat::<f64>::identity(r, r);
        let s = Setup {
            r_m: rand_mat(&mut rng, b, p, 2.0),
            r_s: rand_mat(&mut rng, b, p, 2.0),
            kxx,
            norms,
            kt,
        };
        let a = rand_mat(&mut rng, m, r, 1.0);
        let mu = rand_mat(&mut rng, m, p, 1.0);
        let rho = rand_mat(&mut rng, m, p, 2.0);
        for kind in [KernelKind::Linear, KernelKind::SquaredExponential] {
            let kp = KernelParams::new(0.2, 0.1);
            let x = BasisInputs {
                kxx_b: s.kxx.as_ref().into(),
                sq_norms: &s.norms,
                k_tilde: s.kt.as_ref().into(),
            };
            let kf = kind.forward(&kp, a.as_ref(), &x);
            let f = forward(
                kf.k_z.as_ref(),
                kf.k_bz.as_ref(),
                &kf.k_diag,
                mu.as_ref(),
                rho.as_ref(),
                None,
                &Scratch::new(),
            )
            .unwrap();
            assert_eq!(f.jitter, 0.0);
            let g = backward(
                &f,
                kf.k_z.as_ref(),
                kf.k_bz.as_ref(),
                mu.as_ref(),
                rho.as_ref(),
                s.r_m.as_ref(),
                s.r_s.as_ref(),
                true,
                None,
                &Scratch::new(),
            );
            let kg = kind.backward(
                &kp,
                a.as_ref(),
                &x,
                &kf,
                g.k_z.as_ref(),
                g.k_bz.as_ref(),
                &g.k_diag,
            );
            let h = 1e-6;
            let check = |name: &str, analytic: f64, plus: f64, minus: f64| {
                let fd = (plus - minus) / (2.0 * h);
                let rel = (analytic - fd).abs() / analytic.abs().max(fd.abs()).max(1e-6);
                assert!(
                    rel < 1e-6,
                    "{kind:?} {name}: analytic {analytic} vs fd {fd}"
                );
            };
            for i in 0..m {
                for j in 0..p {
                    let (mut up, mut dn) = (mu.clone(), mu.clone());
                    up[(i, j)] += h;
                    dn[(i, j)] -= h;
                    check(
                        "μ",
                        g.mu[(i, j)],
                        objective(&s, kind, &kp, &a, &up, &rho),
                        objective(&s, kind, &kp, &a, &dn, &rho),
                    );
                    let (mut up, mut dn) = (rho.clone(), rho.clone());
                    up[(i, j)] += h;
                    dn[(i, j)] -= h;
                    check(
                        "ρ",
                        g.rho[(i, j)],
                        objective(&s, kind, &kp, &a, &mu, &up),
                        objective(&s, kind, &kp, &a, &mu, &dn),
                    );
                }
                for j in 0..r {
                    let (mut up, mut dn) = (a.clone(), a.clone());
                    up[(i, j)] += h;
                    dn[(i, j)] -= h;
                    check(
                        "A",
                        kg.a[(i, j)],
                        objective(&s, kind, &kp, &up, &mu, &rho),
                        objective(&s, kind, &kp, &dn, &mu, &rho),
                    );
                }
            }
            let shift =
                |d_sf: f64, d_l: f64| KernelParams::new(kp.log_sf2 + d_sf, kp.log_ell + d_l);
            check(
                "log σ_f²",
                kg.log_sf2,
                objective(&s, kind, &shift(h, 0.0), &a, &mu, &rho),
                objective(&s, kind, &shift(-h, 0.0), &a, &mu, &rho),
            );
            if kind == KernelKind::SquaredExponential {
                check(
                    "log ℓ",
                    kg.log_ell,
                    objective(&s, kind, &shift(0.0, h), &a, &mu, &rho),
                    objective(&s, kind, &shift(0.0, -h), &a, &mu, &rho),
                );
            }
        }
    }

    #[test]
    fn singular_c_is_rescued_by_jitter() {
        // K_Z of rank 1 and σ at its floor: C is numerically singular in f64 for large K_Z.
        let v = Mat::from_fn(4, 1, |i, _| 1e9 * (i as f64 + 1.0));
        let k_z = &v * v.transpose();
        let rho = Mat::from_fn(4, 1, |_, _| -60.0);
        let f = forward(
            k_z.as_ref(),
            Mat::<f64>::zeros(0, 4).as_ref(),
            &[],
            Mat::<f64>::zeros(4, 1).as_ref(),
            rho.as_ref(),
            None,
            &Scratch::new(),
        )
        .unwrap();
        assert!(f.jitter > 0.0);
        assert!(f.kl.is_finite());
    }
}
