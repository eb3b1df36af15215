"""Shared fixtures: every test imports the built torch_tpu package."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TORCH_TPU_PLATFORM", "cpu")
# First calls compile before they run (no host tier), so compile counts are exact; the host
# tier's own tests turn it on.
os.environ.setdefault("TORCH_TPU_ASYNC_COMPILE", "0")
# The persistent compile cache of this test session, not the user's.
os.environ.setdefault("TORCH_TPU_CACHE_DIR", tempfile.mkdtemp(prefix="torch_tpu_test_cache_"))

import pytest
import torch

import torch_tpu


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
