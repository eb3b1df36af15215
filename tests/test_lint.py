"""The Python sources are ruff-clean (ruff.toml): lint rules and formatting."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest


def _source_root() -> pathlib.Path:
    """The workspace sources: Bazel's runfiles tree, or the checkout for a plain pytest run."""
    runfiles = os.environ.get("TEST_SRCDIR")
    if runfiles:
        return pathlib.Path(runfiles) / os.environ.get("TEST_WORKSPACE", "torch_tpu")
    return pathlib.Path(__file__).resolve().parents[1]


ROOT = _source_root()
TARGETS = [str(ROOT / d) for d in ("torch_tpu", "tests", "examples", "benchmarks") if (ROOT / d).is_dir()]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--config", str(ROOT / "ruff.toml"), *TARGETS],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("command", [("check", "--no-cache"), ("format", "--check", "--no-cache")])
def test_ruff(command):
    assert (ROOT / "ruff.toml").exists()
    assert any(pathlib.Path(t).name == "torch_tpu" for t in TARGETS)
    result = _ruff(*command)
    assert result.returncode == 0, result.stdout + result.stderr
