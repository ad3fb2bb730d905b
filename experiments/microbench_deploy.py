"""The CPU deployments the benchmarks bring up themselves: worker specs, and `Deployment` (a PD pair
behind the native sglang-router, two null-mode replicas, two more with chunked prefill). Used by
experiments/microbench.py and experiments/bench_engine.py; everything goes through launch.procs."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from launch.procs import LaunchError, Proc, ProcSpec, free_port, start, stop_group, wait_healthy
from launch.worker_cmd import router_argv, worker_argv
from router.config import ModelSpec

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


def worker_spec(name: str, model_dir: str, role: str, host: str,
                server_args: dict[str, int | str]) -> ProcSpec:
    port = free_port(host)
    bport = free_port(host) if role == "prefill" else None
    spec = ModelSpec(model_path=model_dir, server_args={"torch": server_args})
    argv = worker_argv("torch", model_dir, spec, role, host, port, bport)
    return ProcSpec(name, argv, f"http://{host}:{port}/health",
                    env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
                    ports=[port] + ([bport] if bport else []))


def base_url(spec: ProcSpec) -> str:
    return spec.health_url.removesuffix("/health")


def router_spec(prefill: ProcSpec, decode: ProcSpec, host: str) -> ProcSpec:
    port = free_port(host)
    argv = router_argv([(base_url(prefill), prefill.ports[1])], [base_url(decode)], host, port,
                       host, free_port(host),
                       ["--health-check-interval-secs", "5", "--log-level", "warn"])
    return ProcSpec("router", argv, f"http://{host}:{port}/health", ports=[port])


def wait_generate(url: str, timeout_s: float) -> None:
    """The native router registers its workers in the background: wait for one generate."""
    body = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}).encode()
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        req = urllib.request.Request(f"{url}/generate", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.5)
    raise LaunchError(f"{url}/generate not answering after {timeout_s:.0f} s: {last}")


class Deployment:
    """Everything the microbench compares, on one host; `with Deployment(...) as dep:`."""

    def __init__(self, model_path: str, host: str, max_seq_len: int, log_dir: Path,
                 startup_timeout_s: float = 900.0):
        self.model_dir = resolve(model_path)
        self.host, self.log_dir, self.timeout = host, Path(log_dir), startup_timeout_s
        self.args = {"max_total_tokens": kv_tokens(max_seq_len),
                     "context_length": max(2048, max_seq_len + 64)}
        self.procs: list[Proc] = []
        self.prefill_url = self.router_url = ""
        self.dp_urls: list[str] = []
        self.dp_chunked_urls: list[str] = []
        self.skipped: dict[str, str] = {}  # variant -> why it was not run

    @property
    def cache_urls(self) -> list[str]:
        """Workers with a radix cache (a PD decode worker keeps none, as in SGLang)."""
        return [self.prefill_url, *self.dp_urls, *self.dp_chunked_urls]

    def up(self) -> None:
        h, a = self.host, self.args
        prefill = worker_spec("pd.prefill", self.model_dir, "prefill", h, a)
        decode = worker_spec("pd.decode", self.model_dir, "decode", h, a)
        dp = [worker_spec(f"dp{i}", self.model_dir, "null", h, a) for i in range(2)]
        chunked_args = {**a, "chunked_prefill_size": DP_CHUNK_TOKENS}
        dpc = [worker_spec(f"dp_chunked{i}", self.model_dir, "null", h, chunked_args)
               for i in range(2)]
        # All six load their weights at once; the chunked pair is waited for on its own, so an
        # engine without chunked prefill skips that variant instead of failing the run.
        core = [start(s, self.log_dir) for s in (prefill, decode, *dp)]
        chunked = [start(s, self.log_dir) for s in dpc]
        self.procs += core + chunked
        wait_healthy(core, self.timeout)
        try:
            wait_healthy(chunked, self.timeout)
            self.dp_chunked_urls = [base_url(s) for s in dpc]
        except LaunchError as e:
            self.skipped["dp2_chunked"] = (f"--chunked-prefill-size {DP_CHUNK_TOKENS} replicas "
                                           f"did not start: {e}")
            print(f"dp2_chunked skipped: {self.skipped['dp2_chunked']}", file=sys.stderr)
        router = start(router_spec(prefill, decode, h), self.log_dir)
        self.procs.append(router)
        wait_healthy([router], self.timeout)
        self.prefill_url, self.router_url = base_url(prefill), base_url(router.spec)
        self.dp_urls = [base_url(s) for s in dp]
        wait_generate(self.router_url, self.timeout)

    def down(self) -> None:
        for p in reversed(self.procs):
            stop_group(p.pid)
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
