#!/usr/bin/env python3
"""Time to accuracy baseline for issue 33: GPflow's SVGP on MNIST odd vs even trained as GPflow
documents for non-conjugate likelihoods: natural gradients on q(u) = (q_mu, q_sqrt)
(gpflow.optimizers.NaturalGradient, Salimbeni et al. 2018) and Adam on the rest (kernel
hyperparameters and Z), q_mu / q_sqrt set non-trainable so Adam leaves them alone.

The training rows are the same 80 % that `pipeline ingest --validation-fraction 0.2
--validation-seed 0` keeps: a row with 0-based data-row index i goes to validation iff
XXH3_64(i as 8 little-endian bytes, seed) < floor(0.2 * 2^64) (src/ingest/validation.rs),
computed with the system libxxhash through ctypes. Inputs: raw pixels as in the file (fsgp's
mnist-oddeven ingest has no_normalize = true). Labels: the file's 1 is the positive class.

Settings: SVGP, whiten=True, full q_sqrt, SE kernel (variance 1, lengthscale from the median
pairwise distance of 1000 random training rows, as fsgp starts its SE lengthscale), M = 200
inducing inputs from numpy Lloyd k-means (10 iterations, k-means++ start) on the training
rows, trainable; Bernoulli likelihood (GPflow's default probit link unless --logistic);
minibatch 500 from per-epoch permutations; float64; --threads TF threads (intra-op; 2 by
default, the machine's cores, as fsgp uses). Both optimiser steps run in one tf.function.
--decay-at E1,E2 multiplies both gamma and Adam's rate by --decay (0.1) after those epochs,
the schedule fsgp's --lr-decay-at applies to both.

The clock: setup (k-means + lengthscale) is timed separately; training wall time is the sum
of step times (the first includes tf.function tracing); the validation scoring every
--eval-every steps is outside the clock. Each evaluation prints a TSV line:
  step  epoch  train_seconds  val_acc  val_nlp
and at the end (or --test-at STEP list) test accuracy / NLP of the parameters at those steps.

Usage: scripts/gpflow-svgp-natgrad.py [--gamma 0.1] [--lr 0.01] [--steps 1920]
           [--eval-every 48] [--seed 0] [--budget SECONDS] [--threads 2] [--batch 500]
           [--decay-at 20,25] [--decay 0.1] [--logistic]
"""
import argparse
import ctypes
import gzip
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import sys

THREADS = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 2
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(THREADS)
tf.config.threading.set_inter_op_parallelism_threads(1)

import gpflow  # noqa: E402
from gpflow.optimizers import NaturalGradient  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "classification", "mnist-oddeven")
D = 784

_lib = ctypes.CDLL("libxxhash.so.0")
_xxh3 = _lib.XXH3_64bits_withSeed
_xxh3.restype = ctypes.c_uint64
_xxh3.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64]


def carve(n, fraction, seed):
    thr = int(fraction * 18446744073709551616.0)
    return np.array([_xxh3(i.to_bytes(8, "little"), 8, seed) < thr for i in range(n)])


def read_libsvm(path):
    ys, rows = [], []
    with gzip.open(path, "rt") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            ys.append(float(parts[0]))
            rows.append([(int(i), float(v)) for i, v in (t.split(":") for t in parts[1:])])
    X = np.zeros((len(rows), D))
    for n, r in enumerate(rows):
        for i, v in r:
            X[n, i - 1] = v  # LIBSVM indices are 1-based
    return X, (np.array(ys) == 1).astype(np.float64)


def kmeans(X, k, iters, rng):
    # k-means++ start, then Lloyd; an empty cluster keeps its centre
    x2 = (X * X).sum(1)
    C = [X[rng.randint(len(X))]]
    d2 = x2 - 2 * X @ C[0] + C[0] @ C[0]
    for _ in range(1, k):
        p = np.maximum(d2, 0)
        j = rng.choice(len(X), p=p / p.sum())
        C.append(X[j])
        d2 = np.minimum(d2, x2 - 2 * X @ X[j] + X[j] @ X[j])
    C = np.array(C)
    for _ in range(iters):
        a = (x2[:, None] - 2 * X @ C.T + (C * C).sum(1)[None, :]).argmin(1)
        for j in range(k):
            m = a == j
            if m.any():
                C[j] = X[m].mean(0)
    return C


def median_distance(X, rows, rng):
    S = X[rng.choice(len(X), size=min(rows, len(X)), replace=False)]
    s2 = (S * S).sum(1)
    d2 = s2[:, None] + s2[None, :] - 2 * S @ S.T
    iu = np.triu_indices(len(S), 1)
    return float(np.median(np.sqrt(np.maximum(d2[iu], 0))))


def scores(model, X, y):
    ps = []
    for i in range(0, len(X), 2000):
        m, _ = model.predict_y(tf.constant(X[i:i + 2000]))
        ps.append(m.numpy()[:, 0])
    p = np.concatenate(ps)
    acc = 100.0 * ((p > 0.5) == (y == 1)).mean()
    pt = np.where(y == 1, p, 1 - p)
    return acc, float(-np.log(np.clip(pt, 1e-12, None)).mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gamma", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=1920)
    ap.add_argument("--eval-every", type=int, default=48)
    ap.add_argument("--budget", type=float, default=1e9, help="stop after this many training seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--inducing", type=int, default=200)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--logistic", action="store_true", help="Bernoulli with the logistic link")
    ap.add_argument("--adam-only", action="store_true", help="plain Adam on everything (no natgrad)")
    ap.add_argument("--threads", type=int, default=2, help="TF intra-op threads (read before TF starts)")
    ap.add_argument("--decay-at", default="", help="epochs after which gamma and the Adam rate decay")
    ap.add_argument("--decay", type=float, default=0.1)
    a = ap.parse_args()

    t = time.perf_counter()
    Xall, yall = read_libsvm(os.path.join(DATA, "train.txt.gz"))
    Xte, yte = read_libsvm(os.path.join(DATA, "test.txt.gz"))
    val = carve(len(Xall), 0.2, 0)
    Xtr, ytr, Xva, yva = Xall[~val], yall[~val], Xall[val], yall[val]
    print(f"# gpflow {gpflow.__version__} tensorflow {tf.__version__} numpy {np.__version__}; "
          f"train {len(Xtr)} validation {len(Xva)} test {len(Xte)} (load {time.perf_counter()-t:.1f} s)",
          flush=True)

    np.random.seed(a.seed)
    tf.random.set_seed(a.seed)
    rng = np.random.RandomState(a.seed)
    t = time.perf_counter()
    Z = kmeans(Xtr, a.inducing, 10, rng)
    ell = median_distance(Xtr, 1000, rng)
    setup = time.perf_counter() - t
    print(f"# setup (k-means M={a.inducing}, median lengthscale {ell:.3f}): {setup:.2f} s", flush=True)

    lik = gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid) if a.logistic else gpflow.likelihoods.Bernoulli()
    kern = gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=ell)
    model = gpflow.models.SVGP(kern, lik, gpflow.inducing_variables.InducingPoints(Z),
                               num_latent_gps=1, whiten=True, q_diag=False, num_data=len(Xtr))
    gamma = tf.Variable(a.gamma, dtype=tf.float64, trainable=False)
    adam = tf.optimizers.Adam(learning_rate=a.lr)
    if not a.adam_only:
        gpflow.set_trainable(model.q_mu, False)
        gpflow.set_trainable(model.q_sqrt, False)
        natgrad = NaturalGradient(gamma=gamma)
    decay_at = [int(e) for e in a.decay_at.split(",") if e]

    Y = ytr[:, None]

    @tf.function
    def step(xb, yb):
        loss = lambda: model.training_loss((xb, yb))  # noqa: E731
        if not a.adam_only:
            natgrad.minimize(loss, [(model.q_mu, model.q_sqrt)])
        with tf.GradientTape() as tape:
            value = loss()
        variables = model.trainable_variables
        adam.apply_gradients(zip(tape.gradient(value, variables), variables))

    N, B = len(Xtr), a.batch
    per_epoch = N // B  # whole minibatches; the remainder of a permutation is dropped
    print("step\tepoch\ttrain_seconds\tval_acc\tval_nlp", flush=True)
    clock = 0.0
    perm = None
    snapshots = {}
    for s in range(1, a.steps + 1):
        k = (s - 1) % per_epoch
        if k == 0:
            perm = rng.permutation(N)
            factor = a.decay ** sum(1 for e in decay_at if e <= (s - 1) // per_epoch)
            adam.learning_rate.assign(a.lr * factor)
            gamma.assign(a.gamma * factor)
        idx = perm[k * B:(k + 1) * B]
        xb, yb = tf.constant(Xtr[idx]), tf.constant(Y[idx])
        t = time.perf_counter()
        step(xb, yb)
        model.q_mu.numpy()  # wait for the step
        clock += time.perf_counter() - t
        if s % a.eval_every == 0 or s == a.steps or clock >= a.budget:
            acc, nlp = scores(model, Xva, yva)
            print(f"{s}\t{s / per_epoch:.2f}\t{clock:.2f}\t{acc:.2f}\t{nlp:.5f}", flush=True)
            snapshots[s] = gpflow.utilities.deepcopy(gpflow.utilities.parameter_dict(model))
            if not np.isfinite(nlp) or clock >= a.budget:
                break
    last = max(snapshots)
    for s in sorted(snapshots):
        gpflow.utilities.multiple_assign(model, snapshots[s])
        acc, nlp = scores(model, Xte, yte)
        print(f"# test at step {s}: accuracy {acc:.2f} NLP {nlp:.5f}", flush=True)
    print(f"# lengthscale {float(model.kernel.lengthscales.numpy()):.4g} variance "
          f"{float(model.kernel.variance.numpy()):.4g} (at step {last})", flush=True)


if __name__ == "__main__":
    main()
