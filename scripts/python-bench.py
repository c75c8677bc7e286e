#!/usr/bin/env python3
"""Fit time, predict time and peak memory of fsgp from Python, of the same fit from the
command line, and of omikuji's and GPflow's Python APIs, on Delicious (multi-label) and
MNIST odd/even (binary): BENCHMARKS.md, "From Python".

Usage:
  scripts/python-bench.py [--reps 3] [--out FILE] [--json-out FILE]
      [--budget 15m | --budget delicious=15m --budget mnist=8m] [--default-budget 2m]
      [--datasets delicious mnist] [--tools fsgp-py fsgp-cli fsgp-py-default omikuji gpflow
       fsgp-cli-native fsgp-cli-default]
      [--gpflow-mnist-epochs 25] [--gpflow-delicious-steps 100] [--timeout 1800]
      [--limit-rows N]          # smoke tests: the first N training and test rows only
      [--delicious-set FLAG=VALUE ...] [--mnist-set FLAG=VALUE ...]

Every measured run is a fresh process, one at a time, its peak resident set size taken
when it exits: GNU time's %M (/usr/bin/time, which reads it from wait4), or this script's
own wait4 of the child when /usr/bin/time is missing (see run_measured). The table gives,
per row, the mean and the min–max over the repetitions (interleaved: repetition r runs
every row before repetition r + 1 starts).

Rows:
- fsgp-py: `fsgp.MultiLabelGP` / `fsgp.GPClassifier` in /work/venv34 with a fixed
  configuration (the `--set` options of `pipelines/delicious-fast.toml` and
  `pipelines/classification/mnist-oddeven-fast.toml` that `pipeline fit --set` accepts),
  fitted on NumPy/SciPy arrays and scored with `predict` / `predict_proba`.
- fsgp-cli: the same fit as `pipeline fit --set ... --model-out M`, then `pipeline predict
  --model M --input TEST --output P.parquet`, on LIBSVM text of the same arrays (written
  before the runs, not timed; the estimator reads the arrays in memory, which ingest turns
  into the same chunks as this text): the same rows, options, seed, budget and validation
  carve, so the difference from fsgp-py is the bindings' cost (the interpreter, the arrays
  held in Python). The default budgets afford fit's step cap (3 000 steps on either set: fit's
  floor, more than 60 epochs of the carved training rows at their batch) with room to
  spare: then the plan does not depend on the
  clock, early stopping ends the run on validation scores alone, and both fits train the
  same steps to the same bits (the notes under the table give the steps of each).
  fsgp-cli-native (optional) fits the original files instead; on Delicious the
  XML-repository ingest names the labels differently from the LIBSVM text, so its model,
  and its scores, differ slightly.
- fsgp-py-default: the estimator with every default but the budget (`--default-budget`),
  as a user would call it (its plan depends on the clock).
- omikuji: default hyper-parameters, 2 threads; trained on the training file (its loader,
  timed as load), each test row scored by `Model.predict(top_k=5)`. MNIST as a two-label
  problem (the class as the one label), accuracy from the top-ranked label.
- gpflow: SVGP, whitened full q(u), Adam η = 0.01, minibatches of 500, float64, 2 TF
  threads, Z from a seeded Lloyd k-means (10 iterations) of the training inputs (timed as
  fit). MNIST: SE kernel, Bernoulli (probit), M = 200, a fixed number of epochs. Delicious:
  L = 983 latent GPs sharing one linear kernel and one Z (SharedIndependent), a Bernoulli
  (probit) likelihood over the 0/1 label matrix, M = 100, a fixed number of steps (each
  about 2-3 s and 3.4 GB on this VM: 983 full M × M q(u) factors), P@k from the
  predicted latent means.
- fsgp-cli-default (optional): `pipeline fit --budget` with every default on the original
  files.

Metrics on the test file: P@1/3/5 with every row counted (a row without labels scores 0);
accuracy and NLP = mean −log p(true class), p clipped at 1e-12.

"load s" is reading the files into NumPy/SciPy (omikuji: its own loader of the training
file and the test rows as Python pairs); the command line reads its files inside `fit`
and `predict`, which is why its load is "—". fsgp workspaces live in a temporary directory
removed at the end.

Internals: `--worker KIND JSON` runs one run in the interpreter that starts it and prints
one line `BENCH-RESULT {json}` (load_s, fit_s, predict_s, metrics, notes). KIND fsgp-py,
omikuji, gpflow are measured; write-text (the LIBSVM text for fsgp-cli) and score-cli (the
command line's predictions against the test labels) are not. The driver itself needs only
the standard library.
"""
import argparse
import datetime
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The interpreter with the fsgp package (`pip install ./python`; .ci/run's venv), and the
# one with omikuji, gpflow and tensorflow (--fsgp-python, --peer-python).
FSGP_PY = os.environ.get(
    "FSGP_PYTHON", os.path.join(ROOT, "target", "python-venv", "bin", "python"))
PEER_PY = os.environ.get("PEER_PYTHON", "python3")
PIPELINE_CANDIDATES = [
    os.environ.get("FSGP_PIPELINE", ""),
    os.path.join(ROOT, "target", "release", "pipeline"),
]
DATA = os.path.join(ROOT, "..", "shared", "data")
MARK = "BENCH-RESULT "

# The fixed configurations: `pipeline fit --set` options, in the order the Python estimator
# passes them (its parameters first, then `settings`): the train options of
# `pipelines/delicious-fast.toml` and `pipelines/classification/mnist-oddeven-fast.toml`
# (chosen on validation, issue 33) but what `fit` decides itself: the epochs, the seed, and
# MNIST's `lr-decay-at` schedule, counted in epochs of a run whose length fit decides.
FIXED_SETS = {
    "delicious": ["kernel=linear", "inducing=150", "inducing-inputs=free", "factors=30",
                  "negatives=all", "lr=0.02"],
    "mnist": ["kernel=se", "inducing=200", "inducing-inputs=subspace", "likelihood=logistic",
              "q-form=whitened", "latent=independent", "natural-step=0.1", "batch=1000"],
}
DEFAULT_BUDGETS = {"delicious": "15m", "mnist": "8m"}
# Estimator parameters that are train flags (python/fsgp/_estimators.py), in its order.
PARAM_OF_FLAG = {
    "kernel": "kernel",
    "inducing": "n_inducing",
    "inducing-inputs": "inducing_inputs",
    "likelihood": "likelihood",
    "q-form": "q_form",
    "factors": "n_factors",
}
TOOLS = ["fsgp-py", "fsgp-cli", "fsgp-py-default", "omikuji", "gpflow"]
OPTIONAL_TOOLS = ["fsgp-cli-native", "fsgp-cli-default"]


# ----------------------------------------------------------------------------------------
# Workers (run under the tool's interpreter; NumPy is imported here, not by the driver)
# ----------------------------------------------------------------------------------------


def read_sparse(path, base):
    """Rows of an XML-repository file (header `N D L`, rows `l1,l2 f:v ...`) or a LIBSVM
    file (plain or gzip), as CSR arrays with 0-based feature ids (file id − base) and the
    label lists. Returns (indptr, indices, data, labels, header or None)."""
    import numpy as np

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    header = None
    first = lines[0].split() if lines else []
    if len(first) == 3 and all(t.isdigit() for t in first):
        header = tuple(int(t) for t in first)
        lines = lines[1:]
    else:
        lines = [l for l in lines if l.strip()]
    labels, feats, counts = [], [], []
    for line in lines:
        head, _, rest = line.partition(" ")
        if ":" in head:  # no labels: the row starts with a feature
            head, rest = "", line
        labels.append([int(float(x)) for x in head.split(",") if x])
        counts.append(rest.count(":"))
        feats.append(rest)
    flat = np.fromstring(" ".join(feats).replace(":", " "), sep=" ")
    del feats
    indices = flat[0::2].astype(np.int64) - base
    data = flat[1::2].copy()
    indptr = np.zeros(len(lines) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    if header is not None and header[0] != len(lines):
        raise ValueError(f"{path}: header says {header[0]} rows, found {len(lines)}")
    if indptr[-1] != len(indices):
        raise ValueError(f"{path}: malformed feature tokens")
    return indptr, indices, data, labels, header


def csr(rows, n_features):
    import scipy.sparse as sp

    indptr, indices, data = rows[0], rows[1], rows[2]
    X = sp.csr_matrix((data, indices, indptr), shape=(len(indptr) - 1, n_features))
    X.sort_indices()
    return X


def dense(rows, n_features):
    import numpy as np

    indptr, indices, data = rows[0], rows[1], rows[2]
    n = len(indptr) - 1
    X = np.zeros((n, n_features))
    X[np.repeat(np.arange(n), np.diff(indptr)), indices] = data
    return X


def p_at_k(true_sets, ranked, ks=(1, 3, 5)):
    """P@k in %, every row counted (a row without labels scores 0)."""
    n = len(true_sets)
    out = {}
    for k in ks:
        hits = sum(len(set(list(r)[:k]) & t) for t, r in zip(true_sets, ranked))
        out[f"p{k}"] = 100.0 * hits / (n * k) if n else float("nan")
    return out


def binary_metrics(y, p1):
    """Accuracy (%) with the rule p(1) > 0.5 and NLP, p clipped at 1e-12."""
    import numpy as np

    y = np.asarray(y)
    p1 = np.asarray(p1, dtype=np.float64)
    acc = 100.0 * float(np.mean((p1 > 0.5).astype(np.int64) == y))
    ptrue = np.where(y == 1, p1, 1.0 - p1)
    nlp = float(-np.log(np.clip(ptrue, 1e-12, None)).mean())
    return {"acc": acc, "nlp": nlp}


def outcome_steps(outcome):
    """(steps the final model trained, steps planned for the chosen candidate, its name)
    from what fit returned (`pipeline fit --json`, the estimators' `fit_outcome_`)."""
    if not outcome:
        return None, None, None
    chosen = outcome["candidates"][outcome["chosen"]]
    planned = chosen.get("planned_steps")
    return outcome["final_steps"], planned, chosen["name"]


def fsgp_arrays(spec):
    """What the fsgp estimators are given: X (CSR), Y (CSR indicator n × L, or the classes),
    the test rows Xt and the test label lists."""
    import numpy as np
    import scipy.sparse as sp

    tr = read_sparse(spec["train"], spec["base"])
    te = read_sparse(spec["test"], spec["base"])
    D = spec["features"]
    X, Xt = csr(tr, D), csr(te, D)
    if spec["task"] == "multilabel":
        lab = tr[3]
        cols = np.array([c for l in lab for c in l], dtype=np.int64)
        ptr = np.zeros(len(lab) + 1, dtype=np.int64)
        np.cumsum([len(l) for l in lab], out=ptr[1:])
        Y = sp.csr_matrix((np.ones(len(cols)), cols, ptr), shape=(len(lab), spec["labels"]))
        Y.sort_indices()
    else:
        Y = np.array([l[0] for l in tr[3]], dtype=np.int64)
    return X, Y, Xt, te[3]


def label_csr(task, Y):
    """(label indptr, label ids) of Y as the estimators write them."""
    import numpy as np

    if task == "multilabel":
        return Y.indptr, Y.indices
    return np.arange(len(Y) + 1), Y


def write_libsvm(path, X, label_indptr, labels):
    """LIBSVM text of X and its labels, as the command line's fit reads them: 1-based
    feature indices, values in Python's shortest round-trip form (so the text parses back
    to the same doubles the estimator is given), explicit zeros removed, indices sorted.
    The estimators ingest the arrays themselves; this text is the command line's copy."""
    import numpy as np

    X = X.tocsr().astype(np.float64)
    X.eliminate_zeros()
    X.sort_indices()
    with open(path, "w") as out:
        for i in range(X.shape[0]):
            lo, hi = X.indptr[i], X.indptr[i + 1]
            row_labels = ",".join(str(int(l)) for l in labels[label_indptr[i]:label_indptr[i + 1]])
            features = " ".join(f"{j + 1}:{float(v)!r}"
                                for j, v in zip(X.indices[lo:hi], X.data[lo:hi]))
            out.write(f"{row_labels} {features}\n" if features else f"{row_labels}\n")


def write_text(spec):
    """LIBSVM text of the training rows the estimator is given (and of the test rows in
    the same layout), for the command line's fit: not measured."""
    import numpy as np

    X, Y, Xt, yt = fsgp_arrays(spec)
    write_libsvm(spec["train_out"], X, *label_csr(spec["task"], Y))
    if spec["task"] == "multilabel":
        # Test rows without their labels: predict refuses a label the training rows never
        # had, and it needs none.
        yt = [[] for _ in yt]
    ptr = np.zeros(len(yt) + 1, dtype=np.int64)
    np.cumsum([len(l) for l in yt], out=ptr[1:])
    ids = np.array([c for l in yt for c in l], dtype=np.int64)
    write_libsvm(spec["test_out"], Xt, ptr, ids)
    return {}


def worker_fsgp(spec):
    t = time.perf_counter()
    import fsgp

    import_s = time.perf_counter() - t
    multilabel = spec["task"] == "multilabel"
    t = time.perf_counter()
    X, Y, Xt, yt = fsgp_arrays(spec)
    load_s = time.perf_counter() - t

    est = getattr(fsgp, spec["estimator"])(**spec["params"])
    t = time.perf_counter()
    est.fit(X, Y)
    fit_s = time.perf_counter() - t
    t = time.perf_counter()
    if multilabel:
        labels, _ = est.predict(Xt, top_k=5)
        predict_s = time.perf_counter() - t
        metrics = p_at_k([set(l) for l in yt], labels.tolist())
    else:
        proba = est.predict_proba(Xt)
        predict_s = time.perf_counter() - t
        p1 = proba[:, list(est.classes_).index(1)]
        metrics = binary_metrics([l[0] for l in yt], p1)
    steps, planned, chosen = outcome_steps(est.fit_outcome_)
    return {"load_s": load_s, "fit_s": fit_s, "predict_s": predict_s, "metrics": metrics,
            "notes": {"import_s": import_s, "steps": steps, "planned": planned,
                      "chosen": chosen}}


def worker_omikuji(spec):
    import omikuji

    n_threads = spec["threads"]
    t = time.perf_counter()
    hp = omikuji.Model.default_hyper_param()
    split = hasattr(omikuji, "lib") and hasattr(omikuji, "_ThreadPoolHandle")
    if split:
        # train_on_data's two steps, timed apart: omikuji's loader of the file, then training.
        lib, ffi = omikuji.lib, omikuji.ffi
        pool = omikuji._ThreadPoolHandle(n_threads)
        ds = lib.load_omikuji_data_set(ffi.new("char[]", spec["train"].encode()), pool.ptr)
        if ds == ffi.NULL:
            raise RuntimeError(f"omikuji cannot load {spec['train']}")
        ds = ffi.gc(ds, lib.free_omikuji_data_set)
    te = read_sparse(spec["test"], spec["base"])
    indptr, indices, data, yt = te[0], te[1].tolist(), te[2].tolist(), te[3]
    rows = [list(zip(indices[a:b], data[a:b])) for a, b in zip(indptr[:-1], indptr[1:])]
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    if split:
        ptr = lib.train_omikuji_model(ds, hp, pool.ptr)
        if ptr == ffi.NULL:
            raise RuntimeError("omikuji failed to train")
        model = omikuji.Model(ptr)
        del ds
    else:
        model = omikuji.Model.train_on_data(spec["train"], hp, n_threads=n_threads)
    fit_s = time.perf_counter() - t
    model.init_prediction_thread_pool(n_threads)
    t = time.perf_counter()
    ranked = [[l for l, _ in model.predict(r, top_k=5)] for r in rows]
    predict_s = time.perf_counter() - t
    if spec["task"] == "multilabel":
        metrics = p_at_k([set(l) for l in yt], ranked)
    else:
        top = [r[0] if r else -1 for r in ranked]
        metrics = {"acc": 100.0 * sum(a == l[0] for a, l in zip(top, yt)) / len(yt)}
    notes = {"loader_in_fit": not split}
    return {"load_s": load_s, "fit_s": fit_s, "predict_s": predict_s, "metrics": metrics,
            "notes": notes}


def kmeans(X, k, iters, rng):
    """Lloyd's k-means from k distinct random rows; an empty cluster keeps its centre."""
    import numpy as np

    C = X[rng.choice(len(X), size=k, replace=False)].copy()
    x2 = (X * X).sum(1)
    for _ in range(iters):
        a = (x2[:, None] - 2.0 * X @ C.T + (C * C).sum(1)[None, :]).argmin(1)
        sums = np.zeros_like(C)
        np.add.at(sums, a, X)
        n = np.bincount(a, minlength=k)
        C[n > 0] = sums[n > 0] / n[n > 0, None]
    return C


def worker_gpflow(spec):
    import numpy as np

    t = time.perf_counter()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
    tf.config.threading.set_inter_op_parallelism_threads(spec["threads"])
    import gpflow

    import_s = time.perf_counter() - t
    multilabel = spec["task"] == "multilabel"
    t = time.perf_counter()
    tr = read_sparse(spec["train"], spec["base"])
    te = read_sparse(spec["test"], spec["base"])
    D = spec["features"]
    X, Xt = dense(tr, D), dense(te, D)
    if multilabel:
        L = spec["labels"]
        Y = np.zeros((X.shape[0], L))
        for i, l in enumerate(tr[3]):
            Y[i, l] = 1.0
    else:
        Y = np.array([l[0] for l in tr[3]], dtype=np.float64)[:, None]
    yt = te[3]
    del tr, te
    load_s = time.perf_counter() - t

    seed, M, B = spec["seed"], spec["inducing"], spec["batch"]
    N = X.shape[0]
    B = min(B, N)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    t = time.perf_counter()
    Z = kmeans(X, min(M, N), 10, np.random.default_rng(seed))
    kmeans_s = time.perf_counter() - t
    if multilabel:
        kernel = gpflow.kernels.SharedIndependent(gpflow.kernels.Linear(), output_dim=L)
        iv = gpflow.inducing_variables.SharedIndependentInducingVariables(
            gpflow.inducing_variables.InducingPoints(Z))
        model = gpflow.models.SVGP(kernel, gpflow.likelihoods.Bernoulli(), iv,
                                   num_latent_gps=L, num_data=N, whiten=True, q_diag=False)
    else:
        model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(),
                                   gpflow.likelihoods.Bernoulli(),
                                   gpflow.inducing_variables.InducingPoints(Z),
                                   num_data=N, whiten=True, q_diag=False)
    opt = tf.optimizers.Adam(learning_rate=0.01)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = -model.elbo((x, y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    data = (tf.data.Dataset.from_tensor_slices((X, Y))
            .shuffle(N, seed=seed, reshuffle_each_iteration=True)
            .batch(B, drop_remainder=True))
    steps_per_epoch = N // B
    if spec.get("epochs"):
        stream, steps = data.repeat(spec["epochs"]), spec["epochs"] * steps_per_epoch
    else:
        stream, steps = data.repeat().take(spec["steps"]), spec["steps"]
    done, loss = 0, None
    for x, y in stream:
        loss = step(x, y)
        done += 1
    final = float(loss.numpy()) if loss is not None else float("nan")
    fit_s = time.perf_counter() - t

    t = time.perf_counter()
    out = []
    for i in range(0, len(Xt), 500):
        if multilabel:
            mean, _ = model.predict_f(Xt[i:i + 500])
        else:
            mean, _ = model.predict_y(Xt[i:i + 500])
        out.append(mean.numpy())
    P = np.concatenate(out) if out else np.zeros((0, 1))
    if multilabel:
        ranked = np.argsort(-P, axis=1, kind="stable")[:, :5]
    predict_s = time.perf_counter() - t
    if multilabel:
        metrics = p_at_k([set(l) for l in yt], ranked.tolist())
    else:
        metrics = binary_metrics([l[0] for l in yt], P[:, 0])
    return {"load_s": load_s, "fit_s": fit_s, "predict_s": predict_s, "metrics": metrics,
            "notes": {"import_s": import_s, "kmeans_s": kmeans_s, "steps": done,
                      "steps_per_epoch": steps_per_epoch, "final_minibatch_loss": final,
                      "planned_steps": steps}}


def score_cli(spec):
    """Metrics of `pipeline predict --output` Parquet against the test file's labels."""
    import numpy as np
    import pyarrow.parquet as pq

    import fsgp

    te = read_sparse(spec["test"], spec["base"])
    yt = te[3]
    t = pq.read_table(spec["predictions"]).sort_by("row_id").to_pydict()
    if len(t["row_id"]) != len(yt):
        raise ValueError(f"{len(t['row_id'])} predicted rows for {len(yt)} test rows")
    # The Parquet file holds the engine's label ids; the model file names them (as the
    # estimators map them: python/fsgp/_estimators.py).
    model = fsgp.Model(spec["model"])
    values = model.label_values
    name = (lambda i: values[i]) if values else (lambda i: i)
    if spec["task"] == "multilabel":
        ranked = [[name(i) for i in ls] for ls in t["labels"]]
        return {"metrics": p_at_k([set(l) for l in yt], ranked)}
    # Binary: one label per row, the positive class, with its probability.
    p = np.array([pr[0] for pr in t["probabilities"]], dtype=np.float64)
    positive = {name(ls[0]) for ls in t["labels"] if ls}
    if positive == {0}:
        p = 1.0 - p
    elif positive != {1}:
        raise ValueError(f"unexpected positive classes {positive}")
    return {"metrics": binary_metrics([l[0] for l in yt], p)}


WORKERS = {"fsgp-py": worker_fsgp, "omikuji": worker_omikuji, "gpflow": worker_gpflow,
           "score-cli": score_cli, "write-text": write_text}


def worker_main(kind, spec_json):
    spec = json.loads(spec_json)
    out = WORKERS[kind](spec)
    sys.stdout.flush()
    print(MARK + json.dumps(out), flush=True)


# ----------------------------------------------------------------------------------------
# Driver (standard library only)
# ----------------------------------------------------------------------------------------


TIME = "/usr/bin/time"


def run_measured(argv, log, timeout, env=None, cwd=None, stdout_path=None):
    """Runs argv as a fresh process (own session), output to `log` (standard output to
    `stdout_path` instead when given), and waits for it.
    Returns (exit code or None on timeout, wall seconds, peak RSS MiB).

    The peak is GNU time's %M (the run's wait4 maximum RSS) when /usr/bin/time exists,
    else this process's wait4 of the child. Not getrusage(RUSAGE_CHILDREN), which keeps the
    largest child so far, and not this process's own wait4 if avoidable: a child's peak as
    Linux reports it is at least the RSS of the process it was forked from (the copied
    address space it had before exec), and the tiny time process keeps that floor small."""
    rss_file = log + ".rss"
    use_time = os.path.exists(TIME)
    cmd = [TIME, "-f", "%M", "-o", rss_file] + argv if use_time else argv
    with open(log, "ab") as out:
        out.write(("$ " + " ".join(argv) + "\n").encode())
        out.flush()
        t = time.perf_counter()
        stdout = open(stdout_path, "wb") if stdout_path else out
        p = subprocess.Popen(cmd, stdout=stdout, stderr=out, env=env, cwd=cwd,
                             start_new_session=True)
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
            if stdout is not out:
                stdout.close()
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        # Anything the run left behind in its session (none expected) goes too.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    rc = None if timed_out.is_set() else p.returncode
    rss_kib = ru.ru_maxrss
    if use_time:
        try:
            with open(rss_file) as f:
                kib = [l.strip() for l in f if l.strip().isdigit()]
            if kib:
                rss_kib = int(kib[-1])
            elif rc is not None:
                raise RuntimeError(f"{TIME} wrote no %M to {rss_file}")
        except OSError:
            pass  # killed before time wrote: the wait4 figure, floor included
    return rc, wall, rss_kib / 1024.0


def tail(log, n=6):
    try:
        with open(log, errors="replace") as f:
            lines = [l.rstrip() for l in f if l.strip()]
    except OSError:
        return ""
    keep = [l for l in lines if not l.startswith(MARK)]
    err = [l for l in keep if re.search(r"error|Error|Traceback|Killed", l)]
    return " | ".join((err[-2:] if err else keep[-n:]))[-400:]


def result_of(log):
    with open(log, errors="replace") as f:
        for line in reversed(f.read().splitlines()):
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
    return None


def worker_env(scratch):
    env = dict(os.environ)
    env["TMPDIR"] = scratch
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_python_worker(python, kind, spec, scratch, log, timeout):
    argv = [python, os.path.abspath(__file__), "--worker", kind, json.dumps(spec)]
    rc, wall, rss = run_measured(argv, log, timeout, env=worker_env(scratch), cwd=scratch)
    if rc is None:
        return {"error": f"timeout after {timeout:.0f} s", "wall_s": wall, "max_rss_mib": rss}
    res = result_of(log)
    if rc != 0 or res is None:
        return {"error": f"exit {rc}: {tail(log)}", "wall_s": wall, "max_rss_mib": rss}
    res["wall_s"] = wall
    res["max_rss_mib"] = rss
    return res


def run_cli(row, ds, args, scratch, log):
    """pipeline fit, then pipeline predict --model, each a measured process."""
    ws = os.path.join(scratch, "ws")
    model = os.path.join(scratch, "model.parquet")
    spec_out = os.path.join(scratch, "fit.toml")
    preds = os.path.join(scratch, "predictions.parquet")
    if row["native"]:
        train, test = ds["train"], ds["test"]
    else:
        train, test = ds["text_train"], ds["text_test"]
    fit = [args.pipeline, "--workspace", ws, "fit", "--train", train, "--name",
           ds["name"], "--budget", row["budget"], "--seed", "0", "--spec-out", spec_out,
           "--model-out", model, "--json"]
    if ds["format"] == "libsvm" or not row["native"]:
        fit += ["--format", "libsvm", "--features", str(ds["features"])]
    if ds["task"] == "multilabel":
        fit += ["--task", "multilabel"]
    for s in row["sets"]:
        fit += ["--set", s]
    outcome_file = os.path.join(scratch, "fit-outcome.json")
    rc, fit_s, fit_rss = run_measured(fit, log, args.timeout, env=worker_env(scratch),
                                      cwd=scratch, stdout_path=outcome_file)
    if rc != 0:
        why = f"timeout after {args.timeout:.0f} s" if rc is None else f"exit {rc}"
        return {"error": f"fit {why}: {tail(log)}", "max_rss_mib": fit_rss}
    predict = [args.pipeline, "--workspace", os.path.join(scratch, "none"), "predict",
               "--model", model, "--input", test, "--output", preds]
    predict += ["--top-k", "5"] if ds["task"] == "multilabel" else ["--probabilities"]
    rc, predict_s, pred_rss = run_measured(predict, log, args.timeout,
                                           env=worker_env(scratch), cwd=scratch)
    if rc != 0:
        why = f"timeout after {args.timeout:.0f} s" if rc is None else f"exit {rc}"
        return {"error": f"predict {why}: {tail(log)}", "max_rss_mib": max(fit_rss, pred_rss)}
    spec = {"test": ds["test"], "base": ds["base"], "task": ds["task"], "predictions": preds,
            "model": model}
    scored = run_python_worker(FSGP_PY, "score-cli", spec, scratch, log, args.timeout)
    if "error" in scored:
        return {"error": "scoring: " + scored["error"]}
    with open(outcome_file) as f:
        steps, planned, chosen = outcome_steps(json.load(f))
    return {"load_s": None, "fit_s": fit_s, "predict_s": predict_s,
            "metrics": scored["metrics"], "max_rss_mib": max(fit_rss, pred_rss),
            "notes": {"fit_rss_mib": fit_rss, "predict_rss_mib": pred_rss, "steps": steps,
                      "planned": planned, "chosen": chosen}}


def py_params(sets):
    """Estimator keyword arguments of `--set` options: the estimator's own parameters,
    the rest in `settings` (a switch as True)."""
    params, settings = {}, {}
    for s in sets:
        flag, eq, value = s.partition("=")
        if flag in PARAM_OF_FLAG:
            v = value
            if flag in ("inducing", "factors"):
                v = int(value)
            params[PARAM_OF_FLAG[flag]] = v
        else:
            settings[flag] = value if eq else True
    if settings:
        params["settings"] = settings
    return params


def py_order(sets):
    """The `--set` options in the order the estimator passes them to `pipeline fit`."""
    by_flag = {s.partition("=")[0]: s for s in sets}
    own = [by_flag[f] for f in PARAM_OF_FLAG if f in by_flag]
    return own + [s for s in sets if s.partition("=")[0] not in PARAM_OF_FLAG]


def describe_params(estimator, params):
    parts = []
    for k, v in params.items():
        if k == "settings":
            inner = ", ".join(f"{a}: {b}" for a, b in v.items())
            parts.append(f"settings={{{inner}}}")
        elif k not in ("workspace",):
            parts.append(f"{k}={v}")
    return f"{estimator}({', '.join(parts)})"


def prepare(args, tmp):
    """The files every tool reads: the originals, or their first --limit-rows rows."""
    out = {}
    data = args.data
    if "delicious" in args.datasets:
        d = os.path.join(data, "delicious")
        ds = {"name": "delicious", "task": "multilabel", "format": "xc", "base": 0,
              "train": os.path.join(d, "train.txt"), "test": os.path.join(d, "test.txt")}
        with open(ds["train"]) as f:
            _, D, L = (int(x) for x in f.readline().split())
        ds["features"], ds["labels"] = D, L
        if args.limit_rows:
            for part in ("train", "test"):
                with open(ds[part]) as f:
                    f.readline()
                    rows = [l for _, l in zip(range(args.limit_rows), f)]
                path = os.path.join(tmp, f"delicious-{part}.txt")
                with open(path, "w") as f:
                    f.write(f"{len(rows)} {D} {L}\n")
                    f.writelines(rows)
                ds[part] = path
        ds["omikuji_train"], ds["omikuji_test"], ds["omikuji_base"] = ds["train"], ds["test"], 0
        out["delicious"] = ds
    if "mnist" in args.datasets:
        d = os.path.join(data, "classification", "mnist-oddeven")
        ds = {"name": "mnist-oddeven", "task": "binary", "format": "libsvm", "base": 1,
              "features": 784, "labels": 2,
              "train": os.path.join(d, "train.txt.gz"), "test": os.path.join(d, "test.txt.gz")}
        for part in ("train", "test"):
            # Streamed, so this process stays small (see run_measured).
            if args.limit_rows:
                path = os.path.join(tmp, f"mnist-{part}.txt")
                with gzip.open(ds[part], "rt") as f, open(path, "w") as g:
                    g.writelines(l for _, l in zip(range(args.limit_rows), f))
                ds[part] = path
            if "omikuji" in args.tools:
                # omikuji reads XML-repository text: header, 0-based feature ids, the class
                # as the row's one label of L = 2.
                opener = gzip.open if ds[part].endswith(".gz") else open
                body = os.path.join(tmp, f"mnist-{part}-xc.body")
                n = 0
                with opener(ds[part], "rt") as f, open(body, "w") as g:
                    for l in f:
                        toks = l.split()
                        if not toks:
                            continue
                        n += 1
                        g.write(str(int(float(toks[0]))) + " " + " ".join(
                            f"{int(i) - 1}:{v}" for i, v in (t.split(":") for t in toks[1:]))
                            + "\n")
                path = os.path.join(tmp, f"mnist-{part}-xc.txt")
                with open(path, "w") as g, open(body) as f:
                    g.write(f"{n} 784 2\n")
                    shutil.copyfileobj(f, g)
                os.remove(body)
                ds[f"omikuji_{part}"] = path
        ds["omikuji_base"] = 0
        out["mnist"] = ds
    if "fsgp-cli" in args.tools:
        for key, ds in out.items():
            # Text of the rows the estimator is given, so the command line fits what the
            # bindings fit.
            ds["text_train"] = os.path.join(tmp, f"{key}-train.svm")
            ds["text_test"] = os.path.join(tmp, f"{key}-test.svm")
            spec = {"train": ds["train"], "test": ds["test"], "base": ds["base"],
                    "task": ds["task"], "features": ds["features"], "labels": ds["labels"],
                    "train_out": ds["text_train"], "test_out": ds["text_test"]}
            subprocess.run([args.fsgp_python, os.path.abspath(__file__), "--worker",
                            "write-text", json.dumps(spec)], check=True,
                           stdout=subprocess.DEVNULL)
    return out


def build_rows(args, datasets):
    rows = []
    for key in args.datasets:
        ds = datasets[key]
        sets = py_order(getattr(args, f"{key}_set") or FIXED_SETS[key])
        budget = args.budgets[key]
        estimator = "MultiLabelGP" if ds["task"] == "multilabel" else "GPClassifier"
        for tool in args.tools:
            row = {"data": key, "tool": tool, "ds": ds}
            if tool == "fsgp-py":
                params = dict(py_params(sets), budget=budget, seed=0)
                row.update(kind="fsgp-py", budget=budget, estimator=estimator, params=params,
                           settings=describe_params(estimator, params))
            elif tool == "fsgp-py-default":
                params = {"budget": args.default_budget}
                row.update(kind="fsgp-py", budget=args.default_budget, estimator=estimator,
                           params=params, settings=describe_params(estimator, params)
                           + " (every other default)")
            elif tool in ("fsgp-cli", "fsgp-cli-native"):
                native = tool == "fsgp-cli-native"
                row.update(kind="fsgp-cli", budget=budget, sets=sets, native=native,
                           settings=f"fit --budget {budget} "
                           + " ".join(f"--set {s}" for s in sets)
                           + "; predict --model --input"
                           + (" (the original files)" if native else
                              " (the LIBSVM text fsgp-py's fit writes)"))
            elif tool == "fsgp-cli-default":
                row.update(kind="fsgp-cli", budget=args.default_budget, sets=[], native=True,
                           settings=f"fit --budget {args.default_budget}; predict --model "
                           "--input (the original files)")
            elif tool == "omikuji":
                row.update(kind="omikuji", settings="default hyper-parameters, 2 threads"
                           + ("" if key == "delicious" else "; 2 labels, top-1 as the class"))
            elif tool == "gpflow":
                if key == "mnist":
                    row.update(kind="gpflow", inducing=200, epochs=args.gpflow_mnist_epochs,
                               settings=f"SVGP, SE, Bernoulli (probit), M = 200 k-means Z, "
                               f"Adam 0.01, B = 500, {args.gpflow_mnist_epochs} epochs")
                else:
                    row.update(kind="gpflow", inducing=args.gpflow_delicious_m,
                               steps=args.gpflow_delicious_steps,
                               settings=f"SVGP, {ds['labels']} latent GPs sharing a linear "
                               f"kernel and Z, Bernoulli (probit), M = {args.gpflow_delicious_m}"
                               f" k-means Z, Adam 0.01, B = 500, "
                               f"{args.gpflow_delicious_steps} steps")
                    if args.gpflow_delicious_steps <= 0:
                        row["skip"] = "not run: --gpflow-delicious-steps 0"
            rows.append(row)
    return rows


def run_row(row, args, tmp, rep):
    ds = row["ds"]
    scratch = tempfile.mkdtemp(prefix=f"{row['data']}-{row['tool']}-{rep}-", dir=tmp)
    log = os.path.join(args.logs or scratch, f"{row['data']}-{row['tool']}-{rep}.log")
    try:
        if row["kind"] == "fsgp-cli":
            return run_cli(row, ds, args, scratch, log)
        if row["kind"] == "fsgp-py":
            params = dict(row["params"], workspace=os.path.join(scratch, "ws"))
            spec = {"train": ds["train"], "test": ds["test"], "base": ds["base"],
                    "task": ds["task"], "features": ds["features"], "labels": ds["labels"],
                    "estimator": row["estimator"], "params": params, "scratch": scratch}
            return run_python_worker(args.fsgp_python, "fsgp-py", spec, scratch, log,
                                     args.timeout)
        if row["kind"] == "omikuji":
            spec = {"train": ds["omikuji_train"], "test": ds["omikuji_test"],
                    "base": ds["omikuji_base"], "task": ds["task"], "threads": 2}
            return run_python_worker(args.peer_python, "omikuji", spec, scratch, log,
                                     args.timeout)
        if row["kind"] == "gpflow":
            spec = {"train": ds["train"], "test": ds["test"], "base": ds["base"],
                    "task": ds["task"], "features": ds["features"], "labels": ds["labels"],
                    "threads": 2, "seed": rep, "inducing": row["inducing"], "batch": 500,
                    "epochs": row.get("epochs"), "steps": row.get("steps")}
            return run_python_worker(args.peer_python, "gpflow", spec, scratch, log,
                                     args.timeout)
        raise ValueError(row["kind"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def stat(values, digits):
    vals = [v for v in values if v is not None]
    if not vals:
        return "—"
    m = sum(vals) / len(vals)
    if len(vals) == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ({min(vals):.{digits}f}–{max(vals):.{digits}f})"


def metric_cell(task, results):
    ms = [r["metrics"] for r in results]
    mean = lambda k: sum(m[k] for m in ms) / len(ms)
    rng = lambda k, d: (f" ({min(m[k] for m in ms):.{d}f}–{max(m[k] for m in ms):.{d}f})"
                        if len(ms) > 1 else "")
    if task == "multilabel":
        return (f"P@1/3/5 {mean('p1'):.2f} / {mean('p3'):.2f} / {mean('p5'):.2f}"
                + (f" (P@1 {rng('p1', 2).strip()[1:-1]})" if len(ms) > 1 else ""))
    cell = f"acc {mean('acc'):.2f} %{rng('acc', 2)}"
    if all(m.get("nlp") is not None for m in ms):
        cell += f", NLP {mean('nlp'):.4f}{rng('nlp', 4)}"
    return cell


def steps_note(results):
    s = sorted({r["notes"].get("steps") for r in results if r.get("notes")} - {None})
    p = sorted({r["notes"].get("planned") for r in results if r.get("notes")} - {None})
    c = sorted({r["notes"].get("chosen") for r in results if r.get("notes")} - {None})
    out = ""
    if s:
        out = "steps " + "/".join(map(str, s))
        if p:
            out += " (of " + "/".join(map(str, p)) + " planned)"
    if c:
        out += "; chose " + " / ".join(c)
    return out


def render(rows, results, args, header_lines):
    lines = list(header_lines)
    lines.append("")
    lines.append("| data | tool | settings | load s | fit s | predict s | peak MiB | metric |")
    lines.append("|---|---|---|---|---|---|---|---|")
    notes = []
    for i, row in enumerate(rows):
        res = results[i]
        ok = [r for r in res if "error" not in r]
        bad = [r for r in res if "error" in r]
        data = {"delicious": "Delicious", "mnist": "MNIST odd/even"}[row["data"]]
        if row.get("skip"):
            lines.append(f"| {data} | {row['tool']} | {row['settings']} | — | — | — | — | "
                         f"{row['skip']} |")
            continue
        if not ok:
            why = bad[0]["error"] if bad else "no run"
            lines.append(f"| {data} | {row['tool']} | {row['settings']} | — | — | — | — | "
                         f"not run: {why} |")
            continue
        metric = metric_cell(row["ds"]["task"], ok)
        if bad:
            metric += f"; {len(bad)} of {len(res)} runs failed: {bad[0]['error']}"
        lines.append(
            f"| {data} | {row['tool']} | {row['settings']} | "
            f"{stat([r['load_s'] for r in ok], 2)} | {stat([r['fit_s'] for r in ok], 2)} | "
            f"{stat([r['predict_s'] for r in ok], 2)} | "
            f"{stat([r['max_rss_mib'] for r in ok], 0)} | {metric} |")
        n = [r.get("notes", {}) for r in ok]
        extra = []
        sn = steps_note(ok)
        if sn:
            extra.append(sn)
        # write_text_s: runs from before the estimators read arrays in memory wrote them
        # as LIBSVM text first, and timed it.
        for key, label in (("import_s", "import s"), ("write_text_s", "arrays → LIBSVM text s"),
                           ("kmeans_s", "k-means s (in fit)"),
                           ("fit_rss_mib", "fit peak MiB"),
                           ("predict_rss_mib", "predict peak MiB")):
            vals = [x.get(key) for x in n if x.get(key) is not None]
            if vals:
                extra.append(f"{label} {stat(vals, 0 if 'MiB' in label else 2)}")
        if any(x.get("loader_in_fit") for x in n):
            extra.append("omikuji's loader timed inside fit")
        if extra:
            notes.append(f"- {data}, {row['tool']}: " + "; ".join(extra))
    if notes:
        lines.append("")
        lines.extend(notes)
    return "\n".join(lines) + "\n"


def parse_budgets(values):
    budgets = dict(DEFAULT_BUDGETS)
    for v in values or []:
        if "=" in v:
            k, _, b = v.partition("=")
            if k not in budgets:
                raise SystemExit(f"--budget {v}: unknown data set {k!r}")
            budgets[k] = b
        else:
            budgets = {k: v for k in budgets}
    return budgets


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--worker":
        return worker_main(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--datasets", nargs="+", default=["delicious", "mnist"],
                    choices=["delicious", "mnist"])
    ap.add_argument("--tools", nargs="+", default=TOOLS, choices=TOOLS + OPTIONAL_TOOLS)
    ap.add_argument("--budget", action="append", metavar="[DATA=]BUDGET",
                    help="budget of the fixed-configuration fits (fsgp-py, fsgp-cli); "
                    f"default {DEFAULT_BUDGETS}")
    ap.add_argument("--default-budget", default="2m",
                    help="budget of the fsgp-py-default row (default 2m)")
    ap.add_argument("--delicious-set", action="append", metavar="FLAG=VALUE",
                    help=f"replace the fixed Delicious --set options {FIXED_SETS['delicious']}")
    ap.add_argument("--mnist-set", action="append", metavar="FLAG=VALUE",
                    help=f"replace the fixed MNIST --set options {FIXED_SETS['mnist']}")
    ap.add_argument("--gpflow-mnist-epochs", type=int, default=25,
                    help="25 epochs = 3 000 steps, about 100 s of fit on this VM")
    ap.add_argument("--gpflow-delicious-steps", type=int, default=100,
                    help="about 2-3 s a step on this VM; 0: report the row as not run")
    ap.add_argument("--gpflow-delicious-m", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="seconds; a run past it is killed and reported (default 1800)")
    ap.add_argument("--limit-rows", type=int, default=None,
                    help="smoke tests: the first N training and test rows of each set")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--pipeline", default=next((p for p in PIPELINE_CANDIDATES
                                                if os.path.exists(p)), "pipeline"))
    ap.add_argument("--fsgp-python", default=FSGP_PY)
    ap.add_argument("--peer-python", default=PEER_PY)
    ap.add_argument("--tmp", default=None, help="parent of the temporary directory")
    ap.add_argument("--logs", default=None, help="keep every run's log in this directory")
    ap.add_argument("--out", default=None, help="also write the Markdown table here")
    ap.add_argument("--json-out", default=None, help="every run's raw result as JSON")
    args = ap.parse_args()
    args.budgets = parse_budgets(args.budget)
    args.pipeline = os.path.abspath(args.pipeline) if os.path.exists(args.pipeline) \
        else args.pipeline
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
        args.logs = os.path.abspath(args.logs)

    tmp = tempfile.mkdtemp(prefix="python-bench-", dir=args.tmp)
    try:
        t = time.perf_counter()
        datasets = prepare(args, tmp)
        print(f"prepared the files in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        rows = build_rows(args, datasets)
        results = [[] for _ in rows]
        started = time.perf_counter()
        for rep in range(args.reps):
            for i, row in enumerate(rows):
                if row.get("skip"):
                    continue
                t = time.perf_counter()
                r = run_row(row, args, tmp, rep)
                results[i].append(r)
                load = "—" if r.get("load_s") is None else f"{r['load_s']:.2f}"
                brief = r.get("error") or (
                    f"load {load} s, "
                    f"fit {r['fit_s']:.2f} s, predict {r['predict_s']:.2f} s, "
                    f"peak {r['max_rss_mib']:.0f} MiB, {r['metrics']}")
                print(f"[rep {rep + 1}/{args.reps}, {time.perf_counter() - started:.0f} s] "
                      f"{row['data']} {row['tool']}: {brief} ({time.perf_counter() - t:.1f} s)",
                      file=sys.stderr, flush=True)
        try:
            commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = "?"
        head = [
            f"python-bench.py, {datetime.date.today()}, {os.cpu_count()} cores, "
            f"{args.reps} rep(s) per row, interleaved; checkout {commit or '?'}, "
            f"pipeline {args.pipeline}"
            + (f"; FIRST {args.limit_rows} ROWS ONLY (smoke test)" if args.limit_rows else ""),
            f"Cells: mean (min–max). Peak MiB: max RSS of the run's process "
            f"({'GNU time %M' if os.path.exists(TIME) else 'wait4'}; fsgp-cli: the "
            f"larger of fit's and predict's). fsgp budgets: fixed {args.budgets}, "
            f"default row {args.default_budget}.",
        ]
        table = render(rows, results, args, head)
        print(table)
        if args.out:
            with open(args.out, "w") as f:
                f.write(table)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump([{k: v for k, v in row.items() if k != "ds"} | {"runs": res}
                           for row, res in zip(rows, results)], f, indent=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
