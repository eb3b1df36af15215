"""The test runner tests the installed wheel, not the source tree, and the wheel is whole."""

import importlib.metadata
import os
import subprocess
import sys


def _site():
    return os.path.join(os.environ["TEST_TMPDIR"], "site")


def test_torch_tpu_comes_from_the_installed_wheel():
    import torch_tpu

    assert os.path.dirname(torch_tpu.__file__) == os.path.join(_site(), "torch_tpu")


def test_the_extension_for_this_torch_is_loaded():
    import torch
    import torch_tpu._C as C

    major, minor = torch.__version__.split(".")[:2]
    assert C.__file__ == os.path.join(_site(), "torch_tpu", "_C", f"torch_{major}_{minor}.so")
    assert sorted(os.listdir(os.path.join(_site(), "torch_tpu", "_C"))) == ["torch_2_13.so", "torch_2_14.so"]


def test_distribution_metadata_and_entry_points():
    dist = importlib.metadata.distribution("torch_tpu")
    requires = set(dist.requires or ())
    assert "torch<2.15,>=2.13" in requires or "torch>=2.13,<2.15" in requires
    assert {r.split(">=")[0] for r in requires} >= {"torch", "jax", "jaxlib", "numpy"}
    eps = {(ep.group, ep.name): ep.value for ep in dist.entry_points}
    assert eps[("torch.backends", "torch_tpu")] == "torch_tpu:_autoload"
    assert eps[("console_scripts", "tpu-info")] == "torch_tpu.tools.tpu_info:main"


def test_subprocesses_see_the_wheel_too():
    proc = subprocess.run(
        [sys.executable, "-c", "import torch_tpu, os; print(os.path.dirname(torch_tpu.__file__))"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == os.path.join(_site(), "torch_tpu")


def test_default_test_environment():
    assert os.environ["TORCH_TPU_NUM_CPU_DEVICES"] == "8"
    assert os.environ["TORCH_TPU_CACHE_DIR"].startswith(os.environ["TEST_TMPDIR"])
