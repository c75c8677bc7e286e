#!/usr/bin/env bash
# Scaling over MPI ranks on one machine (BENCHMARKS.md, "Over MPI ranks"): one rank with one
# thread against two ranks with one thread each, run one after the other in the same
# invocation, for the svd passes and the training steps of two configurations:
#   - Delicious (../shared/data/delicious): R = 250, M = 500, P = 30, B = 500, all negatives;
#   - AmazonCat-shaped: `pipeline synth --shape amazoncat` (D = 203 882, K = 13 330) cut to
#     N = 10 000 training rows, R = 2000 (one power iteration fewer than the default, q = 1,
#     to save time: the figures are per pass), M = 500, P = 30, B = 500, all negatives.
# Training runs 2 epochs; s/step is the second epoch's seconds over its steps,
# so start-up is left out. Each rank prints the seconds its gradient all-reduce took (with
# the wait for the slower rank). Prints one Markdown row per configuration and process
# count. Needs a binary built with `--features mpi` and `mpirun` on the PATH, and a new
# WORKDIR (a stage found done prints no timings). ONLY=delicious skips AmazonCat.
# Usage: scripts/mpi-scaling.sh PIPELINE WORKDIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 PIPELINE WORKDIR" >&2; exit 2; }
bin=$(realpath "$1"); work=$2
root="$(cd "$(dirname "$0")/.." && pwd)"
delicious="$root/../shared/data/delicious"
[ ! -e "$work/delicious-1" ] || { echo "$work already holds a measurement; give a new WORKDIR" >&2; exit 2; }
mkdir -p "$work"

# OpenMPI refuses to start as root unless told.
as_root=""
[ "$(id -u)" != 0 ] || as_root=--allow-run-as-root

# on RANKS WORKSPACE ARGS...: the command on one process or under mpirun.
on() {
    local ranks=$1 ws=$2; shift 2
    if [ "$ranks" = 1 ]; then
        "$bin" --workspace "$ws" "$@"
    else
        mpirun -n "$ranks" --oversubscribe --bind-to none $as_root "$bin" --workspace "$ws" "$@"
    fi
}

# row NAME RANKS LOGDIR STEPS_PER_EPOCH: the Markdown row from the svd and train logs.
row() {
    python3 - "$@" <<'PY'
import re, sys
name, ranks, logs, per_epoch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
svd = open(f"{logs}/svd.log").read()
passes = [float(s) for s in re.search(r"seconds per pass \(last = K_XX̃\): ([0-9., ]+);", svd).group(1).split(", ")]
train = open(f"{logs}/train.log").read()
epoch2 = float(re.search(r"epoch 2/\d+: .*?, ([0-9.]+) s, queue wait", train).group(1))
reduce = [(float(a), float(b)) for a, b in re.findall(r"gradient all-reduce ([0-9.]+) s of ([0-9.]+) s", train)]
basis = ", ".join(f"{p:.3f}" for p in passes[:-1])
red = "; ".join(f"{a:.2f} of {b:.1f}" for a, b in reduce) if reduce else "—"
print(f"| {name} | {ranks} × 1 | {basis} | {passes[-1]:.3f} | {epoch2 / per_epoch:.4f} | {red} |")
PY
}

# measure NAME RANK STEPS_PER_EPOCH INGEST_ARGS: ingest (in 8 chunks, 4 per rank) once per
# process count, then svd and train.
measure() {
    local name=$1 rank=$2 per_epoch=$3 ingest_args=$4
    for ranks in 1 2; do
        local ws="$work/$name-$ranks" logs="$work/$name-$ranks-logs"
        mkdir -p "$logs"
        # shellcheck disable=SC2086
        "$bin" --workspace "$ws" ingest --name "$name" $ingest_args >"$logs/ingest.log" 2>&1
        on "$ranks" "$ws" svd --dataset "$name" --rank "$rank" --inducing 500 --threads 1 \
            --power-iters "${POWER_ITERS:-1}" >"$logs/svd.log" 2>&1
        on "$ranks" "$ws" train --dataset "$name" --kernel linear --inducing 500 --factors 30 \
            --batch 500 --negatives all --epochs 2 --threads 1 \
            --no-final-elbo >"$logs/train.log" 2>&1
        row "$name" "$ranks" "$logs" "$per_epoch"
    done
}

echo "| configuration | ranks × threads | svd basis passes (s) | K_XX̃ pass (s) | train s/step | gradient all-reduce s of train s, per rank |"
echo "|---|---|---|---|---|---|"
measure delicious 250 26 "--train $delicious/train.txt --test $delicious/test.txt --chunk-rows 1615"
[ "${ONLY:-}" != delicious ] || exit 0
if [ ! -d "$work/amazoncat-data" ]; then
    "$bin" --workspace "$work/synth" synth --out "$work/amazoncat-data" --shape amazoncat \
        --rows 10000 --test-rows 100 --seed 1 >/dev/null 2>&1
fi
measure amazoncat 2000 20 "--train $work/amazoncat-data/train.txt --test $work/amazoncat-data/test.txt --chunk-rows 1250"
