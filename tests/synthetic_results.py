"""Synthetic results rows (the runner's results.jsonl schema) for the reporting tests: a dense
9-9-1 graph for setting #1, a tree 9-3-1 graph for #2-#4, early exit killing agents in #4, and
for #6 (routed) the same tree with routing leaving 4 of the 9 proposers out."""

from __future__ import annotations

import random

from experiments.settings import SETTINGS

MODELS = ("qwen-4b", "qwen-8b", "qwen-32b")
BASE_LATENCY = {1: 10.0, 2: 4.0, 3: 3.0, 4: 1.8, 6: 1.2, 7: 4.6}
# Setting #6: the proposers routing leaves out of every question, and its decision's wall time.
ROUTED_OUT = ("p2", "p4", "p7", "p8")
ROUTING_WALL_S = 0.006
# Wall time the router's session clock started at (the agents' times count from it).
SESSION_T0 = 1_700_000_000.0
# Every request's TTFT (0.1 s) in experiments.pd_breakdown.COMPONENTS order: bootstrap, prefill
# queue, prefill compute, KV transfer, first decode step, the token's way to the router.
PD_PARTS = (0.002, 0.011, 0.06, 0.02, 0.005, 0.002)


def worker_timing(request_s: float, parts=PD_PARTS, leaf: bool = False) -> dict[str, float]:
    """The trace's `worker_timing` ("prefill.<meta_info key>", "decode.<key>") of a request sent
    at `request_s` whose TTFT splits into `parts`. A leaf's reply came through the native
    sglang-router: decode's timings only."""
    # The last part, the token's way to the router, is what is left until first_token_s.
    bootstrap, queue, compute, transfer, first, _ = parts
    sent = SESSION_T0 + request_s
    prefill_queued = sent + bootstrap
    prefill_forward = prefill_queued + queue
    prefill_done = prefill_forward + compute
    kv_at_decode = prefill_done + transfer
    decode_forward = kv_at_decode + first / 4  # decode waited a quarter of its part for a batch
    received = sent + 0.001
    timing = {
        "decode.request_received_ts": received,
        "decode.forward_entry_time": decode_forward,
        "decode.queue_time": decode_forward - kv_at_decode,
        "decode.first_token_latency": kv_at_decode + first / 2 - received,
        "decode.response_sent_to_client_ts": kv_at_decode + first,
    }
    if not leaf:
        timing |= {
            "prefill.request_received_ts": sent + 0.001,
            "prefill.queue_time": queue,
            "prefill.forward_entry_time": prefill_forward,
            "prefill.prefill_finished_time": prefill_done,
            "prefill.request_finished_ts": kv_at_decode + 0.001,
        }
    return timing


def _agent(
    model: str,
    precursors: list[str],
    killed: bool = False,
    warmups: int = 0,
    prompt: int = 100,
    cached: int = 0,
) -> dict:
    return {
        "model": model,
        "output_ids": [1, 2, 3],
        "text": "42",
        "start_s": 0.0,
        "final_request_s": 0.0,
        "first_token_s": sum(PD_PARTS),
        "end_s": 1.0,
        "worker_timing": worker_timing(0.0, leaf=not precursors),
        "warmups": warmups,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "slot_order": precursors,
        "killed": killed,
    }


def agents_for(setting: int, rng: random.Random) -> tuple[dict, list[dict]]:
    """(agents trace, early-exit decisions) for one sample of a setting."""
    layer1 = {f"p{i}": _agent(MODELS[i // 3], []) for i in range(9)}
    for a in ROUTED_OUT if setting == 6 else ():
        layer1[a] |= {"output_ids": [], "start_s": None, "routed_out": True, "skipped": True}
    if setting == 1:
        layer2 = {f"a{i}": _agent(MODELS[i // 3], list(layer1), prompt=900) for i in range(9)}
        return {**layer1, **layer2, "final": _agent("qwen-32b", list(layer2), prompt=900)}, []
    pipelined = SETTINGS[setting].mode == "pipelined"
    decisions = []
    for c in range(3):
        members = [f"p{3 * c + k}" for k in range(3)]
        if setting == 4 and rng.random() < 0.6:
            layer1[members[2]]["killed"] = True
            decisions.append(
                {
                    "cluster": f"a{c}",
                    "completed": members[:2],
                    "c_bar": 0.9,
                    "p": 0.8,
                    "b": 0.9,
                    "q": 0.85,
                    "u": 0.3,
                    "exited": True,
                    "killed": [members[2]],
                    "seconds": 0.02,
                }
            )
    aggs = {}
    for c in range(3):
        members = [f"p{3 * c + k}" for k in range(3)]
        aggs[f"a{c}"] = _agent(
            MODELS[c],
            members,
            warmups=4 if pipelined else 0,
            prompt=300,
            cached=240 if pipelined else 0,
        )
    final = _agent(
        "qwen-32b",
        list(aggs),
        warmups=3 if pipelined else 0,
        prompt=300,
        cached=200 if pipelined else 0,
    )
    return {**layer1, **aggs, "final": final}, decisions


def make_rows(
    datasets=("gsm8k", "math500"),
    settings=(1, 2, 3, 4),
    n: int = 20,
    seed: int = 0,
    errors: int = 0,
) -> list[dict]:
    """n samples per dataset, one row per (sample, setting); the first `errors` samples of the
    last setting fail."""
    rng = random.Random(seed)
    rows = []
    for d_i, dataset in enumerate(datasets):
        for i in range(n):
            scale = rng.uniform(0.5, 1.5) * (1 + d_i)
            for s in settings:
                agents, ee = agents_for(s, rng)
                failed = s == settings[-1] and i < errors
                correct = None if failed else rng.random() < 0.7 + 0.05 * s
                rows.append(
                    {
                        "sample_id": f"{dataset}-{i}",
                        "dataset": dataset,
                        "setting": s,
                        "answer": None if failed else "42",
                        "gold": "42",
                        "correct": correct,
                        "e2e_s": BASE_LATENCY[s] * scale * rng.uniform(0.9, 1.1),
                        "session_started_at": SESSION_T0,
                        "agents": {} if failed else agents,
                        "early_exit": [] if failed else ee,
                        "routing": _routing() if s == 6 and not failed else None,
                        "error": "worker died" if failed else None,
                        "config": "all_to_all_9_9_1" if s == 1 else "tree_9_3_1",
                        "mode": SETTINGS[s].mode,
                    }
                )
    return rows


def _routing() -> dict:
    chosen = [f"p{i}" for i in range(9) if f"p{i}" not in ROUTED_OUT]
    return {
        "rule": "k=5",
        "chosen": chosen,
        "candidates": {
            f"p{i}": {"p": 0.5, "chosen": f"p{i}" in chosen, "reason": "synthetic"}
            for i in range(9)
        },
        "embed_s": ROUTING_WALL_S / 2,
        "wall_s": ROUTING_WALL_S,
    }


def make_microbench_rows(n: int = 200, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    factor = {"incremental": 0.75, "pd": 1.0, "dp2": 0.92, "dp2_chunked": 0.9}
    rows = []
    for _ in range(n):
        length = rng.randint(1, 2048)
        for variant, f in factor.items():
            rows.append(
                {
                    "variant": variant,
                    "prompt_tokens": length,
                    "latency_s": f * (0.5 + length / 1000) * rng.uniform(0.9, 1.1),
                }
            )
    return rows
