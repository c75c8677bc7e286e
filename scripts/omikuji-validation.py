#!/usr/bin/env python3
"""omikuji (default hyper-parameters) on the same validation carve as
`pipeline ingest --validation-fraction F --validation-seed S`: trains on the training file's
rows outside the carve, scores P@1/3/5 on the carved rows (label-less rows counted as zero,
evaluate's default). The test file is never read. Prints one JSON line.

The carve is src/ingest/validation.rs's: row i (0-based among the data rows) is validation
iff xxh3_64(i as 8 little-endian bytes, seed = S) < floor(F * 2^64).

Usage: scripts/omikuji-validation.py TRAIN [--fraction 0.2] [--seed 0] [--threads 2]
"""
import argparse
import json
import os
import struct
import tempfile
import time

import omikuji
import xxhash


def carved(i, threshold, seed):
    return xxhash.xxh3_64_intdigest(struct.pack("<Q", i), seed=seed) < threshold


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    threshold = int(a.fraction * 2**64)
    with open(a.train) as f:
        n, d, l = f.readline().split()
        fit, held = [], []
        for i, line in enumerate(f):
            (held if carved(i, threshold, a.seed) else fit).append(line)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fit.txt")
        with open(path, "w") as out:
            out.write(f"{len(fit)} {d} {l}\n")
            out.writelines(fit)
        started = time.perf_counter()
        model = omikuji.Model.train_on_data(path, omikuji.Model.default_hyper_param(),
                                            n_threads=a.threads)
        seconds = time.perf_counter() - started
    hits = [0.0, 0.0, 0.0]
    for line in held:
        parts = line.rstrip("\n").split(" ")
        head = parts[0]
        labels = {int(x) for x in head.split(",") if x} if ":" not in head else set()
        feats = parts[1:] if ":" not in head else parts
        pairs = [(int(k), float(v)) for k, v in (t.split(":") for t in feats if t)]
        top = [lab for lab, _ in model.predict(pairs, top_k=5)]
        for j, k in enumerate((1, 3, 5)):
            hits[j] += sum(lab in labels for lab in top[:k]) / k
    print(json.dumps({
        "tool": "omikuji", "version": "0.5.2", "split": "validation",
        "fraction": a.fraction, "seed": a.seed, "fit_rows": len(fit), "rows": len(held),
        "train_seconds": round(seconds, 2),
        "p_at_135": [round(100 * h / len(held), 2) for h in hits],
    }))


if __name__ == "__main__":
    main()
