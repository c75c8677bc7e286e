#!/usr/bin/env python3
"""Does `pipeline fit` choosing on k folds beat choosing on one validation carve, on small
data? For each set, size and seed: a training subsample drawn with
`random.Random(seed).sample` (the set's own test file kept whole), fitted twice with
`pipeline fit --budget B`: the default (k folds when the carve holds fewer than 500 rows and
the budget affords them) and `--no-folds` (the one carve). Each fit's figures are appended
as one JSON line to OUT/results.jsonl: fit's whole outcome (`pipeline fit --json`: every
candidate's figures, the choice, the final run and its test figures), its wall seconds and
the load average around it. (Lines written before fit had `--json` hold the `== fit:` lines
and candidate table it printed instead; the table reads both.)

Usage: scripts/folds-vs-carve.py run PIPELINE OUT [--jobs SET:SIZE,...] [--seeds 0,1,2,3,4]
                                 [--budget 10m] [--parallel 1]
       scripts/folds-vs-carve.py table RESULTS.jsonl
SET is one of spambase, satimage, banana, yeast, scene; SIZE the subsample's rows (the whole
file, shuffled, when SIZE is not below its row count: banana's training file holds 400).
Subsamples are written under OUT/sub (never beside the shared data).
"""
import argparse
import concurrent.futures
import gzip
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# ../shared beside the repository, as README.md says (SHARED= points elsewhere).
SHARED = os.environ.get("SHARED", os.path.join(HERE, "..", "..", "shared"))
SETS = {
    "spambase": "data/dev/spambase/{}.txt.gz",
    "satimage": "data/dev/satimage/{}.txt.gz",
    "banana": "data/classification/banana/{}.txt.gz",
    "yeast": "data/dev/yeast/{}.txt.gz",
    "scene": "data/dev/scene/{}.txt.gz",
}
MODES = {"folds": [], "carve": ["--no-folds"]}


def shared_file(name, split):
    return os.path.abspath(os.path.join(SHARED, SETS[name].format(split)))


def subsample(name, size, seed, out):
    """Writes SIZE training rows drawn by random.Random(seed).sample; an XML-repository
    file keeps its `N D L` header with N rewritten. Returns the subsample's path."""
    path = os.path.join(out, "sub", f"{name}-{size}-s{seed}.txt")
    if os.path.exists(path):
        return path
    with gzip.open(shared_file(name, "train"), "rt") as f:
        lines = f.read().splitlines()
    header = None
    if re.fullmatch(r"\d+ \d+ \d+", lines[0].strip()):
        header, lines = lines[0].split(), lines[1:]
    rows = random.Random(seed).sample(lines, min(size, len(lines)))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        if header:
            f.write(f"{len(rows)} {header[1]} {header[2]}\n")
        f.write("\n".join(rows) + "\n")
    os.rename(path + ".tmp", path)
    return path


def fit_job(pipeline, out, name, size, seed, mode, budget):
    train = subsample(name, size, seed, out)
    job = os.path.join(out, "runs", f"{name}-{size}-s{seed}-{mode}")
    if os.path.exists(job):
        shutil.rmtree(job)
    os.makedirs(job)
    env = dict(os.environ, FSGP_WORKSPACE=os.path.join(job, "ws"))
    load_before = os.getloadavg()
    t0 = time.monotonic()
    p = subprocess.run([pipeline, "fit", "--train", train, "--test", shared_file(name, "test"),
                        "--budget", budget, "--name", name, "--json"] + MODES[mode],
                       env=env, cwd=job, capture_output=True, text=True)
    wall = time.monotonic() - t0
    load_after = os.getloadavg()
    # Keep what fit said about its choice, not the tens of thousands of epoch lines.
    with open(os.path.join(job, "fit.err"), "w") as f:
        f.write("\n".join(l for l in p.stderr.splitlines()
                          if not l.startswith(("epoch ", "step ", "note: K_Z"))))
    record = {"set": name, "size": size, "seed": seed, "mode": mode, "budget": budget,
              "exit": p.returncode, "wall_seconds": round(wall, 1),
              "load_before": load_before, "load_after": load_after}
    if p.returncode != 0:
        record["error"] = p.stderr[-2000:]
        return record
    # What fit did, as it returns it (`pipeline fit --json`, docs/fit.md): the candidates,
    # the choice, the final run and its test figures.
    outcome = json.loads(p.stdout)
    chosen = outcome["candidates"][outcome["chosen"]]
    final = outcome["final_runs"][0]
    record.update({
        "chose_on_folds": outcome["folds"] > 1,
        "chosen": chosen["name"],
        "chosen_steps": outcome["final_steps"],
        "fit_seconds": outcome["seconds"],
        "outcome": outcome,
        "test": {k: v for k, v in final["metrics"].items() if k != "calibration"},
    })
    shutil.rmtree(os.path.join(job, "ws"))  # checkpoints of 100+ runs a fit; the figures are kept
    return record


def test_figure(record):
    """Test accuracy (binary, multi-class) or P@1 (multi-label), in points."""
    t = record["test"]
    if "accuracy" in t:
        return 100.0 * t["accuracy"]
    return 100.0 * t["p_at"][0]


def mean_sd(xs, digits=2):
    if not xs:
        return "—"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.{digits}f} ± {sd:.{digits}f}"


def nlp_cell(values):
    """Mean ± sd of the test NLP (binary and multi-class; multi-label fits have none)."""
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {sd:.4f}"


def table(path):
    records = [json.loads(l) for l in open(path) if l.strip()]
    ok = [r for r in records if r.get("exit") == 0]
    by = {}
    for r in ok:
        by.setdefault((r["set"], r["size"]), {}).setdefault(r["seed"], {})[r["mode"]] = r
    print("| set | rows | seeds | test, folds | test, one carve | folds − carve (mean, range) "
          "| chose differently | default fell back to one carve | seconds, folds | seconds, one carve "
          "| test NLP, folds | test NLP, one carve |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, size), seeds in sorted(by.items()):
        both = [s for s in seeds.values() if "folds" in s and "carve" in s]
        # A default fit whose probe found the folds unaffordable chose on the one carve too:
        # it compares nothing, and is counted apart.
        pairs = [s for s in both if s["folds"]["chose_on_folds"]]
        defaults = [s["folds"] for s in seeds.values() if "folds" in s]
        fell_back = f"{sum(not r['chose_on_folds'] for r in defaults)} of {len(defaults)}"
        f = [test_figure(s["folds"]) for s in pairs]
        c = [test_figure(s["carve"]) for s in pairs]
        d = [a - b for a, b in zip(f, c)]
        differ = sum(s["folds"]["chosen"] != s["carve"]["chosen"] for s in pairs)
        fs = [s["folds"]["wall_seconds"] for s in pairs]
        cs = [s["carve"]["wall_seconds"] for s in pairs]
        rng = f"{min(d):+.2f} … {max(d):+.2f}" if d else "—"
        nlp = {m: [s[m]["test"].get("nlp") for s in pairs] for m in MODES}
        print(f"| {name} | {size} | {len(pairs)} | {mean_sd(f)} | {mean_sd(c)} "
              f"| {statistics.mean(d) if d else float('nan'):+.2f} ({rng}) | {differ} of {len(pairs)} "
              f"| {fell_back} | {mean_sd(fs, 0)} | {mean_sd(cs, 0)} "
              f"| {nlp_cell(nlp['folds'])} | {nlp_cell(nlp['carve'])} |")
    print()
    print("| set | rows | seed | chosen by the default (steps) | test | chosen, --no-folds (steps) | test |")
    print("|---|---|---|---|---|---|---|")
    for (name, size), seeds in sorted(by.items()):
        for seed, s in sorted(seeds.items()):
            cells = []
            for mode in ("folds", "carve"):
                r = s.get(mode)
                on = "" if mode == "carve" or not r or r["chose_on_folds"] else ", one carve: folds unaffordable"
                cells += [f"{r['chosen']} ({r['chosen_steps']}{on})", f"{test_figure(r):.2f}"] if r else ["—", "—"]
            print(f"| {name} | {size} | {seed} | " + " | ".join(cells) + " |")


def run(args):
    os.makedirs(args.out, exist_ok=True)
    results = os.path.join(args.out, "results.jsonl")
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = []
    # Seed by seed across the sets, so that a run cut short leaves whole pairs of every set.
    for seed in seeds:
        for spec in args.jobs.split(","):
            name, size = spec.split(":")
            for mode in MODES:
                jobs.append((name, int(size), seed, mode))
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        futures = [pool.submit(fit_job, os.path.abspath(args.pipeline), os.path.abspath(args.out),
                               *job, args.budget) for job in jobs]
        for fut in concurrent.futures.as_completed(futures):
            record = fut.result()
            with open(results, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"{record['set']}-{record['size']}-s{record['seed']} {record['mode']}: "
                  f"exit {record['exit']}, {record.get('chosen')}, "
                  f"{test_figure(record) if record['exit'] == 0 else float('nan'):.2f}, "
                  f"{record['wall_seconds']} s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("pipeline")
    r.add_argument("out")
    r.add_argument("--jobs", default="spambase:400,banana:400,spambase:200,banana:200")
    r.add_argument("--seeds", default="0,1,2,3,4")
    r.add_argument("--budget", default="10m")
    r.add_argument("--parallel", type=int, default=1)
    t = sub.add_parser("table")
    t.add_argument("results")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args)
    else:
        table(args.results)


if __name__ == "__main__":
    sys.exit(main())
