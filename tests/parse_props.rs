//! Property tests of the row parser: it never panics on any input, and valid rows written
//! out as text are read back exactly.

use fsgp::ingest::parse::{parse_block, parse_bow_block, parse_header, LineSyntax, RowRules};
use proptest::prelude::*;

fn rules(lenient: bool, normalize: bool, index_base: u32) -> RowRules {
    RowRules {
        normalize,
        lenient,
        ..RowRules::new(50, 20, index_base)
    }
}

/// Valid rows: sorted unique labels < 20, sorted unique features < 50, finite values.
fn valid_row() -> impl Strategy<Value = (Vec<u32>, Vec<(u32, f32)>)> {
    (
        prop::collection::btree_set(0u32..20, 0..5),
        prop::collection::btree_map(0u32..50, -1.0e6f32..1.0e6, 0..12),
    )
        .prop_map(|(l, f)| (l.into_iter().collect(), f.into_iter().collect()))
}

fn format_row(labels: &[u32], feats: &[(u32, f32)]) -> String {
    let l = labels
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let f = feats
        .iter()
        .map(|(i, v)| format!("{i}:{v}"))
        .collect::<Vec<_>>()
        .join(" ");
    match (l.is_empty(), f.is_empty()) {
        (true, _) => f,
        (false, true) => l,
        (false, false) => format!("{l} {f}"),
    }
}

/// Byte-level mutations of a valid line: deletions, insertions of tricky bytes, swaps.
fn mutate(line: String, edits: Vec<(usize, u8, u8)>) -> Vec<u8> {
    const TRICKY: &[u8] = b" :,\t\r-+.eE0123456789nNaAiIfF\x00\xff";
    let mut bytes = line.into_bytes();
    for (pos, kind, byte) in edits {
        let at = if bytes.is_empty() {
            0
        } else {
            pos % (bytes.len() + 1)
        };
        let b = TRICKY[byte as usize % TRICKY.len()];
        match kind % 3 {
            0 if at < bytes.len() => {
                bytes.remove(at);
            }
            1 => bytes.insert(at, b),
            _ if at < bytes.len() => bytes[at] = b,
            _ => bytes.push(b),
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics_on_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300), lenient: bool, normalize: bool, base in 0u32..2, terminated: bool) {
        for syntax in [LineSyntax::LabelsFeatures, LineSyntax::Features, LineSyntax::LabelValues, LineSyntax::Libsvm] {
            let _ = parse_block(&bytes, 2, terminated, syntax, &rules(lenient, normalize, base));
        }
        let _ = parse_bow_block(&bytes, &bytes[bytes.len() / 2..], 2, (terminated, true), &rules(lenient, normalize, base));
        let _ = parse_header(&bytes, &["N", "D", "L"]);
    }

    #[test]
    fn never_panics_on_mutated_valid_lines(rows in prop::collection::vec(valid_row(), 1..6), edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6), lenient: bool) {
        let text = rows.iter().map(|(l, f)| format_row(l, f)).collect::<Vec<_>>().join("\n") + "\n";
        let bytes = mutate(text, edits);
        let r = rules(lenient, true, 0);
        match parse_block(&bytes, 2, bytes.last() == Some(&b'\n'), LineSyntax::LabelsFeatures, &r) {
            Ok(block) => {
                // Whatever was accepted satisfies the output invariants.
                for row in block.rows.rows() {
                    prop_assert!(row.labels.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(row.indices.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(row.labels.iter().all(|&l| l < 20));
                    prop_assert!(row.indices.iter().all(|&i| i < 50));
                    prop_assert!(row.values.iter().all(|v| v.is_finite()));
                    prop_assert!(row.sq_norm.is_finite());
                }
            }
            Err((_, e)) => {
                prop_assert!(e.line >= 2, "error names a data line: {e}");
                prop_assert!(e.msg.contains("expected"), "error says what was expected: {e}");
            }
        }
    }

    #[test]
    fn valid_rows_read_back_exactly(rows in prop::collection::vec(valid_row(), 0..20)) {
        let text: String = rows.iter().map(|(l, f)| format_row(l, f) + "\n").collect();
        let block = parse_block(text.as_bytes(), 2, true, LineSyntax::LabelsFeatures, &rules(false, false, 0)).unwrap();
        prop_assert_eq!(block.rows.len(), rows.len());
        for (i, (labels, feats)) in rows.iter().enumerate() {
            let row = block.rows.row(i);
            prop_assert_eq!(row.row_id, i as u64 + 2);
            prop_assert_eq!(row.labels, &labels[..]);
            prop_assert_eq!(row.indices, &feats.iter().map(|f| f.0).collect::<Vec<_>>()[..]);
            // f32 → shortest decimal → f64 → f32 is exact.
            prop_assert_eq!(row.values, &feats.iter().map(|f| f.1).collect::<Vec<_>>()[..]);
        }
    }
}
