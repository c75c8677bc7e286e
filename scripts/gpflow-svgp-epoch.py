#!/usr/bin/env python3
"""Seconds per epoch of GPflow's SVGP on MNIST odd vs even, for BENCHMARKS.md's ratio
against `pipeline train` on the same machine (optional: needs gpflow and tensorflow, which
the project does not depend on).

The model is the one fsgp's `--task binary --likelihood probit --q-form whitened` trains:
one latent GP, SE kernel, M inducing inputs trained in input space, whitened full-Cholesky
q(u), the Bernoulli likelihood with the probit link (GPflow's default) and Gauss-Hermite
quadrature for the expected log-likelihood, Adam with eta = 0.01 on minibatches of B rows.
The whole training set is held in memory, as GPflow needs; the inducing inputs start at M
rows drawn with the seed (the start does not change the cost of a step).

With --classes K (K > 2) the model is instead the one fsgp's `--task multiclass --latent
independent --likelihood robust-max` trains: K latent GPs sharing the SE kernel's
hyperparameters and the M inducing inputs (GPflow's SharedIndependent kernel and inducing
variables), a whitened full-Cholesky q(u) per GP, and GPflow's MultiClass likelihood with
RobustMax (epsilon = 1e-3, fixed, as fsgp's default) and its Gauss-Hermite expectation;
the labels are the class integers 0..K-1.

Usage: scripts/gpflow-svgp-epoch.py TRAIN.txt.gz [--inducing 200] [--batch 500]
       [--epochs 3] [--threads 2] [--classes K]
Prints one line per epoch (seconds, mean minibatch ELBO) and the mean of the epochs after
the first (the first includes tracing the step function).
"""
import argparse
import gzip
import time

import numpy as np


def read_libsvm(path, features, classes=2):
    """Rows of `label idx:val ...` (1-based indices) as a dense float64 matrix and labels:
    {0, 1} for two classes (from ±1 or 0/1), else the class integers as given."""
    rows, labels = [], []
    with gzip.open(path, "rt") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            x = np.zeros(features)
            for tok in parts[1:]:
                idx, val = tok.split(":")
                x[int(idx) - 1] = float(val)
            rows.append(x)
            labels.append(float(parts[0]))
    y = np.array(labels)
    if classes == 2:
        # Labels ±1 or 0/1 → {0, 1}.
        y = (y > 0).astype(np.float64)
    return np.vstack(rows), y[:, None]


def build_model(gpflow, z, n, classes):
    """The SVGP of the module docstring: Bernoulli for two classes, else RobustMax."""
    if classes == 2:
        return gpflow.models.SVGP(
            kernel=gpflow.kernels.SquaredExponential(),
            likelihood=gpflow.likelihoods.Bernoulli(),
            inducing_variable=z,
            num_data=n,
            whiten=True,
            q_diag=False,
        )
    kernel = gpflow.kernels.SharedIndependent(
        gpflow.kernels.SquaredExponential(), output_dim=classes
    )
    inducing = gpflow.inducing_variables.SharedIndependentInducingVariables(
        gpflow.inducing_variables.InducingPoints(z)
    )
    likelihood = gpflow.likelihoods.MultiClass(
        classes, invlink=gpflow.likelihoods.RobustMax(classes)
    )
    return gpflow.models.SVGP(
        kernel=kernel,
        likelihood=likelihood,
        inducing_variable=inducing,
        num_latent_gps=classes,
        num_data=n,
        whiten=True,
        q_diag=False,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("--features", type=int, default=784)
    ap.add_argument("--inducing", type=int, default=200)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--classes", type=int, default=2)
    args = ap.parse_args()

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import gpflow

    x, y = read_libsvm(args.train, args.features, args.classes)
    n = x.shape[0]
    rng = np.random.default_rng(args.seed)
    z = x[rng.choice(n, args.inducing, replace=False)].copy()
    model = build_model(gpflow, z, n, args.classes)
    opt = tf.optimizers.Adam(learning_rate=0.01)
    steps = n // args.batch
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(n, seed=args.seed, reshuffle_each_iteration=True)
        .batch(args.batch, drop_remainder=True)
    )

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            loss = -model.elbo(batch)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return -loss

    seconds = []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        total = 0.0
        for batch in data:
            total += float(step(batch))
        seconds.append(time.perf_counter() - start)
        print(f"epoch {epoch + 1}/{args.epochs}: {seconds[-1]:.2f} s, "
              f"mean minibatch ELBO {total / steps:.6e}")
    later = seconds[1:] or seconds
    print(f"mean s/epoch after the first: {sum(later) / len(later):.2f} "
          f"(M = {args.inducing}, B = {args.batch}, K = {args.classes}, {steps} steps an epoch, "
          f"gpflow {gpflow.__version__}, tensorflow {tf.__version__})")


if __name__ == "__main__":
    main()
