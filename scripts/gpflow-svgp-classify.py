#!/usr/bin/env python3
"""Test accuracy and NLP of GPflow's SVGP (Hensman et al. 2015) on the LIBSVM classification
sets, on raw and on z-scored features: the reference column of docs/fit.md's table (optional:
needs gpflow and tensorflow, which the project does not depend on).

Usage: scripts/gpflow-svgp-classify.py [--data ../shared/data] [--sets banana spambase ...]
           [--out results.tsv] [--summary summary.md]

Fixed settings (same for every set):
  model        gpflow.models.SVGP, whiten=True, q_diag=False
  kernel       SquaredExponential, single lengthscale, init lengthscale 1, variance 1
  inducing     M = 100, trainable Z, init by numpy Lloyd k-means (10 iterations,
               centres start at M distinct random training rows, run seed) on the
               training inputs as transformed (raw or zscore)
  likelihood   binary: Bernoulli (probit invlink), 1 latent GP
               K>2   : Softmax(K), num_latent_gps = K
  optimiser    Adam lr 0.01, 3000 steps, minibatch 500 (min(500, N)); batches are
               consecutive slices of a stream of per-epoch random permutations (seeded)
  training     tf.function-compiled step, float64
  variants     raw (as in file), zscore (train mean / train sd, sd 0 -> 1)
  seeds        0, 1, 2 (np.random.seed + tf.random.set_seed)
  threads      TF intra-op 1, inter-op 1; runs sequential
  metrics      test accuracy (%) from predict_y (binary p>0.5, multi argmax),
               NLP = mean -log p(true class) (p clipped at 1e-12),
               train_seconds = wall clock of the 3000 steps (includes tf.function trace)
"""
import argparse
import gzip
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import gpflow  # noqa: E402

M = 100
KMEANS_ITERS = 10
LR = 0.01
BATCH = 500
STEPS = 3000
SEEDS = [0, 1, 2]
VARIANTS = ["raw", "zscore"]
SETS = {
    "banana": "classification/banana",
    "spambase": "dev/spambase",
    "satimage": "dev/satimage",
    "mnist-oddeven": "classification/mnist-oddeven",
}
DATA = "../shared/data"


def read_libsvm(path):
    labels, rows = [], []
    maxidx, minidx = 0, None
    with gzip.open(path, "rt") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            labels.append(float(parts[0]))
            r = []
            for tok in parts[1:]:
                i, v = tok.split(":")
                i = int(i)
                r.append((i, float(v)))
                maxidx = max(maxidx, i)
                minidx = i if minidx is None else min(minidx, i)
            rows.append(r)
    return np.array(labels), rows, minidx, maxidx


def densify(rows, D, base):
    X = np.zeros((len(rows), D), dtype=np.float64)
    for n, r in enumerate(rows):
        for i, v in r:
            X[n, i - base] = v
    return X


def load(data, name):
    d = os.path.join(data, SETS[name])
    ytr, rtr, mn1, mx1 = read_libsvm(os.path.join(d, "train.txt.gz"))
    yte, rte, mn2, mx2 = read_libsvm(os.path.join(d, "test.txt.gz"))
    base = 0 if min(mn1, mn2) == 0 else 1  # indices are 1-based unless a 0 index appears
    D = max(mx1, mx2) + (1 - base)
    Xtr, Xte = densify(rtr, D, base), densify(rte, D, base)
    classes = np.unique(ytr)
    lut = {c: k for k, c in enumerate(classes)}
    Ytr = np.array([lut[c] for c in ytr], dtype=np.int64)
    Yte = np.array([lut[c] for c in yte], dtype=np.int64)  # KeyError if unseen test label
    return Xtr, Ytr, Xte, Yte, len(classes), base


def transform(Xtr, Xte, variant):
    if variant == "raw":
        return Xtr, Xte
    mu = Xtr.mean(0)
    sd = Xtr.std(0)
    sd[sd == 0] = 1.0
    return (Xtr - mu) / sd, (Xte - mu) / sd


def kmeans(X, k, iters, rng):
    C = X[rng.choice(len(X), size=k, replace=False)].copy()
    x2 = (X * X).sum(1)
    for _ in range(iters):
        d2 = x2[:, None] - 2.0 * X @ C.T + (C * C).sum(1)[None, :]
        a = d2.argmin(1)
        for j in range(k):
            m = a == j
            if m.any():  # empty cluster keeps its previous centre
                C[j] = X[m].mean(0)
    return C


def run(name, data, variant, seed, steps, outfile):
    Xtr0, Ytr, Xte0, Yte, K, _ = data
    Xtr, Xte = transform(Xtr0, Xte0, variant)
    N, D = Xtr.shape
    np.random.seed(seed)
    tf.random.set_seed(seed)
    rng = np.random.RandomState(seed)
    Z = kmeans(Xtr, M, KMEANS_ITERS, rng)

    kern = gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=1.0)
    if K == 2:
        lik = gpflow.likelihoods.Bernoulli()
        L = 1
    else:
        lik = gpflow.likelihoods.Softmax(K)
        L = K
    model = gpflow.models.SVGP(kern, lik, gpflow.inducing_variables.InducingPoints(Z),
                               num_latent_gps=L, whiten=True, q_diag=False, num_data=N)

    B = min(BATCH, N)
    # index stream: concatenated per-epoch permutations, consecutive slices of B
    need = steps * B
    perms = [rng.permutation(N) for _ in range(need // N + 1)]
    stream = np.concatenate(perms)[:need].reshape(steps, B)
    # Bernoulli wants float 0/1 labels; Softmax wants integer class indices
    Yf = (Ytr.astype(np.float64) if K == 2 else Ytr.astype(np.int64))[:, None]

    opt = tf.optimizers.Adam(learning_rate=LR)
    loss_fn = model.training_loss  # takes (X, Y)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn((xb, yb))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    t0 = time.perf_counter()
    first = None
    for s in range(steps):
        idx = stream[s]
        loss = step(tf.constant(Xtr[idx]), tf.constant(Yf[idx]))
        if s == 0:
            loss.numpy()
            first = time.perf_counter() - t0
    final_loss = float(loss.numpy())
    secs = time.perf_counter() - t0

    probs = []
    for i in range(0, len(Xte), 1000):
        m, _ = model.predict_y(tf.constant(Xte[i:i + 1000]))
        probs.append(m.numpy())
    P = np.concatenate(probs)
    if K == 2:
        p1 = P[:, 0]
        pred = (p1 > 0.5).astype(np.int64)
        ptrue = np.where(Yte == 1, p1, 1.0 - p1)
    else:
        pred = P.argmax(1)
        ptrue = P[np.arange(len(Yte)), Yte]
    acc = 100.0 * (pred == Yte).mean()
    nlp = float(-np.log(np.clip(ptrue, 1e-12, None)).mean())
    with open(outfile, "a") as f:
        f.write(f"{name}\t{variant}\t{seed}\t{acc:.4f}\t{nlp:.6f}\t{secs:.2f}\n")
    ls = float(model.kernel.lengthscales.numpy())
    var = float(model.kernel.variance.numpy())
    print(f"{name} {variant} seed={seed} N={N} D={D} K={K} B={B} acc={acc:.2f} nlp={nlp:.4f} "
          f"secs={secs:.1f} (first step {first:.1f}s) final_minibatch_loss={final_loss:.3f} "
          f"lengthscale={ls:.4g} variance={var:.4g}", flush=True)


def summarize(infile, outfile):
    rows = [l.rstrip("\n").split("\t") for l in open(infile) if l.strip()]
    order = []
    agg = {}
    for r in rows:
        key = (r[0], r[1])
        if key not in agg:
            agg[key] = []
            order.append(key)
        agg[key].append((float(r[3]), float(r[4]), float(r[5])))
    with open(outfile, "w") as f:
        f.write(f"# GPflow SVGP baseline\n\n")
        f.write(f"gpflow {gpflow.__version__}, tensorflow {tf.__version__}, numpy {np.__version__}; "
                f"1 TF thread (intra 1, inter 1).\n\n")
        f.write(f"Settings: SVGP, SE kernel (single lengthscale, init ls 1, var 1), M={M} inducing "
                f"(numpy Lloyd k-means {KMEANS_ITERS} iters, seeded, trainable Z), whiten=True, "
                f"q_diag=False; Bernoulli(probit) 1 latent GP for binary, Softmax(K) with K latent GPs "
                f"for multi-class; Adam lr {LR}, minibatch {BATCH} (min(500,N)), {STEPS} steps, "
                f"tf.function, float64. Mean ± sd (ddof=1) over seeds.\n\n")
        f.write("| set | variant | seeds | accuracy % | NLP | train s |\n|---|---|---|---|---|---|\n")
        for key in order:
            a = np.array(agg[key])
            n = len(a)
            sd = a.std(0, ddof=1) if n > 1 else np.full(3, np.nan)
            f.write(f"| {key[0]} | {key[1]} | {n} | {a[:,0].mean():.2f} ± {sd[0]:.2f} | "
                    f"{a[:,1].mean():.4f} ± {sd[1]:.4f} | {a[:,2].mean():.1f} ± {sd[2]:.1f} |\n")
    print(open(outfile).read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", nargs="+", default=["banana", "spambase", "satimage", "mnist-oddeven"])
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    ap.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--out", default="gpflow-svgp-classify.tsv")
    ap.add_argument("--summary", default=None)
    ap.add_argument("--summary-only", action="store_true")
    a = ap.parse_args()
    if not a.summary_only:
        print(f"gpflow {gpflow.__version__} tensorflow {tf.__version__} numpy {np.__version__} "
              f"M={M} kmeans_iters={KMEANS_ITERS} lr={LR} batch={BATCH} steps={a.steps}", flush=True)
        for name in a.sets:
            t = time.perf_counter()
            data = load(a.data, name)
            Xtr, Ytr, Xte, Yte, K, base = data
            print(f"loaded {name}: train {Xtr.shape} test {Xte.shape} K={K} index_base={base} "
                  f"({time.perf_counter()-t:.1f}s)", flush=True)
            for variant in a.variants:
                for seed in a.seeds:
                    run(name, data, variant, seed, a.steps, a.out)
    if a.summary:
        summarize(a.out, a.summary)


if __name__ == "__main__":
    main()
