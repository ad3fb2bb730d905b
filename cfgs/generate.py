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
):
    """n_clusters leaf clusters of len(leaf_models) proposers, one aggregator each, one root.
    Leaf k of each cluster takes `leaf_sampling[k]` (its length budget, say); `mid_model` is one
    model for every cluster's aggregator, or a list with one per cluster."""
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
):
    """The paper's dense baseline: n proposers, n layer-2 agents each reading all n, 1 root."""
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


def gpu_models(names: list[str]) -> dict:
    return {
        n: {"model_path": QWEN[n], "server_args": {"sglang": {"mem_fraction_static": 0.85}}}
        for n in names
    }


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


if __name__ == "__main__":
    main()
