//! Training checkpoints: one zstd Parquet file holding every parameter tensor, Adam's state,
//! the position in the data stream and the run configuration (`docs/formats.md`,
//! "Checkpoints").
//!
//! The container is `tensors`' (shared with exported model files): one row per tensor.
//!
//! | column | type      | meaning                                           |
//! |--------|-----------|---------------------------------------------------|
//! | name   | utf8      | `A`, `mu`, `rho`, `phi`, `bias`, `kernel`, `adam_m`, `adam_v`; then `chol` or `chol_whitened` for the full-Cholesky q(u) forms, `ard` with subspace ARD, `ard_features` with feature ARD, `amortiser_w1`, `_c1`, `_w2`, `_c2`, `_w3`, `_c3` with an augment-and-reduce likelihood, `logit_epsilon` with `--learn-epsilon` |
//! | rows   | u64       | first dimension                                   |
//! | cols   | u64       | second dimension                                  |
//! | values | list<f64> | the entries in row-major (C) order                |
//!
//! Key-value metadata carries the counters (`fsgp.step`, `fsgp.epoch`, …) and the
//! configuration as JSON. The bytes depend only on their content, never on time or run id,
//! so two runs with the same seed write bitwise-identical checkpoints.

use std::fs::File;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use parquet::file::reader::ChunkReader;

use super::chunks::WrittenFile;
use super::integrity::Registered;
use super::tensors::{write_tensors, Tensor, TensorFile, Tensors};
use crate::model::kernel::KernelParams;
use crate::model::likelihood::multiclass::amortiser::Amortiser;
use crate::model::optim::AdamState;
use crate::model::params::{packed_len, CholFactors, Params, QParams};

/// Value of `fsgp.format` in every checkpoint.
pub const CHECKPOINT_FORMAT: &str = "fsgp-checkpoint/1";

/// Where the trainer stands in its data stream and its running epoch figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainState {
    /// Optimiser steps taken.
    pub step: u64,
    /// Epoch the next minibatch belongs to (0-based).
    pub epoch: u64,
    /// Minibatches of that epoch already consumed.
    pub batch_in_epoch: u64,
    /// Σ of the minibatch bounds of the current epoch so far (for its mean at epoch end).
    pub epoch_elbo_sum: f64,
    /// Early stopping's state once the run has evaluated the validation split (None before
    /// the first evaluation, and for runs without `--early-stopping`).
    pub early: Option<EarlyState>,
}

/// Where early stopping stands: the best validation score so far, its step, and how many
/// evaluations since have not improved on it. Written with every checkpoint, so a resumed
/// run stops where an uninterrupted one does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EarlyState {
    pub best_value: f64,
    pub best_step: u64,
    pub since_best: u64,
}

/// Everything a run needs to continue bit for bit.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub params: Params,
    pub adam: AdamState,
    pub state: TrainState,
    /// The run's configuration (canonical JSON, no run-specific values).
    pub config: serde_json::Value,
}

/// What a checkpoint holds, borrowed from whoever has it: the trainer writes its live
/// parameters and optimiser state through this, without first copying them (at D·P in
/// the tens of millions each copy is hundreds of MB of fresh pages).
#[derive(Debug, Clone, Copy)]
pub struct CheckpointRef<'a> {
    pub params: &'a Params,
    pub adam: &'a AdamState,
    pub state: &'a TrainState,
    /// The run's configuration (canonical JSON, no run-specific values).
    pub config: &'a serde_json::Value,
}

impl<'a> From<&'a Checkpoint> for CheckpointRef<'a> {
    fn from(c: &'a Checkpoint) -> Self {
        CheckpointRef {
            params: &c.params,
            adam: &c.adam,
            state: &c.state,
            config: &c.config,
        }
    }
}

/// The model's tensors in the order a checkpoint stores them: `A`, `mu`, `rho`, `phi`,
/// `bias`, `kernel`, then the optional ones (`chol`/`chol_whitened`, `ard`,
/// `ard_features`, `amortiser_*`, `logit_epsilon`), each only when the model has it. A
/// checkpoint puts Adam's moments between `kernel` and the optional ones
/// ([`FIRST_OPTIONAL`]); a model file (`model_file`) stores these alone.
pub fn param_tensors(p: &Params) -> Vec<Tensor<'_>> {
    // [log σ_f², log ℓ], and log σ_lin² third for SE + linear.
    let mut kernel = vec![p.kernel.log_sf2, p.kernel.log_ell];
    kernel.extend(p.kernel.log_lin2);
    // ρ is written empty (0×0) for the full-Cholesky forms.
    let no_rho = faer::Mat::new();
    let mut all = vec![
        Tensor::matrix("A", &p.a),
        Tensor::matrix("mu", p.q.mu()),
        Tensor::matrix("rho", p.q.rho().unwrap_or(&no_rho)),
        Tensor::matrix("phi", &p.phi),
        Tensor::vector("bias", &p.bias),
        Tensor::owned("kernel", 1, kernel.len(), kernel),
    ];
    // Only the full-Cholesky forms have (and write) the packed factors.
    if let Some(chol) = p.q.chol() {
        all.push(Tensor::matrix(chol_tensor(chol.whitened), &chol.packed));
    }
    // Subspace ARD's log ω [1×R], written only when the model has it.
    if !p.kernel.log_ard.is_empty() {
        all.push(Tensor::vector("ard", &p.kernel.log_ard));
    }
    // ARD over the features: log w [1×D], written only when the model has it.
    if !p.kernel.log_features.is_empty() {
        all.push(Tensor::vector("ard_features", &p.kernel.log_features));
    }
    // The augment-and-reduce likelihoods' amortisation network, only when the model has it.
    if let Some(net) = &p.amortiser {
        all.extend([
            Tensor::matrix("amortiser_w1", &net.w1),
            Tensor::vector("amortiser_c1", &net.c1),
            Tensor::matrix("amortiser_w2", &net.w2),
            Tensor::vector("amortiser_c2", &net.c2),
            Tensor::matrix("amortiser_w3", &net.w3),
            Tensor::vector("amortiser_c3", &net.c3),
        ]);
    }
    // Robust-max's learnt logit ε [1×1], written only when the model learns it.
    if let Some(theta) = p.logit_epsilon {
        all.push(Tensor::owned("logit_epsilon", 1, 1, vec![theta]));
    }
    all
}

/// Where a checkpoint inserts `adam_m` and `adam_v` among [`param_tensors`]: after the six
/// tensors every model has, so checkpoints keep the order (and bytes) they always had.
const FIRST_OPTIONAL: usize = 6;

fn tensors<'a>(c: impl Into<CheckpointRef<'a>>) -> Vec<Tensor<'a>> {
    let c = c.into();
    let mut all = param_tensors(c.params);
    let adam = [
        Tensor::vector("adam_m", &c.adam.m),
        Tensor::vector("adam_v", &c.adam.v),
    ];
    all.splice(FIRST_OPTIONAL..FIRST_OPTIONAL, adam);
    all
}

/// The amortisation network if the file holds its tensors (all six or none).
fn read_amortiser(found: &Tensors) -> Result<Option<Amortiser>> {
    if !found.found.iter().any(|t| t.name.starts_with("amortiser_")) {
        return Ok(None);
    }
    let net = Amortiser {
        w1: found.mat("amortiser_w1")?,
        c1: found.vector("amortiser_c1")?,
        w2: found.mat("amortiser_w2")?,
        c2: found.vector("amortiser_c2")?,
        w3: found.mat("amortiser_w3")?,
        c3: found.vector("amortiser_c3")?,
    };
    ensure!(
        net.shapes_agree(),
        "{}: the amortiser tensors' shapes do not chain (W₁ {}×{}, W₂ {}×{}, W₃ {}×{})",
        found.path.display(),
        net.w1.nrows(),
        net.w1.ncols(),
        net.w2.nrows(),
        net.w2.ncols(),
        net.w3.nrows(),
        net.w3.ncols()
    );
    Ok(Some(net))
}

/// The tensor holding the packed Cholesky factors [M(M+1)/2 × P]: its name says the form.
fn chol_tensor(whitened: bool) -> &'static str {
    if whitened {
        "chol_whitened"
    } else {
        "chol"
    }
}

fn metadata<'a>(c: impl Into<CheckpointRef<'a>>) -> Vec<(String, String)> {
    let c = c.into();
    let s = c.state;
    // `{:?}` prints the shortest decimal that parses back to the same f64.
    [
        ("fsgp.format", CHECKPOINT_FORMAT.to_string()),
        ("fsgp.step", s.step.to_string()),
        ("fsgp.epoch", s.epoch.to_string()),
        ("fsgp.batch_in_epoch", s.batch_in_epoch.to_string()),
        ("fsgp.epoch_elbo_sum", format!("{:?}", s.epoch_elbo_sum)),
        ("fsgp.adam_t", c.adam.t.to_string()),
        ("fsgp.config", c.config.to_string()),
    ]
    .into_iter()
    .chain(s.early.iter().flat_map(|e| {
        [
            ("fsgp.best_value", format!("{:?}", e.best_value)),
            ("fsgp.best_step", e.best_step.to_string()),
            ("fsgp.evaluations_since_best", e.since_best.to_string()),
        ]
    }))
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Early stopping's state if the metadata holds it (all three keys, or none).
fn read_early(meta: &[(String, String)], path: &Path) -> Result<Option<EarlyState>> {
    if !meta.iter().any(|(k, _)| k == "fsgp.best_step") {
        return Ok(None);
    }
    Ok(Some(EarlyState {
        best_value: parse_kv(meta, "fsgp.best_value", path)?,
        best_step: parse_kv(meta, "fsgp.best_step", path)?,
        since_best: parse_kv(meta, "fsgp.evaluations_since_best", path)?,
    }))
}

/// Writes a checkpoint to `path` (fsynced) and returns its size and checksum. Callers write
/// to a temporary name and rename.
pub fn write_checkpoint<'a>(path: &Path, c: impl Into<CheckpointRef<'a>>) -> Result<WrittenFile> {
    let c = c.into();
    write_tensors(path, &tensors(c), &metadata(c))
}

/// The packed Cholesky factors if the file holds `chol` or `chol_whitened` (not both).
fn read_chol(found: &Tensors) -> Result<Option<CholFactors>> {
    match (found.has(chol_tensor(false)), found.has(chol_tensor(true))) {
        (false, false) => Ok(None),
        (true, true) => bail!(
            "{}: {} holds both chol and chol_whitened",
            found.path.display(),
            found.what
        ),
        (_, whitened) => Ok(Some(CholFactors {
            whitened,
            packed: found.mat(chol_tensor(whitened))?,
        })),
    }
}

fn kv<'a>(meta: &'a [(String, String)], key: &str, path: &Path) -> Result<&'a str> {
    meta.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .with_context(|| format!("{}: checkpoint metadata lacks {key}", path.display()))
}

fn parse_kv<T: std::str::FromStr>(meta: &[(String, String)], key: &str, path: &Path) -> Result<T> {
    let v = kv(meta, key, path)?;
    v.parse()
        .ok()
        .with_context(|| format!("{}: bad value {v:?} for {key}", path.display()))
}

/// Reads a checkpoint written by [`write_checkpoint`], checking every shape (an
/// unregistered file: tests, tools).
pub fn read_checkpoint(path: &Path) -> Result<Checkpoint> {
    let file =
        File::open(path).with_context(|| format!("opening checkpoint {}", path.display()))?;
    decode_checkpoint(file, path)
}

/// Reads a registered checkpoint: the whole file, checked against the catalog, decoded.
pub fn read_registered_checkpoint(file: &Registered) -> Result<Checkpoint> {
    decode_checkpoint(bytes::Bytes::from(file.read()?), file.path())
}

/// What prediction, export and reports read of a checkpoint: the model, without Adam's
/// moments (twice the parameters' size) or the loop's state.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointModel {
    pub params: Params,
    /// The run's configuration (canonical JSON, no run-specific values).
    pub config: serde_json::Value,
}

/// The optimiser's tensors, which [`read_registered_model`] passes over.
const OPTIMISER_TENSORS: [&str; 2] = ["adam_m", "adam_v"];

/// Reads the model of a registered checkpoint (the whole file, checked against the
/// catalog): its parameters and configuration; Adam's pages are not decoded. At
/// D·P = 28 million weights that is a third of the values.
pub fn read_registered_model(file: &Registered) -> Result<CheckpointModel> {
    let path = file.path();
    let file = checkpoint_file(bytes::Bytes::from(file.read()?), path)?;
    let config = checkpoint_config(&file.meta, path)?;
    let found = file.tensors_except(path, "checkpoint", &OPTIMISER_TENSORS)?;
    let params = read_params(&found, &config)?;
    Ok(CheckpointModel { params, config })
}

/// The footer of a checkpoint of this build's format.
fn checkpoint_file<R: ChunkReader + 'static>(reader: R, path: &Path) -> Result<TensorFile<R>> {
    let file = TensorFile::open(reader, path)?;
    let format = kv(&file.meta, "fsgp.format", path)?;
    ensure!(
        format == CHECKPOINT_FORMAT,
        "{}: format {format:?}, expected {CHECKPOINT_FORMAT:?}",
        path.display()
    );
    Ok(file)
}

/// The run's configuration a checkpoint embeds.
fn checkpoint_config(meta: &[(String, String)], path: &Path) -> Result<serde_json::Value> {
    serde_json::from_str(kv(meta, "fsgp.config", path)?)
        .with_context(|| format!("{}: fsgp.config is not JSON", path.display()))
}

fn decode_checkpoint<R: ChunkReader + 'static>(reader: R, path: &Path) -> Result<Checkpoint> {
    let file = checkpoint_file(reader, path)?;
    let meta = file.meta.clone();
    let mut found = file.tensors(path, "checkpoint")?;
    let config = checkpoint_config(&meta, path)?;
    let params = read_params(&found, &config)?;
    let adam = AdamState {
        m: found.take_vector("adam_m")?,
        v: found.take_vector("adam_v")?,
        t: parse_kv(&meta, "fsgp.adam_t", path)?,
    };
    let n = crate::model::params::flat_len(&params);
    ensure!(
        adam.m.len() == n && adam.v.len() == n,
        "{}: Adam state length differs from the parameters ({n})",
        path.display()
    );
    Ok(Checkpoint {
        params,
        adam,
        state: TrainState {
            step: parse_kv(&meta, "fsgp.step", path)?,
            epoch: parse_kv(&meta, "fsgp.epoch", path)?,
            batch_in_epoch: parse_kv(&meta, "fsgp.batch_in_epoch", path)?,
            epoch_elbo_sum: parse_kv(&meta, "fsgp.epoch_elbo_sum", path)?,
            early: read_early(&meta, path)?,
        },
        config,
    })
}

/// The model's parameters from the tensors [`param_tensors`] wrote, every shape checked
/// and the optional tensors checked against `config` (the run's `TrainConfig` as JSON).
pub fn read_params(found: &Tensors, config: &serde_json::Value) -> Result<Params> {
    let path = found.path;
    let kernel = found.vector("kernel")?;
    ensure!(
        kernel.len() == 2 || kernel.len() == 3,
        "{}: kernel tensor must hold 2 values (3 for SE + linear), not {}",
        path.display(),
        kernel.len()
    );
    let optional = |name: &str| -> Result<Vec<f64>> {
        match found.has(name) {
            true => found.vector(name),
            false => Ok(Vec::new()),
        }
    };
    let log_ard = optional("ard")?;
    let log_features = optional("ard_features")?;
    let logit_epsilon = match found.has("logit_epsilon") {
        true => {
            let v = found.vector("logit_epsilon")?;
            ensure!(
                v.len() == 1,
                "{}: logit_epsilon tensor must hold 1 value, not {}",
                path.display(),
                v.len()
            );
            Some(v[0])
        }
        false => None,
    };
    let a = found.mat("A")?;
    let mu = found.mat("mu")?;
    let rho = found.mat("rho")?;
    let phi = found.mat("phi")?;
    let bias = found.vector("bias")?;
    let kernel = KernelParams {
        log_lin2: kernel.get(2).copied(),
        log_ard,
        log_features,
        ..KernelParams::new(kernel[0], kernel[1])
    };
    let chol = read_chol(found)?;
    let amortiser = read_amortiser(found)?;
    let (m, p) = (mu.nrows(), mu.ncols());
    // The paper's form: ρ [M×P], no factors; the full-Cholesky forms: factors, ρ empty.
    let (q_ok, q) = match chol {
        None => (
            rho.nrows() == m && rho.ncols() == p,
            QParams::Sites { mu, rho },
        ),
        Some(chol) => (
            rho.nrows() * rho.ncols() == 0
                && chol.packed.nrows() == packed_len(m)
                && chol.packed.ncols() == p,
            QParams::Full { mu, chol },
        ),
    };
    let params = Params {
        logit_epsilon,
        a,
        q,
        phi,
        bias,
        kernel,
        amortiser,
    };
    // Inducing features at the axes (`model/qu/axes.rs`): A is [0×D] for μ of D rows.
    let axes = config.get("inducing_inputs").and_then(|v| v.as_str()) == Some("axes");
    let a_ok = match axes {
        true => params.a.nrows() == 0 && params.a.ncols() == m,
        false => params.a.nrows() == m,
    };
    ensure!(
        a_ok && q_ok
            && params.phi.ncols() == p
            && params.bias.len() == params.phi.nrows()
            && (params.kernel.log_ard.is_empty()
                || params.kernel.log_ard.len() == params.a.ncols()),
        "{}: parameter shapes disagree",
        path.display()
    );
    check_kernel_tensors(&params, config, path)?;
    Ok(params)
}

/// The optional kernel tensors agree with the embedded configuration: a 1×3 `kernel` for
/// `"kernel": "se+linear"` only, an `ard` tensor for `"ard": "subspace"` only.
fn check_kernel_tensors(params: &Params, config: &serde_json::Value, path: &Path) -> Result<()> {
    let field = |key: &str| config.get(key).and_then(|v| v.as_str()).unwrap_or("");
    let k = &params.kernel;
    ensure!(
        k.log_lin2.is_some() == (field("kernel") == "se+linear"),
        "{}: the kernel tensor holds {} values but the configuration's kernel is {:?}",
        path.display(),
        2 + usize::from(k.log_lin2.is_some()),
        field("kernel")
    );
    ensure!(
        k.log_ard.is_empty() != (field("ard") == "subspace"),
        "{}: {} ARD weights but the configuration's ard is {:?}",
        path.display(),
        k.log_ard.len(),
        field("ard")
    );
    ensure!(
        k.log_features.is_empty() != (field("ard") == "features"),
        "{}: {} feature ARD weights but the configuration's ard is {:?}",
        path.display(),
        k.log_features.len(),
        field("ard")
    );
    let learns = config.get("learn_epsilon").and_then(|v| v.as_bool()) == Some(true);
    ensure!(
        params.logit_epsilon.is_some() == learns,
        "{}: {} a logit_epsilon tensor but the configuration's learn_epsilon is {learns}",
        path.display(),
        if params.logit_epsilon.is_some() {
            "has"
        } else {
            "lacks"
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use faer::Mat;

    fn sample() -> Checkpoint {
        let f = |r: usize, c: usize, s: f64| {
            Mat::from_fn(r, c, |i, j| s * (i as f64 - j as f64 * 0.37).sin())
        };
        let params = Params {
            logit_epsilon: None,
            a: f(4, 3, 1.0),
            q: QParams::Sites {
                mu: f(4, 2, 1e-3),
                rho: f(4, 2, -2.0),
            },
            phi: f(5, 2, 0.7),
            bias: vec![-1.0, f64::MIN_POSITIVE, 3.5, -0.0, 1e300],
            kernel: KernelParams::new(0.1, -1.0 / 3.0),
            amortiser: None,
        };
        let mut adam = AdamState::new(&params);
        for (i, x) in adam.m.iter_mut().enumerate() {
            *x = (i as f64).sqrt() / 7.0;
        }
        adam.t = 17;
        Checkpoint {
            params,
            adam,
            state: TrainState {
                step: 17,
                epoch: 2,
                batch_in_epoch: 3,
                epoch_elbo_sum: -12345.678901234567,
                early: None,
            },
            config: serde_json::json!({"kernel": "linear", "seed": 5}),
        }
    }

    #[test]
    fn checkpoint_round_trips_bit_for_bit_and_deterministically() {
        let dir = tempfile::tempdir().unwrap();
        let (p1, p2) = (dir.path().join("a.parquet"), dir.path().join("b.parquet"));
        let c = sample();
        let w1 = write_checkpoint(&p1, &c).unwrap();
        let w2 = write_checkpoint(&p2, &c).unwrap();
        assert_eq!(w1, w2, "same content must give the same bytes");
        let back = read_checkpoint(&p1).unwrap();
        let bits = |p: &Params| {
            let mut q = p.clone();
            let n = crate::model::params::flat_len(p);
            (0..n)
                .map(|i| crate::model::params::flat_entry(&mut q, i).1.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&back.params), bits(&c.params));
        assert_eq!(back.adam, c.adam);
        assert_eq!(
            back.state.epoch_elbo_sum.to_bits(),
            c.state.epoch_elbo_sum.to_bits()
        );
        assert_eq!(back, c);
    }

    #[test]
    fn early_stopping_state_round_trips_and_stays_out_of_other_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let key = |c: &Checkpoint| metadata(c).iter().any(|kv| kv.0.starts_with("fsgp.best"));
        assert!(
            !key(&sample()),
            "a run without early stopping writes no keys of it"
        );
        let mut c = sample();
        c.state.early = Some(EarlyState {
            best_value: 0.1 + 0.2,
            best_step: 12,
            since_best: 3,
        });
        assert!(key(&c));
        let path = dir.path().join("early.parquet");
        write_checkpoint(&path, &c).unwrap();
        let back = read_checkpoint(&path).unwrap();
        assert_eq!(back.state, c.state);
        assert_eq!(
            back.state.early.unwrap().best_value.to_bits(),
            (0.1f64 + 0.2).to_bits()
        );
    }

    #[test]
    fn full_cholesky_checkpoints_round_trip_with_their_form() {
        let dir = tempfile::tempdir().unwrap();
        for whitened in [false, true] {
            let mut c = sample();
            let (m, p) = (c.params.q.mu().nrows(), c.params.q.mu().ncols());
            c.params.set_full(CholFactors {
                whitened,
                packed: Mat::from_fn(packed_len(m), p, |i, j| (i as f64 * 0.3 - j as f64).cos()),
            });
            c.adam = AdamState::new(&c.params);
            c.adam.v[3] = 0.25;
            let path = dir.path().join(format!("w{whitened}.parquet"));
            write_checkpoint(&path, &c).unwrap();
            let back = read_checkpoint(&path).unwrap();
            assert_eq!(back, c);
            assert_eq!(back.params.q_form(), c.params.q_form());
            // A factor of the wrong shape is refused.
            let QParams::Full { chol, .. } = &mut c.params.q else {
                unreachable!("made full above")
            };
            chol.packed = Mat::zeros(packed_len(m) - 1, p);
            c.adam = AdamState::new(&c.params);
            write_checkpoint(&path, &c).unwrap();
            let err = read_checkpoint(&path).unwrap_err().to_string();
            assert!(err.contains("shapes disagree"), "{err}");
        }
    }

    #[test]
    fn axes_checkpoints_round_trip_and_refuse_an_a_of_another_shape() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = sample();
        let d = c.params.q.mu().nrows();
        c.params.a = Mat::zeros(0, d);
        c.adam = AdamState::new(&c.params);
        c.config["inducing_inputs"] = "axes".into();
        let path = dir.path().join("axes.parquet");
        write_checkpoint(&path, &c).unwrap();
        assert_eq!(read_checkpoint(&path).unwrap(), c);
        // An A with rows under an axes configuration, and none under another one.
        let mut rows = c.clone();
        rows.params.a = Mat::zeros(d, d);
        rows.adam = AdamState::new(&rows.params);
        let mut other = c.clone();
        other.config["inducing_inputs"] = "free".into();
        for bad in [rows, other] {
            write_checkpoint(&path, &bad).unwrap();
            let err = read_checkpoint(&path).unwrap_err().to_string();
            assert!(err.contains("shapes disagree"), "{err}");
        }
    }

    #[test]
    fn rejects_foreign_and_damaged_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.parquet");
        write_checkpoint(&path, &sample()).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes.truncate(n - 9);
        std::fs::write(&path, &bytes).unwrap();
        assert!(read_checkpoint(&path).is_err());
    }

    #[test]
    fn se_plus_linear_and_ard_round_trip_and_stay_out_of_other_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let plain = sample();
        assert!(tensors(&plain).iter().all(|t| t.name != "ard"));
        assert_eq!(tensors(&plain)[5].cols, 2);
        let mut c = sample();
        c.config = serde_json::json!({"kernel": "se+linear", "ard": "subspace", "seed": 5});
        c.params.kernel.log_lin2 = Some(-0.7);
        c.params.kernel.log_ard = vec![0.25, -1.5, 3.0];
        c.adam = AdamState::new(&c.params);
        c.adam.v[0] = 0.5;
        let t = tensors(&c);
        assert_eq!(t[5].cols, 3);
        assert_eq!(t.last().unwrap().name, "ard");
        let path = dir.path().join("k.parquet");
        write_checkpoint(&path, &c).unwrap();
        assert_eq!(read_checkpoint(&path).unwrap(), c);
        // Tensors that disagree with the configuration are refused, naming both.
        c.config = serde_json::json!({"kernel": "se", "ard": "subspace"});
        write_checkpoint(&path, &c).unwrap();
        let e = format!("{:#}", read_checkpoint(&path).unwrap_err());
        assert!(e.contains("holds 3 values") && e.contains("\"se\""), "{e}");
        c.config = serde_json::json!({"kernel": "se+linear"});
        write_checkpoint(&path, &c).unwrap();
        let e = format!("{:#}", read_checkpoint(&path).unwrap_err());
        assert!(e.contains("3 ARD weights"), "{e}");
    }

    #[test]
    fn feature_ard_weights_round_trip_as_their_own_tensor() {
        let dir = tempfile::tempdir().unwrap();
        assert!(tensors(&sample()).iter().all(|t| t.name != "ard_features"));
        let mut c = sample();
        c.config = serde_json::json!({"kernel": "linear", "ard": "features", "seed": 5});
        c.params.kernel.log_features = vec![0.5, -0.25, 0.0, 1.75];
        c.adam = AdamState::new(&c.params);
        *c.adam.m.last_mut().unwrap() = 0.125;
        let t = tensors(&c);
        let last = t.last().unwrap();
        assert_eq!(
            (last.name.as_str(), last.rows, last.cols),
            ("ard_features", 1, 4)
        );
        let path = dir.path().join("f.parquet");
        write_checkpoint(&path, &c).unwrap();
        assert_eq!(read_checkpoint(&path).unwrap(), c);
        // Weights without `"ard": "features"` in the configuration are refused.
        c.config = serde_json::json!({"kernel": "linear"});
        write_checkpoint(&path, &c).unwrap();
        let e = format!("{:#}", read_checkpoint(&path).unwrap_err());
        assert!(e.contains("4 feature ARD weights"), "{e}");
    }

    #[test]
    fn amortiser_weights_round_trip_as_their_own_tensors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(tensors(&sample())
            .iter()
            .all(|t| !t.name.starts_with("amortiser")));
        let mut c = sample();
        c.params.amortiser = Some(Amortiser::init(2, 3, &[0.75], 9));
        c.adam = AdamState::new(&c.params);
        *c.adam.v.last_mut().unwrap() = 0.25;
        let all = tensors(&c);
        let names: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
        assert!(names.ends_with(&[
            "amortiser_w1",
            "amortiser_c1",
            "amortiser_w2",
            "amortiser_c2",
            "amortiser_w3",
            "amortiser_c3"
        ]));
        let path = dir.path().join("a.parquet");
        write_checkpoint(&path, &c).unwrap();
        assert_eq!(read_checkpoint(&path).unwrap(), c);
        // Shapes that do not chain are refused.
        c.params.amortiser.as_mut().unwrap().c2.pop();
        c.adam = AdamState::new(&c.params);
        write_checkpoint(&path, &c).unwrap();
        let e = format!("{:#}", read_checkpoint(&path).unwrap_err());
        assert!(e.contains("amortiser tensors"), "{e}");
    }

    #[test]
    fn a_learnt_epsilon_round_trips_as_its_own_tensor() {
        let dir = tempfile::tempdir().unwrap();
        assert!(tensors(&sample()).iter().all(|t| t.name != "logit_epsilon"));
        let mut c = sample();
        c.config = serde_json::json!({"kernel": "linear", "learn_epsilon": true, "seed": 5});
        c.params.logit_epsilon = Some(-6.25);
        c.adam = AdamState::new(&c.params);
        *c.adam.v.last_mut().unwrap() = 0.375;
        let t = tensors(&c);
        let last = t.last().unwrap();
        assert_eq!(
            (last.name.as_str(), last.rows, last.cols),
            ("logit_epsilon", 1, 1)
        );
        let path = dir.path().join("e.parquet");
        write_checkpoint(&path, &c).unwrap();
        assert_eq!(read_checkpoint(&path).unwrap(), c);
        // A learnt ε without `"learn_epsilon": true` in the configuration is refused.
        c.config = serde_json::json!({"kernel": "linear"});
        write_checkpoint(&path, &c).unwrap();
        let e = format!("{:#}", read_checkpoint(&path).unwrap_err());
        assert!(e.contains("has a logit_epsilon tensor"), "{e}");
    }
}
