#!/usr/bin/env python3
"""Markdown tables of docs/experiments/text-quality.md from scripts/text-quality.py's JSON
lines and scripts/omikuji-validation.py's: one table per set, validation (and training
split) P@1/3/5 in points, steps, seconds a step and the options that differ.

Usage: scripts/text-quality-table.py RUNS.jsonl OMIKUJI.jsonl
"""
import json
import re
import sys


def option(train, flag, default):
    m = re.search(rf"--{flag} (\S+)", train)
    return m.group(1) if m else default


def main():
    runs = [json.loads(l) for l in open(sys.argv[1])]
    omikuji = {o["set"]: o for o in map(json.loads, open(sys.argv[2]))}
    for s in ("stackex_chess", "yahoo_business", "rcv1sub2", "delicious"):
        rows = [r for r in runs if r["set"] == s and "run" in r]  # fit lines: text only
        first = {}
        for i, r in enumerate(rows):
            first.setdefault((r["run"], r["tag"]), i)
        rows.sort(key=lambda r: (first[(r["run"], r["tag"])], r["split"] == "train", r["steps"]))
        if not rows:
            continue
        print(f"\n### {s}\n")
        print("| run (tag) | Z | M | P | R | η | steps | split | P@1 / P@3 / P@5 | s/step |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        o = omikuji.get(s)
        if o:
            p = " / ".join(f"{v:.2f}" for v in o["p_at_135"])
            print(f"| omikuji 0.5.2 defaults | — | — | — | — | — | — | validation | {p} | "
                  f"{o['train_seconds']} s train |")
        for r in rows:
            t = r["train"]
            latent = option(t, "latent", "factor")
            p_col = "K (one GP a label)" if latent == "independent" else r["P"]
            ev = r["metrics"]["p_at"]
            p = " / ".join(f"{100 * ev[k]:.2f}" for k in (0, 2, 4))
            sec = r["step_seconds"] if r["step_seconds"] else "—"
            print(f"| #{r['run']} ({r['tag']}) | {option(t, 'inducing-inputs', 'subspace')} | "
                  f"{r['M']} | {p_col} | {r['R']} | {option(t, 'lr', '0.01')} | {r['steps']} | "
                  f"{r['split']} | {p} | {sec} |")


if __name__ == "__main__":
    main()
