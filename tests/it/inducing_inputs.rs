//! `pipeline train --inducing-inputs subspace|free|fixed-subspace|fixed-rows` end to end on
//! the toy workspace (tests/it/common/toy.rs): a free run starts at exactly the bound a
//! subspace run starts at (`pipeline elbo`), trains Z [M×D], predicts and evaluates;
//! fixed-rows holds M distinct training rows drawn from the seed, unchanged through
//! training; fixed-subspace is `--freeze-a`, bit for bit; free runs are bitwise
//! reproducible, across thread counts too, and resume after a crash to the same bytes;
//! the memory check refuses before anything runs; specs are checked; status shows it.

use crate::common;
use common::toy::*;
use common::*;
use faer::Mat;
use fsgp::store::chunks::read_chunk;
use std::path::Path;
use std::process::Command;

/// Features of the toy dataset (D) and its inducing inputs (M).
const D: usize = 60;
const M: usize = 16;

fn elbo_exact(ws: &Path, run: i64) -> f64 {
    let values = metrics(ws, run, "elbo_exact");
    f64::from_bits(values.last().expect("an exact bound was recorded").1)
}

/// The exact bound at (almost exactly) the initial parameters: one step with η = 1e-300
/// moves nothing but μ's zeros, by 1e-300, then `pipeline elbo` on the final checkpoint.
fn initial_bound(ws: &Path, extra: &[&str]) -> f64 {
    let mut overrides = vec!["--max-steps", "1", "--lr", "1e-300", "--no-final-elbo"];
    overrides.extend_from_slice(extra);
    let run = train_ok(ws, &overrides);
    let out = pipeline(ws, &["elbo", "--run", &run.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    elbo_exact(ws, run)
}

#[test]
fn free_starts_at_the_subspace_bound_through_pipeline_elbo() {
    // Z₀ = A₀ X̃ gives K_Z = A₀K_X̃A₀ᵀ and K_bZ = X_b X̃ᵀA₀ᵀ = Kxx_b A₀ᵀ: the subspace model at
    // A₀, whatever the rank; at R = D (a full orthonormal basis) the two are the same model
    // everywhere. The bounds differ only by kxx.npy's f32 rounding of X X̃ᵀ.
    let p = prepared();
    for rank in ["8", "60"] {
        let ws = p.copy(&format!("elbo-r{rank}"));
        if rank == "60" {
            // A second svd run, the newest, which training then uses: R = D.
            let out = pipeline(
                &ws,
                &[
                    "svd",
                    "--dataset",
                    "toy",
                    "--rank",
                    rank,
                    "--inducing",
                    "16",
                ],
            );
            assert!(out.status.success(), "{}", stderr(&out));
        }
        for kernel in ["linear", "se"] {
            let subspace = initial_bound(&ws, &["--kernel", kernel]);
            let free = initial_bound(&ws, &["--kernel", kernel, "--inducing-inputs", "free"]);
            let rel = (subspace - free).abs() / subspace.abs();
            eprintln!(
                "R = {rank}, {kernel}: subspace {subspace:.12e}, free {free:.12e}, relative {rel:.1e}"
            );
            assert!(
                rel <= 1e-8,
                "R = {rank}, {kernel}: {subspace} vs {free} ({rel:e})"
            );
            // Fixed training rows are another model: another bound.
            let rows = initial_bound(
                &ws,
                &["--kernel", kernel, "--inducing-inputs", "fixed-rows"],
            );
            assert!(
                (rows - subspace).abs() > 1e-5 * subspace.abs(),
                "{rows} vs {subspace}"
            );
        }
    }
}

/// Every training row of the toy workspace densified [N×D], in row order.
fn training_rows(ws: &Path) -> Vec<Vec<f64>> {
    let dir = ws.join("datasets/toy.run1/train");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut rows = Vec::new();
    for f in files {
        let chunk = read_chunk(&f).unwrap();
        for i in 0..chunk.len() {
            let mut dense = vec![0.0; D];
            chunk.densify_row(i, D, |j, v| dense[j] = v as f64).unwrap();
            rows.push(dense);
        }
    }
    rows
}

fn z_rows(z: &Mat<f64>) -> Vec<Vec<f64>> {
    (0..z.nrows())
        .map(|i| (0..z.ncols()).map(|j| z[(i, j)]).collect())
        .collect()
}

/// Predicts and evaluates run `run` on the test split; P@1 in percent.
fn predict_and_evaluate(ws: &Path, run: i64) -> f64 {
    let id = run.to_string();
    let out = pipeline(ws, &["predict", "--run", &id, "--probabilities"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = pipeline(ws, &["evaluate", "--run", &id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p1 = json["p_at"][0]
        .as_f64()
        .unwrap_or_else(|| panic!("no P@1 in {json}"));
    100.0 * p1
}

#[test]
fn free_trains_z_in_input_space_and_predicts() {
    let p = prepared();
    let ws = p.copy("free");
    let run = train_ok(&ws, &["--inducing-inputs", "free"]);
    let ck = checkpoints(&ws, run);
    let steps: Vec<u64> = ck.keys().copied().collect();
    let first = read_ckpt(&ws, run, steps[0]).params.a;
    let last = read_ckpt(&ws, run, STEPS).params.a;
    // The checkpoint's A tensor holds Z [M×D], and training moves it.
    assert_eq!((last.nrows(), last.ncols()), (M, D));
    assert_ne!(z_rows(&first), z_rows(&last), "free must train Z");
    let params = run_params(&ws, run);
    assert_eq!(params["inducing_inputs"], "free");
    assert_eq!(params["freeze_a"], false);
    // The bound improves, and the model ranks the test rows better than chance.
    let elbo = metrics(&ws, run, "epoch_elbo");
    assert!(f64::from_bits(elbo[5].1) > f64::from_bits(elbo[0].1));
    let p1 = predict_and_evaluate(&ws, run);
    eprintln!("free: P@1 {p1:.2} %");
    assert!(p1 > 20.0, "P@1 {p1}");
    // status shows the choice, and D as the width the model sees.
    let summary = train_summary(&ws, run);
    assert_eq!(summary["inducing_inputs"], "free");
    assert_eq!(summary["rank"], D as u64);
    let table = stdout(&pipeline(&ws, &["status"]));
    assert!(table.contains(&format!("{M}/3/D{D}")), "{table}");
    let detail = stdout(&pipeline(&ws, &["status", "--run", &run.to_string()]));
    assert!(detail.contains("inducing inputs: free"), "{detail}");
}

#[test]
fn fixed_rows_are_distinct_training_rows_from_the_seed_and_never_move() {
    let p = prepared();
    let ws = p.copy("rows");
    let run = train_ok(&ws, &["--inducing-inputs", "fixed-rows"]);
    let rows = training_rows(&ws);
    let ck = checkpoints(&ws, run);
    let z0 = z_rows(&read_ckpt(&ws, run, *ck.keys().next().unwrap()).params.a);
    assert_eq!(z0.len(), M);
    // Each row of Z is a training row, bit for bit, and no two are the same row.
    let mut picked: Vec<usize> = z0
        .iter()
        .map(|z| {
            rows.iter()
                .position(|r| r.iter().zip(z).all(|(a, b)| a.to_bits() == b.to_bits()))
                .expect("a row of Z that is no training row")
        })
        .collect();
    picked.sort_unstable();
    picked.dedup();
    assert_eq!(picked.len(), M, "rows {picked:?} are not distinct");
    // Z stays as it was at every checkpoint, while the rest trains.
    for &step in ck.keys() {
        let c = read_ckpt(&ws, run, step);
        assert_eq!(z_rows(&c.params.a), z0, "Z moved by step {step}");
    }
    let first = read_ckpt(&ws, run, 7).params.q.mu().clone();
    let last = read_ckpt(&ws, run, STEPS).params.q.mu().clone();
    assert_ne!(z_rows(&first), z_rows(&last), "μ must train");
    let params = run_params(&ws, run);
    assert_eq!(params["inducing_inputs"], "fixed-rows");
    assert_eq!(params["freeze_a"], true);
    // The same seed picks the same rows, another seed others.
    let again = p.copy("rows-again");
    let run_again = train_ok(&again, &["--inducing-inputs", "fixed-rows"]);
    assert_eq!(checkpoints(&again, run_again), ck);
    let other = p.copy("rows-other");
    let run_other = train_ok(&other, &["--inducing-inputs", "fixed-rows", "--seed", "12"]);
    let z_other = z_rows(&read_ckpt(&other, run_other, STEPS).params.a);
    assert_ne!(z_other, z0);
    let p1 = predict_and_evaluate(&ws, run);
    eprintln!("fixed-rows: P@1 {p1:.2} %");
    assert!(p1 > 20.0, "P@1 {p1}");
}

#[test]
fn fixed_subspace_is_freeze_a_bit_for_bit() {
    let p = prepared();
    let ws_a = p.copy("freeze-a");
    let run_a = train_ok(&ws_a, &["--freeze-a"]);
    let ws_b = p.copy("fixed-subspace");
    let run_b = train_ok(&ws_b, &["--inducing-inputs", "fixed-subspace"]);
    assert_eq!(checkpoints(&ws_a, run_a), checkpoints(&ws_b, run_b));
    let params = run_params(&ws_b, run_b);
    assert_eq!(params, run_params(&ws_a, run_a));
    assert!(params.get("inducing_inputs").is_none(), "{params}");
    // One configuration: the other spelling finds the run done.
    let out = pipeline(&ws_a, &train_args(&["--inducing-inputs", "fixed-subspace"]));
    assert!(stderr(&out).contains("already done"), "{}", stderr(&out));
    assert_eq!(train_run_id(&ws_a), run_a);
    // A trains under the default, which stores nothing new.
    let ws_c = p.copy("subspace");
    let run_c = train_ok(&ws_c, &["--inducing-inputs", "subspace"]);
    assert!(run_params(&ws_c, run_c).get("inducing_inputs").is_none());
    let a_first = z_rows(&read_ckpt(&ws_c, run_c, 7).params.a);
    assert_ne!(a_first, z_rows(&read_ckpt(&ws_c, run_c, STEPS).params.a));
    // Training Z and fixing it at once is refused, naming both.
    let out = pipeline(
        &ws_a,
        &train_args(&["--inducing-inputs", "free", "--freeze-a"]),
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--freeze-a fixes it"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn free_runs_repeat_bitwise_across_thread_counts_and_resume_after_a_crash() {
    let p = prepared();
    let free = ["--inducing-inputs", "free"];
    let ws_a = p.copy("a");
    let run_a = train_ok(&ws_a, &free);
    let ws_b = p.copy("b");
    let run_b = train_ok(&ws_b, &free);
    let expected = checkpoints(&ws_a, run_a);
    assert_eq!(expected, checkpoints(&ws_b, run_b));
    // One thread: the same parameters and Adam moments, bit for bit (the checkpoint
    // bytes differ only by the recorded thread count).
    let ws_1 = p.copy("one-thread");
    let run_1 = train_ok(&ws_1, &["--inducing-inputs", "free", "--threads", "1"]);
    assert_eq!(
        tensor_bits(&read_ckpt(&ws_1, run_1, STEPS)),
        tensor_bits(&read_ckpt(&ws_a, run_a, STEPS))
    );
    // Crashes around checkpoints, then --resume: the uninterrupted run's bytes.
    for point in ["checkpoint-written:14", "checkpoint-renamed:49"] {
        let ws = p.copy(&point.replace(':', "-"));
        let id = crash_at(&ws, &free, point);
        // The inducing inputs cannot change on resume.
        let out = pipeline(
            &ws,
            &[
                "train",
                "--resume",
                &id.to_string(),
                "--inducing-inputs",
                "subspace",
            ],
        );
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains(&format!(
                "--inducing-inputs subspace: run {id} has free, and it cannot change on resume"
            )),
            "{}",
            stderr(&out)
        );
        let out = pipeline(&ws, &["train", "--resume", &id.to_string()]);
        assert!(out.status.success(), "{point}: {}", stderr(&out));
        assert_eq!(checkpoints(&ws, id), expected, "{point}");
        assert_eq!(
            metrics(&ws, id, "epoch_elbo"),
            metrics(&ws_a, run_a, "epoch_elbo")
        );
    }
}

#[test]
fn input_space_memory_is_refused_before_anything_runs() {
    let p = prepared();
    let ws = p.copy("memory");
    let out = Command::new(pipeline_bin())
        .arg("--workspace")
        .arg(&ws)
        .args(train_args(&["--inducing-inputs", "free"]))
        .env("FSGP_INPUTS_MEMORY_MIB", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    // M = 16, D = 60, B = 64, prefetch 4: 6·16·60 doubles and 6·64 sparse rows = 0.1 MiB
    // (no I_D: D > ¾M).
    for expected in [
        "--inducing-inputs free needs about 0.1 MiB",
        "the limit is 0 MiB",
        "FSGP_INPUTS_MEMORY_MIB=MIB",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in: {err}");
    }
    assert_eq!(
        count_runs(&ws, "train", None),
        0,
        "no training run may be started"
    );
}

#[test]
fn specs_check_the_inducing_inputs_and_run_them() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let bad = write(
        dir.path(),
        "bad.toml",
        &toy_spec(1, "inducing_inputs = \"fre\"\n", ""),
    );
    let out = pipeline(&ws, &["run", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("inducing_inputs") || err.contains("inducing-inputs"),
        "{err}"
    );
    assert!(err.contains("fre"), "{err}");
    let both = write(
        dir.path(),
        "both.toml",
        &toy_spec(1, "inducing_inputs = \"free\"\nfreeze_a = true\n", ""),
    );
    let out = pipeline(&ws, &["run", both.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--freeze-a fixes it"),
        "{}",
        stderr(&out)
    );
    assert!(
        !ws.join("datasets").exists(),
        "a stage ran before the spec was checked"
    );
    let good = write(
        dir.path(),
        "good.toml",
        &toy_spec(2, "inducing_inputs = \"fixed-rows\"\n", ""),
    );
    let out = pipeline(&ws, &["run", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let runs = status_json(&ws)["train_runs"].clone();
    assert_eq!(runs[0]["inducing_inputs"], "fixed-rows", "{runs}");
}

#[test]
fn axes_train_the_weights_predict_and_repeat_bitwise_after_a_crash() {
    let p = prepared();
    let axes = ["--inducing-inputs", "axes"];
    let ws = p.copy("axes");
    let run = train_ok(&ws, &axes);
    let first = read_ckpt(&ws, run, *checkpoints(&ws, run).keys().next().unwrap());
    let last = read_ckpt(&ws, run, STEPS);
    // No inducing inputs: A is [0×D]; q(u) has one row per feature, and training moves it.
    assert_eq!((last.params.a.nrows(), last.params.a.ncols()), (0, D));
    assert_eq!(last.params.q.mu().nrows(), D);
    assert_ne!(z_rows(first.params.q.mu()), z_rows(last.params.q.mu()));
    let elbo = metrics(&ws, run, "epoch_elbo");
    assert!(f64::from_bits(elbo[5].1) > f64::from_bits(elbo[0].1));
    let p1 = predict_and_evaluate(&ws, run);
    eprintln!("axes: P@1 {p1:.2} %");
    assert!(p1 > 20.0, "P@1 {p1}");
    let summary = train_summary(&ws, run);
    assert_eq!(summary["inducing_inputs"], "axes");
    assert_eq!(summary["inducing"], D as u64);
    // The exact bound at the end (`pipeline elbo`) reads the axes' checkpoint.
    let out = pipeline(&ws, &["elbo", "--run", &run.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(elbo_exact(&ws, run).is_finite());
    // One thread: the same bits.
    let ws_1 = p.copy("axes-one-thread");
    let run_1 = train_ok(&ws_1, &["--inducing-inputs", "axes", "--threads", "1"]);
    assert_eq!(
        tensor_bits(&read_ckpt(&ws_1, run_1, STEPS)),
        tensor_bits(&last)
    );
    // A crash after a checkpoint, then --resume: the uninterrupted run's checkpoints.
    let ws_c = p.copy("axes-crash");
    let id = crash_at(&ws_c, &axes, "checkpoint-renamed:49");
    let out = pipeline(&ws_c, &["train", "--resume", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(checkpoints(&ws_c, id), checkpoints(&ws, run));
}

#[test]
fn axes_refuse_what_they_cannot_be() {
    let p = prepared();
    let ws = p.copy("axes-refusals");
    for (extra, expected) in [
        (
            &["--kernel", "se"][..],
            "--kernel se with --inducing-inputs axes",
        ),
        (
            &["--inducing", "8"][..],
            "--inducing with --inducing-inputs axes",
        ),
        (
            &["--q-form", "whitened"][..],
            "--q-form whitened with --inducing-inputs axes",
        ),
        (
            &["--ard", "subspace"][..],
            "--ard subspace with --inducing-inputs axes",
        ),
        (
            &["--freeze-a"][..],
            "--freeze-a with --inducing-inputs axes",
        ),
    ] {
        let mut overrides = vec!["--inducing-inputs", "axes"];
        overrides.extend_from_slice(extra);
        let out = pipeline(&ws, &train_args(&overrides));
        assert!(!out.status.success(), "{extra:?} ran");
        assert!(
            stderr(&out).contains(expected),
            "{extra:?}: {}",
            stderr(&out)
        );
    }
    assert_eq!(count_runs(&ws, "train", None), 0, "nothing registered");
}
