//! Paths the user names for outputs (`src/store/user_file.rs`, `docs/reliability.md`,
//! "Outputs at paths the user names"): `report --out`, `synth --out`, `predict --output`,
//! `export --out`, `fit --spec-out` and `--model-out`. Each case runs the binary in a
//! sandbox of its own whose other files (the "victims": the user's files beside the
//! target, the workspace) are hashed (xxh3) before and after: a refused command exits 1
//! naming what was wrong and leaves every one of them as it was; a directory, a device or
//! a file the user did not let go (`--force`) is never replaced; a directory output writes
//! only its own file names.

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

use crate::common::registered::{pipeline_spec, query};
use crate::common::toy::copy_dir;
use crate::common::*;

/// The baseline's training run (the spec runs ingest 1, svd 2, train 3, predict 4,
/// evaluate 5).
const TRAIN_RUN: &str = "3";

/// A workspace that ran the pipeline spec, built once per test binary; its generated data
/// (`data/train.txt`, `data/test.txt`) beside it.
fn baseline() -> &'static Path {
    static BASELINE: OnceLock<PathBuf> = OnceLock::new();
    BASELINE.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("user-outputs-baseline");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let spec = write(&root, "toy.toml", &pipeline_spec());
        let out = pipeline(&root.join("ws"), &["run", spec.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        root
    })
}

/// A private copy of the baseline (workspace `ws`, data `data/`) in a fresh directory.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Self {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        copy_dir(&baseline().join("ws"), &dir.path().join("ws"));
        copy_dir(&baseline().join("data"), &dir.path().join("data"));
        Sandbox { dir }
    }

    /// An empty sandbox, for the commands that need no workspace.
    fn empty() -> Self {
        Sandbox {
            dir: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
        }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn ws(&self) -> PathBuf {
        self.root().join("ws")
    }

    /// `pipeline --workspace WS ARGS...`.
    fn run(&self, args: &[&str]) -> Output {
        pipeline(&self.ws(), args)
    }

    /// A directory `name` holding the user's own files: `notes.txt`, `README.md` and
    /// `sub/keep.bin`.
    fn users_directory(&self, name: &str) -> PathBuf {
        let dir = self.root().join(name);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        write(&dir, "notes.txt", "the user's notes\n");
        write(&dir, "README.md", "# the user's own readme\n");
        std::fs::write(dir.join("sub/keep.bin"), [0u8, 1, 2, 3]).unwrap();
        dir
    }

    /// Every entry below the sandbox: a regular file by the xxh3 of its bytes, anything
    /// else by its kind (but SQLite's own `-wal` and `-shm` beside the catalog).
    fn snapshot(&self) -> BTreeMap<String, String> {
        snapshot(self.root())
    }
}

fn snapshot(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            // Made by SQLite when the catalog is opened, for reading too.
            if rel.ends_with("catalog.sqlite-wal") || rel.ends_with("catalog.sqlite-shm") {
                continue;
            }
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            let what = if kind.is_dir() {
                walk(root, &path, out);
                "directory".to_string()
            } else if kind.is_file() {
                let bytes = std::fs::read(&path).unwrap();
                format!("file {:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
            } else {
                format!("{kind:?}")
            };
            out.insert(rel, what);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The command failed with exit status 1 (a refusal, not a panic or a usage error) and
/// said `says`.
fn assert_refused(out: &Output, says: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(says), "expected {says:?} in: {err}");
}

/// What changed between two snapshots: (path, before, after).
fn changes(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> Vec<(String, Option<String>, Option<String>)> {
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| (k.clone(), before.get(k).cloned(), after.get(k).cloned()))
        .collect()
}

fn assert_unchanged(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) {
    let changed = changes(before, after);
    assert!(changed.is_empty(), "changed: {changed:#?}");
}

/// A special file to aim outputs at, and how the refusal names it: as root, a character
/// device of /dev/null's numbers (1, 3) made in the sandbox, so that a regression replaces
/// that node and never the machine's /dev/null; for a user who is not root, /dev/null
/// itself (which such a user cannot replace); as root where mknod is refused, a FIFO.
fn special_file(sandbox: &Sandbox) -> (PathBuf, &'static str) {
    let node = sandbox.root().join("null");
    let c_path = std::ffi::CString::new(node.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mknod, geteuid and mkfifo read the NUL-terminated path (or nothing) only.
    unsafe {
        if libc::mknod(c_path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) == 0 {
            return (node, "a character device");
        }
        if libc::geteuid() != 0 {
            return (PathBuf::from("/dev/null"), "a character device");
        }
        assert_eq!(
            libc::mkfifo(c_path.as_ptr(), 0o666),
            0,
            "mkfifo {}",
            node.display()
        );
    }
    (node, "a FIFO")
}

/// `path` is still the special file [`special_file`] made, and /dev/null still a device.
fn assert_still_special(path: &Path) {
    let kind = std::fs::symlink_metadata(path).unwrap().file_type();
    assert!(
        kind.is_char_device() || kind.is_fifo(),
        "{} is no longer a special file: {kind:?}",
        path.display()
    );
    let dev_null = std::fs::symlink_metadata("/dev/null").unwrap().file_type();
    assert!(dev_null.is_char_device(), "/dev/null is no longer a device");
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

// --- report ------------------------------------------------------------------------------

/// `report --out DIR` into a directory of the user's: a name of the report's there
/// (`README.md`) is refused before anything is drawn, leaving every file as it was; into
/// a directory without one, the report's files are added beside the user's; with
/// `--force`, the report's names are replaced and nothing else is touched.
#[test]
fn report_out_writes_only_its_own_names_beside_the_users_files() {
    let sandbox = Sandbox::new();
    let dir = sandbox.users_directory("mine");
    let before = sandbox.snapshot();
    let out = sandbox.run(&["report", "--run", TRAIN_RUN, "--out", s(&dir)]);
    assert_refused(
        &out,
        &format!("{} exists; give --force", dir.join("README.md").display()),
    );
    assert_unchanged(&before, &sandbox.snapshot());

    std::fs::remove_file(dir.join("README.md")).unwrap();
    let before = sandbox.snapshot();
    pipeline_ok(
        &sandbox.ws(),
        &["report", "--run", TRAIN_RUN, "--out", s(&dir)],
    );
    let added: Vec<String> = changes(&before, &sandbox.snapshot())
        .into_iter()
        .map(|(path, was, _)| {
            assert_eq!(was, None, "{path} was there before and changed");
            path.strip_prefix("mine/").unwrap().to_string()
        })
        .collect();
    assert!(added.contains(&"README.md".to_string()), "{added:?}");
    assert!(added.contains(&"elbo.png".to_string()), "{added:?}");
    assert!(
        added.iter().all(|n| !n.contains('/')),
        "only files in DIR: {added:?}"
    );

    write(&dir, "README.md", "# the user's own readme\n");
    let before = sandbox.snapshot();
    let args = ["report", "--run", TRAIN_RUN, "--out", s(&dir), "--force"];
    pipeline_ok(&sandbox.ws(), &args);
    for (path, was, now) in changes(&before, &sandbox.snapshot()) {
        let name = path.strip_prefix("mine/").unwrap_or(&path);
        assert!(
            added.contains(&name.to_string()) && was.is_some() && now.is_some(),
            "--force changed {path} ({was:?} -> {now:?}), not one of the report's files"
        );
    }
    assert_ne!(
        std::fs::read_to_string(dir.join("README.md")).unwrap(),
        "# the user's own readme\n"
    );
}

/// `report --out` at the workspace, at a training run's directory or inside the catalog's
/// directories is refused before anything is drawn; the workspace keeps every byte.
#[test]
fn report_out_in_the_workspace_is_refused_and_touches_nothing() {
    let sandbox = Sandbox::new();
    let ws = sandbox.ws();
    let checkpoint: String = query(
        &ws,
        "SELECT path FROM checkpoints WHERE stage_run_id = 3 ORDER BY step LIMIT 1",
    );
    let run_dir = ws.join(&checkpoint).parent().unwrap().to_path_buf();
    let before = sandbox.snapshot();
    for target in [ws.clone(), run_dir.clone(), ws.join("datasets/new")] {
        let out = sandbox.run(&["report", "--run", TRAIN_RUN, "--out", s(&target)]);
        assert_refused(
            &out,
            &format!("--out {}: inside the workspace", target.display()),
        );
        assert_unchanged(&before, &sandbox.snapshot());
    }
    // `..` and a symbolic link do not hide the workspace.
    let link = sandbox.root().join("link-to-run");
    std::os::unix::fs::symlink(&run_dir, &link).unwrap();
    let dotted = sandbox.root().join("data/../ws");
    for target in [link, dotted] {
        let before = sandbox.snapshot();
        let out = sandbox.run(&["report", "--run", TRAIN_RUN, "--out", s(&target), "--force"]);
        assert_refused(&out, "inside the workspace");
        assert_unchanged(&before, &sandbox.snapshot());
    }
}

/// The default directory (`WS/reports/train-run3`) is the report's: a second report
/// replaces the first's files without `--force`, and a file of the user's put there stays.
#[test]
fn the_default_report_directory_replaces_only_the_reports_files() {
    let sandbox = Sandbox::new();
    let ws = sandbox.ws();
    pipeline_ok(&ws, &["report", "--run", TRAIN_RUN]);
    let dir = ws.join("reports/train-run3");
    write(&dir, "my-notes.txt", "keep me\n");
    let before = snapshot(&dir);
    pipeline_ok(&ws, &["report", "--run", TRAIN_RUN]);
    assert_unchanged(&before, &snapshot(&dir));
    // Replaced, not only left: a report's file of another content is rewritten.
    write(&dir, "README.md", "stale\n");
    pipeline_ok(&ws, &["report", "--run", TRAIN_RUN]);
    assert_eq!(snapshot(&dir), before);
}

// --- predict --input … --output ----------------------------------------------------------

/// `predict --output` at a device (`--force` or not), at a directory, at an existing file
/// without `--force`, and at its own input: refused before any row is read, with every
/// file as it was and the device still a device.
#[test]
fn predict_output_is_never_a_device_a_directory_or_a_kept_file() {
    let sandbox = Sandbox::new();
    let input = sandbox.root().join("data/test.txt");
    let dir = sandbox.users_directory("mine");
    let existing = dir.join("notes.txt");
    let (device, kind) = special_file(&sandbox);
    let cases: [(&Path, &[&str], String); 5] = [
        (
            &device,
            &["--force"],
            format!(
                "{}: found {kind}, expected a regular file or nothing",
                device.display()
            ),
        ),
        (&device, &[], format!("{}: found {kind}", device.display())),
        (
            &dir,
            &["--force"],
            format!(
                "{}: found a directory, expected a regular file",
                dir.display()
            ),
        ),
        (
            &existing,
            &[],
            format!("{} exists; give --force to replace it", existing.display()),
        ),
        (
            &input,
            &["--force"],
            format!(
                "--output {} and --input {}",
                input.display(),
                input.display()
            ),
        ),
    ];
    for (output, extra, says) in cases {
        let before = sandbox.snapshot();
        let mut args = vec!["predict", "--run", TRAIN_RUN, "--input", s(&input)];
        args.extend(["--output", s(output)]);
        args.extend(extra);
        assert_refused(&sandbox.run(&args), &says);
        assert_unchanged(&before, &sandbox.snapshot());
        assert_still_special(&device);
    }
}

// --- export ------------------------------------------------------------------------------

/// `export --out` at a directory, at a device and in a missing directory is refused before
/// the workspace is read, `--force` or not.
#[test]
fn export_out_is_never_a_directory_or_a_device() {
    let sandbox = Sandbox::new();
    let dir = sandbox.users_directory("mine");
    let missing = sandbox.root().join("no-such-dir/model.parquet");
    let (device, kind) = special_file(&sandbox);
    let cases = [
        (dir.clone(), format!("{}: found a directory", dir.display())),
        (
            device.clone(),
            format!("{}: found {kind}", device.display()),
        ),
        (
            missing.clone(),
            format!(
                "{}: directory {} does not exist",
                missing.display(),
                missing.parent().unwrap().display()
            ),
        ),
    ];
    for (out, says) in cases {
        for extra in [&[][..], &["--force"][..]] {
            let before = sandbox.snapshot();
            let mut args = vec!["export", "--run", TRAIN_RUN, "--out", s(&out)];
            args.extend(extra);
            assert_refused(&sandbox.run(&args), &says);
            assert_unchanged(&before, &sandbox.snapshot());
            assert_still_special(&device);
        }
    }
}

/// `export --out` and `predict --output` at a registered file of the workspace (a
/// checkpoint) or at the catalog, `--force` or not: refused before anything is read, every
/// byte as it was (the catalog no longer vouches for a file replaced behind its back).
#[test]
fn outputs_in_the_workspaces_own_folders_are_refused() {
    let sandbox = Sandbox::new();
    let ws = sandbox.ws();
    let checkpoint: String = query(
        &ws,
        "SELECT path FROM checkpoints ORDER BY step DESC LIMIT 1",
    );
    let rows = write(sandbox.root(), "rows.txt", "1:0.5 2:0.25\n");
    for (target, top) in [
        (ws.join(&checkpoint), "train"),
        (ws.join("catalog.sqlite"), "catalog.sqlite"),
    ] {
        let says = format!("lies in the workspace's own '{top}'");
        let before = sandbox.snapshot();
        let export = ["export", "--run", TRAIN_RUN, "--out", s(&target), "--force"];
        assert_refused(&sandbox.run(&export), &says);
        let predict = [
            "predict",
            "--run",
            TRAIN_RUN,
            "--input",
            s(&rows),
            "--output",
            s(&target),
            "--force",
        ];
        assert_refused(&sandbox.run(&predict), &says);
        assert_unchanged(&before, &sandbox.snapshot());
    }
}

// --- synth -------------------------------------------------------------------------------

/// `synth --out DIR` where DIR holds a `train.txt` (or only a `test.txt`): refused before
/// anything is generated, every file as it was (no `test.txt`, or `train.txt`, either); with `--force` both files are written and
/// the user's other files stay.
#[test]
fn synth_out_keeps_an_existing_train_txt_unless_forced() {
    let sandbox = Sandbox::empty();
    let dir = sandbox.users_directory("data");
    write(&dir, "train.txt", "the user's training file\n");
    let synth = |extra: &[&str]| {
        let mut args = vec!["synth", "--out", s(&dir), "--rows", "50"];
        args.extend(["--features", "10", "--labels", "5", "--seed", "1"]);
        args.extend(extra);
        pipeline(&sandbox.root().join("ws"), &args)
    };
    let before = sandbox.snapshot();
    assert_refused(
        &synth(&[]),
        &format!("{} exists; give --force", dir.join("train.txt").display()),
    );
    assert_unchanged(&before, &sandbox.snapshot());

    // Refused before the work, not when the files are moved into place: train.txt,
    // moved first, is not written either when only a test.txt is there.
    std::fs::rename(dir.join("train.txt"), dir.join("test.txt")).unwrap();
    let before_test = sandbox.snapshot();
    assert_refused(
        &synth(&[]),
        &format!("{} exists; give --force", dir.join("test.txt").display()),
    );
    assert_unchanged(&before_test, &sandbox.snapshot());
    std::fs::rename(dir.join("test.txt"), dir.join("train.txt")).unwrap();

    let out = synth(&["--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let changed: Vec<String> = changes(&before, &sandbox.snapshot())
        .into_iter()
        .map(|(path, ..)| path)
        .collect();
    assert_eq!(changed, ["data/test.txt", "data/train.txt"]);
    let train = std::fs::read_to_string(dir.join("train.txt")).unwrap();
    assert!(
        train.starts_with("50 10 5\n"),
        "{}",
        &train[..20.min(train.len())]
    );
}

// --- fit ---------------------------------------------------------------------------------

/// A small LIBSVM training file for fit.
fn fit_train_file(dir: &Path) -> PathBuf {
    let rows: String = (0..40)
        .map(|i| {
            let x = i as f64 / 40.0;
            format!(
                "{} 1:{x:.3} 2:{:.3}\n",
                if i % 2 == 0 { "+1" } else { "-1" },
                1.0 - x
            )
        })
        .collect();
    write(dir, "toy.svm", &rows)
}

/// `fit` with `--spec-out X --model-out X`, and with `--spec-out` in a missing directory:
/// refused at once, before its ingest (no ingest line, no dataset, a few seconds at most),
/// every file as it was.
#[test]
fn fit_refuses_colliding_or_unwritable_outputs_before_its_ingest() {
    let sandbox = Sandbox::empty();
    let train = fit_train_file(sandbox.root());
    let same = sandbox.root().join("out.toml");
    let missing = sandbox.root().join("no-such-dir/fit.toml");
    let model = sandbox.root().join("model.parquet");
    let cases = [
        (
            vec!["--spec-out", s(&same), "--model-out", s(&same)],
            format!(
                "--spec-out {} and --model-out {} name the same file",
                same.display(),
                same.display()
            ),
        ),
        (
            vec!["--spec-out", s(&missing), "--model-out", s(&model)],
            format!(
                "--spec-out: {}: directory {} does not exist",
                missing.display(),
                missing.parent().unwrap().display()
            ),
        ),
        (
            vec!["--spec-out", s(&train), "--force"],
            format!(
                "--spec-out {} and --train {}",
                train.display(),
                train.display()
            ),
        ),
    ];
    for (extra, says) in cases {
        let before = sandbox.snapshot();
        let mut args = vec!["fit", "--train", s(&train), "--budget", "60s"];
        args.extend(extra);
        let started = std::time::Instant::now();
        let out = sandbox.run(&args);
        let seconds = started.elapsed().as_secs_f64();
        assert_refused(&out, &says);
        assert!(!stderr(&out).contains("== fit: ingest"), "{}", stderr(&out));
        assert!(seconds < 5.0, "refused after {seconds:.1} s");
        if sandbox.ws().exists() {
            assert!(dataset_names(&sandbox.ws()).is_empty(), "nothing ingested");
        }
        let changed = changes(&before, &sandbox.snapshot());
        assert!(
            changed
                .iter()
                .all(|(path, was, _)| was.is_none() && path.starts_with("ws")),
            "only the (empty) workspace may appear: {changed:#?}"
        );
    }
}
