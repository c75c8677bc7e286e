#!/usr/bin/env bash
# Model files for the `pipeline serve` benchmark (issue 32).
#
#   scripts/serve-bench-models.sh WORKDIR [PIPELINE]
#
# Writes, under WORKDIR:
#   ws-delicious/            workspace: Delicious ingested, svd, trained (pipelines/delicious.toml's settings)
#   delicious.fsgp-model     `pipeline export` of that training run
#   synth-amazoncat/         `pipeline synth --shape amazoncat` text files, rows scaled down
#   ws-amazoncat/            workspace: the synthetic data ingested, svd, trained a few hundred steps
#   amazoncat.fsgp-model     `pipeline export` of that run: AmazonCat-13K's D and L (203 882, 13 330),
#                            M, R, P at their defaults (500, 250, 30)
# and prints the files' sizes and each model's D, L, M, R, P.
#
# PIPELINE (2nd argument or env; default: `pipeline` on PATH) is the binary used.
# Knobs (env):
#   DELICIOUS_DATA        directory of Delicious's train.txt and test.txt [/work/shared/data/delicious]
#   DELICIOUS_MAX_STEPS   stop Delicious's training after this many steps; 0 = the paper's full
#                         200 epochs (5200 steps). Default 2080 (80 epochs): the full run takes
#                         ~15-25 min on a 2-core machine, and only the model's shape matters here.
#   SYNTH_ROWS            training rows of the synthetic data [50000]; test rows: synth's default
#                         ratio (AmazonCat's 306 782 / 1 186 239, ~12 900 test rows)
#   SYNTH_STEPS           training steps on the synthetic data [300]
#   THREADS               --threads of every stage [all cores]
# Stages already done are skipped by the pipeline itself (same inputs and options); an existing
# model file is kept (delete it to export again).
set -euo pipefail

if [[ $# -lt 1 ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 2
fi
WORKDIR=$1
PIPELINE=${2:-${PIPELINE:-pipeline}}
DELICIOUS_DATA=${DELICIOUS_DATA:-/work/shared/data/delicious}
DELICIOUS_MAX_STEPS=${DELICIOUS_MAX_STEPS:-2080}
SYNTH_ROWS=${SYNTH_ROWS:-50000}
SYNTH_STEPS=${SYNTH_STEPS:-300}
THREADS_ARG=()
[[ -n ${THREADS:-} ]] && THREADS_ARG=(--threads "$THREADS")

mkdir -p "$WORKDIR"
WORKDIR=$(cd "$WORKDIR" && pwd)
command -v "$PIPELINE" >/dev/null || { echo "no pipeline binary: $PIPELINE" >&2; exit 1; }

stamp() { echo "== $(date -u +%H:%M:%S) $*" >&2; }
timed() { # timed LABEL CMD...: run, print wall seconds
    local label=$1 t0 t1
    shift
    t0=$EPOCHREALTIME
    "$@"
    t1=$EPOCHREALTIME
    printf '== %s: %s s\n' "$label" "$(python3 -c "print(round($t1 - $t0, 1))")" >&2
}
# Newest finished training run of a dataset in a workspace.
last_run() {
    "$PIPELINE" --workspace "$1" status --json | python3 -c '
import json, sys
runs = [r for r in json.load(sys.stdin)["train_runs"] if r["dataset"] == sys.argv[1] and r["status"] == "ok"]
if not runs: sys.exit("no finished training run of " + sys.argv[1])
print(max(r["id"] for r in runs))' "$2"
}
export_model() { # export_model WS DATASET OUT
    local run
    run=$(last_run "$1" "$2")
    if [[ -e $3 ]]; then
        stamp "$3 exists (kept); run $run"
    else
        stamp "export run $run -> $3"
        timed "export $2" "$PIPELINE" --workspace "$1" export --run "$run" --out "$3"
    fi
    echo "$2: run $run, model $3, $(stat -c %s "$3") bytes ($(du -h "$3" | cut -f1))"
}

# ---- a. Delicious, pipelines/delicious.toml's settings --------------------------------------
WS=$WORKDIR/ws-delicious
stamp "Delicious: ingest"
timed "ingest delicious" "$PIPELINE" --workspace "$WS" ingest --name delicious \
    --train "$DELICIOUS_DATA/train.txt" --test "$DELICIOUS_DATA/test.txt" "${THREADS_ARG[@]}"
stamp "Delicious: svd"
timed "svd delicious" "$PIPELINE" --workspace "$WS" svd --dataset delicious \
    --rank 250 --inducing 500 --seed 0 "${THREADS_ARG[@]}"
MAX_STEPS_ARG=()
[[ $DELICIOUS_MAX_STEPS != 0 ]] && MAX_STEPS_ARG=(--max-steps "$DELICIOUS_MAX_STEPS")
if last_run "$WS" delicious >/dev/null 2>&1; then
    stamp "Delicious: a finished training run exists, not training again"
else
    stamp "Delicious: train (max steps: ${DELICIOUS_MAX_STEPS/#0/all})"
    timed "train delicious" "$PIPELINE" --workspace "$WS" train --dataset delicious \
        --kernel linear --inducing 500 --factors 30 --batch 500 --epochs 200 --lr 0.01 \
        --negatives all --seed 0 --checkpoint-every 520 --eval-every 20 --eval-split test \
        "${MAX_STEPS_ARG[@]}" "${THREADS_ARG[@]}"
fi
export_model "$WS" delicious "$WORKDIR/delicious.fsgp-model"

# ---- b. AmazonCat-shaped synthetic data -------------------------------------------------------
SYN=$WORKDIR/synth-amazoncat
WS=$WORKDIR/ws-amazoncat
if [[ -s $SYN/train.txt && -s $SYN/test.txt ]]; then
    stamp "synth: $SYN exists (kept)"
else
    stamp "synth --shape amazoncat --rows $SYNTH_ROWS"
    timed "synth" "$PIPELINE" --workspace "$WS" synth --shape amazoncat --rows "$SYNTH_ROWS" \
        --seed 0 --out "$SYN" "${THREADS_ARG[@]}"
fi
stamp "amazoncat-synth: ingest"
timed "ingest amazoncat-synth" "$PIPELINE" --workspace "$WS" ingest --name amazoncat-synth \
    --train "$SYN/train.txt" --test "$SYN/test.txt" "${THREADS_ARG[@]}"
stamp "amazoncat-synth: svd (R, M defaults)"
timed "svd amazoncat-synth" "$PIPELINE" --workspace "$WS" svd --dataset amazoncat-synth \
    --seed 0 "${THREADS_ARG[@]}"
if last_run "$WS" amazoncat-synth >/dev/null 2>&1; then
    stamp "amazoncat-synth: a finished training run exists, not training again"
else
    # The exact full-data ELBO at the end is a pass over N x L terms: skipped.
    stamp "amazoncat-synth: train $SYNTH_STEPS steps (M, P defaults)"
    timed "train amazoncat-synth" "$PIPELINE" --workspace "$WS" train --dataset amazoncat-synth \
        --kernel linear --batch 500 --lr 0.01 --negatives all --seed 0 --steps "$SYNTH_STEPS" \
        --checkpoint-every "$SYNTH_STEPS" --no-final-elbo "${THREADS_ARG[@]}"
fi
export_model "$WS" amazoncat-synth "$WORKDIR/amazoncat.fsgp-model"

# ---- shapes ---------------------------------------------------------------------------------
echo
for pair in "$WORKDIR/ws-delicious delicious" "$WORKDIR/ws-amazoncat amazoncat-synth"; do
    set -- $pair
    "$PIPELINE" --workspace "$1" status --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
name = sys.argv[1]
ds = [x for x in d["datasets"] if x.get("name") == name]
runs = [r for r in d["train_runs"] if r["dataset"] == name and r["status"] == "ok"]
r = max(runs, key=lambda r: r["id"])
D = ds[0]["n_features"]; L = ds[0]["n_labels"]
print("%s: run %d: D = %d, L = %d, M = %d, R = %d, P = %d, steps = %s/%s" % (name, r["id"], D, L,
      r["inducing"], r["rank"], r["factors"], r["steps_done"], r["steps_total"]))' "$2"
done
ls -l "$WORKDIR"/*.fsgp-model
