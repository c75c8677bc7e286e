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

use anyhow::{bail, ensure, Context, Result};
use ndarray::{Array1, Array2};
use serde_json::json;

use crate::comm::{Comm, Single};
use crate::error::InvalidOptions;
use crate::memtrace::{self, available_memory_bytes};
use crate::progress::Progress;
use crate::sparse::project_chunk;
use crate::stage::{lookup, memoised_on, thread_pool, threads_or_all, Lookup, Outcome, Staged};
use crate::stop::StopToken;
use crate::store::catalog::{ArtifactKind, ArtifactRow, DatasetRow, RunRow, Split, StageKind};
use crate::store::chunks::WrittenFile;
use crate::store::npy::{write_array, NpyMap, NpyRowWriter};
use crate::store::space::{ensure_free, human_bytes};
use crate::store::workspace::Workspace;
use kmeans::{InitMethod, KMeansConfig};
use rsvd::{randomized_svd_on, ChunkFiles, RowSource, SvdConfig};
pub use rsvd::{MAX_OVERSAMPLE, MAX_POWER_ITERS};

/// R when `--rank` is not given, before [`SvdSizes::of`] holds it to min(N, D): the
/// paper's Delicious setting (R = 250 of D = 500). The basis costs 4·N·R bytes of K_XX̃ on
/// disk and 16·D·(R + oversample) bytes during the passes; at D ≤ 250 the clamp makes R = D,
/// a full orthonormal basis, which loses nothing (`docs/svd.md`, "Sizes from the data").
pub const DEFAULT_RANK: usize = 250;

/// M when `--inducing` is not given, before [`SvdSizes::of`] holds it to the rows k-means
/// sees: the paper's M; each GP's q(u) costs O(M³) a step with the full-Cholesky forms and
/// O(M²B) with the paper's.
pub const DEFAULT_INDUCING: usize = 500;

/// What `pipeline svd` computes.
#[derive(Debug, Clone, PartialEq)]
pub struct SvdOptions {
    /// Dataset (as named at ingest) whose training split is factorised.
    pub dataset: String,
    /// R: number of singular vectors kept (None: [`DEFAULT_RANK`] held to min(N, D)).
    pub rank: Option<usize>,
    /// p: extra random directions beyond R (accuracy of the last singular values).
    pub oversample: usize,
    /// q: power iterations (each is one more pass over the data).
    pub power_iters: usize,
    /// M: number of subspace inducing inputs initialised (rows of a_init.npy; None:
    /// [`DEFAULT_INDUCING`] held to the rows k-means sees).
    pub inducing: Option<usize>,
    /// How A is initialised.
    pub init: InitMethod,
    /// Lloyd iterations of the k-means initialisation.
    pub kmeans_iters: usize,
    /// Run k-means on a uniform sample of at most this many rows of K_XX̃.
    pub kmeans_max_rows: usize,
    pub seed: u64,
    /// Worker threads (None: all cores).
    pub threads: Option<usize>,
}

impl SvdOptions {
    /// The command line's defaults for `dataset`: R and M from the data.
    pub fn new(dataset: &str) -> Self {
        SvdOptions {
            dataset: dataset.to_string(),
            rank: None,
            oversample: 20,
            power_iters: 2,
            inducing: None,
            init: InitMethod::KmeansPlusPlus,
            kmeans_iters: 10,
            kmeans_max_rows: 200_000,
            seed: 0,
            threads: None,
        }
    }

    /// Checks the values no type rules out; `run` and `pipeline run`'s spec check call it.
    pub fn validate(&self) -> Result<(), InvalidOptions> {
        let mut c = InvalidOptions::new("");
        c.check(self.rank != Some(0), "rank", || "must be at least 1".into());
        c.check(self.inducing != Some(0), "inducing", || {
            "must be at least 1".into()
        });
        c.check(self.kmeans_max_rows >= 1, "kmeans-max-rows", || {
            "must be at least 1".into()
        });
        c.check(self.oversample <= MAX_OVERSAMPLE, "oversample", || {
            format!("must be at most {MAX_OVERSAMPLE}")
        });
        c.check(self.power_iters <= MAX_POWER_ITERS, "power-iters", || {
            format!("must be at most {MAX_POWER_ITERS} (each is a pass over the data)")
        });
        c.into_result()
    }
}

/// The R and M an svd run computes, decided from the options and the training split's N
/// rows and D features before anything is allocated for them; the run's parameters record
/// these, so a run whose sizes came from the data is the same run as one given them.
///
/// The basis is R orthonormal directions spanned by N rows of D features, so R ≤ min(N, D);
/// k-means places the M inducing inputs at centroids of the S rows it is given (N, or its
/// sample of `--kmeans-max-rows`), and S rows have at most S distinct centroids — more would
/// be copies, which make K_Z singular — so M ≤ S. A value left out is its default held to
/// that bound; a value given above it is refused, naming the bound (it asks for something
/// the data cannot give, and a silent change would make the run another one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvdSizes {
    /// R.
    pub rank: usize,
    /// M.
    pub inducing: usize,
    /// N, D and S as the sizes were decided from them (for the printed note).
    n_rows: u64,
    n_cols: u64,
    kmeans_rows: u64,
    /// Whether R and M were given.
    rank_given: bool,
    inducing_given: bool,
}

impl SvdSizes {
    /// The sizes of an svd of a training split of `n_rows` × `n_cols` (dataset `name`).
    pub fn of(opts: &SvdOptions, name: &str, n_rows: u64, n_cols: u64) -> Result<Self> {
        let (n, d) = (n_rows, n_cols);
        ensure!(
            n >= 1 && d >= 1,
            "the training split of '{name}' has N = {n} rows and D = {d} features: an svd \
             needs at least one of each"
        );
        let rank = match opts.rank {
            Some(rank) => {
                let r = rank as u64;
                ensure!(
                    r <= n.min(d),
                    "--rank {r} exceeds min(N, D) = min({n}, {d}) of the training split of \
                     '{name}': the basis is R orthonormal directions of the span of its N rows \
                     in D features, which has dimension at most min(N, D); give --rank ≤ {}, \
                     or leave --rank out (then R = min({DEFAULT_RANK}, N, D))",
                    n.min(d)
                );
                rank
            }
            None => (DEFAULT_RANK as u64).min(n).min(d) as usize,
        };
        let rows = n.min(opts.kmeans_max_rows as u64);
        let inducing = match opts.inducing {
            Some(m) => {
                ensure!(
                    m as u64 <= rows,
                    "--inducing {m}: the M inducing inputs are k-means centroids of {rows} rows \
                     (the N = {n} training rows of '{name}', at most --kmeans-max-rows {}), and \
                     {rows} rows have at most {rows} distinct centroids (copies would make K_Z \
                     singular); give --inducing ≤ {rows}, or leave --inducing out (then M = \
                     min({DEFAULT_INDUCING}, {rows}))",
                    opts.kmeans_max_rows
                );
                m
            }
            None => (DEFAULT_INDUCING as u64).min(rows) as usize,
        };
        Ok(SvdSizes {
            rank,
            inducing,
            n_rows: n,
            n_cols: d,
            kmeans_rows: rows,
            rank_given: opts.rank.is_some(),
            inducing_given: opts.inducing.is_some(),
        })
    }

    /// The sizes and where they came from, as the stage prints them:
    /// `R = 2 (--rank left out: min(250, N = 400, D = 2)), M = 400 (...)`.
    pub fn describe(&self) -> String {
        let (n, d, s) = (self.n_rows, self.n_cols, self.kmeans_rows);
        let rank = match self.rank_given {
            true => "--rank".to_string(),
            false => format!("--rank left out: min({DEFAULT_RANK}, N = {n}, D = {d})"),
        };
        let full = match self.rank as u64 == d {
            true => "; R = D: a full orthonormal basis of the input space",
            false => "",
        };
        let inducing = match (self.inducing_given, s < n) {
            (true, _) => "--inducing".to_string(),
            (false, false) => format!("--inducing left out: min({DEFAULT_INDUCING}, N = {n})"),
            (false, true) => format!(
                "--inducing left out: min({DEFAULT_INDUCING}, the {s} rows k-means samples)"
            ),
        };
        format!(
            "R = {} ({rank}{full}), M = {} ({inducing})",
            self.rank, self.inducing
        )
    }
}

/// What the svd stage holds in memory, in bytes, estimated before anything is allocated
/// (`docs/reliability.md`, "Memory estimate"). The two phases do not overlap: Q and B are
/// dropped before the basis is written and k-means runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvdMemory {
    /// The passes: Q and B, two D×k f64 matrices (k = R + oversample, at most D).
    pub passes: u64,
    /// A's initialisation: X̃ᵀ [D×R] f32 (kept until the stage ends), k-means++'s sample of
    /// rows (R f32 and a distance each) and three M×R f64 centroid arrays.
    pub kmeans: u64,
}

impl SvdMemory {
    pub fn of(opts: &SvdOptions, sizes: &SvdSizes, src: &ChunkFiles) -> Self {
        let (d, r, m) = (src.n_cols as u64, sizes.rank as u64, sizes.inducing as u64);
        let mul = |a: u64, b: u64| a.saturating_mul(b);
        let seed_rows = match opts.init {
            InitMethod::KmeansPlusPlus => src.n_rows.min(
                (kmeans::SEED_SAMPLE_MIN as u64)
                    .max(mul(kmeans::SEED_SAMPLE_PER_CLUSTER as u64, m)),
            ),
            InitMethod::RandomRows => 0,
        };
        SvdMemory {
            passes: Self::passes_bytes(d, r, opts.oversample as u64),
            kmeans: mul(4, mul(d, r))
                .saturating_add(mul(seed_rows, mul(4, r).saturating_add(8)))
                .saturating_add(mul(24, mul(m, r))),
        }
    }

    /// The passes' Q and B for `n_cols` features and rank `rank`: 16·D·k bytes with
    /// k = min(R + oversample, D). The stage's largest part whenever R is at least a few
    /// hundred (the k-means phase holds 4·D·R), so what bounds R by memory.
    pub fn passes_bytes(n_cols: u64, rank: u64, oversample: u64) -> u64 {
        let k = rank.saturating_add(oversample).min(n_cols);
        16u64.saturating_mul(n_cols).saturating_mul(k)
    }

    pub fn total(&self) -> u64 {
        self.passes.max(self.kmeans)
    }

    /// Refuses when the total exceeds `available` bytes (None: no figure, no refusal).
    pub fn check(&self, available: Option<u64>) -> Result<()> {
        let Some(available) = available else {
            return Ok(());
        };
        ensure!(
            self.total() <= available,
            "svd needs about {} (its passes hold Q and B, two D×k f64 matrices with k = --rank \
             + --oversample: {}; A's k-means initialisation {}), this machine has {} available \
             (MemAvailable); lower --rank or --oversample, or ingest fewer features (D)",
            human_bytes(self.total()),
            human_bytes(self.passes),
            human_bytes(self.kmeans),
            human_bytes(available)
        );
        Ok(())
    }
}

/// What an SVD run produced (or found already done).
#[derive(Debug, Clone)]
pub struct SvdOutput {
    /// Workspace-relative directory of the artifacts.
    pub dir: String,
    pub singular_values: Vec<f64>,
    /// Seconds of each pass over the data (empty when found done).
    pub pass_seconds: Vec<f64>,
}

fn train_chunk_files(ws: &Workspace, d: &DatasetRow) -> Result<ChunkFiles> {
    let chunks = ws.split_chunks(d, Split::Train)?;
    let n_rows = chunks.iter().map(|c| c.1).sum();
    let files = chunks.into_iter().map(|c| c.0).collect();
    Ok(ChunkFiles {
        files,
        n_rows,
        n_cols: d.n_features as usize,
    })
}

/// This rank's chunks of `all` (chunk i is rank i mod K's), with N still the whole split's.
fn rank_share(all: &ChunkFiles, comm: &dyn Comm) -> ChunkFiles {
    ChunkFiles {
        files: (all.files.iter().enumerate())
            .filter(|(i, _)| comm.owns_chunk(*i))
            .map(|(_, f)| f.clone())
            .collect(),
        n_rows: all.n_rows,
        n_cols: all.n_cols,
    }
}

/// Runs `pipeline svd` (memoised on the dataset's ingest and the options).
pub fn run(ws: &Workspace, opts: &SvdOptions) -> Result<Outcome<SvdOutput>> {
    Ok(run_on(ws, &Single, opts)?.of_one_process())
}

/// [`run`] over the ranks of `comm` (docs/scale-out.md): each rank reads its share of the
/// chunks, the passes sum over the ranks, rank 0 writes every file and the catalog and is
/// the one that returns the output (`None` on the others).
pub fn run_on(
    ws: &Workspace,
    comm: &dyn Comm,
    opts: &SvdOptions,
) -> Result<Outcome<Option<SvdOutput>>> {
    crate::alloc::for_streaming();
    opts.validate()?;
    let dataset = ws.dataset_named(&opts.dataset)?;
    let src = train_chunk_files(ws, &dataset)?;
    let sizes = SvdSizes::of(opts, &dataset.name, src.n_rows, src.n_cols as u64)?;
    if comm.is_root() {
        crate::progress::note(format!("svd of '{}': {}", dataset.name, sizes.describe()));
    }
    // The sizes as decided: a run whose R or M came from the data is the run given them.
    let params = json!({
        "dataset": dataset.name,
        "dataset_checksum": dataset.checksum,
        "rank": sizes.rank,
        "oversample": opts.oversample,
        "power_iters": opts.power_iters,
        "inducing": sizes.inducing,
        "init": format!("{:?}", opts.init),
        "kmeans_iters": opts.kmeans_iters,
        "kmeans_max_rows": opts.kmeans_max_rows,
        "seed": opts.seed,
    });
    let cached = |done: &RunRow| {
        let sv_file = ws
            .run_file(done.id, ArtifactKind::SingularValues)?
            .context("completed svd run without singular values")?;
        let sv = <Array1<f64> as ndarray_npy::ReadNpyExt>::read_npy(&sv_file.read()?[..])
            .with_context(|| format!("reading {}", sv_file.name()))?;
        crate::progress::note(format!(
            "svd of '{}' with these parameters is already done (run {}); nothing to do",
            dataset.name, done.id
        ));
        Ok(SvdOutput {
            dir: Path::new(&sv_file.rel)
                .parent()
                .unwrap_or(Path::new(""))
                .display()
                .to_string(),
            singular_values: sv.to_vec(),
            pass_seconds: Vec::new(),
        })
    };
    let pool = thread_pool(threads_or_all(opts.threads))?;
    let stop = ws.stop().clone();
    // Before the run is recorded; a finished run is reused whatever memory there is now.
    if !matches!(lookup(ws, StageKind::Svd, &params)?, Lookup::Done(_)) {
        SvdMemory::of(opts, &sizes, &src).check(available_memory_bytes()?)?;
    }
    memoised_on(
        ws,
        comm,
        StageKind::Svd,
        &params,
        Some(&pool),
        cached,
        |scratch| compute(&src, (comm, &stop), &dataset, (opts, &sizes), scratch),
        |published, computed: Computed| {
            let artifacts: Vec<ArtifactRow> = computed
                .artifacts
                .iter()
                .map(|(kind, file, rows, written)| ArtifactRow {
                    kind: *kind,
                    path: format!("{}/{file}", published.rel),
                    bytes: written.bytes,
                    rows: Some(*rows),
                    checksum: written.checksum.clone(),
                    split: Some(Split::Train),
                })
                .collect();
            ws.catalog
                .commit_artifacts(published.run_id, Some(dataset.id), &artifacts)?;
            Ok(SvdOutput {
                dir: published.rel.clone(),
                singular_values: computed.singular_values,
                pass_seconds: computed.pass_seconds,
            })
        },
    )
}

/// One file of an svd run: kind, file name, rows, what was written.
type LocalArtifact = (ArtifactKind, &'static str, u64, WrittenFile);

/// What [`compute`] leaves in the scratch directory, and the figures it measured.
struct Computed {
    artifacts: Vec<LocalArtifact>,
    singular_values: Vec<f64>,
    pass_seconds: Vec<f64>,
}

/// Computes every artifact into `tmp/svd/`.
/// Bytes of the stage's f32 outputs for N rows, D features and rank R: K_XX̃ [N×R], the
/// basis [R×D] and the squared norms [N] (the npy headers and the R singular values are
/// negligible).
fn output_bytes(n_rows: u64, n_cols: usize, rank: usize) -> u64 {
    let (d, r) = (n_cols as u64, rank as u64);
    4 * (n_rows * r + r * d + n_rows)
}

fn compute(
    all: &ChunkFiles,
    (comm, stop): (&dyn Comm, &StopToken),
    dataset: &DatasetRow,
    (args, sizes): (&SvdOptions, &SvdSizes),
    tmp: &Path,
) -> Result<Staged<Computed>> {
    let out = tmp.join("svd");
    let root = comm.is_root();
    if root {
        std::fs::create_dir_all(&out)?;
        // Refused before the passes over the data, not after them with a half-written K_XX̃.
        ensure_free(
            &out,
            output_bytes(all.n_rows, all.n_cols, sizes.rank),
            "writing kxx.npy, basis.npy and sq_norms.npy",
        )?;
    }
    let share;
    let src = if comm.size() > 1 {
        share = rank_share(all, comm);
        &share
    } else {
        all
    };
    let started = Instant::now();
    let cfg = SvdConfig {
        rank: sizes.rank,
        oversample: args.oversample,
        power_iters: args.power_iters,
        seed: args.seed,
    };
    // The root process reports the passes, so a job of K ranks shows them once.
    let passes = match comm.is_root() {
        true => Progress::start(
            "svd",
            "basis",
            Some((args.power_iters + 2) as u64),
            "passes",
            0,
        ),
        false => Progress::silent(),
    };
    // A stop request is honoured between passes (one process: ranks would have to agree).
    let stop_here = |at: &str| match comm.size() {
        1 => stop.check(|| {
            format!("{at}; an unfinished svd keeps nothing, the same command starts it again")
        }),
        _ => Ok(()),
    };
    let svd = randomized_svd_on(src, comm, &cfg, &mut |i, total| {
        stop_here(&format!("before basis pass {} of {total}", i + 1))?;
        passes.set(i as u64 + 1);
        Ok(())
    })?;
    drop(passes);
    memtrace::mark("svd basis computed");
    let (d, r) = (src.n_cols, sizes.rank);
    let basis_t = Array2::from_shape_fn((d, r), |(j, k)| svd.basis_t[(j, k)] as f32);
    let svd = rsvd::SvdResult {
        basis_t: faer::Mat::new(),
        ..svd
    };
    let mut arts: Vec<LocalArtifact> = Vec::new();
    if root {
        let basis = basis_t.t().as_standard_layout().into_owned();
        let basis_file = write_array(&out.join("basis.npy"), &basis)?;
        drop(basis);
        memtrace::mark("svd basis.npy written");
        let sv = Array1::from(svd.singular_values.clone());
        arts.push((ArtifactKind::Basis, "basis.npy", r as u64, basis_file));
        arts.push((
            ArtifactKind::SingularValues,
            "singular_values.npy",
            r as u64,
            write_array(&out.join("singular_values.npy"), &sv)?,
        ));
    }

    // The K_XX̃ pass: one more read of the chunks, rows projected onto the basis.
    stop_here("before the K_XX̃ pass")?;
    let t = Instant::now();
    if comm.size() > 1 {
        arts.extend(
            write_projection_ranks(all, comm, basis_t.view(), &out)?
                .into_iter()
                .flatten(),
        );
    } else {
        arts.extend(write_projection(src, basis_t.view(), &out)?);
    }
    let mut pass_seconds = svd.pass_seconds.clone();
    pass_seconds.push(t.elapsed().as_secs_f64());
    let computed = Computed {
        artifacts: arts,
        singular_values: svd.singular_values,
        pass_seconds,
    };
    // A's initialisation: k-means over the rows of the K_XX̃ rank 0 has written
    // (memory-mapped, not loaded; a sample of at most `kmeans_max_rows` rows), its Lloyd
    // passes shared by the ranks, which map rank 0's file on the shared workspace.
    stop_here("before k-means")?;
    let map = NpyMap::open(&shared_path(comm, &out.join("kxx.npy"))?)?;
    let km = kmeans::kmeans_on(
        map.view2::<f32>()?,
        comm,
        &KMeansConfig {
            k: sizes.inducing,
            iters: args.kmeans_iters,
            seed: args.seed,
            init: args.init,
            max_rows: Some(args.kmeans_max_rows),
            ..KMeansConfig::default()
        },
    )?;
    memtrace::mark("svd k-means");
    match km {
        Some(km) => finish_on_root(dataset, (args, sizes), &out, computed, started, km),
        // Rank 0 alone writes A and publishes: nothing more to do here.
        None => Ok(Staged {
            dir: "svd",
            name: String::new(),
            value: computed,
        }),
    }
}

/// Rank 0's `path` on every rank. Rank 0 calls this after the file is complete, so a rank
/// that opens it after this returns sees it whole (the workspace is shared by the ranks).
fn shared_path(comm: &dyn Comm, path: &Path) -> Result<PathBuf> {
    if comm.size() == 1 {
        return Ok(path.to_path_buf());
    }
    let text = path
        .to_str()
        .with_context(|| format!("{path:?} is not UTF-8"))?;
    let len = comm.broadcast_u64(text.len() as u64)? as usize;
    let mut bytes = if comm.is_root() {
        text.as_bytes().to_vec()
    } else {
        vec![0u8; len]
    };
    comm.broadcast_bytes(&mut bytes)?;
    Ok(PathBuf::from(String::from_utf8(bytes)?))
}

/// Rank 0's (or the one process's) end of [`compute`]: A's initialisation written, and
/// the summary.
fn finish_on_root(
    dataset: &DatasetRow,
    (args, sizes): (&SvdOptions, &SvdSizes),
    out: &Path,
    mut computed: Computed,
    started: Instant,
    km: kmeans::KMeansResult,
) -> Result<Staged<Computed>> {
    computed.artifacts.push((
        ArtifactKind::AInit,
        "a_init.npy",
        sizes.inducing as u64,
        write_array(&out.join("a_init.npy"), &km.centroids)?,
    ));
    print_summary(
        dataset,
        (args, sizes),
        &computed.singular_values,
        &computed.pass_seconds,
        started.elapsed().as_secs_f64(),
        &km.objective,
    );
    Ok(Staged {
        dir: "svd",
        name: format!("{}-r{}", dataset.name, sizes.rank),
        value: computed,
    })
}

/// The K_XX̃ pass: every training row projected onto the basis, streamed into `kxx.npy`
/// [N×R] and its squared norm into `sq_norms.npy` [N] in `out`; nothing N-sized is held in
/// memory. `basis_t` is X̃ᵀ [D×R].
fn write_projection(
    src: &ChunkFiles,
    basis_t: ndarray::ArrayView2<'_, f32>,
    out: &Path,
) -> Result<[LocalArtifact; 2]> {
    let (n, r) = (src.n_rows as usize, basis_t.ncols());
    let mut kxx = NpyRowWriter::create(&out.join("kxx.npy"), n, r)?;
    let mut sq_norms = NpyRowWriter::create_vector(&out.join("sq_norms.npy"), n)?;
    let chunks = Progress::start("svd", "K_XX̃", Some(src.files.len() as u64), "chunks", 0);
    let mut row = 0usize;
    src.for_each_chunk(&mut |chunk| {
        let mut view = kxx.view_mut()?;
        let block = view.slice_mut(ndarray::s![row..row + chunk.len(), ..]);
        project_chunk(chunk, basis_t, block);
        sq_norms
            .view_mut1()?
            .slice_mut(ndarray::s![row..row + chunk.len()])
            .assign(&ndarray::ArrayView1::from(&chunk.sq_norms[..]));
        row += chunk.len();
        chunks.advance(1);
        Ok(())
    })?;
    drop(chunks);
    if row != n {
        bail!("read {row} rows of the train split, expected {n}");
    }
    memtrace::mark("svd K_XX̃ pass");
    Ok([
        (ArtifactKind::Kxx, "kxx.npy", n as u64, kxx.finish()?),
        (
            ArtifactKind::SqNorms,
            "sq_norms.npy",
            n as u64,
            sq_norms.finish()?,
        ),
    ])
}

/// The K_XX̃ pass over the ranks of `comm` (K > 1): in round j every rank projects its
/// chunk j·K + rank (chunk i is rank i mod K's) and rank 0 gathers the K blocks, in rank
/// order, which is the chunks' order, and writes them into `kxx.npy` and `sq_norms.npy`
/// at their rows. Each row is projected alone, so a row's K_XX̃ is bitwise the one process
/// computes from the same basis. Rank 0 holds at most K chunks' blocks at a time; it
/// returns the two files, the other ranks `None`.
fn write_projection_ranks(
    all: &ChunkFiles,
    comm: &dyn Comm,
    basis_t: ndarray::ArrayView2<'_, f32>,
    out: &Path,
) -> Result<Option<[LocalArtifact; 2]>> {
    let (n, r, k) = (all.n_rows as usize, basis_t.ncols(), comm.size());
    let rounds = all.files.len().div_ceil(k);
    let mut writers = match comm.is_root() {
        true => Some((
            NpyRowWriter::create(&out.join("kxx.npy"), n, r)?,
            NpyRowWriter::create_vector(&out.join("sq_norms.npy"), n)?,
        )),
        false => None,
    };
    let mut row = 0usize;
    let mut gather_round = |part: &[u8]| -> Result<()> {
        let parts = comm.gather_bytes(part)?;
        if let Some((kxx, sq_norms)) = writers.as_mut() {
            for part in parts.iter().filter(|p| !p.is_empty()) {
                row += write_projected_block(part, r, row, kxx, sq_norms)?;
            }
        }
        Ok(())
    };
    let mut seen = 0usize;
    rank_share(all, comm).for_each_chunk(&mut |chunk| {
        let mut block = Array2::<f32>::zeros((chunk.len(), r));
        project_chunk(chunk, basis_t, block.view_mut());
        let mut part = Vec::with_capacity(4 * chunk.len() * (r + 1));
        part.extend(block.iter().flat_map(|v| v.to_le_bytes()));
        part.extend(chunk.sq_norms.iter().flat_map(|v| v.to_le_bytes()));
        seen += 1;
        gather_round(&part)
    })?;
    // A rank with fewer chunks than rounds takes part in the last ones with nothing.
    for _ in seen..rounds {
        gather_round(&[])?;
    }
    let Some((kxx, sq_norms)) = writers else {
        return Ok(None);
    };
    if row != n {
        bail!("gathered {row} rows of the train split from the ranks, expected {n}");
    }
    memtrace::mark("svd K_XX̃ pass");
    Ok(Some([
        (ArtifactKind::Kxx, "kxx.npy", n as u64, kxx.finish()?),
        (
            ArtifactKind::SqNorms,
            "sq_norms.npy",
            n as u64,
            sq_norms.finish()?,
        ),
    ]))
}

/// Writes one gathered block (rows × R f32 of K_XX̃, then the rows' squared norms, all
/// little-endian) at `row`; returns its number of rows.
fn write_projected_block(
    part: &[u8],
    r: usize,
    row: usize,
    kxx: &mut NpyRowWriter,
    sq_norms: &mut NpyRowWriter,
) -> Result<usize> {
    let values: Vec<f32> = part
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    let rows = values.len() / (r + 1);
    if part.len() % 4 != 0 || rows * (r + 1) != values.len() {
        bail!(
            "a rank sent a K_XX̃ block of {} bytes, not rows × (R + 1) f32",
            part.len()
        );
    }
    let (block, norms) = values.split_at(rows * r);
    if row + rows > kxx.view_mut()?.nrows() {
        bail!("the ranks sent more rows than the train split's");
    }
    let mut view = kxx.view_mut()?;
    view.slice_mut(ndarray::s![row..row + rows, ..])
        .assign(&ndarray::ArrayView2::from_shape((rows, r), block)?);
    sq_norms
        .view_mut1()?
        .slice_mut(ndarray::s![row..row + rows])
        .assign(&ndarray::ArrayView1::from(norms));
    Ok(rows)
}

fn print_summary(
    d: &DatasetRow,
    (args, sizes): (&SvdOptions, &SvdSizes),
    sv: &[f64],
    passes: &[f64],
    total: f64,
    objective: &[f64],
) {
    let head: Vec<String> = sv.iter().take(5).map(|s| format!("{s:.4}")).collect();
    crate::progress::note(format!(
        "svd of '{}': R = {}, p = {}, q = {}; σ_1..5 = {}; σ_R = {:.4}",
        d.name,
        sizes.rank,
        args.oversample,
        args.power_iters,
        head.join(", "),
        sv.last().copied().unwrap_or(0.0)
    ));
    let passes: Vec<String> = passes.iter().map(|s| format!("{s:.3}")).collect();
    crate::progress::note(format!(
        "seconds per pass (last = K_XX̃): {}; total {total:.2} s",
        passes.join(", ")
    ));
    if let (Some(first), Some(last)) = (objective.first(), objective.last()) {
        crate::progress::note(format!(
            "k-means (M = {}): objective {first:.4e} → {last:.4e} in {} iterations",
            sizes.inducing,
            objective.len() - 1
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(n_rows: u64, n_cols: usize) -> ChunkFiles {
        ChunkFiles {
            files: Vec::new(),
            n_rows,
            n_cols,
        }
    }

    #[test]
    fn a_huge_d_is_refused_before_the_sketch_is_allocated() {
        // D = 4·10⁹ from a LIBSVM file, R = 2, p = 20: the Gaussian sketch alone was the
        // 704 GB allocation that panicked; Q and B together are twice that.
        let opts = SvdOptions {
            rank: Some(2),
            inducing: Some(500),
            ..SvdOptions::new("big")
        };
        let src = split(1000, 4_000_000_000);
        let sizes = SvdSizes::of(&opts, "big", src.n_rows, src.n_cols as u64).unwrap();
        let need = SvdMemory::of(&opts, &sizes, &src);
        assert_eq!(need.passes, 16 * 4_000_000_000 * 22);
        assert!(need.total() >= need.passes);
        let err = need.check(Some(24 << 30)).unwrap_err().to_string();
        assert!(err.starts_with("svd needs about 1.3 TiB"), "{err}");
        assert!(err.contains("this machine has 24.0 GiB available"), "{err}");
        need.check(None).unwrap();
    }

    #[test]
    fn rank_and_inducing_given_are_held_to_the_data() {
        let sizes = |opts: &SvdOptions| SvdSizes::of(opts, "toy", 900, 60);
        let mut opts = SvdOptions {
            rank: Some(60),
            inducing: Some(900),
            ..SvdOptions::new("toy")
        };
        let ok = sizes(&opts).unwrap();
        assert_eq!((ok.rank, ok.inducing), (60, 900));
        opts.rank = Some(61);
        let err = sizes(&opts).unwrap_err().to_string();
        assert!(err.contains("give --rank ≤ 60"), "{err}");
        assert!(
            err.contains("leave --rank out (then R = min(250, N, D))"),
            "{err}"
        );
        opts.rank = Some(8);
        opts.inducing = Some(901);
        let err = sizes(&opts).unwrap_err().to_string();
        assert!(err.contains("give --inducing ≤ 900"), "{err}");
        opts.inducing = Some(200);
        opts.kmeans_max_rows = 100;
        let err = sizes(&opts).unwrap_err().to_string();
        assert!(err.contains("give --inducing ≤ 100"), "{err}");
        assert!(err.contains("(then M = min(500, 100))"), "{err}");
    }

    #[test]
    fn rank_and_inducing_left_out_are_their_defaults_held_to_the_data() {
        let of = |n: u64, d: u64, max_rows: usize| {
            let opts = SvdOptions {
                kmeans_max_rows: max_rows,
                ..SvdOptions::new("d")
            };
            let s = SvdSizes::of(&opts, "d", n, d).unwrap();
            (s.rank, s.inducing, s.describe())
        };
        // Delicious: N = 12 920, D = 500: neither bound binds.
        let (r, m, note) = of(12_920, 500, 200_000);
        assert_eq!((r, m), (DEFAULT_RANK, DEFAULT_INDUCING));
        assert_eq!(
            note,
            "R = 250 (--rank left out: min(250, N = 12920, D = 500)), \
             M = 500 (--inducing left out: min(500, N = 12920))"
        );
        // Banana: D = 2 and N = 400 below both defaults.
        let (r, m, note) = of(400, 2, 200_000);
        assert_eq!((r, m), (2, 400));
        assert!(note.contains("R = D: a full orthonormal basis"), "{note}");
        // Fewer rows than features: R = N; k-means's sample bounds M.
        assert_eq!(of(40, 1000, 200_000).0, 40);
        let (_, m, note) = of(900, 60, 300);
        assert_eq!(m, 300);
        assert!(
            note.contains("min(500, the 300 rows k-means samples)"),
            "{note}"
        );
        let empty = SvdSizes::of(&SvdOptions::new("e"), "e", 0, 5).unwrap_err();
        assert!(empty.to_string().contains("N = 0 rows"), "{empty}");
    }
}
