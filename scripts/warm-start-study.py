#!/usr/bin/env python3
"""Validation P@1 of `pipeline train` runs against the steps they trained, read from
`pipeline status --run N --json` (the per-epoch figures `--eval-every` records), one JSON
line per run: the study behind fit's warm start at many labels
(docs/experiments/warm-start-and-prior-scale.md).

Usage:
  scripts/warm-start-study.py PIPELINE WORKSPACE DATASET TAG STEPS -- TRAIN-FLAGS...
      trains DATASET (ingested with a validation split, its svd run done) with TRAIN-FLAGS
      for STEPS steps, scoring the validation split every epoch, and prints the run's line;
  scripts/warm-start-study.py --table RESULTS.jsonl
      prints the table of those lines (mean of the last three scores, the best, the last).
Runs are memoised by their options: give each TAG's runs options of their own.
"""
import json
import subprocess
import sys
import time


def curve(pipeline, workspace, run):
    """(epoch, validation P@1 in %) of a run, from its recorded metrics (an evaluation is
    recorded under its epoch)."""
    status = json.loads(subprocess.run(
        [pipeline, "--workspace", workspace, "status", "--run", str(run), "--json"],
        capture_output=True, text=True, check=True).stdout)
    points = [(m["step"], 100 * m["value"]) for m in status["metrics"]
              if m["name"] == "P@1" and m["split"] == "validation"]
    return status["train"], sorted(points)


def newest_train_run(pipeline, workspace):
    status = json.loads(subprocess.run(
        [pipeline, "--workspace", workspace, "status", "--json"],
        capture_output=True, text=True, check=True).stdout)
    return max(r["id"] for r in status["train_runs"])


def run(pipeline, workspace, dataset, tag, steps, flags):
    start = time.monotonic()
    subprocess.run([pipeline, "--workspace", workspace, "train", "--dataset", dataset,
                    "--steps", str(steps), "--eval-every", "1", "--eval-split", "validation",
                    "--no-final-elbo", *flags], check=True, capture_output=True)
    seconds = time.monotonic() - start
    run_id = newest_train_run(pipeline, workspace)
    train, points = curve(pipeline, workspace, run_id)
    print(json.dumps({"dataset": dataset, "tag": tag, "flags": " ".join(flags),
                      "run": run_id, "factors": train["factors"], "inducing": train["inducing"],
                      "steps": train["steps_done"], "seconds": round(seconds, 1),
                      "p1": points}))


def table(path):
    print("| dataset | tag | steps | P@1 last 3 (mean) | best | last |")
    print("|---|---|---|---|---|---|")
    for line in open(path):
        r = json.loads(line)
        p = [v for _, v in r["p1"]]
        print(f"| {r['dataset']} | {r['tag']} | {r['steps']} | {sum(p[-3:]) / len(p[-3:]):.2f} "
              f"| {max(p):.2f} | {p[-1]:.2f} |")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        pipeline, workspace, dataset, tag, steps, sep, *flags = sys.argv[1:]
        assert sep == "--", __doc__
        run(pipeline, workspace, dataset, tag, int(steps), flags)
