#!/usr/bin/env bash
# Banana (Hensman, Matthews & Ghahramani, *Scalable Variational Gaussian Process
# Classification*, Figure 1): runs pipelines/classification/banana/m{4,8,16,32,64}.toml into
# WORKSPACE (each: ingest once, k-means start for its M, train the spec's seeds, predict and
# evaluate on the 4 900 test rows), draws each M's decision boundary from its seed-0 run
# with `pipeline report` and copies the PNG to IMG_DIR/banana-m<M>.png (default
# WORKSPACE/banana-img), and prints one Markdown row per M: held-out mean NLP and accuracy
# (mean ± sample sd over the seeds when there are several) and the training loop's seconds
# per seed (mean).
# Runs already in the workspace are found in the catalog, not trained again.
# Usage: scripts/banana.sh PIPELINE_BINARY WORKSPACE [IMG_DIR]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 PIPELINE_BINARY WORKSPACE [IMG_DIR]" >&2; exit 2; }
[ -x "$1" ] || { echo "$0: $1 is not an executable pipeline binary" >&2; exit 2; }
bin=$(realpath "$1"); ws=$2; img=${3:-$ws/banana-img}
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$ws" "$img"
echo "| M | test NLP | test accuracy % | train s per seed |"
echo "|---:|---:|---:|---:|"
for m in 4 8 16 32 64; do
    spec="$root/pipelines/classification/banana/m$m.toml"
    log="$ws/banana-m$m"
    "$bin" --workspace "$ws" run "$spec" --json >"$log.json" 2>"$log.log"
    run0=$(python3 -c 'import json, sys
print(next(r["train_run"] for r in json.load(open(sys.argv[1]))["runs"] if r["seed"] == 0))' "$log.json")
    "$bin" --workspace "$ws" report --run "$run0" --out "$ws/banana-report-m$m" 2>>"$log.log"
    cp "$ws/banana-report-m$m/decision-boundary.png" "$img/banana-m$m.png"
    python3 - "$ws" "$m" "$log.json" <<'PY'
import json, sqlite3, statistics, sys
ws, m, log = sys.argv[1:4]
runs = json.load(open(log))["runs"]
db = sqlite3.connect(f"{ws}/catalog.sqlite")
def seconds(run):
    # The training loop's own seconds (`train_seconds`), not the stage's wall time.
    (v,) = db.execute("SELECT value FROM metrics WHERE stage_run_id = ? AND name = 'train_seconds' "
                      "ORDER BY id DESC LIMIT 1", (run,)).fetchone()
    return v
def cell(values, scale, digits):
    # One seed: the value; several: mean ± sample sd.
    v = [scale * x for x in values]
    if len(v) == 1:
        return f"{v[0]:.{digits}f}"
    return f"{statistics.mean(v):.{digits}f} ± {statistics.stdev(v):.{digits}f}"
nlp = cell([r["metrics"]["nlp"] for r in runs], 1, 4)
acc = cell([r["metrics"]["accuracy"] for r in runs], 100, 2)
secs = statistics.mean(seconds(r["train_run"]) for r in runs)
print(f"| {m} | {nlp} | {acc} | {secs:.0f} |")
PY
done
