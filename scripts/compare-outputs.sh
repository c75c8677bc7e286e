#!/usr/bin/env bash
# Runs the same pipeline with two `pipeline` binaries into two fresh workspaces and
# compares every checkpoint, predictions file and metrics JSON byte for byte:
#   (a) `pipeline run pipelines/quickstart.toml`;
#   (b) Delicious with the paper's settings (M = 500, P = 30, R = 250, B = 500, η = 0.01)
#       cut to --max-steps 300, for the linear kernel, the SE kernel, and --negatives 100.
# Usage: scripts/compare-outputs.sh OLD_BINARY NEW_BINARY OUT_DIR
# Prints one line per file (sha256, workspace-relative path) for each side, then a verdict;
# exits non-zero when anything differs.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 OLD_BINARY NEW_BINARY OUT_DIR" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
old=$(realpath "$1"); new=$(realpath "$2"); out=$3
data="$repo/../shared/data/delicious"
mkdir -p "$out"
out=$(realpath "$out")

one_side() {
    local bin=$1 ws=$2
    rm -rf "$ws"
    "$bin" --workspace "$ws" run "$repo/pipelines/quickstart.toml" --json >/dev/null 2>"$ws.log"
    "$bin" --workspace "$ws" ingest --name delicious --train "$data/train.txt" \
        --test "$data/test.txt" 2>>"$ws.log"
    "$bin" --workspace "$ws" svd --dataset delicious --rank 250 --inducing 500 --seed 0 \
        2>>"$ws.log"
    for variant in "linear all" "se all" "linear 100"; do
        set -- $variant
        "$bin" --workspace "$ws" train --dataset delicious --kernel "$1" --inducing 500 \
            --factors 30 --batch 500 --epochs 200 --lr 0.01 --negatives "$2" --seed 0 \
            --max-steps 300 --checkpoint-every 100 --threads 2 2>"$ws.train.log"
        cat "$ws.train.log" >>"$ws.log"
        local run
        run=$(sed -n 's/^trained run \([0-9]*\):.*/\1/p' "$ws.train.log")
        "$bin" --workspace "$ws" predict --run "$run" --split test --top-k 5 \
            --probabilities 2>>"$ws.log"
        "$bin" --workspace "$ws" evaluate --run "$run" --split test --json \
            >/dev/null 2>>"$ws.log"
    done
    (cd "$ws" && find . \( -name 'ckpt-*.parquet' -o -name 'predictions.parquet' \
        -o -name 'metrics.json' \) -type f | sort | xargs sha256sum)
}

one_side "$old" "$out/old" >"$out/old.sha256"
one_side "$new" "$out/new" >"$out/new.sha256"
echo "old: $(wc -l <"$out/old.sha256") files; new: $(wc -l <"$out/new.sha256") files"
if diff "$out/old.sha256" "$out/new.sha256"; then
    echo "identical: every checkpoint, predictions file and metrics JSON"
else
    echo "DIFFERENT (see above)"; exit 1
fi
