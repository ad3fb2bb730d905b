"""The results row schema and `results.jsonl` I/O: an append-and-fsync writer the runner calls per
finished (sample, setting), a reader for summaries and figures, and `completed_keys` for --resume.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from experiments.router_load import RouterWindow
from experiments.settings import SETTINGS

log = logging.getLogger(__name__)


class ResultsError(ValueError):
    """A results file that cannot be read or a row that does not fit the schema."""


class AgentTrace(BaseModel):
    """One agent's entry in a row's `agents` trace (the shell router's per-agent record)."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    model: str
    layer: int | None = None
    output_ids: list[int] = []
    text: str = ""
    # Seconds since the question started (the shell router's session clock).
    start_s: float | None = None
    final_request_s: float | None = None  # the agent's (final) request went out
    prefill_reply_s: float | None = None  # its prefill worker replied (successors)
    first_token_s: float | None = None
    end_s: float | None = None
    warmups: int = 0
    skipped: bool = False  # never ran: a bypassed successor, a candidate routing left out
    warmup_spans: list[list[float]] = []  # [sent_s, replied_s, tokens, cached_tokens]
    worker_timing: dict[str, float] = {}
    # None where the workers' numbers are not known: an agent killed before its final request.
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    slot_order: list[str] = []  # precursor ids in the order spliced; empty for a first-layer agent
    # Its place in the order the question's agents started (None: a run before it was recorded,
    # which started them in the config's order).
    start_index: int | None = None
    killed: bool = False


class EarlyExitRecord(BaseModel):
    """One early-exit decision (router.early_exit.Decision.to_record())."""

    model_config = ConfigDict(extra="allow")

    cluster: str
    completed: list[str] = []
    c_bar: float | None = None
    p: float | None = None
    b: float | None = None
    q: float | None = None
    u: float | None = None
    exited: bool = False  # the exit cut at least one agent
    moot: bool = False  # the draw said exit but nothing was left to cut: not an exit
    killed: list[str] = []
    seconds: float = 0.0  # compute, each output's embedding charged once
    wall_s: float | None = None  # from the triggering completion to the decision applied


class ResultRow(BaseModel):
    """One (sample, setting) result. Extra keys (final_text, ...) are kept as they are."""

    model_config = ConfigDict(extra="allow")

    sample_id: str
    dataset: str
    setting: int
    # Setting #5 (single-model baseline): the model that answered alone; None for MoA settings.
    single_model: str | None = None
    answer: str | None = None
    gold: str | None = None
    correct: bool | None = None  # None: not gradable (or the run failed)
    e2e_s: float = Field(ge=0.0)
    # Wall times (epoch s): the runner sent the question; the router's session clock started
    # (the agents' times count from it).
    started_at: float | None = None
    session_started_at: float | None = None
    agents: dict[str, AgentTrace] = {}
    early_exit: list[EarlyExitRecord] = []
    # Setting #6: the routing decision (routing.choose.RoutingDecision.to_record()) and the
    # posterior corrections (routing.posterior.PosteriorDecision.to_record()).
    routing: dict | None = None
    posterior: list[dict] = []
    error: str | None = None
    config: str | None = None
    mode: str | None = None
    chunk_policy: str | None = None
    # The shell router's load around this row's request (experiments/router_load.py): its
    # stats before and after; and, for a row that ran alone (--concurrency 1), the CPU seconds
    # and event-loop lag p99 in between. None in rows of older runs or routers.
    router: RouterWindow | None = None
    router_cpu_s: float | None = None
    router_lag_p99_s: float | None = None

    @field_validator("setting")
    @classmethod
    def _known_setting(cls, v: int) -> int:
        if v not in SETTINGS:
            raise ValueError(f"setting {v} is not one of {', '.join(map(str, SETTINGS))}")
        return v

    @field_validator("sample_id", "answer", "gold", mode="before")
    @classmethod
    def _numbers_as_text(cls, v: Any) -> Any:
        # Datasets store some ids and gold answers as JSON numbers; compare them as text.
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @property
    def key(self) -> tuple:
        """The --resume key, as experiments.run uses it: (sample_id, setting), and the model
        for a single-model row (#5 has one row per model)."""
        if self.single_model is None:
            return (self.sample_id, self.setting)
        return (self.sample_id, self.setting, self.single_model)

    @property
    def ok(self) -> bool:
        return self.error is None


def validate_row(row: ResultRow | dict, where: str = "row") -> ResultRow:
    if isinstance(row, ResultRow):
        return row
    try:
        return ResultRow.model_validate(row)
    except ValidationError as e:
        first = e.errors()[0]
        path = ".".join(str(p) for p in first["loc"]) or "$"
        raise ResultsError(f"{where}: {path}: {first['msg']}") from None


class ResultsWriter:
    """Appends rows to a JSONL file, one line per call, flushed and fsynced before returning, so
    a crash or Ctrl-C loses at most the row being written. Opening repairs a torn last line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        _drop_torn_tail(self.path)

    def append(self, row: ResultRow | dict) -> None:
        checked = validate_row(row, f"results row for {self.path}")
        data = row if isinstance(row, dict) else checked.model_dump(mode="json")
        line = json.dumps(data, ensure_ascii=False, allow_nan=False) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line without its newline (a write cut short) so the next row starts clean."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        log.warning(
            "%s: dropping a torn last line (%d bytes) before appending", path, len(data) - keep
        )
        f.truncate(keep)


def read_results(path: str | Path) -> list[ResultRow]:
    """All rows of a results file, in file order; when a key repeats (a --resume retry of a
    failed row), the later row replaces the earlier. A torn last line is skipped with a warning;
    a bad line anywhere else is an error naming the line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ResultsError(
            f"{path}: no such results file; run `moa-pd run --out DIR` first, "
            "or point at the folder holding results.jsonl"
        ) from None
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows: dict[tuple[str, str, int], ResultRow] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            if i == last:
                log.warning("%s:%d: skipping a torn last line (%s)", path, i + 1, e.msg)
                continue
            raise ResultsError(
                f"{path}:{i + 1}: not valid JSON ({e.msg}); fix or delete that line"
            ) from None
        row = validate_row(raw, f"{path}:{i + 1}")
        key = (row.dataset, *row.key)
        rows.pop(key, None)  # re-insert so a retried row takes the later position
        rows[key] = row
    return list(rows.values())


def completed_keys(path: str | Path, retry_errors: bool = True) -> set[tuple[str, int]]:
    """(sample_id, setting) pairs already in the file, for --resume. Rows that failed are left
    out by default, so a resumed run tries them again (the retry's row then wins on read)."""
    path = Path(path)
    if not path.exists():
        return set()
    return {r.key for r in read_results(path) if r.ok or not retry_errors}
