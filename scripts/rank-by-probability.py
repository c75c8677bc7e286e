#!/usr/bin/env python3
"""P@1/3/5 of a multi-label prediction file ranked two ways: by the predictive mean f̄
(how `pipeline predict` ranks) and, among the labels the file kept, by the predictive
probability E_q[σ(f)] it wrote (`pipeline predict --top-k K --probabilities`).

    scripts/rank-by-probability.py WORKSPACE DATASET SPLIT PREDICTIONS.parquet

Reads the split's true labels from the dataset's registered chunks (label-less rows count
as zero, as `pipeline evaluate` counts them by default) and prints one JSON object."""
import glob
import json
import sys

import numpy as np
import pyarrow.parquet as pq


def main():
    workspace, dataset, split, predictions = sys.argv[1:5]
    truth = {}
    chunks = glob.glob(f"{workspace}/datasets/{dataset}.run*/{split}/*.parquet")
    if not chunks:
        sys.exit(f"no chunks of {dataset}'s {split} split under {workspace}/datasets")
    for f in chunks:
        t = pq.read_table(f, columns=["row_id", "labels"]).to_pydict()
        truth.update({r: set(l) for r, l in zip(t["row_id"], t["labels"])})
    p = pq.read_table(predictions).to_pydict()
    if "probabilities" not in p:
        sys.exit(f"{predictions} has no probabilities column: predict with --probabilities")

    def p_at(by, k):
        hits = 0.0
        for row, labels, scores, probs in zip(
            p["row_id"], p["labels"], p["scores"], p["probabilities"]
        ):
            key = np.asarray(scores if by == "mean" else probs)
            top = np.argsort(-key, kind="stable")[:k]
            hits += sum(labels[i] in truth[row] for i in top) / k
        return 100.0 * hits / len(p["row_id"])

    out = {
        "predictions": predictions,
        "rows": len(p["row_id"]),
        "kept": max(len(l) for l in p["labels"]),
        "by_mean": [round(p_at("mean", k), 2) for k in (1, 3, 5)],
        "by_probability": [round(p_at("probability", k), 2) for k in (1, 3, 5)],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
