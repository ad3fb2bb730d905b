"""A trained proposer scorer (`moa-pd train-scorer --out scorer.json`): for each candidate of a
pool, a logistic model on the query's MiniLM embedding that predicts the probability that the
candidate answers correctly (RouteMoA's lightweight scorer, without pre-inference), and a length
model that predicts how many tokens it writes for the query (what the question will cost).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "moa-pd.scorer/1"


class LengthModel(BaseModel):
    """log(1 + output tokens) as a linear function of the query embedding (ridge regression)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    coef: list[float]
    intercept: float
    median_tokens: float  # on its training questions (the baseline a length model must beat)
    examples: int

    def predict(self, x: np.ndarray) -> float:
        return float(np.expm1(x @ np.asarray(self.coef) + self.intercept))


class CandidateModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    coef: list[float]  # one weight per embedding dimension
    intercept: float
    prior: float = Field(ge=0, le=1)  # its accuracy on the training questions
    positives: int  # correct answers among its training questions
    examples: int
    length: LengthModel | None = None  # None: runs without output tokens recorded


class Scorer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal["moa-pd.scorer/1"] = Field(SCHEMA, alias="schema")
    embedder: str  # the sentence-transformers model the embeddings came from
    dim: int
    candidates: dict[str, CandidateModel]  # the pool entry's id -> its model
    trained_on: dict[str, object] = {}  # runs, datasets, question ids, seed
    heldout: dict[str, dict[str, float]] = {}  # candidate -> {"auc": .., "brier_prior": .., ...}
    # The scorer as a router on the held-out questions (routing.train.router_metrics): top-1 hit
    # rate and regret against the oracle, beside the prior's.
    heldout_router: dict[str, float | str] = {}

    @classmethod
    def load(cls, path: str | Path) -> Scorer:
        return cls.model_validate_json(Path(path).read_text())

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(by_alias=True, indent=2) + "\n")

    def _vector(self, embedding: np.ndarray) -> np.ndarray:
        x = np.asarray(embedding, dtype=np.float64).reshape(-1)
        if x.shape[0] != self.dim:
            raise ValueError(
                f"the scorer takes {self.dim}-dimensional embeddings, got {x.shape[0]}"
            )
        return x

    def predict_tokens(self, embedding: np.ndarray) -> dict[str, float | None]:
        """Each candidate's expected output tokens for the query (None: no length model)."""
        x = self._vector(embedding)
        return {
            cid: None if c.length is None else max(1.0, c.length.predict(x))
            for cid, c in self.candidates.items()
        }

    def predict(self, embedding: np.ndarray) -> dict[str, float]:
        """Each candidate's probability of a correct answer to the query of `embedding`."""
        x = self._vector(embedding)
        return {
            cid: float(1.0 / (1.0 + np.exp(-(x @ np.asarray(c.coef) + c.intercept))))
            for cid, c in self.candidates.items()
        }
