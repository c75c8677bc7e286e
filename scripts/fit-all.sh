#!/usr/bin/env bash
# `pipeline fit` on the seven public sets of docs/fit.md's results table, one at a time
# (the machine must be quiet: a fit's step counts come from its measured step times).
# Usage: scripts/fit-all.sh PIPELINE OUT_DIR [dataset...] ; FIT_ARGS adds fit options
# (e.g. FIT_ARGS=--no-early-stopping), BUDGET sets --budget (default 5m).
set -euo pipefail
P=$1; OUT=$2; shift 2
SETS=${*:-spambase satimage banana mnist-oddeven yeast scene delicious}
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=${SHARED:-$(cd "$HERE/../../shared" && pwd)}
mkdir -p "$OUT"; cd "$OUT"
for d in $SETS; do
  case $d in
    spambase|satimage|yeast|scene) train=$SHARED/data/dev/$d/train.txt.gz; test=$SHARED/data/dev/$d/test.txt.gz ;;
    banana|mnist-oddeven) train=$SHARED/data/classification/$d/train.txt.gz; test=$SHARED/data/classification/$d/test.txt.gz ;;
    delicious) train=$SHARED/data/delicious/train.txt; test=$SHARED/data/delicious/test.txt ;;
  esac
  # fit never overwrites a spec, and a workspace here may be someone's: refuse, do not delete.
  for old in "ws-$d"; do
    [ -e "$old" ] && { echo "$OUT/$old exists: remove it or choose another OUT_DIR" >&2; exit 1; }
  done
  FSGP_WORKSPACE=$OUT/ws-$d /usr/bin/time -f "fit wall %e s" $P fit --train $train --test $test \
    --budget ${BUDGET:-5m} --name $d ${FIT_ARGS:-} > fit-$d.out 2> fit-$d.err
done
