#!/usr/bin/env bash
# The main job on an embedded default: generate a Delicious-shaped dataset, ingest it, factorise
# it, show the workspace. Later stages (train, predict, evaluate) join this run as they land.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
bin=./target/release/pipeline
ws=${FSGP_WORKSPACE:-fsgp-workspace}
$bin synth --out "$ws/inputs/quickstart" --shape delicious --seed 1
$bin --workspace "$ws" ingest --name quickstart \
    --train "$ws/inputs/quickstart/train.txt" --test "$ws/inputs/quickstart/test.txt"
$bin --workspace "$ws" svd --dataset quickstart --rank 100 --inducing 200
$bin --workspace "$ws" status
