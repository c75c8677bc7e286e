#!/usr/bin/env python3
"""The rates of fit's svd-time prediction (src/fit/sizes.rs, `svd_run_seconds`): a
non-negative least-squares fit, in relative error, of each svd run's seconds (the svd's own
"total" line) to D·k², nnz·k, N·k² and N·k with k = R + 20. Reads JSON lines with n, d, nnz,
rank, oversample and svd_seconds (docs/experiments/data/svd-seconds-fit.jsonl); prints the
rates and each run's prediction as JSON.

Usage: scripts/svd-time-fit.py [RUNS.jsonl]
Needs numpy and scipy.
"""
import json
import sys

import numpy as np
from scipy.optimize import nnls

TERMS = ["d_k2", "nnz_k", "n_k2", "n_k"]


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "docs/experiments/data/svd-seconds-fit.jsonl"
    runs = [json.loads(line) for line in open(path)]
    rows = []
    for r in runs:
        k = r["rank"] + r["oversample"]
        rows.append([r["d"] * k * k, r["nnz"] * k, r["n"] * k * k, r["n"] * k])
    x, y = np.array(rows, dtype=float), np.array([r["svd_seconds"] for r in runs])
    rates, _ = nnls(x / y[:, None], np.ones(len(y)))
    print(json.dumps({"rates": dict(zip(TERMS, rates.tolist()))}))
    for r, row in zip(runs, x):
        predicted = float(row @ rates)
        print(json.dumps({"run": r["run"], "rank": r["rank"], "measured": r["svd_seconds"],
                          "predicted": round(predicted, 2),
                          "ratio": round(predicted / r["svd_seconds"], 2)}))


if __name__ == "__main__":
    main()
