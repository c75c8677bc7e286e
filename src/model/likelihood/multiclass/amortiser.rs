//! The amortisation network of the augment-and-reduce likelihoods (Ruiz, Titsias, Dieng &
//! Blei, *Augment and Reduce: Stochastic Inference for Large Categorical Distributions*):
//! each row's local variational parameters are not free per-row parameters but the outputs
//! of one small network applied to the row as the model sees it (`docs/likelihood.md`,
//! "Augment and reduce").
//!
//! Two tanh hidden layers of width H on an input x_i [D_in], O linear outputs; for a
//! minibatch X [B×D_in] (one row per row of the batch):
//! H₁ = tanh(X W₁ + 1 c₁ᵀ) [B×H], H₂ = tanh(H₁ W₂ + 1 c₂ᵀ) [B×H], O = H₂ W₃ + 1 c₃ᵀ [B×O].
//! The likelihood maps its row of O to its local parameters (e.g. α = 1 + softplus(o)).
//! Backpropagation of G = ∂F/∂O [B×O], all GEMMs over the minibatch:
//! ∂W₃ = H₂ᵀ G, ∂c₃ = Gᵀ1, G₂ = (G W₃ᵀ) ∘ (1 − H₂²), ∂W₂ = H₁ᵀ G₂, ∂c₂ = G₂ᵀ1,
//! G₁ = (G₂ W₂ᵀ) ∘ (1 − H₁²), ∂W₁ = Xᵀ G₁, ∂c₁ = G₁ᵀ1.
//! Cost per step: 2·B·(D_in·H + H² + H·O) flops forward, twice that backward.

use faer::{Mat, MatRef};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::linalg::{clear_upper_simd_state, product};

/// The default width H of the hidden layers (`--amortiser-hidden`).
pub const DEFAULT_HIDDEN: usize = 32;

/// The network's weights: W₁ [D_in×H], c₁ [H], W₂ [H×H], c₂ [H], W₃ [H×O], c₃ [O]. Also the
/// shape of their gradients. The flat order (optimiser, finite differences, `params.rs`)
/// is W₁, c₁, W₂, c₂, W₃, c₃, each matrix column by column.
#[derive(Debug, Clone, PartialEq)]
pub struct Amortiser {
    pub w1: Mat<f64>,
    pub c1: Vec<f64>,
    pub w2: Mat<f64>,
    pub c2: Vec<f64>,
    pub w3: Mat<f64>,
    pub c3: Vec<f64>,
}

/// The hidden activations of one forward pass, kept for the backward pass.
#[derive(Debug, Clone)]
pub struct AmortiserForward {
    /// H₁ [B×H].
    h1: Mat<f64>,
    /// H₂ [B×H].
    h2: Mat<f64>,
    /// O [B×O].
    pub out: Mat<f64>,
}

/// `x W + 1 cᵀ` [B×n_out].
fn affine(x: MatRef<'_, f64>, w: &Mat<f64>, c: &[f64]) -> Mat<f64> {
    let mut z = product(x, w.as_ref());
    for (j, cj) in c.iter().enumerate() {
        for v in z.col_mut(j).iter_mut() {
            *v += cj;
        }
    }
    z
}

/// Column sums of `g` [B×n] in row order.
fn column_sums(g: &Mat<f64>) -> Vec<f64> {
    (0..g.ncols())
        .map(|j| g.col(j).iter().sum::<f64>())
        .collect()
}

/// `g ∘ (1 − h²)`: the gradient through tanh from its output h.
fn through_tanh(mut g: Mat<f64>, h: &Mat<f64>) -> Mat<f64> {
    for j in 0..g.ncols() {
        for (gv, hv) in g.col_mut(j).iter_mut().zip(h.col(j).iter()) {
            *gv *= 1.0 - hv * hv;
        }
    }
    g
}

impl Amortiser {
    /// A network of `inputs` → `hidden` → `hidden` → `outputs`, drawn from `seed`: W₁ and W₂
    /// with N(0, 1/n_in) entries (unit-scale tanh inputs for unit-scale rows), W₃ with
    /// N(0, 0.01/H) entries so that the outputs start near their biases, c₁ = c₂ = 0 and
    /// c₃ = `out_bias` [O] (the likelihood's choice of starting local parameters).
    pub fn init(inputs: usize, hidden: usize, out_bias: &[f64], seed: u64) -> Amortiser {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut draw = |rows: usize, cols: usize, sd: f64| {
            let mut m = Mat::zeros(rows, cols);
            for j in 0..cols {
                for i in 0..rows {
                    let e: f64 = StandardNormal.sample(&mut rng);
                    m[(i, j)] = sd * e;
                }
            }
            m
        };
        let w1 = draw(inputs, hidden, 1.0 / (inputs.max(1) as f64).sqrt());
        let w2 = draw(hidden, hidden, 1.0 / (hidden as f64).sqrt());
        let w3 = draw(hidden, out_bias.len(), 0.1 / (hidden as f64).sqrt());
        Amortiser {
            w1,
            c1: vec![0.0; hidden],
            w2,
            c2: vec![0.0; hidden],
            w3,
            c3: out_bias.to_vec(),
        }
    }

    /// D_in.
    pub fn inputs(&self) -> usize {
        self.w1.nrows()
    }

    /// H.
    pub fn hidden(&self) -> usize {
        self.w1.ncols()
    }

    /// O.
    pub fn outputs(&self) -> usize {
        self.w3.ncols()
    }

    /// Whether the shapes chain: W₁ [D_in×H], c₁ [H], W₂ [H×H], c₂ [H], W₃ [H×O], c₃ [O].
    pub fn shapes_agree(&self) -> bool {
        let h = self.hidden();
        self.c1.len() == h
            && self.w2.nrows() == h
            && self.w2.ncols() == h
            && self.c2.len() == h
            && self.w3.nrows() == h
            && self.c3.len() == self.outputs()
    }

    /// The number of weights.
    pub fn len(&self) -> usize {
        let (d, h, o) = (self.inputs(), self.hidden(), self.outputs());
        d * h + h + h * h + h + h * o + o
    }

    /// Whether the network has no weights (never, for a built one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Zeros of the same shapes (a gradient to accumulate into).
    pub fn zeros_like(&self) -> Amortiser {
        let (d, h, o) = (self.inputs(), self.hidden(), self.outputs());
        Amortiser {
            w1: Mat::zeros(d, h),
            c1: vec![0.0; h],
            w2: Mat::zeros(h, h),
            c2: vec![0.0; h],
            w3: Mat::zeros(h, o),
            c3: vec![0.0; o],
        }
    }

    /// Every weight in the flat order (W₁, c₁, W₂, c₂, W₃, c₃, matrices column by column).
    pub fn values(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.len());
        let mat = |m: &Mat<f64>, out: &mut Vec<f64>| {
            for j in 0..m.ncols() {
                out.extend(m.col(j).iter());
            }
        };
        mat(&self.w1, &mut out);
        out.extend(&self.c1);
        mat(&self.w2, &mut out);
        out.extend(&self.c2);
        mat(&self.w3, &mut out);
        out.extend(&self.c3);
        out
    }

    /// Calls `f(weight, other's weight)` for every weight in the flat order, `other` of the
    /// same shapes (the optimiser's walk over weights and gradients).
    pub fn zip_mut(&mut self, other: &Amortiser, mut f: impl FnMut(&mut f64, f64)) {
        zip_mat(&mut self.w1, &other.w1, &mut f);
        zip_vec(&mut self.c1, &other.c1, &mut f);
        zip_mat(&mut self.w2, &other.w2, &mut f);
        zip_vec(&mut self.c2, &other.c2, &mut f);
        zip_mat(&mut self.w3, &other.w3, &mut f);
        zip_vec(&mut self.c3, &other.c3, &mut f);
    }

    /// The weight at flat index `idx` (< [`Amortiser::len`]).
    pub fn entry_mut(&mut self, mut idx: usize) -> &mut f64 {
        let (h, o) = (self.hidden(), self.outputs());
        let sizes = [self.inputs() * h, h, h * h, h, h * o, o];
        let mut part = 0;
        while idx >= sizes[part] {
            idx -= sizes[part];
            part += 1;
        }
        let at = |m: &mut Mat<f64>, idx: usize| {
            let rows = m.nrows();
            (idx % rows, idx / rows)
        };
        match part {
            0 => {
                let (i, j) = at(&mut self.w1, idx);
                &mut self.w1[(i, j)]
            }
            1 => &mut self.c1[idx],
            2 => {
                let (i, j) = at(&mut self.w2, idx);
                &mut self.w2[(i, j)]
            }
            3 => &mut self.c2[idx],
            4 => {
                let (i, j) = at(&mut self.w3, idx);
                &mut self.w3[(i, j)]
            }
            _ => &mut self.c3[idx],
        }
    }

    /// The forward pass on the rows `x` [B×D_in].
    pub fn forward(&self, x: MatRef<'_, f64>) -> AmortiserForward {
        assert_eq!(x.ncols(), self.inputs(), "amortiser input width");
        let mut h1 = affine(x, &self.w1, &self.c1);
        tanh_in_place(&mut h1);
        let mut h2 = affine(h1.as_ref(), &self.w2, &self.c2);
        tanh_in_place(&mut h2);
        let out = affine(h2.as_ref(), &self.w3, &self.c3);
        AmortiserForward { h1, h2, out }
    }

    /// The weights' gradient from G = ∂F/∂O [B×O] (see the module docs).
    pub fn backward(
        &self,
        x: MatRef<'_, f64>,
        fwd: &AmortiserForward,
        g_out: &Mat<f64>,
    ) -> Amortiser {
        let w3 = product(fwd.h2.as_ref().transpose(), g_out.as_ref());
        let c3 = column_sums(g_out);
        let g2 = through_tanh(
            product(g_out.as_ref(), self.w3.as_ref().transpose()),
            &fwd.h2,
        );
        let w2 = product(fwd.h1.as_ref().transpose(), g2.as_ref());
        let c2 = column_sums(&g2);
        let g1 = through_tanh(product(g2.as_ref(), self.w2.as_ref().transpose()), &fwd.h1);
        let w1 = product(x.transpose(), g1.as_ref());
        let c1 = column_sums(&g1);
        Amortiser {
            w1,
            c1,
            w2,
            c2,
            w3,
            c3,
        }
    }
}

/// `f(x, g)` over a matrix's entries, column by column.
fn zip_mat(m: &mut Mat<f64>, g: &Mat<f64>, f: &mut impl FnMut(&mut f64, f64)) {
    for j in 0..m.ncols() {
        for (x, y) in m.col_mut(j).iter_mut().zip(g.col(j).iter()) {
            f(x, *y);
        }
    }
}

/// `f(x, g)` over a vector's entries.
fn zip_vec(v: &mut [f64], g: &[f64], f: &mut impl FnMut(&mut f64, f64)) {
    for (x, y) in v.iter_mut().zip(g) {
        f(x, *y);
    }
}

/// tanh of every entry. It follows faer's GEMMs, whose AVX-512 kernels leave the upper
/// register halves dirty, which makes libm's tanh pay a state-transition penalty per call
/// (`docs/likelihood.md`, "libm after faer's GEMMs"): cleared first.
fn tanh_in_place(z: &mut Mat<f64>) {
    clear_upper_simd_state();
    for j in 0..z.ncols() {
        for v in z.col_mut(j).iter_mut() {
            *v = v.tanh();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_order_round_trips_through_entry_mut_and_zip_mut() {
        let mut net = Amortiser::init(3, 4, &[0.5, -0.5], 7);
        assert!(net.shapes_agree());
        let values = net.values();
        assert_eq!(values.len(), net.len());
        for (i, v) in values.iter().enumerate() {
            assert_eq!(*net.entry_mut(i), *v, "entry {i}");
        }
        let mut seen = Vec::new();
        let copy = net.clone();
        net.zip_mut(&copy, |x, y| {
            assert_eq!(*x, y);
            seen.push(y);
        });
        assert_eq!(seen, values);
    }

    #[test]
    fn backward_matches_central_differences() {
        let net = Amortiser::init(3, 5, &[0.3, 0.1], 11);
        let x = Mat::from_fn(4, 3, |i, j| ((i * 3 + j) as f64 * 0.37).sin());
        // F = Σ_ij w_ij O_ij with fixed w: G = w.
        let w = Mat::from_fn(4, 2, |i, j| 0.5 - (i + 2 * j) as f64 * 0.2);
        let value = |n: &Amortiser| {
            let o = n.forward(x.as_ref()).out;
            (0..4)
                .flat_map(|i| (0..2).map(move |j| (i, j)))
                .map(|(i, j)| w[(i, j)] * o[(i, j)])
                .sum::<f64>()
        };
        let grad = net
            .backward(x.as_ref(), &net.forward(x.as_ref()), &w)
            .values();
        let h = 1e-6;
        for (idx, g) in grad.iter().enumerate() {
            let mut up = net.clone();
            *up.entry_mut(idx) += h;
            let mut down = net.clone();
            *down.entry_mut(idx) -= h;
            let fd = (value(&up) - value(&down)) / (2.0 * h);
            assert!(
                (fd - g).abs() <= 1e-7 * (1.0 + g.abs()),
                "weight {idx}: {g} vs {fd}"
            );
        }
    }
}
