#!/usr/bin/env python3
"""Does averaging two candidates help? Trains each run of RUNS on SET's selection split
(the training file with fit's 0.2 validation carve), predicts the validation split with
E[σ(f_k)] (`predict --probabilities`), and prints one JSON line: each run's validation
P@1 and that of every pair's averaged probabilities. Never reads the test file.

    scripts/ensemble-validation.py PIPELINE TRAIN WORKSPACE RUNS.json TOP_K

RUNS.json maps a tag to [svd options, train options, steps], e.g.
    {"axes": ["--rank 1 --inducing 1", "--kernel linear --inducing-inputs axes --lr 0.05", 1000]}
TOP_K: labels kept per row (at most L). Needs pyarrow.
"""
import glob
import itertools
import json
import subprocess
import sys

import pyarrow.parquet as pq


def main():
    binary, train, ws, runs_file, top_k = sys.argv[1:6]
    runs = json.load(open(runs_file))

    def p(*args):
        done = subprocess.run([binary, "--workspace", ws, "--quiet", *args],
                              capture_output=True, text=True)
        if done.returncode:
            sys.exit(done.stderr[-3000:])
        return done.stdout

    def newest(kind, stage=None):
        st = json.loads(p("status", "--json"))
        if kind == "svd":
            return max(r["id"] for r in st["runs"] if r["stage"] == "svd" and r["status"] == "ok")
        return max(r["id"] for r in st["train_runs"])

    p("ingest", "--name", "s", "--train", train, "--validation-fraction", "0.2",
      "--transform", "auto")
    val = pq.read_table(glob.glob(f"{ws}/datasets/s.*/validation/*.parquet")[0]).to_pylist()
    truth = {r["row_id"]: set(r["labels"]) for r in val if r["labels"]}
    svds, preds = {}, {}
    for tag, (svd, options, steps) in runs.items():
        if svd not in svds:
            p("svd", "--dataset", "s", "--threads", "2", *svd.split())
            svds[svd] = newest("svd")
        p("train", "--dataset", "s", "--svd", str(svds[svd]), "--threads", "2", "--fresh",
          "--no-final-elbo", "--steps", str(steps), "--max-steps", str(steps), *options.split())
        run = newest("train")
        p("predict", "--run", str(run), "--split", "validation", "--probabilities",
          "--top-k", top_k)
        newest_file = max(glob.glob(f"{ws}/predictions/*"),
                          key=lambda f: int(f.rsplit("run", 1)[1]))
        preds[tag] = {r["row_id"]: dict(zip(r["labels"], r["probabilities"]))
                      for r in pq.read_table(newest_file).to_pylist()}

    def p_at_1(scores):
        return round(100 * sum(max(scores[i], key=scores[i].get) in y
                               for i, y in truth.items()) / len(truth), 2)

    result = {tag: p_at_1(pr) for tag, pr in preds.items()}
    for a, b in itertools.combinations(preds, 2):
        mean = {i: {k: (preds[a][i].get(k, 0.0) + preds[b][i].get(k, 0.0)) / 2
                    for k in preds[a][i].keys() | preds[b][i].keys()} for i in truth}
        result[f"{a}+{b}"] = p_at_1(mean)
    print(json.dumps({"train": train, "runs": runs, "validation_p_at_1": result}))


if __name__ == "__main__":
    main()
