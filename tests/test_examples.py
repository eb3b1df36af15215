"""Every example trains on tpu like the same run on CPU (its own --check), with no op falling back
to CPU. Each runs as its users run it: `python examples/<name>/train.py`, in a subprocess."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
NAMES = ["mingpt", "llama", "qwen", "resnet", "dlrm", "unet"]


def _run(name: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(EXAMPLES / name / "train.py"), "--steps", "2", "--check", "--no-fallbacks", *args]
    env = dict(os.environ, TORCH_TPU_PLATFORM=os.environ.get("TORCH_TPU_PLATFORM", "cpu"))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)


def _assert_passed(result: subprocess.CompletedProcess) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "check passed" in result.stdout, output[-4000:]
    assert "cpu_fallbacks          0" in result.stdout, output[-4000:]


def test_every_example_is_tested():
    assert sorted(NAMES) == sorted(p.parent.name for p in EXAMPLES.glob("*/train.py"))


@pytest.mark.parametrize("name", NAMES)
def test_example_trains_like_cpu(name):
    result = _run(name)
    _assert_passed(result)
    assert "step   0  loss " in result.stdout and "step   1  loss " in result.stdout
    assert " on tpu: 100%" in result.stdout  # the progress bar
    assert "inference: " in result.stdout


def _tpu_backend_registered() -> bool:
    import torch_tpu  # noqa: F401  (registers the backend, once it exists)

    return "tpu" in torch._dynamo.list_backends()


@pytest.mark.parametrize("name", ["mingpt", "resnet"])
def test_compiled_example_trains_like_cpu(name):
    if not _tpu_backend_registered():
        pytest.skip("torch.compile backend 'tpu' is not registered yet")
    _assert_passed(_run(name, "--quiet", "--compile"))
