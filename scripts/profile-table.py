#!/usr/bin/env python3
"""The release profile's cost and worth, measured: for each LTO setting (fat, thin, off)
and codegen-units (1, 16), a cold `cargo build --release --locked` into a target directory
of its own, an incremental rebuild after touching src/lib.rs, and `cargo bench --bench
train_step` (its JSON lines, FSGP_BENCH_JSON) under the same profile.

Usage:
  scripts/profile-table.py OUT.jsonl [--work DIR] [--profiles fat:1,thin:16,...]
  scripts/profile-table.py --table OUT.jsonl

One JSON line per profile goes to OUT.jsonl (appended as each profile finishes, so a long
run that is stopped keeps what it measured). `--table` prints the Markdown table of
BENCHMARKS.md from such a file: each figure beside its ratio to the first profile's
(fat LTO, one codegen unit: the shipped one when this was written). Run it on a quiet
machine, nothing else running: the builds take most of an hour on 2 cores.
"""

import argparse
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_PROFILES = "fat:1,fat:16,thin:1,thin:16,off:1,off:16"
# The bench rows the table shows, by name, each the sum of its rows' step times: the
# Delicious configuration's kernels and q(u) forms, the AmazonCat-like ones, the free
# inducing inputs (the identity basis: the dense and classification sets' kind of model),
# and the natural step at M = 500 and MNIST's M = 200.
TABLE_ROWS = ("Delicious", "AmazonCat-like", "Delicious free Z", "natural")


def profile_env(lto, units, target):
    env = dict(os.environ)
    for profile in ("RELEASE", "BENCH"):
        env[f"CARGO_PROFILE_{profile}_LTO"] = lto
        env[f"CARGO_PROFILE_{profile}_CODEGEN_UNITS"] = str(units)
    env["CARGO_TARGET_DIR"] = str(target)
    return env


def timed(cmd, env, log):
    started = time.monotonic()
    with open(log, "ab") as out:
        subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=out, check=True)
    return time.monotonic() - started


def measure(lto, units, work):
    target = work / f"target-{lto}-{units}"
    if target.exists():
        # The script's own directory, named by it: a cold build starts from nothing.
        shutil.rmtree(target)
    env = profile_env(lto, units, target)
    log = work / f"build-{lto}-{units}.log"
    cold = timed(["cargo", "build", "--release", "--locked"], env, log)
    (REPO / "src" / "lib.rs").touch()
    incremental = timed(["cargo", "build", "--release", "--locked"], env, log)
    rows_file = work / f"bench-{lto}-{units}.jsonl"
    rows_file.unlink(missing_ok=True)
    bench_env = dict(env, FSGP_BENCH_JSON=str(rows_file))
    bench_seconds = timed(
        ["cargo", "bench", "--locked", "--bench", "train_step"], bench_env, log
    )
    rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line]
    binary = target / "release" / "pipeline"
    shutil.rmtree(target)
    return {
        "lto": lto,
        "codegen_units": units,
        "cold_build_seconds": cold,
        "incremental_build_seconds": incremental,
        "bench_build_and_run_seconds": bench_seconds,
        "bench": rows,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_before": os.getloadavg()[0],
        "binary_existed": binary.exists(),
    }


def run(args):
    work = pathlib.Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for spec in args.profiles.split(","):
        lto, units = spec.split(":")
        print(f"profile lto={lto} codegen-units={units} ...", file=sys.stderr, flush=True)
        line = measure(lto, int(units), work)
        with open(args.out, "a") as out:
            out.write(json.dumps(line) + "\n")
        print(
            f"  cold {line['cold_build_seconds']:.0f} s, incremental "
            f"{line['incremental_build_seconds']:.0f} s",
            file=sys.stderr,
            flush=True,
        )


def step_seconds(line, name):
    """The best step times of the bench rows named `name`, summed."""
    rows = [r for r in line["bench"] if r["name"] == name]
    return sum(r["seconds_per_step"] for r in rows) if rows else None


def table(path):
    lines = [json.loads(l) for l in open(path) if l.strip()]
    if not lines:
        sys.exit(f"{path}: no profiles measured")
    base = lines[0]
    head = ["profile", "cold build", "incremental rebuild"] + [
        f"step: {r} rows" for r in TABLE_ROWS
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))

    def cell(value, reference, unit):
        if value is None or reference is None:
            return "—"
        return f"{value:.{1 if unit == 's' else 3}f} {unit} ({value / reference:.2f}×)"

    for line in lines:
        cells = [
            f"lto={line['lto']}, codegen-units={line['codegen_units']}",
            cell(line["cold_build_seconds"], base["cold_build_seconds"], "s"),
            cell(line["incremental_build_seconds"], base["incremental_build_seconds"], "s"),
        ] + [
            cell(step_seconds(line, r), step_seconds(base, r), "s/step") for r in TABLE_ROWS
        ]
        print("| " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSON lines file (written, or read with --table)")
    parser.add_argument("--table", action="store_true", help="print the table of OUT")
    parser.add_argument("--work", default="/tmp/fsgp-profile-table")
    parser.add_argument("--profiles", default=DEFAULT_PROFILES)
    args = parser.parse_args()
    if args.table:
        table(args.out)
    else:
        run(args)


if __name__ == "__main__":
    main()
