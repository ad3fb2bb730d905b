"""Engine: owns the model, the KV buffer and the scheduler, and runs the step loop in one thread.

The HTTP server (asyncio) calls `submit`, `abort` and `call` from any thread; they only enqueue
commands. Everything that mutates scheduler state runs in the engine thread, so no locks are
needed there. A step: poll PD queues → prefill batch → one batched decode step for all running.
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

from sglang_ext import protocol as P
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
        self.sched = Scheduler(cfg, decode_text)
        self.kv_manager = kv_manager
        self.pd = None
        if cfg.mode != "null":
            from sglang_ext.engine.pd_queues import PDQueues

            self.pd = PDQueues(self.sched, kv_manager, kv_buffer)
        self.reqs: dict[str, Req] = {}  # live requests, engine thread only
        self.counters = {
            "requests": 0,
            "finished": 0,
            "aborted": 0,
            "failed": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "generated_tokens": 0,
            "forward_steps": 0,
        }
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)

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
        self._inbox.put(lambda: self._add(req))

    def abort(
        self, rid: str, message: str = "Aborted by /abort_request"
    ) -> concurrent.futures.Future:
        """Future of True when the rid was live (and is now aborted), False when unknown."""
        return self.call(lambda: rid in self.reqs and self._abort(self.reqs[rid], message))

    def abort_all(self, message: str = "Aborted by /abort_request") -> int:
        """Engine thread (through `call`): abort every live request; returns how many."""
        return sum(self._abort(req, message) for req in list(self.reqs.values()))

    def abort_req(self, req: Req, message: str) -> concurrent.futures.Future:
        """Abort this very request (not another live one that reuses its rid)."""
        return self.call(lambda: self.reqs.get(req.rid) is req and self._abort(req, message))

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
    def _pending(self) -> bool:
        """Something may move without a new command: queued, running or transferring requests,
        or decode pages in quarantine."""
        s, pd = self.sched, self.pd
        return bool(
            s.waiting
            or s.prefilling
            or s.running
            or (pd is not None and (len(pd) or pd.quarantine))
        )

    def _loop(self) -> None:
        worked = False
        while not self._stop.is_set():
            # After a forward, go straight on; when the last step ran nothing but something is
            # pending (transfers, requests waiting for pages), poll every 2 ms rather than spin;
            # when idle, block until a command comes.
            self._drain(0 if worked else (0.002 if self._pending() else None))
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
                        self._abort(req, "internal engine error (see the worker log)", status=500)
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
        """Poll PD, run a prefill batch and a decode batch; True when a forward ran."""
        if self.pd is not None:
            self.pd.poll()
        ran = False
        for batch in (self.sched.schedule_prefill(), self.sched.schedule_decode()):
            if batch is None:
                continue
            started = time.perf_counter()
            logits = self.model.forward(batch.forward, self.kv_buffer)
            if batch.is_prefill:  # SGLang's prefill_run_batch_{start,end}_time: last batch wins
                ended = time.perf_counter()
                for req in batch.reqs:
                    req.time_stats.prefill_run_batch_start_time = started
                    req.time_stats.prefill_run_batch_end_time = ended
            self.counters["forward_steps"] += 1
            self.sched.process(batch, logits)
            ran = True
        self._reap()
        return ran

    def _reap(self) -> None:
        # A finished prefill request stays live while its KV is being sent (it holds pages and
        # a KVSender): abort, flush and integrity checks must still see it.
        for rid, req in list(self.reqs.items()):
            if req.finished and not req.holds_resources:
                del self.reqs[rid]
                c = self.counters
                c["finished"] += 1
                c["generated_tokens"] += len(req.output_ids)
                c["cached_tokens"] += req.cached_tokens
                if req.finish_reason.get("type") == P.FINISH_ABORT:
                    c["aborted" if req.status == 200 else "failed"] += 1

    def _reject(self, req: Req, status: int, message: str) -> None:
        req.fail(message, status)
        req.emit()

    def _add(self, req: Req) -> None:
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += req.prompt_len
        if req.rid in self.reqs:
            return self._reject(req, 400, f"rid '{req.rid}' is already in use by a live request")
        need = self.sched.pool.pages_for(self.sched.kv_tokens_needed(req))
        if need > self.cfg.num_pages:
            return self._reject(
                req,
                503,
                (
                    f"the request needs {need} KV pages (prompt + max_new_tokens) but the pool has "
                    f"{self.cfg.num_pages}: lower max_new_tokens or raise --max-total-tokens"
                ),
            )
        queued = len(self.sched.waiting) + (len(self.pd) if self.pd else 0)
        if queued >= self.cfg.max_queued_requests:
            return self._reject(
                req,
                503,
                (f"{queued} requests are already queued (--max-queued-requests); retry later"),
            )
        if not self.sched.set_or_validate_priority(req):
            return self._reject(req, 503, P.PRIORITY_DISABLED_MESSAGE)
        self.reqs[req.rid] = req
        if self.pd is None:
            self.sched.enqueue(req)
            return
        try:
            self.pd.add(req)
        except Exception as e:  # noqa: BLE001 - e.g. a bootstrap host that does not resolve
            del self.reqs[req.rid]
            logger.warning("rid=%s: PD setup failed: %s", req.rid, e)
            from sglang_ext.disagg import RoomInUseError

            status = 409 if isinstance(e, RoomInUseError) else 502
            self._reject(
                req, status, f"PD setup failed for bootstrap_room {req.bootstrap_room}: {e}"
            )

    def _abort(self, req: Req, message: str, status: int = 200) -> bool:
        del self.reqs[req.rid]
        if self.pd is not None:
            self.pd.abort(req)  # whichever queue holds it; aborts its KV transfer too
        else:
            self.sched.drop(req)
        req.fail(message, status)
        req.emit()
        self.counters["finished"] += 1
        self.counters["aborted" if status == 200 else "failed"] += 1
        return True

    # --- snapshots (run through `call`) ----------------------------------------------------------
    def stats(self) -> dict:
        out = self.sched.page_stats()
        if self.pd is not None:
            out.update({f"pd_{k}": v for k, v in self.pd.counts().items()})
        out["num_live_reqs"] = len(self.reqs)
        out.update(self.counters)
        return out

    def check_integrity(self) -> None:
        quarantined = self.pd.quarantined_pages() if self.pd is not None else 0
        self.sched.check_integrity(list(self.reqs.values()), quarantined)

    def flush_cache(self) -> bool:
        """Drop the radix cache; refused (False) while anything is live or queued (a request's
        pages may be locked in the tree or still being sent), as SGLang does. A worker without
        one (decode) has nothing to flush and succeeds when idle, as SGLang's does."""
        if self.reqs or self._pending():
            return False
        if self.sched.cache is not None:
            self.sched.cache.reset()
        return True


def build_engine(args, tokenizer=None) -> Engine:
    """Load the model named by ServerArgs, size the KV pool, start PD transport when asked."""
    from sglang_ext.engine.model import CausalLM, make_kv_buffer
    from sglang_ext.engine.model_store import resolve_model_path

    dtype = DTYPES[args.dtype]
    model = CausalLM.from_pretrained(resolve_model_path(args.model_path), dtype=dtype)
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
