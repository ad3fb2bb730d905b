"""`python -m sglang_ext.sglang_backend`: start one PD pair on real SGLang (or print it).

`--dry-run` prints the three exact command lines; otherwise they run until Ctrl-C or one exits.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import time
from pathlib import Path

from launch.procs import LaunchError, Proc, ProcSpec, start, stop_group, wait_healthy
from sglang_ext import protocol as P
from sglang_ext.sglang_backend.pair import PDPairSpec, pd_pair_commands


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sglang_ext.sglang_backend",
        description="One SGLang PD pair (prefill + decode over NIXL) behind an sglang-router.",
    )
    p.add_argument(
        "--model-path",
        required=True,
        help="HF id, a directory with config.json, or dummy:SHAPE (random weights, e.g. "
        "dummy:qwen3-8b)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--prefill-port", type=int, default=30000)
    p.add_argument("--decode-port", type=int, default=30001)
    p.add_argument("--router-port", type=int, default=8000)
    p.add_argument("--router-metrics-port", type=int, default=29000)
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=P.DEFAULT_BOOTSTRAP_PORT)
    p.add_argument("--disaggregation-transfer-backend", default="nixl")
    p.add_argument("--disaggregation-ib-device", default=None)
    p.add_argument("--prefill-gpu", type=int, default=0, help="--base-gpu-id of the prefill")
    p.add_argument("--decode-gpu", type=int, default=1, help="--base-gpu-id of the decode")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--schedule-conservativeness", type=float, default=None)
    p.add_argument("--load-format", default=None, help="'dummy' for random weights")
    p.add_argument("--skip-tokenizer-init", action="store_true")
    for role in ("prefill", "decode", "router"):
        p.add_argument(
            f"--{role}-extra",
            default="",
            help=f"more flags for the {role}, one shell-quoted string",
        )
    p.add_argument("--log-dir", type=Path, default=Path("logs/sglang_pd"))
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--dry-run", action="store_true", help="print the command lines, run nothing")
    return p


def spec_from_args(a: argparse.Namespace) -> PDPairSpec:
    model_path, load_format = a.model_path, a.load_format
    if P.dummy_shape(model_path) is not None:
        # A shape-only model (e.g. dummy:qwen3-8b): SGLang gets the directory the model store
        # writes, always with random weights.
        from sglang_ext.engine.model_store import resolve_model_path

        model_path, load_format = resolve_model_path(model_path), P.LOAD_FORMAT_DUMMY
    return PDPairSpec(
        model_path=model_path,
        host=a.host,
        prefill_port=a.prefill_port,
        decode_port=a.decode_port,
        router_port=a.router_port,
        router_metrics_port=a.router_metrics_port,
        bootstrap_port=a.disaggregation_bootstrap_port,
        transfer_backend=a.disaggregation_transfer_backend,
        ib_device=a.disaggregation_ib_device,
        prefill_gpu=a.prefill_gpu,
        decode_gpu=a.decode_gpu,
        tp_size=a.tp_size,
        mem_fraction_static=a.mem_fraction_static,
        schedule_conservativeness=a.schedule_conservativeness,
        load_format=load_format,
        skip_tokenizer_init=a.skip_tokenizer_init,
        prefill_args=tuple(shlex.split(a.prefill_extra)),
        decode_args=tuple(shlex.split(a.decode_extra)),
        router_args=tuple(shlex.split(a.router_extra)),
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec = spec_from_args(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    commands = pd_pair_commands(spec)
    if args.dry_run:
        for role, cmd in commands.items():
            print(f"# {role}\n{shlex.join(cmd)}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # SIGTERM stops the pair exactly as Ctrl-C does (a shell that backgrounds us ignores SIGINT).
    signal.signal(signal.SIGTERM, _interrupt)
    procs: list[Proc] = []
    try:
        # Workers first (in parallel: each loads its model), the router once both answer.
        workers = [
            start(ProcSpec(role, commands[role], spec.url(role) + "/health"), args.log_dir)
            for role in ("prefill", "decode")
        ]
        procs += workers
        wait_healthy(workers, args.startup_timeout)
        router = start(
            ProcSpec("router", commands["router"], spec.url("router") + "/health"), args.log_dir
        )
        procs.append(router)
        wait_healthy([router], args.startup_timeout)
        print(
            f"ready: router {spec.url('router')} prefill {spec.url('prefill')} "
            f"decode {spec.url('decode')}",
            flush=True,
        )
        while all(p.popen.poll() is None for p in procs):
            time.sleep(1.0)
        dead = next(p for p in procs if p.popen.poll() is not None)
        print(
            f"error: {dead.spec.name} exited ({dead.popen.returncode}); log {dead.log_path}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 0
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        for proc in reversed(procs):
            stop_group(proc.pid)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
