"""After a worker is healthy, its KV pool as the worker reports it, checked against the config's
need: a pool SGLang sized smaller than asked (less memory free than planned) fails the start."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from launch.procs import LaunchError, Proc


def pool_tokens(base_url: str) -> int:
    """`max_total_num_tokens` from /get_server_info (SGLang's name; the reference engine's too)."""
    try:
        with urllib.request.urlopen(base_url + "/get_server_info", timeout=30) as resp:
            info = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise LaunchError(f"cannot read {base_url}/get_server_info for its KV pool: {e}") from None
    value = info.get("max_total_num_tokens")
    if value is None:  # some SGLang versions report it per scheduler only
        value = (info.get("internal_states") or [{}])[0].get("max_total_num_tokens")
    if value is None:
        raise LaunchError(f"{base_url}/get_server_info reports no max_total_num_tokens")
    return int(value)


def check_pools(procs: list[Proc], needs: dict[tuple[str, str], int], concurrency: int) -> None:
    """Raise for the first worker in procs (named "model.roleN") whose pool is below
    needs[(model, role)]."""
    for p in procs:
        model, worker = p.spec.name.rsplit(".", 1)
        need = needs.get((model, worker.rstrip("0123456789")))
        if need is None:
            continue
        check_pool(
            p,
            need,
            f"its config's agents need at concurrency {concurrency} (their prompts and outputs "
            "in flight at once)",
            "give it more memory (fewer workers per GPU, --gpus), raise max_total_tokens in the "
            "config's server_args, or lower --concurrency",
        )


def check_pool(proc: Proc, need: int, needed_by: str, fix: str) -> None:
    """Raise when proc's pool is below `need` tokens: "{name} started with a KV pool of N
    tokens, below the {need} {needed_by}; {fix}"."""
    if not proc.spec.health_url:
        return
    have = pool_tokens(proc.spec.health_url.removesuffix("/health"))
    if have < need:
        raise LaunchError(
            f"{proc.spec.name} started with a KV pool of {have:,} tokens, below the {need:,} "
            f"{needed_by}; {fix}"
        )
