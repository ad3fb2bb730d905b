"""Every bad-config case of the foundation issue: exit code 2, no traceback, a message naming the
file, the JSON path and the fix."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from router.config_loader import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent


def base() -> dict:
    return {
        "name": "t",
        "models": {"m": {"model_path": "smollm2-135m"}},
        "templates": {
            "p": {"user": "{question}"},
            "agg": {"user": "{question}\n<|answer:a|>\n<|answer:b|>"},
        },
        "agents": [
            {"id": "a", "model": "m", "template": "p"},
            {"id": "b", "model": "m", "template": "p"},
            {"id": "c", "model": "m", "template": "agg"},
        ],
    }


def error_for(cfg: dict | str, tmp_path: Path) -> ConfigError:
    f = tmp_path / "bad.json"
    f.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg, indent=2))
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert str(f) in str(info.value)
    return info.value


def test_base_config_is_valid():
    cfg = parse_config(json.dumps(base()))
    assert cfg.final == "c" and cfg.precursors("c") == ["a", "b"]


def test_invalid_json_names_line_and_column(tmp_path):
    err = error_for('{\n  "name": "t",\n  "models": {,}\n}', tmp_path)
    assert "invalid JSON at line 3, column" in err.message


def test_unknown_key_suggests_closest(tmp_path):
    cfg = base()
    cfg["agents"][0]["temprature"] = 0.1
    cfg["early_exit"] = {"enabeld": True}
    err = error_for(cfg, tmp_path)
    assert err.path == "agents[0].temprature"
    assert "unknown key 'temprature'" in err.message and "did you mean 'template'" in err.message
    cfg = base()
    cfg["early_exit"] = {"enabeld": True}
    err = error_for(cfg, tmp_path)
    assert err.path == "early_exit.enabeld" and "did you mean 'enabled'" in err.message


def test_placeholder_naming_unknown_agent(tmp_path):
    cfg = base()
    cfg["templates"]["agg"]["user"] += "<|answer:zed|>"
    err = error_for(cfg, tmp_path)
    assert err.path == "templates.agg.user"
    assert "<|answer:zed|> names an unknown agent" in err.message


def test_cycle_is_printed(tmp_path):
    cfg = base()
    cfg["templates"]["p2"] = {"user": "{question} <|answer:c|>"}
    cfg["agents"][0]["template"] = "p2"  # a reads c, c reads a
    cfg["agents"].append({"id": "d", "model": "m", "template": "p"})
    err = error_for(cfg, tmp_path)
    assert "dependency cycle: a -> c -> a" in err.message or "c -> a -> c" in err.message


def test_self_dependency(tmp_path):
    cfg = base()
    cfg["templates"]["agg"]["user"] += "<|answer:c|>"
    err = error_for(cfg, tmp_path)
    assert "reads its own answer" in err.message and "<|answer:c|>" in err.message


def test_duplicate_agent_id(tmp_path):
    cfg = base()
    cfg["agents"][1]["id"] = "a"
    err = error_for(cfg, tmp_path)
    assert err.path == "agents[1].id" and "duplicate agent id 'a'" in err.message


def test_agent_naming_unknown_model(tmp_path):
    cfg = base()
    cfg["agents"][2]["model"] = "gpt-9"
    err = error_for(cfg, tmp_path)
    assert err.path == "agents[2].model"
    assert "model 'gpt-9'" in err.message and "known: m" in err.message


def test_template_without_question_where_required(tmp_path):
    cfg = base()
    cfg["templates"]["p"]["user"] = "Say something."
    err = error_for(cfg, tmp_path)
    assert err.path == "templates.p.user" and "add {question}" in err.message


@pytest.mark.parametrize("tau", [0.0, 1.0, 1.5, -0.2])
def test_tau_outside_open_unit_interval(tmp_path, tau):
    cfg = base()
    cfg["early_exit"] = {"tau": tau}
    err = error_for(cfg, tmp_path)
    assert err.path == "early_exit.tau"
    assert ("greater than 0" in err.message) or ("less than 1" in err.message)


@pytest.mark.parametrize("value", [0, -5])
def test_non_positive_max_tokens(tmp_path, value):
    cfg = base()
    cfg["agents"][1]["sampling"] = {"max_new_tokens": value}
    err = error_for(cfg, tmp_path)
    assert err.path == "agents[1].sampling.max_new_tokens"
    assert "greater than 0" in err.message and f"got {value}" in err.message


def test_empty_agent_list(tmp_path):
    cfg = base()
    cfg["agents"] = []
    err = error_for(cfg, tmp_path)
    assert err.path == "agents" and "agent list is empty" in err.message


def test_two_final_agents(tmp_path):
    cfg = base()
    cfg["agents"].append({"id": "d", "model": "m", "template": "agg"})
    err = error_for(cfg, tmp_path)
    assert "2 final agents (c, d)" in err.message and "one final agent" in err.message


def test_missing_required_key(tmp_path):
    cfg = base()
    del cfg["models"]["m"]["model_path"]
    err = error_for(cfg, tmp_path)
    assert err.path == "models.m.model_path" and "missing" in err.message


def test_unknown_config_name_suggests_shipped_one():
    with pytest.raises(ConfigError, match="did you mean 'tree_3_1_cpu'"):
        load_config("tree_3_1_cpuu")


def test_shipped_configs_are_valid():
    for f in sorted((ROOT / "cfgs").glob("*.json")):
        cfg = load_config(f)
        assert cfg.final == "final"
    tree = load_config("tree_9_3_1_hetero")
    assert [len(tree.precursors(a.id)) for a in tree.agents if tree.precursors(a.id)] == [3] * 4
    dense = load_config("all_to_all_9_9_1_homo")
    assert all(len(dense.precursors(f"agg_{i}")) == 9 for i in range(9))


def test_cli_validate_exit_code_and_no_traceback(tmp_path):
    cfg = copy.deepcopy(base())
    cfg["agents"][0]["model"] = "nope"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(cfg))
    good = ROOT / "cfgs" / "tree_3_1_cpu.json"
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "validate", str(good), str(bad)],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{bad}: agents[0].model: agent 'a' names model 'nope'" in proc.stderr
    assert "ok: " in proc.stdout


def test_cli_show_prints_layers_and_clusters():
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "show", "tree_9_3_1_cpu"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "layer 2 (3 agents)" in proc.stdout
    assert "agg_1: {leaf_1_0, leaf_1_1, leaf_1_2}" in proc.stdout


def test_config_option_takes_a_path_anywhere_and_names_must_not_clash(tmp_path, capsys):
    from launch.cli import main
    from router.config_loader import ConfigError, load_configs_by_name

    mine = tmp_path / "mytree.json"
    raw = json.loads((ROOT / "cfgs" / "tree_3_1_cpu.json").read_text())
    mine.write_text(json.dumps(raw))
    assert main(["validate", "--config", str(mine)]) == 0
    assert main(["show", "--config", str(mine)]) == 0
    assert capsys.readouterr().out.count("tree_3_1_cpu:") == 2
    # Served by name: the copy is the same config; an edited copy under that name is not.
    assert list(load_configs_by_name([str(mine), "tree_3_1_cpu"])) == ["tree_3_1_cpu"]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**raw, "description": "edited"}))
    with pytest.raises(ConfigError, match="also named 'tree_3_1_cpu' but differs"):
        load_configs_by_name([str(mine), str(other)])


def test_dummy_load_format_and_dummy_models(tmp_path):
    cfg = base()
    cfg["models"]["m"] = {"model_path": "/models/qwen3-8b-shape", "load_format": "dummy"}
    assert parse_config(json.dumps(cfg)).models["m"].load_format == "dummy"
    cfg["models"]["m"] = {"model_path": "dummy:qwen3-8b"}  # a shape-only model loads dummy
    assert parse_config(json.dumps(cfg)).models["m"].load_format == "dummy"
    cfg["models"]["m"] = {"model_path": "dummy:qwen3-8b", "load_format": "auto"}
    err = error_for(cfg, tmp_path)
    assert err.path == "models.m" and "'dummy:qwen3-8b' has no weights" in err.message
    cfg["models"]["m"] = {"model_path": "smollm2-135m", "load_format": "dumy"}
    err = error_for(cfg, tmp_path)
    assert err.path == "models.m.load_format" and "'auto' or 'dummy'" in err.message
    cfg["models"]["m"] = {
        "model_path": "smollm2-135m",
        "server_args": {"sglang": {"load_format": "dummy"}},
    }
    err = error_for(cfg, tmp_path)
    assert err.path == "models.m" and "server_args.sglang.load_format" in err.message
    assert "set the model's own load_format" in err.message


def test_one_predicate_names_a_dummy_model_for_config_and_store(tmp_path):
    from sglang_ext.engine.model_store import resolve_model_path
    from sglang_ext.protocol import dummy_shape

    assert dummy_shape(" Dummy:Qwen3-Tiny ") == "qwen3-tiny"
    assert dummy_shape("dummy:") == "" and dummy_shape("/models/dummy:x") is None
    cfg = base()
    cfg["models"]["m"] = {"model_path": "Dummy:Qwen3-Tiny"}  # the store reads it: so must we
    spec = parse_config(json.dumps(cfg)).models["m"]
    assert spec.is_shape_only and spec.load_format == "dummy"
    assert resolve_model_path(spec.model_path).endswith("dummy-qwen3-tiny")
    cfg["models"]["m"] = {"model_path": "dummy: "}
    err = error_for(cfg, tmp_path)
    assert err.path == "models.m" and "'dummy:' names no shape" in err.message


def test_min_new_tokens_cannot_exceed_max_new_tokens(tmp_path):
    cfg = base()
    cfg["agents"][0]["sampling"] = {"max_new_tokens": 8, "min_new_tokens": 8, "ignore_eos": True}
    parsed = parse_config(json.dumps(cfg))
    assert parsed.sampling_of("a").to_sglang()["min_new_tokens"] == 8
    cfg["agents"][0]["sampling"] = {"max_new_tokens": 8, "min_new_tokens": 9}
    err = error_for(cfg, tmp_path)
    assert err.path == "agents[0].sampling"
    assert "min_new_tokens (9) exceeds max_new_tokens (8)" in err.message


@pytest.mark.parametrize(
    "name,lengths",
    [
        ("tree_9_3_1_dummy_gpu", (300, 500, 700)),
        ("all_to_all_9_9_1_dummy_gpu", (300, 500, 700)),
        ("tree_9_3_1_dummy_cpu", (12, 20, 28)),
    ],
)
def test_dummy_configs_fix_each_clusters_output_length(name, lengths):
    cfg = load_config(name)
    assert all(m.load_format == "dummy" and m.is_shape_only for m in cfg.models.values())
    leaves = [a.id for a in cfg.agents if not cfg.precursors(a.id)]
    assert len(leaves) == 9
    for i, leaf in enumerate(leaves):
        s = cfg.sampling_of(leaf)
        want = lengths[i // 3]  # the leaves of one cluster (dense: of one group of three)
        assert s.ignore_eos and s.max_new_tokens == s.min_new_tokens == want, leaf
        assert s.temperature == 0.0
    assert all(cfg.sampling_of(a.id).ignore_eos for a in cfg.agents)


def test_dummy_gpu_configs_use_the_hetero_shapes():
    tree = load_config("tree_9_3_1_dummy_gpu")
    paths = {n: m.model_path for n, m in tree.models.items()}
    assert paths == {f"qwen3-{s}": f"dummy:qwen3-{s}" for s in ("4b", "8b", "32b")}
    assert [tree.agent(f"leaf_0_{j}").model for j in range(3)] == list(paths)
    assert tree.agent("agg_1").model == "qwen3-8b" and tree.agent("final").model == "qwen3-32b"
    dense = load_config("all_to_all_9_9_1_dummy_gpu")
    assert dense.models == tree.models  # one deployment serves both (setting #1)
    single = load_config("single_8b_dummy_gpu")
    assert (
        list(single.models) == ["qwen3-8b"] and single.models["qwen3-8b"] == tree.models["qwen3-8b"]
    )
