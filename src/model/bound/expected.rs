//! The likelihood phase of the bound: from the marginals m, s [B×P] of the latent GPs to the
//! utilities' moments f̄_ik = Σ_p Φ_kp m_ip + b_k and v_ik = Σ_p Φ_kp² s_ip, the expected
//! log-likelihood Σ_terms w E(y, f̄, v), and its gradients with respect to m, s, Φ and b
//! (`docs/model.md`, "Algorithm as implemented", step 3).

use faer::{Mat, MatMut, MatRef};
use rayon::prelude::*;

use crate::linalg::{product, product_into};
use crate::model::bound::class_phase::classes_part;
use crate::model::bound::terms::{Term, TermSet};
use crate::model::likelihood::multiclass::amortiser::Amortiser;
use crate::model::likelihood::Likelihood;
use crate::model::params::Params;
use crate::model::scratch::Scratch;

/// The likelihood part's results: Σ w E and the gradients with respect to m, s, Φ, b.
pub(crate) struct LikelihoodGrads {
    pub expected: f64,
    /// ∂/∂m [B×P].
    pub mean: Mat<f64>,
    /// ∂/∂s [B×P].
    pub var: Mat<f64>,
    /// ∂/∂Φ [K×P].
    pub phi: Mat<f64>,
    /// ∂/∂b [K].
    pub bias: Vec<f64>,
    /// ∂/∂(amortisation network weights), multi-class likelihoods with local parameters
    /// only.
    pub amortiser: Option<Amortiser>,
    /// ∂/∂θ of a class likelihood's learnt parameter (`Params::logit_epsilon`); None
    /// without one.
    pub lik_param: Option<f64>,
}

/// Σ_terms w E and the gradients with respect to m, s, Φ and b, for the marginals `mean` and
/// `var` [B×P] of the rows the terms refer to; `rows` [B×D_in] are those rows as the model
/// sees them, the input of an amortised multi-class likelihood's network.
pub(crate) fn likelihood_part(
    params: &Params,
    (mean, var): (MatRef<'_, f64>, MatRef<'_, f64>),
    rows: MatRef<'_, f64>,
    terms: &TermSet<'_>,
    lik: &dyn Likelihood,
    scratch: &Scratch,
) -> LikelihoodGrads {
    match terms {
        TermSet::List(list) => likelihood_list(params, mean, var, list, lik, scratch),
        TermSet::AllLabels { positives, scale } => likelihood_dense(
            (params.phi.as_ref(), &params.bias),
            mean,
            var,
            positives,
            *scale,
            lik,
            scratch,
        ),
        TermSet::Stratified {
            frequent,
            positives,
            scale,
            rest,
        } => {
            let listed = likelihood_list(params, mean, var, rest, lik, scratch);
            let dense =
                likelihood_frequent(params, mean, var, frequent, positives, *scale, lik, scratch);
            with_frequent(listed, dense, frequent)
        }
        TermSet::Classes(classes) => {
            let part = classes_part(params, (mean, var), rows, classes, scratch);
            LikelihoodGrads {
                expected: part.expected,
                mean: part.mean,
                var: part.var,
                phi: part.phi,
                bias: part.bias,
                amortiser: part.amortiser,
                lik_param: part.lik_param,
            }
        }
    }
}

/// Terms per parallel task of the list path's quadrature.
const TERM_BLOCK: usize = 4096;

/// Terms per segment of the list path's gradient accumulation, at least: a segment ends at
/// the first label boundary after this many terms.
const SEGMENT_TERMS: usize = 32_768;

/// The list path: per term, f̄ = Φ_k·m_i + b_k and v = (Φ_k∘Φ_k)·s_i, the quadrature in
/// parallel blocks of terms, then the gradients accumulated in parallel segments of whole
/// labels (terms sorted by label): a segment owns its labels' rows of ∂Φ and ∂b and sums its
/// own ∂m, ∂s [B×P], which are added up in segment order. Segments are cut by term counts
/// alone, so the result is independent of the thread count; up to [`SEGMENT_TERMS`] terms
/// there is one segment, the plain sum in term order.
fn likelihood_list(
    params: &Params,
    m: MatRef<'_, f64>,
    s: MatRef<'_, f64>,
    terms: &[Term],
    lik: &dyn Likelihood,
    scratch: &Scratch,
) -> LikelihoodGrads {
    let (b, p_count, k_count) = (m.nrows(), m.ncols(), params.phi.nrows());
    let by_label = sorted_by_label(terms, k_count);
    let terms = by_label.as_slice();
    // Row-major copies so each term reads contiguous P-vectors; Φ's copy and ∂Φ's rows live
    // in the scratch's buffers from step to step (K×P each: fresh ones cost a page fault per
    // 4 KiB, a tenth of a step at K = 50 000).
    // ∂Φ's rows are zeroed by the segment that owns them, in parallel, just before use.
    let (mut phi_rows, mut g_phi_rows) = scratch.take_rows(k_count * p_count);
    row_major_into(params.phi.as_ref(), &mut phi_rows);
    let m_rows = row_major(m);
    let s_rows = row_major(s);
    // (value, ∂E/∂f̄, ∂E/∂v) per term.
    let per_term: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = terms
        .par_chunks(TERM_BLOCK)
        .map(|block| {
            let n = block.len();
            let (mut y, mut fm, mut fv, mut val) =
                (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            for (j, t) in block.iter().enumerate() {
                let (i, k) = (t.row as usize, t.label as usize);
                let f = &phi_rows[k * p_count..(k + 1) * p_count];
                let mi = &m_rows[i * p_count..(i + 1) * p_count];
                let si = &s_rows[i * p_count..(i + 1) * p_count];
                let mut mean = params.bias[k];
                let mut var = 0.0;
                for p in 0..p_count {
                    mean += f[p] * mi[p];
                    var += f[p] * f[p] * si[p];
                }
                y[j] = t.y;
                fm[j] = mean;
                fv[j] = var.max(0.0);
            }
            lik.expect_lanes(&y, &mut fm, &mut fv, &mut val);
            (val, fm, fv)
        })
        .collect();
    let at = |t: usize| {
        let (val, dm, dv) = &per_term[t / TERM_BLOCK];
        let j = t % TERM_BLOCK;
        (val[j], dm[j], dv[j])
    };
    let segments = label_segments(terms, k_count);
    let mut g_bias = vec![0.0; k_count];
    // Each segment's labels' rows of ∂Φ and entries of ∂b, as disjoint slices.
    let mut owned = Vec::with_capacity(segments.len());
    let (mut phi_rest, mut bias_rest) = (g_phi_rows.as_mut_slice(), g_bias.as_mut_slice());
    for seg in &segments {
        let labels = seg.labels.end - seg.labels.start;
        let (phi_here, phi_after) = std::mem::take(&mut phi_rest).split_at_mut(labels * p_count);
        let (bias_here, bias_after) = std::mem::take(&mut bias_rest).split_at_mut(labels);
        (phi_rest, bias_rest) = (phi_after, bias_after);
        owned.push((seg, phi_here, bias_here));
    }
    let partials: Vec<(f64, Vec<f64>, Vec<f64>)> = owned
        .into_par_iter()
        .map(|(seg, g_phi, g_b)| {
            g_phi.fill(0.0);
            let mut g_mean = vec![0.0; b * p_count];
            let mut g_var = vec![0.0; b * p_count];
            let mut expected = 0.0;
            let first_label = seg.labels.start;
            for (n, t) in terms[seg.terms.clone()].iter().enumerate() {
                let (val, dm, dv) = at(seg.terms.start + n);
                let (i, k) = (t.row as usize, t.label as usize);
                expected += t.weight * val;
                let (alpha, beta) = (t.weight * dm, t.weight * dv);
                let local = k - first_label;
                g_b[local] += alpha;
                let f = &phi_rows[k * p_count..(k + 1) * p_count];
                let mi = &m_rows[i * p_count..(i + 1) * p_count];
                let si = &s_rows[i * p_count..(i + 1) * p_count];
                let gm = &mut g_mean[i * p_count..(i + 1) * p_count];
                for p in 0..p_count {
                    gm[p] += alpha * f[p];
                }
                let gv = &mut g_var[i * p_count..(i + 1) * p_count];
                for p in 0..p_count {
                    gv[p] += beta * f[p] * f[p];
                }
                let gf = &mut g_phi[local * p_count..(local + 1) * p_count];
                for p in 0..p_count {
                    gf[p] += alpha * mi[p] + 2.0 * beta * f[p] * si[p];
                }
            }
            (expected, g_mean, g_var)
        })
        .collect();
    let mut parts = partials.into_iter();
    let (mut expected, mut g_mean_rows, mut g_var_rows) = parts
        .next()
        .unwrap_or_else(|| (0.0, vec![0.0; b * p_count], vec![0.0; b * p_count]));
    for (e, gm, gv) in parts {
        expected += e;
        for (a, x) in g_mean_rows.iter_mut().zip(&gm) {
            *a += x;
        }
        for (a, x) in g_var_rows.iter_mut().zip(&gv) {
            *a += x;
        }
    }
    let mut phi = scratch.take_labels(k_count, p_count);
    from_row_major_into(&g_phi_rows, phi.as_mut());
    scratch.give_rows(phi_rows, g_phi_rows);
    LikelihoodGrads {
        expected,
        mean: Mat::from_fn(b, p_count, |i, p| g_mean_rows[i * p_count + p]),
        var: Mat::from_fn(b, p_count, |i, p| g_var_rows[i * p_count + p]),
        phi,
        bias: g_bias,
        amortiser: None,
        lik_param: None,
    }
}

/// A run of whole labels' terms: `terms` indexes the label-sorted terms, `labels` the labels
/// they cover (labels without terms included).
struct Segment {
    terms: std::ops::Range<usize>,
    labels: std::ops::Range<usize>,
}

/// The label-sorted `terms` cut into segments of at least [`SEGMENT_TERMS`] terms, each ending
/// at a label boundary; together their label ranges cover 0..`labels` in order.
fn label_segments(terms: &[Term], labels: usize) -> Vec<Segment> {
    let mut out = Vec::new();
    let (mut start, mut first_label) = (0usize, 0usize);
    while start < terms.len() {
        let mut end = (start + SEGMENT_TERMS).min(terms.len());
        while end < terms.len() && terms[end].label == terms[end - 1].label {
            end += 1;
        }
        let last_label = match end < terms.len() {
            true => terms[end].label as usize,
            false => labels,
        };
        out.push(Segment {
            terms: start..end,
            labels: first_label..last_label,
        });
        (start, first_label) = (end, last_label);
    }
    if out.is_empty() {
        out.push(Segment {
            terms: 0..0,
            labels: 0..labels,
        });
    }
    out
}

/// `terms` stably sorted by label (a counting sort, O(terms + K)). The list path runs its
/// terms in this order so that it streams through Φ's rows and its gradient's once instead
/// of jumping between them term by term: with K = 50 000 labels Φ [K×P] no longer fits in
/// the cache, and the jumps made a step with 1 000 sampled negatives per row cost 0.3 s
/// more than the same step at K = 1 000 (`docs/model.md`, "Many labels"). Stability keeps
/// each label's terms in their order, so ∂Φ and ∂b are summed in the same order as before.
fn sorted_by_label(terms: &[Term], labels: usize) -> Vec<Term> {
    let mut next = vec![0usize; labels + 1];
    for t in terms {
        next[t.label as usize + 1] += 1;
    }
    for k in 0..labels {
        next[k + 1] += next[k];
    }
    let mut out = terms.to_vec();
    for t in terms {
        let slot = &mut next[t.label as usize];
        out[*slot] = *t;
        *slot += 1;
    }
    out
}

/// Rows per block of the transposing copies below: one block of every column (P runs of
/// this many entries) and its rows stay in cache together.
const TRANSPOSE_ROWS: usize = 64;

/// `mat` [K×P] row-major: row k at [k·P, (k + 1)·P). Copied in blocks of rows so every
/// column is read in runs: a plain row-by-row read steps through memory by K entries and
/// misses the cache (and the TLB) on every entry once K·8 bytes exceed a page, which made
/// this copy and its inverse cost more than a step's sampled terms at K = 50 000.
fn row_major(mat: MatRef<'_, f64>) -> Vec<f64> {
    let mut out = vec![0.0; mat.nrows() * mat.ncols()];
    row_major_into(mat, &mut out);
    out
}

/// [`row_major`] into `out` (of length K·P), blocks of rows in parallel.
fn row_major_into(mat: MatRef<'_, f64>, out: &mut [f64]) {
    let cols = mat.ncols();
    if cols == 0 {
        return;
    }
    mat.par_row_chunks(TRANSPOSE_ROWS)
        .zip(out.par_chunks_mut(TRANSPOSE_ROWS * cols))
        .for_each(|(block, out)| {
            for p in 0..cols {
                let col = block.col(p);
                for k in 0..block.nrows() {
                    out[k * cols + p] = col[k];
                }
            }
        });
}

/// The inverse of [`row_major_into`]: `out` [K×P] gets row k from `data[k·P .. (k + 1)·P]`,
/// blocks of rows in parallel; every entry of `out` is written.
fn from_row_major_into(data: &[f64], out: MatMut<'_, f64>) {
    let cols = out.ncols();
    if cols == 0 {
        return;
    }
    out.par_row_chunks_mut(TRANSPOSE_ROWS)
        .zip(data.par_chunks(TRANSPOSE_ROWS * cols))
        .for_each(|(mut block, data)| {
            for p in 0..cols {
                let mut col = block.as_mut().col_mut(p);
                for k in 0..col.nrows() {
                    col[k] = data[k * cols + p];
                }
            }
        });
}

/// The dense path on the labels of `frequent` (sorted ids) only: their rows of Φ and b
/// gathered into an [F×P] matrix and an F-vector, each row's positives among them mapped to
/// their positions in `frequent`. The gradients' Φ and b are the gathered ones' ([F×P], F).
#[allow(clippy::too_many_arguments)]
fn likelihood_frequent(
    params: &Params,
    m: MatRef<'_, f64>,
    s: MatRef<'_, f64>,
    frequent: &[u32],
    positives: &[Vec<u32>],
    scale: f64,
    lik: &dyn Likelihood,
    scratch: &Scratch,
) -> LikelihoodGrads {
    let phi = Mat::from_fn(frequent.len(), params.phi.ncols(), |j, p| {
        params.phi[(frequent[j] as usize, p)]
    });
    let bias: Vec<f64> = frequent.iter().map(|&k| params.bias[k as usize]).collect();
    let local: Vec<Vec<u32>> = positives
        .iter()
        .map(|pos| {
            pos.iter()
                .filter_map(|k| frequent.binary_search(k).ok().map(|j| j as u32))
                .collect()
        })
        .collect();
    likelihood_dense((phi.as_ref(), &bias), m, s, &local, scale, lik, scratch)
}

/// The list part's gradients `listed` plus the dense part's `dense` on the labels of
/// `frequent` (whose Φ and b gradients are those labels' rows, in order).
fn with_frequent(
    mut listed: LikelihoodGrads,
    dense: LikelihoodGrads,
    frequent: &[u32],
) -> LikelihoodGrads {
    listed.expected += dense.expected;
    listed.mean += &dense.mean;
    listed.var += &dense.var;
    for (j, &k) in frequent.iter().enumerate() {
        let k = k as usize;
        for p in 0..listed.phi.ncols() {
            listed.phi[(k, p)] += dense.phi[(j, p)];
        }
        listed.bias[k] += dense.bias[j];
    }
    listed
}

/// The dense all-labels path, every step a GEMM or an elementwise pass over [K×B] buffers
/// (the transposes of f̄, v, α, β, so each minibatch row is a contiguous column):
/// f̄ᵀ = Φ mᵀ + b1ᵀ, vᵀ = (Φ∘Φ) sᵀ; the quadrature in place, per row in parallel, turns
/// them into αᵀ = scale ∂E/∂f̄ and βᵀ = scale ∂E/∂v; then G_m = α Φ, G_s = β (Φ∘Φ),
/// ∂Φ = αᵀ m + 2 Φ ∘ (βᵀ s), ∂b = Σ_i α_i.
/// `(phi, bias)` are Φ [K×P] and b (K) of the labels the path runs over: the model's, or
/// a gathered subset of its labels ([`likelihood_frequent`]).
fn likelihood_dense(
    (phi, bias): (MatRef<'_, f64>, &[f64]),
    m: MatRef<'_, f64>,
    s: MatRef<'_, f64>,
    positives: &[Vec<u32>],
    scale: f64,
    lik: &dyn Likelihood,
    scratch: &Scratch,
) -> LikelihoodGrads {
    let (b, p_count, k_count) = (m.nrows(), m.ncols(), phi.nrows());
    let phi2 = Mat::from_fn(k_count, p_count, |k, p| phi[(k, p)] * phi[(k, p)]);
    // The two [K×B] buffers come from the arena: at AmazonCat sizes they are 2 × 53 MB.
    let (mut alpha, mut beta) = scratch.take_dense(k_count * b);
    {
        let f_t = MatMut::from_column_major_slice_mut(&mut alpha, k_count, b);
        product_into(f_t, phi, m.transpose());
        let v_t = MatMut::from_column_major_slice_mut(&mut beta, k_count, b);
        product_into(v_t, phi2.as_ref(), s.transpose());
    }
    let row_values: Vec<f64> = alpha
        .par_chunks_mut(k_count)
        .zip(beta.par_chunks_mut(k_count))
        .zip(positives.par_iter())
        .map(|((f_row, v_row), pos)| {
            let mut y = vec![-1.0; k_count];
            for &k in pos {
                y[k as usize] = 1.0;
            }
            for (f, bias) in f_row.iter_mut().zip(bias) {
                *f += bias;
            }
            for v in v_row.iter_mut() {
                *v = v.max(0.0);
            }
            let mut val = vec![0.0; k_count];
            lik.expect_lanes(&y, f_row, v_row, &mut val);
            for (a, bt) in f_row.iter_mut().zip(v_row.iter_mut()) {
                *a *= scale;
                *bt *= scale;
            }
            val.iter().sum::<f64>()
        })
        .collect();
    let expected = scale * row_values.iter().sum::<f64>();
    let alpha_t = MatRef::from_column_major_slice(&alpha, k_count, b);
    let beta_t = MatRef::from_column_major_slice(&beta, k_count, b);
    let g_mean = product(alpha_t.transpose(), phi);
    let g_var = product(beta_t.transpose(), phi2.as_ref());
    let mut g_phi = product(alpha_t, m);
    let bt_s = product(beta_t, s);
    for p in 0..p_count {
        for k in 0..k_count {
            g_phi[(k, p)] += 2.0 * phi[(k, p)] * bt_s[(k, p)];
        }
    }
    // ∂b_k = Σ_i α_ik, summed over rows in order.
    let mut g_bias = vec![0.0; k_count];
    for row in alpha.chunks(k_count) {
        for (g, a) in g_bias.iter_mut().zip(row) {
            *g += a;
        }
    }
    scratch.give_dense(alpha, beta);
    LikelihoodGrads {
        expected,
        mean: g_mean,
        var: g_var,
        phi: g_phi,
        bias: g_bias,
        amortiser: None,
        lik_param: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_sorted_by_label_keep_each_labels_order() {
        let term = |row: u32, label: u32| Term {
            row,
            label,
            y: -1.0,
            weight: 1.0,
        };
        let terms = [
            term(0, 3),
            term(0, 1),
            term(1, 3),
            term(1, 0),
            term(2, 1),
            term(2, 3),
        ];
        let rows_labels: Vec<(u32, u32)> = sorted_by_label(&terms, 5)
            .iter()
            .map(|t| (t.row, t.label))
            .collect();
        assert_eq!(
            rows_labels,
            [(1, 0), (0, 1), (2, 1), (0, 3), (1, 3), (2, 3)],
            "by label, and within a label in the order given"
        );
        assert!(sorted_by_label(&[], 0).is_empty());
    }

    #[test]
    fn blocked_row_major_copies_are_the_plain_transposes() {
        // Shapes below, at and across the block of rows (64), and empty; the blocks run on
        // a pool of two threads.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (rows, cols) in [(0, 3), (3, 0), (1, 1), (63, 5), (64, 4), (130, 7), (200, 1)] {
            let mat = Mat::from_fn(rows, cols, |k, p| (k * 1000 + p) as f64 + 0.5);
            let plain: Vec<f64> = (0..rows)
                .flat_map(|k| (0..cols).map(move |p| (k * 1000 + p) as f64 + 0.5))
                .collect();
            assert_eq!(
                pool.install(|| row_major(mat.as_ref())),
                plain,
                "{rows}×{cols}"
            );
            // Into a matrix holding other values: every entry is written.
            let mut back = Mat::from_fn(rows, cols, |_, _| f64::NAN);
            pool.install(|| from_row_major_into(&plain, back.as_mut()));
            assert_eq!(back, mat, "{rows}×{cols}");
        }
    }
}
