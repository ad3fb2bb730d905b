"""Predictions the planner and `moa-pd simulate` ask for: one setting of the paper on a
deployment (a plan, or the config's default), at a concurrency, with output lengths from a
recorded run or from the config's max_new_tokens."""

from __future__ import annotations

from pathlib import Path

from experiments.results import ResultRow, read_results
from experiments.settings import SETTINGS, Setting
from planning.plan_file import DeploymentPlan, Prediction
from planning.prompt_length import DEFAULT_QUESTION_TOKENS
from profiling.profile_file import Profile
from router.config import TopologyConfig
from simulation.deployment import SimDeployment, default_deployment, from_plan
from simulation.engine import Outcome, Simulation
from simulation.workload import QuestionWork, from_config, from_trace


def config_for_setting(configs: list[TopologyConfig], setting: Setting) -> TopologyConfig:
    """The tree config (the first) for #2/#3/#4/#7, the dense one (the second) for #1."""
    if setting.topology == "single":
        raise ValueError("setting 5 (single model) is not simulated; pick among 1, 2, 3, 4, 7")
    if setting.topology == "dense":
        if len(configs) < 2:
            raise ValueError(
                "setting 1 (dense all-to-all) needs the dense config: pass it with "
                "--dense-config (second in `configs`), or leave 1 out of the settings"
            )
        return configs[1]
    return configs[0]


def trace_rows(trace: str | Path) -> list[ResultRow]:
    """A run folder's (or a results.jsonl's) rows that ran without error."""
    path = Path(trace)
    if path.is_dir():
        path = path / "results.jsonl"
    return [r for r in read_results(path) if r.ok]


def workloads(
    cfg: TopologyConfig,
    setting: Setting,
    questions: int,
    rows: list[ResultRow] | None,
    question_tokens: int = DEFAULT_QUESTION_TOKENS,
) -> list[QuestionWork]:
    """`questions` questions of `cfg`: the trace's rows of this config (this setting's first,
    cycled as needed), else all alike from the config (each question `question_tokens` long)."""
    if not rows:
        return [from_config(cfg, f"q{i}", question_tokens) for i in range(questions)]
    mine = [r for r in rows if r.config == cfg.name]
    same = [r for r in mine if r.setting == setting.number] or mine
    if not same:
        raise ValueError(
            f"the trace has no rows of config '{cfg.name}' (it has "
            f"{sorted({r.config for r in rows})}); record a run of that config or leave --trace out"
        )
    out = []
    for i in range(questions):
        q = from_trace(cfg, same[i % len(same)])
        # A repeated question is another question to the caches.
        out.append(
            q if i < len(same) else QuestionWork(f"{q.qid}#{i}", q.config, q.final, q.agents)
        )
    return out


def simulate_setting(
    deployment: SimDeployment,
    configs: list[TopologyConfig],
    profile: Profile,
    setting: int,
    concurrency: int,
    questions: int,
    rows: list[ResultRow] | None = None,
    rate_qps: float | None = None,
    exit_rate: float | None = None,
    question_tokens: int = DEFAULT_QUESTION_TOKENS,
    workflow_priority: bool = False,
    critical_path_first: bool = False,
) -> Outcome:
    """`workflow_priority`: the deployment's workers schedule by priority and the router ranks
    requests by question (router/priority.py); else FCFS, the router's default.
    `critical_path_first`: questions without a recorded start order start their agents longest
    remaining path first (router/priority.start_order), else in the config's order (the
    router's default)."""
    s = SETTINGS[setting]
    cfg = config_for_setting(configs, s)
    asked = workloads(cfg, s, questions, rows, question_tokens)
    work = [(q, s.number, s.mode, s.early_exit) for q in asked]
    sim = Simulation(
        configs,
        profile,
        deployment,
        exit_rate=exit_rate,
        priority_scheduling=workflow_priority,
        workflow_priority=workflow_priority,
        critical_path_first=critical_path_first,
    )
    return sim.run(work, concurrency=concurrency, rate_qps=rate_qps)


def deployment_for(
    plan: DeploymentPlan | None,
    configs: list[TopologyConfig],
    profile: Profile,
    concurrency: int = 1,
) -> SimDeployment:
    """The plan's deployment, or the configs' default one, as started for `concurrency`."""
    if plan is None:
        return default_deployment(configs, profile, concurrency)
    return from_plan(plan, configs, profile, concurrency)


def predict_plan(
    plan: DeploymentPlan | None,
    configs: list[TopologyConfig],
    profile: Profile,
    concurrency: int,
    setting: int = 3,
    questions: int | None = None,
    trace: str | Path | None = None,
    question_tokens: int = DEFAULT_QUESTION_TOKENS,
) -> Prediction:
    """Predicted latency and throughput of `setting` on `plan` at `concurrency` (closed loop).
    None plan: the configs' default deployment (CPU profile: every worker on the machine's
    cores, shared; GPU profile: one GPU per worker). `questions` defaults to four waves of
    `concurrency` (at least 32), so throughput is not one wave's ramp-up and drain."""
    questions = max(32, 4 * concurrency) if questions is None else questions
    if setting not in SETTINGS:
        raise ValueError(f"setting {setting} is not one of {', '.join(map(str, SETTINGS))}")
    if concurrency < 1 or questions < 1:
        raise ValueError("concurrency and questions must be at least 1")
    rows = trace_rows(trace) if trace is not None else None
    deployment = deployment_for(plan, configs, profile, concurrency)
    out = simulate_setting(
        deployment,
        configs,
        profile,
        setting,
        concurrency,
        questions,
        rows,
        question_tokens=question_tokens,
    )
    return Prediction(
        concurrency=concurrency,
        latency_median_s=out.median_s,
        latency_p90_s=out.p90_s,
        throughput_qps=out.throughput_qps,
        device_utilization={
            d: round(busy / (out.makespan_s * deployment.devices[d]), 4)
            for d, busy in out.device_busy.items()
            if out.makespan_s > 0
        },
    )
