//! Kernels evaluated through the basis, never touching D-dimensional data (Panos,
//! Dellaportas & Titsias, *Fully Scalable Gaussian Processes using Subspace Inducing Inputs*,
//! §2.2 and A.6; `docs/model.md`, section "Kernels through the basis").
//!
//! With Z = A X̃: G = A K_X̃ Aᵀ = Z Zᵀ [M×M] and H = Kxx_b Aᵀ = X_b Zᵀ [B×M], where
//! Kxx_b = X_b X̃ᵀ [B×R] are rows of `kxx.npy` and K_X̃ = X̃ X̃ᵀ [R×R].
//!
//! - linear: K_Z = σ_f² G, K_bZ = σ_f² H, k_ii = σ_f² ‖x_i‖²;
//! - squared exponential: K = σ_f² exp(−D/2ℓ²) with D_Z = g1ᵀ + 1gᵀ − 2G (g = diag G) and
//!   D_bZ = n1ᵀ + 1gᵀ − 2H (n_i = ‖x_i‖²); k_ii = σ_f²;
//! - SE + linear: the sum of the two, K = σ_f² exp(−D/2ℓ²) + σ_lin² ⟨x, z⟩ with two free
//!   variances (σ_f² is the SE part's).
//!
//! `backward` maps the gradients of any objective with respect to K_Z, K_bZ and k_ii to
//! gradients with respect to A and the hyperparameters (chain rule of `docs/model.md`);
//! `input_grads` maps them to the kernel's data inputs Kxx_b, n and K_X̃, which input
//! transforms (ARD, `kernel/ard.rs`) chain further.

pub mod ard;
pub mod feature_ard;
pub mod input_space;

use faer::{Mat, MatRef};

pub use input_space::{Gram, GramRef, Rows};

use crate::linalg::{clear_upper_simd_state, inner};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelKind {
    Linear,
    SquaredExponential,
    /// σ_f² exp(−D/2ℓ²) + σ_lin² ⟨x, z⟩.
    SePlusLinear,
}

/// Unconstrained kernel hyperparameters: σ_f² = exp(log_sf2), ℓ = exp(log_ell), and the
/// optional ones, which are parameters (in the flat index, the optimiser, checkpoints) only
/// when present.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelParams {
    pub log_sf2: f64,
    pub log_ell: f64,
    /// log σ_lin², the linear part's variance of SE + linear; None for the other kernels.
    pub log_lin2: Option<f64>,
    /// log ω [R]: subspace ARD weights (`kernel/ard.rs`); empty without ARD.
    pub log_ard: Vec<f64>,
    /// log w [D]: ARD weights over the input features (`kernel/feature_ard.rs`); empty without.
    /// They act on the data before the kernel sees it, so every function here that takes
    /// [`BasisInputs`] is given the weighted inputs and parameters without them.
    pub log_features: Vec<f64>,
}

impl KernelParams {
    /// σ_f² and ℓ alone (the linear and SE kernels without ARD).
    pub fn new(log_sf2: f64, log_ell: f64) -> Self {
        KernelParams {
            log_sf2,
            log_ell,
            log_lin2: None,
            log_ard: Vec::new(),
            log_features: Vec::new(),
        }
    }

    /// Zeros in the same shape (the gradient of frozen hyperparameters).
    pub fn zeros_like(&self) -> Self {
        KernelParams {
            log_sf2: 0.0,
            log_ell: 0.0,
            log_lin2: self.log_lin2.map(|_| 0.0),
            log_ard: vec![0.0; self.log_ard.len()],
            log_features: vec![0.0; self.log_features.len()],
        }
    }

    /// Whether every entry is finite.
    pub fn is_finite(&self) -> bool {
        self.log_sf2.is_finite()
            && self.log_ell.is_finite()
            && self.log_lin2.is_none_or(f64::is_finite)
            && self.log_ard.iter().all(|v| v.is_finite())
            && self.log_features.iter().all(|v| v.is_finite())
    }

    /// σ_lin² of SE + linear. Callers check [`KernelKind::check`] first.
    fn lin2(&self) -> f64 {
        self.log_lin2
            .expect("SE + linear parameters carry log σ_lin² (KernelKind::check)")
            .exp()
    }
}

/// The minibatch's view of the data: Kxx_b [B×R], ‖x_i‖² [B], and K_X̃ [R×R]; with the
/// identity basis the rows sparse and K_X̃ = I_D a marker (`kernel/input_space.rs`).
#[derive(Debug, Clone, Copy)]
pub struct BasisInputs<'a> {
    pub kxx_b: Rows<'a>,
    pub sq_norms: &'a [f64],
    pub k_tilde: GramRef<'a>,
}

impl<'a> BasisInputs<'a> {
    /// No rows: what K_Z and the KL read (they depend on the data only through K_X̃).
    pub fn without_rows(k_tilde: GramRef<'a>) -> Self {
        BasisInputs {
            kxx_b: Rows::Dense(MatRef::from_column_major_slice(&[], 0, k_tilde.dim())),
            sq_norms: &[],
            k_tilde,
        }
    }
}

/// Kernel matrices of one step, with what `backward` needs.
#[derive(Debug, Clone)]
pub struct KernelForward {
    /// K_Z [M×M].
    pub k_z: Mat<f64>,
    /// K_bZ [B×M].
    pub k_bz: Mat<f64>,
    /// k(x_i, x_i) [B].
    pub k_diag: Vec<f64>,
    /// A K_X̃ [M×R], reused by the gradient; None with K_X̃ = I, where it is A.
    a_kt: Option<Mat<f64>>,
    /// Squared distances D_Z [M×M] and D_bZ [B×M] (SE and SE + linear; empty for linear).
    d_z: Mat<f64>,
    d_bz: Mat<f64>,
    /// SE + linear only (empty otherwise): the SE parts of K_Z and K_bZ, and G and H.
    se_z: Mat<f64>,
    se_bz: Mat<f64>,
    gram_z: Mat<f64>,
    gram_bz: Mat<f64>,
}

impl KernelForward {
    /// Every part empty.
    pub(crate) fn empty() -> Self {
        KernelForward {
            k_z: Mat::new(),
            k_bz: Mat::new(),
            k_diag: Vec::new(),
            a_kt: None,
            d_z: Mat::new(),
            d_bz: Mat::new(),
            se_z: Mat::new(),
            se_bz: Mat::new(),
            gram_z: Mat::new(),
            gram_bz: Mat::new(),
        }
    }
}

/// Gradients with respect to the kernel's trainable inputs.
#[derive(Debug, Clone)]
pub struct KernelGrads {
    /// ∂/∂A [M×R].
    pub a: Mat<f64>,
    pub log_sf2: f64,
    pub log_ell: f64,
    /// ∂/∂log σ_lin² (0 unless SE + linear).
    pub log_lin2: f64,
}

/// Gradients with respect to the kernel's data inputs (`KernelKind::input_grads`).
#[derive(Debug, Clone)]
pub struct InputGrads {
    /// ∂/∂Kxx_b [B×R].
    pub kxx_b: Mat<f64>,
    /// ∂/∂n [B].
    pub sq_norms: Vec<f64>,
    /// ∂/∂K_X̃ [R×R] (entries as independent; empty unless asked for).
    pub k_tilde: Mat<f64>,
}

/// The SE kernel's matrices from the Gram matrices: (K_Z, K_bZ, D_Z, D_bZ).
fn se_parts(
    sf2: f64,
    log_ell: f64,
    g: &Mat<f64>,
    h: &Mat<f64>,
    sq_norms: &[f64],
) -> (Mat<f64>, Mat<f64>, Mat<f64>, Mat<f64>) {
    // G and H come straight from faer's GEMMs and (B + M)·M calls of libm's exp follow:
    // see `clear_upper_simd_state` (a 1.9× shorter M = 200 binary epoch on AVX-512).
    clear_upper_simd_state();
    let inv_2l2 = 0.5 * (-2.0 * log_ell).exp();
    let m = g.nrows();
    let diag = gram_diagonal(g);
    // Clamped at 0: rounding can make a squared distance slightly negative.
    let d_z = Mat::from_fn(m, m, |i, j| (diag[i] + diag[j] - 2.0 * g[(i, j)]).max(0.0));
    let k_z = Mat::from_fn(m, m, |i, j| sf2 * (-d_z[(i, j)] * inv_2l2).exp());
    let (k_bz, d_bz) = se_cross(sf2, inv_2l2, &diag, h, sq_norms);
    (k_z, k_bz, d_z, d_bz)
}

/// G = A K_X̃ Aᵀ [M×M] and A K_X̃ [M×R] for `a` [M×R]; with the identity basis G = A Aᵀ
/// and A K_X̃ is A itself (None): no M·R² product and no R×R matrix.
fn inducing_gram(a: MatRef<'_, f64>, k_tilde: GramRef<'_>) -> (Mat<f64>, Option<Mat<f64>>) {
    let a_kt = k_tilde.times(a);
    let g = match &a_kt {
        Some(a_kt) => a_kt * a.transpose(),
        None => a * a.transpose(),
    };
    (g, a_kt)
}

impl KernelForward {
    /// A K_X̃ [M×R] for the `a` the pass was evaluated at.
    fn a_kt<'s>(&'s self, a: MatRef<'s, f64>) -> MatRef<'s, f64> {
        self.a_kt.as_ref().map_or(a, |m| m.as_ref())
    }
}

/// diag(G) of G = A K_X̃ Aᵀ [M×M]: ‖z_m‖².
fn gram_diagonal(g: &Mat<f64>) -> Vec<f64> {
    (0..g.nrows()).map(|i| g[(i, i)]).collect()
}

/// The SE block between the rows and Z: K_bZ [B×M] and its squared distances D_bZ, from
/// H = K_bX̃ Aᵀ [B×M], ‖x_b‖² and ‖z_m‖² (`z_sq`).
fn se_cross(
    sf2: f64,
    inv_2l2: f64,
    z_sq: &[f64],
    h: &Mat<f64>,
    sq_norms: &[f64],
) -> (Mat<f64>, Mat<f64>) {
    let d_bz = Mat::from_fn(h.nrows(), z_sq.len(), |i, j| {
        (sq_norms[i] + z_sq[j] - 2.0 * h[(i, j)]).max(0.0)
    });
    let k_bz = Mat::from_fn(h.nrows(), z_sq.len(), |i, j| {
        sf2 * (-d_bz[(i, j)] * inv_2l2).exp()
    });
    (k_bz, d_bz)
}

/// ∂F/∂log ℓ of an SE part K_se with distances D: ⟨Ḡ, K_se ∘ D⟩ / ℓ² over both blocks.
fn se_log_ell(
    log_ell: f64,
    (g_z, g_bz): (MatRef<'_, f64>, MatRef<'_, f64>),
    (k_z, k_bz): (&Mat<f64>, &Mat<f64>),
    (d_z, d_bz): (&Mat<f64>, &Mat<f64>),
) -> f64 {
    let inv_2l2 = 0.5 * (-2.0 * log_ell).exp();
    let (m, b) = (k_z.nrows(), k_bz.nrows());
    // ∂K/∂log ℓ = K ∘ D / ℓ² (from exp(−D e^{−2 log ℓ}/2)).
    let two_inv_2l2 = 2.0 * inv_2l2;
    two_inv_2l2
        * (inner(
            g_z,
            Mat::from_fn(m, m, |i, j| k_z[(i, j)] * d_z[(i, j)]).as_ref(),
        ) + inner(
            g_bz,
            Mat::from_fn(b, m, |i, j| k_bz[(i, j)] * d_bz[(i, j)]).as_ref(),
        ))
}

/// The SE part's gradients with respect to G [M×M], H [B×M] and n [B], added to `acc`.
fn se_gram_grads(
    log_ell: f64,
    (g_z, g_bz): (MatRef<'_, f64>, MatRef<'_, f64>),
    (k_z, k_bz): (&Mat<f64>, &Mat<f64>),
    acc: &mut GramGrads,
) {
    let inv_2l2 = 0.5 * (-2.0 * log_ell).exp();
    let (m, b) = (k_z.nrows(), k_bz.nrows());
    // Gradients with respect to the squared distances.
    let e_z = Mat::from_fn(m, m, |i, j| -g_z[(i, j)] * k_z[(i, j)] * inv_2l2);
    let e_b = Mat::from_fn(b, m, |i, j| -g_bz[(i, j)] * k_bz[(i, j)] * inv_2l2);
    // D_Z = g1ᵀ + 1gᵀ − 2G, D_bZ = n1ᵀ + 1gᵀ − 2H with g = diag G.
    for j in 0..m {
        let mut s = 0.0;
        for i in 0..m {
            s += e_z[(j, i)] + e_z[(i, j)];
            acc.g[(i, j)] -= 2.0 * e_z[(i, j)];
        }
        for i in 0..b {
            s += e_b[(i, j)];
            acc.h[(i, j)] -= 2.0 * e_b[(i, j)];
            acc.n[i] += e_b[(i, j)];
        }
        acc.g[(j, j)] += s;
    }
}

/// Gradients with respect to the Gram matrices G = A K_X̃ Aᵀ [M×M], H = Kxx_b Aᵀ [B×M] and
/// the squared norms n [B], through which every kernel here sees its inputs.
struct GramGrads {
    g: Mat<f64>,
    h: Mat<f64>,
    n: Vec<f64>,
}

impl KernelKind {
    /// An error unless `p` holds exactly this kernel's optional hyperparameters.
    pub fn check(self, p: &KernelParams) -> anyhow::Result<()> {
        anyhow::ensure!(
            p.log_lin2.is_some() == (self == KernelKind::SePlusLinear),
            "the {self:?} kernel {} log σ_lin², but the parameters {}",
            if self == KernelKind::SePlusLinear {
                "needs"
            } else {
                "has no"
            },
            if p.log_lin2.is_some() {
                "hold one"
            } else {
                "hold none"
            }
        );
        Ok(())
    }

    /// K_Z [M×M] alone: it depends on the data only through K_X̃ [R×R].
    pub fn k_z<'g>(
        self,
        p: &KernelParams,
        a: MatRef<'_, f64>,
        k_tilde: impl Into<GramRef<'g>>,
    ) -> Mat<f64> {
        self.forward(p, a, &BasisInputs::without_rows(k_tilde.into()))
            .k_z
    }

    /// Evaluates K_Z, K_bZ and k_ii for inducing-input coordinates `a` [M×R].
    /// ‖z_m‖² = diag(A K_X̃ Aᵀ) [M], computed as [`KernelKind::forward`] computes it (the
    /// same GEMMs), for [`KernelKind::cross`].
    pub fn inducing_sq_norms<'g>(a: MatRef<'_, f64>, k_tilde: impl Into<GramRef<'g>>) -> Vec<f64> {
        gram_diagonal(&inducing_gram(a, k_tilde.into()).0)
    }

    /// The forward pass without the M×M block: K_bZ and k_ii at the rows of `x` (every
    /// other part empty), given ‖z_m‖² ([`KernelKind::inducing_sq_norms`]). The same
    /// arithmetic as [`KernelKind::forward`], so the same bits, at O(B·R·M) instead of
    /// O(M·R·(R + M) + B·R·M): what prediction needs (its M×M work is done once per model),
    /// and what makes scoring one row cost one row's work.
    pub fn cross(
        self,
        p: &KernelParams,
        a: MatRef<'_, f64>,
        z_sq: &[f64],
        x: &BasisInputs<'_>,
    ) -> KernelForward {
        let sf2 = p.log_sf2.exp();
        let h = x.kxx_b.times_transpose(a);
        let (k_bz, k_diag) = match self {
            KernelKind::Linear => (
                &h * faer::Scale(sf2),
                x.sq_norms.iter().map(|n| sf2 * n).collect(),
            ),
            KernelKind::SquaredExponential => {
                clear_upper_simd_state();
                let inv_2l2 = 0.5 * (-2.0 * p.log_ell).exp();
                (
                    se_cross(sf2, inv_2l2, z_sq, &h, x.sq_norms).0,
                    vec![sf2; h.nrows()],
                )
            }
            KernelKind::SePlusLinear => {
                clear_upper_simd_state();
                let (lin2, inv_2l2) = (p.lin2(), 0.5 * (-2.0 * p.log_ell).exp());
                let se_bz = se_cross(sf2, inv_2l2, z_sq, &h, x.sq_norms).0;
                let k_diag = x.sq_norms.iter().map(|n| sf2 + lin2 * n).collect();
                (&se_bz + &h * faer::Scale(lin2), k_diag)
            }
        };
        KernelForward {
            k_bz,
            k_diag,
            ..KernelForward::empty()
        }
    }

    pub fn forward(
        self,
        p: &KernelParams,
        a: MatRef<'_, f64>,
        x: &BasisInputs<'_>,
    ) -> KernelForward {
        let sf2 = p.log_sf2.exp();
        let (g, a_kt) = inducing_gram(a, x.k_tilde);
        let h = x.kxx_b.times_transpose(a);
        let empty = || Mat::new();
        match self {
            KernelKind::Linear => KernelForward {
                k_z: &g * faer::Scale(sf2),
                k_bz: &h * faer::Scale(sf2),
                k_diag: x.sq_norms.iter().map(|n| sf2 * n).collect(),
                a_kt,
                d_z: empty(),
                d_bz: empty(),
                se_z: empty(),
                se_bz: empty(),
                gram_z: empty(),
                gram_bz: empty(),
            },
            KernelKind::SquaredExponential => {
                let (k_z, k_bz, d_z, d_bz) = se_parts(sf2, p.log_ell, &g, &h, x.sq_norms);
                KernelForward {
                    k_diag: vec![sf2; h.nrows()],
                    k_z,
                    k_bz,
                    a_kt,
                    d_z,
                    d_bz,
                    se_z: empty(),
                    se_bz: empty(),
                    gram_z: empty(),
                    gram_bz: empty(),
                }
            }
            KernelKind::SePlusLinear => {
                let lin2 = p.lin2();
                let (se_z, se_bz, d_z, d_bz) = se_parts(sf2, p.log_ell, &g, &h, x.sq_norms);
                KernelForward {
                    k_z: &se_z + &g * faer::Scale(lin2),
                    k_bz: &se_bz + &h * faer::Scale(lin2),
                    k_diag: x.sq_norms.iter().map(|n| sf2 + lin2 * n).collect(),
                    a_kt,
                    d_z,
                    d_bz,
                    se_z,
                    se_bz,
                    gram_z: g,
                    gram_bz: h,
                }
            }
        }
    }

    /// Chain rule from ∂F/∂K_Z [M×M], ∂F/∂K_bZ [B×M], ∂F/∂k_ii [B] to the parameters, for
    /// the pass `fwd` evaluated at inducing coordinates `a` [M×R] and inputs `x`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        self,
        p: &KernelParams,
        a: MatRef<'_, f64>,
        x: &BasisInputs<'_>,
        fwd: &KernelForward,
        g_z: MatRef<'_, f64>,
        g_bz: MatRef<'_, f64>,
        g_diag: &[f64],
    ) -> KernelGrads {
        let sf2 = p.log_sf2.exp();
        let diag_dot = |k: &[f64]| g_diag.iter().zip(k).map(|(g, k)| g * k).sum::<f64>();
        if self == KernelKind::SePlusLinear {
            let gg = self.gram_grads(p, fwd, g_z, g_bz, g_diag);
            return KernelGrads {
                a: x.kxx_b
                    .add_transpose_times(gg.h.as_ref(), (&gg.g + gg.g.transpose()) * fwd.a_kt(a)),
                log_sf2: inner(g_z, fwd.se_z.as_ref())
                    + inner(g_bz, fwd.se_bz.as_ref())
                    + sf2 * g_diag.iter().sum::<f64>(),
                log_ell: se_log_ell(
                    p.log_ell,
                    (g_z, g_bz),
                    (&fwd.se_z, &fwd.se_bz),
                    (&fwd.d_z, &fwd.d_bz),
                ),
                log_lin2: p.lin2()
                    * (inner(g_z, fwd.gram_z.as_ref())
                        + inner(g_bz, fwd.gram_bz.as_ref())
                        + diag_dot(x.sq_norms)),
            };
        }
        // Every kernel entry is proportional to σ_f²: ∂F/∂log σ_f² = Σ ∂F/∂K · K.
        let log_sf2 =
            inner(g_z, fwd.k_z.as_ref()) + inner(g_bz, fwd.k_bz.as_ref()) + diag_dot(&fwd.k_diag);
        match self {
            KernelKind::Linear => {
                // K_Z = σ_f² A K_X̃ Aᵀ, K_bZ = σ_f² Kxx_b Aᵀ.
                let sym = g_z + g_z.transpose();
                let a = x.kxx_b.add_transpose_times(g_bz, &sym * fwd.a_kt(a)) * faer::Scale(sf2);
                KernelGrads {
                    a,
                    log_sf2,
                    log_ell: 0.0,
                    log_lin2: 0.0,
                }
            }
            KernelKind::SquaredExponential => {
                let inv_2l2 = 0.5 * (-2.0 * p.log_ell).exp();
                let m = fwd.k_z.nrows();
                let b = fwd.k_bz.nrows();
                // Gradients with respect to the squared distances.
                let e_z = Mat::from_fn(m, m, |i, j| -g_z[(i, j)] * fwd.k_z[(i, j)] * inv_2l2);
                let e_b = Mat::from_fn(b, m, |i, j| -g_bz[(i, j)] * fwd.k_bz[(i, j)] * inv_2l2);
                // D_Z = g1ᵀ + 1gᵀ − 2G, D_bZ = n1ᵀ + 1gᵀ − 2H with g = diag G.
                let mut d_g = &e_z * faer::Scale(-2.0);
                for j in 0..m {
                    let mut s = 0.0;
                    for i in 0..m {
                        s += e_z[(j, i)] + e_z[(i, j)];
                    }
                    for i in 0..b {
                        s += e_b[(i, j)];
                    }
                    d_g[(j, j)] += s;
                }
                let d_h = &e_b * faer::Scale(-2.0);
                let a = x
                    .kxx_b
                    .add_transpose_times(d_h.as_ref(), (&d_g + d_g.transpose()) * fwd.a_kt(a));
                let log_ell = se_log_ell(
                    p.log_ell,
                    (g_z, g_bz),
                    (&fwd.k_z, &fwd.k_bz),
                    (&fwd.d_z, &fwd.d_bz),
                );
                KernelGrads {
                    a,
                    log_sf2,
                    log_ell,
                    log_lin2: 0.0,
                }
            }
            KernelKind::SePlusLinear => unreachable!("handled above"),
        }
    }

    /// ∂F/∂G, ∂F/∂H and ∂F/∂n for this kernel (`docs/model.md`, "Kernel chain").
    fn gram_grads(
        self,
        p: &KernelParams,
        fwd: &KernelForward,
        g_z: MatRef<'_, f64>,
        g_bz: MatRef<'_, f64>,
        g_diag: &[f64],
    ) -> GramGrads {
        let (m, b) = (g_z.nrows(), g_bz.nrows());
        let mut acc = GramGrads {
            g: Mat::zeros(m, m),
            h: Mat::zeros(b, m),
            n: vec![0.0; b],
        };
        let linear_scale = match self {
            KernelKind::Linear => Some(p.log_sf2.exp()),
            KernelKind::SePlusLinear => Some(p.lin2()),
            KernelKind::SquaredExponential => None,
        };
        if let Some(s) = linear_scale {
            acc.g += g_z * faer::Scale(s);
            acc.h += g_bz * faer::Scale(s);
            for (n, g) in acc.n.iter_mut().zip(g_diag) {
                *n += s * g;
            }
        }
        match self {
            KernelKind::Linear => {}
            KernelKind::SquaredExponential => {
                se_gram_grads(p.log_ell, (g_z, g_bz), (&fwd.k_z, &fwd.k_bz), &mut acc)
            }
            KernelKind::SePlusLinear => {
                se_gram_grads(p.log_ell, (g_z, g_bz), (&fwd.se_z, &fwd.se_bz), &mut acc)
            }
        }
        acc
    }

    /// Chain rule from ∂F/∂K_Z, ∂F/∂K_bZ, ∂F/∂k_ii to the kernel's data inputs, given the
    /// inducing coordinates `a` [M×R] it was evaluated at: ∂Kxx_b = (∂F/∂H) A,
    /// ∂n = ∂F/∂n and, if `with_k_tilde`, ∂K_X̃ = Aᵀ (∂F/∂G) A.
    #[allow(clippy::too_many_arguments)]
    pub fn input_grads(
        self,
        p: &KernelParams,
        a: MatRef<'_, f64>,
        fwd: &KernelForward,
        g_z: MatRef<'_, f64>,
        g_bz: MatRef<'_, f64>,
        g_diag: &[f64],
        with_k_tilde: bool,
    ) -> InputGrads {
        let gg = self.gram_grads(p, fwd, g_z, g_bz, g_diag);
        InputGrads {
            kxx_b: &gg.h * a,
            k_tilde: if with_k_tilde {
                a.transpose() * &gg.g * a
            } else {
                Mat::new()
            },
            sq_norms: gg.n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    struct Problem {
        a: Mat<f64>,
        kxx: Mat<f64>,
        norms: Vec<f64>,
        kt: Mat<f64>,
        g_z: Mat<f64>,
        g_bz: Mat<f64>,
        g_diag: Vec<f64>,
    }

    fn problem(seed: u64) -> Problem {
        let (m, r, b) = (5, 4, 6);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut u = |s: f64| (rng.random::<f64>() - 0.5) * s;
        let a = Mat::from_fn(m, r, |_, _| u(1.0));
        let kxx = Mat::from_fn(b, r, |_, _| u(1.0));
        // ‖x_i‖² ≥ ‖projection‖² as for real data.
        let norms: Vec<f64> = (0..b)
            .map(|i| (0..r).map(|k| kxx[(i, k)].powi(2)).sum::<f64>() + 0.3)
            .collect();
        let w = Mat::from_fn(r, r, |_, _| u(0.5));
        let kt = Mat::<f64>::identity(r, r) + &w * w.transpose();
        let g_z = Mat::from_fn(m, m, |_, _| u(2.0));
        let g_bz = Mat::from_fn(b, m, |_, _| u(2.0));
        let g_diag = (0..b).map(|_| u(2.0)).collect();
        Problem {
            a,
            kxx,
            norms,
            kt,
            g_z,
            g_bz,
            g_diag,
        }
    }

    /// F = ⟨G_Z, K_Z⟩ + ⟨G_bZ, K_bZ⟩ + Σ g_i k_ii: its gradient is what `backward` computes.
    fn objective_at(kind: KernelKind, p: &KernelParams, a: &Mat<f64>, pr: &Problem) -> f64 {
        let x = BasisInputs {
            kxx_b: pr.kxx.as_ref().into(),
            sq_norms: &pr.norms,
            k_tilde: pr.kt.as_ref().into(),
        };
        let f = kind.forward(p, a.as_ref(), &x);
        inner(pr.g_z.as_ref(), f.k_z.as_ref())
            + inner(pr.g_bz.as_ref(), f.k_bz.as_ref())
            + pr.g_diag
                .iter()
                .zip(&f.k_diag)
                .map(|(g, k)| g * k)
                .sum::<f64>()
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / a.abs().max(b.abs()).max(1e-8)
    }

    fn params_for(kind: KernelKind) -> KernelParams {
        KernelParams {
            log_lin2: (kind == KernelKind::SePlusLinear).then_some(-0.4),
            ..KernelParams::new(0.3, -0.2)
        }
    }

    const KINDS: [KernelKind; 3] = [
        KernelKind::Linear,
        KernelKind::SquaredExponential,
        KernelKind::SePlusLinear,
    ];

    /// The cross-only pass gives forward's K_bZ and k_ii bit for bit, for every kernel.
    #[test]
    fn cross_is_forwards_cross_block_bit_for_bit() {
        let pr = problem(11);
        let x = BasisInputs {
            kxx_b: pr.kxx.as_ref().into(),
            sq_norms: &pr.norms,
            k_tilde: pr.kt.as_ref().into(),
        };
        let z_sq = KernelKind::inducing_sq_norms(pr.a.as_ref(), pr.kt.as_ref());
        for kind in KINDS {
            let p = params_for(kind);
            let (full, cross) = (
                kind.forward(&p, pr.a.as_ref(), &x),
                kind.cross(&p, pr.a.as_ref(), &z_sq, &x),
            );
            let bits = |m: &Mat<f64>| -> Vec<u64> {
                (0..m.nrows())
                    .flat_map(|i| (0..m.ncols()).map(move |j| (i, j)))
                    .map(|(i, j)| m[(i, j)].to_bits())
                    .collect()
            };
            assert_eq!(bits(&full.k_bz), bits(&cross.k_bz), "{kind:?}");
            assert_eq!(full.k_diag, cross.k_diag, "{kind:?}");
            assert_eq!(cross.k_z.nrows(), 0, "no M×M block");
        }
    }

    /// Central difference of F along a perturbation of the problem or parameters.
    fn central(f: &dyn Fn(f64) -> f64) -> f64 {
        let h = 1e-6;
        (f(h) - f(-h)) / (2.0 * h)
    }

    #[test]
    fn gradients_match_central_differences() {
        for kind in KINDS {
            for seed in 0..3 {
                let pr = problem(seed);
                let p = params_for(kind);
                let x = BasisInputs {
                    kxx_b: pr.kxx.as_ref().into(),
                    sq_norms: &pr.norms,
                    k_tilde: pr.kt.as_ref().into(),
                };
                let fwd = kind.forward(&p, pr.a.as_ref(), &x);
                let g = kind.backward(
                    &p,
                    pr.a.as_ref(),
                    &x,
                    &fwd,
                    pr.g_z.as_ref(),
                    pr.g_bz.as_ref(),
                    &pr.g_diag,
                );
                for i in 0..pr.a.nrows() {
                    for j in 0..pr.a.ncols() {
                        let fd = central(&|h| {
                            let mut a = pr.a.clone();
                            a[(i, j)] += h;
                            objective_at(kind, &p, &a, &pr)
                        });
                        assert!(
                            rel(g.a[(i, j)], fd) < 1e-6,
                            "{kind:?} A[{i},{j}]: {} vs {fd}",
                            g.a[(i, j)]
                        );
                    }
                }
                let shifted = |f: &dyn Fn(&mut KernelParams, f64)| {
                    central(&|h| {
                        let mut q = p.clone();
                        f(&mut q, h);
                        objective_at(kind, &q, &pr.a, &pr)
                    })
                };
                let fd_sf = shifted(&|q, h| q.log_sf2 += h);
                assert!(
                    rel(g.log_sf2, fd_sf) < 1e-6,
                    "{kind:?} log σ_f²: {} vs {fd_sf}",
                    g.log_sf2
                );
                let fd_l = shifted(&|q, h| q.log_ell += h);
                assert!(
                    rel(g.log_ell, fd_l) < 1e-6 || (g.log_ell.abs() < 1e-12 && fd_l.abs() < 1e-8),
                    "{kind:?} log ℓ: {} vs {fd_l}",
                    g.log_ell
                );
                if kind == KernelKind::SePlusLinear {
                    let fd_lin = shifted(&|q, h| *q.log_lin2.as_mut().unwrap() += h);
                    assert!(
                        rel(g.log_lin2, fd_lin) < 1e-6,
                        "log σ_lin²: {} vs {fd_lin}",
                        g.log_lin2
                    );
                } else {
                    assert_eq!(g.log_lin2, 0.0);
                }
            }
        }
    }

    /// F as a function of the data inputs Kxx_b, n and K_X̃.
    fn objective_of_inputs(
        kind: KernelKind,
        p: &KernelParams,
        pr: &Problem,
        (kxx, norms, kt): (&Mat<f64>, &[f64], &Mat<f64>),
    ) -> f64 {
        let pr2 = Problem {
            a: pr.a.clone(),
            kxx: kxx.clone(),
            norms: norms.to_vec(),
            kt: kt.clone(),
            g_z: pr.g_z.clone(),
            g_bz: pr.g_bz.clone(),
            g_diag: pr.g_diag.clone(),
        };
        objective_at(kind, p, &pr.a, &pr2)
    }

    #[test]
    fn input_gradients_match_central_differences() {
        for kind in KINDS {
            let pr = problem(4);
            let p = params_for(kind);
            let x = BasisInputs {
                kxx_b: pr.kxx.as_ref().into(),
                sq_norms: &pr.norms,
                k_tilde: pr.kt.as_ref().into(),
            };
            let fwd = kind.forward(&p, pr.a.as_ref(), &x);
            let ig = kind.input_grads(
                &p,
                pr.a.as_ref(),
                &fwd,
                pr.g_z.as_ref(),
                pr.g_bz.as_ref(),
                &pr.g_diag,
                true,
            );
            let at = |kxx: &Mat<f64>, norms: &[f64], kt: &Mat<f64>| {
                objective_of_inputs(kind, &p, &pr, (kxx, norms, kt))
            };
            for i in 0..pr.kxx.nrows() {
                for r in 0..pr.kxx.ncols() {
                    let fd = central(&|h| {
                        let mut k = pr.kxx.clone();
                        k[(i, r)] += h;
                        at(&k, &pr.norms, &pr.kt)
                    });
                    assert!(rel(ig.kxx_b[(i, r)], fd) < 1e-6, "{kind:?} Kxx[{i},{r}]");
                }
                let fd = central(&|h| {
                    let mut n = pr.norms.clone();
                    n[i] += h;
                    at(&pr.kxx, &n, &pr.kt)
                });
                assert!(
                    rel(ig.sq_norms[i], fd) < 1e-6 || (ig.sq_norms[i] == 0.0 && fd.abs() < 1e-8),
                    "{kind:?} n[{i}]: {} vs {fd}",
                    ig.sq_norms[i]
                );
            }
            for r in 0..pr.kt.nrows() {
                for s in 0..pr.kt.ncols() {
                    // Entries as independent (K_X̃ is not symmetrised).
                    let fd = central(&|h| {
                        let mut k = pr.kt.clone();
                        k[(r, s)] += h;
                        at(&pr.kxx, &pr.norms, &k)
                    });
                    assert!(rel(ig.k_tilde[(r, s)], fd) < 1e-6, "{kind:?} K_X̃[{r},{s}]");
                }
            }
        }
    }

    #[test]
    fn se_plus_linear_is_the_sum_of_its_parts() {
        let pr = problem(7);
        let x = BasisInputs {
            kxx_b: pr.kxx.as_ref().into(),
            sq_norms: &pr.norms,
            k_tilde: pr.kt.as_ref().into(),
        };
        let p = params_for(KernelKind::SePlusLinear);
        let sum = KernelKind::SePlusLinear.forward(&p, pr.a.as_ref(), &x);
        let se = KernelKind::SquaredExponential.forward(&p, pr.a.as_ref(), &x);
        let lin = KernelKind::Linear.forward(
            &KernelParams::new(p.log_lin2.unwrap(), 0.0),
            pr.a.as_ref(),
            &x,
        );
        assert!((&sum.k_z - (&se.k_z + &lin.k_z)).norm_max() < 1e-14);
        assert!((&sum.k_bz - (&se.k_bz + &lin.k_bz)).norm_max() < 1e-14);
        for i in 0..sum.k_diag.len() {
            assert!((sum.k_diag[i] - se.k_diag[i] - lin.k_diag[i]).abs() < 1e-14);
        }
        assert!(KernelKind::SePlusLinear.check(&p).is_ok());
        assert!(KernelKind::SePlusLinear
            .check(&KernelParams::new(0.0, 0.0))
            .is_err());
        assert!(KernelKind::Linear.check(&p).is_err());
    }

    #[test]
    fn linear_kernel_equals_explicit_inner_products() {
        // With explicit D-dimensional X̃ and X_b, K_Z = σ_f² Z Zᵀ and K_bZ = σ_f² X_b Zᵀ.
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let (m, r, b, d) = (4, 3, 5, 7);
        let mut u = || rng.random::<f64>() - 0.5;
        let xt = Mat::from_fn(r, d, |_, _| u());
        let xb = Mat::from_fn(b, d, |_, _| u());
        let a = Mat::from_fn(m, r, |_, _| u());
        let z = &a * &xt;
        let kxx = &xb * xt.transpose();
        let kt = &xt * xt.transpose();
        let norms: Vec<f64> = (0..b)
            .map(|i| (0..d).map(|k| xb[(i, k)].powi(2)).sum())
            .collect();
        let x = BasisInputs {
            kxx_b: kxx.as_ref().into(),
            sq_norms: &norms,
            k_tilde: kt.as_ref().into(),
        };
        let p = KernelParams::new(0.7, 0.0);
        let sf2 = 0.7f64.exp();
        let lin = KernelKind::Linear.forward(&p, a.as_ref(), &x);
        assert!((&lin.k_z - (&z * z.transpose()) * faer::Scale(sf2)).norm_max() < 1e-12);
        assert!((&lin.k_bz - (&xb * z.transpose()) * faer::Scale(sf2)).norm_max() < 1e-12);
        let se = KernelKind::SquaredExponential.forward(&p, a.as_ref(), &x);
        for i in 0..b {
            for j in 0..m {
                let d2: f64 = (0..d).map(|k| (xb[(i, k)] - z[(j, k)]).powi(2)).sum();
                assert!((se.k_bz[(i, j)] - sf2 * (-d2 / 2.0).exp()).abs() < 1e-12);
            }
        }
    }
}
