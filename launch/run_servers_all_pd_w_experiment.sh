#!/usr/bin/env bash
# Start the deployments, run the paper's settings on a dataset, tear everything down.
# Environment:
#   CONFIG_PATH          tree topology (default tree_9_3_1_cpu)
#   DENSE_CONFIG_PATH    dense all-to-all topology for setting 1 (default all_to_all_9_9_1_cpu;
#                        empty to skip setting 1)
#   DATASET              gsm8k, math500, aime2025, mmlu_prox_lite, ifbench, bbh, or a JSONL path
#   NUM_SAMPLES          questions to run (default 10)
#   QUESTION_BATCH_SIZE  questions in flight at once (default 1)
#   SETTINGS             which settings (default 1,2,3,4)
#   BACKEND              torch (default) or sglang
#   OUT                  run folder (default runs/experiment-<time>)
set -euo pipefail
cd "$(dirname "$0")/.."
MOA_PD=${MOA_PD:-.venv/bin/moa-pd}
CONFIG_PATH=${CONFIG_PATH:-tree_9_3_1_cpu}
DENSE_CONFIG_PATH=${DENSE_CONFIG_PATH-all_to_all_9_9_1_cpu}
DATASET=${DATASET:-gsm8k}
NUM_SAMPLES=${NUM_SAMPLES:-10}
QUESTION_BATCH_SIZE=${QUESTION_BATCH_SIZE:-1}
SETTINGS=${SETTINGS:-1,2,3,4}
BACKEND=${BACKEND:-torch}
OUT=${OUT:-runs/experiment-$(date +%Y%m%d-%H%M%S)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if [ -z "$DENSE_CONFIG_PATH" ]; then
  SETTINGS=$(echo "$SETTINGS" | tr ',' '\n' | grep -v '^1$' | paste -sd, -)
fi
up_flags=(--config "$CONFIG_PATH")
run_flags=(--config "$CONFIG_PATH")
if [ -n "$DENSE_CONFIG_PATH" ]; then
  up_flags+=(--config "$DENSE_CONFIG_PATH")
  run_flags+=(--dense-config "$DENSE_CONFIG_PATH")
fi

"$MOA_PD" up "${up_flags[@]}" --backend "$BACKEND" --run-dir "$OUT/deployment" --detach
trap '"$MOA_PD" down --run-dir "$OUT/deployment"' EXIT
"$MOA_PD" run "${run_flags[@]}" --dataset "$DATASET" --num-samples "$NUM_SAMPLES" \
  --settings "$SETTINGS" --concurrency "$QUESTION_BATCH_SIZE" \
  --cluster "$OUT/deployment/cluster.json" --out "$OUT"
