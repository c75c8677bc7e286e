#!/usr/bin/env bash
# Training over MPI ranks against one process on Delicious with the paper's settings
# (pipelines/delicious.toml: R = 250, M = 500, P = 30, B = 500, all negatives, η = 0.01,
# seed 0, 200 epochs): one process, then `mpirun -n 2` with one thread per rank, each into
# its own workspace from the same ingest and svd (one process), then predict + evaluate on
# test. Prints the largest relative difference of the per-epoch mean ELBO, the exact bounds
# and test P@1/3/5 of both. EPOCHS=N shortens the runs. Needs a binary built with
# `--features mpi` and `mpirun` on the PATH. Usage: scripts/mpi-equality.sh PIPELINE WORKDIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 PIPELINE WORKDIR" >&2; exit 2; }
bin=$(realpath "$1"); work=$2
data="$(cd "$(dirname "$0")/.." && pwd)/../shared/data/delicious"
epochs=${EPOCHS:-200}
mkdir -p "$work"
as_root=""
[ "$(id -u)" != 0 ] || as_root=--allow-run-as-root
train=(train --dataset delicious --kernel linear --inducing 500 --factors 30 --batch 500
    --epochs "$epochs" --lr 0.01 --negatives all --seed 0 --checkpoint-every 520)
for side in one ranks; do
    ws="$work/$side"
    "$bin" --workspace "$ws" ingest --name delicious --train "$data/train.txt" \
        --test "$data/test.txt" >"$ws.log" 2>&1
    "$bin" --workspace "$ws" svd --dataset delicious --rank 250 --inducing 500 --seed 0 \
        >>"$ws.log" 2>&1
    if [ "$side" = one ]; then
        "$bin" --workspace "$ws" "${train[@]}" >>"$ws.log" 2>&1
    else
        mpirun -n 2 --oversubscribe --bind-to none $as_root "$bin" --workspace "$ws" \
            "${train[@]}" --threads 1 >>"$ws.log" 2>&1
    fi
    "$bin" --workspace "$ws" evaluate --run 3 --split test >>"$ws.log" 2>&1
done
python3 - "$work" <<'PY'
import sqlite3, sys
def figures(ws):
    db = sqlite3.connect(f"{ws}/catalog.sqlite")
    (train,) = db.execute("SELECT id FROM stage_runs WHERE stage = 'train' AND status = 'ok'").fetchone()
    (ev,) = db.execute("SELECT max(id) FROM stage_runs WHERE stage = 'evaluate' AND status = 'ok'").fetchone()
    elbo = dict(db.execute("SELECT step, value FROM metrics WHERE stage_run_id = ? AND name = 'epoch_elbo'", (train,)))
    exact = db.execute("SELECT value FROM metrics WHERE stage_run_id = ? AND name = 'elbo_exact'", (train,)).fetchone()
    p = dict(db.execute("SELECT name, value FROM metrics WHERE stage_run_id = ? AND name IN ('P@1', 'P@3', 'P@5')", (ev,)))
    return elbo, exact[0] if exact else None, p
one, ranks = figures(f"{sys.argv[1]}/one"), figures(f"{sys.argv[1]}/ranks")
rel = {e: abs(one[0][e] - ranks[0][e]) / abs(one[0][e]) for e in one[0]}
worst = max(rel, key=rel.get)
print(f"epochs: {len(one[0])}; per-epoch mean ELBO: largest relative difference {rel[worst]:.2e} (epoch {worst})")
if one[1] is not None:
    print(f"exact bound: one process {one[1]!r}, 2 ranks {ranks[1]!r} ({abs(one[1] - ranks[1]) / abs(one[1]):.1e} relative)")
for k in ("P@1", "P@3", "P@5"):
    print(f"test {k}: one process {100 * one[2][k]:.2f}, 2 ranks {100 * ranks[2][k]:.2f} ({'equal' if one[2][k] == ranks[2][k] else 'differs'} as doubles)")
PY
