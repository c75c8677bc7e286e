#!/usr/bin/env python3
"""Per-evaluation table of a `pipeline --log-format jsonl train --eval-every 1 --eval-split
validation` log (its epoch and validation events; a text log of the same run, as older runs
wrote, is read from its lines):
epoch, epoch seconds, cumulative training seconds (the sum of the epoch times the log prints;
the validation scoring, printed separately, is left out), and the validation metrics.
With --target-frac F: the target F x (last evaluation's first metric) and the first epoch that
reaches it (>=, or <= with --lower for NLP-like metrics), and the first epoch from which it
stays reached.

Usage: scripts/tta-table.py LOG [--target-frac 0.99] [--target VALUE] [--metric P@1] [--lower]
"""
import argparse
import json
import re

ap = argparse.ArgumentParser()
ap.add_argument("log")
ap.add_argument("--metric", default="P@1")
ap.add_argument("--target-frac", type=float, default=None)
ap.add_argument("--target", type=float, default=None)
ap.add_argument("--lower", action="store_true")
a = ap.parse_args()

# A validation event's figures as the text lines print them (percentages).
JSON_FIGURES = {"p_at_1": "P@1", "p_at_3": "P@3", "p_at_5": "P@5", "psp_at_5": "PSP@5",
                "accuracy": "accuracy", "nlp": "NLP"}


def rows_of_events(lines):
    """(epoch, epoch seconds, cumulative seconds, {metric: value}) from JSON events."""
    rows, secs = [], {}
    for line in lines:
        event = json.loads(line)
        if event["event"] == "epoch":
            secs[event["epoch"]] = event["seconds"]
        elif event["event"] == "validation" and event.get("epoch") is not None:
            e = event["epoch"]
            vals = {name: 100 * event[key] if key != "nlp" else event[key]
                    for key, name in JSON_FIGURES.items() if key in event}
            rows.append((e, secs[e], sum(secs[k] for k in secs if k <= e), vals))
    return rows


def rows_of_text(lines):
    """The same rows from the text lines of an older log."""
    rows, secs = [], {}
    for line in lines:
        m = re.match(r"epoch (\d+)/\d+: .*?, ([0-9.]+) s,", line)
        if m:
            secs[int(m.group(1))] = float(m.group(2))
            continue
        m = re.match(r"epoch (\d+): 'validation' (.*) \(([0-9.]+) s\)", line)
        if m:
            e = int(m.group(1))
            # "P@1 67.3 P@3 ..." or "accuracy 96.52 %, mean NLP 0.1017": name, then number.
            pairs = re.findall(r"([A-Za-z@][A-Za-z@0-9 ]*?) (-?[0-9.]+)", m.group(2))
            vals = {k.strip().split()[-1]: float(v) for k, v in pairs}
            rows.append((e, secs[e], sum(secs[k] for k in secs if k <= e), vals))
    return rows


lines = open(a.log).read().splitlines()
events = [l for l in lines if l.startswith("{")]
rows = rows_of_events(events) if events else rows_of_text(lines)
keys = list(rows[0][3].keys())
print("| epoch | epoch s | cumulative s | " + " | ".join(f"val {k}" for k in keys) + " |")
print("|---" * (3 + len(keys)) + "|")
for e, s, c, v in rows:
    print(f"| {e} | {s:.1f} | {c:.1f} | " + " | ".join(f"{v[k]:g}" for k in keys) + " |")
final = rows[-1][3][a.metric]
tgt = a.target if a.target is not None else (final * a.target_frac if a.target_frac else None)
if tgt is not None:
    ok = (lambda x: x <= tgt) if a.lower else (lambda x: x >= tgt)
    first = next((r for r in rows if ok(r[3][a.metric])), None)
    stay = None
    for i in range(len(rows)):
        if all(ok(r[3][a.metric]) for r in rows[i:]):
            stay = rows[i]
            break
    print(f"\nfinal {a.metric} {final:g}; target {tgt:.4f}")
    for name, r in (("first reached", first), ("reached for good", stay)):
        print(f"{name}: " + (f"epoch {r[0]}, {r[2]:.1f} s cumulative" if r else "never"))
