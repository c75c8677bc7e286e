//! `pipeline predict --input` (docs/predict-input.md): rows never ingested, read as the
//! run's dataset was and scored as its splits are. The test file of each small dataset,
//! given as `--input`, must give the rows `predict --split test` gives, bit for bit
//! (multi-label XC text with and without its header, gzip; binary and multi-class LIBSVM;
//! transforms none, l2, tfidf, standardize and scale; standard input, zstd), and `predict --model`
//! of the run's export must write the same bytes without a workspace; then the refusals,
//! what the rows print as on standard output, and that the workspace is only read.

use crate::common;
use common::toy::{newest_run, predictions_path};
use common::*;
use fsgp::store::predictions::{PredictionBlock, PredictionReader};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A decoded row of a predictions file, floats as bits: row id, labels, scores,
/// probabilities (when the file has them), true class's probability (multi-class files).
type Row = (
    u64,
    Vec<u32>,
    Vec<u32>,
    Option<Vec<u32>>,
    Option<Option<u32>>,
);

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Every row of a predictions file, in file order.
fn read_rows(path: &Path) -> Vec<Row> {
    let mut rows = Vec::new();
    for block in PredictionReader::open(path).unwrap() {
        push_rows(&block.unwrap(), &mut rows);
    }
    rows
}

/// Appends the rows of `b`, decoded, to `rows`.
fn push_rows(b: &PredictionBlock, rows: &mut Vec<Row>) {
    for i in 0..b.len() {
        rows.push((
            b.row_ids[i],
            b.labels(i).to_vec(),
            bits(b.scores(i)),
            b.probabilities(i).map(bits),
            b.true_class_probability(i).map(|t| t.map(f32::to_bits)),
        ));
    }
}

/// A workspace (`dir/ws`) and its input files (`dir/src`).
struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Self {
        let case = Case {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(case.src()).unwrap();
        case
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn src(&self) -> PathBuf {
        self.dir.path().join("src")
    }

    /// Writes `src/NAME`; returns its path.
    fn file(&self, name: &str, bytes: &[u8]) -> String {
        let path = self.src().join(name);
        std::fs::write(&path, bytes).unwrap();
        path.display().to_string()
    }

    fn ok(&self, args: &[&str]) -> String {
        pipeline_ok(&self.ws(), args)
    }

    /// Ingests `train`/`test` as `name` (100-row chunks) with `ingest` options, factorises
    /// it (R = `rank`, M = 8) and trains it with `train` options; returns the run.
    fn model(
        &self,
        name: &str,
        (train, test): (&str, &str),
        ingest: &[&str],
        rank: &str,
        train_args: &[&str],
    ) -> String {
        let mut args = vec![
            "ingest",
            "--name",
            name,
            "--train",
            train,
            "--test",
            test,
            "--chunk-rows",
            "100",
        ];
        args.extend(ingest);
        self.ok(&args);
        self.ok(&[
            "svd",
            "--dataset",
            name,
            "--rank",
            rank,
            "--inducing",
            "8",
            "--threads",
            "2",
        ]);
        let mut args = vec![
            "train",
            "--dataset",
            name,
            "--inducing",
            "8",
            "--batch",
            "50",
            "--epochs",
            "3",
            "--lr",
            "0.05",
            "--threads",
            "2",
            "--seed",
            "5",
        ];
        args.extend(train_args);
        self.ok(&args);
        newest_run(&self.ws(), "train").to_string()
    }

    /// `predict --split test` of `run` with `extra`: its rows.
    fn split_rows(&self, run: &str, extra: &[&str]) -> Vec<Row> {
        let mut args = vec!["predict", "--run", run, "--split", "test"];
        args.extend(extra);
        self.ok(&args);
        read_rows(&predictions_path(
            &self.ws(),
            newest_run(&self.ws(), "predict"),
        ))
    }

    /// `predict --input INPUT --output OUT` of `run` with `extra`: its rows.
    fn input_rows(&self, run: &str, input: &str, extra: &[&str]) -> Vec<Row> {
        let out = self
            .dir
            .path()
            .join(format!("out-{}.parquet", rand::random::<u64>()));
        let mut args = vec![
            "predict",
            "--run",
            run,
            "--input",
            input,
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        self.ok(&args);
        self.check_model_file_agrees(run, input, extra, &out);
        read_rows(&out)
    }

    /// `predict --model` of `run`'s export (written once per run) on the same input and
    /// options writes the same bytes as `predict --run` wrote to `by_run`, with no
    /// workspace: the workspace option names a directory that does not exist.
    fn check_model_file_agrees(&self, run: &str, input: &str, extra: &[&str], by_run: &Path) {
        let model = self.dir.path().join(format!("run-{run}.model.parquet"));
        if !model.exists() {
            self.ok(&["export", "--run", run, "--out", model.to_str().unwrap()]);
        }
        let out = by_run.with_extension("model.parquet");
        let mut args = vec![
            "predict",
            "--model",
            model.to_str().unwrap(),
            "--input",
            input,
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        let nowhere = self.dir.path().join("no-workspace");
        pipeline_ok(&nowhere, &args);
        assert!(!nowhere.exists(), "--model created a workspace");
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(by_run).unwrap(),
            "--model and --run wrote different files for {input} {extra:?}"
        );
    }

    /// `pipeline --workspace WS ARGS...` with `stdin` as its standard input.
    fn with_stdin(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = Command::new(pipeline_bin())
            .arg("--workspace")
            .arg(self.ws())
            .args(args)
            .env_remove("FSGP_WORKSPACE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }
}

/// The multi-label XC test file (with its `N D L` header, as synth writes it), without the
/// header, and gzip-compressed: the rows of `predict --split test`, for transforms none and
/// l2; with `--probabilities` too. A header of another D, or whose N the rows fall short
/// of, is refused naming its line.
#[test]
fn xc_multilabel_rows_score_as_the_test_split() {
    let case = Case::new();
    let src = case.src();
    case.ok(&[
        "synth",
        "--out",
        src.to_str().unwrap(),
        "--rows",
        "300",
        "--test-rows",
        "60",
        "--features",
        "40",
        "--labels",
        "12",
        "--seed",
        "3",
    ]);
    let (train, test) = (src.join("train.txt"), src.join("test.txt"));
    let (train, test) = (train.to_str().unwrap(), test.to_str().unwrap());
    let text = std::fs::read_to_string(test).unwrap();
    let headless = case.file("headless.txt", text.split_once('\n').unwrap().1.as_bytes());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text.as_bytes()).unwrap();
    let gzipped = case.file("test.txt.gz", &gz.finish().unwrap());
    for transform in ["none", "l2", "tfidf"] {
        let name = format!("ml-{transform}");
        let run = case.model(
            &name,
            (train, test),
            &["--transform", transform],
            "8",
            &["--factors", "3"],
        );
        let extras: [&[&str]; 2] = [&[], &["--probabilities"]];
        for extra in extras {
            let split = case.split_rows(&run, extra);
            assert_eq!(split.len(), 60);
            for input in [test, headless.as_str(), gzipped.as_str()] {
                assert_eq!(
                    case.input_rows(&run, input, extra),
                    split,
                    "{transform} {input} {extra:?}"
                );
            }
        }
    }
    // A header is held to the dataset: its D at line 1, its N at the end of the rows.
    let rows = text.split_once('\n').unwrap().1;
    let wide = case.file("wide.txt", format!("60 41 12\n{rows}").as_bytes());
    let short = case.file("short.txt", format!("61 40 12\n{rows}").as_bytes());
    for (file, says) in [
        (
            &wide,
            format!("{wide}:1: found D = 41 in the header, expected D = 40"),
        ),
        (
            &short,
            format!("{short}:61: found the end of the file after 60 rows, expected N = 61"),
        ),
    ] {
        let run = newest_run(&case.ws(), "train").to_string();
        let done = pipeline(&case.ws(), &["predict", "--run", &run, "--input", file]);
        assert_eq!(done.status.code(), Some(1), "{file}");
        assert!(stderr(&done).contains(&says), "{says}: {}", stderr(&done));
    }
}

/// LIBSVM rows of 3 features on different scales (x₂ around 100), x₃ absent in a third of
/// the rows; `label(x)` gives the class written.
fn libsvm_text(rows: usize, rng: &mut ChaCha8Rng, label: impl Fn(&[f64; 3]) -> String) -> String {
    let mut text = String::new();
    for i in 0..rows {
        let x = [
            rng.random::<f64>() * 4.0 - 2.0,
            100.0 + rng.random::<f64>() * 10.0,
            if i % 3 == 0 {
                0.0
            } else {
                rng.random::<f64>() - 0.5
            },
        ]
        .map(|v| (v * 1000.0).round() / 1000.0);
        let feats: Vec<String> = (0..3)
            .filter(|&j| x[j] != 0.0)
            .map(|j| format!("{}:{}", j + 1, x[j]))
            .collect();
        text.push_str(&format!("{} {}\n", label(&x), feats.join(" ")));
    }
    text
}

/// A binary LIBSVM file (classes ±1) under `standardize`: the same rows, with and without
/// probabilities; standard input (zstd-compressed) gives the same as the file.
#[test]
fn binary_libsvm_rows_score_as_the_test_split() {
    let case = Case::new();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let label = |x: &[f64; 3]| {
        if x[0] + 0.2 * (x[1] - 105.0) > 0.0 {
            "+1"
        } else {
            "-1"
        }
        .to_string()
    };
    let train = case.file("train.svm", libsvm_text(200, &mut rng, label).as_bytes());
    let test_text = libsvm_text(60, &mut rng, label);
    let test = case.file("test.svm", test_text.as_bytes());
    let run = case.model(
        "bin",
        (&train, &test),
        &["--format", "libsvm", "--transform", "standardize"],
        "3",
        &[
            "--task",
            "binary",
            "--latent",
            "independent",
            "--kernel",
            "se",
        ],
    );
    let split = case.split_rows(&run, &["--probabilities"]);
    assert_eq!(case.input_rows(&run, &test, &["--probabilities"]), split);
    assert_eq!(
        case.input_rows(&run, &test, &[]),
        case.split_rows(&run, &[])
    );
    // Standard input, zstd by its magic bytes.
    let out = case.dir.path().join("stdin.parquet");
    let args = [
        "predict",
        "--run",
        &run,
        "--input",
        "-",
        "--probabilities",
        "--output",
        out.to_str().unwrap(),
    ];
    let zstd = zstd::encode_all(test_text.as_bytes(), 3).unwrap();
    let done = case.with_stdin(&args, &zstd);
    assert!(done.status.success(), "{}", stderr(&done));
    assert_eq!(read_rows(&out), split);
}

/// Three classes written 3, 7 and 9, under `scale`, with a sampling likelihood (softmax):
/// the rows and each row's probability of its class as the split's; without labels the
/// same rankings and no true class; standard output in JSON lines and TSV names the
/// classes 3, 7, 9.
#[test]
fn multiclass_libsvm_rows_score_as_the_test_split_and_print_class_names() {
    let case = Case::new();
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let label = |x: &[f64; 3]| {
        let class = match (x[0] > 0.0, x[1] > 105.0) {
            (true, _) => "3",
            (false, true) => "7",
            (false, false) => "9",
        };
        class.to_string()
    };
    let train = case.file("train.svm", libsvm_text(240, &mut rng, label).as_bytes());
    let test_text = libsvm_text(60, &mut rng, label);
    let test = case.file("test.svm", test_text.as_bytes());
    let run = case.model(
        "classes",
        (&train, &test),
        &["--format", "libsvm", "--transform", "scale"],
        "3",
        &[
            "--task",
            "multiclass",
            "--latent",
            "independent",
            "--kernel",
            "se",
            "--likelihood",
            "softmax",
            "--mc-pairs",
            "4",
        ],
    );
    let split = case.split_rows(&run, &["--probabilities"]);
    assert!(
        split.iter().all(|r| matches!(r.4, Some(Some(_)))),
        "every test row has a class"
    );
    assert_eq!(case.input_rows(&run, &test, &["--probabilities"]), split);
    // Without labels: the same rankings, no true class.
    let unlabelled: String = test_text
        .lines()
        .map(|l| l.split_once(' ').unwrap().1.to_string() + "\n")
        .collect();
    let bare = case.file("bare.svm", unlabelled.as_bytes());
    let rows = case.input_rows(&run, &bare, &["--probabilities"]);
    assert_eq!(rows.len(), split.len());
    for (got, want) in rows.iter().zip(&split) {
        assert_eq!(
            (&got.0, &got.1, &got.2, &got.3),
            (&want.0, &want.1, &want.2, &want.3)
        );
        assert_eq!(got.4, Some(None), "no label: null");
    }
    // Standard output: the classes by their names, the same numbers.
    let names = [3i64, 7, 9];
    let jsonl = case.ok(&[
        "predict",
        "--run",
        &run,
        "--input",
        &test,
        "--probabilities",
    ]);
    let lines: Vec<&str> = jsonl.lines().collect();
    assert_eq!(lines.len(), split.len());
    for (line, want) in lines.iter().zip(&split) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["row"], want.0);
        let labels: Vec<i64> = want.1.iter().map(|&id| names[id as usize]).collect();
        assert_eq!(v["labels"], serde_json::json!(labels), "{line}");
        let floats = |key: &str| -> Vec<u32> {
            v[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| (s.as_f64().unwrap() as f32).to_bits())
                .collect()
        };
        assert_eq!(floats("scores"), want.2);
        assert_eq!(Some(floats("probabilities")), want.3);
        let truth = (v["true_class_probability"].as_f64().unwrap() as f32).to_bits();
        assert_eq!(Some(Some(truth)), want.4);
    }
    // The model file prints the same lines (its class map travels with it).
    let model = case.dir.path().join(format!("run-{run}.model.parquet"));
    let nowhere = case.dir.path().join("no-workspace");
    let model_args = [
        "predict",
        "--model",
        model.to_str().unwrap(),
        "--input",
        &test,
    ];
    let by_model = pipeline_ok(&nowhere, &[&model_args[..], &["--probabilities"]].concat());
    assert_eq!(by_model, jsonl);
    let tsv = case.ok(&[
        "predict", "--run", &run, "--input", &bare, "--format", "tsv",
    ]);
    let mut lines = tsv.lines();
    assert_eq!(
        lines.next(),
        Some("row\tlabels\tscores\ttrue_class_probability")
    );
    for (line, want) in lines.zip(&split) {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 4, "{line}");
        assert_eq!(fields[0], want.0.to_string());
        let labels: Vec<String> = want
            .1
            .iter()
            .map(|&id| names[id as usize].to_string())
            .collect();
        assert_eq!(fields[1], labels.join(","));
        let scores: Vec<u32> = fields[2]
            .split(',')
            .map(|s| s.parse::<f32>().unwrap().to_bits())
            .collect();
        assert_eq!(scores, want.2);
        assert_eq!(fields[3], "", "no label: empty");
    }
}

/// Refusals on a binary LIBSVM dataset of D = 3, each leaving no output file (nor its
/// temporary sibling): a feature id ≥ D (unless dropped, which is counted), a malformed
/// line after a block was already written, a missing file; the workspace is left as it
/// was and no run is recorded.
#[test]
fn refusals_name_the_line_and_leave_no_output() {
    let case = Case::new();
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let label = |x: &[f64; 3]| if x[0] > 0.0 { "1" } else { "-1" }.to_string();
    let train = case.file("train.svm", libsvm_text(150, &mut rng, label).as_bytes());
    let test = case.file("test.svm", libsvm_text(20, &mut rng, label).as_bytes());
    let run = case.model(
        "bin",
        (&train, &test),
        &["--format", "libsvm"],
        "3",
        &["--task", "binary"],
    );
    let ws = case.ws();
    let (before, runs) = (
        contents(&ws),
        status_json(&ws)["runs"].as_array().unwrap().len(),
    );
    let out_dir = case.dir.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("p.parquet");
    let refused = |input: &str, extra: &[&str], says: &[&str]| {
        let mut args = vec![
            "predict",
            "--run",
            &run,
            "--input",
            input,
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        let done = pipeline(&ws, &args);
        let err = stderr(&done);
        assert_eq!(done.status.code(), Some(1), "{args:?}: {err}");
        for s in says {
            assert!(err.contains(s), "{args:?} should say {s}: {err}");
        }
        let left: Vec<_> = std::fs::read_dir(&out_dir).unwrap().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    };
    let wide = case.file("wide.svm", b"1 1:0.5 2:101\n-1 1:-0.5 5:2 2:99\n");
    refused(
        &wide,
        &[],
        &[
            format!("{wide}:2: found feature id 5, expected < 4 (D = 3 in the run's dataset")
                .as_str(),
        ],
    );
    let bad = case.file("bad.svm", b"1 1:0.5 2:101\n-1 1:-0.5\n1 2:x\n");
    refused(
        &bad,
        &["--block-rows", "1"],
        &[format!("{bad}:3: found value 'x' in token '2:x', expected a decimal number").as_str()],
    );
    // 1e200 fits f64, its square does not: the row's norm was infinite and the row was
    // scored as if empty, exit 0.
    let huge = case.file("huge.svm", b"1 1:0.5\n-1 1:0.5 2:1e200\n");
    refused(
        &huge,
        &[],
        &[format!(
            "{huge}:2: found value 1e200 for feature 2, whose square takes the row's squared \
             norm beyond 1.7976931348623157e308"
        )
        .as_str()],
    );
    // Strict whatever the dataset's --lenient, which predict does not offer.
    let crlf = case.file("crlf.svm", b"1 1:0.5\r\n");
    let says = format!("{crlf}:1: found a CRLF line ending (\"\\r\\n\"), expected \"\\n\" (strip the '\\r' characters)\n");
    refused(&crlf, &[], &[says.as_str()]);
    let missing = case.src().join("missing.svm").display().to_string();
    refused(&missing, &[], &[missing.as_str(), "cannot open"]);
    let dir = case.src().display().to_string();
    refused(
        &dir,
        &[],
        &[&format!("{dir}: found a directory, expected a regular file or a pipe")[..]],
    );
    let header = case.file("header.svm", b"2 3 1\n1 1:1\n");
    refused(
        &header,
        &[],
        &[format!("{header}:1: found token '3', expected 'feature:value'").as_str()],
    );
    // Dropped: the row is scored as if the file lacked the feature.
    let done = pipeline(
        &ws,
        &[
            "predict",
            "--run",
            &run,
            "--input",
            &wide,
            "--unknown-features",
            "drop",
            "--output",
            out.to_str().unwrap(),
        ],
    );
    assert!(done.status.success(), "{}", stderr(&done));
    assert!(
        stderr(&done).contains("dropped 1 features with ids beyond the dataset's D = 3 in 1 rows"),
        "{}",
        stderr(&done)
    );
    let narrow = case.file("narrow.svm", b"1 1:0.5 2:101\n-1 1:-0.5 2:99\n");
    assert_eq!(read_rows(&out), case.input_rows(&run, &narrow, &[]));
    // An existing --output is kept, refused before any row is read; --force replaces it.
    let kept = std::fs::read(&out).unwrap();
    let again = [
        "predict",
        "--run",
        &run,
        "--input",
        &narrow,
        "--output",
        out.to_str().unwrap(),
    ];
    let done = pipeline(&ws, &again);
    assert_eq!(done.status.code(), Some(1), "{}", stderr(&done));
    let says = format!("{} exists; give --force to replace it", out.display());
    assert!(stderr(&done).contains(&says), "{}", stderr(&done));
    assert_eq!(
        std::fs::read(&out).unwrap(),
        kept,
        "the existing file was changed"
    );
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 1);
    let mut forced = again.to_vec();
    forced.extend(["--top-k", "1", "--force"]);
    pipeline_ok(&ws, &forced);
    assert_eq!(
        read_rows(&out),
        case.input_rows(&run, &narrow, &["--top-k", "1"])
    );
    assert_eq!(
        contents(&ws),
        before,
        "predict --input writes nothing in the workspace"
    );
    assert_eq!(
        status_json(&ws)["runs"].as_array().unwrap().len(),
        runs,
        "no run recorded"
    );
}

/// The LIBSVM text's feature pairs, 0-based ids (the rows a caller holds in memory).
fn libsvm_pairs(text: &str) -> Vec<Vec<(u64, f64)>> {
    text.lines()
        .map(|line| {
            line.split_whitespace()
                .skip(1)
                .map(|tok| {
                    let (id, value) = tok.split_once(':').unwrap();
                    (id.parse::<u64>().unwrap() - 1, value.parse().unwrap())
                })
                .collect()
        })
        .collect()
}

/// Rows from memory under a model file (`predict::input::score_pairs`, what the Python
/// bindings call) get the bits `predict --model --input` writes for the same rows as
/// text, block by block, with probabilities; a bad row names its position.
#[test]
fn rows_from_memory_score_as_the_same_rows_from_a_file() {
    use fsgp::portable::PortableModel;
    use fsgp::predict::input::score_pairs;
    use fsgp::predict::PredictOptions;
    use fsgp::text::parse::UnknownFeatures;
    let case = Case::new();
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let label = |x: &[f64; 3]| if x[0] > 0.3 { "+1" } else { "-1" }.to_string();
    let train = case.file("train.svm", libsvm_text(200, &mut rng, label).as_bytes());
    let test_text = libsvm_text(70, &mut rng, label);
    let test = case.file("test.svm", test_text.as_bytes());
    let run = case.model(
        "mem",
        (&train, &test),
        &["--format", "libsvm", "--transform", "standardize"],
        "3",
        &[
            "--task",
            "binary",
            "--latent",
            "independent",
            "--kernel",
            "se",
        ],
    );
    let by_text = case.input_rows(&run, &test, &["--probabilities", "--block-rows", "32"]);
    let model = case.dir.path().join(format!("run-{run}.model.parquet"));
    let file = PortableModel::open(&model).unwrap();
    let mut opts = PredictOptions::new(0);
    opts.probabilities = true;
    opts.block_rows = 32;
    let pairs = libsvm_pairs(&test_text);
    let scored = score_pairs(
        &file,
        pairs.iter().map(Vec::as_slice),
        &opts,
        UnknownFeatures::Refuse,
    )
    .unwrap();
    assert_eq!(scored.blocks.len(), 3, "70 rows in blocks of 32");
    let mut from_memory = Vec::new();
    for b in &scored.blocks {
        push_rows(b, &mut from_memory);
    }
    assert_eq!(from_memory, by_text);
    let mut bad = pairs.clone();
    bad[5].push((7, 1.0));
    let e = score_pairs(
        &file,
        bad.iter().map(Vec::as_slice),
        &opts,
        UnknownFeatures::Refuse,
    )
    .unwrap_err();
    assert!(
        format!("{e:#}").contains("row 5: found feature id 7, expected < 3 (D = 3"),
        "{e:#}"
    );
}
