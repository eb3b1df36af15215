"""The fast-path transformer ops (nn.MultiheadAttention, nn.TransformerEncoderLayer and
nn.TransformerEncoder in eval) run natively on tpu and equal CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers import native_only, platform_tol, same_error

D, H = 16, 4


def _pair(module: nn.Module):
    torch.manual_seed(0)
    return module.eval(), copy.deepcopy(module).to("tpu").eval()


class _OpsSeen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.name())
        return func(*args, **(kwargs or {}))


def _run(cpu_fn, tpu_fn, op=None, **tol):
    """cpu_fn() equals tpu_fn(), which runs natively and calls aten `op` (the fast path) when given;
    within platform_tol(tol) (attention's softmax: TPU's exp differs from CPU's)."""
    seen = _OpsSeen()
    with torch.no_grad():
        expected = cpu_fn()
        with seen:
            got = native_only(tpu_fn)
    if op is not None:
        assert f"aten::{op}" in seen.ops, sorted(seen.ops)
    expected, got = (expected, got) if isinstance(expected, tuple) else ((expected,), (got,))
    for e, g in zip(expected, got):
        if e is None:
            assert g is None
        else:
            assert g.device.type == "tpu"
            torch.testing.assert_close(g.cpu(), e, equal_nan=True, **platform_tol(tol))


def _masks(kind: str, b: int = 2, length: int = 5):
    attn = key = None
    if kind in ("attn_bool", "both"):
        attn = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)
    if kind == "attn_float":
        attn = torch.triu(torch.full((length, length), float("-inf")), 1)
    if kind in ("key", "both", "key_full"):
        key = torch.zeros(b, length, dtype=torch.bool)
        key[1, 3:] = True
        if kind == "key_full":
            key[0] = True  # a fully masked row: NaN, as on CPU
    return attn, key


def _tpu(x):
    return None if x is None else x.to("tpu")


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("masks", ["none", "attn_bool", "attn_float", "key", "both", "key_full"])
def test_multihead_attention(masks, need_weights, average):
    cpu, tpu = _pair(nn.MultiheadAttention(D, H, batch_first=True))
    x = torch.randn(2, 5, D)
    attn, key = _masks(masks)
    xt = x.to("tpu")
    _run(
        lambda: cpu(
            x, x, x, attn_mask=attn, key_padding_mask=key, need_weights=need_weights, average_attn_weights=average
        ),
        lambda: tpu(
            xt,
            xt,
            xt,
            attn_mask=_tpu(attn),
            key_padding_mask=_tpu(key),
            need_weights=need_weights,
            average_attn_weights=average,
        ),
        op=None if masks == "attn_float" else "_native_multi_head_attention",
    )


def test_native_multi_head_attention_separate_key_value():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, D).unbind(0)
    params = [torch.randn(3 * D, D), torch.randn(3 * D), torch.randn(D, D), torch.randn(D)]
    mha = torch.ops.aten._native_multi_head_attention.default
    _run(
        lambda: mha(q, k, v, D, H, *params),
        lambda: mha(*[t.to("tpu") for t in (q, k, v)], D, H, *[p.to("tpu") for p in params]),
    )


def test_native_multi_head_attention_errors():
    torch.manual_seed(0)
    w, b = torch.randn(3 * D, D), torch.randn(3 * D)
    pw, pb = torch.randn(D, D), torch.randn(D)
    mha = torch.ops.aten._native_multi_head_attention.default
    x = torch.randn(2, 5, D)
    same_error(lambda x, w, b, pw, pb: mha(x[0], x[0], x[0], D, H, w, b, pw, pb), x, w, b, pw, pb)
    same_error(lambda x, w, b, pw, pb: mha(x, x, x, D, 3, w, b, pw, pb), x, w, b, pw, pb)
    bad_mask = torch.zeros(2, 4, dtype=torch.bool)
    same_error(lambda x, m, w, b, pw, pb: mha(x, x, x, D, H, w, b, pw, pb, m, True, True, 1), x, bad_mask, w, b, pw, pb)


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
@pytest.mark.parametrize("masks", ["none", "attn_bool", "key", "both"])
def test_transformer_encoder_layer(norm_first, activation, masks):
    layer = nn.TransformerEncoderLayer(
        D, H, 32, dropout=0.0, activation=activation, norm_first=norm_first, batch_first=True
    )
    cpu, tpu = _pair(layer)
    x = torch.randn(2, 5, D)
    attn, key = _masks(masks)
    _run(
        lambda: cpu(x, src_mask=attn, src_key_padding_mask=key),
        lambda: tpu(x.to("tpu"), src_mask=_tpu(attn), src_key_padding_mask=_tpu(key)),
        op="_transformer_encoder_layer_fwd",
        rtol=1e-4,
        atol=1e-5,
    )


def test_transformer_encoder_layer_bfloat16():
    cpu, tpu = _pair(nn.TransformerEncoderLayer(D, H, 32, dropout=0.0, batch_first=True).to(torch.bfloat16))
    x = torch.randn(2, 5, D, dtype=torch.bfloat16)
    _run(lambda: cpu(x), lambda: tpu(x.to("tpu")), op="_transformer_encoder_layer_fwd", rtol=2e-2, atol=2e-2)


def test_transformer_encoder_nested_padding():
    """enable_nested_tensor: the padded batch runs as a NestedTensor and pads come back 0, as on CPU."""
    layer = nn.TransformerEncoderLayer(D, H, 32, dropout=0.0, batch_first=True)
    cpu, tpu = _pair(nn.TransformerEncoder(layer, 2, enable_nested_tensor=True))
    x = torch.randn(3, 6, D)
    key = torch.zeros(3, 6, dtype=torch.bool)
    key[1, 4:] = True
    key[2, 1:] = True
    _run(
        lambda: cpu(x, src_key_padding_mask=key),
        lambda: tpu(x.to("tpu"), src_key_padding_mask=key.to("tpu")),
        op="_nested_tensor_from_mask",
        rtol=1e-4,
        atol=1e-5,
    )
    gap = key.clone()
    gap[0, 2] = True  # not left aligned: CPU takes the dense path
    _run(
        lambda: cpu(x, src_key_padding_mask=gap),
        lambda: tpu(x.to("tpu"), src_key_padding_mask=gap.to("tpu")),
        rtol=1e-4,
        atol=1e-5,
    )


def test_nested_tensor_from_mask_errors():
    x = torch.randn(2, 4, D)
    gap = torch.tensor([[True, False, True, True], [True, True, False, False]])
    same_error(lambda x, m: torch._nested_tensor_from_mask(x, m), x, gap)
    same_error(lambda x, m: torch._nested_tensor_from_mask(x, m), x, gap.float())
    assert torch._nested_tensor_from_mask_left_aligned(x.to("tpu"), gap.to("tpu")) is False
    assert torch._nested_tensor_from_mask_left_aligned(x.to("tpu"), gap.sort(dim=1, descending=True).values.to("tpu"))


class _Block(nn.Module):
    """torchvision's ViT EncoderBlock: pre-norm MultiheadAttention (need_weights=False) and a GELU MLP."""

    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.self_attention = nn.MultiheadAttention(D, H, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 32), nn.GELU(), nn.Linear(32, D))

    def forward(self, x):
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class _ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, D, kernel_size=4, stride=4)
        self.class_token = nn.Parameter(torch.randn(1, 1, D))
        self.pos_embedding = nn.Parameter(torch.randn(1, 5, D))
        self.layers = nn.Sequential(_Block(), _Block())
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, 10)

    def forward(self, img):
        x = self.conv_proj(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        return self.head(self.ln(self.layers(x))[:, 0])


def test_vit_eval():
    cpu, tpu = _pair(_ViT())
    img = torch.randn(2, 3, 8, 8)
    _run(lambda: cpu(img), lambda: tpu(img.to("tpu")), op="_native_multi_head_attention", rtol=1e-4, atol=1e-5)
