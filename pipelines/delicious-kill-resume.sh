#!/usr/bin/env bash
# Kill-and-resume check on real data: pipelines/delicious.toml shortened to 6 epochs, run once
# uninterrupted and once killed with SIGKILL after its third checkpoint (then re-invoked);
# the two must end with identical checkpoints (checksums) and identical metrics.
#   bash pipelines/delicious-kill-resume.sh     (needs sqlite3; ~5 minutes on 2 cores)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${FSGP_BIN:-$repo/target/release/pipeline}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
data=$(cd "$repo/../shared/data/delicious" && pwd)
sed -e "s#\"../../shared/data/delicious/#\"$data/#" -e 's/^epochs = 200/epochs = 6/' \
    -e 's/^checkpoint_every = 520/checkpoint_every = 26/' -e '/^eval_every/d' -e '/^eval_split/d' \
    "$repo/pipelines/delicious.toml" > "$work/delicious-6.toml"
cd "$work"
"$bin" --workspace ref run delicious-6.toml --json > ref.json 2> ref.err
"$bin" --workspace kill run delicious-6.toml --json > /dev/null 2> kill1.err &
pid=$!
count() { sqlite3 kill/catalog.sqlite "$1" 2>/dev/null || echo 0; }
until [ "$(count 'select count(*) from checkpoints')" -ge 3 ]; do sleep 0.2; done
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
echo "killed after $(count 'select max(step) from checkpoints') steps"
"$bin" --workspace kill run delicious-6.toml --json > kill.json 2> kill2.err
grep -E "interrupted|resuming" kill2.err
cmp ref.json kill.json && echo "metrics identical"
q="select step, checksum from checkpoints order by step"
cmp <(sqlite3 ref/catalog.sqlite "$q") <(sqlite3 kill/catalog.sqlite "$q") && echo "checkpoint checksums identical"
cat kill.json
