//! Feature transforms: what happens to a row's feature values before they are stored, fitted
//! on the training split at ingest and recorded with the dataset, so that every split (and
//! any later row) goes through the same map. `docs/transforms.md` gives the rules and why.
//!
//! - [`TransformChoice`]: the closed set of names (`ingest --transform`);
//! - [`FeatureStats`]: the training split's per-feature statistics, gathered in one
//!   streaming pass (memory O(D), the values are never held);
//! - [`decide_auto`]: `auto`'s choice from those statistics, with its reason;
//! - [`Transform`]: a resolved transform, applied to one row at a time.

use std::sync::Arc;

use crate::choice::choice_enum;

choice_enum! {
    /// How feature values are transformed at ingest (`--transform`).
    #[derive(Default)]
    pub enum TransformChoice("transform") {
        /// Decided from the training split by [`decide_auto`].
        #[default]
        Auto = "auto" => "decide from the training split (dense or mixed-scale or signed \
                          features: standardize or scale; sparse non-negative features on one \
                          scale: l2); the decision and its reason are printed and recorded",
        /// The values as in the file.
        None = "none" => "store the values as in the file",
        /// Each row scaled to unit Euclidean length.
        L2 = "l2" => "scale each row to unit Euclidean length (word counts, tf-idf, pixel \
                      intensities)",
        /// Per feature, (x − mean) / sd of the training split.
        Standardize = "standardize" => "per feature (x - mean) / sd of the training split; \
                                        every row stores all D values",
        /// Per feature, x / sd of the training split.
        Scale = "scale" => "per feature x / sd of the training split; zeros stay zeros, so \
                            sparse rows stay sparse",
        /// Sublinear tf-idf, then unit length.
        Tfidf = "tfidf" => "word counts as tf-idf: each value v becomes ln(1 + v) times its \
                            feature's idf on the training split, ln((1 + N) / (1 + df)) + 1, \
                            then each row is scaled to unit length; features no training row \
                            has are dropped",
    }
}

impl TransformChoice {
    /// Whether the transform needs the training split's statistics (a pass over its rows
    /// before the rows are written).
    pub fn needs_statistics(self) -> bool {
        match self {
            TransformChoice::Auto
            | TransformChoice::Standardize
            | TransformChoice::Scale
            | TransformChoice::Tfidf => true,
            TransformChoice::None | TransformChoice::L2 => false,
        }
    }
}

/// `auto` standardises (centres) when at least this share of the training values is
/// non-zero: centring then stores at most 1 / share times the values the file holds.
pub const DENSE_SHARE: f64 = 0.5;

/// `auto` calls sparse non-negative features mixed-scale when the largest feature's largest
/// |value| exceeds the median feature's by more than this factor (orders of magnitude:
/// frequencies beside run lengths, not the spread of word counts or pixel intensities).
pub const MIXED_SCALE_RATIO: f64 = 100.0;

/// `auto` calls sparse non-negative fractional features range-scaled when the largest
/// feature's largest value is within this factor of the median feature's: the features
/// share one range, as pixel intensities or values scaled to [0, c] per feature do (MNIST:
/// exactly 1). tf-idf values do not: a feature's largest value follows its idf, and on the
/// generated text of `pipeline synth` the ratio is 2.3.
pub const SHARED_RANGE_RATIO: f64 = 1.1;

/// Per-feature affine map fitted on the training split, `v ↦ (v − shift) · scale`, over
/// the features that occur in the training rows (`ids`, increasing); every other feature is
/// left as it is (shift 0, scale 1), so the map's size follows the training data, not D.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureScaling {
    /// Feature ids, strictly increasing.
    pub ids: Vec<u32>,
    /// The training mean of each (`standardize`), or 0 (`scale`); same length as `ids`.
    pub shift: Vec<f64>,
    /// 1 / the training standard deviation of each, or 1 where it is 0 (a feature constant
    /// over the training rows); same length as `ids`.
    pub scale: Vec<f64>,
}

impl FeatureScaling {
    /// The scale of feature `id` (1 for a feature the training rows do not have).
    fn scale_of(&self, id: u32) -> f64 {
        self.ids.binary_search(&id).map_or(1.0, |i| self.scale[i])
    }

    /// The idf of feature `id` a `tfidf` map holds; None for a feature the training rows
    /// do not have.
    fn idf_of(&self, id: u32) -> Option<f64> {
        self.ids.binary_search(&id).ok().map(|i| self.scale[i])
    }
}

/// Pushes each feature's `weight(id, value)` divided by the weights' Euclidean norm: the
/// norm in f64 over the features in ascending order, then one rounding per value (at
/// `push`). A row whose weights are all 0 is pushed unscaled. `l2` (weight: the value) and
/// `tfidf` (weight: its tf-idf) share it, so both scale by the same arithmetic.
fn to_unit_length(
    features: &[(u32, f64)],
    weight: impl Fn(u32, f64) -> f64,
    push: &mut impl FnMut(u32, f64, f64) -> Result<(), (u32, f64)>,
) -> Result<(), (u32, f64)> {
    let norm = features
        .iter()
        .map(|&(id, v)| {
            let w = weight(id, v);
            w * w
        })
        .sum::<f64>()
        .sqrt();
    let inv = if norm > 0.0 { 1.0 / norm } else { 1.0 };
    for &(id, v) in features {
        push(id, v, weight(id, v) * inv)?;
    }
    Ok(())
}

/// tf-idf's sublinear term frequency, `sign(v) ln(1 + |v|)`: ln(1 + count) for counts, and
/// odd so that a signed value keeps its sign rather than being refused.
fn sublinear(v: f64) -> f64 {
    v.signum() * v.abs().ln_1p()
}

/// A resolved transform (never `auto`).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Transform {
    #[default]
    None,
    L2,
    /// `x / sd`: the shift is 0.
    Scale(Arc<FeatureScaling>),
    /// `(x − mean) / sd`: every feature of every row is stored (zeros become `−mean / sd`).
    Standardize(Arc<FeatureScaling>),
    /// `sign(x) ln(1 + |x|) · idf`, then the row scaled to unit length: the scaling's
    /// `scale` holds each training feature's idf (its shift is 0); a feature it lacks is
    /// dropped.
    Tfidf(Arc<FeatureScaling>),
}

impl Transform {
    /// The transform a dataset recorded as `choice`, fitted ones with the statistics
    /// `scaling` gives (asked for only by `scale` and `standardize`). `auto` is refused: a
    /// dataset records what auto decided, never auto itself.
    pub fn from_recorded(
        choice: TransformChoice,
        scaling: impl FnOnce() -> anyhow::Result<FeatureScaling>,
    ) -> anyhow::Result<Transform> {
        Ok(match choice {
            TransformChoice::None => Transform::None,
            TransformChoice::L2 => Transform::L2,
            TransformChoice::Scale => Transform::Scale(Arc::new(scaling()?)),
            TransformChoice::Standardize => Transform::Standardize(Arc::new(scaling()?)),
            TransformChoice::Tfidf => Transform::Tfidf(Arc::new(scaling()?)),
            TransformChoice::Auto => {
                anyhow::bail!("transform 'auto' recorded, expected the one auto decided")
            }
        })
    }

    /// The catalog's name of this transform.
    pub fn choice(&self) -> TransformChoice {
        match self {
            Transform::None => TransformChoice::None,
            Transform::L2 => TransformChoice::L2,
            Transform::Scale(_) => TransformChoice::Scale,
            Transform::Standardize(_) => TransformChoice::Standardize,
            Transform::Tfidf(_) => TransformChoice::Tfidf,
        }
    }

    /// The fitted per-feature map, for the transforms that have one.
    pub fn scaling(&self) -> Option<&FeatureScaling> {
        match self {
            Transform::None | Transform::L2 => None,
            Transform::Scale(s) | Transform::Standardize(s) | Transform::Tfidf(s) => Some(s),
        }
    }

    /// The transform `choice` names with the statistics of the training split (`None`:
    /// not gathered, for the choices that need none).
    pub fn fitted(choice: TransformChoice, stats: Option<&FeatureStats>) -> Transform {
        let stats = || stats.expect("statistics gathered for a transform that needs them");
        match choice {
            TransformChoice::None => Transform::None,
            TransformChoice::L2 => Transform::L2,
            TransformChoice::Scale => Transform::Scale(Arc::new(stats().scaling(false))),
            TransformChoice::Standardize => Transform::Standardize(Arc::new(stats().scaling(true))),
            TransformChoice::Tfidf => Transform::Tfidf(Arc::new(stats().idf())),
            TransformChoice::Auto => unreachable!("auto is resolved by decide_auto first"),
        }
    }

    /// Transforms one row: `features` are (feature id, value) sorted by id, all ids < D
    /// (the scaling's length); the stored (id, f32 value) pairs are appended to `indices`
    /// and `values` (cleared first) in id order, exact zeros omitted. Values are computed
    /// in f64 and rounded once. A result that does not fit in f32 is returned as
    /// `Err((feature id, value in the file))`.
    pub fn apply(
        &self,
        features: &[(u32, f64)],
        indices: &mut Vec<u32>,
        values: &mut Vec<f32>,
    ) -> Result<(), (u32, f64)> {
        indices.clear();
        values.clear();
        let mut push = |id: u32, raw: f64, transformed: f64| {
            let stored = transformed as f32;
            if !stored.is_finite() {
                return Err((id, raw));
            }
            if stored != 0.0 || matches!(self, Transform::None | Transform::L2) {
                indices.push(id);
                values.push(stored);
            }
            Ok(())
        };
        match self {
            Transform::None => {
                for &(id, v) in features {
                    push(id, v, v)?;
                }
            }
            Transform::L2 => to_unit_length(features, |_, v| v, &mut push)?,
            Transform::Scale(s) => {
                for &(id, v) in features {
                    push(id, v, v * s.scale_of(id))?;
                }
            }
            Transform::Tfidf(s) => to_unit_length(
                features,
                |id, v| s.idf_of(id).map_or(0.0, |idf| sublinear(v) * idf),
                &mut push,
            )?,
            Transform::Standardize(s) => {
                // Merge the row's features with the fitted ones: a fitted feature the row
                // does not list is 0 there; a listed one the fit lacks is left as it is.
                let mut row = features.iter().peekable();
                let mut fit = s.ids.iter().enumerate().peekable();
                loop {
                    let next_row = row.peek().map(|f| f.0);
                    let next_fit = fit.peek().map(|f| *f.1);
                    match (next_row, next_fit) {
                        (None, None) => break,
                        (Some(r), f) if f.is_none_or(|f| r < f) => {
                            let &(id, v) = row.next().expect("peeked");
                            push(id, v, v)?;
                        }
                        (r, Some(f)) => {
                            let (i, _) = fit.next().expect("peeked");
                            let v = match r == Some(f) {
                                true => row.next().expect("peeked").1,
                                false => 0.0,
                            };
                            push(f, v, (v - s.shift[i]) * s.scale[i])?;
                        }
                        (Some(_), None) => unreachable!("covered by the arm above"),
                    }
                }
            }
        }
        Ok(())
    }
}

/// Feature ids below this are counted in a vector indexed by id, the rest in a map: D is
/// often a few thousand, but a LIBSVM file may use ids up to 2³¹ − 2 (32 MiB at most).
const INDEXED_IDS: u32 = 1 << 20;

/// One feature's non-zero training values: how many, their mean, their sum of squared
/// deviations from that mean (Welford), and the largest |value|.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Moments {
    count: u64,
    mean: f64,
    m2: f64,
    max_abs: f64,
}

impl Moments {
    fn add(&mut self, v: f64) {
        self.count += 1;
        let delta = v - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (v - self.mean);
        self.max_abs = self.max_abs.max(v.abs());
    }

    /// Mean and population sd over `rows` rows, the rows without a value counting as 0
    /// (Chan's merge of the non-zero group with `rows − count` zeros).
    fn mean_sd(&self, rows: u64) -> (f64, f64) {
        if rows == 0 {
            return (0.0, 0.0);
        }
        let (n, c) = (rows as f64, self.count as f64);
        let mean = c * self.mean / n;
        let m2 = self.m2 + c * (self.mean - mean).powi(2) + (n - c) * mean * mean;
        (mean, (m2 / n).max(0.0).sqrt())
    }
}

/// The training split's per-feature statistics over all its rows (a feature a row does not
/// list counts as 0 there), gathered row by row: Welford's mean and sum of squared
/// deviations over each feature's non-zero values, merged with the zeros at the end, so a
/// feature far from 0 with a small spread keeps its precision. Memory: four numbers per
/// feature id below [`INDEXED_IDS`] up to the largest seen, and per distinct id above.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FeatureStats {
    rows: u64,
    indexed: Vec<Moments>,
    mapped: std::collections::HashMap<u32, Moments>,
    /// Over all non-zero values: how many, how many negative, how many not whole numbers.
    nonzeros: u64,
    negatives: u64,
    fractional: u64,
}

impl FeatureStats {
    /// Adds one row: its feature ids and values.
    pub fn add_row(&mut self, indices: &[u32], values: &[f32]) {
        self.rows += 1;
        for (&id, &v) in indices.iter().zip(values) {
            let v = f64::from(v);
            if v == 0.0 {
                continue;
            }
            let moments = match id < INDEXED_IDS {
                true => {
                    if self.indexed.len() <= id as usize {
                        self.indexed.resize(id as usize + 1, Moments::default());
                    }
                    &mut self.indexed[id as usize]
                }
                false => self.mapped.entry(id).or_default(),
            };
            moments.add(v);
            self.nonzeros += 1;
            self.negatives += u64::from(v < 0.0);
            self.fractional += u64::from(v.fract() != 0.0);
        }
    }

    /// Rows added.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The features with a non-zero training value, by increasing id.
    fn present(&self) -> Vec<(u32, Moments)> {
        let mut present: Vec<(u32, Moments)> = (0u32..)
            .zip(self.indexed.iter().copied())
            .chain(self.mapped.iter().map(|(&id, &m)| (id, m)))
            .filter(|(_, m)| m.count > 0)
            .collect();
        present.sort_by_key(|p| p.0);
        present
    }

    /// Mean and (population) standard deviation of feature `id` over all rows.
    pub fn mean_sd(&self, id: u32) -> (f64, f64) {
        let moments = match id < INDEXED_IDS {
            true => self.indexed.get(id as usize).copied(),
            false => self.mapped.get(&id).copied(),
        };
        moments.unwrap_or_default().mean_sd(self.rows)
    }

    /// The per-feature map over the features present: shift by the mean when `centre`,
    /// divide by the sd (by 1 where the sd is 0).
    pub fn scaling(&self, centre: bool) -> FeatureScaling {
        let present = self.present();
        let mut fitted = FeatureScaling {
            ids: Vec::with_capacity(present.len()),
            shift: Vec::with_capacity(present.len()),
            scale: Vec::with_capacity(present.len()),
        };
        for (id, m) in present {
            let (mean, sd) = m.mean_sd(self.rows);
            fitted.ids.push(id);
            fitted.shift.push(if centre { mean } else { 0.0 });
            fitted.scale.push(if sd > 0.0 && sd.is_finite() {
                1.0 / sd
            } else {
                1.0
            });
        }
        fitted
    }

    /// Each present feature's smoothed inverse document frequency over the training rows,
    /// `ln((1 + N) / (1 + df)) + 1` (df: the rows where it is non-zero), as a map's scale
    /// with shift 0: 1 for a feature in every row, larger the rarer it is.
    pub fn idf(&self) -> FeatureScaling {
        let present = self.present();
        let n = self.rows as f64;
        FeatureScaling {
            ids: present.iter().map(|p| p.0).collect(),
            shift: vec![0.0; present.len()],
            scale: present
                .iter()
                .map(|p| ((1.0 + n) / (1.0 + p.1.count as f64)).ln() + 1.0)
                .collect(),
        }
    }

    /// Share of the (row, feature) cells that are non-zero, over the features that occur in
    /// the training rows at all (a feature no training row has says nothing of density).
    pub fn density(&self) -> f64 {
        let present = (self.indexed.iter().chain(self.mapped.values()))
            .filter(|m| m.count > 0)
            .count() as f64;
        if present == 0.0 || self.rows == 0 {
            return 0.0;
        }
        self.nonzeros as f64 / (present * self.rows as f64)
    }

    /// The largest feature's largest |value| over the median feature's (features present).
    pub fn scale_spread(&self) -> f64 {
        let mut maxima: Vec<f64> = self.present().iter().map(|p| p.1.max_abs).collect();
        if maxima.is_empty() {
            return 1.0;
        }
        maxima.sort_by(f64::total_cmp);
        maxima[maxima.len() - 1] / maxima[maxima.len() / 2]
    }
}

/// What `auto` chose and why (printed by ingest and recorded with the dataset).
#[derive(Debug, Clone, PartialEq)]
pub struct AutoDecision {
    pub choice: TransformChoice,
    pub reason: String,
}

/// `auto`'s rule, from the training split's statistics (`docs/transforms.md`):
/// 1. dense (at least [`DENSE_SHARE`] of the values non-zero): `standardize` — a
///    single-lengthscale kernel needs features on one scale, and centring costs little;
/// 2. sparse with negative values, or sparse non-negative fractional values whose scales
///    differ by more than [`MIXED_SCALE_RATIO`]: `scale` — the same per-feature scale
///    without the centring that would fill in every zero;
/// 3. sparse, non-negative, mostly fractional values whose features share one range
///    ([`SHARED_RANGE_RATIO`]: intensities, features scaled to [0, c]): `none` — they are
///    on a common scale already;
/// 4. otherwise (sparse, non-negative, on one scale: counts, indicators, tf-idf): `l2`.
pub fn decide_auto(stats: &FeatureStats) -> AutoDecision {
    let density = stats.density();
    let spread = stats.scale_spread();
    let shown = format!(
        "{:.1} % of the training values are non-zero{}",
        100.0 * density,
        if stats.negatives > 0 {
            ", some negative"
        } else {
            ", none negative"
        }
    );
    let (choice, why) = if stats.rows == 0 || stats.nonzeros == 0 {
        (
            TransformChoice::None,
            "no non-zero training value to measure".to_string(),
        )
    } else if density >= DENSE_SHARE {
        (
            TransformChoice::Standardize,
            format!("{shown}: dense features, standardised with the training mean and sd"),
        )
    } else if stats.negatives > 0 {
        (
            TransformChoice::Scale,
            format!(
                "{shown}: sparse signed features, divided by their training sd (centring \
                 would fill in every zero)"
            ),
        )
    } else if stats.fractional > 0 && spread > MIXED_SCALE_RATIO {
        (
            TransformChoice::Scale,
            format!(
                "{shown}: sparse features whose largest values differ {spread:.0}-fold, \
                 divided by their training sd (centring would fill in every zero)"
            ),
        )
    } else if 2 * stats.fractional >= stats.nonzeros && spread <= SHARED_RANGE_RATIO {
        (
            TransformChoice::None,
            format!(
                "{shown}: sparse non-negative fractional values sharing one range (the \
                 largest feature maximum is {spread:.2} times the median's: intensities, or \
                 features already scaled to [0, c]), kept as they are: a row's magnitude is \
                 part of what it measures"
            ),
        )
    } else {
        (
            TransformChoice::L2,
            format!(
                "{shown}: sparse non-negative features on one scale (counts, indicators, \
                 tf-idf), each row scaled to unit length"
            ),
        )
    };
    AutoDecision {
        choice,
        reason: why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats_of(_d: u32, rows: &[&[(u32, f32)]]) -> FeatureStats {
        let mut s = FeatureStats::default();
        for row in rows {
            let (ids, vals): (Vec<u32>, Vec<f32>) = row.iter().copied().unzip();
            s.add_row(&ids, &vals);
        }
        s
    }

    #[test]
    fn mean_and_sd_count_absent_features_as_zero() {
        // Feature 0: 1, 2, absent, 5 → mean 2, population variance (1+0+4+9)/4 = 3.5.
        // Feature 1: absent everywhere but row 2 (value -4) → mean -1, var (1+1+9+1)/4 = 3.
        let s = stats_of(3, &[&[(0, 1.0)], &[(0, 2.0)], &[(1, -4.0)], &[(0, 5.0)]]);
        let (m0, sd0) = s.mean_sd(0);
        assert!((m0 - 2.0).abs() < 1e-15 && (sd0 - 3.5f64.sqrt()).abs() < 1e-15);
        let (m1, sd1) = s.mean_sd(1);
        assert!((m1 + 1.0).abs() < 1e-15 && (sd1 - 3f64.sqrt()).abs() < 1e-15);
        assert_eq!(s.mean_sd(2), (0.0, 0.0));
        let sc = s.scaling(true);
        assert_eq!(
            sc.ids,
            vec![0, 1],
            "a feature absent from training is left as it is"
        );
        assert_eq!(sc.shift, vec![2.0, -1.0]);
        assert_eq!(sc.scale_of(2), 1.0);
        assert_eq!(s.scaling(false).shift, vec![0.0; 2]);
    }

    #[test]
    fn welford_keeps_precision_far_from_zero() {
        // Values 1e8 + {0, 1, 2}: the naive sum of squares loses the unit spread in f64.
        let s = stats_of(1, &[&[(0, 1e8)], &[(0, 1e8 + 8.0)], &[(0, 1e8 + 16.0)]]);
        let (m, sd) = s.mean_sd(0);
        assert!((m - (1e8 + 8.0)).abs() < 1e-6);
        assert!((sd - (128.0f64 / 3.0).sqrt()).abs() < 1e-9, "sd {sd}");
    }

    #[test]
    fn standardize_fills_every_feature_and_scale_keeps_zeros() {
        let s = stats_of(3, &[&[(0, 1.0), (2, 2.0)], &[(0, 3.0)]]);
        // Feature 0: mean 2, sd 1; feature 1 absent: left as it is; feature 2: mean 1, sd 1.
        let standard = Transform::fitted(TransformChoice::Standardize, Some(&s));
        let (mut ids, mut vals) = (Vec::new(), Vec::new());
        standard
            .apply(&[(0, 1.0), (2, 2.0)], &mut ids, &mut vals)
            .unwrap();
        assert_eq!(
            ids,
            vec![0, 2],
            "feature 1 is 0 after centring and not stored"
        );
        assert_eq!(vals, vec![-1.0, 1.0]);
        standard.apply(&[(1, 5.0)], &mut ids, &mut vals).unwrap();
        assert_eq!(
            (ids.clone(), vals.clone()),
            (vec![0, 1, 2], vec![-2.0, 5.0, -1.0])
        );
        let scale = Transform::fitted(TransformChoice::Scale, Some(&s));
        scale.apply(&[(2, 4.0)], &mut ids, &mut vals).unwrap();
        assert_eq!((ids.clone(), vals.clone()), (vec![2], vec![4.0]));
        scale.apply(&[(0, 4.0)], &mut ids, &mut vals).unwrap();
        assert_eq!((ids, vals), (vec![0], vec![4.0]));
    }

    #[test]
    fn tfidf_weighs_counts_by_rarity_and_drops_unseen_features() {
        // Three training rows: feature 0 in all, feature 1 in one, feature 2 in two.
        let s = stats_of(
            3,
            &[
                &[(0, 1.0), (1, 3.0)],
                &[(0, 2.0), (2, 1.0)],
                &[(0, 1.0), (2, 4.0)],
            ],
        );
        let t = Transform::fitted(TransformChoice::Tfidf, Some(&s));
        let idf = t.scaling().unwrap();
        assert_eq!(idf.ids, vec![0, 1, 2]);
        // ln((1 + 3) / (1 + df)) + 1: df 3 → 1, df 1 → ln 2 + 1, df 2 → ln(4/3) + 1.
        let want = [1.0, 2f64.ln() + 1.0, (4.0f64 / 3.0).ln() + 1.0];
        for (got, want) in idf.scale.iter().zip(want) {
            assert!((got - want).abs() < 1e-15, "{got} {want}");
        }
        assert_eq!(idf.shift, vec![0.0; 3]);
        // A row of counts 2 (feature 0) and 3 (feature 1), and a feature (7) no training
        // row has: weights ln 3 · 1 and ln 4 · (ln 2 + 1), scaled to unit length; 7 dropped.
        let (mut ids, mut vals) = (Vec::new(), Vec::new());
        t.apply(&[(0, 2.0), (1, 3.0), (7, 5.0)], &mut ids, &mut vals)
            .unwrap();
        let (a, b) = (3f64.ln(), 4f64.ln() * want[1]);
        let norm = (a * a + b * b).sqrt();
        assert_eq!(ids, vec![0, 1]);
        assert_eq!(vals, vec![(a / norm) as f32, (b / norm) as f32]);
        // A signed value keeps its sign; a row of unseen features only stays empty.
        t.apply(&[(2, -4.0)], &mut ids, &mut vals).unwrap();
        assert_eq!((ids.clone(), vals.clone()), (vec![2], vec![-1.0]));
        t.apply(&[(9, 1.0)], &mut ids, &mut vals).unwrap();
        assert!(ids.is_empty() && vals.is_empty());
        assert_eq!(t.choice(), TransformChoice::Tfidf);
        assert!(TransformChoice::Tfidf.needs_statistics());
    }

    #[test]
    fn standardize_leaves_features_unseen_in_training_as_they_are() {
        // Fitted on features 1 and 3 only (mean 2, sd 1 each); ids near 2^31 cost no memory.
        let big = u32::MAX - 5;
        let s = stats_of(
            0,
            &[&[(1, 1.0), (3, 3.0), (big, 2.0)], &[(1, 3.0), (3, 1.0)]],
        );
        let t = Transform::fitted(TransformChoice::Standardize, Some(&s));
        assert_eq!(t.scaling().unwrap().ids, vec![1, 3, big]);
        let (mut ids, mut vals) = (Vec::new(), Vec::new());
        t.apply(
            &[(0, 5.0), (2, 7.0), (3, 4.0), (9, -1.0)],
            &mut ids,
            &mut vals,
        )
        .unwrap();
        // 0, 2, 9: unseen, as they are; 1: absent, (0 − 2)/1; 3: (4 − 2)/1; big: absent,
        // (0 − 1)/1.
        assert_eq!(ids, vec![0, 1, 2, 3, 9, big]);
        assert_eq!(vals, vec![5.0, -2.0, 7.0, 2.0, -1.0, -1.0]);
        let scale = Transform::fitted(TransformChoice::Scale, Some(&s));
        scale
            .apply(&[(2, 7.0), (3, 4.0)], &mut ids, &mut vals)
            .unwrap();
        assert_eq!((ids, vals), (vec![2, 3], vec![7.0, 4.0]));
    }

    #[test]
    fn l2_and_none_match_the_row_rules_of_old() {
        let (mut ids, mut vals) = (Vec::new(), Vec::new());
        Transform::L2
            .apply(&[(1, 3.0), (4, 4.0)], &mut ids, &mut vals)
            .unwrap();
        assert_eq!((ids.clone(), vals.clone()), (vec![1, 4], vec![0.6, 0.8]));
        Transform::None
            .apply(&[(1, 0.0), (4, 4.0)], &mut ids, &mut vals)
            .unwrap();
        assert_eq!(
            (ids, vals),
            (vec![1, 4], vec![0.0, 4.0]),
            "none stores explicit zeros as before"
        );
        let mut v = Vec::new();
        assert_eq!(
            Transform::None.apply(&[(7, 1e300)], &mut Vec::new(), &mut v),
            Err((7, 1e300))
        );
    }

    #[test]
    fn auto_decides_from_density_sign_and_scale() {
        // Sparse counts (0/1 and small integers): l2.
        let counts: Vec<Vec<(u32, f32)>> = (0..20)
            .map(|i| vec![(i % 10, 1.0 + (i % 3) as f32), ((i + 3) % 10, 1.0)])
            .collect();
        let rows: Vec<&[(u32, f32)]> = counts.iter().map(|r| r.as_slice()).collect();
        assert_eq!(
            decide_auto(&stats_of(10, &rows)).choice,
            TransformChoice::L2
        );
        // Binary 0/1 features, sparse: l2.
        let binary: Vec<Vec<(u32, f32)>> = (0..20).map(|i| vec![(i % 10, 1.0)]).collect();
        let rows: Vec<&[(u32, f32)]> = binary.iter().map(|r| r.as_slice()).collect();
        assert_eq!(
            decide_auto(&stats_of(10, &rows)).choice,
            TransformChoice::L2
        );
        // Dense and signed: standardize.
        let dense: Vec<Vec<(u32, f32)>> = (0..20)
            .map(|i| {
                (0..4)
                    .map(|j| (j, (i as f32 - 9.5) * (j + 1) as f32))
                    .collect()
            })
            .collect();
        let rows: Vec<&[(u32, f32)]> = dense.iter().map(|r| r.as_slice()).collect();
        let d = decide_auto(&stats_of(4, &rows));
        assert_eq!(d.choice, TransformChoice::Standardize);
        assert!(d.reason.contains("dense"), "{}", d.reason);
        // Dense non-negative 0/1 features are dense too.
        let ones: Vec<Vec<(u32, f32)>> = (0..20)
            .map(|i| {
                (0..4)
                    .filter(|j| (i + j) % 4 != 0)
                    .map(|j| (j, 1.0))
                    .collect()
            })
            .collect();
        let rows: Vec<&[(u32, f32)]> = ones.iter().map(|r| r.as_slice()).collect();
        assert_eq!(
            decide_auto(&stats_of(4, &rows)).choice,
            TransformChoice::Standardize
        );
        // Sparse signed: scale.
        let signed: Vec<Vec<(u32, f32)>> = (0..20)
            .map(|i| vec![(i % 10, if i % 2 == 0 { -0.5 } else { 0.25 })])
            .collect();
        let rows: Vec<&[(u32, f32)]> = signed.iter().map(|r| r.as_slice()).collect();
        assert_eq!(
            decide_auto(&stats_of(10, &rows)).choice,
            TransformChoice::Scale
        );
        // Sparse, non-negative, mixed scales (frequencies beside a run length in thousands).
        let mixed: Vec<Vec<(u32, f32)>> = (0..20)
            .map(|i| vec![(i % 9, 0.5 + (i % 4) as f32 * 0.1), (9, 1000.0 + i as f32)])
            .collect();
        let rows: Vec<&[(u32, f32)]> = mixed.iter().map(|r| r.as_slice()).collect();
        let d = decide_auto(&stats_of(10, &rows));
        assert_eq!(d.choice, TransformChoice::Scale, "{}", d.reason);
        // Nothing to measure: none.
        assert_eq!(
            decide_auto(&FeatureStats::default()).choice,
            TransformChoice::None
        );
    }
}
