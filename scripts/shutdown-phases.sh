#!/usr/bin/env bash
# Prints the phases of a sync API Shutdown (the reply's `phases`, ms) of one
# microVM: the test guest (or the firmware) touching all its RAM first.
#   scripts/shutdown-phases.sh MIB None|Transparent guest|firmware
# TERAVM names the binary (default target/release/teravm), BACKING the
# memory backing (default anonymous). Needs curl and python3.
set -euo pipefail
mib=$1 pages=$2 kind=$3
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${TERAVM:-$root/target/release/teravm}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if [ "$kind" = guest ]; then
    boot="\"kernel_image_path\": \"$root/target/release/teravm-guest\", \"boot_args\": \"touch=all\""
else
    boot="\"boot_args\": \"touch=all then=idle\""
fi
cat > "$dir/vm.json" <<JSON
{"machine-config": {"vcpu_count": 2, "mem_size_mib": $mib, "huge_pages": "$pages"},
 "boot-source": {$boot},
 "memory": {"backing": "${BACKING:-anonymous}", "numa_policy": "none", "populate": false},
 "reclaim": {"workers_per_node": 2, "parallel_threshold_mib": 0, "steal": true}}
JSON
"$bin" --api-sock "$dir/api.sock" --config-file "$dir/vm.json" --linger-ms 0 >"$dir/out" 2>"$dir/err" &
pid=$!
# The guest's own line says its memory is touched.
for _ in $(seq 1 1200); do
    grep -q "touched" "$dir/out" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/err"; exit 1; }
    sleep 0.05
done
curl -s --unix-socket "$dir/api.sock" -X PUT http://localhost/actions \
    -d '{"action_type": "Shutdown", "reclaim": "sync"}' |
    python3 -c 'import json, sys; p = json.load(sys.stdin)["phases"]; print(" ".join("%s=%s" % (k[:-3], v) for k, v in p.items()))'
wait "$pid"
