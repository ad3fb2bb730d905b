"""`ReqTimeStats`: one request's timestamps on this worker, under SGLang's names, and the timing
keys of SGLang's `meta_info` they become.

The engine thread sets the scheduler's stamps (queues, forward); the HTTP layer sets the ones
SGLang's API server owns (received, dispatched, first token, first chunk sent, finished).
Stamps are `time.perf_counter()` readings (0.0 = not reached); `meta_info` turns the points in
time into Unix seconds and the spans into seconds, as SGLang 0.5.23 does with `--enable-metrics`
(`SchedulerReqTimeStats` / `APIServerReqTimeStats.convert_to_output_meta_info`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sglang_ext import protocol as P

# perf_counter -> Unix time; fixed per process (a request lives far shorter than NTP drifts).
_REALTIME_OFFSET = time.time() - time.perf_counter()


def _unix(t: float) -> float:
    return t + _REALTIME_OFFSET


@dataclass(slots=True)
class ReqTimeStats:
    # API server side (HTTP layer)
    created_time: float = 0.0
    api_server_dispatch_finish_time: float = 0.0
    first_token_time: float = 0.0
    finished_time: float = 0.0
    response_sent_to_client_time: float = 0.0  # the first response chunk went out
    # scheduler, every mode
    wait_queue_entry_time: float = 0.0
    forward_entry_time: float = 0.0
    prefill_run_batch_start_time: float = 0.0  # the forward that finished the prompt
    prefill_run_batch_end_time: float = 0.0
    prefill_finished_time: float = 0.0
    completion_time: float = 0.0
    # PD prefill
    prefill_bootstrap_queue_entry_time: float = 0.0
    prefill_transfer_queue_entry_time: float = 0.0
    prefill_kv_transfer_finish_time: float = 0.0
    # PD decode
    decode_prealloc_queue_entry_time: float = 0.0
    decode_transfer_queue_entry_time: float = 0.0

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def scheduler_meta(self) -> dict:
        """What SGLang's scheduler adds to every chunk's meta_info."""
        m: dict = {}
        if self.forward_entry_time > 0:
            m[P.FORWARD_ENTRY_TIME] = _unix(self.forward_entry_time)
            if self.wait_queue_entry_time > 0:
                m[P.QUEUE_TIME] = self.forward_entry_time - self.wait_queue_entry_time
        if self.prefill_finished_time > 0:
            m[P.PREFILL_FINISHED_TIME] = _unix(self.prefill_finished_time)
        start, end = self.prefill_run_batch_start_time, self.prefill_run_batch_end_time
        m[P.PREFILL_WAITING_LATENCY] = start - self.forward_entry_time if start > 0 else None
        m[P.PREFILL_LAUNCH_LATENCY] = end - start if start > 0 and end > 0 else None
        return m

    def response_sent_meta(self) -> dict:
        """Stamp the first response chunk going out (once) and return its meta_info entry:
        SGLang adds it to that chunk, and to the last one with the rest of finished_meta."""
        if self.response_sent_to_client_time == 0:
            self.response_sent_to_client_time = self.now()
        return {P.RESPONSE_SENT_TO_CLIENT_TS: _unix(self.response_sent_to_client_time)}

    def finished_meta(self, completion_tokens: int) -> dict:
        """What SGLang's API server adds to the last chunk's meta_info."""
        m: dict = {}
        if self.created_time > 0:
            m[P.REQUEST_RECEIVED_TS] = _unix(self.created_time)
        if self.api_server_dispatch_finish_time > 0:
            m[P.API_SERVER_DISPATCH_FINISH_TS] = _unix(self.api_server_dispatch_finish_time)
        if self.response_sent_to_client_time > 0:
            m.update(self.response_sent_meta())
        if self.created_time > 0 and self.first_token_time > self.created_time:
            m[P.FIRST_TOKEN_LATENCY] = self.first_token_time - self.created_time
        if self.finished_time > 0:
            m[P.REQUEST_FINISHED_TS] = _unix(self.finished_time)
            if self.forward_entry_time > 0:
                m[P.INFERENCE_TIME] = self.finished_time - self.forward_entry_time
            decode = self.finished_time - self.first_token_time
            if self.first_token_time > 0 and decode > 0 and completion_tokens > 1:
                # SGLang's: one over the time per output token after the first.
                m[P.DECODE_THROUGHPUT] = (completion_tokens - 1) / decode
        return m
