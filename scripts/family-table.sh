#!/usr/bin/env bash
# The Delicious family table: runs each given spec (default: every pipelines/family/*.toml,
# each a 3-seed sweep trained on the training file and scored once on test; the specs of
# pipelines/selection/ work the same way on the validation split) into one workspace and
# prints one Markdown row per spec: the split scored, P@1/P@3/P@5 as mean ± sample sd over
# the seeds, and the training loop's seconds per seed (mean). Specs already run are found
# in the catalog and not trained again, so the script can be stopped and rerun.
# Usage: scripts/family-table.sh PIPELINE_BINARY WORKSPACE [SPEC...]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 PIPELINE_BINARY WORKSPACE [SPEC...]" >&2; exit 2; }
bin=$(realpath "$1"); ws=$2; shift 2
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -gt 0 ] || set -- "$root"/pipelines/family/*.toml
mkdir -p "$ws"
echo "| model | spec | split | P@1 | P@3 | P@5 | train s per seed |"
echo "|---|---|---|---|---|---|---|"
for spec in "$@"; do
    name=$(basename "$spec" .toml)
    # family/s-linear and selection/s-linear keep their outputs apart.
    log="$ws/$(basename "$(dirname "$spec")")-$name"
    "$bin" --workspace "$ws" run "$spec" --json >"$log.json" 2>"$log.log"
    python3 - "$ws" "$name" "$spec" "$root" "$log.json" <<'PY'
import json, os, sqlite3, statistics, sys, tomllib
ws, name, spec, root, log = sys.argv[1:6]
split = tomllib.load(open(spec, "rb"))["predict"].get("split", "test")
rel = os.path.relpath(os.path.realpath(spec), root)
out = json.load(open(log))
db = sqlite3.connect(f"{ws}/catalog.sqlite")
def seconds(run):
    # The training loop's own seconds (the train stage's `train_seconds` metric): the stage
    # run's wall time would also count an interrupted attempt that was resumed.
    (v,) = db.execute("SELECT value FROM metrics WHERE stage_run_id = ? AND name = 'train_seconds' "
                      "ORDER BY id DESC LIMIT 1", (run,)).fetchone()
    return v
p = [[100 * r["metrics"]["p_at"][k] for r in out["runs"]] for k in (0, 2, 4)]
cells = [f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}" for v in p]
secs = statistics.mean(seconds(r["train_run"]) for r in out["runs"])
print(f"| {name} | `{rel}` | {split} | " + " | ".join(cells) + f" | {secs:.0f} |")
PY
done
