#!/usr/bin/env bash
# make demo: a dispatcher and two workers on loopback, one epoch of a
# built-in dataset streamed through libsluice with DYNAMIC sharding.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
var=var/demo
mkdir -p "$var"

spec=$var/dataset.json
if [[ ! -f $spec ]]; then
  # The built-in demo dataset: 20 million int64 ids, shuffled within a
  # window, in batches of 1024.
  cat > "$spec" <<'JSON'
{"source": {"type": "range", "start": 0, "stop": 20000000},
 "ops": [{"op": "shuffle", "buffer_size": 4096, "seed": 7},
         {"op": "batch", "batch_size": 1024, "drop_remainder": false}]}
JSON
  echo "demo: wrote the demo dataset spec to $spec"
fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Starts a daemon in the background, waits for its listening line and
# sets $port. Not to be called in $(...): the daemon must be a child of
# this shell, for the cleanup and the wait below.
start() {
  local name=$1; shift
  "$@" >"$var/$name.out" 2>"$var/$name.log" &
  pids+=($!)
  for _ in $(seq 1 200); do
    if grep -q 'listening port=' "$var/$name.out"; then
      port=$(sed -n 's/.*listening port=\([0-9]*\).*/\1/p' "$var/$name.out")
      return
    fi
    kill -0 "${pids[-1]}" 2>/dev/null || { echo "demo: $name failed:"; cat "$var/$name.log"; exit 1; }
    sleep 0.05
  done
  echo "demo: $name did not start"; exit 1
}

# Both bind loopback only: nothing of the demo is reachable from elsewhere.
start dispatcher "$build/dispatcher/sluice-dispatcher" --bind 127.0.0.1 --port 0 --admin-port 0 --work-dir "$var/dispatcher"
dport=$port
echo "demo: dispatcher on 127.0.0.1:$dport"
for i in 1 2; do
  start "worker$i" "$build/workerd/sluice-workerd" --dispatcher "127.0.0.1:$dport" --bind 127.0.0.1 --port 0 \
    --admin-port 0
  wport=$port
  echo "demo: worker $i on 127.0.0.1:$wport"
done

echo "demo: streaming one epoch of $spec with DYNAMIC sharding"
"$build/client/sluice-cat" --dispatcher "127.0.0.1:$dport" --dataset "$spec" --sharding dynamic \
  --format count --progress 2>"$var/cat.err" || { cat "$var/cat.err"; exit 1; }
tr '\r' '\n' <"$var/cat.err" | grep -v '^$' | tail -n 2 | head -n 1
summary=$(tail -n 1 "$var/cat.err")
/usr/bin/python3 - "$summary" <<'PY'
import json, sys
s = json.loads(sys.argv[1])
print("demo: %d elements in %d batches, %.1f MB in %.2f s: %.0f elements/s, %.1f MB/s"
      % (s["elements"], s["batches"], s["bytes"] / 1e6, s["seconds"],
         s["elements"] / s["seconds"], s["bytes"] / 1e6 / s["seconds"]))
PY

status=0
for p in "${pids[@]}"; do
  kill -TERM "$p"
  wait "$p" || status=1
done
pids=()
[[ $status -eq 0 ]] && echo "demo: dispatcher and workers stopped cleanly" || echo "demo: a daemon failed to stop cleanly"
exit $status
