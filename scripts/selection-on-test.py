#!/usr/bin/env python3
"""How well fit's choice on a small validation split picks on test: every candidate's
selection run of `pipeline fit` scored on the selection dataset's test split.

    selection-on-test.py PIPELINE OUT --sets stackex_chess:5m,yeast:1m --seeds 0,1,2,3
    selection-on-test.py --table OUT/selection.jsonl

For each set and seed, runs `pipeline fit --json` with every default, then evaluates each
scored candidate's selection run (trained on the carve's training rows, read at the
checkpoint early stopping kept) on the carve's validation split and on the test split, and
writes one JSON line per candidate to OUT/selection.jsonl. The table compares selection
criteria by the mean test P@1 of the candidate each one picks: fit's own choice, and the
validation figures of the kept checkpoint (P@1, P@3, P@5, nDCG@5, the mean of P@1..P@5).
It reads only what the program printed as JSON. Test figures leave label-less rows out,
as the dev README reports omikuji's.
"""
import json
import statistics
import subprocess

from fit_on_test import arguments, fit_job, fits, start


def pipeline_json(pipeline, env, *args):
    out = subprocess.run([pipeline, *args, "--json"], env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def figures(e):
    return {"p_at": e["p_at"], "ndcg_at": e["ndcg_at"]}


def one_fit(pipeline, out, name, budget, seed):
    _, env, outcome = fit_job(pipeline, out, name, budget, seed)
    lines = []
    for i, c in enumerate(outcome["candidates"]):
        if c["status"] != "scored":
            continue
        run = str(c["selection_run"])
        on = {split: figures(pipeline_json(pipeline, env, "evaluate", "--run", run, "--split",
                                           split, "--labelless", "skip"))
              for split in ("validation", "test")}
        lines.append({"set": name, "budget": budget, "seed": seed, "candidate": c["name"],
                      "chosen": i == outcome["chosen"], "folds": outcome["folds"],
                      "converged": c["converged"], "rule": c["validation"],
                      "validation": on["validation"], "test": on["test"],
                      "fit_seconds": outcome["seconds"]})
    return lines


CRITERIA = {
    "fit's choice": None,
    "P@1 (kept checkpoint)": lambda v: v["p_at"][0],
    "P@3": lambda v: v["p_at"][2],
    "P@5": lambda v: v["p_at"][4],
    "nDCG@5": lambda v: v["ndcg_at"][4],
    "mean of P@1..P@5": lambda v: statistics.mean(v["p_at"][:5]),
}


def table(path):
    rows = [json.loads(line) for line in open(path)]
    fits = {}
    for r in rows:
        fits.setdefault((r["set"], r["budget"], r["seed"]), []).append(r)
    sets = sorted({k[:2] for k in fits})
    print("| criterion | " + " | ".join(f"{s} {b}" for s, b in sets) + " | mean |")
    print("|---" * (len(sets) + 2) + "|")
    best = {k: max(c["test"]["p_at"][0] for c in cs) for k, cs in fits.items()}
    for name, key in [*CRITERIA.items(), ("the best on test (oracle)", "oracle")]:
        per_set = []
        for s in sets:
            picked = []
            for k, cs in fits.items():
                if k[:2] != s:
                    continue
                if key is None:
                    c = next(c for c in cs if c["chosen"])
                    picked.append(c["test"]["p_at"][0])
                elif key == "oracle":
                    picked.append(best[k])
                else:
                    c = max(cs, key=lambda c: key(c["validation"]))
                    picked.append(c["test"]["p_at"][0])
            per_set.append(100 * statistics.mean(picked))
        cells = " | ".join(f"{v:.2f}" for v in per_set)
        print(f"| {name} | {cells} | {statistics.mean(per_set):.2f} |")
    seeds = {s: sorted(k[2] for k in fits if k[:2] == s) for s in sets}
    print("\nseeds: " + "; ".join(f"{s} {b}: {seeds[(s, b)]}" for s, b in sets))


def main():
    a = arguments("SELECTION.jsonl").parse_args()
    if a.table:
        table(a.table)
        return
    path = start(a, "selection.jsonl")
    for name, budget, seed in fits(a):
        lines = one_fit(a.pipeline, a.out, name, budget, seed)
        with open(path, "a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        print(name, budget, seed, [(l["candidate"][:40], l["test"]["p_at"][0]) for l in lines],
              flush=True)
    table(path)


if __name__ == "__main__":
    main()
