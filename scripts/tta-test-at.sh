#!/usr/bin/env bash
# Test metrics of a run's checkpoints: scripts/tta-test-at.sh PIPELINE WORKSPACE RUN STEP...
set -euo pipefail
P=$1; export FSGP_WORKSPACE=$2; RUN=$3; shift 3
for s in "$@"; do
  echo "== run $RUN checkpoint $s"
  $P evaluate --run $RUN --checkpoint $s --split test --k 5 2>&1 | tail -n 12
done
