//! The model's state: every trainable parameter, named by a typed [`Block`], and the flat
//! index over all of them that the optimiser's state and the finite-difference tests use
//! (`docs/model.md`).

use std::fmt;

use faer::Mat;

use super::kernel::KernelParams;

/// All trainable parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// A [M×R]: inducing inputs Z = A X̃.
    pub a: Mat<f64>,
    /// μ [M×P].
    pub mu: Mat<f64>,
    /// ρ [M×P]: Σ_p = diag(softplus(ρ_p) + 10⁻⁶).
    pub rho: Mat<f64>,
    /// Φ [K×P].
    pub phi: Mat<f64>,
    /// b [K].
    pub bias: Vec<f64>,
    pub kernel: KernelParams,
}

/// Gradients, same shapes as [`Params`].
pub type Grads = Params;

/// The parametrisations of q(u) the model knows (`docs/model.md`, "Code map"). Each form has
/// its parameter blocks in [`Params`] and one match arm in `conditional.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QForm {
    /// The paper's O(M) form (Panos, Dellaportas & Titsias, *Fully Scalable Gaussian
    /// Processes using Subspace Inducing Inputs*): q(u_p) = N(K_Z μ_p, (K_Z⁻¹ + Σ_p⁻¹)⁻¹),
    /// Σ_p = diag(softplus(ρ_p) + 10⁻⁶); blocks μ and ρ (`variational.rs`).
    SiteDiagonal,
}

impl Params {
    /// The q(u) form these parameters describe: every [`Params`] holds the paper's μ and ρ.
    pub fn q_form(&self) -> QForm {
        QForm::SiteDiagonal
    }
}

/// One block of [`Params`]: what the optimiser freezes, what reports name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Block {
    /// A [M×R].
    A,
    /// μ [M×P].
    Mu,
    /// ρ [M×P].
    Rho,
    /// Φ [K×P].
    Phi,
    /// b [K].
    Bias,
    /// log σ_f².
    LogSf2,
    /// log ℓ.
    LogEll,
    /// log σ_lin² (SE + linear only).
    LogLin2,
    /// log ω [R], subspace ARD weights (only with ARD).
    LogArd,
}

impl Block {
    /// Every block, in the order of the flat index ([`flat_entry`]). `LogLin2` and `LogArd`
    /// hold entries only for the kernels and ARD modes that have them.
    pub const ALL: [Block; 9] = [
        Block::A,
        Block::Mu,
        Block::Rho,
        Block::Phi,
        Block::Bias,
        Block::LogSf2,
        Block::LogEll,
        Block::LogLin2,
        Block::LogArd,
    ];

    /// Whether the block is a kernel hyperparameter (σ's, ℓ, ARD weights; not A): what
    /// `--freeze-hyper` and `--release-hyper-after` hold.
    pub fn is_kernel_hyper(self) -> bool {
        matches!(
            self,
            Block::LogSf2 | Block::LogEll | Block::LogLin2 | Block::LogArd
        )
    }

    /// The display name ("A", "μ", "ρ", "Φ", "b", "log σ_f²", "log ℓ", "log σ_lin²",
    /// "log ω"), for messages only.
    pub fn name(self) -> &'static str {
        match self {
            Block::A => "A",
            Block::Mu => "μ",
            Block::Rho => "ρ",
            Block::Phi => "Φ",
            Block::Bias => "b",
            Block::LogSf2 => "log σ_f²",
            Block::LogEll => "log ℓ",
            Block::LogLin2 => "log σ_lin²",
            Block::LogArd => "log ω",
        }
    }
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The number of scalar parameters (see [`flat_entry`]).
pub fn flat_len(p: &Params) -> usize {
    let mat = |m: &Mat<f64>| m.nrows() * m.ncols();
    let k = &p.kernel;
    mat(&p.a)
        + mat(&p.mu)
        + mat(&p.rho)
        + mat(&p.phi)
        + p.bias.len()
        + 2
        + usize::from(k.log_lin2.is_some())
        + k.log_ard.len()
}

/// A mutable reference to a parameter by flat index (for finite-difference checks and the
/// optimiser's state) and its block: the blocks in the order of [`Block::ALL`], each matrix
/// column by column.
pub fn flat_entry(p: &mut Params, mut idx: usize) -> (Block, &mut f64) {
    for (block, m) in [
        (Block::A, &mut p.a),
        (Block::Mu, &mut p.mu),
        (Block::Rho, &mut p.rho),
        (Block::Phi, &mut p.phi),
    ] {
        let n = m.nrows() * m.ncols();
        if idx < n {
            let rows = m.nrows();
            return (block, &mut m[(idx % rows, idx / rows)]);
        }
        idx -= n;
    }
    if idx < p.bias.len() {
        return (Block::Bias, &mut p.bias[idx]);
    }
    let k = &mut p.kernel;
    match idx - p.bias.len() {
        0 => (Block::LogSf2, &mut k.log_sf2),
        1 => (Block::LogEll, &mut k.log_ell),
        i => match k.log_lin2.as_mut() {
            Some(lin2) if i == 2 => (Block::LogLin2, lin2),
            Some(_) => (Block::LogArd, &mut k.log_ard[i - 3]),
            None => (Block::LogArd, &mut k.log_ard[i - 2]),
        },
    }
}
