//! Every kind of bad input gets `file:line: found ..., expected ...`, a non-zero exit, and
//! leaves the catalog and the workspace as they were.

use crate::common;
use common::ingest::{loc, IngestCase, GOOD};
use common::*;
use proptest::prelude::*;
use std::path::Path;
use std::time::Duration;

#[test]
fn header_declares_more_rows_than_the_body() {
    let c = IngestCase::new();
    c.train_file_fails(
        &[],
        ("t.txt", "4 5 4\n0 0:1\n1 1:1\n"),
        3,
        "found the end of the file after 2 rows, expected N = 4",
    );
}

#[test]
fn body_has_more_rows_than_the_header() {
    let c = IngestCase::new();
    c.train_file_fails(
        &[],
        ("t.txt", "1 5 4\n0 0:1\n1 1:1\n"),
        3,
        "found more rows than the header's N = 1",
    );
}

#[test]
fn feature_id_out_of_range() {
    let c = IngestCase::new();
    c.train_file_fails(
        &[],
        ("t.txt", "2 5 4\n0 0:1\n1 5:1\n"),
        3,
        "found feature id 5, expected < 5",
    );
}

#[test]
fn label_id_out_of_range() {
    let c = IngestCase::new();
    c.train_file_fails(
        &[],
        ("t.txt", "2 5 4\n0 0:1\n1,4 1:1\n"),
        3,
        "found label id 4, expected < 4",
    );
}

#[test]
fn malformed_tokens() {
    let c = IngestCase::new();
    c.train_file_fails(
        &[],
        ("t.txt", "2 5 4\n0 0:1\n1 1:0.5x\n"),
        3,
        "found value '0.5x' in token '1:0.5x', expected a decimal number",
    );
    c.train_file_fails(
        &[],
        ("u.txt", "2 5 4\n0 0=1\n1 1:1\n"),
        2,
        "found token '0=1', expected 'feature:value'",
    );
    c.train_file_fails(
        &[],
        ("v.txt", "2 5 4\n0,a 0:1\n1 1:1\n"),
        2,
        "found label id 'a', expected a non-negative integer",
    );
    c.train_file_fails(
        &[],
        ("w.txt", "2 5 x\n0 0:1\n1 1:1\n"),
        1,
        "found 'x' for L in the header",
    );
}

#[test]
fn nan_and_inf_values() {
    let c = IngestCase::new();
    c.train_file_fails(
        &[],
        ("t.txt", "2 5 4\n0 0:NaN\n1 1:1\n"),
        2,
        "found non-finite value 'NaN' for feature 0, expected a finite number",
    );
    c.train_file_fails(
        &[],
        ("u.txt", "2 5 4\n0 0:1\n1 1:-inf\n"),
        3,
        "found non-finite value '-inf'",
    );
}

#[test]
fn duplicate_feature_ids() {
    let c = IngestCase::new();
    c.train_file_fails(
        &[],
        ("t.txt", "2 5 4\n0 0:1\n1 3:1 1:1 3:2\n"),
        3,
        "found feature 3 twice in the row, expected unique feature ids",
    );
}

#[test]
fn empty_file() {
    let c = IngestCase::new();
    c.train_file_fails(
        &[],
        ("t.txt", ""),
        1,
        "found an empty file, expected a header 'N D L'",
    );
}

#[test]
fn truncated_last_line() {
    let c = IngestCase::new();
    c.train_file_fails(
        &[],
        ("t.txt", "2 5 4\n0 0:1\n1 1:0.12"),
        3,
        "found the last line without a '\\n' line end",
    );
}

#[test]
fn crlf_line_ends() {
    let c = IngestCase::new();
    c.train_file_fails(
        &[],
        ("t.txt", "2 5 4\n0 0:1\r\n1 1:1\r\n"),
        2,
        "found a CRLF line ending",
    );
    c.train_file_fails(
        &[],
        ("u.txt", "2 5 4\r\n0 0:1\r\n1 1:1\r\n"),
        1,
        "found a CRLF line ending",
    );
}

#[test]
fn test_file_disagrees_with_train_header() {
    let c = IngestCase::new();
    let tr = c.file("tr.txt", GOOD);
    let te = c.file("te.txt", "1 6 4\n0 0:1\n");
    c.fails(
        &["--train", &tr, "--test", &te],
        &loc(&te, 1),
        "found D = 6, L = 4 in the header, expected D = 5, L = 4",
    );
}

#[test]
fn missing_input_file() {
    let c = IngestCase::new();
    let missing = c.dir.path().join("nope.txt").display().to_string();
    c.fails(&["--train", &missing], &missing, "cannot open");
}

#[test]
fn missing_split_file() {
    let c = IngestCase::new();
    let data = c.file("data.txt", GOOD);
    let missing = c.dir.path().join("tr_split.txt").display().to_string();
    c.fails(
        &["--data", &data, "--train-split", &missing],
        &missing,
        "cannot open",
    );
}

#[test]
fn split_index_out_of_range() {
    let c = IngestCase::new();
    let data = c.file("data.txt", GOOD);
    let tr = c.file("trSplit.txt", "1 2\n2 1\n4 3\n");
    c.fails(
        &["--data", &data, "--train-split", &tr],
        &loc(&tr, 3),
        "found row number '4', expected a 1-based row number in 1..=3",
    );
    let tr = c.file("trSplit2.txt", "0\n");
    c.fails(
        &["--data", &data, "--train-split", &tr],
        &loc(&tr, 1),
        "found row number '0'",
    );
    let tr = c.file("trSplit3.txt", "1\n2\n");
    c.fails(
        &["--data", &data, "--train-split", &tr, "--split-column", "1"],
        &loc(&tr, 1),
        "found 1 column(s), expected at least 2",
    );
}

#[test]
fn split_row_in_both_splits() {
    let c = IngestCase::new();
    let data = c.file("data.txt", GOOD);
    let tr = c.file("trSplit.txt", "1\n2\n");
    let te = c.file("tstSplit.txt", "3\n2\n");
    c.fails(
        &["--data", &data, "--train-split", &tr, "--test-split", &te],
        &loc(&te, 2),
        "found row 2, which the training split already holds",
    );
}

#[test]
fn bow_files_disagree() {
    let c = IngestCase::new();
    let x = c.file("X.txt", "2 5\n0:1\n1:1\n");
    let y = c.file("Y.txt", "3 4\n0:1\n1:1\n2:1\n");
    c.fails(
        &["--train-features", &x, "--train-labels", &y],
        &loc(&y, 1),
        "found N = 3 in the header, expected N = 2",
    );
    let y = c.file("Y2.txt", "2 4\n0:1\n9:1\n");
    c.fails(
        &["--train-features", &x, "--train-labels", &y],
        &loc(&y, 3),
        "found label id 9, expected < 4",
    );
}

#[test]
fn lenient_skips_bad_rows_and_counts_them() {
    let c = IngestCase::new();
    let f = c.file("t.txt", "4 5 4\n0 0:1\r\n1 1:x\n2 2:1 2:3\n3 3:1");
    let out = pipeline(
        c.ws.path(),
        &["ingest", "--name", "len", "--train", &f, "--lenient"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&loc(&f, 3)),
        "skip reasons name lines: {}",
        stderr(&out)
    );
    let st = status_json(c.ws.path());
    let d = st["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "len")
        .unwrap()
        .clone();
    let train = &d["splits"][0];
    assert_eq!(train["n_rows"], 2);
    assert_eq!(train["skipped_rows"], 2);
    // File-level problems stay errors under --lenient.
    let g = c.file("g.txt", "5 5 4\n0 0:1\n");
    let out = pipeline(
        c.ws.path(),
        &["ingest", "--name", "len2", "--train", &g, "--lenient"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("expected N = 5"), "{}", stderr(&out));
}

#[test]
fn repeated_ingest_is_a_no_op_and_conflicts_need_replace() {
    let c = IngestCase::new();
    let good = c.dir.path().join("good.txt").display().to_string();
    let before = listing(c.ws.path());
    let out = pipeline(c.ws.path(), &["ingest", "--name", "good", "--train", &good]);
    assert!(out.status.success());
    assert!(stderr(&out).contains("nothing to do"), "{}", stderr(&out));
    assert_eq!(listing(c.ws.path()), before);
    // Same name, other options: refused without --replace, done with it.
    let out = pipeline(
        c.ws.path(),
        &[
            "ingest",
            "--name",
            "good",
            "--train",
            &good,
            "--no-normalize",
        ],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--replace"), "{}", stderr(&out));
    let out = pipeline(
        c.ws.path(),
        &[
            "ingest",
            "--name",
            "good",
            "--train",
            &good,
            "--no-normalize",
            "--replace",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let st = status_json(c.ws.path());
    assert_eq!(st["datasets"].as_array().unwrap().len(), 1);
    assert_eq!(st["datasets"][0]["normalization"], "none");
    let dirs: Vec<String> = listing(c.ws.path())
        .into_iter()
        .filter(|p| p.starts_with("datasets/") && !p[9..].contains('/'))
        .collect();
    assert_eq!(dirs.len(), 1, "old dataset files removed: {dirs:?}");
    let _ = Path::new(&good);
}

/// The message of an input that is not a regular file, after `PATH: found `.
const NOT_REGULAR: &str = ", expected a regular file: ingest reads each input more than once";

#[test]
fn a_fifo_is_refused_before_the_workspace_is_touched() {
    let c = IngestCase::new();
    let fifo = c.dir.path().join("rows.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo failed");
    let fifo = fifo.display().to_string();
    let good = c.file("g.txt", GOOD);
    let located = format!("{fifo}: found a FIFO (named pipe){NOT_REGULAR}");
    c.refused_up_front(
        &["--train", &fifo],
        &located,
        "save the data to a file first",
    );
    c.refused_up_front(
        &["--train", &good, "--test", &fifo, "--format", "xc"],
        &located,
        "",
    );
    c.refused_up_front(&["--train", &fifo, "--format", "libsvm"], &located, "");
    c.refused_up_front(
        &["--train-features", &good, "--train-labels", &fifo],
        &located,
        "",
    );
    c.refused_up_front(&["--data", &good, "--train-split", &fifo], &located, "");
    // A workspace that does not exist yet is not created.
    let fresh = c.dir.path().join("fresh-ws");
    let out = pipeline_within(
        &fresh,
        &["ingest", "--name", "x", "--train", &fifo],
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(&located), "{}", stderr(&out));
    assert!(!fresh.exists(), "the workspace was created");
}

#[test]
fn devices_and_directories_are_refused_naming_what_they_are() {
    let c = IngestCase::new();
    c.refused_up_front(
        &["--train", "/dev/zero"],
        &format!("/dev/zero: found a character device{NOT_REGULAR}"),
        "",
    );
    // A symlink is followed, and the path as given is named.
    let link = c.dir.path().join("zero.txt");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let link = link.display().to_string();
    c.refused_up_front(
        &["--train", &link, "--format", "libsvm"],
        &format!("{link}: found a character device"),
        "",
    );
    let dir = c.dir.path().join("sub");
    std::fs::create_dir(&dir).unwrap();
    let dir = dir.display().to_string();
    c.refused_up_front(
        &["--train", &dir],
        &format!("{dir}: found a directory{NOT_REGULAR}"),
        "",
    );
}

/// `fsgp::text::source::MAX_LINE_BYTES`, as the message states it.
const MAX_LINE: usize = 64 << 20;

#[test]
fn a_line_longer_than_the_cap_is_refused_naming_it() {
    assert_eq!(fsgp::text::source::MAX_LINE_BYTES, MAX_LINE);
    let c = IngestCase::new();
    // A row of MAX_LINE + 4 bytes ("0000...0"), right after the header: the reads double
    // to exactly the cap there, and the one past it ends the line within 64 KiB.
    let mut text = b"2 5 4\n".to_vec();
    text.resize(text.len() + MAX_LINE + 4, b'0');
    text.extend_from_slice(b"\n1 1:1\n");
    let f = c.dir.path().join("long.txt");
    std::fs::write(&f, &text).unwrap();
    let f = f.display().to_string();
    let msg = "found a line longer than 67108864 bytes, expected lines of at most 64 MiB";
    c.fails(&["--train", &f], &loc(&f, 2), msg);
    // The LIBSVM scan pass reads the same way (the long row after a short one, "+1 1:1").
    text.splice(..6, *b"+1 1:1\n");
    let g = c.dir.path().join("long.svm");
    std::fs::write(&g, &text).unwrap();
    let g = g.display().to_string();
    c.fails(&["--train", &g, "--format", "libsvm"], &loc(&g, 2), msg);
}

#[test]
fn libsvm_ids_above_the_limit_are_refused_as_too_large() {
    let c = IngestCase::new();
    for id in [
        "4000000000",
        "2147483648",
        "9223372036854775807",
        "99999999999999999999999",
    ] {
        c.train_file_fails(
            &["--format", "libsvm"],
            ("big.svm", &format!("+1 1:1\n-1 2:1 {id}:0.5\n")),
            2,
            &format!(
                "found feature id {id}, expected at most 2147483647: it is larger than the \
                 largest id fsgp reads (D and L are at most 2^31 - 1"
            ),
        );
    }
    // --features cannot raise the limit.
    let f = c.file("ok.svm", "+1 1:1\n-1 2:1\n");
    refused_by_the_parser(
        &c,
        &[
            "--train",
            &f,
            "--format",
            "libsvm",
            "--features",
            "4000000000",
        ],
        "for '--features <D>': 4000000000 is not in 1..=2147483647",
    );
    // The largest id is accepted: D = 2^31 - 1.
    let f = c.file("max.svm", "+1 1:1\n-1 2147483647:1\n");
    let out = pipeline(
        c.ws.path(),
        &[
            "ingest", "--name", "max", "--train", &f, "--format", "libsvm",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("D = 2147483647"), "{}", stderr(&out));
}

#[test]
fn absurd_header_sizes_are_refused_before_anything_is_sized_by_them() {
    let c = IngestCase::new();
    for (name, header, expected) in [
        ("d.txt", "2 4000000000 4", "found D = 4000000000 in the header, expected at most 2147483647"),
        ("l.txt", "2 5 9223372036854775807", "found L = 9223372036854775807 in the header, expected at most 2147483647"),
        ("n.txt", "99999999999999999999999 5 4", "found N = 99999999999999999999999 in the header, expected at most 18446744073709551615"),
    ] {
        c.train_file_fails(&[], (name, &format!("{header}\n0 0:1\n1 1:1\n")), 1, expected);
    }
    // The split layout sizes its row table by N: an N the file cannot hold is refused.
    let data = c.file("data.txt", "1000000000000000 5 4\n0 0:1\n1 1:1\n");
    let tr = c.file("trSplit.txt", "1\n");
    c.fails(
        &["--data", &data, "--train-split", &tr],
        &loc(&data, 1),
        "found N = 1000000000000000 in the header, expected at most 33 rows: the file has 33 \
         bytes, and every row takes at least one byte",
    );
    // Compressed, N is held to the most the file's bytes can decompress to (zstd: 32768
    // bytes per byte).
    let zst = c.dir.path().join("data.txt.zst");
    let packed = zstd::encode_all(&b"1000000000000000 5 4\n0 0:1\n"[..], 3).unwrap();
    std::fs::write(&zst, &packed).unwrap();
    let zst = zst.display().to_string();
    let most = packed.len() * 32768;
    c.fails(
        &["--data", &zst, "--train-split", &tr],
        &loc(&zst, 1),
        &format!(
            "expected at most {most} rows: the file's {} zstd bytes decompress to at most {most}",
            packed.len()
        ),
    );
    let x = c.file("X.txt", "2 5\n0:1\n1:1\n");
    let y = c.file("Y.txt", "2 4000000000\n0:1\n1:1\n");
    c.fails(
        &["--train-features", &x, "--train-labels", &y],
        &loc(&y, 1),
        "found L = 4000000000 in the header, expected at most 2147483647",
    );
}

#[test]
fn chunk_sizes_beyond_the_limits_are_refused_up_front() {
    let c = IngestCase::new();
    let f = c.file("t.txt", GOOD);
    refused_by_the_parser(
        &c,
        &["--train", &f, "--chunk-rows", "4194305"],
        "for '--chunk-rows <CHUNK_ROWS>': 4194305 is not in 1..=4194304",
    );
    refused_by_the_parser(
        &c,
        &["--train", &f, "--chunk-mb", "18446744073709551615"],
        "for '--chunk-mb <CHUNK_MB>': 18446744073709551615 is not in 1..=4096",
    );
}

/// An ingest whose options the command line refuses (exit 2) with `message`, before the
/// workspace is touched.
fn refused_by_the_parser(c: &IngestCase, args: &[&str], message: &str) {
    let before = listing(c.ws.path());
    let out = c.ingest("bad", args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(message),
        "{args:?}: expected {message:?} in: {err}"
    );
    assert_eq!(
        listing(c.ws.path()),
        before,
        "{args:?} changed the workspace"
    );
}

// Arbitrary bytes as whole input files through the real `pipeline ingest`: every format
// either ingests them or exits 1 naming the file (and the line, for a line's fault), never
// panics or hangs, and a refused ingest leaves the workspace as it was.

/// Rows that are valid for every format (labels 0..3 when `labelled`, then feature ids
/// 1..40) or nearly so: a line is, one time in four, broken by arbitrary bytes or an id at
/// or beyond the limit.
fn row_like_bytes(labelled: bool) -> impl Strategy<Value = Vec<u8>> {
    let labels = prop::sample::select(vec!["0 ", "1 ", "2 ", "1,2 "]);
    let feature = (1u32..40, -4.0f32..4.0).prop_map(|(id, v)| format!("{id}:{v}"));
    let noise = prop_oneof![
        prop::collection::vec(any::<u8>(), 1..6),
        prop::sample::select(vec![
            "2147483647:1",
            "4000000000:1",
            "9223372036854775807:1"
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
    ];
    let line = (
        prop::option::weighted(0.9, labels).prop_map(move |l| l.filter(|_| labelled)),
        prop::collection::btree_set(feature, 0..6),
        prop::option::weighted(0.25, (noise, any::<prop::sample::Index>())),
    )
        .prop_map(|(labels, features, noise)| {
            let features: Vec<String> = features.into_iter().collect();
            let mut line = format!("{}{}", labels.unwrap_or(""), features.join(" ")).into_bytes();
            if let Some((bytes, at)) = noise {
                let at = at.index(line.len() + 1);
                line.splice(at..at, bytes);
            }
            line.push(b'\n');
            line
        });
    prop::collection::vec(line, 1..8).prop_map(|lines| lines.concat())
}

/// Runs one ingest of `inputs` (already written) and checks its outcome.
fn ingest_checked(ws: &Path, args: &[&str], inputs: &[&str]) -> Result<(), TestCaseError> {
    let before = listing(ws);
    let mut full = vec!["ingest", "--name", "fuzz", "--replace"];
    full.extend_from_slice(args);
    let out = pipeline_within(ws, &full, Duration::from_secs(120));
    let err = stderr(&out);
    prop_assert!(!err.contains("panicked"), "{args:?}: {err}");
    match out.status.code() {
        Some(0) => {}
        Some(1) => {
            // `FILE:LINE: ` for a line's fault, `FILE: ` for a whole file's (a LIBSVM
            // file with no labels, a single class, no feature index).
            let names_a_file = inputs.iter().any(|f| err.contains(&format!("{f}:")));
            prop_assert!(names_a_file, "{args:?}: the error names no input: {err}");
            prop_assert_eq!(listing(ws), before, "{:?} left files: {}", args, err);
        }
        code => prop_assert!(false, "{args:?}: exit {code:?}: {err}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn arbitrary_bytes_ingest_or_are_refused_naming_the_file(body in row_like_bytes(true), features in row_like_bytes(false), labels in row_like_bytes(false), header: bool) {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        create_workspace(&ws); // so a refusal can be seen to leave it as it was
        // Half the cases get a well-formed header, so that the rows are what is tested.
        let lines = body.iter().filter(|&&b| b == b'\n').count();
        let with_header = |head: String, rows: &[u8]| match header {
            true => [head.as_bytes(), rows].concat(),
            false => rows.to_vec(),
        };
        let xc = write_bytes(dir.path(), "xc.txt", &with_header(format!("{lines} 50 20\n"), &body));
        let svm = write_bytes(dir.path(), "data.svm", &body);
        let rows = features.iter().filter(|&&b| b == b'\n').count();
        let x = write_bytes(dir.path(), "X.txt", &with_header(format!("{rows} 50\n"), &features));
        let y = write_bytes(dir.path(), "Y.txt", &with_header(format!("{rows} 50\n"), &labels));
        ingest_checked(&ws, &["--train", &xc], &[&xc])?;
        ingest_checked(&ws, &["--train", &svm, "--format", "libsvm"], &[&svm])?;
        ingest_checked(&ws, &["--train-features", &x, "--train-labels", &y], &[&x, &y])?;
    }
}

fn write_bytes(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}
