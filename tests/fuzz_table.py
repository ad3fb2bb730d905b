"""The fuzz table shared by the POST-route fuzz tests (tests/test_openai_api.py on fake
workers, tests/test_real_processes_api.py on a real deployment): bodies a fuzzer or a broken
client sends. No route may answer any of them with a 5xx."""

from __future__ import annotations

import json
from pathlib import Path

# The shell router's POST routes.
ROUTER_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/moa/run", "/v1/moa/agent"]

# Malformed JSON, wrong types, unknown fields, non-UTF-8 bytes, oversized fields.
BODIES = [
    b"",
    b"{",
    b"null",
    b"[]",
    b'"text"',
    b"123",
    b"\xff\xfe\x00",
    b'{"model": "\xff\xfe"}',
    b'{"model": {"nested": [1, 2, {"deep": null}]}, "messages": "hi"}',
    json.dumps({"model": None, "config": None, "question": None, "messages": None}).encode(),
    json.dumps({"question": 1, "config": [], "mode": 3, "agent": {}, "session_id": 5}).encode(),
    json.dumps({"prompt": [], "messages": [{"role": "wizard"}], "unknown_field": 1}).encode(),
    json.dumps({"question": "q", "config": {"name": "x"}, "slot_orders": "all"}).encode(),
    json.dumps({"question": "q" * 50_000, "config": "tree_none", "early_exit": "yes"}).encode(),
    json.dumps({"model": "x" * 10_000, "messages": [{"role": "user", "content": "hi"}]}).encode(),
    json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image"}]}]}
    ).encode(),
    # SGLang's own fields with wrong types (the workers' /generate and OpenAI routes).
    json.dumps({"text": 5, "input_ids": "abc", "sampling_params": [], "stream": "yes"}).encode(),
    json.dumps(
        {
            "input_ids": [1, -2, 10**12],
            "sampling_params": {"max_new_tokens": "abc"},
            "bootstrap_room": "x",
            "bootstrap_port": -1,
        }
    ).encode(),
    json.dumps(
        {
            "text": "hi",
            "sampling_params": {"temperature": -1, "top_p": 7, "max_new_tokens": -5},
            "rid": ["a"],
        }
    ).encode(),
    json.dumps(
        {
            "prompt": "hi",
            "max_tokens": "abc",
            "temperature": "hot",
            "n": 5,
            "stop": ["a"] * 10,
            "logprobs": "many",
            "stream_options": 3,
        }
    ).encode(),
    json.dumps({"rid": 123, "abort_all": "yes"}).encode(),
]

# Files named where a topology's name goes: the shell router answers 404 model_not_found and
# reads none of them (issue 21).
FILE_PATH_MODELS = [
    "/etc/passwd",
    "../../etc/hostname",
    str(Path(__file__).resolve().parent.parent / "cfgs" / "tree_3_1_cpu.json"),
]
# A question far over SmolLM2's 8,192-token context: 400 before anything reaches a worker.
OVERSIZED_PROMPT = "Count the apples in every basket and add them up. " * 1000
SERVED_TOPOLOGY = "tree_3_1_tiny"  # tests/deployment_procs.tiny_config

BODIES += [
    json.dumps({"model": m, "messages": [{"role": "user", "content": "hi"}]}).encode()
    for m in FILE_PATH_MODELS
]
BODIES += [json.dumps({"question": "q", "config": m}).encode() for m in FILE_PATH_MODELS]
BODIES.append(
    json.dumps(
        {"model": SERVED_TOPOLOGY, "messages": [{"role": "user", "content": OVERSIZED_PROMPT}]}
    ).encode()
)


def huge_body(limit: int) -> bytes:
    """A body just over a server's `client_max_size`."""
    return b"x" * (limit + 1024)
