"""A deployment's models as configs name them, before anything starts: the configs' models merged
(one name, one model), and each model's local paths. Facts about the models, not about launching:
placement (`moa-pd plan`) and launch/ (its Stack, `up --plan`) read them here. Errors are
PlanError, which launch/ turns into its LaunchError."""

from __future__ import annotations

from pathlib import Path

from planning.pack import PlanError
from planning.pool_need import unused_models
from router.config import ModelSpec, TopologyConfig


def merge_models(configs: list[TopologyConfig]) -> dict[str, ModelSpec]:
    """The models of all configs; one name must mean one model everywhere, and each must be
    used by an agent (placement sizes a worker's pool by its agents)."""
    if unused := unused_models(configs):
        raise PlanError(unused)
    models: dict[str, ModelSpec] = {}
    for cfg in configs:
        for name, spec in cfg.models.items():
            if name in models and models[name] != spec:
                raise PlanError(
                    f"model '{name}' is defined differently in two configs ({cfg.name} and an "
                    "earlier one); give the two models different names"
                )
            models[name] = spec
    return models


def resolve_model(spec: ModelSpec, backend: str, local: bool = False) -> tuple[str, str]:
    """(model_path, tokenizer_path) as local paths, or a clear error before anything starts.
    `local`: resolve through the model store for SGLang too (its CPU path serves the CPU
    configs' models, named like "smollm2-135m"). A 'dummy:SHAPE' model is written by the model
    store for either backend: SGLang gets its local directory."""
    if backend == "torch" or local or spec.is_shape_only:
        from sglang_ext.engine.model_store import resolve_model_path

        try:
            path = resolve_model_path(spec.model_path)
        except (FileNotFoundError, ValueError) as e:
            raise PlanError(str(e)) from None
        tokenizer = resolve_model_path(spec.tokenizer_path) if spec.tokenizer_path else path
        return path, tokenizer
    # SGLang resolves HF ids itself (from a local HF cache on GPU nodes); only check local paths.
    path = spec.model_path
    if path.startswith(("/", ".")) and not Path(path).exists():
        raise PlanError(f"model path '{path}' does not exist; fix models.*.model_path")
    return path, spec.tokenizer_path or path
