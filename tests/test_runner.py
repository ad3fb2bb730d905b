"""The experiment runner against an in-test stand-in for the shell router's /v1/moa/run and
/v1/moa/configs: rows per (sample, setting), resume, errors recorded without stopping the run,
--fail-fast, configs registered (never sent as paths)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from experiments.datasets import load_questions
from experiments.results import read_results
from experiments.run import FailFast, RunSpec, run_async
from experiments.settings import parse_settings
from tests.text_checks import said


def fake_router(
    calls: list[dict], fail_ids: set[str] = frozenset(), served: dict | None = None
) -> web.Application:
    """`served`: name -> config object, the configs the router was started with; registrations
    add to it as the real router's do (201 new, 200 the same again, 409 another body)."""
    served = {} if served is None else served

    async def register(request: web.Request) -> web.Response:
        cfg = await request.json()
        calls.append({"register": cfg})
        if cfg["name"] in served:
            same = served[cfg["name"]] == cfg
            return web.json_response({"id": cfg["name"]}, status=200 if same else 409)
        served[cfg["name"]] = cfg
        return web.json_response({"id": cfg["name"]}, status=201)

    async def run(request: web.Request) -> web.Response:
        body = await request.json()
        calls.append(body)
        if body["config"] not in served:
            return web.json_response({"error": {"message": "model_not_found"}}, status=404)
        if body["question_id"] in fail_ids:
            return web.json_response({"error": {"message": "precursor leaf_0 failed"}}, status=502)
        gold = answers[body["question_id"]]
        return web.json_response(
            {
                "answer": f"Adding it up, the answer is {gold}.",
                "trace": {"final": {"model": "m", "output_ids": [1, 2], "killed": False}},
                "early_exit": [],
            }
        )

    async def flush(request: web.Request) -> web.Response:
        calls.append({"flush": True})
        return web.json_response({})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/moa/run", run)
    app.router.add_post("/v1/moa/configs", register)
    app.router.add_post("/flush_cache", flush)
    return app


questions = load_questions("gsm8k", 3)
answers = {q.id: q.answer for q in questions}


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def spec_for(out: Path, settings: str = "1,2,3", **kw) -> RunSpec:
    return RunSpec(
        "tree_3_1_cpu", "all_to_all_9_9_1_cpu", "gsm8k", 3, parse_settings(settings), 2, out, **kw
    )


async def test_rows_per_sample_and_setting_then_resume(tmp_path):
    calls: list[dict] = []
    runner, url = await start(fake_router(calls))
    cluster = {"shell_router_url": url, "models": {"m": {"prefill_urls": [url], "decode_urls": []}}}
    try:
        await run_async(spec_for(tmp_path), cluster)
        rows = read_results(tmp_path / "results.jsonl")
        assert sorted((r.setting, r.sample_id) for r in rows) == sorted(
            (s, q.id) for s in (1, 2, 3) for q in questions
        )
        assert all(r.correct for r in rows)
        assert all(r.agents["final"].output_ids == [1, 2] and r.e2e_s > 0 for r in rows)
        runs = [c for c in calls if "mode" in c]
        assert {(c["config"], c["mode"]) for c in runs} == {
            ("all_to_all_9_9_1_cpu", "blocking"),
            ("tree_3_1_cpu", "blocking"),
            ("tree_3_1_cpu", "pipelined"),
        }
        # The router is told the dataset, so DMV votes with the dataset's own extractor.
        assert {c["dataset"] for c in runs} == {"gsm8k"} and not any("task" in c for c in runs)
        # concurrency 2: one block per setting, each on a cold cache
        assert sum("flush" in c for c in calls) == 3

        calls.clear()
        await run_async(spec_for(tmp_path, "1,2,3,4", resume=True), cluster)
        assert [c["early_exit"] for c in calls if "mode" in c] == [True] * 3
        assert len(read_results(tmp_path / "results.jsonl")) == 12
    finally:
        await runner.cleanup()


async def test_failed_sample_is_recorded_and_the_run_goes_on(tmp_path):
    calls: list[dict] = []
    runner, url = await start(fake_router(calls, fail_ids={questions[1].id}))
    cluster = {"shell_router_url": url, "models": {}}
    try:
        await run_async(spec_for(tmp_path, "2"), cluster)
        rows = {r.sample_id: r for r in read_results(tmp_path / "results.jsonl")}
        assert len(rows) == 3
        assert "502" in rows[questions[1].id].error and "leaf_0" in rows[questions[1].id].error
        assert rows[questions[0].id].error is None

        with pytest.raises(FailFast, match="precursor leaf_0 failed"):
            await run_async(spec_for(tmp_path / "ff", "2", fail_fast=True), cluster)
    finally:
        await runner.cleanup()


def test_setting_1_needs_dense_config(tmp_path):
    from experiments.run import config_for

    spec = RunSpec("tree_3_1_cpu", None, "gsm8k", 1, parse_settings("1"), 1, tmp_path)
    with pytest.raises(ValueError, match="needs --dense-config"):
        config_for(spec, spec.settings[0])
    with pytest.raises(ValueError, match="numbers among 1, 2, 3, 4, 5, 6, 7"):
        parse_settings("1,8")
    spec = RunSpec("tree_3_1_cpu", None, "gsm8k", 1, parse_settings("6"), 1, tmp_path)
    with pytest.raises(ValueError, match="needs --routed-config"):
        config_for(spec, spec.settings[0])
    spec.routed_config = "routed_pool_cpu"
    assert config_for(spec, spec.settings[0]) == "routed_pool_cpu"


def test_dmv_on_a_dataset_without_answers_is_refused_before_starting(tmp_path):
    from experiments.run import check_votes, run_experiment

    spec = RunSpec("tree_9_3_1_homo_dmv", None, "ifbench", 1, parse_settings("3,4"), 1, tmp_path)
    with pytest.raises(ValueError, match="setting 4 .* dataset 'ifbench' has no single answer"):
        run_experiment(spec)
    assert not (tmp_path / "results.jsonl").exists()
    check_votes(
        RunSpec("tree_9_3_1_homo_dmv", None, "ifbench", 1, parse_settings("3"), 1, tmp_path)
    )  # without early exit nothing votes
    check_votes(RunSpec("tree_9_3_1_homo_dmv", None, "gsm8k", 1, parse_settings("4"), 1, tmp_path))
    mixed = RunSpec(
        "tree_9_3_1_homo_dmv", None, "gsm8k,ifbench", 2, parse_settings("4"), 1, tmp_path
    )
    with pytest.raises(ValueError, match="dataset 'ifbench' has no single answer"):
        check_votes(mixed)  # one member without answers is enough


def test_cli_run_bad_settings_exit_2(tmp_path):
    from launch.cli import main

    assert (
        main(
            [
                "run",
                "--config",
                "tree_3_1_cpu",
                "--dataset",
                "gsm8k",
                "--settings",
                "x",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert not (tmp_path / "results.jsonl").exists()


async def test_one_at_a_time_interleaves_settings_per_question(tmp_path):
    calls: list[dict] = []
    runner, url = await start(fake_router(calls))
    cluster = {"shell_router_url": url, "models": {"m": {"prefill_urls": [url], "decode_urls": []}}}
    spec = RunSpec("tree_3_1_cpu", None, "gsm8k", 2, parse_settings("2,3"), 1, tmp_path)
    try:
        await run_async(spec, cluster)
    finally:
        await runner.cleanup()
    runs_and_flushes = [c for c in calls if "register" not in c]
    order = [(c["question_id"], c["mode"]) if "mode" in c else "flush" for c in runs_and_flushes]
    q0, q1 = questions[0].id, questions[1].id
    assert order == [
        "flush",
        (q0, "blocking"),
        "flush",
        (q0, "pipelined"),
        "flush",
        (q1, "blocking"),
        "flush",
        (q1, "pipelined"),
    ]


async def test_setting_7_runs_the_tree_blocking_by_layer_and_is_named_in_the_table(tmp_path):
    from rich.console import Console

    from experiments.summary import summarize
    from experiments.summary_table import print_table

    calls: list[dict] = []
    runner, url = await start(fake_router(calls))
    cluster = {"shell_router_url": url, "models": {"m": {"prefill_urls": [url], "decode_urls": []}}}
    spec = RunSpec("tree_3_1_cpu", None, "gsm8k", 2, parse_settings("2,7"), 1, tmp_path)
    try:
        await run_async(spec, cluster)
    finally:
        await runner.cleanup()
    assert [c["mode"] for c in calls if "mode" in c] == ["blocking", "blocking_layer"] * 2
    rows = read_results(tmp_path / "results.jsonl")
    assert {(r.setting, r.mode, r.config) for r in rows} == {
        (2, "blocking", "tree_3_1_cpu"),
        (7, "blocking_layer", "tree_3_1_cpu"),
    }
    console = Console(record=True, width=300)
    print_table(summarize(rows), console)
    assert "#7 tree, blocking by layer" in console.export_text()


async def test_a_config_file_elsewhere_is_asked_for_by_its_name(tmp_path):
    """A copy of a shipped config under another file name keeps its `name`, which is what the
    shell router serves it under; an edited copy whose name the deployment serves differently
    is registered under its name plus a digest, so the run measures the file it was given."""
    import json
    import shutil

    mine = tmp_path / "elsewhere" / "mytree.json"
    mine.parent.mkdir()
    shutil.copy("cfgs/tree_3_1_cpu.json", mine)
    edited = tmp_path / "edited.json"
    raw = json.loads(mine.read_text())
    raw["slot_order"] = "dynamic" if raw.get("slot_order") != "dynamic" else "static"
    edited.write_text(json.dumps(raw))
    calls: list[dict] = []
    served = {"tree_3_1_cpu": json.loads(Path("cfgs/tree_3_1_cpu.json").read_text())}
    runner, url = await start(fake_router(calls, served=served))
    cluster = {"shell_router_url": url, "models": {}}
    try:
        spec = RunSpec(str(mine), None, "gsm8k", 1, parse_settings("2"), 1, tmp_path / "a")
        await run_async(spec, cluster)
        assert [c["config"] for c in calls if "mode" in c] == ["tree_3_1_cpu"]
        assert [r.config for r in read_results(tmp_path / "a" / "results.jsonl")] == [
            "tree_3_1_cpu"
        ]
        calls.clear()
        spec = RunSpec(str(edited), None, "gsm8k", 1, parse_settings("2"), 1, tmp_path / "b")
        await run_async(spec, cluster)
        sent = [c["config"] for c in calls if "mode" in c]
        assert len(sent) == 1 and sent[0].startswith("tree_3_1_cpu@")
        assert served[sent[0]] == {**raw, "name": sent[0]}
        assert [r.config for r in read_results(tmp_path / "b" / "results.jsonl")] == [
            "tree_3_1_cpu"
        ]
    finally:
        await runner.cleanup()


async def test_single_model_baseline_runs_each_model_alone(tmp_path):
    """Setting #5 registers one single-agent config per model of the tree config, runs each by
    name and writes one row per (question, model); --resume skips what is done."""
    calls: list[dict] = []
    served: dict = {}
    runner, url = await start(fake_router(calls, served=served))
    cluster = {"shell_router_url": url, "models": {}}
    spec = RunSpec("tree_9_3_1_hetero", None, "gsm8k", 2, parse_settings("5"), 1, tmp_path)
    try:
        await run_async(spec, cluster)
        runs = [c for c in calls if "mode" in c]
        models = [served[c["config"]]["agents"][0]["model"] for c in runs]
        assert models == ["qwen3vl-4b", "qwen3vl-8b", "qwen3vl-32b"] * 2
        assert all(len(served[c["config"]]["agents"]) == 1 and not c["early_exit"] for c in runs)
        rows = read_results(tmp_path / "results.jsonl")
        assert sorted((r.sample_id, r.single_model) for r in rows) == sorted(
            (q.id, m) for q in questions[:2] for m in ("qwen3vl-4b", "qwen3vl-8b", "qwen3vl-32b")
        )
        assert {r.config for r in rows} == {
            f"tree_9_3_1_hetero-single-{m}" for m in ("qwen3vl-4b", "qwen3vl-8b", "qwen3vl-32b")
        }
        assert all(r.setting == 5 and r.correct for r in rows)
        calls.clear()
        await run_async(
            RunSpec(
                "tree_9_3_1_hetero", None, "gsm8k", 2, parse_settings("5"), 1, tmp_path, resume=True
            ),
            cluster,
        )
        assert not [c for c in calls if "mode" in c]
    finally:
        await runner.cleanup()


def test_a_run_where_every_sample_failed_still_writes_rows_and_a_summary(tmp_path, capsys):
    """Exit code 1, the rows, a summary naming the error, no figures (and no crash), and the
    command that resumes the run."""
    import asyncio
    import json
    import threading

    from launch.cli import main

    calls: list[dict] = []
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    runner, url = asyncio.run_coroutine_threadsafe(
        start(fake_router(calls, fail_ids=set(answers))), loop
    ).result()
    (tmp_path / "cluster.json").write_text(json.dumps({"shell_router_url": url, "models": {}}))
    out = tmp_path / "run"
    try:
        code = main(
            [
                "run",
                "--config",
                "tree_3_1_cpu",
                "--dataset",
                "gsm8k",
                "--num-samples",
                "2",
                "--settings",
                "2,4",
                "--out",
                str(out),
                "--cluster",
                str(tmp_path / "cluster.json"),
            ]
        )
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
    assert code == 1
    assert len(read_results(out / "results.jsonl")) == 4
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["setting"], s["errors"]) for s in summary["settings"]] == [(2, 2), (4, 2)]
    assert summary["settings"][0]["error_messages"] == {
        "shell router answered 502: precursor leaf_0 failed": 2
    }
    assert not list(out.glob("*.png"))
    err = said(capsys.readouterr().err)
    assert "4 of 4 rows failed" in err and "--resume" in err and "moa-pd run --config" in err


def test_single_model_config_keeps_the_prompt_and_the_answer_sampling():
    from experiments.single_model import single_model_configs
    from router.config_loader import load_config

    cfg = load_config("tree_3_1_cpu")
    ((model, single),) = single_model_configs(cfg).items()
    assert model == "smollm2" and [a.id for a in single.agents] == ["single"]
    assert single.template_of("single") == cfg.template_of("leaf_0_0")
    assert single.sampling_of("single") == cfg.sampling_of(cfg.final)
    assert not single.early_exit.enabled and single.final == "single"


def test_single_model_configs_of_a_pool_run_each_candidate_by_its_id():
    from experiments.single_model import single_model_configs
    from router.config_loader import load_config

    cfg = load_config("routed_pool_cpu")
    singles = single_model_configs(cfg)
    assert list(singles) == cfg.pool_ids
    for cid, single in singles.items():
        cand = next(c for c in cfg.pool.candidates if c.id == cid)
        assert [a.id for a in single.agents] == ["single"]
        assert single.agent("single").model == cand.model
        # the candidate as the routed setting runs it: its persona, its sampling
        assert single.template_of("single") == cfg.template_of(cid)
        assert single.template_of("single").system == cand.persona
        assert single.sampling_of("single") == cfg.sampling_of(cid)
    personas = {s.template_of("single").system for s in singles.values()}
    assert len(personas) > 1, "the pool's persona variants reach #5"


class _FlushClient:
    """Answers /flush_cache with the given statuses in turn (then the last one forever)."""

    def __init__(self, statuses: list[int]):
        self.statuses, self.calls = statuses, 0

    async def post_json(self, url: str, body: dict) -> int:
        self.calls += 1
        return self.statuses[min(self.calls, len(self.statuses)) - 1]


CLUSTER = {"models": {"m": {"prefill_urls": ["http://p"], "decode_urls": []}}}


async def test_flush_retries_while_sglang_still_holds_a_request():
    from experiments.run import FlushFailed, flush_worker_caches

    client = _FlushClient([400, 400, 200])  # SGLang: 400 while a request is live
    await flush_worker_caches(client, CLUSTER, retry_s=5)
    assert client.calls == 3
    with pytest.raises(FlushFailed, match=r"http://p \(HTTP 400\)"):
        await flush_worker_caches(_FlushClient([400]), CLUSTER, retry_s=0.3)
    other = _FlushClient([404])
    with pytest.raises(FlushFailed, match="HTTP 404"):
        await flush_worker_caches(other, CLUSTER, retry_s=5)
    assert other.calls == 1  # only a busy worker's refusal is retried


def with_stats(app: web.Application, calls: list[dict]) -> web.Application:
    """`app` with a GET /v1/moa/stats whose counters a question moves: 0.25 CPU s and 4 probe
    wakes (3 within 1 ms, 1 within 10 ms) each; its clock ticks once per stats request."""
    state = {"t": 0.0, "cpu": 1.0, "fast": 0, "slow": 0}

    @web.middleware
    async def load(request: web.Request, handler):
        if request.path == "/v1/moa/run":
            state["cpu"] += 0.25
            state["fast"] += 3
            state["slow"] += 1
        return await handler(request)

    async def stats(request: web.Request) -> web.Response:
        calls.append({"stats": True})
        state["t"] += 1.0
        n = state["fast"] + state["slow"]
        lag = {"period_s": 0.05, "le": [0.001, 0.01], "counts": [state["fast"], n], "count": n}
        return web.json_response(
            {
                "boot_id": "r1",
                "time_s": state["t"],
                "cpu_s": state["cpu"],
                "event_loop_lag": lag | {"sum": 0.0},
            }
        )

    app.middlewares.append(load)
    app.router.add_get("/v1/moa/stats", stats)
    return app


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_rows_carry_the_routers_load_and_the_summary_divides_it(tmp_path, concurrency):
    from experiments.router_load import setting_load

    calls: list[dict] = []
    runner, url = await start(with_stats(fake_router(calls), calls))
    cluster = {"shell_router_url": url, "models": {"m": {"prefill_urls": [url], "decode_urls": []}}}
    spec = RunSpec("tree_3_1_cpu", None, "gsm8k", 3, parse_settings("2,3"), concurrency, tmp_path)
    try:
        await run_async(spec, cluster)
    finally:
        await runner.cleanup()
    rows = read_results(tmp_path / "results.jsonl")
    assert sum("stats" in c for c in calls) == 2 * len(rows) == 12
    assert all(r.router is not None and r.router.alone == (concurrency == 1) for r in rows)
    if concurrency == 1:  # each row's window is its own question
        assert all(r.router_cpu_s == pytest.approx(0.25) for r in rows)
        assert all(r.router_lag_p99_s == 0.01 for r in rows)
    else:  # windows overlap: no per-row numbers, only the setting's
        assert all(r.router_cpu_s is None and r.router_lag_p99_s is None for r in rows)
    for setting in (2, 3):  # what summary.json says of each setting
        load = setting_load([r.router for r in rows if r.setting == setting])
        assert load["router_cpu_s_per_question"] == pytest.approx(0.25)
        assert load["event_loop_lag_samples"] == 12
        assert (load["event_loop_lag_p50_s"], load["event_loop_lag_p99_s"]) == (0.001, 0.01)


async def test_a_router_without_stats_is_asked_once_and_rows_have_no_load(tmp_path):
    calls: list[dict] = []
    app = fake_router(calls)

    @web.middleware
    async def seen(request: web.Request, handler):
        if request.path == "/v1/moa/stats":
            calls.append({"stats": True})
        return await handler(request)

    app.middlewares.append(seen)
    runner, url = await start(app)
    cluster = {"shell_router_url": url, "models": {"m": {"prefill_urls": [url], "decode_urls": []}}}
    spec = RunSpec("tree_3_1_cpu", None, "gsm8k", 2, parse_settings("2"), 1, tmp_path)
    try:
        await run_async(spec, cluster)
    finally:
        await runner.cleanup()
    rows = read_results(tmp_path / "results.jsonl")
    assert len(rows) == 2 and all(r.ok and r.router is None for r in rows)
    assert all(r.router_cpu_s is None for r in rows)
    assert sum("stats" in c for c in calls) == 1


def test_under_concurrency_settings_interleave_by_blocks_in_turning_order(tmp_path):
    """--concurrency 2, 10 questions, #2 and #3: blocks of 4 questions (two waves of 2), each
    through both settings, #2 first in blocks 0 and 2, #3 first in block 1; at concurrency 1
    the settings interleave per question."""
    from experiments.datasets import Question
    from experiments.run import BLOCK_PER_CONCURRENCY, _schedule

    qs = [Question(id=f"q{i}", question="?", answer="1", dataset="gsm8k") for i in range(10)]
    spec = RunSpec("tree_3_1_cpu", None, "gsm8k", 10, parse_settings("2,3"), 2, tmp_path)
    todo = {2: qs, 3: [q for q in qs if q.id != "q5"]}  # q5's #3 row is done (--resume)
    got = [(s.number, [q.id for q in batch]) for s, batch in _schedule(spec, qs, todo)]
    assert BLOCK_PER_CONCURRENCY == 2
    assert got == [
        (2, ["q0", "q1", "q2", "q3"]),
        (3, ["q0", "q1", "q2", "q3"]),
        (3, ["q4", "q6", "q7"]),
        (2, ["q4", "q5", "q6", "q7"]),
        (2, ["q8", "q9"]),
        (3, ["q8", "q9"]),
    ]
    spec.concurrency = 1
    got = [(s.number, [q.id for q in batch]) for s, batch in _schedule(spec, qs[:2], todo)]
    assert got == [(2, ["q0"]), (3, ["q0"]), (2, ["q1"]), (3, ["q1"])]
