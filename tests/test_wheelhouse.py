"""`make wheelhouse` (launch/wheelhouse.py): the pinned sets, the platform tags, trimming a wheel
with its RECORD, splitting into parts; and fit_config's shape swap for the GPU benchmark."""

import argparse
import zipfile

import pytest

from benchmarks.gpu.fit_config import fit, parse_map
from launch import wheelhouse
from launch.wheelhouse import (
    WheelhouseError,
    dist_key,
    download_argv,
    platform_tags,
    release,
    releases,
    split_parts,
    trim_wheel,
)


def test_every_pinned_set_is_exact_and_has_one_version_per_package():
    table = releases()
    assert {"0.5.17", "0.5.23"} <= set(table)
    for version, rel in table.items():
        names = [w.split("==")[0].lower().replace("_", "-") for w in rel["wheels"]]
        assert all("==" in w for w in rel["wheels"]), version
        assert len(names) == len(set(names)), f"{version}: a package twice"
        assert f"sglang=={version}" in rel["wheels"]
        assert rel["torch"] and rel["node"]
    assert table["0.5.17"]["torch"] == "2.11.0" and table["0.5.23"]["torch"] == "2.14.1"
    assert "sglang-kernel==0.4.5" in table["0.5.17"]["wheels"]
    # Every trim names a wheel of its set.
    keys = {w.split("==")[0].replace("-", "_") for w in table["0.5.17"]["wheels"]}
    assert set(table["0.5.17"]["trim"]) <= keys


def test_unknown_release_names_the_known_ones():
    with pytest.raises(WheelhouseError, match="no pinned wheel set for sglang 0.4.0.*0.5.17"):
        release("0.4.0")


def test_platform_tags_cover_every_glibc_up_to_the_node():
    tags = platform_tags("2.35")
    assert tags[0] == "manylinux_2_35_x86_64" and "manylinux_2_28_x86_64" in tags
    assert tags[-2:] == ["manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    for bad in ("2.5", "235", "3.1"):
        with pytest.raises(WheelhouseError, match="--glibc"):
            platform_tags(bad)
    argv = download_argv(["a==1"], "3.12", "2.28", "D", ["pip"])
    assert argv[:3] == ["pip", "download", "--no-deps"] and argv[-1] == "a==1"
    assert argv.count("--platform") == 13
    assert "--no-deps" not in download_argv(["torch==2"], "3.12", "2.28", "D", ["pip"], deps=True)


def _wheel(path, files):
    record = "".join(f"{name},sha256=x,1\n" for name in files) + "pkg-1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("pkg-1.dist-info/RECORD", record)
    return path


def test_trim_drops_files_and_their_record_rows(tmp_path):
    w = _wheel(
        tmp_path / "sglang_kernel-0.4.5-cp310-abi3-x.whl",
        {
            "sgl_kernel/common_ops.so": b"k" * 100,
            "sgl_kernel/flash_ops.abi3.so": b"f" * 5000,
            "sgl_kernel/sm100/common_ops.so": b"b" * 5000,
        },
    )
    saved = trim_wheel(w, ["*flash_ops*", "*/sm100/*"])
    assert saved > 0 and dist_key(w) == "sglang_kernel"
    with zipfile.ZipFile(w) as z:
        assert sorted(z.namelist()) == ["pkg-1.dist-info/RECORD", "sgl_kernel/common_ops.so"]
        record = z.read("pkg-1.dist-info/RECORD").decode()
    assert "flash_ops" not in record and "sm100" not in record
    assert "sgl_kernel/common_ops.so" in record


def test_parts_stay_under_the_limit_and_hold_every_wheel(tmp_path):
    sizes = {"a": 40, "b": 30, "c": 20, "d": 10, "e": 5}
    wheels = []
    for name, kib in sizes.items():
        (p := tmp_path / f"{name}-1-py3-none-any.whl").write_bytes(b"x" * kib * 1024)
        wheels.append(p)
    parts = split_parts(wheels, 50 / 1024)
    assert sorted(w.name for p in parts for w in p) == sorted(w.name for w in wheels)
    assert all(sum(w.stat().st_size for w in p) <= 50 * 1024 for p in parts)
    assert len(parts) == 3
    with pytest.raises(WheelhouseError, match="a-1-py3-none-any.whl alone"):
        split_parts(wheels, 39 / 1024)


def test_build_returns_where_the_split_moved_the_wheels(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(wheelhouse, "run", calls.append)  # no pip: the wheels are here already
    for name, kib in {"a": 40, "b": 30, "c": 20}.items():
        (tmp_path / f"{name}-1-py3-none-any.whl").write_bytes(b"x" * kib * 1024)
    args = argparse.Namespace(
        sglang="0.5.17",
        python="3.12",
        glibc="2.35",
        out=str(tmp_path),
        trim=False,
        split_mib=50 / 1024,
        with_torch=False,
        no_project=True,
        pip_python="python3",
    )
    got = wheelhouse.build(args)
    assert len(calls) == 1 and len(got) == 3
    assert all(w.is_file() and w.parent.name.startswith("part") for w in got)
    assert not list(tmp_path.glob("*.whl"))


def test_fit_config_swaps_shapes_and_renames_models_and_agents():
    raw = {
        "name": "tree",
        "description": "d.",
        "models": {
            "qwen3-4b": {"model_path": "dummy:qwen3-4b", "load_format": "dummy"},
            "qwen3-32b": {"model_path": "dummy:qwen3-32b", "load_format": "dummy"},
        },
        "agents": [{"id": "a", "model": "qwen3-32b"}, {"id": "b", "model": "qwen3-4b"}],
    }
    out = fit(raw, parse_map("qwen3-32b=qwen3-8b"))
    assert out["name"] == "tree_fit" and "qwen3-32b -> qwen3-8b" in out["description"]
    assert out["models"]["qwen3-8b"] == {"model_path": "dummy:qwen3-8b", "load_format": "dummy"}
    assert "qwen3-32b" not in out["models"] and out["models"]["qwen3-4b"]["load_format"] == "dummy"
    assert [a["model"] for a in out["agents"]] == ["qwen3-8b", "qwen3-4b"]
    with pytest.raises(ValueError, match="no model qwen3-14b"):
        fit(raw, {"qwen3-14b": "qwen3-8b"})
    with pytest.raises(ValueError, match="two models one name"):
        fit(raw, {"qwen3-32b": "qwen3-4b"})
    with pytest.raises(ValueError, match="MODEL=SHAPE"):
        parse_map("qwen3-32b")
