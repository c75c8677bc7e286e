//! `pipeline svd`: the out-of-core truncated SVD of the training matrix X and everything the
//! trainer needs from it, so that training never touches D-dimensional data:
//!
//! - `basis.npy` (R×D f32): X̃, the top-R right singular vectors as rows;
//! - `singular_values.npy` (R f64);
//! - `kxx.npy` (N×R f32): K_XX̃ = X X̃ᵀ = U_R S_R, written chunk by chunk into a memory map;
//! - `sq_norms.npy` (N f32): ‖x_i‖², for kernels that need the norms;
//! - `a_init.npy` (M×R f32): the initial subspace inducing inputs A, k-means centroids of
//!   the rows of K_XX̃ (or random rows).

pub mod kmeans;
pub mod rsvd;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use ndarray::{Array1, Array2};
use serde_json::json;

use crate::memtrace;
use crate::sparse::project_chunk;
use crate::store::catalog::{ArtifactRow, DatasetRow};
use crate::store::chunks::{read_chunk, WrittenFile};
use crate::store::npy::{write_array, NpyMap, NpyRowWriter};
use crate::workspace::Workspace;
use kmeans::{InitMethod, KMeansConfig};
use rsvd::{randomized_svd, ChunkFiles, RowSource, SvdConfig};

/// Arguments of `pipeline svd`.
#[derive(clap::Args, Debug, Clone)]
pub struct SvdArgs {
    /// Dataset (as named at ingest) whose training split is factorised.
    #[arg(long)]
    pub dataset: String,
    /// R: number of singular vectors kept.
    #[arg(long)]
    pub rank: usize,
    /// p: extra random directions beyond R (accuracy of the last singular values).
    #[arg(long, default_value_t = 20)]
    pub oversample: usize,
    /// q: power iterations (each is one more pass over the data).
    #[arg(long, default_value_t = 2)]
    pub power_iters: usize,
    /// M: number of subspace inducing inputs initialised (rows of a_init.npy).
    #[arg(long, default_value_t = 500)]
    pub inducing: usize,
    /// How A is initialised.
    #[arg(long, value_enum, default_value_t = InitMethod::KmeansPlusPlus)]
    pub init: InitMethod,
    /// Lloyd iterations of the k-means initialisation.
    #[arg(long, default_value_t = 10)]
    pub kmeans_iters: usize,
    /// Run k-means on a uniform sample of at most this many rows of K_XX̃.
    #[arg(long, default_value_t = 200_000)]
    pub kmeans_max_rows: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// What an SVD run produced (or found already done).
#[derive(Debug, Clone)]
pub struct SvdOutcome {
    pub run_id: i64,
    /// False when an identical run was found in the catalog.
    pub computed: bool,
    /// Workspace-relative directory of the artifacts.
    pub dir: String,
    pub singular_values: Vec<f64>,
    pub pass_seconds: Vec<f64>,
}

fn train_chunk_files(ws: &Workspace, d: &DatasetRow) -> Result<ChunkFiles> {
    let chunks = ws.split_chunks(d, "train")?;
    let n_rows = chunks.iter().map(|c| c.1).sum();
    let files = chunks.into_iter().map(|c| c.0).collect();
    Ok(ChunkFiles {
        files,
        n_rows,
        n_cols: d.n_features as usize,
    })
}

fn progress_bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{pos}}/{{len}} chunks {{elapsed}}"
        ))
        .expect("valid template"),
    );
    pb
}

/// Runs `pipeline svd`.
pub fn run(workspace: &Path, args: &SvdArgs) -> Result<SvdOutcome> {
    let ws = Workspace::open(workspace)?;
    let dataset = ws.catalog.dataset(&args.dataset)?.with_context(|| {
        format!(
            "no dataset '{}' in {}; run `pipeline ingest` first",
            args.dataset,
            workspace.display()
        )
    })?;
    if args.inducing == 0 {
        bail!("--inducing must be at least 1");
    }
    let params = json!({
        "dataset": dataset.name,
        "dataset_checksum": dataset.checksum,
        "rank": args.rank,
        "oversample": args.oversample,
        "power_iters": args.power_iters,
        "inducing": args.inducing,
        "init": format!("{:?}", args.init),
        "kmeans_iters": args.kmeans_iters,
        "kmeans_max_rows": args.kmeans_max_rows,
        "seed": args.seed,
    });
    if let Some(done) = ws.catalog.find_ok_run("svd", &params)? {
        let arts = ws.catalog.run_artifacts(done.id)?;
        let sv_path = arts
            .iter()
            .find(|a| a.kind == "singular_values")
            .context("completed svd run without singular values")?;
        let sv: Array1<f64> = ndarray_npy::read_npy(ws.resolve(&sv_path.path))?;
        eprintln!(
            "svd of '{}' with these parameters is already done (run {}); nothing to do",
            dataset.name, done.id
        );
        return Ok(SvdOutcome {
            run_id: done.id,
            computed: false,
            dir: Path::new(&sv_path.path)
                .parent()
                .unwrap_or(Path::new(""))
                .display()
                .to_string(),
            singular_values: sv.to_vec(),
            pass_seconds: Vec::new(),
        });
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let src = train_chunk_files(&ws, &dataset)?;
    let run = ws.start_run("svd", &params)?;
    let tmp = run.tmp_dir().to_path_buf();
    let result = pool.install(|| compute(&src, &dataset, args, &tmp));
    let (artifacts_local, singular_values, pass_seconds) = match result {
        Ok(r) => r,
        Err(e) => {
            run.failed(&e);
            return Err(e);
        }
    };
    let rel = run.output_rel("svd", &format!("{}-r{}", dataset.name, args.rank));
    let run_id = run.id;
    let artifacts: Vec<ArtifactRow> = artifacts_local
        .iter()
        .map(|(kind, file, rows, written)| ArtifactRow {
            kind: kind.to_string(),
            path: format!("{rel}/{file}"),
            bytes: written.bytes,
            rows: Some(*rows),
            checksum: written.checksum.clone(),
            split: Some("train".into()),
        })
        .collect();
    run.publish_and_commit("svd", &rel, || {
        ws.catalog
            .commit_artifacts(run_id, Some(dataset.id), &artifacts)
    })?;
    Ok(SvdOutcome {
        run_id,
        computed: true,
        dir: rel,
        singular_values,
        pass_seconds,
    })
}

type LocalArtifact = (&'static str, &'static str, u64, WrittenFile);

/// Computes every artifact into `tmp/svd/`.
fn compute(
    src: &ChunkFiles,
    dataset: &DatasetRow,
    args: &SvdArgs,
    tmp: &Path,
) -> Result<(Vec<LocalArtifact>, Vec<f64>, Vec<f64>)> {
    let out = tmp.join("svd");
    std::fs::create_dir_all(&out)?;
    let started = Instant::now();
    let cfg = SvdConfig {
        rank: args.rank,
        oversample: args.oversample,
        power_iters: args.power_iters,
        seed: args.seed,
    };
    let pb = ProgressBar::new((args.power_iters + 2) as u64);
    pb.set_style(
        ProgressStyle::with_template("svd basis pass {pos}/{len} {bar:40} {elapsed}")
            .expect("valid template"),
    );
    let svd = randomized_svd(src, &cfg, &mut |i, _| pb.set_position(i as u64 + 1))?;
    pb.finish_and_clear();
    memtrace::mark("svd basis computed");
    let (n, d, r) = (src.n_rows as usize, src.n_cols, args.rank);
    let basis_t = Array2::from_shape_fn((d, r), |(j, k)| svd.basis_t[(j, k)] as f32);
    let svd = rsvd::SvdResult {
        basis_t: faer::Mat::new(),
        ..svd
    };
    let basis = basis_t.t().as_standard_layout().into_owned();
    let basis_file = write_array(&out.join("basis.npy"), &basis)?;
    drop(basis);
    memtrace::mark("svd basis.npy written");
    let sv = Array1::from(svd.singular_values.clone());
    let mut arts: Vec<LocalArtifact> = vec![
        ("basis", "basis.npy", r as u64, basis_file),
        (
            "singular_values",
            "singular_values.npy",
            r as u64,
            write_array(&out.join("singular_values.npy"), &sv)?,
        ),
    ];

    // The K_XX̃ pass: one more read of the chunks, rows projected onto the basis.
    let t = Instant::now();
    let kxx_path = out.join("kxx.npy");
    let mut kxx = NpyRowWriter::create(&kxx_path, n, r)?;
    // Streamed to its file like K_XX̃: nothing N-sized is held in memory.
    let sq_norms_path = out.join("sq_norms.npy");
    let mut sq_norms = NpyRowWriter::create_vector(&sq_norms_path, n)?;
    let pb = progress_bar(src.files.len() as u64, "K_XX̃");
    let mut row = 0usize;
    src.for_each_chunk(&mut |chunk| {
        let mut view = kxx.view_mut()?;
        let block = view.slice_mut(ndarray::s![row..row + chunk.len(), ..]);
        project_chunk(chunk, basis_t.view(), block);
        sq_norms
            .view_mut1()?
            .slice_mut(ndarray::s![row..row + chunk.len()])
            .assign(&ndarray::ArrayView1::from(&chunk.sq_norms[..]));
        row += chunk.len();
        pb.inc(1);
        Ok(())
    })?;
    pb.finish_and_clear();
    if row != n {
        bail!("read {row} rows of the train split, expected {n}");
    }
    memtrace::mark("svd K_XX̃ pass");
    arts.push(("kxx", "kxx.npy", n as u64, kxx.finish()?));
    arts.push(("sq_norms", "sq_norms.npy", n as u64, sq_norms.finish()?));
    let mut pass_seconds = svd.pass_seconds.clone();
    pass_seconds.push(t.elapsed().as_secs_f64());

    // A's initialisation from the rows of K_XX̃ (memory-mapped, not loaded).
    let map = NpyMap::open(&kxx_path)?;
    let km = kmeans::kmeans(
        map.view2::<f32>()?,
        &KMeansConfig {
            k: args.inducing,
            iters: args.kmeans_iters,
            seed: args.seed,
            init: args.init,
            max_rows: Some(args.kmeans_max_rows),
            ..KMeansConfig::default()
        },
    )?;
    memtrace::mark("svd k-means");
    arts.push((
        "a_init",
        "a_init.npy",
        args.inducing as u64,
        write_array(&out.join("a_init.npy"), &km.centroids)?,
    ));
    print_summary(
        dataset,
        args,
        &svd.singular_values,
        &pass_seconds,
        started.elapsed().as_secs_f64(),
        &km.objective,
    );
    Ok((arts, svd.singular_values, pass_seconds))
}

fn print_summary(
    d: &DatasetRow,
    args: &SvdArgs,
    sv: &[f64],
    passes: &[f64],
    total: f64,
    objective: &[f64],
) {
    let head: Vec<String> = sv.iter().take(5).map(|s| format!("{s:.4}")).collect();
    eprintln!(
        "svd of '{}': R = {}, p = {}, q = {}; σ_1..5 = {}; σ_R = {:.4}",
        d.name,
        args.rank,
        args.oversample,
        args.power_iters,
        head.join(", "),
        sv.last().copied().unwrap_or(0.0)
    );
    let passes: Vec<String> = passes.iter().map(|s| format!("{s:.2}")).collect();
    eprintln!(
        "seconds per pass (last = K_XX̃): {}; total {total:.2} s",
        passes.join(", ")
    );
    if let (Some(first), Some(last)) = (objective.first(), objective.last()) {
        eprintln!(
            "k-means (M = {}): objective {first:.4e} → {last:.4e} in {} iterations",
            args.inducing,
            objective.len() - 1
        );
    }
}

/// Projects every row of a split onto a basis, chunk by chunk: writes `out` (n×R f32 .npy)
/// with row i = x_i X̃ᵀ. `basis` is R×D as stored in `basis.npy`.
pub fn project_split(
    files: &[PathBuf],
    n_rows: usize,
    basis: ndarray::ArrayView2<'_, f32>,
    out: &Path,
) -> Result<WrittenFile> {
    let basis_t = basis.t().as_standard_layout().into_owned();
    let mut writer = NpyRowWriter::create(out, n_rows, basis.nrows())?;
    let mut row = 0usize;
    for path in files {
        let chunk = read_chunk(path)?;
        if row + chunk.len() > n_rows {
            bail!("{}: more rows than the {n_rows} expected", path.display());
        }
        let mut view = writer.view_mut()?;
        project_chunk(
            &chunk,
            basis_t.view(),
            view.slice_mut(ndarray::s![row..row + chunk.len(), ..]),
        );
        row += chunk.len();
    }
    if row != n_rows {
        bail!("projected {row} rows, expected {n_rows}");
    }
    writer.finish()
}
