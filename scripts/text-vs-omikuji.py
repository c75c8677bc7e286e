#!/usr/bin/env python3
"""`pipeline fit --budget B` (every other option default) against omikuji (defaults) on the
sparse text dev sets and Delicious, one job at a time on the same machine: test P@1/3/5,
training seconds and peak memory. Each job's figures are appended as one JSON line to
OUT/results.jsonl (fsgp's from `pipeline fit --json`, `status --json` and `evaluate --json`,
omikuji's from scripts/omikuji-run.py); the table is printed from that file.

Usage: scripts/text-vs-omikuji.py PIPELINE OUT [--budgets 5m,1m] [--sets a,b] [--omikuji-reps 3]
       scripts/text-vs-omikuji.py --table OUT|RESULTS.jsonl
       scripts/text-vs-omikuji.py --means RESULTS.jsonl [RESULTS.jsonl ...]
       scripts/text-vs-omikuji.py PIPELINE OUT --sets stackex_chess --resplits 1-8 --budgets 5m
       scripts/text-vs-omikuji.py --paired RESULTS.jsonl [RESULTS.jsonl ...]
       scripts/text-vs-omikuji.py PIPELINE OUT --files wiki=DIR --sets wiki --budgets 5m
--resplits S-T pools each set's train and test rows and draws new 80/20 splits from them
(numpy default_rng(s).permutation of the pooled rows for s in S..T; the first round(0.8 N)
indices, in pooled order, are train), written under OUT/splits/; each split is a set named
NAME@rS. A single test split of a few hundred rows moves P@1 by several points, and every run
on it shares that draw; new splits measure the tools on rows neither was tuned against.
--paired prints, per base set, the difference fsgp − omikuji (omikuji's mean over its runs)
on each split, their mean and its standard error.
--means prints, per set and budget, fsgp's test P@1 per seed and their mean against the
mean of every omikuji run in the files (omikuji's own P@1 moves from run to run).
Run it on a quiet machine: fit plans its steps from measured step times.
"""
import argparse
import gzip
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("SHARED", os.path.join(HERE, "..", "..", "shared"))
SETS = {
    "yahoo_business": "data/dev/yahoo_business/{}.txt.gz",
    "rcv1sub2": "data/dev/rcv1sub2/{}.txt.gz",
    "stackex_chess": "data/dev/stackex_chess/{}.txt.gz",
    "delicious": "data/delicious/{}.txt",
}


def timed(argv, env=None, cwd=None):
    """Runs argv under /usr/bin/time -v: (stdout, stderr, wall seconds, peak RSS MiB)."""
    p = subprocess.run(["/usr/bin/time", "-v"] + argv, capture_output=True, text=True,
                       env=env, cwd=cwd)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise SystemExit(f"failed ({p.returncode}): {' '.join(argv)}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", p.stderr).group(1)
    secs = 0.0
    for part in wall.split(":"):
        secs = secs * 60 + float(part)
    return p.stdout, p.stderr, secs, rss / 1024.0


def split_paths(name):
    """(train, test) paths of a set: a dev set's files, or a resplit's under OUT/splits/."""
    return tuple(os.path.join(SHARED, SETS[name].format(s)) for s in ("train", "test"))


def read_xml_repo(path):
    """The header (N, D, L) and the row lines of an XML-repository text file (gzip or plain)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        header = f.readline().split()
        rows = [l.rstrip("\n") for l in f]
    return tuple(int(x) for x in header), rows


def resplit(out, name, seed):
    """Writes split `seed` of NAME's pooled rows under OUT/splits/ and registers it in SETS."""
    import numpy as np
    train_path, test_path = split_paths(name)
    (_, d, l), train = read_xml_repo(train_path)
    _, test = read_xml_repo(test_path)
    pooled = train + test
    order = np.random.default_rng(seed).permutation(len(pooled))
    cut = round(0.8 * len(pooled))
    parts = {"train": sorted(order[:cut]), "test": sorted(order[cut:])}
    key = f"{name}@r{seed}"
    folder = os.path.abspath(os.path.join(out, "splits", key))
    os.makedirs(folder, exist_ok=True)
    for part, idx in parts.items():
        with open(os.path.join(folder, f"{part}.txt"), "w") as f:
            f.write(f"{len(idx)} {d} {l}\n")
            f.writelines(pooled[i] + "\n" for i in idx)
    SETS[key] = os.path.join(folder, "{}.txt")
    return key


def fsgp_job(pipeline, out, name, budget, seed=0):
    train, test = split_paths(name)
    job = os.path.join(out, f"{name}-{budget}" + (f"-seed{seed}" if seed else ""))
    os.makedirs(job)
    env = dict(os.environ, FSGP_WORKSPACE=os.path.join(job, "ws"))
    out_json, err, secs, rss = timed([pipeline, "fit", "--train", train, "--test", test,
                                      "--budget", budget, "--name", name.replace("@", "-"), "--json",
                                      "--seed", str(seed)],
                                     env=env, cwd=job)
    with open(os.path.join(job, "fit.err"), "w") as f:
        f.write(err)
    outcome = json.loads(out_json)
    status = json.loads(subprocess.run([pipeline, "status", "--json"], env=env,
                                       capture_output=True, text=True, check=True).stdout)
    final_id = outcome["final_runs"][0]["train_run"]
    final = next(r for r in status["train_runs"] if r["id"] == final_id)
    figures = {}
    for labelless in ("count-as-zero", "skip"):
        e = json.loads(subprocess.run(
            [pipeline, "evaluate", "--run", str(final["id"]), "--split", "test",
             "--labelless", labelless, "--json"],
            env=env, capture_output=True, text=True, check=True).stdout)
        figures[labelless] = e
    return {"tool": "fsgp", "set": name, "budget": budget, "seed": seed, "wall_seconds": secs,
            "peak_rss_mib": rss, "final_run": final, "evaluate": figures, "fit": outcome}


def omikuji_job(out, name, rep):
    train, test = split_paths(name)
    stdout, _, secs, rss = timed([sys.executable, os.path.join(HERE, "omikuji-run.py"), train, test])
    r = json.loads(stdout.strip().splitlines()[-1])
    r.update({"set": name, "rep": rep, "wall_seconds": secs, "peak_rss_mib": rss})
    return r


def p_at(evaluate):
    """P@1/3/5 in points from `pipeline evaluate --json`'s `p_at` (k = 1..5)."""
    return [100.0 * evaluate["p_at"][k - 1] for k in (1, 3, 5)]


def table(out):
    """The table of OUT/results.jsonl, or of OUT itself when it is a .jsonl file."""
    path = out if out.endswith(".jsonl") else os.path.join(out, "results.jsonl")
    rows = [json.loads(l) for l in open(path)]
    print("| set | tool | budget | P@1 / P@3 / P@5 (label-less rows left out) | P@1 counted as zero | seconds | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for name in set_names(rows):
        om = [r for r in rows if r["tool"] == "omikuji" and r["set"] == name]
        if om:
            mean = lambda key, j: sum(r[key][j] for r in om) / len(om)
            print(f"| {name} | omikuji (mean of {len(om)}) | — | "
                  f"{mean('p_at_135_skipped', 0):.2f} / {mean('p_at_135_skipped', 1):.2f} / {mean('p_at_135_skipped', 2):.2f} | "
                  f"{mean('p_at_135_counted', 0):.2f} | {sum(r['train_seconds'] for r in om) / len(om):.1f} train | "
                  f"{max(r['peak_rss_mib'] for r in om):.0f} |")
        for r in rows:
            if r["tool"] == "fsgp" and r["set"] == name:
                s, c = p_at(r["evaluate"]["skip"]), p_at(r["evaluate"]["count-as-zero"])
                budget = r["budget"] + (f", seed {r['seed']}" if r.get("seed") else "")
                print(f"| {name} | fsgp fit | {budget} | {s[0]:.2f} / {s[1]:.2f} / {s[2]:.2f} | "
                      f"{c[0]:.2f} | {r['wall_seconds']:.0f} whole fit | {r['peak_rss_mib']:.0f} |")


def set_names(rows):
    """The sets in rows, in first-seen order."""
    return list(dict.fromkeys(r["set"] for r in rows))


def paired(paths):
    """Per base set and budget: fsgp − omikuji's mean on each resplit, their mean and its
    standard error (the splits are independent draws; the pairing removes each split's own
    difficulty, which both tools share)."""
    import statistics
    rows = [json.loads(l) for path in paths for l in open(path)]
    print("| set | budget | splits | fsgp mean P@1 | omikuji mean P@1 | Δ by split | mean Δ ± s.e. |")
    print("|---|---|---|---|---|---|---|")
    names = [n for n in set_names(rows) if "@r" in n]
    for base in dict.fromkeys(n.split("@r")[0] for n in names):
        fits = [r for r in rows if r["tool"] == "fsgp" and r["set"].startswith(base + "@r")]
        for budget in sorted({r["budget"] for r in fits}, reverse=True):
            deltas, ours, theirs = [], [], []
            for name in (n for n in names if n.startswith(base + "@r")):
                fit = [p_at(r["evaluate"]["skip"])[0] for r in fits
                       if r["set"] == name and r["budget"] == budget]
                om = [r["p_at_135_skipped"][0] for r in rows
                      if r["tool"] == "omikuji" and r["set"] == name]
                if fit and om:
                    ours.append(statistics.mean(fit))
                    theirs.append(statistics.mean(om))
                    deltas.append(ours[-1] - theirs[-1])
            if not deltas:
                continue
            se = statistics.stdev(deltas) / len(deltas) ** 0.5 if len(deltas) > 1 else float("nan")
            print(f"| {base} | {budget} | {len(deltas)} | {statistics.mean(ours):.2f} | "
                  f"{statistics.mean(theirs):.2f} | {', '.join(f'{d:+.2f}' for d in deltas)} | "
                  f"{statistics.mean(deltas):+.2f} ± {se:.2f} |")


def means(paths):
    """Per set and budget: fsgp's P@1 by seed, their mean, omikuji's mean over its runs."""
    rows = [json.loads(l) for path in paths for l in open(path)]
    print("| set | budget | fsgp P@1 by seed | fsgp mean | omikuji mean (runs, range) | Δ |")
    print("|---|---|---|---|---|---|")
    for name in set_names(rows):
        om = [r["p_at_135_skipped"][0] for r in rows if r["tool"] == "omikuji" and r["set"] == name]
        fits = [r for r in rows if r["tool"] == "fsgp" and r["set"] == name]
        for budget in sorted({r["budget"] for r in fits}, reverse=True):
            by_seed = sorted((r.get("seed", 0), p_at(r["evaluate"]["skip"])[0])
                             for r in fits if r["budget"] == budget)
            mean_fit = sum(p for _, p in by_seed) / len(by_seed)
            mean_om = sum(om) / len(om) if om else float("nan")
            seeds = ", ".join(f"{p:.2f} ({s})" for s, p in by_seed)
            print(f"| {name} | {budget} | {seeds} | {mean_fit:.2f} | {mean_om:.2f} ({len(om)}, "
                  f"{min(om, default=float('nan')):.2f}–{max(om, default=float('nan')):.2f}) | "
                  f"{mean_fit - mean_om:+.2f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pipeline", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--budgets", default="5m,1m")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--omikuji-reps", type=int, default=3)
    ap.add_argument("--seeds", default="0", help="fit's --seed for each fsgp run, e.g. 0,1,2")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--means", nargs="+", metavar="RESULTS.jsonl")
    ap.add_argument("--paired", nargs="+", metavar="RESULTS.jsonl")
    ap.add_argument("--resplits", metavar="S-T", help="new 80/20 splits S..T of each set")
    ap.add_argument("--files", action="append", default=[], metavar="NAME=DIR",
                    help="a set of your own: DIR/train.txt and DIR/test.txt (e.g. pipeline synth's)")
    a = ap.parse_args()
    if a.paired:
        return paired(a.paired)
    if a.means:
        return means(a.means)
    if a.table:
        return table(a.out or a.pipeline)
    os.makedirs(a.out, exist_ok=True)
    results = os.path.join(a.out, "results.jsonl")
    for spec in a.files:
        name, folder = spec.split("=", 1)
        SETS[name] = os.path.join(os.path.abspath(folder), "{}.txt")
    names = a.sets.split(",")
    if a.resplits:
        first, last = (int(x) for x in a.resplits.split("-"))
        names = [resplit(a.out, n, s) for n in names for s in range(first, last + 1)]
    for name in names:
        jobs = [omikuji_job(a.out, name, rep) for rep in range(a.omikuji_reps)]
        jobs += [fsgp_job(os.path.abspath(a.pipeline), a.out, name, b, int(seed))
                 for seed in a.seeds.split(",") for b in a.budgets.split(",")]
        with open(results, "a") as f:
            for j in jobs:
                f.write(json.dumps(j) + "\n")
    table(a.out)


if __name__ == "__main__":
    main()
