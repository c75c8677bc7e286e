//! The model's state: every trainable parameter, named by a typed [`Block`], and the flat
//! index over all of them that the optimiser's state and the finite-difference tests use
//! (`docs/model.md`).

use std::fmt;

use anyhow::{ensure, Result};
use faer::Mat;

use crate::model::kernel::KernelParams;
use crate::model::likelihood::multiclass::amortiser::Amortiser;

/// All trainable parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// A [M×R]: inducing inputs Z = A X̃.
    pub a: Mat<f64>,
    /// q(u)'s parameters, in one of the forms the model knows.
    pub q: QParams,
    /// Φ [K×P].
    pub phi: Mat<f64>,
    /// b [K].
    pub bias: Vec<f64>,
    pub kernel: KernelParams,
    /// The amortisation network of the augment-and-reduce likelihoods
    /// (`likelihood/multiclass/amortiser.rs`); None for every other likelihood.
    pub amortiser: Option<Amortiser>,
    /// θ = logit ε of robust-max's ε when it is learnt (`--learn-epsilon`); None otherwise
    /// (ε fixed, or another likelihood). `docs/likelihood.md`, "Robust-max".
    pub logit_epsilon: Option<f64>,
}

/// The parameters of q(u), by form ([`QForm`]): each form holds its blocks and no other's.
#[derive(Debug, Clone, PartialEq)]
pub enum QParams {
    /// The paper's form ([`QForm::SiteDiagonal`]).
    Sites {
        /// μ [M×P]: the paper's μ_p (q(u_p) has mean K_Z μ_p).
        mu: Mat<f64>,
        /// ρ [M×P]: Σ_p = diag(softplus(ρ_p) + 10⁻⁶).
        rho: Mat<f64>,
    },
    /// The full-Cholesky forms ([`QForm::Cholesky`], [`QForm::Whitened`], told apart by
    /// `chol.whitened`).
    Full {
        /// μ [M×P]: the mean μ_p of q(u_p), or the whitened mean m_p.
        mu: Mat<f64>,
        /// The factors L_p.
        chol: CholFactors,
    },
}

impl QParams {
    /// μ [M×P], whatever the form (its meaning depends on the form, see [`QParams`]).
    pub fn mu(&self) -> &Mat<f64> {
        match self {
            QParams::Sites { mu, .. } | QParams::Full { mu, .. } => mu,
        }
    }

    pub fn mu_mut(&mut self) -> &mut Mat<f64> {
        match self {
            QParams::Sites { mu, .. } | QParams::Full { mu, .. } => mu,
        }
    }

    /// The form.
    pub fn form(&self) -> QForm {
        match self {
            QParams::Sites { .. } => QForm::SiteDiagonal,
            QParams::Full { chol, .. } if chol.whitened => QForm::Whitened,
            QParams::Full { .. } => QForm::Cholesky,
        }
    }

    /// ρ [M×P] of the paper's form; None for the full-Cholesky forms.
    pub fn rho(&self) -> Option<&Mat<f64>> {
        match self {
            QParams::Sites { rho, .. } => Some(rho),
            QParams::Full { .. } => None,
        }
    }

    /// The factors of the full-Cholesky forms; None for the paper's form.
    pub fn chol(&self) -> Option<&CholFactors> {
        match self {
            QParams::Sites { .. } => None,
            QParams::Full { chol, .. } => Some(chol),
        }
    }

    /// The matrix blocks in the order of the flat index ([`Block::ALL`]): μ, then ρ or L;
    /// mutable.
    fn blocks_mut(&mut self) -> [(Block, &mut Mat<f64>); 2] {
        match self {
            QParams::Sites { mu, rho } => [(Block::Mu, mu), (Block::Rho, rho)],
            QParams::Full { mu, chol } => [(Block::Mu, mu), (Block::CholFactor, &mut chol.packed)],
        }
    }

    /// [`QParams::blocks_mut`], read-only.
    fn blocks(&self) -> [&Mat<f64>; 2] {
        match self {
            QParams::Sites { mu, rho } => [mu, rho],
            QParams::Full { mu, chol } => [mu, &chol.packed],
        }
    }
}

/// The lower-triangular factors L_p [M×M] of a full-Cholesky q(u), one per latent GP, packed
/// (`docs/model.md`, "Full-Cholesky q(u)"): column p of `packed` [M(M+1)/2 × P] holds L_p's
/// lower triangle column by column, (i, j) with i ≥ j at j·M − j(j−1)/2 + (i − j). The
/// diagonal is unconstrained (S_p = L_p L_pᵀ does not change when a column of L_p flips
/// sign, and the KL's −log|L_p,jj| keeps it away from 0).
#[derive(Debug, Clone, PartialEq)]
pub struct CholFactors {
    /// Whitened (u_p = L_Z v_p, q(v_p) = N(μ_p, L_p L_pᵀ)) or not (q(u_p) = N(μ_p, L_p L_pᵀ)).
    pub whitened: bool,
    /// [M(M+1)/2 × P].
    pub packed: Mat<f64>,
}

/// Entries of the packed lower triangle of an M×M matrix.
pub fn packed_len(m: usize) -> usize {
    m * (m + 1) / 2
}

/// Position of (i, j), i ≥ j, in the packed lower triangle of an M×M matrix.
pub fn packed_index(m: usize, i: usize, j: usize) -> usize {
    debug_assert!(i >= j && i < m);
    j * (2 * m + 1 - j) / 2 + (i - j)
}

/// Gradients, same shapes as [`Params`].
pub type Grads = Params;

/// The parametrisations of q(u) the model knows (`docs/model.md`, "Code map"). Each form has
/// its parameter blocks in [`Params`] and one match arm in `qu/conditional.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QForm {
    /// The paper's O(M) form (Panos, Dellaportas & Titsias, *Fully Scalable Gaussian
    /// Processes using Subspace Inducing Inputs*): q(u_p) = N(K_Z μ_p, (K_Z⁻¹ + Σ_p⁻¹)⁻¹),
    /// Σ_p = diag(softplus(ρ_p) + 10⁻⁶); blocks μ and ρ (`qu/sites/mod.rs`).
    SiteDiagonal,
    /// The full Cholesky form of the journal version of the paper and of SVGP (Hensman,
    /// Matthews & Ghahramani, *Scalable Variational Gaussian Process Classification*):
    /// q(u_p) = N(μ_p, L_p L_pᵀ); blocks μ and L (`qu/cholesky.rs`).
    Cholesky,
    /// The same family whitened: u_p = L_Z v_p with K_Z = L_Z L_Zᵀ, q(v_p) = N(μ_p, L_p L_pᵀ)
    /// (μ holds the whitened mean m_p); blocks μ and L (`qu/cholesky.rs`).
    Whitened,
}

impl QForm {
    /// Every form, the default first.
    pub const ALL: [QForm; 3] = [QForm::SiteDiagonal, QForm::Cholesky, QForm::Whitened];

    /// The name used by `train --q-form` and in run configs.
    pub fn name(self) -> &'static str {
        match self {
            QForm::SiteDiagonal => "sites",
            QForm::Cholesky => "cholesky",
            QForm::Whitened => "whitened",
        }
    }

    /// The matrix whose Cholesky factorisation may need jitter, for messages: K_Z + Σ_p
    /// for the site form, K_Z alone for the full-Cholesky forms.
    pub fn factorised(self) -> &'static str {
        match self {
            QForm::SiteDiagonal => "K_Z + Σ",
            QForm::Cholesky | QForm::Whitened => "K_Z",
        }
    }

    /// The form called `name` ([`QForm::name`]), or an error listing the names.
    pub fn parse(name: &str) -> Result<QForm, String> {
        QForm::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| {
                format!("unknown q(u) form {name:?}: expected sites, cholesky or whitened")
            })
    }
}

impl Params {
    /// The parameters without their feature weights (`--ard features`): the model that,
    /// given the weighted inputs of `kernel::feature_ard::FeatureWarp`, is the model with
    /// them.
    pub fn without_feature_weights(&self) -> Params {
        let mut plain = self.clone();
        plain.kernel.log_features = Vec::new();
        plain
    }

    /// The q(u) form these parameters describe.
    pub fn q_form(&self) -> QForm {
        self.q.form()
    }

    /// Keeps μ and makes q(u) a full-Cholesky form with factors `chol` (for tests and
    /// benchmarks).
    pub fn set_full(&mut self, chol: CholFactors) {
        let mu = std::mem::replace(self.q.mu_mut(), Mat::new());
        self.q = QParams::Full { mu, chol };
    }

    /// Keeps μ and makes q(u) the paper's form with sites `rho` (for tests).
    pub fn set_sites(&mut self, rho: Mat<f64>) {
        let mu = std::mem::replace(self.q.mu_mut(), Mat::new());
        self.q = QParams::Sites { mu, rho };
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
    /// The packed Cholesky factors L_p [M(M+1)/2 × P] of the full-Cholesky forms.
    CholFactor,
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
    /// log w [D], ARD weights over the input features (only with `--ard features`).
    LogFeatures,
    /// The amortisation network's weights (augment-and-reduce likelihoods only).
    Amortiser,
    /// logit ε, robust-max's learnt ε (only with `--learn-epsilon`).
    LogitEpsilon,
}

impl Block {
    /// Every block, in the order of the flat index ([`flat_entry`]). `LogLin2`, `LogArd` and
    /// `LogFeatures` hold entries only for the kernels and ARD modes that have them.
    pub const ALL: [Block; 13] = [
        Block::A,
        Block::Mu,
        Block::Rho,
        Block::CholFactor,
        Block::Phi,
        Block::Bias,
        Block::LogSf2,
        Block::LogEll,
        Block::LogLin2,
        Block::LogArd,
        Block::LogFeatures,
        Block::Amortiser,
        Block::LogitEpsilon,
    ];

    /// Whether the block is a kernel hyperparameter (σ's, ℓ, ARD weights; not A): what
    /// `--freeze-hyper` and `--release-hyper-after` hold.
    pub fn is_kernel_hyper(self) -> bool {
        matches!(
            self,
            Block::LogSf2 | Block::LogEll | Block::LogLin2 | Block::LogArd | Block::LogFeatures
        )
    }

    /// The display name ("A", "μ", "ρ", "L", "Φ", "b", "log σ_f²", "log ℓ", "log σ_lin²",
    /// "log ω", "log w", "logit ε"), for messages only.
    pub fn name(self) -> &'static str {
        match self {
            Block::A => "A",
            Block::Mu => "μ",
            Block::Rho => "ρ",
            Block::CholFactor => "L",
            Block::Phi => "Φ",
            Block::Bias => "b",
            Block::LogSf2 => "log σ_f²",
            Block::LogEll => "log ℓ",
            Block::LogLin2 => "log σ_lin²",
            Block::LogArd => "log ω",
            Block::LogFeatures => "log w",
            Block::Amortiser => "amortiser",
            Block::LogitEpsilon => "logit ε",
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
        + p.q.blocks().into_iter().map(mat).sum::<usize>()
        + mat(&p.phi)
        + p.bias.len()
        + 2
        + usize::from(k.log_lin2.is_some())
        + k.log_ard.len()
        + k.log_features.len()
        + p.amortiser.as_ref().map_or(0, Amortiser::len)
        + usize::from(p.logit_epsilon.is_some())
}

/// A mutable reference to a parameter by flat index (for finite-difference checks and the
/// optimiser's state) and its block: the blocks in the order of [`Block::ALL`], each matrix
/// column by column.
pub fn flat_entry(p: &mut Params, mut idx: usize) -> (Block, &mut f64) {
    let [q_first, q_second] = p.q.blocks_mut();
    let blocks = [
        (Block::A, &mut p.a),
        q_first,
        q_second,
        (Block::Phi, &mut p.phi),
    ];
    for (block, m) in blocks {
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
    let scalars = 2 + usize::from(k.log_lin2.is_some());
    match idx - p.bias.len() {
        0 => (Block::LogSf2, &mut k.log_sf2),
        1 => (Block::LogEll, &mut k.log_ell),
        i if i < scalars => (
            Block::LogLin2,
            k.log_lin2.as_mut().expect("counted in scalars"),
        ),
        i if i - scalars < k.log_ard.len() => (Block::LogArd, &mut k.log_ard[i - scalars]),
        i if i - scalars - k.log_ard.len() < k.log_features.len() => (
            Block::LogFeatures,
            &mut k.log_features[i - scalars - k.log_ard.len()],
        ),
        i => {
            let at = i - scalars - k.log_ard.len() - k.log_features.len();
            match p.amortiser.as_mut() {
                Some(net) if at < net.len() => (Block::Amortiser, net.entry_mut(at)),
                _ => (
                    Block::LogitEpsilon,
                    p.logit_epsilon
                        .as_mut()
                        .expect("index within flat_len: the last entry"),
                ),
            }
        }
    }
}

/// Every parameter in the flat order of [`flat_entry`] (blocks in
/// `Block::ALL` order, each matrix column by column).
pub fn flat_values(p: &Params) -> Vec<f64> {
    let mut out = Vec::with_capacity(flat_len(p));
    let [q_first, q_second] = p.q.blocks();
    for m in [&p.a, q_first, q_second, &p.phi] {
        for j in 0..m.ncols() {
            out.extend(m.col(j).iter());
        }
    }
    out.extend(&p.bias);
    let k = &p.kernel;
    out.extend([k.log_sf2, k.log_ell]);
    out.extend(k.log_lin2);
    out.extend(&k.log_ard);
    out.extend(&k.log_features);
    if let Some(net) = &p.amortiser {
        out.extend(net.values());
    }
    out.extend(p.logit_epsilon);
    out
}

/// Writes `values` (in the order of [`flat_values`]) into `p`.
pub fn set_flat(p: &mut Params, values: &[f64]) -> Result<()> {
    ensure!(
        values.len() == flat_len(p),
        "internal: {} values for {} parameters",
        values.len(),
        flat_len(p)
    );
    let mut it = values.iter().copied();
    let mut next = || it.next().expect("length checked above");
    let [(_, q_first), (_, q_second)] = p.q.blocks_mut();
    for m in [&mut p.a, q_first, q_second, &mut p.phi] {
        for j in 0..m.ncols() {
            for x in m.col_mut(j).iter_mut() {
                *x = next();
            }
        }
    }
    for x in p.bias.iter_mut() {
        *x = next();
    }
    let k = &mut p.kernel;
    k.log_sf2 = next();
    k.log_ell = next();
    if let Some(x) = k.log_lin2.as_mut() {
        *x = next();
    }
    for x in k.log_ard.iter_mut().chain(k.log_features.iter_mut()) {
        *x = next();
    }
    if let Some(net) = p.amortiser.as_mut() {
        let copy = net.clone();
        net.zip_mut(&copy, |x, _| *x = next());
    }
    if let Some(x) = p.logit_epsilon.as_mut() {
        *x = next();
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Parameters with every block present, each entry distinct.
    pub(crate) fn every_block() -> Params {
        let counter = std::cell::Cell::new(0.0);
        let mat = |r, c| {
            Mat::from_fn(r, c, |_, _| {
                counter.set(counter.get() + 1.0);
                counter.get()
            })
        };
        Params {
            logit_epsilon: Some(-2.5),
            a: mat(3, 2),
            q: QParams::Full {
                mu: mat(3, 2),
                chol: CholFactors {
                    whitened: true,
                    packed: mat(6, 2),
                },
            },
            phi: mat(4, 2),
            bias: vec![-1.0, -2.0, -3.0, -4.0],
            kernel: KernelParams {
                log_sf2: 0.5,
                log_ell: 0.25,
                log_lin2: Some(0.125),
                log_ard: vec![7.0, 8.0],
                log_features: vec![9.0],
            },
            amortiser: Some(Amortiser::init(2, 3, &[0.5], 1)),
        }
    }

    #[test]
    fn flat_values_follow_flat_entry_and_round_trip() {
        let mut p = every_block();
        let flat = flat_values(&p);
        assert_eq!(flat.len(), flat_len(&p));
        for (i, v) in flat.iter().enumerate() {
            assert_eq!(*flat_entry(&mut p, i).1, *v, "entry {i}");
        }
        let doubled: Vec<f64> = flat.iter().map(|v| 2.0 * v).collect();
        set_flat(&mut p, &doubled).unwrap();
        assert_eq!(flat_values(&p), doubled);
        assert!(set_flat(&mut p, &doubled[1..]).is_err());
    }
}
