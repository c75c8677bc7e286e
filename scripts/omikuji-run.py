#!/usr/bin/env python3
"""omikuji (default hyper-parameters) on one XML-repository-format train/test pair: prints one
JSON object with the training seconds (train_on_data only) and test P@1/3/5, with label-less
test rows counted as zero (as `pipeline evaluate` does by default) and left out (as
../shared/data/dev/README.md reports omikuji's figures).

Usage: scripts/omikuji-run.py TRAIN TEST [--threads 2]
Files may be gzip; omikuji reads plain text, so a gzip file is decompressed to a temporary
file first (not timed).
"""
import argparse
import gzip
import json
import os
import shutil
import tempfile
import time

import omikuji


def plain(path, tmp):
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic != b"\x1f\x8b":
        return path
    out = os.path.join(tmp, os.path.basename(path)[:-3] or "data.txt")
    with gzip.open(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def rows(path):
    with open(path) as f:
        f.readline()
        for line in f:
            parts = line.rstrip("\n").split(" ")
            head = parts[0] if parts else ""
            if head and ":" not in head:
                labels, feats = {int(x) for x in head.split(",") if x}, parts[1:]
            elif head == "":
                labels, feats = set(), parts[1:]
            else:
                labels, feats = set(), parts
            yield labels, [(int(a), float(b)) for a, b in (t.split(":") for t in feats if t)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("test")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        train, test = plain(a.train, tmp), plain(a.test, tmp)
        hp = omikuji.Model.default_hyper_param()
        started = time.perf_counter()
        model = omikuji.Model.train_on_data(train, hp, n_threads=a.threads)
        seconds = time.perf_counter() - started
        hits, n_all, n_labelled = [0, 0, 0], 0, 0
        for labels, fv in rows(test):
            n_all += 1
            if not labels:
                continue
            n_labelled += 1
            top = [l for l, _ in model.predict(fv, top_k=5)]
            for j, k in enumerate((1, 3, 5)):
                hits[j] += sum(1 for l in top[:k] if l in labels)
    p = lambda n: [100.0 * hits[j] / (n * k) for j, k in enumerate((1, 3, 5))]
    print(json.dumps({"tool": "omikuji", "version": "0.5.2", "train_seconds": seconds,
                      "p_at_135_counted": p(n_all), "p_at_135_skipped": p(n_labelled),
                      "test_rows": n_all, "labelled_test_rows": n_labelled}))


if __name__ == "__main__":
    main()
