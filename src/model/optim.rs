//! Adam (Kingma & Ba 2015) over the flat parameter vector of [`Params`], maximising the bound.
//!
//! With gradient g_t of the objective being *maximised*:
//! m_t = β1 m_{t−1} + (1−β1) g_t, v_t = β2 v_{t−1} + (1−β2) g_t²,
//! θ_t = θ_{t−1} + η m̂_t / (√v̂_t + ε), m̂_t = m_t / (1−β1ᵗ), v̂_t = v_t / (1−β2ᵗ).
//! The state (m, v, t) is part of a checkpoint so a resumed run continues bit for bit.

#[cfg(doc)]
use crate::model::params::flat_entry;
use crate::model::params::{flat_len, Block, Params, QParams};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// Adam's moving averages, flat in the order of [`flat_entry`].
#[derive(Debug, Clone, PartialEq)]
pub struct AdamState {
    pub m: Vec<f64>,
    pub v: Vec<f64>,
    /// Steps taken.
    pub t: u64,
}

impl AdamState {
    pub fn new(params: &Params) -> Self {
        let n = flat_len(params);
        AdamState {
            m: vec![0.0; n],
            v: vec![0.0; n],
            t: 0,
        }
    }

    /// One ascent step on `params` with gradient `grads`. Entries of the blocks for which
    /// `frozen` returns true are left unchanged.
    pub fn step(
        &mut self,
        cfg: &AdamConfig,
        params: &mut Params,
        grads: &Params,
        frozen: &dyn Fn(Block) -> bool,
    ) {
        self.step_scheduled(cfg, params, grads, &|block| (!frozen(block)).then_some(0));
    }

    /// One ascent step where `start(block)` is None for a block left unchanged and Some(t₀)
    /// for a block trained since step t₀ (0: from the start). A block released at t₀ has
    /// moments that were never updated (zero) and gets the bias corrections of an Adam
    /// started then, c = 1 − βᵗ⁻ᵗ⁰, so its first steps are as large as a fresh start's.
    ///
    /// Walks the blocks in the order of [`flat_entry`] (each matrix column by column), so
    /// the flat index of every entry, and the arithmetic, are those of a per-index loop.
    pub fn step_scheduled(
        &mut self,
        cfg: &AdamConfig,
        params: &mut Params,
        grads: &Params,
        start: &dyn Fn(Block) -> Option<u64>,
    ) {
        self.t += 1;
        let t = self.t;
        let coef_of = |block: Block| {
            start(block).map(|t0| {
                let steps = t.saturating_sub(t0) as i32;
                Coefficients {
                    cfg: *cfg,
                    c1: 1.0 - cfg.beta1.powi(steps),
                    c2: 1.0 - cfg.beta2.powi(steps),
                }
            })
        };
        let mut idx = 0;
        // q(u)'s blocks: μ, then ρ (the paper's form) or the factors L (the full-Cholesky
        // forms).
        let ((mu, g_mu), (second, second_block, g_second)) = match (&mut params.q, &grads.q) {
            (QParams::Sites { mu, rho }, QParams::Sites { mu: gm, rho: gr }) => {
                ((mu, gm), (rho, Block::Rho, gr))
            }
            (QParams::Full { mu, chol }, QParams::Full { mu: gm, chol: gc }) => {
                ((mu, gm), (&mut chol.packed, Block::CholFactor, &gc.packed))
            }
            _ => panic!("internal: gradients of another q(u) form than the parameters'"),
        };
        for (block, p, g) in [
            (Block::A, &mut params.a, &grads.a),
            (Block::Mu, mu, g_mu),
            (second_block, second, g_second),
            (Block::Phi, &mut params.phi, &grads.phi),
        ] {
            let (rows, cols) = (p.nrows(), p.ncols());
            if let Some(coef) = coef_of(block) {
                for j in 0..cols {
                    let (pc, gc) = (p.col_mut(j), g.col(j));
                    for (i, theta) in pc.iter_mut().enumerate() {
                        self.update(idx + j * rows + i, gc[i], theta, &coef);
                    }
                }
            }
            idx += rows * cols;
        }
        if let Some(coef) = coef_of(Block::Bias) {
            for (k, theta) in params.bias.iter_mut().enumerate() {
                self.update(idx + k, grads.bias[k], theta, &coef);
            }
        }
        idx += params.bias.len();
        let (pk, gk) = (&mut params.kernel, &grads.kernel);
        let mut scalars = vec![
            (Block::LogSf2, &mut pk.log_sf2, gk.log_sf2),
            (Block::LogEll, &mut pk.log_ell, gk.log_ell),
        ];
        if let (Some(theta), Some(g)) = (pk.log_lin2.as_mut(), gk.log_lin2) {
            scalars.push((Block::LogLin2, theta, g));
        }
        for (theta, &g) in pk.log_ard.iter_mut().zip(&gk.log_ard) {
            scalars.push((Block::LogArd, theta, g));
        }
        for (theta, &g) in pk.log_features.iter_mut().zip(&gk.log_features) {
            scalars.push((Block::LogFeatures, theta, g));
        }
        if let (Some(theta), Some(g)) = (params.logit_epsilon.as_mut(), grads.logit_epsilon) {
            scalars.push((Block::LogitEpsilon, theta, g));
        }
        for (block, theta, g) in scalars {
            if let Some(coef) = coef_of(block) {
                self.update(idx, g, theta, &coef);
            }
            idx += 1;
        }
        // The amortisation network (augment-and-reduce likelihoods only), last.
        if let (Some(net), Some(g_net)) = (params.amortiser.as_mut(), grads.amortiser.as_ref()) {
            let coef = coef_of(Block::Amortiser);
            net.zip_mut(g_net, |theta, g| {
                if let Some(coef) = &coef {
                    self.update(idx, g, theta, coef);
                }
                idx += 1;
            });
        }
        debug_assert_eq!(idx, self.m.len());
    }

    /// Adam's update of the entry at flat index `idx`.
    #[inline(always)]
    fn update(&mut self, idx: usize, g: f64, theta: &mut f64, k: &Coefficients) {
        let cfg = &k.cfg;
        self.m[idx] = cfg.beta1 * self.m[idx] + (1.0 - cfg.beta1) * g;
        self.v[idx] = cfg.beta2 * self.v[idx] + (1.0 - cfg.beta2) * g * g;
        *theta += cfg.lr * (self.m[idx] / k.c1) / ((self.v[idx] / k.c2).sqrt() + cfg.eps);
    }
}

/// The configuration and this step's bias corrections c1 = 1 − β1ᵗ, c2 = 1 − β2ᵗ.
struct Coefficients {
    cfg: AdamConfig,
    c1: f64,
    c2: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernel::KernelParams;
    use crate::model::likelihood::multiclass::amortiser::Amortiser;
    use faer::Mat;

    fn params(x: f64) -> Params {
        Params {
            logit_epsilon: None,
            a: Mat::from_fn(1, 1, |_, _| x),
            q: QParams::Sites {
                mu: Mat::zeros(1, 1),
                rho: Mat::zeros(1, 1),
            },
            phi: Mat::zeros(1, 1),
            bias: vec![0.0],
            kernel: KernelParams::new(0.0, 0.0),
            amortiser: None,
        }
    }

    /// The per-index form Adam had before it walked the blocks: the reference.
    fn reference_step(
        st: &mut AdamState,
        cfg: &AdamConfig,
        params: &mut Params,
        grads: &Params,
        frozen: &dyn Fn(Block) -> bool,
    ) {
        use crate::model::params::flat_entry;
        st.t += 1;
        let t = st.t as i32;
        let (c1, c2) = (1.0 - cfg.beta1.powi(t), 1.0 - cfg.beta2.powi(t));
        let mut grads = grads.clone();
        for idx in 0..st.m.len() {
            let (block, g) = flat_entry(&mut grads, idx);
            if frozen(block) {
                continue;
            }
            let g = *g;
            st.m[idx] = cfg.beta1 * st.m[idx] + (1.0 - cfg.beta1) * g;
            st.v[idx] = cfg.beta2 * st.v[idx] + (1.0 - cfg.beta2) * g * g;
            let update = cfg.lr * (st.m[idx] / c1) / ((st.v[idx] / c2).sqrt() + cfg.eps);
            *flat_entry(params, idx).1 += update;
        }
    }

    #[test]
    fn block_walk_is_bitwise_the_per_index_update() {
        let mut k = 0u64;
        // Deterministic pseudo-random entries, different for every call.
        let mut next = move || {
            k = k
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((k >> 11) as f64 / (1u64 << 53) as f64) - 0.5
        };
        let mut random = |rows: usize, cols: usize| Mat::from_fn(rows, cols, |_, _| next());
        let mut p = Params {
            logit_epsilon: None,
            a: random(3, 2),
            q: QParams::Sites {
                mu: random(3, 4),
                rho: random(3, 4),
            },
            phi: random(5, 4),
            bias: vec![0.1, -0.2, 0.3, 0.0, 0.5],
            kernel: KernelParams {
                log_lin2: Some(0.05),
                log_ard: vec![0.3, -0.2],
                ..KernelParams::new(0.2, -0.1)
            },
            amortiser: Some(Amortiser::init(2, 3, &[0.1], 5)),
        };
        let grads: Vec<Params> = (0..4u64)
            .map(|g| Params {
                logit_epsilon: None,
                a: random(3, 2),
                q: QParams::Sites {
                    mu: random(3, 4),
                    rho: random(3, 4),
                },
                phi: random(5, 4),
                bias: vec![0.4, 0.1, -0.3, 0.2, -0.5],
                kernel: KernelParams {
                    log_lin2: Some(0.9),
                    log_ard: vec![-0.6, 0.25],
                    ..KernelParams::new(-0.3, 0.7)
                },
                amortiser: Some(Amortiser::init(2, 3, &[0.3], 100 + g)),
            })
            .collect();
        let cfg = AdamConfig::default();
        let frozen = |block: Block| block == Block::Rho || block == Block::LogEll;
        assert_eq!(flat_len(&p), 6 + 12 + 12 + 20 + 5 + 2 + 1 + 2 + 25);
        let (mut p_ref, mut st_ref, mut st) = (p.clone(), AdamState::new(&p), AdamState::new(&p));
        for g in &grads {
            st.step(&cfg, &mut p, g, &frozen);
            reference_step(&mut st_ref, &cfg, &mut p_ref, g, &frozen);
        }
        assert_eq!(p, p_ref);
        assert_eq!(st, st_ref);
    }

    /// Long columns (Φ of 9 000 labels) on a pool of two threads: the bits of the per-index
    /// update.
    #[test]
    fn long_columns_on_two_threads_are_bitwise_the_per_index_update() {
        let wave = |rows: usize, cols: usize, phase: f64| {
            Mat::from_fn(rows, cols, |i, j| {
                ((i * 7 + j * 13) as f64 * 0.37 + phase).sin()
            })
        };
        let at = |phase: f64| Params {
            logit_epsilon: None,
            a: wave(2, 1, phase),
            q: QParams::Sites {
                mu: wave(4500, 2, phase + 1.0),
                rho: wave(4500, 2, phase + 2.0),
            },
            phi: wave(9000, 2, phase + 3.0),
            bias: (0..9000).map(|k| (k as f64 + phase).cos()).collect(),
            kernel: KernelParams::new(0.1, 0.2),
            amortiser: None,
        };
        let mut p = at(0.0);
        let cfg = AdamConfig::default();
        let (mut p_ref, mut st_ref, mut st) = (p.clone(), AdamState::new(&p), AdamState::new(&p));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for step in 0..3 {
            let g = at(10.0 + step as f64);
            pool.install(|| st.step(&cfg, &mut p, &g, &|_| false));
            reference_step(&mut st_ref, &cfg, &mut p_ref, &g, &|_| false);
        }
        assert_eq!(p, p_ref);
        assert_eq!(st, st_ref);
    }

    #[test]
    fn first_step_moves_by_lr_in_the_gradient_sign() {
        // With bias correction, m̂_1 = g and v̂_1 = g², so the first step is lr·g/(|g|+ε).
        let cfg = AdamConfig::default();
        let mut p = params(1.0);
        let mut g = params(-3.0);
        g.bias[0] = 0.5;
        let mut st = AdamState::new(&p);
        st.step(&cfg, &mut p, &g, &|_| false);
        assert!((p.a[(0, 0)] - (1.0 - cfg.lr * 3.0 / (3.0 + cfg.eps))).abs() < 1e-15);
        assert!((p.bias[0] - cfg.lr * 0.5 / (0.5 + cfg.eps)).abs() < 1e-15);
        assert_eq!(st.t, 1);
    }

    #[test]
    fn maximises_a_concave_quadratic_and_respects_frozen_blocks() {
        // F = −(a − 3)² − (b + 1)²: maximum at a = 3, b = −1; b frozen stays put.
        let cfg = AdamConfig {
            lr: 0.05,
            ..AdamConfig::default()
        };
        let mut p = params(0.0);
        let mut st = AdamState::new(&p);
        for _ in 0..3000 {
            let mut g = params(-2.0 * (p.a[(0, 0)] - 3.0));
            g.bias[0] = -2.0 * (p.bias[0] + 1.0);
            st.step(&cfg, &mut p, &g, &|block| block == Block::Bias);
        }
        assert!((p.a[(0, 0)] - 3.0).abs() < 1e-3, "{}", p.a[(0, 0)]);
        assert_eq!(p.bias[0], 0.0);
    }

    #[test]
    fn a_block_released_later_starts_like_a_fresh_adam() {
        // Frozen for 5 steps, then released: its first step is lr·g/(|g|+ε), as at step 1
        // of a fresh run, while A (trained throughout) has its own corrections.
        let cfg = AdamConfig::default();
        let mut p = params(1.0);
        let mut g = params(-3.0);
        g.bias[0] = 0.5;
        let mut st = AdamState::new(&p);
        let release = 5;
        for step in 0..release + 1 {
            let before = p.bias[0];
            st.step_scheduled(&cfg, &mut p, &g, &|b| match b {
                Block::Bias => (step >= release).then_some(release),
                _ => Some(0),
            });
            if step < release {
                assert_eq!(p.bias[0], before);
            }
        }
        assert!((p.bias[0] - cfg.lr * 0.5 / (0.5 + cfg.eps)).abs() < 1e-15);
        // The same as a global-corrections step would not be: the moments started at zero.
        let mut q = params(1.0);
        let mut st2 = AdamState::new(&q);
        for _ in 0..release + 1 {
            st2.step(&cfg, &mut q, &g, &|_| false);
        }
        assert_eq!(q.a, p.a, "A's corrections do not depend on the schedule");
    }
}
