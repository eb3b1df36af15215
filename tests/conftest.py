"""Shared fixtures: every test imports the built torch_tpu package."""

from __future__ import annotations

import os
import shutil
import tempfile

os.environ.setdefault("TORCH_TPU_PLATFORM", "cpu")
# First calls compile before they run (no host tier), so compile counts are exact; the host
# tier's own tests turn it on.
os.environ.setdefault("TORCH_TPU_ASYNC_COMPILE", "0")
# The persistent compile cache and torch's cache directory (the "tpu" backend's aot_autograd
# results) of this test session, not the user's: fresh directories, removed at its end (a pid
# is not unique across Bazel's sandboxes, which share /tmp).
os.environ.update(
    _OWN_DIRS := {
        variable: tempfile.mkdtemp(prefix=prefix)
        for variable, prefix in (
            ("TORCH_TPU_CACHE_DIR", "torch_tpu_test_cache_"),
            ("TORCHINDUCTOR_CACHE_DIR", "torch_tpu_test_torch_cache_"),
        )
        if variable not in os.environ
    }
)

import pytest
import torch

import torch_tpu


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cpu_client: pins behaviour of the XLA CPU client itself (the host tier, the compile worker, "
        "the fused XLA attention standing in for Pallas); skipped on other platforms (the TPU lane)",
    )


def pytest_collection_modifyitems(config, items):
    from torch_tpu import platforms

    if torch_tpu.platform() == "tpu":
        # One process at a time holds the chip: the processes tests start run on the CPU client.
        os.environ.update(TORCH_TPU_PLATFORM="cpu", JAX_PLATFORMS="cpu")
    if torch_tpu.platform() == "cpu" and not platforms.shaped_buffers():
        return
    where = "TPU's buffer layout" if torch_tpu.platform() == "cpu" else torch_tpu.platform()
    skip = pytest.mark.skip(reason=f"CPU-client behaviour; tpu tensors run on {where} here")
    for item in items:
        if item.get_closest_marker("cpu_client") is not None:
            item.add_marker(skip)


def pytest_unconfigure(config):
    for variable, own in _OWN_DIRS.items():
        if os.environ.get(variable) == own:
            shutil.rmtree(own, ignore_errors=True)


@pytest.fixture
def no_fallbacks():
    """Fails the test if any op it runs went through the CPU fallback."""
    torch_tpu.metrics.reset()
    yield
    fallbacks = torch_tpu.metrics.counters()["cpu_fallback_ops"]
    assert not fallbacks, f"ops fell back to CPU: {fallbacks}"


@pytest.fixture
def fresh_dynamo():
    """dynamo's caches and torch_tpu's counters cleared before the test, dynamo's again after."""
    torch._dynamo.reset()
    torch_tpu.metrics.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _no_unread_check_failures():
    """A test whose deferred index check failed without a host read reporting it fails itself, not
    the next test that reads a value (ops/deferred_checks.py)."""
    yield
    from torch_tpu.ops import deferred_checks

    deferred_checks.raise_pending()
