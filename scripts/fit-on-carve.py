#!/usr/bin/env python3
"""A whole `pipeline fit` judged on held-out training rows, never on the test file.

The training file is cut by fit's own validation carve (ingest's xxh3 row hash, seed 0,
fraction 0.2: the rows `scripts/omikuji-validation.py` and `scripts/ova-validation.py` score)
into F, the rows outside it, and V, the carve. `pipeline fit --train F --test V` then
chooses and trains its model on F alone (carving F again for its own selection) and its
"test" metrics are V's. With --steps-factors, the fit's final spec is run again with its
steps multiplied by each factor (in the fit's workspace: ingest and svd are reused).
Appends one JSON line per fit and per rerun to --out.

    scripts/fit-on-carve.py PIPELINE TRAIN SCRATCH --set NAME [--budget 5m] [--seed 0]
        [--steps-factors 0.8,1.25,1.5] [--out FILE]

Needs xxhash. Run one job at a time on a quiet machine.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import time

import xxhash


def split(train, scratch, name, fraction=0.2, seed=0):
    """Writes SCRATCH/NAME.F.txt and NAME.V.txt (XML-repository text, header rewritten)."""
    threshold = int(fraction * 2**64)
    with open(train) as f:
        _, d, labels = f.readline().split()
        lines = f.readlines()
    held = [xxhash.xxh3_64_intdigest(struct.pack("<Q", i), seed=seed) < threshold
            for i in range(len(lines))]
    paths = {}
    for part, keep in (("F", False), ("V", True)):
        rows = [line for line, h in zip(lines, held) if h == keep]
        paths[part] = os.path.join(scratch, f"{name}.{part}.txt")
        with open(paths[part], "w") as g:
            g.write(f"{len(rows)} {d} {labels}\n")
            g.writelines(rows)
    return paths


def p_at_135(metrics):
    return [round(100 * metrics["p_at"][k], 2) for k in (0, 2, 4)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pipeline")
    ap.add_argument("train", help="the training file, uncompressed XML-repository text")
    ap.add_argument("scratch")
    ap.add_argument("--set", required=True)
    ap.add_argument("--budget", default="5m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps-factors", default="")
    ap.add_argument("--out", default="docs/experiments/data/fit-on-carve.jsonl")
    a = ap.parse_args()
    os.makedirs(a.scratch, exist_ok=True)
    paths = split(a.train, a.scratch, a.set)
    job = os.path.join(a.scratch, f"job-{a.set}-{a.budget}-{a.seed}")
    env = dict(os.environ, FSGP_WORKSPACE=os.path.join(job, "ws"))
    os.makedirs(job, exist_ok=False)
    t0 = time.time()
    done = subprocess.run([a.pipeline, "fit", "--train", paths["F"], "--test", paths["V"],
                           "--budget", a.budget, "--name", a.set, "--json", "--seed",
                           str(a.seed), "--log-format", "text"],
                          env=env, cwd=job, capture_output=True, text=True, check=True)
    outcome = json.loads(done.stdout)
    line = {"set": a.set, "budget": a.budget, "seed": a.seed, "split": "carve",
            "wall_seconds": round(time.time() - t0, 1),
            "p_at_135": p_at_135(outcome["final_runs"][0]["metrics"]), "fit": outcome}
    with open(a.out, "a") as f:
        f.write(json.dumps(line) + "\n")
    print(a.set, a.seed, "fit", line["p_at_135"])
    spec = outcome["spec"]
    text = open(spec).read()
    steps = int(re.search(r"^steps = (\d+)$", text, re.M).group(1))
    for factor in (float(x) for x in a.steps_factors.split(",") if x):
        scaled = os.path.join(job, f"spec-x{factor}.toml")
        with open(scaled, "w") as g:
            g.write(re.sub(r"^steps = \d+$", f"steps = {round(steps * factor)}", text,
                           flags=re.M))
        run = subprocess.run([a.pipeline, "run", scaled, "--json", "--quiet"], env=env,
                             cwd=job, capture_output=True, text=True, check=True)
        metrics = json.loads(run.stdout)
        rerun = {"set": a.set, "budget": a.budget, "seed": a.seed, "split": "carve",
                 "steps_factor": factor, "steps": round(steps * factor),
                 "fit_steps": steps, "p_at_135": p_at_135(metrics)}
        with open(a.out, "a") as f:
            f.write(json.dumps(rerun) + "\n")
        print(a.set, a.seed, "x", factor, rerun["p_at_135"])


if __name__ == "__main__":
    main()
