#!/usr/bin/env bash
# Validation and test curves for choosing an early-stopping rule (issue 33, lever 4;
# docs/experiments/stopping.md). For each dataset: ingest as `pipeline fit` does (a 20 %
# validation carve, seed 0), the svd and train options of the candidate fit chose there,
# and a run that scores validation every ⌈S/50⌉ steps without ever stopping (patience
# larger than the budget) and keeps a checkpoint at every score. Then the test figures of
# every checkpoint. scripts/stopping-rules.py replays the rules on the validation scores.
# Usage: scripts/stopping-curves.sh PIPELINE OUT_DIR [dataset...]
set -euo pipefail
P=$1; OUT=$2; shift 2
SETS=${*:-spambase satimage banana yeast scene delicious mnist-oddeven}
SEEDS=${SEEDS:-0 1 2}
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=${SHARED:-$(cd "$HERE/../../shared" && pwd)}
mkdir -p "$OUT"; cd "$OUT"
for d in $SETS; do
  export FSGP_WORKSPACE=$OUT/ws-$d
  fmt=libsvm; test=; steps=3000
  case $d in
    spambase|satimage) dir=$SHARED/data/dev/$d; train=$dir/train.txt.gz; test=$dir/test.txt.gz ;;
    yeast|scene) fmt=xc; dir=$SHARED/data/dev/$d; train=$dir/train.txt.gz; test=$dir/test.txt.gz ;;
    banana|mnist-oddeven) dir=$SHARED/data/classification/$d; train=$dir/train.txt.gz; test=$dir/test.txt.gz ;;
    delicious) fmt=xc; train=$SHARED/data/delicious/train.txt; test=$SHARED/data/delicious/test.txt ;;
  esac
  case $d in
    spambase) svd="--rank 56 --inducing 100"; tr="--task binary --kernel se+linear --inducing 100 --inducing-inputs free --latent independent --likelihood logistic --q-form whitened --natural-step 0.1" ;;
    banana) svd="--rank 1 --inducing 100"; tr="--task binary --kernel se+linear --inducing 100 --inducing-inputs free --latent independent --likelihood logistic --q-form whitened --natural-step 0.1" ;;
    satimage) svd="--rank 35 --inducing 300"; tr="--task multiclass --kernel se --inducing 300 --inducing-inputs free --latent independent --likelihood softmax --q-form whitened --natural-step 0.1" ;;
    yeast) svd="--rank 102 --inducing 200"; tr="--task multilabel --kernel se --inducing 200 --inducing-inputs free --factors 14" ;;
    scene) svd="--rank 250 --inducing 200"; tr="--task multilabel --kernel se --inducing 200 --inducing-inputs free --factors 6" ;;
    delicious) steps=1050; svd="--rank 250 --inducing 150"; tr="--task multilabel --kernel linear --inducing 150 --inducing-inputs free --factors 30 --lr 0.02" ;;
    mnist-oddeven) steps=2400; svd="--rank 250 --inducing 200"; tr="--task binary --kernel se --inducing 200 --inducing-inputs subspace --latent independent --likelihood logistic --q-form whitened --natural-step 0.1 --batch 1000" ;;
  esac
  every=$(( (steps + 49) / 50 ))
  $P ingest --name $d --format $fmt --train $train --test $test --validation-fraction 0.2 --validation-seed 0 > ingest-$d.log 2>&1
  for seed in $SEEDS; do
    log=$d-s$seed
    [ -f $log.done ] && continue
    $P svd --dataset $d --seed $seed $svd > svd-$log.log 2>&1
    $P train --dataset $d $tr --seed $seed --steps $steps --no-final-elbo --early-stopping --validate-every $every --patience 1000000 --checkpoint-every $every --keep-checkpoints all > train-$log.log 2>&1
    run=$(grep -o "trained run [0-9]*" train-$log.log | grep -o "[0-9]*$")
    $P status --run $run --json > status-$log.json
    for s in $(seq $every $every $steps); do
      echo "== step $s"; $P evaluate --run $run --checkpoint $s --split test --k 5 --json 2>/dev/null
    done > test-$log.txt
    touch $log.done
  done
done
