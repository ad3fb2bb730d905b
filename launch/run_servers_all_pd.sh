#!/usr/bin/env bash
# Start every PD deployment a topology needs (workers, native sglang-routers, the shell router)
# and keep it up until Ctrl-C. Environment:
#   CONFIG_PATH  topology config, path or cfgs/ name (default tree_9_3_1_cpu); several, space-separated
#   BACKEND      torch (CPU reference engine, default) or sglang (GPU)
#   OUT          run folder for cluster.json and logs (default runs/servers-<time>)
#   HOST         bind address (default 127.0.0.1)
set -euo pipefail
cd "$(dirname "$0")/.."
MOA_PD=${MOA_PD:-.venv/bin/moa-pd}
CONFIG_PATH=${CONFIG_PATH:-tree_9_3_1_cpu}
BACKEND=${BACKEND:-torch}
OUT=${OUT:-runs/servers-$(date +%Y%m%d-%H%M%S)}
HOST=${HOST:-127.0.0.1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

config_flags=()
for c in $CONFIG_PATH; do config_flags+=(--config "$c"); done
exec "$MOA_PD" up "${config_flags[@]}" --backend "$BACKEND" --run-dir "$OUT" --host "$HOST"
