#!/bin/bash
# What a training step costs as the label count grows: L = 1 000 against L = 50 000, the
# same rows, features and model otherwise (docs/model.md, "Many labels").
#
#   scripts/label-scale.sh PIPELINE WORKDIR
#
# PIPELINE is a built `pipeline` binary; WORKDIR a fresh directory (its data and workspace
# are written there). `pipeline synth` writes two sparse text-like sets of 10 000 training
# rows, 20 000 features, 50 non-zeros and 5 labels per row, with 1 000 and 50 000 labels;
# each is ingested and gets an svd of rank 250 with M = 500. Every configuration then
# trains 2 and 8 steps (linear kernel, subspace Z, B = 500, one thread) and the line
# printed is the CPU seconds of the 6 steps between (user + system time of the process,
# so the one-off setup and the checkpoint cancel and other load on the machine counts
# less than in wall-clock time), and the process's peak RSS (the larger run's). The last
# column is the step's ratio to the same options at L = 1 000 in the same run.
set -euo pipefail
BIN=$(realpath "$1")
WORK=$2
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
export FSGP_WORKSPACE="$WORK/ws"
# A seed of this invocation's own: a second invocation (another build) in the same WORKDIR
# trains new runs instead of finding these done.
SEED=${SEED:-$(date +%s)}
for L in 1000 50000; do
  if [ ! -e "$WORK/s$L/train.txt" ]; then
    "$BIN" synth --out "$WORK/s$L" --rows 10000 --test-rows 1000 --features 20000 \
      --labels "$L" --nnz-per-row 50 --labels-per-row 5 --seed 1 >/dev/null 2>&1
    "$BIN" ingest --name "s$L" --train "$WORK/s$L/train.txt" --test "$WORK/s$L/test.txt" \
      >/dev/null 2>&1
    "$BIN" svd --dataset "s$L" --rank 250 --inducing 500 >/dev/null 2>&1
  fi
done

# CPU seconds (user + system) and peak RSS (KiB) of one training run of $1 steps.
run() {
  local steps=$1 dataset=$2
  shift 2
  /usr/bin/time -f "%U %S %M" -o "$WORK/time" "$BIN" train --dataset "$dataset" \
    --kernel linear --inducing 500 --batch 500 --steps "$steps" --seed "$SEED" \
    --no-final-elbo --threads 1 "$@" >/dev/null 2>"$WORK/err" || {
    tail -3 "$WORK/err" >&2
    return 1
  }
  cat "$WORK/time"
}

# CPU seconds per step and peak RSS in MiB of the options "$@" on dataset $1.
per_step() {
  local dataset=$1
  shift
  local two eight
  two=$(run 2 "$dataset" "$@")
  eight=$(run 8 "$dataset" "$@")
  awk -v a="$two" -v b="$eight" 'BEGIN {
    split(a, x, " "); split(b, y, " ");
    printf "%.3f %.0f", ((y[1] + y[2]) - (x[1] + x[2])) / 6, y[3] / 1024 }'
}

echo "seed $SEED; $BIN"
printf '%-36s %14s %14s %12s %12s %8s\n' "options" "L=1000 s/step" "L=50000 s/step" \
  "L=1000 MiB" "L=50000 MiB" "ratio"
CONFIGS=(
  "--factors 30"
  "--factors 30 --negatives 1000"
  "--factors 106 --negatives 1000"
  "--factors 200 --negatives 1000"
)
for options in "${CONFIGS[@]}"; do
  # Word splitting of $options is meant: it holds several flags.
  # shellcheck disable=SC2086
  read -r small small_mib <<<"$(per_step s1000 $options)"
  # shellcheck disable=SC2086
  read -r large large_mib <<<"$(per_step s50000 $options)"
  awk -v o="$options" -v s="$small" -v l="$large" -v sm="$small_mib" -v lm="$large_mib" \
    'BEGIN { printf "%-36s %14.3f %14.3f %12d %12d %8.2f\n", o, s, l, sm, lm, l / s }'
done
