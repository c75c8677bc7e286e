#!/usr/bin/env python3
"""Time to accuracy baseline for issue 33: omikuji (default hyper-parameters, 2 threads) on
Delicious, trained on the full training file and on the same 80 % of its rows that
`pipeline ingest --validation-fraction 0.2 --validation-seed 0` keeps for training.

The carve is reproduced exactly: a training row with 0-based data-row index i goes to
validation iff XXH3_64(i as 8 little-endian bytes, seed) < floor(F * 2^64)
(src/ingest/validation.rs); XXH3 is called from the system's libxxhash through ctypes.

Usage: scripts/tta-omikuji.py [--data DIR] [--out DIR] [--reps 3]
Prints one line per training: wall seconds of train_on_data only, validation and test P@1/3/5
(every row counted, a row without labels scores 0, as `pipeline evaluate` does by default).
"""
import argparse
import ctypes
import os
import sys
import time

import omikuji

lib = ctypes.CDLL("libxxhash.so.0")
xxh3 = lib.XXH3_64bits_withSeed
xxh3.restype = ctypes.c_uint64
xxh3.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64]


def selects(i, fraction, seed):
    return xxh3(i.to_bytes(8, "little"), 8, seed) < int(fraction * 18446744073709551616.0)


def read(path):
    with open(path) as f:
        header = f.readline()
        lines = [l.rstrip("\n") for l in f]
    return header.split(), lines


def parse_row(line):
    parts = line.split(" ")
    if parts and parts[0] and ":" not in parts[0]:
        labels, feats = [int(x) for x in parts[0].split(",") if x], parts[1:]
    elif parts and parts[0] == "":
        labels, feats = [], parts[1:]
    else:
        labels, feats = [], parts
    return set(labels), [(int(a), float(b)) for a, b in (t.split(":") for t in feats if t)]


def write(path, header, lines):
    with open(path, "w") as f:
        f.write(f"{len(lines)} {header[1]} {header[2]}\n")
        for l in lines:
            f.write(l + "\n")


def p_at(model, rows):
    hits = [0, 0, 0]
    for labels, fv in rows:
        pred = [l for l, _ in model.predict(fv, top_k=5)]
        for j, k in enumerate((1, 3, 5)):
            hits[j] += sum(1 for l in pred[:k] if l in labels)
    n = len(rows)
    return [100.0 * hits[j] / (n * k) for j, k in enumerate((1, 3, 5))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "delicious"))
    ap.add_argument("--out", default="tta-omikuji")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    header, lines = read(os.path.join(a.data, "train.txt"))
    train80 = [l for i, l in enumerate(lines) if not selects(i, a.fraction, a.seed)]
    val = [l for i, l in enumerate(lines) if selects(i, a.fraction, a.seed)]
    f80 = os.path.join(a.out, "train80.txt")
    write(f80, header, train80)
    write(os.path.join(a.out, "validation.txt"), header, val)
    print(f"carve: {len(train80)} train rows, {len(val)} validation rows", flush=True)
    _, tlines = read(os.path.join(a.data, "test.txt"))
    test_rows = [parse_row(l) for l in tlines]
    val_rows = [parse_row(l) for l in val]
    hp = omikuji.Model.default_hyper_param()
    for name, path in (("train80", f80), ("full", os.path.join(a.data, "train.txt"))):
        for r in range(a.reps):
            t = time.perf_counter()
            m = omikuji.Model.train_on_data(path, hp, n_threads=2)
            secs = time.perf_counter() - t
            m.init_prediction_thread_pool(2)
            v = p_at(m, val_rows) if name == "train80" else None
            te = p_at(m, test_rows)
            vs = "validation P@1/3/5 " + " / ".join(f"{x:.2f}" for x in v) + "; " if v else ""
            print(f"omikuji {name} rep {r}: train {secs:.2f} s; {vs}test P@1/3/5 "
                  + " / ".join(f"{x:.2f}" for x in te), flush=True)


if __name__ == "__main__":
    main()
