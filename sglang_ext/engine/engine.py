"""Engine: owns the model, the KV buffer and the scheduler, and runs the step loop in one thread.

The HTTP server (asyncio) calls `submit`, `abort` and `call` from any thread; they only enqueue
commands. Everything that mutates request state runs in the engine thread, in the scheduler (its
one owner), so no locks are needed. A step: poll transfers → prefill batch → one batched decode
step for all running → reap.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from sglang_ext.engine.config import EngineConfig
from sglang_ext.engine.request import Req
from sglang_ext.engine.scheduler import Scheduler

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Engine:
    def __init__(
        self,
        cfg: EngineConfig,
        model,
        kv_buffer: torch.Tensor,
        decode_text: Callable[[list[int]], str] | None = None,
        kv_manager=None,
    ):
        self.cfg, self.model, self.kv_buffer = cfg, model, kv_buffer
        self.sched = Scheduler(cfg, decode_text, kv_manager, kv_buffer)
        self.kv_manager = kv_manager
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)

    @property
    def reqs(self) -> dict[str, Req]:
        """Live requests by rid (engine thread; others read it through `call`)."""
        return self.sched.reqs

    @property
    def counters(self) -> dict[str, int]:
        return self.sched.counters

    # --- any thread ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.kv_manager is not None and hasattr(self.kv_manager, "close"):
            self.kv_manager.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, req: Req) -> None:
        req.time_stats.api_server_dispatch_finish_time = req.time_stats.now()
        self._inbox.put(lambda: self.sched.add(req))

    def abort(
        self, rid: str, message: str = "Aborted by /abort_request"
    ) -> concurrent.futures.Future:
        """Future of True when the rid was live (and is now aborted), False when unknown."""
        return self.call(lambda: rid in self.reqs and self.sched.abort(self.reqs[rid], message))

    def abort_all(self, message: str = "Aborted by /abort_request") -> int:
        """Engine thread (through `call`): abort every live request; returns how many."""
        return sum(self.sched.abort(req, message) for req in list(self.reqs.values()))

    def abort_req(self, req: Req, message: str) -> concurrent.futures.Future:
        """Abort this very request (not another live one that reuses its rid)."""
        return self.call(lambda: self.reqs.get(req.rid) is req and self.sched.abort(req, message))

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` in the engine thread between steps (consistent snapshots, flush, ...)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except Exception as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

        self._inbox.put(run)
        return fut

    # --- engine thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        worked = False
        while not self._stop.is_set():
            # After a forward, go straight on; when the last step ran nothing but something is
            # pending (transfers, requests waiting for pages), poll every 2 ms rather than spin;
            # when idle, block until a command comes.
            self._drain(0 if worked else (0.002 if self.sched.pending() else None))
            if self._stop.is_set():
                break
            try:
                with torch.inference_mode():
                    worked = self.step()
            except Exception:
                worked = False
                logger.exception("engine step failed; failing the %d live requests", len(self.reqs))
                for req in list(self.reqs.values()):
                    try:
                        self.sched.abort(req, "internal engine error (see the worker log)", 500)
                    except Exception:  # keep failing the others
                        logger.exception("rid=%s: abort after the failed step failed", req.rid)
                        self.reqs.pop(req.rid, None)

    def _drain(self, timeout: float | None) -> None:
        try:
            cmd = self._inbox.get(timeout=timeout) if timeout != 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while cmd is not None:
            cmd()
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return

    def step(self) -> bool:
        """Poll transfers, run a prefill batch and a decode batch; True when a forward ran."""
        s = self.sched
        s.poll()
        ran = False
        for batch in (s.schedule_prefill(), s.schedule_decode()):
            if batch is None:
                continue
            started = time.perf_counter()
            logits = self.model.forward(batch.forward, self.kv_buffer)
            s.counters["forward_steps"] += 1
            s.process(batch, logits, started, time.perf_counter())
            ran = True
        s.reap()
        return ran

    # --- snapshots (run through `call`) ----------------------------------------------------------
    def stats(self) -> dict:
        return self.sched.stats()

    def check_integrity(self) -> None:
        self.sched.check_integrity()

    def flush_cache(self) -> bool:
        return self.sched.flush_cache()


def build_engine(args, tokenizer=None) -> Engine:
    """Load the model named by ServerArgs, size the KV pool, start PD transport when asked."""
    from sglang_ext.engine.model import CausalLM, make_kv_buffer
    from sglang_ext.engine.model_store import resolve_model_path

    dtype = DTYPES[args.dtype]
    model = CausalLM.from_pretrained(
        resolve_model_path(args.model_path), dtype=dtype, load_format=args.load_format
    )
    extra_eos = (
        (tokenizer.eos_token_id,)
        if tokenizer is not None and tokenizer.eos_token_id is not None
        else ()
    )
    cfg = EngineConfig.from_args(args, model.config, extra_eos)
    kv_buffer = make_kv_buffer(model.config, cfg.num_pages * cfg.page_size, dtype)
    manager = None
    if cfg.mode != "null":
        from sglang_ext.disagg import KVManager

        manager = KVManager(
            cfg.mode,
            kv_buffer,
            host=args.host,
            bootstrap_port=args.disaggregation_bootstrap_port,
            page_size=cfg.page_size,
            backend=args.disaggregation_transfer_backend,
            bootstrap_timeout=cfg.bootstrap_timeout_s,
            waiting_timeout=cfg.waiting_timeout_s,
        )
    decode_text = None
    if tokenizer is not None:

        def decode_text(ids: list[int]) -> str:
            return tokenizer.decode(ids, skip_special_tokens=True)

    logger.info(
        "engine: mode=%s pages=%d x %d tokens, context %d, max running %d",
        cfg.mode,
        cfg.num_pages,
        cfg.page_size,
        cfg.context_length,
        cfg.max_running_requests,
    )
    return Engine(cfg, model, kv_buffer, decode_text, manager)
