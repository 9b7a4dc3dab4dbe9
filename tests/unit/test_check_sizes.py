"""scripts/check-sizes.py: what is over the size limits outside tests/, the allowlist aside."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-sizes.py"


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines, its def line included."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}() -> None:\n{body}{indent}    return None\n"


def _class(name: str, public: int) -> str:
    methods = "".join(f"    def m{i}(self) -> int:\n        return {i}\n" for i in range(public))
    extra = "    @property\n    def p(self) -> int:\n        return 0\n"
    extra += "    def _private(self) -> int:\n        return 0\n"
    return f"class {name}:\n{methods}{extra}"


def test_the_repository_is_within_its_limits_or_allowed() -> None:
    result = _check()
    assert result.returncode == 0, result.stdout
    assert result.stdout == ""


def test_each_thing_over_a_limit_is_named_with_its_size(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "funcs.py").write_text(
        _function("fits", 80)
        + _function("long", 81)
        + "class Holder:\n"
        + _function("meth", 90, "    ")
    )
    (pkg / "classes.py").write_text(_class("Wide", 16) + _class("Narrow", 15))
    (pkg / "big.py").write_text("x = 1\n" * 401)
    (pkg / "edge.py").write_text("x = 1\n" * 400)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_long.py").write_text(_function("test_long", 200) + "x = 1\n" * 500)
    result = _check(str(tmp_path))
    assert result.returncode == 1
    assert sorted(result.stdout.splitlines()) == [
        "pkg/big.py: module of 401 lines (limit 400)",
        "pkg/classes.py: class Wide, 16 public methods (limit 15)",
        "pkg/funcs.py: function Holder.meth, 90 lines (limit 80)",
        "pkg/funcs.py: function long, 81 lines (limit 80)",
    ]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_sizes", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_allowed_entry_is_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    allowed = tmp_path / "replay" / "runner" / "live.py"
    allowed.parent.mkdir(parents=True)
    allowed.write_text("x = 1\n" * 450)
    check = _script().main
    allowlist = {"replay/runner/live.py": "being restructured"}
    assert check(["check-sizes", str(tmp_path)], allowlist) == 0
    assert capsys.readouterr().out == ""
    (tmp_path / "replay" / "runner" / "other.py").write_text("x = 1\n" * 450)
    assert check(["check-sizes", str(tmp_path)], allowlist) == 1
    assert capsys.readouterr().out == "replay/runner/other.py: module of 450 lines (limit 400)\n"
    assert check(["check-sizes", str(tmp_path)], {}) == 1  # without the entry, refused too


def test_this_checkout_has_nothing_over_the_limits() -> None:
    result = _check()
    assert result.returncode == 0, result.stdout
    assert "0 over the limits, 0 allowed" in result.stderr
