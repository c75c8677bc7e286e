//! The class map of a dataset whose label ids were assigned at ingest (LIBSVM files, and
//! `--first-label` on any layout): label id → the label as written in the input, so that
//! predictions can be read back in the original labels.
//!
//! Stored as JSON text in the catalog's `datasets.class_map` column (`docs/formats.md`,
//! "Label kinds and the class map"): `{"values":[v_0, v_1, ...]}`, plus `"negative":v` for a
//! binary dataset (the label of the rows that have no positive label). The values are
//! strictly increasing, so label id = rank of the value in ascending numeric order. A map
//! built from the training rows only (`ingest --class-map train`) adds `"unseen"`: per
//! other split, the classes of its rows that no training row has, and how many rows are of
//! them (those rows are stored without a label id).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::kinds::Split;

/// Label id → original label value, and for binary datasets the negative class's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassMap {
    /// `values[id]` is the original label of label id `id`; strictly increasing.
    pub values: Vec<i64>,
    /// Binary datasets: the original label of the rows without a positive label (None when
    /// the input held positive rows only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub negative: Option<i64>,
    /// `--class-map train`: per split other than train, its classes absent from the training
    /// rows; empty (and absent from the text) otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unseen: Vec<UnseenClasses>,
}

/// The classes of one split that the training rows lack, and its rows of those classes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnseenClasses {
    pub split: Split,
    /// The original labels, strictly increasing.
    pub values: Vec<i64>,
    /// Rows of the split whose class is one of `values` (stored without a label id).
    pub rows: u64,
}

impl ClassMap {
    /// A map over `values`, which must be strictly increasing.
    pub fn new(values: Vec<i64>, negative: Option<i64>) -> Result<Self> {
        if let Some(w) = values.windows(2).find(|w| w[0] >= w[1]) {
            bail!(
                "class map: found {} before {}, expected strictly increasing label values",
                w[0],
                w[1]
            );
        }
        Ok(ClassMap {
            values,
            negative,
            unseen: Vec::new(),
        })
    }

    /// Whether `value` is a class of some split that the training rows lack.
    pub fn is_unseen(&self, value: i64) -> bool {
        self.unseen
            .iter()
            .any(|u| u.values.binary_search(&value).is_ok())
    }

    /// The unseen classes of `split`, if it has any.
    pub fn unseen_in(&self, split: Split) -> Option<&UnseenClasses> {
        self.unseen.iter().find(|u| u.split == split)
    }

    /// Number of label ids (L).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The label id of original label `value`, if it has one.
    pub fn id_of(&self, value: i64) -> Option<u32> {
        self.values.binary_search(&value).ok().map(|i| i as u32)
    }

    /// The original label of label id `id`.
    pub fn value_of(&self, id: u32) -> Option<i64> {
        self.values.get(id as usize).copied()
    }

    /// The catalog's text of the map.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a class map serialises")
    }

    /// Reads the catalog's text of a map, checking it.
    pub fn from_text(text: &str) -> Result<Self> {
        let map: ClassMap = serde_json::from_str(text)
            .with_context(|| format!("class map '{text}': expected {{\"values\": [...]}}"))?;
        let unseen = map.unseen;
        let mut checked = ClassMap::new(map.values, map.negative)?;
        checked.unseen = unseen;
        Ok(checked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_its_text_and_maps_both_ways() {
        let map = ClassMap::new(vec![-3, 0, 7], None).unwrap();
        assert_eq!(map.to_text(), r#"{"values":[-3,0,7]}"#);
        assert_eq!(ClassMap::from_text(&map.to_text()).unwrap(), map);
        assert_eq!(map.id_of(7), Some(2));
        assert_eq!(map.id_of(1), None);
        assert_eq!(map.value_of(1), Some(0));
        let binary = ClassMap::new(vec![1], Some(-1)).unwrap();
        assert_eq!(binary.to_text(), r#"{"values":[1],"negative":-1}"#);
        assert_eq!(ClassMap::from_text(&binary.to_text()).unwrap(), binary);
        assert!(ClassMap::new(vec![1, 1], None).is_err());
        assert!(ClassMap::from_text(r#"{"values":[2,1]}"#).is_err());
    }
}
