//! Rows held in memory written as LIBSVM text, the layout `ingest --format libsvm` reads
//! (`label[,label...] index:value ...`, 1-based indices, LIBSVM's convention): how the
//! Python package's arrays become a file that `pipeline fit` ingests, so the engine reads
//! them exactly as it reads a user's file and the file reproduces the fit from the command
//! line. Values are written in Rust's shortest form that reads back to the same f64, which
//! the parser does, so no bit is lost on the way.

use std::io::Write;

use super::parse::{RowRules, MAX_IDS};

/// Appends one row to `out`: its labels (comma-separated; none for a row without labels)
/// and its features, given as (0-based feature id, value) pairs in the order to write them.
/// A value that is not finite or an id beyond what the parser reads is an error saying so,
/// in the parser's words.
pub fn libsvm_row(
    out: &mut Vec<u8>,
    labels: &[i64],
    features: &[(u64, f64)],
) -> Result<(), String> {
    for (i, label) in labels.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        write!(out, "{sep}{label}").expect("writing to a Vec");
    }
    for &(id, value) in features {
        let written = u32::try_from(id).ok().filter(|&i| i < MAX_IDS - 1);
        let Some(id) = written else {
            return Err(format!(
                "found feature id {id}, expected < {} (the most features a dataset may have)",
                MAX_IDS - 1
            ));
        };
        if !value.is_finite() {
            return Err(RowRules::non_finite("feature", &value.to_string(), id));
        }
        write!(out, " {}:{value}", u64::from(id) + 1).expect("writing to a Vec");
    }
    out.push(b'\n');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_rows_read_back_bit_for_bit() {
        let values = [
            0.1,
            -2.5e-300,
            1.0 / 3.0,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            -0.0,
            123456789.0,
        ];
        let features: Vec<(u64, f64)> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u64 * 7, v))
            .collect();
        let mut out = Vec::new();
        libsvm_row(&mut out, &[3, -1], &features).unwrap();
        libsvm_row(&mut out, &[], &[]).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1], "");
        let mut tokens = lines[0].split(' ');
        assert_eq!(tokens.next(), Some("3,-1"));
        for ((id, value), token) in features.iter().zip(tokens) {
            let (index, text) = token.split_once(':').unwrap();
            assert_eq!(index.parse::<u64>().unwrap(), id + 1);
            assert_eq!(
                text.parse::<f64>().unwrap().to_bits(),
                value.to_bits(),
                "{token}"
            );
        }
        let e = libsvm_row(&mut Vec::new(), &[1], &[(2, f64::NAN)]).unwrap_err();
        assert_eq!(
            e,
            "found non-finite value 'NaN' for feature 2, expected a finite number"
        );
        assert!(libsvm_row(&mut Vec::new(), &[1], &[(u64::MAX, 1.0)]).is_err());
    }
}
