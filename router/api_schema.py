"""The shell router's request bodies as pydantic models: the OpenAI-compatible chat and text
completions and the MoA routes. `parse` turns a body into one of them or a BadRequest naming the
field (wrong type, unknown key with a did-you-mean, out of range). Used by server.py and
chat_api.py.

OpenAI's sampling fields apply to the final agent only: `max_tokens` caps the final answer,
`stop`, `temperature`, `top_p` and `seed` are the final agent's; the inner agents keep the
sampling their topology config gives them (their budgets are part of the topology).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from router.config_loader import first_error
from router.orchestrator import Mode


class BadRequest(ValueError):
    """A request body the API cannot serve; the message says which field is wrong and how to fix
    it (HTTP 400)."""


class _Body(BaseModel):
    # strict: "abc" is not a number and "yes" is not a boolean; unknown keys are typos.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    # Clients send more per message (name, tool_call_id, refusal): read what we use.
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class _Sampling(_Body):
    """OpenAI's sampling fields, applied to the final agent."""

    max_tokens: int | None = Field(default=None, gt=0, le=65536)
    max_completion_tokens: int | None = Field(default=None, gt=0, le=65536)
    stop: str | list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: dict | None = None
    user: str | None = None
    # MoA extensions: the mode and early exit of this question (else the config's).
    moa_mode: Mode = "pipelined"
    early_exit: bool | None = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError(f"at most 4 stop strings (OpenAI's limit), not {len(stop)}")
        if stop == "" or (isinstance(stop, list) and "" in stop):
            raise ValueError("a stop string must not be empty")
        return stop

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError(
                "only n = 1 is served (an MoA run gives one answer); send n requests for n answers"
            )
        return n

    def final_sampling(self) -> dict:
        """SGLang sampling_params overrides for the final agent."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        out = {
            "max_new_tokens": self.max_completion_tokens or self.max_tokens,
            "stop": stop,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "sampling_seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
        }
        return {k: v for k, v in out.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ChatRequest(_Sampling):
    # A dict is parsed only to be refused with a message saying how to register it.
    model: str | dict = Field(description="a served topology's name (GET /v1/models)")
    messages: list[Message] = Field(min_length=1)

    @property
    def question(self) -> str:
        users = [m for m in self.messages if m.role == "user"]
        if not users or not users[-1].text.strip():
            raise BadRequest(
                "messages: the last user message is the question; send one with non-empty content"
            )
        return users[-1].text


class CompletionRequest(_Sampling):
    model: str | dict
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    echo: bool = False

    @property
    def question(self) -> str:
        text = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        if not text.strip():
            raise BadRequest("prompt: send a non-empty prompt (it is the question)")
        return text


class MoaRunRequest(_Body):
    """POST /v1/moa/run: one question through a whole graph."""

    question: str = Field(min_length=1)
    config: str | dict
    mode: Mode = "pipelined"
    early_exit: bool | None = None
    question_id: str | int | None = None
    session_id: str | None = None
    slot_orders: dict[str, list[str]] | None = None
    # The question's dataset (and BBH task): majority vote reads answers with its extractor.
    dataset: str | None = Field(default=None, min_length=1)
    task: str | None = Field(default=None, min_length=1)


class MoaAgentRequest(MoaRunRequest):
    """POST /v1/moa/agent: one agent of a question (SSE unless stream is false)."""

    session_id: str
    agent: str
    stream: bool = True


def parse(schema: type[BaseModel], body: object) -> BaseModel:
    """`body` as `schema`, or a BadRequest naming the first wrong field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    try:
        return schema.model_validate(body)
    except ValidationError as e:
        err = first_error(e, schema, "request body")
        raise BadRequest(str(err)) from None
