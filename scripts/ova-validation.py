#!/usr/bin/env python3
"""An outside reference for the linear models: one-vs-rest logistic regression
(scikit-learn's liblinear, L2 penalty, C from a grid) on l2-normalised rows, trained on the
rows outside fit's validation carve and scored on the carve (label-less rows counted as
zero, evaluate's default). The carve is scripts/omikuji-validation.py's (src/ingest/
validation.rs's xxh3 row hash). Prints one JSON line per C.

With --test TEST it trains on every training row and scores TEST instead: a reference for
what a linear model reaches on the test split, never a way to choose C (fit's figures are
compared with it, not tuned on it).

Usage: scripts/ova-validation.py TRAIN [--test TEST] [--c 1,4,16,64] [--fraction 0.2] [--seed 0]
Files may be gzip. Needs numpy, scipy, scikit-learn and xxhash.
"""
import argparse
import gzip
import json
import struct

import numpy as np
import scipy.sparse as sp
import xxhash
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import normalize


def read(path, fraction, seed):
    """(X [N×D] l2-normalised CSR, labels per row, L, carved mask)."""
    threshold = int(fraction * 2**64)
    rows, cols, vals, labels, held = [], [], [], [], []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        _, d, n_labels = map(int, f.readline().split())
        for i, line in enumerate(f):
            parts = line.rstrip("\n").split(" ")
            head = parts[0]
            labels.append([int(x) for x in head.split(",") if x] if ":" not in head else [])
            for t in parts[1:] if ":" not in head else parts:
                if t:
                    c, v = t.split(":")
                    rows.append(i)
                    cols.append(int(c))
                    vals.append(float(v))
            held.append(xxhash.xxh3_64_intdigest(struct.pack("<Q", i), seed=seed) < threshold)
    x = normalize(sp.csr_matrix((vals, (rows, cols)), shape=(len(labels), d)))
    return x, labels, n_labels, np.array(held)


def p_at_1(scores, labels):
    return 100.0 * np.mean([s.argmax() in y for s, y in zip(scores, labels)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("--test")
    ap.add_argument("--c", default="1,4,16,64")
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    x, labels, n_labels, held = read(a.train, a.fraction, a.seed)
    fit_rows, val_rows = np.where(~held)[0], np.where(held)[0]
    split = "validation"
    if a.test:
        # Every training row fits; the test rows stand where the carve stood.
        xt, labels_t, _, _ = read(a.test, a.fraction, a.seed)
        n = x.shape[0]
        x = sp.vstack([x, xt[:, : x.shape[1]]]).tocsr()
        labels = labels + labels_t
        fit_rows, val_rows, split = np.arange(n), np.arange(n, n + xt.shape[0]), "test"
    for c in (float(v) for v in a.c.split(",")):
        val = np.full((len(val_rows), n_labels), -np.inf)
        fit = np.full((len(fit_rows), n_labels), -np.inf)
        for k in range(n_labels):
            y = np.array([k in labels[i] for i in fit_rows])
            if 0 < y.sum() < len(y):
                m = LogisticRegression(C=c, solver="liblinear").fit(x[fit_rows], y)
                val[:, k] = m.decision_function(x[val_rows])
                fit[:, k] = m.decision_function(x[fit_rows])
        print(json.dumps({
            "tool": "one-vs-rest logistic regression (scikit-learn, liblinear)", "C": c,
            "features": "l2", "split": split, "test": a.test, "fraction": a.fraction if not a.test else None, "seed": a.seed,
            "rows": len(val_rows), "fit_rows": len(fit_rows),
            "p_at_1": round(p_at_1(val, [labels[i] for i in val_rows]), 2),
            "training_p_at_1": round(p_at_1(fit, [labels[i] for i in fit_rows]), 2),
        }), flush=True)


if __name__ == "__main__":
    main()
