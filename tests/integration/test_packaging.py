"""`pip install .` ships what the code reads at run time: the wheel built from the tree
carries every package with its data files (Redis Lua scripts, YAML presets, report
templates), the `pdd-router` entry point, and nothing of the tests."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("policies", "engines_adapter", "engine_sim", "router", "bench", "replay", "cli")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("pdd_router-*.whl")
    return zipfile.ZipFile(built)


def _tree_files(suffixes: set[str] | None) -> set[str]:
    files = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            wanted = suffixes is None or path.suffix in suffixes
            if wanted and path.is_file() and "__pycache__" not in path.parts:
                files.add(path.relative_to(ROOT).as_posix())
    return files


def test_the_wheel_carries_every_module_and_data_file(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    data = _tree_files({".lua", ".yaml", ".j2", ".css", ".typed", ".json", ".jinja"})
    assert {"router/index/lua/match.lua", "replay/presets/clusters/pdd.yaml"} <= data
    assert "router/tokenization/data/tokenizer.json" in data
    assert "replay/report/templates/report.html.j2" in data
    assert _tree_files(None) - {n for n in names} == set()
    tops = {n.split("/")[0] for n in names if not n.startswith("pdd_router-")}
    assert tops == set(PACKAGES)  # no tests, scripts or docs in the wheel


def test_the_entry_point_is_the_cli_package(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith("entry_points.txt")]
    assert "pdd-router = cli.app:run" in wheel.read(entry_points).decode()
