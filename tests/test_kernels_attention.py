"""Flash attention (Pallas, interpreted on the CPU client) and the SDPA routing, against
PyTorch's math on CPU. Shapes are small and shared between tests: each new shape compiles
three interpreted kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_tpu
from tests.helpers import same
from torch_tpu.kernels import flash, flash_attention, sdpa

F32_TOL = {"rtol": 1e-4, "atol": 1e-4}
BF16_TOL = {"rtol": 3e-2, "atol": 3e-2}


def reference_attention(q, k, v, causal=False, sm_scale=None):
    """Attention in float32 math on CPU, key/value heads repeated for grouped queries."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=sm_scale)
    return out.to(q.dtype)


def attention_inputs(batch, heads, kv_heads, q_len, kv_len, dim, v_dim=None, dtype=torch.float32):
    return (
        torch.randn(batch, heads, q_len, dim, dtype=dtype),
        torch.randn(batch, kv_heads, kv_len, dim, dtype=dtype),
        torch.randn(batch, kv_heads, kv_len, v_dim or dim, dtype=dtype),
    )


def test_flash_causal_gqa_several_blocks_float32():
    # 130 rows: two 128-blocks, the second padded; two query heads per key/value head.
    q, k, v = attention_inputs(1, 2, 1, 130, 130, 8)
    same(
        lambda device, q, k, v: (flash_attention if device == "tpu" else reference_attention)(q, k, v, causal=True),
        q,
        k,
        v,
        grad=True,
        device_arg=True,
        seed=0,
        **F32_TOL,
    )


def test_flash_bfloat16_odd_lengths_other_value_dim():
    q, k, v = attention_inputs(2, 2, 2, 9, 23, 8, v_dim=16, dtype=torch.bfloat16)
    same(
        lambda device, q, k, v: (flash_attention if device == "tpu" else reference_attention)(q, k, v, sm_scale=0.5),
        q,
        k,
        v,
        grad=True,
        device_arg=True,
        seed=0,
        **BF16_TOL,
    )


@pytest.mark.parametrize(
    ("shape", "causal", "dtype", "tol"),
    [
        # (batch, heads, kv_heads, q_len, kv_len, head_dim): two query and key blocks of 512
        # with the second padded, causal blocks skipped above the diagonal, GQA, float16 (computed
        # in float32), a head dim past one lane row (padded to 256), one query row (decoding).
        ((1, 4, 2, 600, 600, 64), True, torch.float32, F32_TOL),
        ((1, 2, 2, 130, 700, 16), False, torch.float16, {"rtol": 2e-3, "atol": 2e-3}),
        ((1, 2, 1, 40, 40, 192), True, torch.bfloat16, BF16_TOL),
        ((2, 4, 1, 1, 300, 32), False, torch.float32, F32_TOL),
    ],
    ids=["two-blocks-causal-gqa", "float16-long-keys", "head-dim-192", "one-query-row"],
)
def test_flash_blocks_and_dtypes(shape, causal, dtype, tol):
    batch, heads, kv_heads, q_len, kv_len, dim = shape
    q, k, v = attention_inputs(batch, heads, kv_heads, q_len, kv_len, dim, dtype=dtype)
    same(
        lambda device, q, k, v: (flash_attention if device == "tpu" else reference_attention)(q, k, v, causal=causal),
        q,
        k,
        v,
        grad=True,
        device_arg=True,
        seed=0,
        **tol,
    )


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((1, 2, 4, 8), (1, 2, 4, 16), (1, 2, 4, 16)), "head dims differ"),
        (((1, 3, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)), "multiple of the number of key/value heads"),
        (((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 5, 8)), "differ in batch, heads or length"),
        (((2, 8), (2, 8), (2, 8)), "expected 4-D"),
    ],
)
def test_flash_bad_shapes_raise(shapes, message):
    q, k, v = (torch.randn(s).to("tpu") for s in shapes)
    with pytest.raises(RuntimeError, match=message):
        flash_attention(q, k, v)


def test_flash_bad_dtypes_raise():
    q = torch.randn(1, 2, 4, 8).to("tpu")
    with pytest.raises(RuntimeError, match="same dtype"):
        flash_attention(q, q.bfloat16(), q)
    with pytest.raises(RuntimeError, match="not supported"):
        flash_attention(q.double(), q.double(), q.double())
    with pytest.raises(RuntimeError, match="one tpu device"):
        flash_attention(q.cpu(), q.cpu(), q.cpu())


def test_sdpa_routes_causal_gqa_to_flash(monkeypatch, capfd):
    # Causal with fewer queries than keys (top-left aligned, as the math path) and grouped heads.
    monkeypatch.setenv("TORCH_TPU_DEBUG", "1")
    monkeypatch.setenv("TORCH_TPU_PALLAS_ON_CPU", "1")  # the interpreted Pallas kernel, not the XLA attention
    q, k, v = attention_inputs(1, 2, 1, 5, 12, 8)
    torch_tpu.metrics.reset()
    same(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        q,
        k,
        v,
        grad=True,
        seed=0,
        **F32_TOL,
    )
    counters = torch_tpu.metrics.counters()
    assert counters.get("sdpa_flash") == 1 and not counters.get("sdpa_math")
    assert "sdpa: flash attention" in capfd.readouterr().err


@pytest.mark.cpu_client
@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, F32_TOL), (torch.bfloat16, BF16_TOL)], ids=["float32", "bfloat16"]
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_on_the_cpu_client_takes_the_fused_xla_attention(monkeypatch, capfd, dtype, tol, causal):
    # Pallas only interprets on the CPU client: the fused path is one XLA op there, same results.
    monkeypatch.setenv("TORCH_TPU_DEBUG", "1")
    monkeypatch.delenv("TORCH_TPU_PALLAS_ON_CPU", raising=False)
    q, k, v = attention_inputs(2, 4, 2, 5, 7, 8, v_dim=16, dtype=dtype)
    torch_tpu.metrics.reset()
    same(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3, enable_gqa=True),
        q,
        k,
        v,
        grad=True,
        seed=0,
        **tol,
    )
    counters = torch_tpu.metrics.counters()
    assert counters.get("sdpa_xla") == 1 and not counters.get("sdpa_flash") and not counters.get("sdpa_math")
    assert "sdpa: fused XLA attention" in capfd.readouterr().err


def test_sdpa_takes_the_xla_attention_where_the_kernel_fails_to_compile(monkeypatch, capfd):
    # A Mosaic or VMEM failure of the kernel must not fail SDPA: that signature takes the XLA
    # attention from then on (the kernel is not tried again), counted and logged.
    monkeypatch.setenv("TORCH_TPU_DEBUG", "1")
    monkeypatch.setenv("TORCH_TPU_PALLAS_ON_CPU", "1")
    monkeypatch.setattr(sdpa, "_kernel_failed", set())
    tries = []

    def failing(*args):
        tries.append(len(args))
        raise ValueError("Mosaic failed to compile the kernel (simulated)")

    monkeypatch.setattr(flash, "forward_op", failing)
    monkeypatch.setattr(flash, "backward_op", failing)
    q, k, v = attention_inputs(1, 2, 1, 5, 12, 8)
    for attempt in range(2):
        same(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            q,
            k,
            v,
            grad=True,
            seed=0,
            **F32_TOL,
        )
        failures = torch_tpu.metrics.counters().get("sdpa_kernel_failures")  # (same() resets the counters)
        assert failures == (2 if attempt == 0 else None)
    assert tries == [5, 8], "the kernel is tried once per signature, forward and backward"
    assert "does not compile" in capfd.readouterr().err


def test_sdpa_with_a_mask_takes_the_math_path(monkeypatch, capfd):
    monkeypatch.setenv("TORCH_TPU_DEBUG", "1")
    q, k, v = attention_inputs(1, 2, 2, 5, 12, 8)
    mask = torch.randn(5, 12)
    same(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask, grad=True, seed=0)
    counters = torch_tpu.metrics.counters()
    assert counters.get("sdpa_math") == 1 and not counters.get("sdpa_flash")
    assert "sdpa: math path: attn_mask" in capfd.readouterr().err


def test_sdpa_kernel_math_forces_the_math_path():
    q, k, v = (t.to("tpu") for t in attention_inputs(1, 2, 1, 5, 12, 8))
    torch_tpu.metrics.reset()
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch_tpu.metrics.counters().get("sdpa_math") == 1
    expected = reference_attention(q.cpu(), k.cpu(), v.cpu(), causal=True)
    torch.testing.assert_close(out.cpu(), expected, **F32_TOL)


def test_sdpa_with_only_flash_enabled_and_a_mask_raises():
    q = torch.randn(1, 2, 4, 8).to("tpu")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), pytest.raises(RuntimeError, match="No viable backend"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4).to("tpu"))


class _CausalSelfAttention(torch.nn.Module):
    def __init__(self, width: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c)).pow(2).mean()


def test_compiled_graphs_hold_the_flash_kernel(monkeypatch, fresh_dynamo):
    # Where the kernel compiles (TORCH_TPU_PALLAS_ON_CPU=1 stands in for a TPU here), a compiled
    # graph's SDPA is the flash kernel, forward and backward: the attention matrix never reaches
    # memory between them. Gradients as CPU's.
    monkeypatch.setenv("TORCH_TPU_PALLAS_ON_CPU", "1")
    torch.manual_seed(0)
    model = _CausalSelfAttention()
    tpu_model = _CausalSelfAttention().to("tpu")
    tpu_model.load_state_dict(model.state_dict())
    x = torch.randn(2, 20, 32)
    model(x).backward()
    torch_tpu.metrics.reset()
    loss = torch.compile(tpu_model, backend="tpu")(x.to("tpu"))
    loss.backward()
    counters = torch_tpu.metrics.counters()
    assert counters.get("sdpa_flash", 0) >= 1 and not counters.get("sdpa_math"), counters
    assert counters["graph_compiles"] == 2  # forward and backward, not split
    for (name, p), p_tpu in zip(model.named_parameters(), tpu_model.parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=name)
