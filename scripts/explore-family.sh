#!/usr/bin/env bash
# A first look at members of the model family on Delicious's validation split: one seed,
# 40 epochs each, scored on `validation` (never on test). It decides which candidates get
# the 3-seed comparison of docs/experiments/selection.md; it chooses no configuration by itself.
# Usage: scripts/explore-family.sh PIPELINE_BINARY WORKSPACE
# Prints one line per model: name, train run, seconds, validation P@1/3/5.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 PIPELINE_BINARY WORKSPACE" >&2; exit 2; }
bin=$(realpath "$1"); ws=$2
data="$(cd "$(dirname "$0")/.." && pwd)/../shared/data/delicious"
"$bin" --workspace "$ws" ingest --name delicious-val --train "$data/train.txt" \
    --test "$data/test.txt" --validation-fraction 0.2 --validation-seed 0 >/dev/null
"$bin" --workspace "$ws" svd --dataset delicious-val --rank 250 --inducing 500 --seed 0 >/dev/null
common=(--dataset delicious-val --inducing 500 --factors 30 --batch 500 --lr 0.01
    --negatives all --seed 0 --epochs 40 --eval-every 10 --eval-split validation --threads 2)
while read -r name flags; do
    start=$(date +%s)
    # shellcheck disable=SC2086
    "$bin" --workspace "$ws" train "${common[@]}" $flags >"$ws/$name.train.log" 2>&1
    secs=$(($(date +%s) - start))
    # A fresh run ends 'trained run N: …'; one already done says '… already done (run N) …'.
    run=$(sed -n -e 's/^trained run \([0-9]*\):.*/\1/p' \
        -e 's/.*already done (run \([0-9]*\)).*/\1/p' "$ws/$name.train.log")
    "$bin" --workspace "$ws" evaluate --run "$run" --split validation --json \
        >"$ws/$name.eval.json" 2>/dev/null
    python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['p_at']; \
print(sys.argv[2], 'run', sys.argv[3], sys.argv[4], 's', \
'P@1/3/5 %.2f/%.2f/%.2f' % (100*p[0], 100*p[2], 100*p[4]))" \
        "$ws/$name.eval.json" "$name" "$run" "$secs"
done <<'LIST'
s-linear --kernel linear
s-linear-ard --kernel linear --ard subspace
se-linear --kernel se+linear
whitened-linear --kernel linear --q-form whitened
s-se --kernel se
LIST
