#!/usr/bin/env python3
"""One run of docs/experiments/text-quality.md: ingest the TRAINING file with a validation
carve, svd, train, and evaluate on the validation split only (never the test file).

    scripts/text-quality.py PIPELINE SCRATCH SET TAG --transform T --svd "--rank R --inducing M"
        --train "--kernel linear ..." --max-steps S [--checkpoints 500,1000] [--out FILE]

SCRATCH holds data/SET.train.txt (the uncompressed training file) and one workspace per set
(SCRATCH/ws-SET). Each evaluated checkpoint appends one JSON line to --out: the set, tag,
options, steps, seconds a step (wall clock of train over its steps; indicative on a shared
machine) and validation P@1/3/5 from `pipeline evaluate --json`.
"""
import argparse
import json
import re
import shlex
import subprocess
import sys
import time


def pipeline(binary, ws, *args, stderr=False):
    cmd = [binary, "--workspace", ws, *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return done.stdout + (done.stderr if stderr else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("scratch")
    ap.add_argument("set")
    ap.add_argument("tag")
    ap.add_argument("--transform", default="auto")
    ap.add_argument("--svd", default="")
    ap.add_argument("--svd-run", type=int, help="reuse this svd run instead of --svd")
    ap.add_argument("--train", default="")
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--score-run", type=int,
                    help="only score this (stopped) train run's --checkpoints, no training")
    ap.add_argument("--checkpoints", default="", help="extra checkpoint steps to score")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--workspace", help="default SCRATCH/ws-SET; one per concurrent run")
    ap.add_argument("--train-split", action="store_true",
                    help="also score the last step on the training split (underfit or not)")
    ap.add_argument("--out", default="docs/experiments/data/text-quality.jsonl")
    a = ap.parse_args()

    ws = a.workspace or f"{a.scratch}/ws-{a.set}"
    name = f"{a.set}-{a.transform}"
    pipeline(a.binary, ws, "ingest", "--name", name, "--train",
             f"{a.scratch}/data/{a.set}.train.txt", "--validation-fraction", "0.2",
             "--transform", a.transform)
    if a.score_run is not None:
        return score(a, ws, a.score_run, None, 0.0, None)
    t0 = time.time()
    if a.svd_run is None:
        said = pipeline(a.binary, ws, "svd", "--dataset", name, "--threads", a.threads,
                        *shlex.split(a.svd), stderr=True)
        done = re.search(r"already done \(run (\d+)\)", said)
        # status --json lists the 20 newest stage runs: a fresh svd run is among them.
        status = json.loads(pipeline(a.binary, ws, "status", "--json"))
        a.svd_run = int(done.group(1)) if done else max(
            r["id"] for r in status["runs"] if r["stage"] == "svd" and r["status"] == "ok")
    svd_seconds = time.time() - t0
    svd_run = a.svd_run
    t0 = time.time()
    pipeline(a.binary, ws, "train", "--dataset", name, "--svd", str(svd_run),
                   "--seed", "0", "--no-final-elbo", "--fresh", "--threads", a.threads,
                   "--steps", str(a.max_steps), "--max-steps", str(a.max_steps),
                   *shlex.split(a.train))
    score(a, ws, None, svd_run, svd_seconds, time.time() - t0)


def score(a, ws, run_id, svd_run, svd_seconds, train_seconds):
    """Evaluates the run's --checkpoints and last step on validation (and train)."""
    status = json.loads(pipeline(a.binary, ws, "status", "--json"))
    run = max((r for r in status["train_runs"] if run_id in (None, r["id"])),
              key=lambda r: r["id"])
    steps = [(int(s), "validation") for s in a.checkpoints.split(",") if s]
    if run_id is not None and a.train_split:
        steps += [(step, "train") for step, _ in steps]
    if run_id is None:
        steps += [(None, "validation")] + ([(None, "train")] if a.train_split else [])
    with open(a.out, "a") as f:
        for step, split in steps:
            extra = ["--checkpoint", str(step)] if step else []
            ev = json.loads(pipeline(a.binary, ws, "evaluate", "--run", str(run["id"]),
                                     "--split", split, "--json", *extra))
            line = {
                "set": a.set, "tag": a.tag, "transform": a.transform, "svd": a.svd,
                "train": a.train, "run": run["id"], "svd_run": svd_run or run["svd_run"],
                "M": run["inducing"], "P": run["factors"], "R": run["rank"],
                "steps": step or run["steps_done"], "steps_done": run["steps_done"],
                "step_seconds": train_seconds and round(train_seconds / max(run["steps_done"], 1), 4),
                "svd_seconds": round(svd_seconds, 2), "split": split,
                "metrics": ev,
            }
            f.write(json.dumps(line) + "\n")
            print(json.dumps({k: line[k] for k in ("set", "tag", "split", "steps", "step_seconds")}),
                  pk(ev))


def pk(ev):
    """P@1/3/5 in points from evaluate's JSON."""
    return " / ".join(f"{100 * ev['p_at'][k]:.2f}" for k in (0, 2, 4))


if __name__ == "__main__":
    main()
