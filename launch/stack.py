"""A deployment built from topology configs: per model its prefill and decode workers and a native
sglang-router in PD mode, plus one shell router. `Stack` starts it, writes `cluster.json` (every
endpoint) and stops exactly what it started. With a plan (launch/plan_deploy.py) it starts the
plan's workers: all of them, one node's (writing cluster.NODE.json, launch/cluster_part.py), or
none, with the routers over the workers of joined node parts."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from typing_extensions import Self

from launch.cluster_part import part_path, write_json
from launch.models import ModelPlan
from launch.plan_deploy import PlanSlice
from launch.pool_check import check_pool, check_pools
from launch.ports import PortBook, start_with_fresh_ports
from launch.procs import (
    LaunchError,
    Proc,
    ProcSpec,
    start,
    stop_groups,
    wait_healthy,
    wait_routable,
    write_pidfile,
)
from launch.run_dir import claim, mark_stopped
from launch.worker_cmd import placement_flags, router_argv, worker_argv
from planning.models import merge_models, resolve_model
from planning.pack import PlanError, plan_cpus
from planning.pool_need import decode_running_requests, running_needs
from planning.types import Placement
from router.api_key import KEY_FILE, write_key_file
from router.cluster import create_time
from router.config import TopologyConfig
from sglang_ext.engine.config import DEFAULT_MAX_TOTAL_TOKENS
from sglang_ext.server_args import DEFAULT_MAX_RUNNING_REQUESTS
from sglang_ext.sglang_backend import cpu
from sglang_ext.sglang_backend import gpu as sglang_gpu

log = logging.getLogger(__name__)
PY = sys.executable
# SGLang's /health is a one-token generation queued behind the running batch: ~1 s on a GPU, up
# to ~4.5 s behind a 1,024-token prefill on its CPU path. Measured: a 2.5 s probe called a busy
# CPU prefill worker hung (tree_3_1_cpu #3). Two misses of 5 s call a hung SGLang worker down
# in at most ~11 s.
SGLANG_HEALTH_PROBE_S = 5.0


class Stack:
    def __init__(
        self,
        configs: list[TopologyConfig],
        config_paths: list[str],
        backend: str,
        run_dir: Path,
        host: str = "127.0.0.1",
        placement: Placement | None = None,
        startup_timeout_s: float = 600.0,
        pin_cpus: bool = False,
        sglang_cpu: bool = False,
        warmup_verb: str = "generate",
        pool_needs: dict[tuple[str, str], int] | None = None,
        concurrency: int = 1,
        api_key: str | None = None,
        plan: PlanSlice | None = None,
        joined: dict[str, dict] | None = None,
        joined_devices: dict[str, int] | None = None,
    ):
        self.configs, self.config_paths = configs, config_paths
        self.backend, self.run_dir, self.host = backend, Path(run_dir), host
        # Where each SGLang worker runs on GPUs, its explicit pool and start turn (planning/).
        self.placement = placement
        # {(model, role): KV tokens} the configs' agents need (planning.pool_need); every worker's
        # pool is checked against it once healthy.
        self.pool_needs = pool_needs or {}
        self.concurrency = concurrency
        # {model: requests} a decode worker runs at once at this concurrency (planning.pool_need).
        self.running_needs = running_needs(configs, concurrency)
        self.startup_timeout_s = startup_timeout_s
        # Each worker on its own cores (planning.pack.plan_cpus), so a prefill and a decode
        # worker contend as little as on separate GPUs.
        self.pin_cpus = pin_cpus
        # backend "sglang" without a GPU: SGLang's CPU path, with its flags and environment.
        self.sglang_cpu = sglang_cpu and backend == "sglang"
        # How the shell router sends warm-ups (router/cluster.py): SGLang's /generate with the
        # fake bootstrap host, or our /prefill_only verb (both backends serve it).
        self.warmup_verb = warmup_verb
        # The shell router's key (router/api_key.py): it travels in RUN_DIR/api_key (0600).
        self.api_key = api_key
        # A plan's part: its workers' replicas, devices, pools and shares (placement is its
        # Placement). With `node` set only that node's workers start, and no router.
        self.plan_slice = plan
        # {model: entry} merged from node parts (launch/cluster_part.merge_parts), and their
        # devices: the workers run elsewhere; this stack starts the routers over them.
        self.joined = joined
        self.joined_devices = joined_devices or {}
        self._claim = None  # the run folder's lock while this stack owns it (launch/run_dir.py)
        self.procs: list[Proc] = []
        # Children get SIGTERM if this process dies (kill -9 too); `moa-pd up --detach` clears it.
        self.die_with_parent = True
        self.models: dict[str, ModelPlan] = {}
        # Worker URL -> (device, slots), filled by worker_specs (cluster.json's `devices`).
        self.worker_devices: dict[str, tuple[str, int]] = {}
        self.ports = PortBook(host)
        self.shell_router_port = 0

    # --- planning --------------------------------------------------------------------------------
    def check_embedders(self) -> None:
        """Early exit's embedding models resolve now (a hub id is fetched or found in the local
        hub cache), not at a question's first early-exit decision in the shell router."""
        from router.embedder import resolve_model_path

        for cfg in self.configs:
            if cfg.early_exit.enabled and cfg.early_exit.method == "q":
                try:
                    resolve_model_path(cfg.early_exit.embedding_model)
                except ValueError as e:
                    raise LaunchError(f"config {cfg.name}: {e}") from None

    def plan(self) -> None:
        self.check_embedders()
        try:
            specs = merge_models(self.configs)
            paths = {
                n: resolve_model(s, self.backend, local=self.sglang_cpu) for n, s in specs.items()
            }
        except PlanError as e:
            raise LaunchError(str(e)) from None
        for name, spec in specs.items():
            m = ModelPlan(name, spec, *paths[name])
            if self.plan_slice is not None:
                ps = self.plan_slice
                m.spec = spec.model_copy(update={"workers": ps.replica_counts(name)})
                m.prefill_replicas = [] if self.joined else ps.local_replicas(name, "prefill")
                m.decode_replicas = [] if self.joined else ps.local_replicas(name, "decode")
                if self.node and not (m.prefill_replicas or m.decode_replicas):
                    continue  # none of its workers on this node
            self.models[name] = m
        self._assign_ports()

    @property
    def node(self) -> str | None:
        """The plan's node whose part this stack starts (no routers); None: a whole deployment."""
        return self.plan_slice.node if self.plan_slice is not None else None

    def _assign_ports(self) -> None:
        """Every port from the book: at planning, and again after `_start_phase` renewed some."""
        book = self.ports
        for name, m in self.models.items():
            m.prefill_ports = [book[f"{name}.prefill{i}"] for i in m.replicas("prefill")]
            m.bootstrap_ports = [book[f"{name}.bootstrap{i}"] for i in m.replicas("prefill")]
            m.decode_ports = [book[f"{name}.decode{i}"] for i in m.replicas("decode")]
            if self.node is None:
                m.router_port = book[f"{name}.router"]
        if self.node is None:
            self.shell_router_port = book["shell_router"]

    def worker_specs(self) -> list[ProcSpec]:
        specs = []
        for m in self.models.values():
            roles = [
                ("prefill", i, port, bport)
                for i, port, bport in zip(m.replicas("prefill"), m.prefill_ports, m.bootstrap_ports)
            ]
            roles += [
                ("decode", i, port, None) for i, port in zip(m.replicas("decode"), m.decode_ports)
            ]
            for role, i, port, bport in roles:
                argv = worker_argv(
                    self.backend,
                    m.model_path,
                    m.spec,
                    role,
                    self.host,
                    port,
                    bport,
                    m.tokenizer_path,
                )
                env = {}
                if self.sglang_cpu:
                    argv += cpu.worker_flags(role)
                    env = cpu.worker_env(role)
                elif self.backend == "sglang":
                    argv += sglang_gpu.worker_flags(argv)  # triton where the kernels lack FA3
                argv, env = self._with_pool(m, role, f"{m.name}.{role}{i}", argv, env)
                argv = self._with_running_slots(m, role, argv)
                specs.append(
                    ProcSpec(
                        f"{m.name}.{role}{i}",
                        argv,
                        f"http://{self.host}:{port}/health",
                        env=env,
                        ports=[port] + ([bport] if bport else []),
                    )
                )
        if self.pin_cpus or self.plan_slice is not None:
            roles = [s.name.rsplit(".", 1)[1].rstrip("0123456789") for s in specs]
            pins = (
                [self.plan_slice.cpus(s.name) or None for s in specs]
                if self.plan_slice is not None
                else plan_cpus(roles)
            )
            for spec, cpus in zip(specs, pins):
                if cpus is None:
                    continue
                spec.cpus = cpus
                # SGLang's CPU engine binds its OpenMP threads by this variable.
                spec.env["SGLANG_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cpus))
        self.worker_devices = {
            spec.health_url.removesuffix("/health"): self._device_of(spec) for spec in specs
        }
        return specs

    def _device_of(self, spec: ProcSpec) -> tuple[str, int]:
        """(device name, slots) of a worker, for the router's warm-up gate: CPU cores run one
        busy worker each (every worker runs one compute thread: OMP_NUM_THREADS=1); a GPU is
        taken as one slot (kernels of different processes time-slice without MPS), unmeasured,
        which is why GPU deployments default to the per-worker gate (cluster()). On a plan's node
        the name starts with the node's, so the devices of two nodes never merge into one."""
        prefix = f"{self.node}/" if self.node else ""
        gpus = self.placement.worker(spec.name).gpus if self.placement is not None else ()
        if spec.cpus is not None:
            return f"{prefix}cpu:{','.join(map(str, spec.cpus))}", len(spec.cpus)
        if gpus:
            # A tensor-parallel worker's GPUs count as one device (a worker sharing only one of
            # them is not seen as its neighbour: rare, since TP workers fill their GPUs).
            return f"{prefix}cuda:{','.join(map(str, gpus))}", 1
        return f"{prefix}cpu", len(os.sched_getaffinity(0))

    def _with_pool(self, m: ModelPlan, role: str, name: str, argv: list[str], env: dict):
        """A placed worker gets its GPU(s) and explicit pool; an unplaced one (on CPU) gets the
        pool its agents need where its own default is smaller and the config sets none."""
        if self.placement is not None:
            flags, gpu_env = placement_flags(self.placement.worker(name))
            return argv + flags, {**env, **gpu_env}
        need = self.pool_needs.get((m.name, role), 0)
        configured = m.spec.server_args.get(self.backend, {}).get("max_total_tokens")
        default = cpu.POOL_TOKENS if self.sglang_cpu else DEFAULT_MAX_TOTAL_TOKENS
        if configured is None and need > default:
            argv = argv + ["--max-total-tokens", str(need)]
        return argv, env

    def _with_running_slots(self, m: ModelPlan, role: str, argv: list[str]) -> list[str]:
        """A decode worker's --max-running-requests where planning.pool_need's rule raises it
        above the engine's default (a config's own value is in argv already)."""
        if role != "decode" or "max_running_requests" in m.spec.server_args.get(self.backend, {}):
            return argv
        need = self.running_needs.get(m.name, 0)
        n = decode_running_requests(m.spec.server_args, self.backend, need)
        if n is not None and n > DEFAULT_MAX_RUNNING_REQUESTS:
            argv = argv + ["--max-running-requests", str(n)]
        return argv

    def worker_turns(self) -> list[list[ProcSpec]]:
        """Workers in start order: those sharing a GPU one turn after another (placement
        turns); without a placement, all at once."""
        specs = self.worker_specs()
        if self.placement is None:
            return [specs] if specs else []
        by_name = {s.name: s for s in specs}
        # A plan's node may hold none of some turn's workers: no empty phase.
        turns = [[by_name[w.name] for w in turn] for turn in self.placement.turns()]
        return [t for t in turns if t]

    def _workers(self, model: str) -> dict:
        """The model's worker endpoints (prefill_urls, bootstrap_ports, decode_urls): those
        started here, or, joining node parts, those of every node."""
        if self.joined is not None:
            j = self.joined[model]
            return {k: j[k] for k in ("prefill_urls", "bootstrap_ports", "decode_urls")}
        m = self.models[model]
        return {
            "prefill_urls": [f"http://{self.host}:{p}" for p in m.prefill_ports],
            "bootstrap_ports": list(m.bootstrap_ports),
            "decode_urls": [f"http://{self.host}:{p}" for p in m.decode_ports],
        }

    def router_specs(self) -> list[ProcSpec]:
        """Each model's native sglang-router, in front of all its replicas (of every node)."""
        specs = []
        for m in self.models.values():
            metrics_port = self.ports[f"{m.name}.router_metrics"]
            ends = self._workers(m.name)
            argv = router_argv(
                list(zip(ends["prefill_urls"], ends["bootstrap_ports"])),
                ends["decode_urls"],
                self.host,
                m.router_port,
                self.host,
                metrics_port,
                ["--health-check-interval-secs", "5", "--log-level", "warn"],
            )
            specs.append(
                ProcSpec(
                    f"{m.name}.router",
                    argv,
                    f"http://{self.host}:{m.router_port}/health",
                    ports=[m.router_port, metrics_port],
                )
            )
        return specs

    def shell_router_spec(self) -> ProcSpec:
        argv = [
            PY,
            "-m",
            "router",
            "--cluster",
            str(self.cluster_path),
            "--host",
            self.host,
            "--port",
            str(self.shell_router_port),
        ]
        for path in self.config_paths:
            argv += ["--config", path]
        if self.api_key:
            argv += ["--api-key-file", str(self.key_path)]
        return ProcSpec(
            "shell_router",
            argv,
            f"http://{self.host}:{self.shell_router_port}/health",
            ports=[self.shell_router_port],
        )

    # --- running ---------------------------------------------------------------------------------
    @property
    def cluster_path(self) -> Path:
        return self.run_dir / "cluster.json"

    @property
    def key_path(self) -> Path:
        return (self.run_dir / KEY_FILE).resolve()

    def cluster(self) -> dict:
        devices = {**self.joined_devices, **dict(self.worker_devices.values())}
        return {
            "backend": self.backend,
            "host": self.host,
            "models": {n: self._model_entry(n) for n in self.models},
            "devices": devices,
            # The device-wide warm-up gate is measured on CPU cores shared by several workers
            # (docs/benchmarks.md); on a GPU whether a warm-up slows a co-located decode is not
            # measured yet, so GPUs keep the per-worker gate (edit cluster.json to try "device").
            "warmup_gate_scope": "worker" if any("cuda:" in d for d in devices) else "device",
            "shell_router_url": f"http://{self.host}:{self.shell_router_port}",
            "warmup_verb": self.warmup_verb,
            "configs": self.config_paths,
            # The questions in flight its KV pools and decode running requests are sized for.
            "concurrency": self.concurrency,
            **({"api_key_file": str(self.key_path)} if self.api_key else {}),
            **(
                {"timeouts": {"health_probe_s": SGLANG_HEALTH_PROBE_S}}
                if self.backend == "sglang"
                else {}
            ),
        }

    def _model_entry(self, name: str) -> dict:
        """cluster.json's entry of one model; with a plan, its request split (router/pd.py)."""
        m = self.models[name]
        entry = {
            **m.cluster_entry(self.host, self.backend),
            **self._workers(name),
            "processes": self._processes(name),
            **self._worker_devices(name),
        }
        if self.joined is not None:
            j = self.joined[name]
            entry["processes"] = {**j["processes"], **entry["processes"]}
            entry.update({k: j[k] for k in ("prefill_devices", "decode_devices") if k in j})
        if self.plan_slice is not None:
            entry["prefill_shares"] = self.plan_slice.shares(name, "prefill")
            entry["decode_shares"] = self.plan_slice.shares(name, "decode")
        return entry

    def part(self) -> dict:
        """This node's part of a plan's deployment (launch/cluster_part.NodePart): its workers
        with their replica numbers, every URL on this node's host."""
        models = {}
        for n, m in self.models.items():
            entry = m.cluster_entry(self.host, self.backend)
            models[n] = {
                **{k: entry[k] for k in ("model_path", "tokenizer_path", "priority_scheduling")},
                **self._workers(n),
                "prefill_replicas": m.replicas("prefill"),
                "decode_replicas": m.replicas("decode"),
                "processes": self._processes(n),
                **self._worker_devices(n),
            }
        return {
            "node": self.node,
            "host": self.host,
            "backend": self.backend,
            "models": models,
            "devices": dict(self.worker_devices.values()),
        }

    def _worker_devices(self, model: str) -> dict[str, list[str]]:
        """{prefill_devices, decode_devices}: each worker's device, in the order of its URLs."""
        m = self.models[model]
        out = {}
        for role, ports in (("prefill", m.prefill_ports), ("decode", m.decode_ports)):
            devices = [
                self.worker_devices.get(f"http://{self.host}:{port}", ("", 0))[0] for port in ports
            ]
            if all(devices):
                out[f"{role}_devices"] = devices
        return out

    def _processes(self, model: str) -> dict[str, dict]:
        """The model's started processes by URL, for the shell router's health watch."""
        return {
            p.spec.health_url.removesuffix("/health"): {
                "name": p.spec.name,
                "pid": p.pid,
                "create_time": create_time(p.pid),
                "log": str(p.log_path.resolve()),
            }
            for p in self.procs
            if p.spec.health_url and p.spec.name.startswith(f"{model}.")
        }

    def up(self, on_ready=None) -> dict:
        """Start everything in dependency order; on any failure stop what started, then raise."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # A live deployment in this folder is refused, a dead one's folder taken over.
        self._claim = claim(self.run_dir)
        try:
            if self.api_key:
                write_key_file(self.key_path, self.api_key)
            self.plan()
            # Built when they start: the routers' command lines name the workers' ports, which
            # _start_phase may have renewed.
            for turn in self.worker_turns():
                self._start_phase(turn, on_ready)
                self._check_pools(self.procs[-len(turn) :])
            if self.node is not None:
                write_json(part_path(self.run_dir, self.node), self.part())
                return self.part()
            self._start_phase(self.router_specs(), on_ready)
            self._wait_routable()
            self._write_cluster()
            self._start_phase([self.shell_router_spec()], on_ready)
        except BaseException:
            self.down()
            raise
        return self.cluster()

    def _check_pools(self, procs: list[Proc]) -> None:
        """A plan's worker must have the pool the plan gave it; others what their agents need."""
        if self.plan_slice is None:
            return check_pools(procs, self.pool_needs, self.concurrency)
        for p in procs:
            need = self.placement.worker(p.spec.name).pool_tokens
            check_pool(p, need, "its plan gives it", "give it more memory in the plan")

    def _start_phase(self, specs: list[ProcSpec], on_ready) -> None:
        """Start specs and wait until each is healthy, with new ports where another process
        took one (launch.ports.start_with_fresh_ports)."""

        def start_all(specs: list[ProcSpec]) -> None:
            started = [start(s, self.run_dir / "logs", self.die_with_parent) for s in specs]
            self.procs += started
            write_pidfile(self.run_dir / "processes.json", self.procs)
            try:
                wait_healthy(started, self.startup_timeout_s, on_ready)
            except LaunchError:
                stop_groups([p.pid for p in started])  # so their ports tell who else holds one
                for p in started:
                    self.procs.remove(p)
                write_pidfile(self.run_dir / "processes.json", self.procs)
                raise

        start_with_fresh_ports(specs, self.host, start_all, self._renew_ports)

    def _renew_ports(self, taken: list[int], names: list[str]) -> list[ProcSpec]:
        """New ports for the taken ones, everywhere they are recorded; the named specs again."""
        self.ports.renew(taken)
        self._assign_ports()
        if self.cluster_path.exists():
            self._write_cluster()
        specs = self.worker_specs()
        if self.node is None:
            specs += [*self.router_specs(), self.shell_router_spec()]
        return [s for n in names for s in specs if s.name == n]

    def _wait_routable(self) -> None:
        """A native sglang-router answers /health before it has registered its workers (its
        first /generate then gets 503 "No prefill workers available"): wait until each routes."""
        for m in self.models.values():
            router = next(p for p in self.procs if p.spec.name == f"{m.name}.router")
            wait_routable(f"http://{self.host}:{m.router_port}", self.startup_timeout_s, router)

    def _write_cluster(self) -> None:
        tmp = self.cluster_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.cluster(), indent=2))
        tmp.replace(self.cluster_path)

    def down(self) -> None:
        stop_groups([p.pid for p in reversed(self.procs)])
        self.procs.clear()
        if self._claim is not None:  # never touch a folder another deployment owns
            mark_stopped(self.run_dir)
            self._claim.close()
            self._claim = None

    def __enter__(self) -> Self:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()
