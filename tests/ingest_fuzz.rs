//! Arbitrary bytes as whole input files through the real `pipeline ingest`: every format
//! either ingests them or exits 1 naming the file (and the line, for a line's fault), never
//! panics or hangs, and a refused ingest leaves the workspace as it was.

mod common;
use common::*;
use proptest::prelude::*;
use std::path::Path;
use std::time::Duration;

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
        status_json(&ws); // creates the workspace, so a refusal can be seen to leave it as it was
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
