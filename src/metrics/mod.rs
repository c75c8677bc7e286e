//! Ranking metrics of the Extreme Classification Repository, with the conventions of its
//! Python toolkit pyxclib (`xclib/evaluation/xc_metrics.py`): precision P@k, nDCG@k,
//! propensity-scored PSP@k and PSnDCG@k, plus label coverage@k, for every k = 1..k_max.
//!
//! Rows arrive one at a time through [`MetricsAccumulator::add_row`]; accumulators filled
//! from different chunks of a split are combined with [`MetricsAccumulator::merge`].
//! Every sum is kept exactly (integers, and per-row real contributions rounded once to a
//! fixed-point grid of 2⁻⁶⁴ and summed in `i128`), so the result is bit-identical however
//! the rows are split into chunks and in whatever grouping the chunks are merged.
//!
//! Predictions are ranked lists of label ids, best first; ties between scores are the
//! caller's business (the order given is the order scored). The formulas, the
//! label-less-row policy and the propensity model are in `docs/metrics.md`.
//!
//! The submodules measure predicted probabilities: [`calibration`] (Brier, ECE, MCE and the
//! reliability bins), [`nlp`], [`binary`] (with the AUC) and [`multiclass`] (accuracy,
//! top-k accuracy, coverage); [`evaluation::Evaluation`] is one evaluation's metrics
//! whatever its [`task::Task`]; [`names`] names every figure the catalog records.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use anyhow::{bail, ensure, Result};

use crate::store::catalog::{MetricRow, Split};
use calibration::Calibration;
use fixed::{add_all_i128, from_fixed, ratio, to_fixed};
use names::AtK;

pub mod baseline;
pub mod binary;
pub mod calibration;
pub mod evaluation;
mod fixed;
pub mod multiclass;
pub mod names;
pub mod nlp;
pub mod task;

/// Largest supported `k_max` (coverage stores the best hit rank of a label in a byte).
pub const MAX_K: usize = 254;

/// Parameters A, B of the propensity model of Jain, Prabhu & Varma (KDD 2016):
/// p_l = 1 / (1 + C (n_l + B)^(−A)), C = (ln N − 1)(B + 1)^A.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PropensityParams {
    pub a: f64,
    pub b: f64,
}

impl PropensityParams {
    /// The repository's default for data sets other than Amazon and Wikipedia ones.
    pub const GENERIC: Self = Self { a: 0.55, b: 1.5 };
    /// The repository's preset for Amazon data sets.
    pub const AMAZON: Self = Self { a: 0.6, b: 2.6 };
    /// The repository's preset for Wikipedia data sets.
    pub const WIKIPEDIA: Self = Self { a: 0.5, b: 0.4 };

    /// Inverse propensities 1/p_l of labels with training counts `counts` among `n_train`
    /// training rows; see [`inverse_propensity`].
    pub fn inverse_propensity(&self, counts: &[u64], n_train: u64) -> Vec<f64> {
        inverse_propensity(counts, n_train, self.a, self.b)
    }

    /// Inverse propensity of a label never seen in training (n_l = 0): the weight to give
    /// [`MetricsAccumulator::with_unseen_inv_prop`] for label ids beyond the table.
    pub fn unseen_inverse_propensity(&self, n_train: u64) -> f64 {
        inverse_propensity(&[0], n_train, self.a, self.b)[0]
    }
}

/// Inverse propensities 1/p_l = 1 + C (n_l + B)^(−A), C = (ln N − 1)(B + 1)^A, where
/// n_l = `counts[l]` is label l's number of training rows and N = `n_train` the number of
/// training rows (label-less ones included). This is pyxclib's `compute_inv_propesity`.
/// A label with n_l = 0 gets the finite weight 1 + C B^(−A) (B > 0).
///
/// N must be at least 3 for the weights to be ≥ 1 (C < 0 when ln N < 1); the accumulator
/// rejects non-positive or non-finite weights.
pub fn inverse_propensity(counts: &[u64], n_train: u64, a: f64, b: f64) -> Vec<f64> {
    let c = ((n_train as f64).ln() - 1.0) * (b + 1.0).powf(a);
    counts
        .iter()
        .map(|&n| 1.0 + c * (n as f64 + b).powf(-a))
        .collect()
}

/// What to do with test rows that have no true label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum LabellessRows {
    /// pyxclib's behaviour: the row counts in the mean of P@k and nDCG@k with value 0
    /// (pyxclib's IDCG of an empty row is positive, so its nDCG is 0, not NaN).
    #[default]
    CountAsZero,
    /// The row is left out of the means (it is still counted in `labelless_rows`).
    Skip,
}

/// Coverage code: label not in any test truth seen so far.
const COV_ABSENT: u8 = 0;
/// Coverage code: label in some test truth, never correctly predicted within k_max.
const COV_MISSED: u8 = u8::MAX;

/// Streaming accumulator of the metrics over the rows of a split.
#[derive(Clone, Debug)]
pub struct MetricsAccumulator {
    k_max: usize,
    inv_prop: Arc<[f64]>,
    unseen_inv_prop: f64,
    policy: LabellessRows,
    rows: u64,
    labelless_rows: u64,
    /// Σ over rows of the number of hits in the top k (index k − 1).
    hits: Vec<u64>,
    /// Σ over rows of DCG@k / IDCG@k.
    ndcg: Vec<i128>,
    /// Σ over rows of Σ_{top-k} y_l w_l.
    psp_num: Vec<i128>,
    /// Σ over rows of the best achievable Σ_{top-k} y_l w_l.
    psp_den: Vec<i128>,
    /// Σ over rows of PSDCG@k / IDCG@k.
    psndcg_num: Vec<i128>,
    /// Σ over rows of best PSDCG@k / IDCG@k.
    psndcg_den: Vec<i128>,
    /// Per label id < inv_prop.len(): COV_ABSENT, COV_MISSED, or the best rank (1..=k_max)
    /// at which it was correctly predicted in some row.
    coverage: Vec<u8>,
    /// The same for label ids ≥ inv_prop.len().
    coverage_extra: BTreeMap<u32, u8>,
    /// 1/log2(r + 1) for r = 1..=k_max (index r − 1).
    discount: Arc<[f64]>,
    /// IDCG@m = Σ_{r=1..m} 1/log2(r + 1) for m = 0..=k_max.
    idcg: Arc<[f64]>,
    scratch: Scratch,
}

#[derive(Clone, Debug, Default)]
struct Scratch {
    truth: Vec<u32>,
    pred: Vec<u32>,
    weights: Vec<f64>,
    row_i128: Vec<i128>,
}

impl MetricsAccumulator {
    /// An empty accumulator for k = 1..=`k_max` (1 ≤ k_max ≤ 254) with inverse propensities
    /// `inv_prop[l]` = 1/p_l (from [`inverse_propensity`]). Label ids ≥ `inv_prop.len()`
    /// get the weight set by [`Self::with_unseen_inv_prop`], by default the largest entry
    /// of `inv_prop` (which is the n_l = 0 weight whenever the table holds a label never
    /// seen in training), or 1 for an empty table.
    pub fn new(
        k_max: usize,
        inv_prop: impl Into<Arc<[f64]>>,
        policy: LabellessRows,
    ) -> Result<Self> {
        ensure!(
            (1..=MAX_K).contains(&k_max),
            "k_max must be in 1..={MAX_K}, got {k_max}"
        );
        let inv_prop: Arc<[f64]> = inv_prop.into();
        if let Some((l, w)) = inv_prop
            .iter()
            .enumerate()
            .find(|(_, w)| !(w.is_finite() && **w > 0.0))
        {
            bail!("inverse propensity of label {l} is {w}; expected a finite positive number");
        }
        let unseen_inv_prop = inv_prop.iter().copied().reduce(f64::max).unwrap_or(1.0);
        let discount: Arc<[f64]> = (1..=k_max).map(|r| 1.0 / ((r + 1) as f64).log2()).collect();
        let mut idcg = Vec::with_capacity(k_max + 1);
        let mut s = 0.0;
        idcg.push(s);
        for d in discount.iter() {
            s += d;
            idcg.push(s);
        }
        let n_labels = inv_prop.len();
        Ok(Self {
            k_max,
            inv_prop,
            unseen_inv_prop,
            policy,
            rows: 0,
            labelless_rows: 0,
            hits: vec![0; k_max],
            ndcg: vec![0; k_max],
            psp_num: vec![0; k_max],
            psp_den: vec![0; k_max],
            psndcg_num: vec![0; k_max],
            psndcg_den: vec![0; k_max],
            coverage: vec![COV_ABSENT; n_labels],
            coverage_extra: BTreeMap::new(),
            discount,
            idcg: idcg.into(),
            scratch: Scratch::default(),
        })
    }

    /// Sets the inverse propensity of label ids ≥ `inv_prop.len()` (use
    /// [`PropensityParams::unseen_inverse_propensity`] for the n_l = 0 weight).
    pub fn with_unseen_inv_prop(mut self, weight: f64) -> Result<Self> {
        ensure!(
            weight.is_finite() && weight > 0.0,
            "inverse propensity of unseen labels is {weight}; expected a finite positive number"
        );
        self.unseen_inv_prop = weight;
        Ok(self)
    }

    pub fn k_max(&self) -> usize {
        self.k_max
    }

    pub fn policy(&self) -> LabellessRows {
        self.policy
    }

    fn weight(&self, label: u32) -> f64 {
        self.inv_prop
            .get(label as usize)
            .copied()
            .unwrap_or(self.unseen_inv_prop)
    }

    /// Adds one test row: `pred_ranked` the predicted labels best first (only the first
    /// k_max are read; fewer than k_max count the missing positions as misses), `truth` the
    /// row's true labels in any order. Duplicate labels in `truth`, or among the first k_max
    /// predictions, are an error; on error the accumulator is unchanged.
    pub fn add_row(&mut self, pred_ranked: &[u32], truth: &[u32]) -> Result<()> {
        let k_max = self.k_max;
        let pred = &pred_ranked[..pred_ranked.len().min(k_max)];
        let mut sc = std::mem::take(&mut self.scratch);
        let result = self.add_row_with(pred, truth, &mut sc);
        self.scratch = sc;
        result
    }

    fn add_row_with(&mut self, pred: &[u32], truth: &[u32], sc: &mut Scratch) -> Result<()> {
        let k_max = self.k_max;
        if let Some(l) = sorted_with_duplicate(&mut sc.truth, truth) {
            bail!("true label {l} appears twice in the row");
        }
        if let Some(l) = sorted_with_duplicate(&mut sc.pred, pred) {
            bail!("predicted label {l} appears twice in the row's top {k_max}");
        }
        let n_true = sc.truth.len();

        // Per-k running quantities of this row.
        let mut row_hits = [0u64; MAX_K];
        let mut dcg = [0.0f64; MAX_K];
        let mut psp = [0.0f64; MAX_K];
        let mut psdcg = [0.0f64; MAX_K];
        let mut best_psp = [0.0f64; MAX_K];
        let mut best_psdcg = [0.0f64; MAX_K];
        // First rank (1-based) of each hit, for coverage.
        let mut hit_rank = [0u8; MAX_K];
        let (mut h, mut d, mut p, mut pd) = (0u64, 0.0f64, 0.0f64, 0.0f64);
        for r in 0..k_max {
            if let Some(&l) = pred.get(r) {
                if sc.truth.binary_search(&l).is_ok() {
                    let w = self.weight(l);
                    h += 1;
                    d += self.discount[r];
                    p += w;
                    pd += w * self.discount[r];
                    hit_rank[r] = (r + 1) as u8;
                }
            }
            row_hits[r] = h;
            dcg[r] = d;
            psp[r] = p;
            psdcg[r] = pd;
        }
        // Best achievable propensity-scored values: true labels ranked by weight (ties in
        // weight are equal values, so the sums do not depend on their order).
        sc.weights.clear();
        sc.weights.extend(sc.truth.iter().map(|&l| self.weight(l)));
        sc.weights.sort_unstable_by(|a, b| b.total_cmp(a));
        let (mut bp, mut bpd) = (0.0f64, 0.0f64);
        for r in 0..k_max {
            if let Some(&w) = sc.weights.get(r) {
                bp += w;
                bpd += w * self.discount[r];
            }
            best_psp[r] = bp;
            best_psdcg[r] = bpd;
        }

        // Fixed-point contributions, all checked before anything is committed.
        let row = &mut sc.row_i128;
        row.clear();
        for k in 1..=k_max {
            let (nd, pn, pden, psn, psden) = if n_true == 0 {
                (0.0, 0.0, 0.0, 0.0, 0.0)
            } else {
                let idcg = self.idcg[k.min(n_true)];
                (
                    dcg[k - 1] / idcg,
                    psp[k - 1],
                    best_psp[k - 1],
                    psdcg[k - 1] / idcg,
                    best_psdcg[k - 1] / idcg,
                )
            };
            row.extend([
                to_fixed(nd)?,
                to_fixed(pn)?,
                to_fixed(pden)?,
                to_fixed(psn)?,
                to_fixed(psden)?,
            ]);
        }
        let fits = |acc: &[i128], j: usize| {
            acc.iter()
                .enumerate()
                .all(|(k, a)| a.checked_add(row[5 * k + j]).is_some())
        };
        ensure!(
            fits(&self.ndcg, 0)
                && fits(&self.psp_num, 1)
                && fits(&self.psp_den, 2)
                && fits(&self.psndcg_num, 3)
                && fits(&self.psndcg_den, 4),
            "fixed-point metric sum overflow"
        );

        // Commit.
        self.rows += 1;
        if n_true == 0 {
            self.labelless_rows += 1;
        }
        for k in 0..k_max {
            self.hits[k] += row_hits[k];
            self.ndcg[k] += row[5 * k];
            self.psp_num[k] += row[5 * k + 1];
            self.psp_den[k] += row[5 * k + 2];
            self.psndcg_num[k] += row[5 * k + 3];
            self.psndcg_den[k] += row[5 * k + 4];
        }
        for &l in &sc.truth {
            let slot = self.coverage_slot(l);
            if *slot == COV_ABSENT {
                *slot = COV_MISSED;
            }
        }
        for (r, &rank) in hit_rank[..k_max].iter().enumerate() {
            if rank != 0 {
                let slot = self.coverage_slot(pred[r]);
                *slot = (*slot).min(rank);
            }
        }
        Ok(())
    }

    fn coverage_slot(&mut self, label: u32) -> &mut u8 {
        match self.coverage.get_mut(label as usize) {
            Some(slot) => slot,
            None => self.coverage_extra.entry(label).or_insert(COV_ABSENT),
        }
    }

    fn same_config(&self, other: &Self) -> bool {
        self.k_max == other.k_max
            && self.policy == other.policy
            && self.unseen_inv_prop.to_bits() == other.unseen_inv_prop.to_bits()
            && (Arc::ptr_eq(&self.inv_prop, &other.inv_prop)
                || (self.inv_prop.len() == other.inv_prop.len()
                    && self
                        .inv_prop
                        .iter()
                        .zip(other.inv_prop.iter())
                        .all(|(a, b)| a.to_bits() == b.to_bits())))
    }

    /// Adds the rows of `other` (an accumulator with the same k_max, policy and
    /// propensities). Exact: any grouping of merges gives bit-identical metrics.
    pub fn merge(&mut self, other: &Self) -> Result<()> {
        ensure!(
            self.same_config(other),
            "cannot merge metric accumulators with different k_max, policy or propensities"
        );
        for (a, b) in [
            (&self.ndcg, &other.ndcg),
            (&self.psp_num, &other.psp_num),
            (&self.psp_den, &other.psp_den),
            (&self.psndcg_num, &other.psndcg_num),
            (&self.psndcg_den, &other.psndcg_den),
        ] {
            ensure!(
                a.iter().zip(b).all(|(x, y)| x.checked_add(*y).is_some()),
                "fixed-point metric sum overflow"
            );
        }
        self.rows += other.rows;
        self.labelless_rows += other.labelless_rows;
        for (a, b) in self.hits.iter_mut().zip(&other.hits) {
            *a += *b;
        }
        add_all_i128(&mut self.ndcg, &other.ndcg)?;
        add_all_i128(&mut self.psp_num, &other.psp_num)?;
        add_all_i128(&mut self.psp_den, &other.psp_den)?;
        add_all_i128(&mut self.psndcg_num, &other.psndcg_num)?;
        add_all_i128(&mut self.psndcg_den, &other.psndcg_den)?;
        let merge_code = |a: u8, b: u8| match (a, b) {
            (COV_ABSENT, x) | (x, COV_ABSENT) => x,
            (x, y) => x.min(y),
        };
        for (a, &b) in self.coverage.iter_mut().zip(&other.coverage) {
            *a = merge_code(*a, b);
        }
        for (&l, &b) in &other.coverage_extra {
            let a = self.coverage_extra.entry(l).or_insert(COV_ABSENT);
            *a = merge_code(*a, b);
        }
        Ok(())
    }

    /// An accumulator with the same configuration and no rows.
    pub fn empty_like(&self) -> Self {
        Self {
            k_max: self.k_max,
            inv_prop: Arc::clone(&self.inv_prop),
            unseen_inv_prop: self.unseen_inv_prop,
            policy: self.policy,
            rows: 0,
            labelless_rows: 0,
            hits: vec![0; self.k_max],
            ndcg: vec![0; self.k_max],
            psp_num: vec![0; self.k_max],
            psp_den: vec![0; self.k_max],
            psndcg_num: vec![0; self.k_max],
            psndcg_den: vec![0; self.k_max],
            coverage: vec![COV_ABSENT; self.inv_prop.len()],
            coverage_extra: BTreeMap::new(),
            discount: Arc::clone(&self.discount),
            idcg: Arc::clone(&self.idcg),
            scratch: Scratch::default(),
        }
    }

    /// The metrics of the rows added so far.
    pub fn finish(&self) -> Metrics {
        let k_max = self.k_max;
        let mean_rows = match self.policy {
            LabellessRows::CountAsZero => self.rows,
            LabellessRows::Skip => self.rows - self.labelless_rows,
        } as f64;
        let mut p_at = Vec::with_capacity(k_max);
        let mut ndcg_at = Vec::with_capacity(k_max);
        let mut psp_at = Vec::with_capacity(k_max);
        let mut psndcg_at = Vec::with_capacity(k_max);
        for k in 1..=k_max {
            p_at.push(ratio(self.hits[k - 1] as f64, k as f64 * mean_rows));
            ndcg_at.push(ratio(from_fixed(self.ndcg[k - 1]), mean_rows));
            psp_at.push(ratio(
                self.psp_num[k - 1] as f64,
                self.psp_den[k - 1] as f64,
            ));
            psndcg_at.push(ratio(
                self.psndcg_num[k - 1] as f64,
                self.psndcg_den[k - 1] as f64,
            ));
        }
        // Histogram of best hit ranks over the distinct test labels.
        let mut first_hit = vec![0u64; k_max + 1];
        let mut test_labels = 0u64;
        for &c in self.coverage.iter().chain(self.coverage_extra.values()) {
            if c != COV_ABSENT {
                test_labels += 1;
                if c != COV_MISSED {
                    first_hit[c as usize] += 1;
                }
            }
        }
        let mut covered_labels_at = Vec::with_capacity(k_max);
        let mut covered = 0u64;
        for &n in &first_hit[1..] {
            covered += n;
            covered_labels_at.push(covered);
        }
        let coverage_at = covered_labels_at
            .iter()
            .map(|&c| ratio(c as f64, test_labels as f64))
            .collect();
        Metrics {
            k_max,
            policy: self.policy,
            rows: self.rows,
            labelless_rows: self.labelless_rows,
            test_labels,
            p_at,
            ndcg_at,
            psp_at,
            psndcg_at,
            coverage_at,
            covered_labels_at,
            calibration: None,
        }
    }
}

/// The metrics of `rows` = (predicted labels best first, true labels) pairs; see
/// [`MetricsAccumulator`].
pub fn ranking_metrics<'a>(
    k_max: usize,
    inv_prop: impl Into<Arc<[f64]>>,
    policy: LabellessRows,
    rows: impl IntoIterator<Item = (&'a [u32], &'a [u32])>,
) -> Result<Metrics> {
    let mut acc = MetricsAccumulator::new(k_max, inv_prop, policy)?;
    for (i, (pred, truth)) in rows.into_iter().enumerate() {
        acc.add_row(pred, truth)
            .map_err(|e| e.context(format!("test row {i}")))?;
    }
    Ok(acc.finish())
}

/// Metrics for k = 1..=k_max (vectors indexed by k − 1), as fractions in [0, 1].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Metrics {
    pub k_max: usize,
    pub policy: LabellessRows,
    /// Rows added, label-less ones included.
    pub rows: u64,
    /// Rows without any true label.
    pub labelless_rows: u64,
    /// Distinct labels present in the test truth.
    pub test_labels: u64,
    pub p_at: Vec<f64>,
    pub ndcg_at: Vec<f64>,
    pub psp_at: Vec<f64>,
    pub psndcg_at: Vec<f64>,
    /// covered_labels_at / test_labels.
    pub coverage_at: Vec<f64>,
    /// Distinct test labels correctly predicted within the top k of at least one row.
    pub covered_labels_at: Vec<u64>,
    /// Calibration of the listed labels' probabilities over (row, label) pairs, when the
    /// predictions carry them (`pipeline evaluate` sets it). Absent from the JSON otherwise,
    /// so files of probability-less evaluations are what they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
}

impl Metrics {
    /// The values of `measure` at k = 1..=k_max (index k − 1).
    pub fn at_k(&self, measure: AtK) -> &[f64] {
        match measure {
            AtK::P => &self.p_at,
            AtK::Ndcg => &self.ndcg_at,
            AtK::Psp => &self.psp_at,
            AtK::Psndcg => &self.psndcg_at,
            AtK::Coverage => &self.coverage_at,
        }
    }

    /// Pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("metrics serialise to JSON")
    }

    /// Fixed-width text table, one line per metric and one column per k, in percent with
    /// two decimals, under a line with the row and label counts.
    pub fn to_table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "rows {} (label-less {}, {:?}), test labels {}",
            self.rows, self.labelless_rows, self.policy, self.test_labels
        );
        let _ = write!(s, "{:<10}", "metric");
        for k in 1..=self.k_max {
            let _ = write!(s, "{:>8}", format!("@{k}"));
        }
        s.push('\n');
        for &measure in AtK::ALL {
            let _ = write!(s, "{:<10}", measure.prefix());
            for v in self.at_k(measure) {
                let _ = write!(s, "{:>8.2}", 100.0 * v);
            }
            s.push('\n');
        }
        s
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_table())
    }
}

/// Fills `dst` with `src` sorted; returns a label that appears twice, if any.
fn sorted_with_duplicate(dst: &mut Vec<u32>, src: &[u32]) -> Option<u32> {
    dst.clear();
    dst.extend_from_slice(src);
    dst.sort_unstable();
    dst.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// The catalog rows recorded for `m` (names like `P@1`, values as fractions).
pub fn metric_rows(m: &Metrics, step: Option<i64>, split: Option<Split>) -> Vec<MetricRow> {
    let mut rows = Vec::new();
    for k in 1..=m.k_max {
        for &measure in AtK::ALL {
            rows.push(MetricRow {
                name: measure.at(k),
                value: m.at_k(measure)[k - 1],
                step,
                split,
            });
        }
    }
    rows
}
