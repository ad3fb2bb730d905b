"""SGLang's wire contract: every request/response field name and constant, typed once.

Stdlib only. The reference engine, the patch applied to real SGLang and the shell router all
import these names, so "bootstrap_room" and friends are spelled in exactly one place.
"""

from __future__ import annotations

import json
import random

# --- /generate request (GenerateReqInput) -------------------------------------------------------
TEXT = "text"
INPUT_IDS = "input_ids"
SAMPLING_PARAMS = "sampling_params"
STREAM = "stream"
RETURN_LOGPROB = "return_logprob"
TOP_LOGPROBS_NUM = "top_logprobs_num"
LOGPROB_START_LEN = "logprob_start_len"
RID = "rid"
BOOTSTRAP_HOST = "bootstrap_host"
BOOTSTRAP_PORT = "bootstrap_port"
BOOTSTRAP_ROOM = "bootstrap_room"
# 0.5.23 name for pinning a data-parallel rank; 0.5.3 used "data_parallel_rank".
ROUTED_DP_RANK = "routed_dp_rank"

# --- sampling_params keys (SGLang 0.5.23 rejects unknown ones: never add private keys) ----------
MAX_NEW_TOKENS = "max_new_tokens"
TEMPERATURE = "temperature"
TOP_P = "top_p"
TOP_K = "top_k"
MIN_P = "min_p"
STOP = "stop"
STOP_TOKEN_IDS = "stop_token_ids"
IGNORE_EOS = "ignore_eos"
SAMPLING_SEED = "sampling_seed"
SKIP_SPECIAL_TOKENS = "skip_special_tokens"
DEFAULT_MAX_NEW_TOKENS = 128

# --- response ------------------------------------------------------------------------------------
OUTPUT_IDS = "output_ids"
META_INFO = "meta_info"
META_ID = "id"
FINISH_REASON = "finish_reason"
PROMPT_TOKENS = "prompt_tokens"
COMPLETION_TOKENS = "completion_tokens"
CACHED_TOKENS = "cached_tokens"
E2E_LATENCY = "e2e_latency"
OUTPUT_TOKEN_LOGPROBS = "output_token_logprobs"  # [[logprob, token_id, text|None], ...]
OUTPUT_TOP_LOGPROBS = "output_top_logprobs"
INPUT_TOKEN_LOGPROBS = "input_token_logprobs"

# finish_reason shapes: {"type": "length", "length": N} | {"type": "stop", "matched": x}
#                       | {"type": "abort", "message": str}
FINISH_LENGTH = "length"
FINISH_STOP = "stop"
FINISH_ABORT = "abort"

# --- PD disaggregation ---------------------------------------------------------------------------
# A prefill request whose bootstrap_host is this address has no decode peer: SGLang prefills it
# with a FakeKVSender and transfers nothing. We use it for prefill-only warm-ups.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
DISAGG_MODES = ("null", "prefill", "decode")
DEFAULT_BOOTSTRAP_PORT = 8998
MAX_BOOTSTRAP_ROOM = 2**63 - 1
# rid prefix of our warm-ups; the real-SGLang patch keys radix insertion on it (0.5.11+).
WARMUP_RID_PREFIX = "moa-warm-"
# Top-level request field of SGLang's priority scheduling (`--enable-priority-scheduling`; larger
# values first unless `--schedule-low-priority-values-first`). The router sends these values.
PRIORITY = "priority"
PRIORITY_CRITICAL = 1
PRIORITY_WARMUP = 0
# SGLang fills in a request without `priority` with --default-priority-value, else the lowest
# possible value; with --abort-on-priority-when-disabled a server without priority scheduling
# refuses a request that carries one (503, this message).
PRIORITY_DISABLED_MESSAGE = (
    "Using priority is disabled for this server. Please send a new request without a priority."
)

# --- meta_info timing keys (SGLang with --enable-metrics; without it meta_info has none) --------
# Every chunk (the scheduler's SchedulerReqTimeStats, 0.5.17 and 0.5.23): points in time as Unix
# seconds, spans in seconds. In PD mode, on prefill: the waiting queue is entered once bootstrap
# is done; on decode: once the KV arrived, and the "forward" is the prebuilt batch that emits the
# token prefill sampled (decode reports no prefill_finished_time).
FORWARD_ENTRY_TIME = "forward_entry_time"  # the request's first forward began
PREFILL_FINISHED_TIME = "prefill_finished_time"  # the forward that finished its prompt ended
QUEUE_TIME = "queue_time"  # forward_entry_time - entering the waiting queue (after bootstrap)
# In some earlier releases' meta_info, not in 0.5.17's or 0.5.23's.
PREFILL_WAITING_LATENCY = "prefill_waiting_latency"
PREFILL_LAUNCH_LATENCY = "prefill_launch_latency"
# The last chunk (the API server's APIServerReqTimeStats). On a PD prefill worker the reply, and
# so request_finished_ts, comes only once the KV reached decode.
REQUEST_RECEIVED_TS = "request_received_ts"
API_SERVER_DISPATCH_FINISH_TS = "api_server_dispatch_finish_ts"
REQUEST_FINISHED_TS = "request_finished_ts"
FIRST_TOKEN_LATENCY = "first_token_latency"  # 0.5.23: first token - received, seconds
# When the API server sent its first response chunk (a stream's first token; a whole reply):
# that chunk has it and, with --enable-metrics, the last chunk too (0.5.17 and 0.5.23).
RESPONSE_SENT_TO_CLIENT_TS = "response_sent_to_client_ts"
INFERENCE_TIME = "inference_time"  # request_finished - forward_entry (not in 0.5.17/0.5.23)
DECODE_THROUGHPUT = "decode_throughput"  # (completion tokens - 1) / (finished - first token)
# meta_info keys with a request's worker-side timings, copied into the agent trace.
WORKER_TIMING_KEYS: tuple[str, ...] = (
    REQUEST_RECEIVED_TS,
    QUEUE_TIME,
    FORWARD_ENTRY_TIME,
    PREFILL_FINISHED_TIME,
    REQUEST_FINISHED_TS,
    RESPONSE_SENT_TO_CLIENT_TS,
    FIRST_TOKEN_LATENCY,
    INFERENCE_TIME,
)

# Our one added verb, served by both backends: a prefill-only warm-up with a JSON reply.
PREFILL_ONLY_PATH = "/prefill_only"

# --- SSE framing ---------------------------------------------------------------------------------
SSE_DATA_PREFIX = "data: "
SSE_DONE = "[DONE]"
SSE_CONTENT_TYPE = "text/event-stream"


def sse_event(payload: dict) -> bytes:
    """One server-sent event in SGLang's framing."""
    return f"{SSE_DATA_PREFIX}{json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def sse_done() -> bytes:
    return f"{SSE_DATA_PREFIX}{SSE_DONE}\n\n".encode()


def sse_error(message: str, status: int) -> bytes:
    """The event a stream sends when it fails after its headers went out (only `[DONE]` may
    follow): `{"error": {"message", "code"}}`, as SGLang and OpenAI send it. Every HTTP surface
    (the workers' /generate and OpenAI routes, the shell router's chat and agent streams)
    writes its stream errors with this one function."""
    return sse_event({"error": error_body(message, status)["error"]})


def parse_sse_line(line: str) -> dict | None:
    """Parse one `data: ...` line; None for blank lines, comments and the [DONE] marker."""
    line = line.strip()
    if not line.startswith(SSE_DATA_PREFIX.strip()):
        return None
    body = line[len(SSE_DATA_PREFIX.strip()) :].strip()
    if body == SSE_DONE or not body:
        return None
    return json.loads(body)


def new_bootstrap_room(dp_rank: int = 0, dp_size: int = 1, rng: random.Random | None = None) -> int:
    """A random 63-bit room that lands on `dp_rank` (SGLang picks the rank as room % dp_size)."""
    r = (rng or random).randrange(0, MAX_BOOTSTRAP_ROOM // max(dp_size, 1))
    return r * max(dp_size, 1) + dp_rank


def error_body(message: str, status: int) -> dict:
    """The JSON error body SGLang returns (OpenAI style)."""
    return {"error": {"message": message, "code": status}, "object": "error", "message": message}


# --- /prefill_only reply (our verb; both backends) -----------------------------------------------
# {rid, prompt_tokens, cached_tokens, e2e_latency, elapsed_s}: e2e_latency is the server's own
# figure when it reports one, elapsed_s the wall time the route measured around the generate call.
ELAPSED_S = "elapsed_s"

# --- more request / meta_info names SGLang uses ------------------------------------------------
RETURN_TEXT_IN_LOGPROBS = "return_text_in_logprobs"
INPUT_TOP_LOGPROBS = "input_top_logprobs"
WEIGHT_VERSION = "weight_version"

# --- aux data that travels with a request's KV from prefill to decode (torch backend) ----------
# Together with CACHED_TOKENS and PROMPT_TOKENS: the first token prefill sampled and its logprobs.
AUX_FIRST_TOKEN = "first_token"
AUX_LOGPROB = "logprob"
AUX_TOP_LOGPROBS = "top_logprobs"

# --- weight-free models (the config, the launcher and the model store read these) --------------
# SGLang's --load-format value for random weights of the model's real shape.
LOAD_FORMAT_DUMMY = "dummy"
# A model_path "dummy:SHAPE" (e.g. "dummy:qwen3-8b") names a shape-only directory the model store
# writes (sglang_ext/engine/dummy_model.py); it is always served with LOAD_FORMAT_DUMMY.
DUMMY_MODEL_PREFIX = "dummy:"


def dummy_shape(model_path: str) -> str | None:
    """The shape a 'dummy:SHAPE' model path names ("dummy:Qwen3-8B" -> "qwen3-8b", "" for a bare
    'dummy:'), else None. The one test of a weight-free model: config, launcher and store use it."""
    path = model_path.strip()
    if not path.lower().startswith(DUMMY_MODEL_PREFIX):
        return None
    return path[len(DUMMY_MODEL_PREFIX) :].strip().lower()
