//! The conditional: from q(u) to the marginals q(h_p(x_i)) = N(m_ip, s_ip) of the latent GPs
//! at a set of rows, and back for the gradients. This is the one place where "kernel forward
//! → the factorisation path → the q(u) form's forward pass" is written; the minibatch bound,
//! the exact bound (`bound/objective.rs`) and prediction (`predictive.rs`) all go through it.
//!
//! Each q(u) form ([`QForm`]) is one match arm below; the paper's form is in
//! `qu/sites/mod.rs`, its per-GP algebra in `qu/sites/inducing.rs` (C_p) and `qu/sites/low_rank.rs` (J_p); the
//! full-Cholesky forms are in `qu/cholesky.rs`.

use anyhow::{ensure, Result};
use faer::{Mat, MatRef};

use crate::model::kernel::ard::{warp_inducing, Warp};
use crate::model::kernel::{
    BasisInputs, GramRef, InputGrads, KernelForward, KernelKind, KernelParams,
};
use crate::model::params::{CholFactors, Params, QForm};
use crate::model::qu::axes::{self, on_axes, AxesForward, AxesRows};
use crate::model::qu::cholesky::{self, CholFactorsOnce, CholForward};
use crate::model::qu::sites::low_rank::{self, LowRankFactors};
use crate::model::qu::sites::{self, Factors, VariationalForward, VariationalGrads};
use crate::model::scratch::Scratch;

/// The per-GP algebra of q(u): through C_p = K_Z + Σ_p [M×M] (any kernel), or through
/// J_p = I + Fᵀ Σ_p⁻¹ F [R×R] (linear kernel only, `qu/sites/low_rank.rs`). Both give the same bound
/// and gradients up to rounding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Factorisation {
    /// The low-rank path (J_p) for the linear kernel when it is cheaper
    /// ([`low_rank::worthwhile`]: R ≤ ¾M) and K_X̃ is positive definite; else C_p.
    #[default]
    Auto,
    /// Always C_p = K_Z + Σ_p.
    Inducing,
    /// Always J_p, through K_Z = F Fᵀ (an error for the squared-exponential kernel or a singular K_X̃).
    LowRank,
}

/// Marginal means and variances of the latent GPs at a set of rows.
#[derive(Debug, Clone)]
pub struct Marginals {
    /// m [B×P].
    pub mean: Mat<f64>,
    /// s [B×P].
    pub var: Mat<f64>,
    /// Largest diagonal jitter a Cholesky factorisation needed (0 when none).
    pub jitter: f64,
}

/// The kernel matrices at a set of rows and the path the per-GP algebra takes there.
#[derive(Debug, Clone)]
pub struct Conditional {
    kind: KernelKind,
    form: QForm,
    /// K_Z, K_bZ and k_ii at the rows.
    pub kernel: KernelForward,
    /// The linear kernel's low-rank factors (K_Z = F Fᵀ) when the J_p path was chosen.
    low_rank: Option<LowRankFactors>,
    /// The inputs after subspace ARD's map (`kernel/ard.rs`) when the parameters carry weights;
    /// the kernel and the low-rank factors were evaluated at them.
    warp: Option<Warp>,
    /// With inducing features at the axes (`qu/axes.rs`), the rows themselves: no kernel
    /// matrix is formed (`kernel` is empty).
    axes: Option<AxesRows>,
}

impl Conditional {
    /// The kernel's forward pass at the rows of `x` (no rows for the KL alone), then the
    /// factorisation path `choice` selects for this kernel and shape.
    pub fn new(
        kind: KernelKind,
        params: &Params,
        x: &BasisInputs<'_>,
        choice: Factorisation,
    ) -> Result<Self> {
        check_kernel_params(kind, params, x.k_tilde.dim())?;
        let mut cond = Self::through_inducing(kind, params, x);
        if cond.axes.is_some() {
            ensure!(
                choice != Factorisation::LowRank,
                "the subspace factorisation does not apply to inducing features at the axes"
            );
            return Ok(cond);
        }
        if cond.form != QForm::SiteDiagonal {
            ensure!(
                choice != Factorisation::LowRank,
                "the subspace factorisation applies only to the paper's q(u) form (--q-form \
                 sites), not to --q-form {}",
                cond.form.name()
            );
            return Ok(cond);
        }
        let a = cond.kernel_a(params);
        let xk = cond.kernel_inputs(x);
        cond.low_rank = low_rank_for(kind, params, a, &xk, &cond.kernel, choice)?;
        Ok(cond)
    }

    /// The inducing coordinates the kernel was evaluated at: A, or A' under ARD.
    fn kernel_a<'s>(&'s self, params: &'s Params) -> MatRef<'s, f64> {
        match &self.warp {
            Some(w) => w.a.as_ref(),
            None => params.a.as_ref(),
        }
    }

    /// The data inputs the kernel was evaluated at: `x`, or its transform under ARD.
    fn kernel_inputs<'s>(&'s self, x: &BasisInputs<'s>) -> BasisInputs<'s> {
        match &self.warp {
            Some(w) => w.inputs(x.k_tilde),
            None => *x,
        }
    }

    /// As [`Conditional::new`] with [`Factorisation::Inducing`], for parameters already
    /// checked against the kernel (by [`FactorisedQ::new`] or a [`Conditional::new`]).
    pub fn through_inducing(kind: KernelKind, params: &Params, x: &BasisInputs<'_>) -> Self {
        if on_axes(params) {
            return Self::at_axes(kind, params, x);
        }
        let log_ard = &params.kernel.log_ard;
        let warp = (!log_ard.is_empty()).then(|| Warp::new(log_ard, params.a.as_ref(), x));
        let kernel = match &warp {
            Some(w) => kind.forward(&params.kernel, w.a.as_ref(), &w.inputs(x.k_tilde)),
            None => kind.forward(&params.kernel, params.a.as_ref(), x),
        };
        Conditional {
            kind,
            form: params.q_form(),
            kernel,
            low_rank: None,
            warp,
            axes: None,
        }
    }

    /// Inducing features at the axes: the rows kept as they are, no kernel matrix.
    fn at_axes(kind: KernelKind, params: &Params, x: &BasisInputs<'_>) -> Self {
        Conditional {
            kind,
            form: params.q_form(),
            kernel: KernelForward::empty(),
            low_rank: None,
            warp: None,
            axes: Some(AxesRows::new(&x.kxx_b)),
        }
    }

    /// [`Conditional::through_inducing`] for prediction: only K_bZ and k_ii, from the
    /// inducing inputs' ‖z_m‖² computed once per model (`z_sq`,
    /// `KernelKind::inducing_sq_norms`), which is all [`Conditional::mean_given`] and
    /// [`Conditional::marginals_given`] read. Subspace ARD (whose map warps Z with the rows)
    /// and a missing `z_sq` take the whole forward pass.
    pub fn at_rows(
        kind: KernelKind,
        params: &Params,
        x: &BasisInputs<'_>,
        z_sq: Option<&[f64]>,
    ) -> Self {
        match z_sq {
            Some(z_sq) if params.kernel.log_ard.is_empty() && !on_axes(params) => Conditional {
                kind,
                form: params.q_form(),
                kernel: kind.cross(&params.kernel, params.a.as_ref(), z_sq, x),
                low_rank: None,
                warp: None,
                axes: None,
            },
            _ => Self::through_inducing(kind, params, x),
        }
    }

    /// m = K_bZ w [B×P] alone (ranking needs no variances), with the weights w [M×P] of
    /// [`mean_weights`], computed once per set of parameters.
    pub fn mean_given(&self, weights: MatRef<'_, f64>) -> Mat<f64> {
        match &self.axes {
            Some(rows) => axes::mean_given(rows, weights),
            None => &self.kernel.k_bz * weights,
        }
    }

    /// Marginals, Σ_p KL_p and the per-GP factors [`Conditional::backward`] needs.
    pub fn forward(&self, params: &Params, scratch: &Scratch) -> Result<QForward> {
        if let Some(rows) = &self.axes {
            return Ok(QForward::Axes(axes::forward(params, rows, scratch)?));
        }
        let kf = &self.kernel;
        Ok(match self.form {
            QForm::SiteDiagonal => QForward::SiteDiagonal(sites::forward(
                kf.k_z.as_ref(),
                kf.k_bz.as_ref(),
                &kf.k_diag,
                params.q.mu().as_ref(),
                rho_of(params),
                self.low_rank.as_ref(),
                scratch,
            )?),
            QForm::Cholesky | QForm::Whitened => QForward::Cholesky(Box::new(cholesky::forward(
                kf.k_z.as_ref(),
                kf.k_bz.as_ref(),
                &kf.k_diag,
                params.q.mu().as_ref(),
                chol_of(params),
                scratch,
            )?)),
        })
    }

    /// Marginals only: no KL, nothing kept for a backward pass.
    pub fn marginals(&self, params: &Params, scratch: &Scratch) -> Result<Marginals> {
        if let Some(rows) = &self.axes {
            let (mean, var) = axes::marginals(params, rows)?;
            return Ok(Marginals {
                mean,
                var,
                jitter: 0.0,
            });
        }
        let kf = &self.kernel;
        match self.form {
            QForm::SiteDiagonal => {
                let (mean, var, jitter) = sites::marginals(
                    kf.k_z.as_ref(),
                    kf.k_bz.as_ref(),
                    &kf.k_diag,
                    params.q.mu().as_ref(),
                    rho_of(params),
                    self.low_rank.as_ref(),
                    scratch,
                )?;
                Ok(Marginals { mean, var, jitter })
            }
            QForm::Cholesky | QForm::Whitened => {
                let fwd = cholesky::forward(
                    kf.k_z.as_ref(),
                    kf.k_bz.as_ref(),
                    &kf.k_diag,
                    params.q.mu().as_ref(),
                    chol_of(params),
                    scratch,
                )?;
                let (mean, var, jitter) = (fwd.mean.clone(), fwd.var.clone(), fwd.jitter);
                fwd.recycle(scratch);
                Ok(Marginals { mean, var, jitter })
            }
        }
    }

    /// Σ_p KL_p alone, in the same order as [`Conditional::forward`].
    pub fn kl_total(&self, params: &Params, scratch: &Scratch) -> Result<f64> {
        if self.axes.is_some() {
            return axes::kl_total(params);
        }
        match self.form {
            QForm::SiteDiagonal => sites::kl_total(
                self.kernel.k_z.as_ref(),
                params.q.mu().as_ref(),
                rho_of(params),
                self.low_rank.as_ref(),
                scratch,
            ),
            QForm::Cholesky | QForm::Whitened => cholesky::kl_total(
                self.kernel.k_z.as_ref(),
                params.q.mu().as_ref(),
                chol_of(params),
                scratch,
            ),
        }
    }

    /// Gradients with respect to q(u)'s parameters and the kernel matrices, given ∂F/∂m
    /// `g_mean` and ∂F/∂s `g_var` [B×P] (`fwd` from [`Conditional::forward`]; the axes form
    /// takes the KL's gradients out of it, so a forward pass serves one backward pass).
    /// Without `kernel_grads` the kernel blocks are left empty.
    pub fn backward(
        &self,
        fwd: &mut QForward,
        params: &Params,
        g_mean: MatRef<'_, f64>,
        g_var: MatRef<'_, f64>,
        kernel_grads: bool,
        scratch: &Scratch,
    ) -> VariationalGrads {
        let kf = &self.kernel;
        match fwd {
            QForward::Axes(fwd) => {
                let rows = self
                    .axes
                    .as_ref()
                    .expect("an axes forward pass comes from an axes conditional");
                let g = axes::backward(params, rows, fwd, g_mean, g_var)
                    .expect("the forward pass checked the parameters and kept the KL's gradients");
                let mut vg = VariationalGrads::without_kernel(g.mu, g.rho);
                vg.log_sf2 = g.log_sf2;
                vg
            }
            QForward::SiteDiagonal(fwd) => sites::backward(
                fwd,
                kf.k_z.as_ref(),
                kf.k_bz.as_ref(),
                params.q.mu().as_ref(),
                rho_of(params),
                g_mean,
                g_var,
                kernel_grads,
                self.low_rank.as_ref(),
                scratch,
            ),
            QForward::Cholesky(fwd) => cholesky::backward(
                fwd,
                params.q.mu().as_ref(),
                chol_of(params),
                g_mean,
                g_var,
                kernel_grads,
                scratch,
            ),
        }
    }

    /// The kernel's chain rule from the gradients of [`Conditional::backward`] (with kernel
    /// blocks) to ∂A [M×R] and the hyperparameters, through the low-rank factors too when
    /// that path was taken, and through the ARD map to A and log ω when there is one.
    pub fn kernel_backward(
        &self,
        params: &Params,
        x: &BasisInputs<'_>,
        vg: &VariationalGrads,
    ) -> (Mat<f64>, KernelParams) {
        if self.axes.is_some() {
            // A is [0×D]: nothing to train; σ² is the only hyperparameter.
            let mut g = params.kernel.zeros_like();
            g.log_sf2 = vg.log_sf2;
            return (Mat::zeros(params.a.nrows(), params.a.ncols()), g);
        }
        let xk = self.kernel_inputs(x);
        let kg = self.kind.backward(
            &params.kernel,
            self.kernel_a(params),
            &xk,
            &self.kernel,
            vg.k_z.as_ref(),
            vg.k_bz.as_ref(),
            &vg.k_diag,
        );
        let (mut g_a, mut g_log_sf2) = (kg.a, kg.log_sf2);
        if let Some(sub) = &self.low_rank {
            let (a, log_sf2) = sub.chain(vg.f.as_ref(), vg.g.as_ref());
            g_a += a;
            g_log_sf2 += log_sf2;
        }
        let mut g_log_ard = Vec::new();
        if let Some(w) = &self.warp {
            let ig = self.kind.input_grads(
                &params.kernel,
                w.a.as_ref(),
                &self.kernel,
                vg.k_z.as_ref(),
                vg.k_bz.as_ref(),
                &vg.k_diag,
                false,
            );
            let mut g_kxx = ig.kxx_b;
            if let Some(sub) = &self.low_rank {
                g_kxx += sub.kxx_grad(vg.g.as_ref());
            }
            (g_a, g_log_ard) = w.backward(x, g_a.as_ref(), g_kxx.as_ref(), &ig.sq_norms);
        }
        (
            g_a,
            KernelParams {
                log_sf2: g_log_sf2,
                log_ell: kg.log_ell,
                log_lin2: params.kernel.log_lin2.map(|_| kg.log_lin2),
                log_ard: g_log_ard,
                log_features: Vec::new(),
            },
        )
    }

    /// The kernel's gradients with respect to its data inputs Kxx_b, n and K_X̃
    /// (`KernelKind::input_grads`) from the gradients of [`Conditional::backward`] (with
    /// kernel blocks), for input transforms applied before the conditional (ARD over the
    /// features, `kernel/feature_ard.rs`). An error on the subspace path or under subspace ARD,
    /// whose factors depend on the inputs in ways these gradients leave out.
    pub fn input_grads(&self, params: &Params, vg: &VariationalGrads) -> Result<InputGrads> {
        ensure!(
            self.low_rank.is_none() && self.warp.is_none() && self.axes.is_none(),
            "internal: input gradients are taken through C_p without subspace ARD"
        );
        Ok(self.kind.input_grads(
            &params.kernel,
            params.a.as_ref(),
            &self.kernel,
            vg.k_z.as_ref(),
            vg.k_bz.as_ref(),
            &vg.k_diag,
            true,
        ))
    }

    /// Marginals at these rows given q(u) factorised once ([`FactorisedQ`]).
    pub fn marginals_given(
        &self,
        q: &FactorisedQ,
        params: &Params,
        scratch: &Scratch,
    ) -> (Mat<f64>, Mat<f64>) {
        let kf = &self.kernel;
        match &q.factors {
            QFactors::Axes => {
                let rows = self
                    .axes
                    .as_ref()
                    .expect("axes parameters give an axes conditional");
                axes::marginals(params, rows).expect("FactorisedQ::new checked the parameters")
            }
            QFactors::SiteDiagonal(factors) => factors.marginals(
                kf.k_bz.as_ref(),
                &kf.k_diag,
                params.q.mu().as_ref(),
                scratch,
            ),
            QFactors::Cholesky(factors) => factors.marginals(kf.k_bz.as_ref(), &kf.k_diag, scratch),
        }
    }
}

/// q(u) factorised once for marginals at many sets of rows (prediction), through C_p.
#[derive(Debug, Clone)]
pub struct FactorisedQ {
    factors: QFactors,
}

/// The factors of each q(u) form.
#[derive(Debug, Clone)]
enum QFactors {
    /// Inducing features at the axes: nothing to factorise.
    Axes,
    SiteDiagonal(Factors),
    Cholesky(CholFactorsOnce),
}

impl FactorisedQ {
    /// Factorises q(u) for `params`; `k_tilde` [R×R] is the basis Gram K_X̃ the model was
    /// trained with.
    pub fn new<'g>(
        kind: KernelKind,
        params: &Params,
        k_tilde: impl Into<GramRef<'g>>,
        scratch: &Scratch,
    ) -> Result<Self> {
        let k_tilde = k_tilde.into();
        check_kernel_params(kind, params, k_tilde.dim())?;
        if on_axes(params) {
            axes::check(params, k_tilde.dim())?;
            return Ok(FactorisedQ {
                factors: QFactors::Axes,
            });
        }
        let k_z = inducing_gram(kind, params, k_tilde);
        let factors = match params.q_form() {
            QForm::SiteDiagonal => {
                QFactors::SiteDiagonal(Factors::new(k_z.as_ref(), rho_of(params), scratch)?)
            }
            QForm::Cholesky | QForm::Whitened => QFactors::Cholesky(CholFactorsOnce::new(
                k_z.as_ref(),
                params.q.mu().as_ref(),
                chol_of(params),
                scratch,
            )?),
        };
        Ok(FactorisedQ { factors })
    }

    /// Largest diagonal jitter a factorisation needed (0 when none).
    pub fn jitter(&self) -> f64 {
        match &self.factors {
            QFactors::Axes => 0.0,
            QFactors::SiteDiagonal(f) => f.jitter,
            QFactors::Cholesky(f) => f.jitter,
        }
    }
}

/// K_Z [M×M] of `params` (after subspace ARD's map, if any), for a basis Gram `k_tilde`.
fn inducing_gram(kind: KernelKind, params: &Params, k_tilde: GramRef<'_>) -> Mat<f64> {
    match params.kernel.log_ard.is_empty() {
        true => kind.k_z(&params.kernel, params.a.as_ref(), k_tilde),
        false => {
            let a = warp_inducing(&params.kernel.log_ard, params.a.as_ref(), k_tilde);
            kind.k_z(&params.kernel, a.as_ref(), k_tilde)
        }
    }
}

/// The weights w [M×P] of the marginal means m = K_bZ w ([`Conditional::mean_given`]): μ for
/// the paper's form; for the full-Cholesky forms L_Z⁻ᵀ m (whitened) or K_Z⁻¹ μ, which
/// factorise K_Z (M³/3) — once per set of parameters, not per block of rows. Fails when K_Z
/// cannot be factorised even with jitter (non-finite or far from positive definite
/// parameters): an error, rather than NaN means that would rank labels arbitrarily.
pub fn mean_weights<'g>(
    kind: KernelKind,
    params: &Params,
    k_tilde: impl Into<GramRef<'g>>,
) -> Result<Mat<f64>> {
    if on_axes(params) {
        return Ok(axes::mean_weights(params));
    }
    match params.q_form() {
        QForm::SiteDiagonal => Ok(params.q.mu().clone()),
        QForm::Cholesky | QForm::Whitened => cholesky::mean_weights(
            inducing_gram(kind, params, k_tilde.into()).as_ref(),
            params.q.mu().as_ref(),
            chol_of(params),
            &Scratch::new(),
        ),
    }
}

/// The forward pass of each q(u) form, for [`Conditional::backward`].
#[derive(Debug)]
pub enum QForward {
    Axes(AxesForward),
    SiteDiagonal(VariationalForward),
    Cholesky(Box<CholForward>),
}

impl QForward {
    /// Marginal means m [B×P].
    pub fn mean(&self) -> MatRef<'_, f64> {
        match self {
            QForward::Axes(f) => f.mean.as_ref(),
            QForward::SiteDiagonal(f) => f.mean.as_ref(),
            QForward::Cholesky(f) => f.mean.as_ref(),
        }
    }

    /// Marginal variances s [B×P].
    pub fn var(&self) -> MatRef<'_, f64> {
        match self {
            QForward::Axes(f) => f.var.as_ref(),
            QForward::SiteDiagonal(f) => f.var.as_ref(),
            QForward::Cholesky(f) => f.var.as_ref(),
        }
    }

    /// Σ_p KL_p.
    pub fn kl(&self) -> f64 {
        match self {
            QForward::Axes(f) => f.kl,
            QForward::SiteDiagonal(f) => f.kl,
            QForward::Cholesky(f) => f.kl,
        }
    }

    /// Largest diagonal jitter a factorisation needed (0 when none).
    pub fn jitter(&self) -> f64 {
        match self {
            QForward::Axes(_) => 0.0,
            QForward::SiteDiagonal(f) => f.jitter,
            QForward::Cholesky(f) => f.jitter,
        }
    }

    /// Hands the work buffers back to `scratch` for reuse by later steps.
    pub fn recycle(self, scratch: &Scratch) {
        match self {
            QForward::Axes(_) => {}
            QForward::SiteDiagonal(f) => f.recycle(scratch),
            QForward::Cholesky(f) => f.recycle(scratch),
        }
    }
}

/// The Cholesky factors of a full-Cholesky form's parameters.
fn chol_of(params: &Params) -> &CholFactors {
    params
        .q
        .chol()
        .expect("a full-Cholesky q(u) form holds its factors")
}

/// ρ of the paper's form's parameters.
fn rho_of(params: &Params) -> MatRef<'_, f64> {
    params
        .q
        .rho()
        .expect("the paper's q(u) form holds its sites")
        .as_ref()
}

/// An error unless the parameters hold this kernel's optional hyperparameters and, with
/// ARD, one weight per basis direction (R = `rank`).
fn check_kernel_params(kind: KernelKind, params: &Params, rank: usize) -> Result<()> {
    kind.check(&params.kernel)?;
    ensure!(
        params.kernel.log_features.is_empty(),
        "internal: feature ARD weights act on the inputs first (feature_ard.rs): the \
         conditional takes the weighted inputs and the parameters without the weights"
    );
    let n = params.kernel.log_ard.len();
    ensure!(
        n == 0 || (n == rank && params.a.ncols() == rank),
        "{n} subspace ARD weights for a basis of rank {rank}"
    );
    if on_axes(params) {
        ensure!(
            kind == KernelKind::Linear && n == 0,
            "inducing features at the axes need the linear kernel without subspace ARD"
        );
        ensure!(
            params.q_form() == QForm::SiteDiagonal && params.q.mu().nrows() == rank,
            "internal: inducing features at the axes need the paper's q(u) form with one row \
             per feature ({} rows for a basis of {rank})",
            params.q.mu().nrows()
        );
    }
    Ok(())
}

/// The low-rank factors (K_Z = F Fᵀ) when `choice` selects that path for this kernel and shape, at the
/// kernel's inducing coordinates `a` [M×R] and inputs `x` (after ARD's map, if any: K_Z
/// still factors through the basis then, as A' K_X̃ A'ᵀ). Only the linear kernel's K_Z and
/// K_bZ factor through the basis; the SE part of SE and SE + linear does not.
fn low_rank_for(
    kind: KernelKind,
    params: &Params,
    a: MatRef<'_, f64>,
    x: &BasisInputs<'_>,
    kf: &KernelForward,
    choice: Factorisation,
) -> Result<Option<LowRankFactors>> {
    let (m, r) = (a.nrows(), a.ncols());
    let wanted = match choice {
        Factorisation::Auto => kind == KernelKind::Linear && low_rank::worthwhile(m, r),
        Factorisation::Inducing => false,
        Factorisation::LowRank => {
            ensure!(
                kind == KernelKind::Linear,
                "the subspace factorisation needs the linear kernel"
            );
            true
        }
    };
    if !wanted {
        return Ok(None);
    }
    let sub = LowRankFactors::new(&params.kernel, a, x, &kf.k_diag);
    ensure!(
        sub.is_some() || choice == Factorisation::Auto,
        "the subspace factorisation needs a positive definite K_X̃"
    );
    Ok(sub)
}
