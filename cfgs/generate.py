"""Writes the shipped topology configs (cfgs/*.json). Run: python cfgs/generate.py

The JSON files are the user's input and are committed; this script only keeps the 13- and
19-agent graphs consistent. Edit the wording here, then regenerate.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Nine proposer personas, one per leaf of a 9-3-1 tree: under greedy decoding identical prompts
# would give identical answers (and identical aggregator prompts), which no real MoA has. They
# differ in style, and so in how long each answer runs.
PERSONAS = [
    (
        "You are a careful problem solver. Work through the problem step by step, check each step, "
        "and finish with the final answer stated plainly."
    ),
    (
        "You are a concise expert. Explain the key idea briefly, compute what is needed, and finish "
        "with the final answer stated plainly."
    ),
    (
        "You are a meticulous tutor. Restate what is asked, solve it methodically, verify the result, "
        "and finish with the final answer stated plainly."
    ),
    (
        "You are a quick mental-math champion. Give the shortest correct solution you can, then the "
        "final answer."
    ),
    (
        "You are a patient teacher explaining to a beginner. Define every quantity, show each "
        "calculation, and end with the final answer."
    ),
    (
        "You are a skeptical reviewer. Solve the problem, then look for a mistake in your own work "
        "and correct it if you find one, and end with the final answer."
    ),
    (
        "You are an engineer who likes tables and lists. Organize the known facts as a list, compute "
        "the result, and give the final answer on its own line."
    ),
    (
        "You are a mathematician. Set up equations for the problem, solve them, and state the final "
        "answer."
    ),
    (
        "You are a practical accountant. Track every amount as you go, add things up carefully, and "
        "report the final answer."
    ),
]
# Their names in pool candidate ids (`model.persona.sampling`).
NAMED_PERSONAS = dict(zip(["careful", "concise", "tutor"], PERSONAS))
AGGREGATOR_SYSTEM = (
    "You receive a question and several candidate answers written by other assistants. Some may "
    "be wrong. Judge them critically, keep what is correct, fix what is not, and write one "
    "complete, accurate answer of your own. Do not mention the candidates."
)


def aggregator_user(precursors: list[str]) -> str:
    parts = ["Question:\n{question}\n\nCandidate answers:"]
    for i, agent_id in enumerate(precursors, 1):
        parts.append(f"\n\n[Candidate {i}]\n<|answer:{agent_id}|>")
    parts.append("\n\nNow write the best answer to the question, ending with the final answer.")
    return "".join(parts)


def proposer_templates(n: int) -> dict:
    return {
        f"proposer_{i}": {"system": p, "user": "{question}"} for i, p in enumerate(PERSONAS[:n])
    }


def tree(
    n_clusters: int,
    leaf_models: list[str],
    mid_model: str | list[str],
    root_model: str,
    leaf_sampling: list[dict] | None = None,
    cluster_sampling: list[dict] | None = None,
):
    """n_clusters leaf clusters of len(leaf_models) proposers, one aggregator each, one root.
    Leaf k of each cluster takes `leaf_sampling[k]` (its length budget, say), or every leaf of
    cluster c `cluster_sampling[c]`; `mid_model` is one model for every cluster's aggregator, or
    a list with one per cluster."""
    mid_models = [mid_model] * n_clusters if isinstance(mid_model, str) else mid_model
    agents, templates = [], proposer_templates(n_clusters * len(leaf_models))
    mids = []
    for c in range(n_clusters):
        leaves = []
        for j, model in enumerate(leaf_models):
            agent_id = f"leaf_{c}_{j}"
            agent = {
                "id": agent_id,
                "model": model,
                "template": f"proposer_{c * len(leaf_models) + j}",
            }
            if leaf_sampling:
                agent["sampling"] = leaf_sampling[j]
            if cluster_sampling:
                agent["sampling"] = cluster_sampling[c]
            agents.append(agent)
            leaves.append(agent_id)
        mid = f"agg_{c}" if n_clusters > 1 else "final"
        templates[f"aggregate_{mid}"] = {
            "system": AGGREGATOR_SYSTEM,
            "user": aggregator_user(leaves),
        }
        agents.append(
            {
                "id": mid,
                "model": mid_models[c] if n_clusters > 1 else root_model,
                "template": f"aggregate_{mid}",
            }
        )
        mids.append(mid)
    if n_clusters > 1:
        templates["aggregate_final"] = {"system": AGGREGATOR_SYSTEM, "user": aggregator_user(mids)}
        agents.append({"id": "final", "model": root_model, "template": "aggregate_final"})
    return agents, templates


def all_to_all(
    n: int,
    leaf_models: list[str],
    mid_model: str,
    root_model: str,
    leaf_sampling: list[dict] | None = None,
    cluster_sampling: list[dict] | None = None,
):
    """The paper's dense baseline: n proposers, n layer-2 agents each reading all n, 1 root.
    `cluster_sampling[c]` goes to leaves 3c..3c+2, the leaves of the 9-3-1 tree's cluster c."""
    agents, templates = [], proposer_templates(n)
    leaves = []
    for i in range(n):
        agent_id = f"leaf_{i}"
        agent = {
            "id": agent_id,
            "model": leaf_models[i % len(leaf_models)],
            "template": f"proposer_{i}",
        }
        if leaf_sampling:
            agent["sampling"] = leaf_sampling[i % len(leaf_sampling)]
        if cluster_sampling:
            agent["sampling"] = cluster_sampling[i // 3]
        agents.append(agent)
        leaves.append(agent_id)
    templates["aggregate_layer2"] = {"system": AGGREGATOR_SYSTEM, "user": aggregator_user(leaves)}
    mids = [f"agg_{i}" for i in range(n)]
    agents += [{"id": m, "model": mid_model, "template": "aggregate_layer2"} for m in mids]
    templates["aggregate_final"] = {"system": AGGREGATOR_SYSTEM, "user": aggregator_user(mids)}
    agents.append({"id": "final", "model": root_model, "template": "aggregate_final"})
    return agents, templates


QWEN = {
    "qwen3vl-4b": "Qwen/Qwen3-VL-4B-Instruct",
    "qwen3vl-8b": "Qwen/Qwen3-VL-8B-Instruct",
    "qwen3vl-32b": "Qwen/Qwen3-VL-32B-Instruct",
}
# The Qwen3-VL model cards' text-only sampling values (paper-notes §5.5); the paper's cap of 65535
# new tokens is lowered to 4096 here so a stuck agent cannot hold a run for minutes.
GPU_SAMPLING = {
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "presence_penalty": 1.5,
    "max_new_tokens": 4096,
}
CPU_SAMPLING = {"temperature": 0.0, "max_new_tokens": 96}
# One model plays every part on the CPU, so the leaves of a cluster get the length budgets that
# a 4B, an 8B and a 32B model would have in time: they end at different moments, fastest first in
# template order, as in the paper's hetero clusters (SmolLM2 rarely stops early on its own).
CPU_LEAF_BUDGETS = [{"max_new_tokens": 48}, {"max_new_tokens": 96}, {"max_new_tokens": 160}]
GPU_EMBEDDING = "Qwen/Qwen3-Embedding-4B"
# Weight-free configs (`"model_path": "dummy:SHAPE"`, served with --load-format dummy): real
# shapes, random weights, so real timings and meaningless text. Random weights never end an
# answer, so every answer has a fixed length (ignore_eos): the leaves of cluster c write
# DUMMY_CLUSTER_TOKENS[c] tokens and the aggregators DUMMY_SAMPLING's, which gives the clusters
# the unequal finish times of the paper's runs on top of the shapes' unequal speeds. Greedy, so
# pipelined and blocking runs produce the same tokens.
DUMMY_CLUSTER_TOKENS = [300, 500, 700]
DUMMY_SAMPLING = {"temperature": 0.0, "max_new_tokens": 500, "ignore_eos": True}
# The paper's hetero trio as shapes; a test or a user with less GPU memory substitutes smaller
# ones (tests/test_sglang_gpu_run.py: MOA_PD_GPU_TRIO).
DUMMY_TRIO = ["qwen3-4b", "qwen3-8b", "qwen3-32b"]
# The CPU twin: one 2-layer shape for every part, answers of 12/20/28 tokens, aggregators 16.
DUMMY_CPU_CLUSTER_TOKENS = [12, 20, 28]
DUMMY_CPU_SAMPLING = {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}


def gpu_models(names: list[str]) -> dict:
    return {
        n: {"model_path": QWEN[n], "server_args": {"sglang": {"mem_fraction_static": 0.85}}}
        for n in names
    }


def dummy_models(shapes: list[str]) -> dict:
    return {n: {"model_path": f"dummy:{n}", "load_format": "dummy"} for n in dict.fromkeys(shapes)}


def fixed_lengths(tokens: list[int]) -> list[dict]:
    return [{"max_new_tokens": n, "min_new_tokens": n} for n in tokens]


# Routed configs (issue 20): a pool of candidate proposers (models × personas × sampling) read by
# one aggregator through `<|answers:pool|>`; routing picks k per question. Add a CPU model to
# CPU_POOL_MODELS (and to the config's models) to grow the pool.
CPU_POOL_MODELS = ["smollm2", "gemma3", "qwen2.5-coder"]
# Two ways to answer, so candidates end at different times: an answer-first persona that stops
# early, and the step-by-step one that runs to the cap. Greedy only: with 12 candidates (×
# greedy/T=0.7) at 256 tokens, a question cost ~3 min of the 2 cores in setting #5. At 96 tokens
# (issue 20) Qwen's step-by-step answers were cut off before their final answer; at 256 (issue
# 30's first pilot, docs/benchmarks.md) Qwen answers GSM8K and MMLU but no HumanEval question
# (its answers restate the docstring, then stop mid-body); 512 is the HumanEval pilot where
# Qwen is right on 3 of 10 and every other candidate on none: the domain that separates the
# pool. Gemma's answer-first persona left the pool: right on 0 of the first pilot's 30
# questions and on 2 of issue 20's 148 (it echoes its prompt), and a scorer cannot learn a
# candidate that is never right.
CPU_POOL_PERSONAS = {
    "direct": (
        "You are a knowledgeable expert. Give the final answer first, in the form the question "
        "asks for, then justify it in one or two sentences."
    ),
    "careful": NAMED_PERSONAS["careful"],
}
CPU_POOL_SAMPLING = {"greedy": {"temperature": 0.0, "max_new_tokens": 512}}
# The aggregator writes the answer that is graded, so it gets the candidates' cap: at the tree
# configs' 96 tokens no code answer would be complete.
CPU_POOL_AGGREGATOR_SAMPLING = CPU_POOL_SAMPLING["greedy"]
CPU_POOL_LEFT_OUT = {"gemma3.direct.greedy"}
# The routed config's scorer, trained by the README's `moa-pd train-scorer` command and committed.
CPU_POOL_SCORER = "routing/scorers/routed_pool_cpu.json"


def pool(
    models: list[str],
    personas: dict[str, str],
    samplings: dict[str, dict],
    left_out: frozenset[str] | set[str] = frozenset(),
) -> dict:
    """Every model × persona × sampling as one candidate, with an id that says which, but those
    in `left_out`."""
    candidates = [
        {"id": f"{m}.{name}.{s}", "model": m, "persona": p, "sampling": sampling}
        for m in models
        for name, p in personas.items()
        for s, sampling in samplings.items()
    ]
    return {"candidates": [c for c in candidates if c["id"] not in left_out]}


def routed(
    name: str,
    description: str,
    models: dict,
    candidates: dict,
    root_model: str,
    sampling: dict,
    routing: dict | None,
) -> None:
    """A pool read by one aggregator (the final agent): the tree's proposer layer is the pool.
    Without `routing` every candidate runs on every question: the routed setting's baseline
    (#4 on the same pool) and the config whose #5 rows train its scorer."""
    templates = {
        "aggregate_final": {
            "system": AGGREGATOR_SYSTEM,
            "user": "Question:\n{question}\n\nCandidate answers:\n\n<|answers:pool|>\n\n"
            "Now write the best answer to the question, ending with the final answer.",
        }
    }
    agents = [{"id": "final", "model": root_model, "template": "aggregate_final"}]
    cfg = {
        "name": name,
        "description": description,
        "models": models,
        "pool": candidates,
        **({"routing": routing} if routing else {}),
        "templates": templates,
        "agents": agents,
        "sampling": sampling,
        "early_exit": {"enabled": False, "method": "q", "embedding_model": "all-minilm-l6-v2"},
        "incremental_prefill": {"enabled": True, "chunk_policy": "adaptive"},
        "slot_order": "template",
    }
    (HERE / f"{name}.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def write(
    name: str,
    description: str,
    models: dict,
    agents: list,
    templates: dict,
    sampling: dict,
    embedding: str,
    dmv: bool = False,
) -> None:
    early_exit = {"enabled": dmv, "method": "dmv" if dmv else "q", "embedding_model": embedding}
    cfg = {
        "name": name,
        "description": description,
        "models": models,
        "templates": templates,
        "agents": agents,
        "sampling": sampling,
        "early_exit": early_exit,
        "incremental_prefill": {"enabled": True, "chunk_policy": "adaptive"},
        "slot_order": "template",
    }
    (HERE / f"{name}.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    # Leaves ordered fastest first: only the slot next to the warmed region can grow (DESIGN §5).
    hetero = ["qwen3vl-4b", "qwen3vl-8b", "qwen3vl-32b"]
    for dmv in (False, True):
        sfx = "_dmv" if dmv else ""
        how = " Early exit by dynamic majority voting." if dmv else ""
        a, t = tree(3, ["qwen3vl-4b"] * 3, "qwen3vl-4b", "qwen3vl-4b")
        write(
            f"tree_9_3_1_homo{sfx}",
            "Paper 9-3-1 tree, every agent Qwen3-VL-4B." + how,
            gpu_models(["qwen3vl-4b"]),
            a,
            t,
            GPU_SAMPLING,
            GPU_EMBEDDING,
            dmv,
        )
        a, t = tree(3, hetero, "qwen3vl-8b", "qwen3vl-32b")
        write(
            f"tree_9_3_1_hetero{sfx}",
            "Paper 9-3-1 tree: each leaf cluster is Qwen3-VL "
            "4B/8B/32B; layer-2 aggregators 8B, root 32B." + how,
            gpu_models(hetero),
            a,
            t,
            GPU_SAMPLING,
            GPU_EMBEDDING,
            dmv,
        )
        a, t = all_to_all(9, ["qwen3vl-4b"], "qwen3vl-4b", "qwen3vl-4b")
        write(
            f"all_to_all_9_9_1_homo{sfx}",
            "Paper dense baseline 9-9-1, every agent Qwen3-VL-4B." + how,
            gpu_models(["qwen3vl-4b"]),
            a,
            t,
            GPU_SAMPLING,
            GPU_EMBEDDING,
            dmv,
        )
        a, t = all_to_all(9, hetero, "qwen3vl-8b", "qwen3vl-32b")
        write(
            f"all_to_all_9_9_1_hetero{sfx}",
            "Paper dense baseline 9-9-1: leaves cycle "
            "Qwen3-VL 4B/8B/32B; layer-2 aggregators 8B, root 32B." + how,
            gpu_models(hetero),
            a,
            t,
            GPU_SAMPLING,
            GPU_EMBEDDING,
            dmv,
        )

    _, mid, large = DUMMY_TRIO
    lengths = "/".join(map(str, DUMMY_CLUSTER_TOKENS))
    a, t = tree(3, DUMMY_TRIO, mid, large, cluster_sampling=fixed_lengths(DUMMY_CLUSTER_TOKENS))
    write(
        "tree_9_3_1_dummy_gpu",
        "GPU, weight-free: the paper's 9-3-1 hetero tree on Qwen3 4B/8B/32B shapes with random "
        f"weights (load_format dummy); leaves of cluster 0/1/2 write exactly {lengths} tokens "
        f"(ignore_eos), aggregators and root {DUMMY_SAMPLING['max_new_tokens']}; greedy.",
        dummy_models(DUMMY_TRIO),
        a,
        t,
        DUMMY_SAMPLING,
        "all-minilm-l6-v2",
    )
    a, t = all_to_all(
        9, DUMMY_TRIO, mid, large, cluster_sampling=fixed_lengths(DUMMY_CLUSTER_TOKENS)
    )
    write(
        "all_to_all_9_9_1_dummy_gpu",
        "GPU, weight-free: the dense 9-9-1 twin of tree_9_3_1_dummy_gpu (setting #1); leaves "
        f"cycle the 4B/8B/32B shapes, leaves 0-2/3-5/6-8 write exactly {lengths} tokens, "
        f"layer-2 aggregators 8B and root 32B {DUMMY_SAMPLING['max_new_tokens']}; greedy.",
        dummy_models(DUMMY_TRIO),
        a,
        t,
        DUMMY_SAMPLING,
        "all-minilm-l6-v2",
    )
    a, t = tree(1, [mid] * 3, mid, mid, fixed_lengths(DUMMY_CLUSTER_TOKENS))
    write(
        "single_8b_dummy_gpu",
        "GPU, weight-free: one Qwen3-8B-shaped model (one PD pair) for the PD-pair tests and "
        f"the microbench; a 3-1 tree whose leaves write exactly {lengths} tokens, the "
        f"aggregator {DUMMY_SAMPLING['max_new_tokens']}; greedy.",
        dummy_models([mid]),
        a,
        t,
        DUMMY_SAMPLING,
        "all-minilm-l6-v2",
    )
    tiny = "qwen3-tiny"
    cpu_lengths = "/".join(map(str, DUMMY_CPU_CLUSTER_TOKENS))
    a, t = tree(1, [tiny] * 3, tiny, tiny, fixed_lengths(DUMMY_CPU_CLUSTER_TOKENS))
    write(
        "tree_3_1_dummy_cpu",
        "CPU twin of the weight-free GPU configs: a 3-1 tree on a 2-layer Qwen3 shape with random "
        f"weights (load_format dummy); leaves write exactly {cpu_lengths} tokens (ignore_eos), "
        f"the aggregator {DUMMY_CPU_SAMPLING['max_new_tokens']}; greedy.",
        dummy_models([tiny]),
        a,
        t,
        DUMMY_CPU_SAMPLING,
        "all-minilm-l6-v2",
    )
    a, t = tree(3, [tiny] * 3, tiny, tiny, cluster_sampling=fixed_lengths(DUMMY_CPU_CLUSTER_TOKENS))
    write(
        "tree_9_3_1_dummy_cpu",
        "CPU twin of tree_9_3_1_dummy_gpu: the 9-3-1 tree on a 2-layer Qwen3 shape with random "
        f"weights; leaves of cluster 0/1/2 write exactly {cpu_lengths} tokens (ignore_eos), "
        f"aggregators and root {DUMMY_CPU_SAMPLING['max_new_tokens']}; greedy.",
        dummy_models([tiny]),
        a,
        t,
        DUMMY_CPU_SAMPLING,
        "all-minilm-l6-v2",
    )

    # Prefill forwards of at most 512 tokens: between forwards the engine answers finished
    # prefills (which the native sglang-router awaits before it streams decode's tokens) and
    # admits critical requests, so neither waits behind one long batch on a CPU core.
    cpu_args = {"torch": {"max_prefill_tokens": 512, "chunked_prefill_size": 512}}
    cpu = {"smollm2": {"model_path": "smollm2-135m", "server_args": cpu_args}}
    budgets = "leaves of a cluster capped at 48/96/160 new tokens (as 4B/8B/32B), others at 96"
    a, t = tree(1, ["smollm2"] * 3, "smollm2", "smollm2", CPU_LEAF_BUDGETS)
    write(
        "tree_3_1_cpu",
        f"CPU default: 3 SmolLM2-135M proposers, 1 aggregator; greedy; {budgets}.",
        cpu,
        a,
        t,
        CPU_SAMPLING,
        "all-minilm-l6-v2",
    )
    a, t = tree(3, ["smollm2"] * 3, "smollm2", "smollm2", CPU_LEAF_BUDGETS)
    write(
        "tree_9_3_1_cpu",
        f"CPU default: the 9-3-1 tree on SmolLM2-135M; greedy; {budgets}.",
        cpu,
        a,
        t,
        CPU_SAMPLING,
        "all-minilm-l6-v2",
    )
    a, t = all_to_all(9, ["smollm2"], "smollm2", "smollm2", CPU_LEAF_BUDGETS)
    write(
        "all_to_all_9_9_1_cpu",
        f"CPU default: the dense 9-9-1 baseline on SmolLM2-135M; greedy; {budgets}.",
        cpu,
        a,
        t,
        CPU_SAMPLING,
        "all-minilm-l6-v2",
    )

    # Two model families with different tokenizers, so a successor reads some precursors by
    # token ids (same family) and others by re-tokenized text (README: mixed-family configs).
    mixed = {**cpu, "gemma3": {"model_path": "gemma3-270m", "server_args": cpu_args}}
    family = ["smollm2", "smollm2", "gemma3"]
    a, t = tree(1, family, "smollm2", "smollm2", CPU_LEAF_BUDGETS)
    write(
        "tree_3_1_mixed_cpu",
        "CPU, two model families: proposers SmolLM2-135M, SmolLM2-135M "
        f"and Gemma-3-270M, aggregator SmolLM2-135M; greedy; {budgets}.",
        mixed,
        a,
        t,
        CPU_SAMPLING,
        "all-minilm-l6-v2",
    )
    a, t = tree(3, family, ["smollm2", "gemma3", "smollm2"], "smollm2", CPU_LEAF_BUDGETS)
    write(
        "tree_9_3_1_mixed_cpu",
        "CPU, two model families: the 9-3-1 tree with each cluster's "
        "proposers SmolLM2, SmolLM2, Gemma-3-270M; agg_1 is Gemma-3-270M, the other "
        f"aggregators and the root SmolLM2; greedy; {budgets}.",
        mixed,
        a,
        t,
        CPU_SAMPLING,
        "all-minilm-l6-v2",
    )

    cpu_pool = pool(CPU_POOL_MODELS, CPU_POOL_PERSONAS, CPU_POOL_SAMPLING, CPU_POOL_LEFT_OUT)
    n = len(cpu_pool["candidates"])
    pool_models = {
        **mixed,
        "qwen2.5-coder": {"model_path": "qwen2.5-coder-0.5b", "server_args": cpu_args},
    }
    routed(
        "pool_all_cpu",
        f"CPU, routed_pool_cpu's pool without routing (issue 20): all {n} candidates answer every "
        "question. #4 on it is #6's baseline (--config pool_all_cpu --routed-config "
        "routed_pool_cpu --settings 4,6); #5 on it runs each candidate alone, the rows moa-pd "
        "train-scorer learns from.",
        pool_models,
        cpu_pool,
        "qwen2.5-coder",
        CPU_POOL_AGGREGATOR_SAMPLING,
        None,
    )
    routed(
        "routed_pool_cpu",
        f"CPU, routed (issues 20, 30): a pool of {n} candidates, SmolLM2-135M, Gemma-3-270M "
        "and Qwen2.5-Coder-0.5B × an answer-first and a step-by-step persona (not Gemma's "
        "answer-first: right on none of issue 30's pilot questions), greedy, 512 tokens; "
        "routing runs every candidate whose predicted p reaches 0.25, one per model, at least "
        f"the best by utility (scorer: {CPU_POOL_SCORER}, trained on HumanEval and IFBench by "
        "the README's moa-pd train-scorer command: Qwen on code, SmolLM2 elsewhere); "
        "aggregator Qwen2.5-Coder-0.5B, the pool's strongest model, at 512 tokens.",
        pool_models,
        cpu_pool,
        "qwen2.5-coder",
        CPU_POOL_AGGREGATOR_SAMPLING,
        {
            "scorer": CPU_POOL_SCORER,
            # A threshold, not a fixed k: the set's size follows the question. 0.25 lies between
            # Qwen's p on code questions and on the others (docs/benchmarks.md, stop 52); one
            # candidate per model, since two personas of one model share its mistakes.
            "threshold": 0.25,
            "min_k": 1,
            "max_per_model": 1,
            "weights": {"performance": 1.0, "cost": 0.2, "latency": 0.2},
            # planning/model_memory.py's counts (134,515,008, 268,098,176 and 630,167,424),
            # declared so the router does not build the models on the meta device at start-up.
            "model_sizes_b": {"smollm2": 0.1345, "gemma3": 0.2681, "qwen2.5-coder": 0.6302},
            # Decode seconds per token of each model, measured (`moa-pd profile --config
            # pool_all_cpu`, stop 52): 78, 108 and 203 ms a step at batch 1 and 524 tokens of
            # context, where the declared speeds had 25, 50 and 56.
            "profile": "profiling/measured/cpu_2core_pool_torch.json",
            "posterior_correction": {"enabled": True, "action": "last"},
        },
    )
    gpu_pool = pool(DUMMY_TRIO, NAMED_PERSONAS, {"fixed": fixed_lengths([500])[0]})
    routed(
        "routed_pool_qwen3_gpu",
        "GPU, weight-free, routed (issue 20): RouteMoA's kind of pool, Qwen3 4B/8B/32B shapes × 3 "
        "personas (random weights, load_format dummy; answers of exactly 500 tokens); routing "
        "runs the 3 best per question; aggregator 32B "
        f"({DUMMY_SAMPLING['max_new_tokens']} tokens); greedy.",
        dummy_models(DUMMY_TRIO),
        gpu_pool,
        large,
        DUMMY_SAMPLING,
        {
            "scorer": "runs/scorer_routed_pool_qwen3_gpu.json",
            "k": 3,
            "min_k": 1,
            "weights": {"performance": 1.0, "cost": 0.2, "latency": 0.2},
            "model_sizes_b": {"qwen3-4b": 4.0, "qwen3-8b": 8.2, "qwen3-32b": 32.8},
            # H100 bf16 decode at batch 1, order of magnitude; a profile.json replaces them.
            "decode_tokens_per_s": {"qwen3-4b": 150.0, "qwen3-8b": 110.0, "qwen3-32b": 40.0},
            "posterior_correction": {"enabled": True, "action": "last"},
        },
    )


if __name__ == "__main__":
    main()
