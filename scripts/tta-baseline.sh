#!/usr/bin/env bash
# Issue 33 baseline runs, one heavy process at a time, with a load monitor that logs every
# process other than the measured ones using CPU (the machine must be quiet for the clock).
# Usage: scripts/tta-baseline.sh PIPELINE_BINARY OUT_DIR [step...]
#   steps: del-free del-slinear omikuji mnist gpflow   (default: all but del-free/omikuji)
#   and the levers' runs (docs/experiments/time-to-accuracy.md):
#   del-free-to-target  the chosen Delicious configuration up to epoch 12 (--max-steps 252)
#   mnist-to-target     the baseline MNIST configuration up to epoch 49 (--max-steps 4753)
#   mnist-natural       the baseline MNIST configuration with --natural-step 0.1
#   mnist-fast          pipelines/classification/mnist-oddeven-fast.toml's train settings
#   gpflow-fast         GPflow with mnist-fast's batch, epochs and decay
set -euo pipefail
P=$1; OUT=$2; shift 2
STEPS=${*:-del-slinear mnist gpflow}
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=${SHARED:-$(cd "$HERE/../../shared" && pwd)}
DEL=$SHARED/data/delicious
MN=$SHARED/data/classification/mnist-oddeven
mkdir -p "$OUT"; cd "$OUT"
( while sleep 5; do date +%T; top -bn1 | awk 'NR>7 && $9>20 {print "   ", $1, $9, $12}'; done ) > load.log 2>&1 &
MON=$!
trap 'kill $MON' EXIT
del_common="--dataset del --kernel linear --inducing 500 --factors 30 --batch 500 --epochs 40 --lr 0.01 --negatives all --seed 0 --eval-every 1 --eval-split validation --checkpoint-every 21 --keep-checkpoints all"
for s in $STEPS; do
  case $s in
  del-free|del-slinear)
    export FSGP_WORKSPACE=$OUT/ws-del
    $P ingest --name del --train $DEL/train.txt --test $DEL/test.txt --validation-fraction 0.2 > ingest-del.log 2>&1
    [ -f svd-del.log ] || /usr/bin/time -f "svd wall %e s" $P svd --dataset del --rank 250 --inducing 500 --seed 0 > svd-del.log 2>&1
    if [ $s = del-free ]; then ii=free; else ii=subspace; fi
    /usr/bin/time -f "train wall %e s" $P --log-format jsonl train $del_common --inducing-inputs $ii > $s.log 2>&1 ;;
  del-free-to-target)
    export FSGP_WORKSPACE=$OUT/ws-del
    $P ingest --name del --train $DEL/train.txt --test $DEL/test.txt --validation-fraction 0.2 > ingest-del.log 2>&1
    [ -f svd-del.log ] || /usr/bin/time -f "svd wall %e s" $P svd --dataset del --rank 250 --inducing 500 --seed 0 > svd-del.log 2>&1
    /usr/bin/time -f "train wall %e s" $P --log-format jsonl train $del_common --inducing-inputs free --max-steps 252 > $s.log 2>&1 ;;
  omikuji)
    python3 "$HERE/tta-omikuji.py" --out "$OUT/omikuji" > omikuji.log 2> omikuji.stderr ;;
  mnist)
    export FSGP_WORKSPACE=$OUT/ws-mnist
    /usr/bin/time -f "ingest wall %e s" $P ingest --name mnist-oddeven --format libsvm --train $MN/train.txt.gz --test $MN/test.txt.gz --features 784 --no-normalize --validation-fraction 0.2 > ingest-mnist.log 2>&1
    /usr/bin/time -f "svd wall %e s" $P svd --dataset mnist-oddeven --rank 250 --inducing 200 --seed 0 > svd-mnist.log 2>&1
    /usr/bin/time -f "train wall %e s" $P --log-format jsonl train --dataset mnist-oddeven --task binary --latent independent --kernel se --inducing 200 --batch 500 --epochs 60 --lr 0.01 --lr-decay-at 40,50 --lr-decay 0.1 --negatives all --inducing-inputs free --likelihood logistic --q-form whitened --seed 0 --eval-every 1 --eval-split validation --checkpoint-every 96 --keep-checkpoints all > mnist.log 2>&1 ;;
  mnist-to-target|mnist-natural|mnist-fast)
    export FSGP_WORKSPACE=$OUT/ws-mnist
    [ -f ingest-mnist.log ] || $P ingest --name mnist-oddeven --format libsvm --train $MN/train.txt.gz --test $MN/test.txt.gz --features 784 --no-normalize --validation-fraction 0.2 > ingest-mnist.log 2>&1
    [ -f svd-mnist.log ] || /usr/bin/time -f "svd wall %e s" $P svd --dataset mnist-oddeven --rank 250 --inducing 200 --seed 0 > svd-mnist.log 2>&1
    mnist_common="--dataset mnist-oddeven --task binary --latent independent --kernel se --inducing 200 --negatives all --likelihood logistic --q-form whitened --seed 0 --eval-every 1 --eval-split validation --keep-checkpoints all"
    case $s in
      mnist-to-target) extra="--batch 500 --epochs 60 --lr 0.01 --lr-decay-at 40,50 --inducing-inputs free --checkpoint-every 96 --max-steps 4753" ;;
      mnist-natural) extra="--batch 500 --epochs 60 --lr 0.01 --lr-decay-at 40,50 --inducing-inputs free --checkpoint-every 96 --natural-step 0.1" ;;
      mnist-fast) extra="--batch 1000 --epochs 28 --lr 0.01 --lr-decay-at 20,25 --inducing-inputs subspace --checkpoint-every 49 --natural-step 0.1" ;;
    esac
    /usr/bin/time -f "train wall %e s" $P --log-format jsonl train $mnist_common $extra > $s.log 2>&1 ;;
  gpflow)
    python3 "$HERE/gpflow-svgp-natgrad.py" --steps 2880 --eval-every 48 --budget 240 > gpflow.log 2> gpflow.stderr ;;
  gpflow-fast)
    python3 "$HERE/gpflow-svgp-natgrad.py" --logistic --batch 1000 --steps 1344 --eval-every 48 --decay-at 20,25 --threads 2 > $s.log 2> $s.stderr ;;
  esac
done
