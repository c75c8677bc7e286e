//! The multi-class likelihood phase of the bound: from the marginals m, s [B×P] of the
//! latent GPs and one class per row to scale · Σ_i E_i and its gradients with respect to m,
//! s, Φ and b, for any [`ClassLikelihood`]; and the predictive class probabilities of a
//! block of rows (`docs/likelihood.md`, "Multi-class").
//!
//! The mean path is GEMMs over the minibatch, as in the dense multi-label path: f̄ᵀ = Φ mᵀ +
//! b 1ᵀ [K×B] before the rows, and with aᵀ = scale ∂E/∂f̄ [K×B] after them, ∂m = a Φ,
//! ∂Φ = aᵀ m (+ the covariance path), ∂b = Σ_i a_i. The rows run in parallel in fixed blocks
//! of [`ROW_BLOCK`]; each block adds its rows' covariance-path ∂Φ in row order into its own
//! [K×P] sum and the block sums are added in block order, so the result is the same bit for
//! bit for any number of threads.

use faer::{Mat, MatMut, MatRef};
use rayon::prelude::*;

use crate::linalg::{clear_upper_simd_state, product, product_into};
use crate::model::likelihood::multiclass::amortiser::{Amortiser, AmortiserForward};
use crate::model::likelihood::multiclass::{ClassLikelihood, Classes, RowGrads, RowInput};
use crate::model::params::Params;
use crate::model::scratch::Scratch;

/// Rows per parallel task. Fixed (not derived from the thread count) because the blocks
/// decide the order of the ∂Φ sums. Memory: ⌈B/ROW_BLOCK⌉ × K × P doubles for those sums.
pub const ROW_BLOCK: usize = 64;

/// The multi-class part's results: scale · Σ_i E_i and its gradients.
pub(crate) struct ClassGrads {
    pub expected: f64,
    /// ∂/∂m [B×P].
    pub mean: Mat<f64>,
    /// ∂/∂s [B×P].
    pub var: Mat<f64>,
    /// ∂/∂Φ [K×P].
    pub phi: Mat<f64>,
    /// ∂/∂b [K].
    pub bias: Vec<f64>,
    /// ∂/∂(network weights), for a likelihood with amortised local parameters.
    pub amortiser: Option<Amortiser>,
    /// ∂/∂θ of the likelihood's learnt parameter (`Params::logit_epsilon`); None without.
    pub lik_param: Option<f64>,
}

/// The amortisation network's outputs on the minibatch's rows, for a likelihood with local
/// parameters: the forward pass and its outputs row-major [B×O]. None without.
fn local_outputs(
    params: &Params,
    rows: MatRef<'_, f64>,
    lik: &dyn ClassLikelihood,
) -> Option<(AmortiserForward, Vec<f64>)> {
    if lik.local_init(params.phi.nrows()).is_empty() {
        return None;
    }
    let net = params
        .amortiser
        .as_ref()
        .expect("objective::check_shapes: the likelihood's network is present");
    let fwd = net.forward(rows);
    let out = row_major(fwd.out.as_ref(), false);
    Some((fwd, out))
}

/// One row block's share of the likelihood phase, summed in the block's row order.
struct BlockSums {
    /// E_i of each row.
    values: Vec<f64>,
    /// The covariance path's ∂/∂Φ [K×P], row-major.
    phi: Vec<f64>,
    /// ∂E_i/∂o_i of each row [rows×O] (empty without local parameters).
    local: Vec<f64>,
    /// Σ_i ∂E_i/∂θ of the learnt likelihood parameter (0 without one).
    lik_param: f64,
}

/// The entries of `x` [rows×cols] row by row (each row contiguous), negative entries
/// clamped to 0 when `clamp` (rounding can make a marginal variance slightly negative).
fn row_major(x: MatRef<'_, f64>, clamp: bool) -> Vec<f64> {
    let (rows, cols) = (x.nrows(), x.ncols());
    (0..rows)
        .flat_map(|i| (0..cols).map(move |j| x[(i, j)]))
        .map(|v| if clamp { v.max(0.0) } else { v })
        .collect()
}

/// f̄ᵀ = Φ mᵀ + b 1ᵀ into `f_t` [K×B] column-major (row i of the batch is column i).
fn utilities_into(f_t: &mut [f64], params: &Params, m: MatRef<'_, f64>) {
    let k_count = params.phi.nrows();
    let view = MatMut::from_column_major_slice_mut(f_t, k_count, m.nrows());
    product_into(view, params.phi.as_ref(), m.transpose());
    for col in f_t.chunks_mut(k_count) {
        for (f, b) in col.iter_mut().zip(&params.bias) {
            *f += b;
        }
    }
}

/// scale · Σ_i E_i and its gradients with respect to m, s, Φ and b (see the module docs),
/// and with respect to the amortisation network's weights for a likelihood with local
/// parameters, whose network reads `rows` [B×D_in] (the minibatch as the model sees it).
pub(crate) fn classes_part(
    params: &Params,
    (m, s): (MatRef<'_, f64>, MatRef<'_, f64>),
    rows: MatRef<'_, f64>,
    classes: &Classes<'_>,
    scratch: &Scratch,
) -> ClassGrads {
    let (b, p_count, k_count) = (m.nrows(), m.ncols(), params.phi.nrows());
    let local = local_outputs(params, rows, classes.lik);
    let o_count = local.as_ref().map_or(0, |(f, _)| f.out.ncols());
    let no_local = Vec::new();
    let local_rows = local.as_ref().map_or(&no_local, |(_, o)| o);
    let phi = params.phi.as_ref();
    let phi_rows = row_major(phi, false);
    let m_rows = row_major(m, false);
    let s_rows = row_major(s, true);
    let (mut f_t, mut a_t) = scratch.take_dense(k_count * b);
    utilities_into(&mut f_t, params, m);
    let mut g_var_rows = vec![0.0; b * p_count];
    let blocks: Vec<BlockSums> = a_t
        .par_chunks_mut(ROW_BLOCK * k_count)
        .zip(g_var_rows.par_chunks_mut(ROW_BLOCK * p_count))
        .enumerate()
        .map(|(block, (a_block, gv_block))| {
            let (mut phi_sum, mut lik_sum) = (vec![0.0; k_count * p_count], 0.0);
            let mut g_local = vec![0.0; a_block.len() / k_count * o_count];
            let mut work = Vec::new();
            let rows = a_block
                .chunks_mut(k_count)
                .zip(gv_block.chunks_mut(p_count));
            let values = rows
                .enumerate()
                .map(|(j, (a_row, gv_row))| {
                    let g_local_row = &mut g_local[j * o_count..(j + 1) * o_count];
                    let i = block * ROW_BLOCK + j;
                    let input = RowInput {
                        class: classes.class[i] as usize,
                        stream: classes.first_stream + i as u64,
                        seed: classes.seed,
                        mean: &m_rows[i * p_count..(i + 1) * p_count],
                        var: &s_rows[i * p_count..(i + 1) * p_count],
                        utility: &f_t[i * k_count..(i + 1) * k_count],
                        phi: &phi_rows,
                        local: local_rows
                            .get(i * o_count..(i + 1) * o_count)
                            .unwrap_or(&[]),
                        lik_param: params.logit_epsilon,
                    };
                    let mut grads = RowGrads {
                        utility: a_row,
                        var: gv_row,
                        phi: &mut phi_sum,
                        local: g_local_row,
                        lik_param: &mut lik_sum,
                    };
                    // The likelihoods call libm (exp, erfc); see `clear_upper_simd_state`.
                    clear_upper_simd_state();
                    classes.lik.row(&input, &mut grads, &mut work)
                })
                .collect();
            BlockSums {
                values,
                phi: phi_sum,
                local: g_local,
                lik_param: lik_sum,
            }
        })
        .collect();
    let scale = classes.scale;
    // Σ_i E_i in row order.
    let expected = scale * blocks.iter().flat_map(|s| &s.values).sum::<f64>();
    let amortiser = local.map(|(fwd, _)| {
        let g_local: Vec<f64> = blocks.iter().flat_map(|s| &s.local).copied().collect();
        let g_out = Mat::from_fn(b, o_count, |i, o| scale * g_local[i * o_count + o]);
        let net = params.amortiser.as_ref().expect("checked by local_outputs");
        net.backward(rows, &fwd, &g_out)
    });
    // Each block's rows in order, then the blocks in order.
    let lik_param = params
        .logit_epsilon
        .map(|_| scale * blocks.iter().map(|s| s.lik_param).sum::<f64>());
    for a in a_t.iter_mut() {
        *a *= scale;
    }
    let at = MatRef::from_column_major_slice(&a_t, k_count, b);
    let g_mean = product(at.transpose(), phi);
    let mut g_phi = product(at, m);
    let mut cov_phi = vec![0.0; k_count * p_count];
    for sums in &blocks {
        for (acc, x) in cov_phi.iter_mut().zip(&sums.phi) {
            *acc += x;
        }
    }
    for k in 0..k_count {
        for p in 0..p_count {
            g_phi[(k, p)] += scale * cov_phi[k * p_count + p];
        }
    }
    // ∂b_k = Σ_i a_ik, summed over rows in order.
    let mut g_bias = vec![0.0; k_count];
    for row in a_t.chunks(k_count) {
        for (g, a) in g_bias.iter_mut().zip(row) {
            *g += a;
        }
    }
    scratch.give_dense(f_t, a_t);
    ClassGrads {
        expected,
        mean: g_mean,
        var: Mat::from_fn(b, p_count, |i, p| scale * g_var_rows[i * p_count + p]),
        phi: g_phi,
        bias: g_bias,
        amortiser,
        lik_param,
    }
}

/// The predictive class probabilities [B×K] of a block of rows from their marginals m, s
/// [B×P] (from `Predictor::marginals`), in parallel over the rows. Sampling likelihoods draw
/// row i's noise from `seed` and the stream `streams[i]` (the row's id in its split, or its
/// position in its request), so a row's probabilities do not depend on how the rows are
/// split into blocks nor on which other rows share its block.
pub fn class_probabilities(
    lik: &dyn ClassLikelihood,
    params: &Params,
    m: MatRef<'_, f64>,
    s: MatRef<'_, f64>,
    seed: u64,
    streams: &[u64],
) -> Mat<f64> {
    let (b, p_count, k_count) = (m.nrows(), m.ncols(), params.phi.nrows());
    assert_eq!(streams.len(), b, "one stream per row");
    let phi_rows = row_major(params.phi.as_ref(), false);
    let m_rows = row_major(m, false);
    let s_rows = row_major(s, true);
    let mut f_t = vec![0.0; k_count * b];
    utilities_into(&mut f_t, params, m);
    let mut probs = vec![0.0; k_count * b];
    probs
        .par_chunks_mut(k_count)
        .enumerate()
        .for_each_init(Vec::new, |work, (i, out)| {
            let input = RowInput {
                class: 0,
                stream: streams[i],
                seed,
                mean: &m_rows[i * p_count..(i + 1) * p_count],
                var: &s_rows[i * p_count..(i + 1) * p_count],
                utility: &f_t[i * k_count..(i + 1) * k_count],
                phi: &phi_rows,
                local: &[],
                lik_param: params.logit_epsilon,
            };
            clear_upper_simd_state();
            lik.probabilities(&input, out, work);
        });
    Mat::from_fn(b, k_count, |i, k| probs[i * k_count + k])
}
