#!/usr/bin/env bash
# Runs the same pipeline with two `pipeline` binaries into two fresh workspaces and
# compares every checkpoint, predictions file and metrics JSON byte for byte:
#   (a) `pipeline run pipelines/quickstart.toml`;
#   (b) Delicious with the paper's settings (M = 500, P = 30, R = 250, B = 500, η = 0.01)
#       cut to --max-steps 300, for the linear kernel, the SE kernel, and --negatives 100;
#   (c) classification, cut short: banana (binary, probit and logistic, whitened q(u), free
#       Z; and probit with each other q(u) form, cholesky and sites) and MNIST's ten classes
#       (one-vs-each, robust-max, softmax; M = 20, 20 steps).
# Usage: scripts/compare-outputs.sh OLD NEW_BINARY OUT_DIR
# OLD is a `pipeline` binary, or the OUT_DIR/old.sha256 listing of an earlier call (so one
# baseline serves several comparisons; its workspace stays in OUT_DIR/old). NEW_BINARY `-`
# records only that baseline.
# Prints one line per file (sha256, workspace-relative path) for each side, then a verdict;
# exits non-zero when anything differs.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 OLD_BINARY NEW_BINARY OUT_DIR" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
old=$(realpath "$1"); new=$2; out=$3
data="$repo/../shared/data/delicious"
mkdir -p "$out"
out=$(realpath "$out")

# Trains, predicts and evaluates one cut-short classification run: DATASET TASK then train flags.
one_classifier() {
    local bin=$1 ws=$2 dataset=$3 task=$4; shift 4
    "$bin" --workspace "$ws" train --dataset "$dataset" --task "$task" --seed 0 --threads 2 \
        --checkpoint-every 10 "$@" 2>"$ws.train.log"
    cat "$ws.train.log" >>"$ws.log"
    local run
    run=$(sed -n 's/^trained run \([0-9]*\):.*/\1/p' "$ws.train.log")
    "$bin" --workspace "$ws" predict --run "$run" --split test --top-k 1 \
        --probabilities 2>>"$ws.log"
    "$bin" --workspace "$ws" evaluate --run "$run" --split test --json \
        >/dev/null 2>>"$ws.log"
}

classification() {
    local bin=$1 ws=$2 cls="$repo/../shared/data/classification"
    "$bin" --workspace "$ws" ingest --name banana --format libsvm --no-normalize \
        --train "$cls/banana/train.txt.gz" --test "$cls/banana/test.txt.gz" 2>>"$ws.log"
    "$bin" --workspace "$ws" svd --dataset banana --rank 2 --inducing 8 --seed 0 2>>"$ws.log"
    for link in probit logistic; do
        one_classifier "$bin" "$ws" banana binary --latent independent --kernel se \
            --inducing 8 --batch 100 --epochs 50 --max-steps 40 --inducing-inputs free \
            --q-form whitened --likelihood "$link"
    done
    for form in cholesky sites; do
        one_classifier "$bin" "$ws" banana binary --latent independent --kernel se \
            --inducing 8 --batch 100 --epochs 50 --max-steps 40 --inducing-inputs free \
            --q-form "$form" --likelihood probit
    done
    "$bin" --workspace "$ws" ingest --name mnist --format libsvm --no-normalize \
        --features 784 --train "$cls/mnist/train.txt.gz" --test "$cls/mnist/test.txt.gz" \
        2>>"$ws.log"
    "$bin" --workspace "$ws" svd --dataset mnist --rank 50 --inducing 20 --seed 0 2>>"$ws.log"
    for lik in ove robust-max softmax; do
        one_classifier "$bin" "$ws" mnist multiclass --latent independent --kernel se \
            --inducing 20 --batch 500 --epochs 1 --max-steps 20 --inducing-inputs free \
            --q-form whitened --likelihood "$lik"
    done
}

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
    classification "$bin" "$ws"
    (cd "$ws" && find . \( -name 'ckpt-*.parquet' -o -name 'predictions.parquet' \
        -o -name 'metrics.json' \) -type f | sort | xargs sha256sum)
}

if [[ "$1" == *.sha256 ]]; then
    [ "$old" = "$out/old.sha256" ] || cp "$old" "$out/old.sha256"
else
    one_side "$old" "$out/old" >"$out/old.sha256"
fi
[ "$new" = "-" ] && { echo "baseline: $(wc -l <"$out/old.sha256") files"; exit 0; }
one_side "$(realpath "$new")" "$out/new" >"$out/new.sha256"
echo "old: $(wc -l <"$out/old.sha256") files; new: $(wc -l <"$out/new.sha256") files"
if diff "$out/old.sha256" "$out/new.sha256"; then
    echo "identical: every checkpoint, predictions file and metrics JSON"
else
    echo "DIFFERENT (see above)"; exit 1
fi
