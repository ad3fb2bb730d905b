"""`moa-pd run`: the paper's settings #1-#4 (and #5-#7, experiments/settings.py) on the same
questions, one results row per
(sample, setting), appended and flushed as each finishes so a run can resume."""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
from tqdm import tqdm

from experiments.datasets import Question, load_questions, mix_members, resolve
from experiments.prompts import build_question_prompt
from experiments.router_client import GraphRunError, RouterClient
from experiments.router_load import RouterWindow, window, window_values
from experiments.scoring import score
from experiments.settings import Setting
from experiments.single_model import single_model_configs
from planning.placement import PlacementOptions

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RunSpec:
    tree_config: str
    dense_config: str | None
    dataset: str
    num_samples: int | None
    settings: list[Setting]
    concurrency: int
    out_dir: Path
    cluster_path: Path | None = None
    resume: bool = False
    fail_fast: bool = False
    backend: str = "torch"
    pin_cpus: bool = False  # when the run brings its own deployment up
    # A failed sample whose deployment is down stops the run, unless this is set (then every
    # remaining sample is tried and recorded).
    keep_going: bool = False
    # --gpus/--gpu-policy/--question-tokens of the deployment it brings up (planning/); its
    # KV pools are sized for `concurrency`.
    gpu_placement: PlacementOptions | None = None
    # Setting #6: the config with a pool and routing.
    routed_config: str | None = None
    # Which questions: `num_samples` from `offset` on, of a seeded shuffle when set.
    shuffle_seed: int | None = None
    offset: int = 0


# At --concurrency N > 1, settings interleave per block of this many × N questions: two waves,
# so a block has questions that start as others end (what a server under load sees), not only
# N that start together.
BLOCK_PER_CONCURRENCY = 2


class FailFast(RuntimeError):
    """The run stopped early: --fail-fast saw a failed sample, or the deployment is down."""


def config_for(spec: RunSpec, setting: Setting) -> str:
    """The config file `setting` runs (#5 builds its single-model configs from the tree's)."""
    if setting.topology == "dense":
        if not spec.dense_config:
            raise ValueError(
                "setting 1 (dense all-to-all) needs --dense-config; add it or "
                "leave 1 out of --settings"
            )
        return spec.dense_config
    if setting.topology == "routed":
        if not spec.routed_config:
            raise ValueError(
                "setting 6 (routed) needs --routed-config (a config with a pool and routing, "
                "e.g. cfgs/routed_pool_cpu.json); add it or leave 6 out of --settings"
            )
        return spec.routed_config
    return spec.tree_config


def check_votes(spec: RunSpec) -> None:
    """Refuse, before anything starts, a setting whose config votes on extracted answers (DMV
    early exit, answer-based bypass) on a dataset with no single answer (IFBench)."""
    from router.answers import has_answer
    from router.config_loader import load_config

    members = mix_members(spec.dataset) if "," in spec.dataset else [spec.dataset]
    unanswered = [name for name in (resolve(m)[0] for m in members) if not has_answer(name)]
    if not unanswered:
        return
    dataset = unanswered[0]
    for s in spec.settings:
        cfg = load_config(config_for(spec, s))
        dmv = s.early_exit and cfg.early_exit.method == "dmv"
        bypass = cfg.aggregator_bypass.enabled and cfg.aggregator_bypass.criterion == "answer"
        if dmv or bypass:
            what = "early_exit.method 'dmv'" if dmv else "aggregator_bypass.criterion 'answer'"
            raise ValueError(
                f"setting {s.number} on config '{cfg.name}' votes on extracted answers ({what}) "
                f"but dataset '{dataset}' has no single answer to extract; use a config with "
                "early_exit.method 'q' (and bypass criterion 'q'), or leave that setting out"
            )


def result_row(
    q: Question,
    setting: Setting,
    config: str,
    graph: dict | None,
    error: str | None,
    e2e_s: float,
    started_at: float | None = None,
    single_model: str | None = None,
    router: RouterWindow | None = None,
) -> dict:
    """One results row. e2e_s is the runner's own clock around the whole-graph call, which it
    sent at wall time `started_at`; the agents' times count from the router's session start,
    at wall time `session_started_at`. `router`: the router's stats around the call."""
    answer_text = (graph or {}).get("answer")
    graded = score(q, answer_text) if answer_text is not None else None
    return {
        "sample_id": q.id,
        "dataset": q.dataset,
        "setting": setting.number,
        "single_model": single_model,
        "config": config,
        "mode": setting.mode,
        "answer": graded.extracted if graded else None,
        "gold": q.answer,
        "correct": graded.correct if graded else None,
        "e2e_s": e2e_s,
        "started_at": started_at,
        "session_started_at": (graph or {}).get("started_at"),
        "agents": (graph or {}).get("trace", {}),
        "early_exit": (graph or {}).get("early_exit", []),
        "routing": (graph or {}).get("routing"),
        "posterior": (graph or {}).get("posterior") or [],
        "final_text": answer_text,
        "error": error,
        "router": router.model_dump(mode="json") if router else None,
        **window_values(router),
    }


def variants(spec: RunSpec, setting: Setting) -> list[tuple[dict, str, str | None]]:
    """What one question of `setting` runs: (the config object the runner registers with the
    router, its name for the row, single model); one entry per model (per pool candidate, by
    its id, when the config has a pool) for #5, else one. The router is handed the config
    itself, never a path: it serves only what it was started with or what was registered. A
    routed config's scorer and profile go inline too (the router reads no file a request names,
    and may not have been started with them)."""
    from router.config_loader import load_config, resolve_config_path
    from routing.routing_files import inline_routing_files

    path = config_for(spec, setting)
    raw = json.loads(resolve_config_path(path).read_text(encoding="utf-8"))
    if setting.topology != "single":
        return [(inline_routing_files(raw), load_config(path).name, None)]
    return [
        (c.model_dump(mode="json"), c.name, cid)
        for cid, c in single_model_configs(load_config(path)).items()
    ]


def row_keys(spec: RunSpec, setting: Setting, q: Question) -> list[tuple]:
    """The --resume keys of the rows `setting` writes for `q` (ResultRow.key)."""
    if setting.topology != "single":
        return [(q.id, setting.number)]
    return [(q.id, setting.number, m) for _, _, m in variants(spec, setting)]


class FlushFailed(RuntimeError):
    """A worker did not empty its prefix cache: the next measurement would not be cold."""


# SGLang answers /flush_cache with 400 while a request is still live, and a PD worker keeps one
# until its KV transfer is acknowledged (real SGLang: right after start-up, its router's first
# request): such a refusal is retried for up to this long.
FLUSH_RETRY_S = 30.0


async def _flush_one(client: RouterClient, url: str, retry_s: float) -> str | None:
    """None once url's cache is empty, else why not."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            status = await client.post_json(f"{url}/flush_cache", {})
        except (aiohttp.ClientError, TimeoutError) as e:
            return f"{url} ({type(e).__name__}: {e})"
        if status == 200:
            return None
        if status != 400 or time.monotonic() > deadline:
            return f"{url} (HTTP {status})"
        await asyncio.sleep(0.2)


async def flush_worker_caches(
    client: RouterClient, cluster: dict, retry_s: float = FLUSH_RETRY_S
) -> None:
    """Empty every worker's prefix cache so no setting profits from the one before it (and a
    wrong warm-up KV cannot hide behind another run's fresh computation); raise FlushFailed
    naming the workers that did not."""
    failed = []
    for model in cluster["models"].values():
        for url in model["prefill_urls"] + model["decode_urls"]:
            if (why := await _flush_one(client, url, retry_s)) is not None:
                failed.append(why)
    if failed:
        raise FlushFailed(
            "flush_cache failed on "
            + ", ".join(failed)
            + "; a sample measured on a warm cache would not be comparable"
        )


async def register_variants(
    client: RouterClient, spec: RunSpec, setting: Setting
) -> list[tuple[str, str, str | None]]:
    """`variants` with each config registered: (name the router serves it by, row name,
    single model). GraphRunError when the router refuses one."""
    return [
        (await client.register(config), name, model)
        for config, name, model in variants(spec, setting)
    ]


async def _run_setting(
    client: RouterClient,
    spec: RunSpec,
    runs: list[tuple[str, str, str | None]],
    setting: Setting,
    questions: list[Question],
    writer,
    bar: tqdm,
    stats: dict,
    done: set | frozenset = frozenset(),
) -> None:
    semaphore = asyncio.Semaphore(spec.concurrency)

    async def one(q: Question) -> None:
        for config, name, model in runs:
            if (key := (q.id, setting.number, model) if model else (q.id, setting.number)) in done:
                continue
            async with semaphore:
                await run_one(q, config, name, model, key)

    async def run_one(q: Question, config, name: str, model: str | None, key: tuple) -> None:
        # The router's load counters around the question (experiments/router_load.py); at
        # --concurrency 1 what changed in between is this question's own.
        before = await client.stats()
        started_at, t0 = time.time(), time.perf_counter()
        graph, error = None, None
        try:
            graph = await client.run_graph(
                build_question_prompt(q),
                q.id,
                config,
                setting.mode,
                setting.early_exit,
                q.dataset,
                q.extra.get("task"),
            )
        except GraphRunError as e:
            error = str(e)
        e2e_s = time.perf_counter() - t0
        router = window(before, await client.stats(), alone=spec.concurrency == 1)
        # In a thread: grading may run code in the sandbox for seconds (HumanEval), which
        # must not stall the other questions' requests on this event loop.
        row = await asyncio.to_thread(
            result_row, q, setting, name, graph, error, e2e_s, started_at, model, router
        )
        writer.append(row)
        _update_bar(bar, stats, setting, row)
        if error and spec.fail_fast:
            raise FailFast(f"{q.id} setting {setting.number}: {error}")
        if error:
            await _stop_if_down(client, spec, f"{q.id} setting {setting.number}")

    # Like a TaskGroup (3.11+; we support 3.10): the first failure cancels the questions still
    # running, so nothing is left talking to a deployment that is being torn down.
    tasks = [asyncio.ensure_future(one(q)) for q in questions]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _stop_if_down(client: RouterClient, spec: RunSpec, what: str) -> None:
    """After a failure: stop the run (FailFast) when the deployment is down, unless
    --keep-going; the samples still to run would only fail the same way."""
    if spec.keep_going:
        return
    # The shell router probes its processes each second: a worker that died a moment ago may
    # not be reported yet, so ask a few times before taking the failure as the sample's own.
    for attempt in range(4):
        if down := await client.deployment_down():
            raise FailFast(f"{what} failed and the deployment is down: {down}")
        if attempt < 3:
            await asyncio.sleep(0.5)


def _record_failed(
    spec: RunSpec,
    setting: Setting,
    questions: list[Question],
    error: str,
    writer,
    bar: tqdm,
    stats: dict,
) -> None:
    """Rows for questions that could not be measured (their error says why)."""
    each = variants(spec, setting)  # once: a routed setting reads its scorer file
    for q in questions:
        for _, name, model in each:
            row = result_row(q, setting, name, None, error, 0.0, single_model=model)
            writer.append(row)
            _update_bar(bar, stats, setting, row)
    if spec.fail_fast:
        raise FailFast(f"setting {setting.number}: {error}")


def _update_bar(bar: tqdm, stats: dict, setting: Setting, row: dict) -> None:
    s = stats.setdefault(setting.number, {"correct": 0, "graded": 0, "lat": [], "err": 0})
    if row["error"]:
        s["err"] += 1
    else:
        s["lat"].append(row["e2e_s"])
        if row["correct"] is not None:
            s["graded"] += 1
            s["correct"] += bool(row["correct"])
    acc = f"{s['correct']}/{s['graded']}" if s["graded"] else "-"
    med = f"{statistics.median(s['lat']):.2f}s" if s["lat"] else "-"
    bar.set_postfix_str(f"setting {setting.number}: acc {acc}, median {med}, errors {s['err']}")
    bar.update(1)


async def run_async(spec: RunSpec, cluster: dict) -> None:
    from experiments.results import ResultsWriter, completed_keys
    from router.api_key import client_key

    questions = load_questions(
        spec.dataset, spec.num_samples, shuffle_seed=spec.shuffle_seed, offset=spec.offset
    )
    results = spec.out_dir / "results.jsonl"
    done = completed_keys(results) if spec.resume else set()
    keys = {(s.number, q.id): row_keys(spec, s, q) for s in spec.settings for q in questions}
    todo = {
        s.number: [q for q in questions if set(keys[(s.number, q.id)]) - done]
        for s in spec.settings
    }
    total = sum(len(set(keys[(n, q.id)]) - done) for n, qs in todo.items() for q in qs)
    writer = ResultsWriter(results)
    stats: dict = {}
    key = client_key(cluster, spec.cluster_path)
    registered: dict[int, list] = {}
    async with RouterClient(cluster["shell_router_url"], api_key=key) as client:
        with tqdm(total=total, desc="questions x settings", unit="run") as bar:
            for setting, batch in _schedule(spec, questions, todo):
                try:
                    await flush_worker_caches(client, cluster)
                    if setting.number not in registered:
                        registered[setting.number] = await register_variants(client, spec, setting)
                except (FlushFailed, GraphRunError) as e:
                    _record_failed(spec, setting, batch, str(e), writer, bar, stats)
                    await _stop_if_down(client, spec, f"setting {setting.number}")
                    continue
                runs = registered[setting.number]
                await _run_setting(client, spec, runs, setting, batch, writer, bar, stats, done)


def _schedule(
    spec: RunSpec, questions: list[Question], todo: dict[int, list[Question]]
) -> list[tuple[Setting, list[Question]]]:
    """The order of (setting, questions) batches, each run on cold caches.

    One question at a time: settings interleave per question (q1: #1 #2 #3 #4, q2: ...), so a
    drift in machine speed hits every setting alike and the latency ratios are paired. With
    --concurrency N > 1 a flush would disturb the questions in flight, so settings interleave
    per block of BLOCK_PER_CONCURRENCY × N questions instead, each block run through every
    setting with N in flight, the order turning by one setting per block (block 0: #2 #3,
    block 1: #3 #2, ...): no setting always runs first, or on a machine warmer or slower than
    the others'.
    """
    if spec.concurrency > 1:
        size = BLOCK_PER_CONCURRENCY * spec.concurrency
        out = []
        for b, start in enumerate(range(0, len(questions), size)):
            ids = {q.id for q in questions[start : start + size]}
            turn = b % len(spec.settings)
            for s in spec.settings[turn:] + spec.settings[:turn]:
                if batch := [q for q in todo[s.number] if q.id in ids]:
                    out.append((s, batch))
        return out
    pending = {s.number: {q.id for q in todo[s.number]} for s in spec.settings}
    return [(s, [q]) for q in questions for s in spec.settings if q.id in pending[s.number]]


def _runs(spec: RunSpec, config: str) -> bool:
    """Whether a setting of the run uses `config` (a routed config is deployed only for #6)."""
    return config != spec.routed_config or any(s.topology == "routed" for s in spec.settings)


def undersized_warning(cluster: dict, concurrency: int, path: Path) -> str | None:
    """Why a deployment started for fewer questions in flight than this run sends may make it
    wait (its decode workers' running requests and KV pools are sized at `moa-pd up`), or None."""
    started_for = cluster.get("concurrency")
    if started_for is None or concurrency <= started_for:
        return None
    return (
        f"warning: {path} was started for {started_for} question(s) in flight and this run sends "
        f"{concurrency}: its decode workers may admit too few requests (a request then waits "
        f"before its prefill even starts) and its KV pools may be short; start it with `moa-pd "
        f"up --concurrency {concurrency}` for numbers of this load"
    )


def run_experiment(spec: RunSpec) -> list[Path]:
    """Run (bringing a deployment up and down when no cluster is given), then write summary.json,
    the comparison table and the figures; returns the files written."""
    from experiments.plot_cmd import rebuild

    spec.out_dir.mkdir(parents=True, exist_ok=True)
    for s in spec.settings:
        config_for(spec, s)  # fail on a missing --dense-config before anything starts
        if s.topology == "routed":
            variants(spec, s)  # and on a scorer or profile the runner cannot read and send
    check_votes(spec)
    if spec.cluster_path:
        cluster = json.loads(Path(spec.cluster_path).read_text())
        warning = undersized_warning(cluster, spec.concurrency, spec.cluster_path)
        if warning:
            from rich.console import Console
            from rich.markup import escape

            Console(stderr=True, soft_wrap=True).print(f"[yellow]{escape(warning)}[/yellow]")
        asyncio.run(run_async(spec, cluster))
    else:
        from launch.commands import bring_up, make_stack

        configs = [spec.tree_config] + [
            c for c in (spec.dense_config, spec.routed_config) if c and _runs(spec, c)
        ]
        placement = replace(spec.gpu_placement or PlacementOptions(), concurrency=spec.concurrency)
        stack = make_stack(
            configs,
            spec.backend,
            spec.out_dir / "deployment",
            "127.0.0.1",
            spec.pin_cpus,
            placement=placement,
        )
        try:
            cluster = bring_up(stack)
            asyncio.run(run_async(spec, cluster))
        finally:
            stack.down()
    return rebuild(spec.out_dir)
