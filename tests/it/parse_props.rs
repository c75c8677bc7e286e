//! Property tests of the row parser: it never panics on any input, and valid rows written
//! out as text are read back exactly.

use fsgp::text::parse::{
    parse_block, parse_bow_block, parse_header, LineSyntax, ParsedBlock, RowRules, MAX_IDS,
};
use fsgp::transform::Transform;
use proptest::prelude::*;

fn rules(lenient: bool, normalize: bool, index_base: u32) -> RowRules {
    RowRules {
        transform: match normalize {
            true => Transform::L2,
            false => Transform::None,
        },
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

/// Bytes that look like rows often enough to reach every check: row syntax bytes, ids at
/// and beyond the limit (2^31 - 1), integers of any size, and any byte at all.
fn row_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        4 => prop::sample::select(b" :,\n\t\r-+.e#qid0123456789".to_vec()).prop_map(|b| vec![b]),
        1 => any::<u8>().prop_map(|b| vec![b]),
        1 => any::<u64>().prop_map(|v| v.to_string().into_bytes()),
        1 => prop::sample::select(vec![
            "2147483646", "2147483647", "2147483648", "4000000000",
            "9223372036854775807", "99999999999999999999999",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
    ];
    prop::collection::vec(piece, 0..120).prop_map(|p| p.concat())
}

/// The lines the parser sees in a block (a last line without '\n' counts).
fn lines_of(bytes: &[u8]) -> u64 {
    let newlines = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
    newlines + u64::from(!bytes.is_empty() && bytes.last() != Some(&b'\n'))
}

/// What a parsed block may hold, given its input: no more rows than lines; no more feature
/// entries than `id:value` tokens fit (each at least 3 bytes and a separator) nor label
/// entries than ids fit (a digit and a separator); every id below the limit. So nothing the
/// parser keeps is sized by a value read from the input, only by the input's length.
fn assert_bounded(
    block: &ParsedBlock,
    input_bytes: usize,
    lines: u64,
) -> Result<(), TestCaseError> {
    let rows = &block.rows;
    prop_assert!(rows.len() as u64 <= lines);
    prop_assert!(4 * rows.indices.len() <= input_bytes + 1);
    prop_assert!(2 * rows.labels.len() <= input_bytes + 1);
    prop_assert!(rows
        .indices
        .iter()
        .chain(&rows.labels)
        .all(|&id| id < MAX_IDS));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Under the widest rules (D = L = the limit, as the LIBSVM scan pass parses), any bytes
    /// give a bounded block or an error naming one of the block's lines and saying what was
    /// found.
    #[test]
    fn any_bytes_give_bounded_rows_or_an_error_naming_a_line(bytes in row_like_bytes(), labels in row_like_bytes(), lenient: bool, base in 0u32..2, syntax in 0usize..4) {
        const FIRST: u64 = 5;
        let syntax = [LineSyntax::LabelsFeatures, LineSyntax::Features, LineSyntax::LabelValues, LineSyntax::Libsvm][syntax];
        let rules = RowRules { lenient, ..RowRules::new(MAX_IDS, MAX_IDS, base) };
        let lines = lines_of(&bytes);
        let named = |line: u64| (FIRST..FIRST + lines.max(1)).contains(&line);
        let terminated = bytes.last() == Some(&b'\n');
        match parse_block(&bytes, FIRST, terminated, syntax, &rules) {
            Ok(block) => assert_bounded(&block, bytes.len(), lines)?,
            Err((source, e)) => {
                prop_assert_eq!(source, 0);
                prop_assert!(named(e.line), "line {} of {lines}: {e}", e.line);
                prop_assert!(e.msg.starts_with("found "), "{e}");
            }
        }
        let label_terminated = labels.last() == Some(&b'\n');
        match parse_bow_block(&bytes, &labels, FIRST, (terminated, label_terminated), &rules) {
            Ok(block) => assert_bounded(&block, bytes.len() + labels.len(), lines)?,
            Err((source, e)) => {
                prop_assert!(source <= 1);
                prop_assert!(named(e.line), "line {} of {lines}: {e}", e.line);
                prop_assert!(e.msg.starts_with("found "), "{e}");
            }
        }
        match parse_header(&bytes, &["N", "D", "L"]) {
            Ok(values) => prop_assert_eq!(values.len(), 3),
            Err(msg) => prop_assert!(msg.starts_with("found "), "{msg}"),
        }
    }

    /// An id above the limit is refused as too large, whatever its size, never wrapped or
    /// taken as "not an integer".
    #[test]
    fn ids_beyond_the_limit_are_too_large(above in 0..=u64::MAX - (1 << 31), extra_digits in 0usize..4, base in 0u32..2, label: bool) {
        let id = u64::from(MAX_IDS) + u64::from(base) + above;
        let id = format!("{id}{}", "9".repeat(extra_digits));
        let row = if label { format!("{id} 1:1\n") } else { format!("1 {id}:1\n") };
        let rules = RowRules::new(MAX_IDS, MAX_IDS, base);
        let (_, e) = parse_block(row.as_bytes(), 3, true, LineSyntax::LabelsFeatures, &rules).unwrap_err();
        prop_assert_eq!(e.line, 3);
        let what = if label { "label" } else { "feature" };
        let largest = u64::from(MAX_IDS) - 1 + u64::from(base);
        let expected = format!("found {what} id {}, expected at most {largest}: it is larger", &id[..id.len().min(40)]);
        prop_assert!(e.msg.starts_with(&expected), "{e}");
    }
}
