//! Every kind of bad input gets `file:line: found ..., expected ...`, a non-zero exit, and
//! leaves the catalog and the workspace as they were.

mod common;
use common::*;
use std::path::Path;

const GOOD: &str = "3 5 4\n0,2 0:1.0 3:2.0\n1 1:0.5\n3 4:1.5 2:1\n";

struct Case {
    ws: tempfile::TempDir,
    dir: tempfile::TempDir,
}

impl Case {
    /// A workspace that already holds one good dataset, so "unchanged" is not trivially true.
    fn new() -> Case {
        let case = Case {
            ws: tempfile::tempdir().unwrap(),
            dir: tempfile::tempdir().unwrap(),
        };
        let good = write(case.dir.path(), "good.txt", GOOD);
        let out = pipeline(
            case.ws.path(),
            &[
                "ingest",
                "--name",
                "good",
                "--train",
                good.to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        case
    }

    fn file(&self, name: &str, text: &str) -> String {
        write(self.dir.path(), name, text).display().to_string()
    }

    /// Runs a failing ingest and checks the error and that nothing changed.
    fn fails(&self, args: &[&str], expect_location: &str, expect_text: &str) -> String {
        let before = listing(self.ws.path());
        let runs_before = status_json(self.ws.path())["runs"]
            .as_array()
            .unwrap()
            .len();
        let mut full = vec!["ingest", "--name", "bad"];
        full.extend_from_slice(args);
        let out = pipeline(self.ws.path(), &full);
        let err = stderr(&out);
        assert!(!out.status.success(), "should fail: {args:?}");
        assert_eq!(out.status.code(), Some(1));
        assert!(
            err.contains(expect_location),
            "error should name {expect_location}: {err}"
        );
        assert!(
            err.contains(expect_text),
            "error should say {expect_text}: {err}"
        );
        assert_eq!(dataset_names(self.ws.path()), vec!["good".to_string()]);
        assert_eq!(listing(self.ws.path()), before, "workspace files changed");
        // A run is recorded as failed, unless the input was rejected before a run started.
        let runs = status_json(self.ws.path())["runs"]
            .as_array()
            .unwrap()
            .clone();
        if runs.len() > runs_before {
            assert_eq!(
                runs[0]["status"], "failed",
                "the failed run is recorded as failed"
            );
        }
        err
    }
}

fn loc(path: &str, line: u64) -> String {
    format!("{path}:{line}: ")
}

#[test]
fn header_declares_more_rows_than_the_body() {
    let c = Case::new();
    let f = c.file("t.txt", "4 5 4\n0 0:1\n1 1:1\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 3),
        "found the end of the file after 2 rows, expected N = 4",
    );
}

#[test]
fn body_has_more_rows_than_the_header() {
    let c = Case::new();
    let f = c.file("t.txt", "1 5 4\n0 0:1\n1 1:1\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 3),
        "found more rows than the header's N = 1",
    );
}

#[test]
fn feature_id_out_of_range() {
    let c = Case::new();
    let f = c.file("t.txt", "2 5 4\n0 0:1\n1 5:1\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 3),
        "found feature id 5, expected < 5",
    );
}

#[test]
fn label_id_out_of_range() {
    let c = Case::new();
    let f = c.file("t.txt", "2 5 4\n0 0:1\n1,4 1:1\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 3),
        "found label id 4, expected < 4",
    );
}

#[test]
fn malformed_tokens() {
    let c = Case::new();
    let f = c.file("t.txt", "2 5 4\n0 0:1\n1 1:0.5x\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 3),
        "found value '0.5x' in token '1:0.5x', expected a decimal number",
    );
    let f = c.file("u.txt", "2 5 4\n0 0=1\n1 1:1\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 2),
        "found token '0=1', expected 'feature:value'",
    );
    let f = c.file("v.txt", "2 5 4\n0,a 0:1\n1 1:1\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 2),
        "found label id 'a', expected a non-negative integer",
    );
    let f = c.file("w.txt", "2 5 x\n0 0:1\n1 1:1\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 1),
        "found 'x' for L in the header",
    );
}

#[test]
fn nan_and_inf_values() {
    let c = Case::new();
    let f = c.file("t.txt", "2 5 4\n0 0:NaN\n1 1:1\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 2),
        "found non-finite value 'NaN' for feature 0, expected a finite number",
    );
    let f = c.file("u.txt", "2 5 4\n0 0:1\n1 1:-inf\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 3),
        "found non-finite value '-inf'",
    );
}

#[test]
fn duplicate_feature_ids() {
    let c = Case::new();
    let f = c.file("t.txt", "2 5 4\n0 0:1\n1 3:1 1:1 3:2\n");
    c.fails(
        &["--train", &f],
        &loc(&f, 3),
        "found feature 3 twice in the row, expected unique feature ids",
    );
}

#[test]
fn empty_file() {
    let c = Case::new();
    let f = c.file("t.txt", "");
    c.fails(
        &["--train", &f],
        &loc(&f, 1),
        "found an empty file, expected a header 'N D L'",
    );
}

#[test]
fn truncated_last_line() {
    let c = Case::new();
    let f = c.file("t.txt", "2 5 4\n0 0:1\n1 1:0.12");
    c.fails(
        &["--train", &f],
        &loc(&f, 3),
        "found the last line without a '\\n' line end",
    );
}

#[test]
fn crlf_line_ends() {
    let c = Case::new();
    let f = c.file("t.txt", "2 5 4\n0 0:1\r\n1 1:1\r\n");
    c.fails(&["--train", &f], &loc(&f, 2), "found a CRLF line ending");
    let f = c.file("u.txt", "2 5 4\r\n0 0:1\r\n1 1:1\r\n");
    c.fails(&["--train", &f], &loc(&f, 1), "found a CRLF line ending");
}

#[test]
fn test_file_disagrees_with_train_header() {
    let c = Case::new();
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
    let c = Case::new();
    let missing = c.dir.path().join("nope.txt").display().to_string();
    c.fails(&["--train", &missing], &missing, "cannot open");
}

#[test]
fn missing_split_file() {
    let c = Case::new();
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
    let c = Case::new();
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
    let c = Case::new();
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
    let c = Case::new();
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
    let c = Case::new();
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
    let c = Case::new();
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
