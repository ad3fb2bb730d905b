"""The deployments the benchmarks bring up themselves: worker specs of either backend, and
`Deployment` (a PD pair behind the native sglang-router, two null-mode replicas, two more with
chunked prefill). Used by benchmarks/microbench.py, bench_engine.py and bench_sglang_cpu.py;
command lines come from launch.worker_cmd (and sglang_backend/cpu.py for SGLang without a GPU),
as for `moa-pd up`; processes start and stop through launch.procs."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from launch.pool_check import check_pool
from launch.ports import free_port, start_with_fresh_ports
from launch.procs import (
    LaunchError,
    Proc,
    ProcSpec,
    start,
    stop_groups,
    wait_healthy,
    wait_routable,
)
from launch.worker_cmd import placement_flags, router_argv, worker_argv
from planning.model_memory import model_memory
from planning.pack import PlanError, place
from planning.types import WorkerDemand, WorkerPlacement
from router.config import ModelSpec
from sglang_ext.sglang_backend import cpu, gpu

DP_CHUNK_TOKENS = 256  # --chunked-prefill-size of the dp2_chunked replicas (Sarathi baseline)


def resolve(model_path: str) -> str:
    from sglang_ext.engine.model_store import resolve_model_path

    try:
        return resolve_model_path(model_path)
    except (FileNotFoundError, ValueError) as e:
        raise LaunchError(str(e)) from None


def vocab_size(model_path: str) -> int:
    return int(json.loads((Path(resolve(model_path)) / "config.json").read_text())["vocab_size"])


def kv_tokens(max_seq_len: int) -> int:
    """KV pool per worker: two full sequences (a warmed prefix may stay cached beside the live
    request), at least 2048, in whole 256-token blocks; small, since six workers share the box."""
    return max(2048, -(-2 * max_seq_len // 256) * 256)


def worker_spec(
    name: str,
    model_dir: str,
    role: str,
    host: str,
    server_args: dict[str, int | str],
    backend: str = "torch",
    placed: WorkerPlacement | None = None,
    load_format: str = "auto",
) -> ProcSpec:
    """One worker of `backend`: "torch" (the reference engine) or "sglang" (real SGLang: on the
    GPU(s) of `placed`, its placement (planning/), whose pool and GPU flags come last and win;
    without one on SGLang's CPU path with the flags and environment `moa-pd up --backend
    sglang` gives it there, which fix its KV pool at cpu.py's size)."""
    port = free_port(host)
    bport = free_port(host) if role == "prefill" else None
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    sglang_cpu = backend == "sglang" and placed is None
    if sglang_cpu:
        server_args = {k: v for k, v in server_args.items() if k != "max_total_tokens"}
    spec = ModelSpec(
        model_path=model_dir, load_format=load_format, server_args={backend: server_args}
    )
    argv = worker_argv(backend, model_dir, spec, role, host, port, bport)
    if sglang_cpu:
        argv += cpu.worker_flags(role)
        env.update(cpu.worker_env(role))
    elif backend == "sglang":
        argv += gpu.worker_flags(argv)  # triton where the kernels lack FA3
    if placed is not None:
        flags, gpu_env = placement_flags(placed)
        argv += flags
        env.update(gpu_env)
    return ProcSpec(
        name,
        argv,
        f"http://{host}:{port}/health",
        env=env,
        ports=[port] + ([bport] if bport else []),
    )


def base_url(spec: ProcSpec) -> str:
    return spec.health_url.removesuffix("/health")


def router_spec(prefill: ProcSpec, decode: ProcSpec, host: str) -> ProcSpec:
    port, metrics_port = free_port(host), free_port(host)
    argv = router_argv(
        [(base_url(prefill), prefill.ports[1])],
        [base_url(decode)],
        host,
        port,
        host,
        metrics_port,
        ["--health-check-interval-secs", "5", "--log-level", "warn"],
    )
    return ProcSpec("router", argv, f"http://{host}:{port}/health", ports=[port, metrics_port])


class Deployment:
    """The workers the microbench compares, on one host; `with Deployment(...) as dep:`.

    Only what `variants` need is started: the PD pair and its router for "incremental" and "pd",
    two replicas for "dp2", two more with chunked prefill for "dp2_chunked". backend "sglang"
    runs real SGLang, on one GPU per worker where nvidia-smi is found, else on SGLang's CPU path
    (≈3.7 GB per worker, so pick few variants there)."""

    def __init__(
        self,
        model_path: str,
        host: str,
        max_seq_len: int,
        log_dir: Path,
        startup_timeout_s: float = 900.0,
        backend: str = "torch",
        variants: tuple[str, ...] = ("incremental", "pd", "dp2", "dp2_chunked"),
        load_format: str | None = None,
    ):
        self.model_dir = resolve(model_path)
        # None: what a config would take for this model_path ("dummy" for a dummy:SHAPE model).
        self.load_format = load_format or ModelSpec(model_path=model_path).load_format
        self.host, self.log_dir, self.timeout = host, Path(log_dir), startup_timeout_s
        self.backend, self.variants = backend, tuple(variants)
        self.args = {
            "max_total_tokens": kv_tokens(max_seq_len),
            "context_length": max(2048, max_seq_len + 64),
        }
        self.procs: list[Proc] = []
        self.prefill_url = self.router_url = ""
        self.dp_urls: list[str] = []
        self.dp_chunked_urls: list[str] = []
        self.skipped: dict[str, str] = {}  # variant -> why it was not run

    @property
    def cache_urls(self) -> list[str]:
        """Workers with a radix cache (a PD decode worker keeps none, as in SGLang)."""
        return [u for u in (self.prefill_url, *self.dp_urls, *self.dp_chunked_urls) if u]

    @property
    def urls(self) -> list[str]:
        """Where requests go: the PD router and the replicas that were started."""
        return [u for u in (self.router_url, *self.dp_urls, *self.dp_chunked_urls) if u]

    def _placements(self, names: list[str]) -> dict[str, WorkerPlacement | None]:
        """SGLang where there are GPUs: the workers packed onto them by memory (planning/),
        each with the pool the benchmark sets; None: the CPU (either engine)."""
        from planning.gpus import has_nvidia_gpus, query_gpus

        if self.backend != "sglang" or not has_nvidia_gpus():
            return dict.fromkeys(names)
        mem = model_memory(self.model_dir)
        pool = self.args["max_total_tokens"]
        demands = [  # one "model" per worker name, so each placement is found by its name
            WorkerDemand(n, "worker", 0, 1, mem.weights_bytes, mem.kv_bytes_per_token, pool)
            for n in names
        ]
        try:
            plan = place(demands, query_gpus())
        except PlanError as e:
            raise LaunchError(str(e)) from None
        return {w.demand.model: w for w in plan.workers}

    def up(self) -> None:
        h, a, v = self.host, self.args, self.variants
        groups: dict[str, list[tuple[str, str, dict]]] = {}  # group -> (name, role, args)
        if {"incremental", "pd"} & set(v):
            groups["pd"] = [("pd.prefill", "prefill", a), ("pd.decode", "decode", a)]
        if "dp2" in v:
            groups["dp"] = [(f"dp{i}", "null", a) for i in range(2)]
        if "dp2_chunked" in v:
            chunked_args = {**a, "chunked_prefill_size": DP_CHUNK_TOKENS}
            groups["chunked"] = [(f"dp_chunked{i}", "null", chunked_args) for i in range(2)]
        rows = {name: (g, role, args) for g, rs in groups.items() for name, role, args in rs}
        placed = self._placements(list(rows))

        def build(name: str) -> ProcSpec:  # new ports on every call
            _, role, args = rows[name]
            return worker_spec(
                name,
                self.model_dir,
                role,
                h,
                args,
                self.backend,
                placed=placed[name],
                load_format=self.load_format,
            )

        specs = {name: build(name) for name in rows}
        # Workers load their weights at once, except those sharing a GPU: one turn after another
        # (each sizes its pool from the memory free at its start). The chunked pair starts on
        # its own, so an engine without chunked prefill skips that variant instead of failing.
        turn = {n: (w.turn if w else 0) for n, w in placed.items()}
        chunked_names = {n for n, _, _ in groups.get("chunked", [])}
        for t in sorted(set(turn.values())):
            now = [n for n in rows if turn[n] == t]
            self._start_phase([n for n in now if n not in chunked_names], specs, build, placed)
            chunked = [n for n in now if n in chunked_names]
            if chunked and "dp2_chunked" not in self.skipped:
                try:
                    self._start_phase(chunked, specs, build, placed)
                except LaunchError as e:
                    done = [p for p in self.procs if p.spec.name in chunked_names]
                    stop_groups([p.pid for p in done])  # one of the pair is no variant
                    self.procs = [p for p in self.procs if p not in done]
                    self.skipped["dp2_chunked"] = (
                        f"--chunked-prefill-size {DP_CHUNK_TOKENS} replicas did not start: {e}"
                    )
                    print(f"dp2_chunked skipped: {self.skipped['dp2_chunked']}", file=sys.stderr)
        self.dp_urls = [base_url(specs[n]) for n, _, _ in groups.get("dp", [])]
        if "chunked" in groups and "dp2_chunked" not in self.skipped:
            self.dp_chunked_urls = [base_url(specs[n]) for n, _, _ in groups["chunked"]]
        if "pd" in groups:
            prefill, decode = specs["pd.prefill"], specs["pd.decode"]
            specs["router"] = router_spec(prefill, decode, h)
            self._start_phase(["router"], specs, lambda _: router_spec(prefill, decode, h), {})
            router = self.procs[-1]
            self.prefill_url, self.router_url = base_url(prefill), base_url(router.spec)
            wait_routable(self.router_url, self.timeout, router)

    def _start_phase(
        self,
        names: list[str],
        specs: dict[str, ProcSpec],
        build: Callable[[str], ProcSpec],
        placed: dict[str, WorkerPlacement | None],
    ) -> None:
        """Start the named specs and wait until healthy, with new ports where another process
        took one (launch.ports.start_with_fresh_ports, as `moa-pd up`); specs gets the rebuilt
        ones. A worker placed on a GPU must come up with the pool the benchmark sets."""

        def start_all(batch: list[ProcSpec]) -> None:
            started = [start(s, self.log_dir) for s in batch]
            self.procs += started
            try:
                wait_healthy(started, self.timeout)
                for p in started:
                    if placed.get(p.spec.name) is not None:
                        check_pool(
                            p,
                            self.args["max_total_tokens"],
                            "the microbench sets (two of its longest sequences)",
                            "give it more memory (fewer --variants, a GPU with more free "
                            "memory) or lower --max-len",
                        )
            except LaunchError:
                stop_groups([p.pid for p in started])  # so their ports tell who else holds one
                self.procs = [p for p in self.procs if p not in started]
                raise

        def renew(_taken: list[int], again: list[str]) -> list[ProcSpec]:
            specs.update({n: build(n) for n in again})
            return [specs[n] for n in again]

        if names:
            start_with_fresh_ports([specs[n] for n in names], self.host, start_all, renew)

    def down(self) -> None:
        stop_groups([p.pid for p in reversed(self.procs)])
        self.procs.clear()

    def __enter__(self) -> Deployment:  # noqa: PYI034 - final in practice
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()
