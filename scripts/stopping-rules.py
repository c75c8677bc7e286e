#!/usr/bin/env python3
"""Replays early-stopping rules on the curves of scripts/stopping-curves.sh.

For every run (dataset, seed): the validation scores (`early_stopping_score`, every
⌈S/50⌉ steps) and the test figures of the checkpoint at each score. A rule is a window W
(the score it watches is the mean of the last W scores, fewer at the start) and a patience
P (smoothed scores in a row without a strict improvement on the best one before the run
stops). What it would have done: the step it stops at, the checkpoint it keeps (the last
step of the best window) and that checkpoint's test figures.

Usage: scripts/stopping-rules.py OUT_DIR [W:P ...]   (default 1:10 2:10 3:10 3:5 5:5 5:10)
"""
import glob
import json
import os
import re
import statistics
import sys


def load(out, name):
    status = json.load(open(os.path.join(out, f"status-{name}.json")))
    val = [(m["step"], m["value"]) for m in status["metrics"] if m["name"] == "early_stopping_score"]
    metric = status["run"]["params"]["early_stopping"]["metric"]
    test = {}
    text = open(os.path.join(out, f"test-{name}.txt")).read()
    for block in re.split(r"^== step ", text, flags=re.M)[1:]:
        step, body = block.split("\n", 1)
        j = json.loads(body)
        if "p_at" in j or "precision" in j:
            p = j.get("p_at") or j["precision"]
            test[int(step)] = {"P@1": 100 * p[0], "P@3": 100 * p[2], "P@5": 100 * p[4]}
        else:
            test[int(step)] = {"acc": 100 * j["accuracy"], "nlp": j["nlp"]}
    return sorted(val), metric, test


def replay(val, higher, window, patience):
    """(stop step, kept step) of the rule on the scores `val` [(step, value)]."""
    best, kept, since = None, None, 0
    for i, (step, _) in enumerate(val):
        recent = [v for _, v in val[max(0, i - window + 1): i + 1]]
        s = statistics.fmean(recent)
        if best is None or (s > best if higher else s < best):
            best, kept, since = s, step, 0
        else:
            since += 1
            if since >= patience:
                return step, kept
    return val[-1][0], kept


def main():
    out = sys.argv[1]
    rules = [tuple(map(int, r.split(":"))) for r in sys.argv[2:]] or [
        (1, 10), (2, 10), (3, 10), (3, 5), (5, 5), (5, 10)]
    names = sorted(os.path.basename(p)[7:-5] for p in glob.glob(os.path.join(out, "status-*.json")))
    header = "run".ljust(18) + "budget end".rjust(22) + "".join(f"W{w}:P{p}".rjust(30) for w, p in rules)
    print(header)
    totals = {r: [] for r in rules}
    for name in names:
        val, metric, test = load(out, name)
        higher = metric != "nlp"
        keys = list(next(iter(test.values())).keys())
        show = lambda t: " / ".join(f"{t[k]:.4f}" if k == "nlp" else f"{t[k]:.2f}" for k in keys[:2])
        last = val[-1][0]
        row = name.ljust(18) + f"{show(test[last])}".rjust(22)
        for r in rules:
            stop, kept = replay(val, higher, *r)
            row += f"{stop:>6} {kept:>5} {show(test[kept])}".rjust(30)
            totals[r].append((stop / last, test[kept], test[last]))
        print(row)
    print()
    # Means over seeds per dataset: the kept checkpoint's test figures and the stop step
    # as a share of the budget.
    sets = sorted({n.rsplit("-s", 1)[0] for n in names})
    print("means over seeds".ljust(18) + "budget end".rjust(22) + "".join(f"W{w}:P{p}".rjust(30) for w, p in rules))
    for d in sets:
        idx = [i for i, n in enumerate(names) if n.rsplit("-s", 1)[0] == d]
        end = [totals[rules[0]][i][2] for i in idx]
        keys = list(end[0].keys())[:2]
        fmt = lambda k, v: f"{v:.4f}" if k == "nlp" else f"{v:.2f}"
        mean = lambda ts: " / ".join(fmt(k, statistics.fmean(t[k] for t in ts)) for k in keys)
        row = d.ljust(18) + mean(end).rjust(22)
        for r in rules:
            xs = [totals[r][i] for i in idx]
            share = statistics.fmean(x[0] for x in xs)
            row += f"{100 * share:>5.0f}% {mean([x[1] for x in xs])}".rjust(30)
        print(row)


if __name__ == "__main__":
    main()
