"""Datasets the project may not ship (GPQA Diamond, HumanEval+): the user's own file, named by an
environment variable, or a clear error saying how to get it."""

from __future__ import annotations

import os
from pathlib import Path


def user_file(dataset: str, env_var: str, how_to_get: str) -> Path:
    """The file `env_var` names; a ValueError explaining how to get it otherwise."""
    value = os.environ.get(env_var, "").strip()
    if not value:
        raise ValueError(f"dataset '{dataset}': {env_var} is not set. {how_to_get}")
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"dataset '{dataset}': {env_var}={value} is not a file. {how_to_get}")
    return path
