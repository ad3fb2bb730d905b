"""`moa-pd sweep`: spec validation with JSON paths, one run per combination through an injected
runner, chunk-policy config copies, sweep.csv and the table, failures recorded and skipped."""

import csv
import json

import pytest
from synthetic_results import make_rows

from experiments import sweep
from experiments.results import ResultsWriter
from experiments.sweep_spec import spec_from_dict
from router.config_loader import ConfigError, load_config
from tests.text_checks import said


def _spec(tmp_path, **kw):
    raw = {
        "configs": ["tree_9_3_1_cpu"],
        "dense_config": "all_to_all_9_9_1_cpu",
        "datasets": ["gsm8k", "math500"],
        "settings": [1, 2, 4],
        "num_samples": 4,
        "out": str(tmp_path / "sweep"),
        **kw,
    }
    return spec_from_dict(raw, "spec.json")


class FakeRunner:
    """Writes synthetic rows the way experiments.run does, and records each job."""

    def __init__(self, fail_on: str | None = None):
        self.jobs, self.fail_on = [], fail_on

    def __call__(self, job: sweep.SweepJob) -> None:
        self.jobs.append(job)
        if self.fail_on and self.fail_on in str(job.out_dir):
            raise RuntimeError("worker died during start-up")
        writer = ResultsWriter(job.out_dir / "results.jsonl")
        for row in make_rows(
            datasets=(job.dataset,), settings=tuple(job.settings), n=job.num_samples
        ):
            writer.append(row)


@pytest.mark.parametrize(
    "raw, where, message",
    [
        ({"confgs": ["x"]}, "confgs", "did you mean 'configs'"),
        ({"settings": [1, 8]}, "settings", "numbers among 1, 2, 3, 4, 5, 6, 7"),
        ({"settings": [2, 6]}, "$", "needs 'routed_config'"),
        ({"chunk_policies": ["adaptive", "fixed:0"]}, "chunk_policies", "fixed:N"),
        ({"dense_config": None}, "$", "needs 'dense_config'"),
        ({"concurrency": 0}, "concurrency", "greater than 0"),
        ({"cluster": "c.json", "chunk_policies": ["fixed:8"]}, "$", "fresh deployment"),
    ],
)
def test_spec_errors_name_the_json_path(tmp_path, raw, where, message):
    with pytest.raises(ConfigError) as e:
        _spec(tmp_path, **raw)
    assert e.value.path == where and message in e.value.message


def test_missing_key_and_bad_json(tmp_path):
    with pytest.raises(ConfigError, match="required key 'datasets'"):
        spec_from_dict({"configs": ["a"], "out": "o", "settings": [2]})
    bad = tmp_path / "spec.json"
    bad.write_text('{"configs": [')
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        sweep.load_spec(bad)


def test_sweep_runs_every_combination_and_writes_one_csv(tmp_path):
    spec = _spec(tmp_path, chunk_policies=["config", "fixed:16"])
    runner = FakeRunner()
    rows = sweep.run_sweep(spec, runner)
    assert len(runner.jobs) == 4  # 1 config x 2 datasets x 2 chunk policies
    fixed = [j for j in runner.jobs if j.chunk_policy == "fixed:16"]
    cfg = load_config(fixed[0].config)  # a validated copy with the policy written in
    assert (cfg.incremental_prefill.chunk_policy, cfg.incremental_prefill.chunk_tokens) == (
        "fixed",
        16,
    )
    assert fixed[0].config.endswith("configs/tree_9_3_1_cpu.json")
    with open(tmp_path / "sweep" / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) == 4 * 3  # one row per (run, setting)
    assert {(r["dataset"], r["chunk_policy"], r["setting"]) for r in table} == {
        (d, p, s)
        for d in ("gsm8k", "math500")
        for p in ("config", "fixed:16")
        for s in ("1", "2", "4")
    }
    four = next(r for r in table if r["setting"] == "4")
    assert float(four["latency_vs_1_median"]) < 0.3 and "qwen-4b=" in four["activation_pct"]


def test_a_failed_run_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(
        json.dumps(
            {
                "configs": ["tree_9_3_1_cpu"],
                "datasets": ["gsm8k", "math500"],
                "settings": [2, 3],
                "num_samples": 3,
                "out": str(tmp_path / "out"),
            }
        )
    )
    runner = FakeRunner(fail_on="math500")
    parser_args = type("A", (), {"spec": str(spec_path), "resume": True, "fail_fast": False})
    assert sweep.main(parser_args, runner=runner) == 1
    assert all(j.resume for j in runner.jobs)
    out = capsys.readouterr().out
    assert "worker died" in out and "gsm8k" in out
    with open(tmp_path / "out" / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["status"] for r in table] == ["ok", "ok", "error: worker died during start-up"]
    with pytest.raises(RuntimeError):
        sweep.run_sweep(sweep.load_spec(spec_path), FakeRunner(fail_on="math500"), fail_fast=True)


def test_cli_wires_the_sweep_subcommand(tmp_path, capsys):
    from launch.cli import main as cli_main

    spec_path = tmp_path / "spec.json"
    spec_path.write_text(
        json.dumps(
            {
                "configs": ["tree_9_3_1_cpu"],
                "datasets": ["gsm8k"],
                "out": str(tmp_path),
                "setings": [2],
            }
        )
    )
    assert cli_main(["sweep", str(spec_path)]) == 2
    assert "unknown key 'setings'; did you mean 'settings'" in said(capsys.readouterr().err)


def test_a_dataset_mix_gets_a_folder_of_its_members():
    assert sweep._slug("gsm8k,mmlu") == "gsm8k+mmlu"
    assert sweep._slug("a/x.jsonl,b/y.jsonl") == "x+y"  # not y's folder
    assert sweep._slug("b/y.jsonl") == "y"
