#!/usr/bin/env python3
"""Would averaging fit's candidates beat choosing one? Every scored candidate's selection
run of `pipeline fit` predicts every label's probability on the carve's validation split
and on the test split; ensembles chosen on validation alone are scored on test.

    ensemble-on-test.py PIPELINE OUT --sets stackex_chess:5m,yeast:1m --seeds 0,1,2,3
    ensemble-on-test.py --table OUT/ensemble.jsonl
    ensemble-on-test.py --criteria OUT            (writes OUT/criteria.jsonl from OUT's runs)
    ensemble-on-test.py --criteria-table OUT/criteria.jsonl

Needs pyarrow and numpy. For each set and seed it runs `pipeline fit --json` with every
default, then `pipeline predict --run R --split S --top-k L --probabilities` for each
scored candidate's selection run (read at the checkpoint early stopping kept), and writes
one JSON line per fit with each rule's validation and test P@1/3/5. Label-less test rows
are left out, as the dev README reports omikuji's. The rules, all decided on validation:

- chosen: fit's own choice (its selection run, not its final model);
- mean of all: every scored candidate's probabilities averaged;
- mean of top 2 / top 3: the candidates with the best rule figures (fit's plateau);
- within 1 se: the candidates whose rule figure is within one standard error of P@1 on the
  validation rows of the best one;
- greedy: Caruana's forward selection with replacement on validation P@1 (ties: P@3),
  at most 10 rounds.

--criteria asks a different question of the same runs: would a validation figure other than
fit's pick a single candidate that does better on test? It scores every candidate's
validation probabilities by their Bernoulli negative log-likelihood per row (every label)
and by label ranking average precision, and writes one JSON line per fit with each
candidate's figures and test P@1/3/5; --criteria-table credits each figure with the test
P@1 of the candidate it would pick.
"""
import glob
import json
import math
import os
import statistics
import subprocess

import numpy as np
import pyarrow.parquet as pq

from fit_on_test import arguments, fit_job, fits, start


def split_labels(ws, dataset, split):
    """Each row's label set of an ingested split, read from its Parquet chunks."""
    [run] = glob.glob(os.path.join(ws, "datasets", f"{dataset}.run*"))
    out = []
    for part in sorted(glob.glob(os.path.join(run, split, "part-*.parquet"))):
        out.extend(set(ls) for ls in pq.read_table(part, columns=["labels"])["labels"].to_pylist())
    return out


def dense_probabilities(path, rows, labels):
    """[rows × labels] probabilities from a predictions file listing every label."""
    t = pq.read_table(path).to_pydict()
    p = np.zeros((rows, labels))
    for r, ls, ps in zip(t["row_id"], t["labels"], t["probabilities"]):
        p[r, ls] = ps
    return p


def p_at(p, truth, ks=(1, 3, 5)):
    """P@k over rows with a label; p [rows × labels]."""
    keep = [i for i, t in enumerate(truth) if t]
    order = np.argsort(-p[keep], axis=1, kind="stable")[:, :max(ks)]
    out = []
    for k in ks:
        hits = sum(len(truth[i] & set(order[j, :k].tolist())) for j, i in enumerate(keep))
        out.append(hits / (k * len(keep)))
    return out


def greedy(vals, truth, rounds=10):
    """Caruana's forward selection with replacement: indices chosen (with repeats)."""
    picked, total = [], None
    for _ in range(rounds):
        best = None
        for i, v in enumerate(vals):
            trial = v if total is None else (total * len(picked) + v) / (len(picked) + 1)
            s = p_at(trial, truth, (1, 3))
            if best is None or s > best[0]:
                best = (s, i, trial)
        if picked and best[0] <= p_at(total, truth, (1, 3)):
            break
        picked.append(best[1])
        total = best[2]
    return picked


def one_fit(pipeline, out, name, budget, seed):
    job, env, outcome = fit_job(pipeline, out, name, budget, seed)
    labels = outcome["labels"]
    cands = [c for c in outcome["candidates"] if c["status"] == "scored"]
    probs = {}
    for split in ("validation", "test"):
        probs[split] = []
        for c in cands:
            pred_dir = os.path.join(job, "ws", "predictions")
            before = set(os.listdir(pred_dir))
            subprocess.run([pipeline, "predict", "--run", str(c["selection_run"]), "--split",
                            split, "--top-k", str(labels), "--probabilities"], env=env, cwd=job,
                           capture_output=True, text=True, check=True)
            [new] = set(os.listdir(pred_dir)) - before
            probs[split].append(os.path.join(pred_dir, new, "predictions.parquet"))
    ws = os.path.join(job, "ws")
    truths = {s: split_labels(ws, f"{name}-select", s) for s in ("validation", "test")}
    return outcome, cands, probs, truths


def score_fit(outcome, cands, probs, truths):
    labels = outcome["labels"]
    vals = {s: [dense_probabilities(p, len(truths[s]), labels) for p in probs[s]]
            for s in probs}
    figure = [(c["validation"]["primary"]["value"], c["validation"]["secondary"]["value"])
              for c in cands]
    order = sorted(range(len(cands)), key=lambda i: figure[i], reverse=True)
    chosen_name = outcome["candidates"][outcome["chosen"]]["name"]
    chosen = next(i for i, c in enumerate(cands) if c["name"] == chosen_name)
    n_val = sum(1 for t in truths["validation"] if t)
    best = figure[order[0]][0]
    se = math.sqrt(best * (1 - best) / n_val)
    rules = {
        "chosen": [chosen],
        "mean of all": list(range(len(cands))),
        "mean of top 2": order[:2],
        "mean of top 3": order[:3],
        "within 1 se": [i for i in order if figure[i][0] >= best - se],
        "greedy": greedy(vals["validation"], truths["validation"]),
    }
    out = {}
    for rule, members in rules.items():
        out[rule] = {"members": [cands[i]["name"] for i in members]}
        for s in ("validation", "test"):
            p = sum(vals[s][i] for i in members) / len(members)
            out[rule][s] = p_at(p, truths[s])
    out["oracle single"] = {s: max((p_at(v, truths[s]) for v in vals[s]), key=lambda f: f[0])
                            for s in ("test",)}
    return out


def nll(p, truth):
    """Mean over labelled rows of the Bernoulli negative log-likelihood of every label."""
    keep = [i for i, t in enumerate(truth) if t]
    y = np.zeros((len(keep), p.shape[1]))
    for j, i in enumerate(keep):
        y[j, list(truth[i])] = 1
    q = np.clip(p[keep], 1e-12, 1 - 1e-12)
    return float(-(y * np.log(q) + (1 - y) * np.log(1 - q)).sum(axis=1).mean())


def lrap(p, truth):
    """Label ranking average precision over labelled rows."""
    out = []
    for i, t in enumerate(truth):
        if not t:
            continue
        order = np.argsort(-p[i], kind="stable")
        rank = np.empty(len(order), int)
        rank[order] = np.arange(1, len(order) + 1)
        ranks = sorted(rank[list(t)])
        out.append(np.mean([(k + 1) / r for k, r in enumerate(ranks)]))
    return float(np.mean(out))


def criteria(out):
    """OUT/criteria.jsonl from the fits of OUT/ensemble.jsonl and the predictions they left:
    the script's own predictions are each fit's last 2n (validation, then test, in the
    order of its scored candidates)."""
    with open(os.path.join(out, "criteria.jsonl"), "w") as f:
        for line in open(os.path.join(out, "ensemble.jsonl")):
            r = json.loads(line)
            ws = os.path.join(out, f"{r['set']}-{r['budget']}-seed{r['seed']}", "ws")
            preds = sorted(glob.glob(os.path.join(ws, "predictions", "*")),
                           key=lambda d: int(d.rsplit(".run", 1)[1]))
            n = len(r["candidates"])
            mine = {"validation": preds[-2 * n:-n], "test": preds[-n:]}
            truths = {s: split_labels(ws, f"{r['set']}-select", s) for s in mine}
            # Each of the script's predictions lists every label (--top-k L).
            first = pq.read_table(os.path.join(mine["test"][0], "predictions.parquet"),
                                  columns=["labels"])["labels"]
            labels = len(first[0])
            cands = []
            for j, name in enumerate(r["candidates"]):
                v, t = (dense_probabilities(os.path.join(mine[s][j], "predictions.parquet"),
                                            len(truths[s]), labels) for s in ("validation", "test"))
                cands.append({"name": name, "validation_p_at": p_at(v, truths["validation"]),
                              "validation_nll": nll(v, truths["validation"]),
                              "validation_lrap": lrap(v, truths["validation"]),
                              "test_p_at": p_at(t, truths["test"])})
            f.write(json.dumps({"set": r["set"], "budget": r["budget"], "seed": r["seed"],
                                "chosen": r["rules"]["chosen"]["members"][0],
                                "candidates": cands}) + "\n")


def criteria_table(path):
    rows = [json.loads(line) for line in open(path)]
    sets = sorted({(r["set"], r["budget"]) for r in rows})
    picks = {
        "fit's choice": lambda r: next(c for c in r["candidates"] if c["name"] == r["chosen"]),
        "lowest validation NLL": lambda r: min(r["candidates"], key=lambda c: c["validation_nll"]),
        "highest validation LRAP": lambda r: max(r["candidates"], key=lambda c: c["validation_lrap"]),
        "oracle": lambda r: max(r["candidates"], key=lambda c: c["test_p_at"][0]),
    }
    print("| pick (mean test P@1) | " + " | ".join(f"{s} {b}" for s, b in sets) + " | mean |")
    print("|---" * (len(sets) + 2) + "|")
    for rule, pick in picks.items():
        per = [100 * statistics.mean(pick(r)["test_p_at"][0] for r in rows
                                     if (r["set"], r["budget"]) == s) for s in sets]
        print(f"| {rule} | " + " | ".join(f"{v:.2f}" for v in per)
              + f" | {statistics.mean(per):.2f} |")


def table(path):
    rows = [json.loads(line) for line in open(path)]
    sets = sorted({(r["set"], r["budget"]) for r in rows})
    rules = list(rows[0]["rules"])
    print("| rule (mean test P@1) | " + " | ".join(f"{s} {b}" for s, b in sets) + " | mean |")
    print("|---" * (len(sets) + 2) + "|")
    for rule in rules:
        per = [100 * statistics.mean(r["rules"][rule]["test"][0] for r in rows
                                     if (r["set"], r["budget"]) == s) for s in sets]
        print(f"| {rule} | " + " | ".join(f"{v:.2f}" for v in per)
              + f" | {statistics.mean(per):.2f} |")
    for s in sets:
        print(s, "seeds", sorted(r["seed"] for r in rows if (r["set"], r["budget"]) == s))


def main():
    ap = arguments("ENSEMBLE.jsonl")
    ap.add_argument("--criteria", metavar="OUT")
    ap.add_argument("--criteria-table", metavar="CRITERIA.jsonl")
    a = ap.parse_args()
    if a.criteria:
        criteria(a.criteria)
        return
    if a.criteria_table:
        criteria_table(a.criteria_table)
        return
    if a.table:
        table(a.table)
        return
    path = start(a, "ensemble.jsonl")
    for name, budget, seed in fits(a):
        outcome, cands, probs, truths = one_fit(a.pipeline, a.out, name, budget, seed)
        rules = score_fit(outcome, cands, probs, truths)
        line = {"set": name, "budget": budget, "seed": seed, "rules": rules,
                "candidates": [c["name"] for c in cands], "fit_seconds": outcome["seconds"]}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(name, budget, seed, {k: round(100 * v["test"][0], 2) for k, v in rules.items()},
              flush=True)
    table(path)


if __name__ == "__main__":
    main()
