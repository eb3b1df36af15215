"""The models of benchmarks/tpu_training.py, in plain PyTorch and mirrored by hand in jax.

- GPT: nanoGPT-style (pre-LN blocks, fused qkv Linear, `F.scaled_dot_product_attention(is_causal=True)`,
  exact GELU MLP, biases, untied head); 12 layers, 768 wide, 12 heads, vocab 50,304, sequence
  1,024: 163M parameters.
- ResNet-50 (torchvision's v1.5 layout: stride on the 3x3 conv), BatchNorm in training mode.

The jax functions do the math torch's autocast (CUDA's policy, which tpu follows) does with
fp32 parameters: matmuls and convolutions in bfloat16 (weights cast per use), layer norm,
softmax and the loss in float32, BatchNorm statistics in float32 with a bfloat16 result.
Parameters are the torch state dict's tensors under the same names (conv weights as HWIO: the
jax ResNet runs NHWC, as jax users write it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

LR, BETAS, EPS, WEIGHT_DECAY = 3e-4, (0.9, 0.95), 1e-8, 0.1


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50304
    block_size: int = 1024


GPT_TINY = GPTConfig(n_layer=2, n_head=4, n_embd=128, vocab_size=512, block_size=64)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token ids (B, T) and targets (B, T) -> mean cross-entropy loss."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of the residual projections
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))
            elif name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    widths: tuple[int, ...] = (64, 128, 256, 512)
    depths: tuple[int, ...] = (3, 4, 6, 3)
    stem: int = 64
    num_classes: int = 1000
    image_size: int = 224


RESNET_TINY = ResNetConfig(widths=(8, 16), depths=(1, 1), stem=8, num_classes=10, image_size=32)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """Images (B, 3, H, W) -> class logits (B, num_classes)."""

    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        self.cfg = cfg
        self.conv1 = nn.Conv2d(3, cfg.stem, 7, 2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(cfg.stem)
        stages, cin = [], cfg.stem
        for i, (width, depth) in enumerate(zip(cfg.widths, cfg.depths)):
            blocks = []
            for j in range(depth):
                blocks.append(Bottleneck(cin, width, stride=2 if i > 0 and j == 0 else 1))
                cin = width * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layers = nn.ModuleList(stages)
        self.fc = nn.Linear(cin, cfg.num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, padding=1)
        for stage in self.layers:
            x = stage(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def gpt_loss(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x, y)


def resnet_loss(model: ResNet, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def adamw(params) -> torch.optim.AdamW:
    """The benchmark's optimizer, torch's default implementation for the device (foreach on tpu)."""
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)


# ---- workloads: a model, its batch size, its batches and FLOPs ----------------------------


@dataclasses.dataclass
class Workload:
    model: str  # "gpt" or "resnet50"
    batch: int
    label: str  # "4x1024", "128x224²"
    items: int  # tokens or images per step
    unit: str
    flops: int  # model FLOPs per step
    formula: str
    n_params: int
    base: nn.Module  # on CPU, float32: every mode starts from a copy
    cfg: Any
    loss_of: Callable  # loss_of(model, x, y)
    batches: list  # (x, y) CPU tensors, one per step


def workloads(models: list[str], gpt_batches: list[int], image_batch: int, tiny: bool, n_steps: int) -> list[Workload]:
    out = []
    for name in models:
        torch.manual_seed(0)
        if name == "gpt":
            cfg = GPT_TINY if tiny else GPTConfig()
            base = GPT(cfg)
            n = sum(p.numel() for p in base.parameters())
            per_token = gpt_flops_per_token(cfg, n)
            formula = (
                f"GPT: 6 N + 12 L T d = 6 x {n / 1e6:.2f}M + 12 x {cfg.n_layer} x {cfg.block_size} x {cfg.n_embd}"
                f" = {per_token / 1e9:.4g} GFLOP per token (N: every parameter)"
            )
            for b in gpt_batches:
                g = torch.Generator().manual_seed(b)
                inputs = [torch.randint(0, cfg.vocab_size, (b, cfg.block_size), generator=g) for _ in range(n_steps)]
                batches = [(x, (x + 1) % cfg.vocab_size) for x in inputs]  # learnable, so the losses fall
                items = b * cfg.block_size
                label = f"{b}x{cfg.block_size}"
                out.append(
                    Workload(
                        name, b, label, items, "tokens/s", per_token * items, formula, n, base, cfg, gpt_loss, batches
                    )
                )
        else:
            cfg = RESNET_TINY if tiny else ResNetConfig()
            base = ResNet(cfg)
            n = sum(p.numel() for p in base.parameters())
            per_image = resnet_flops_per_image(cfg)
            b, size = image_batch, cfg.image_size
            formula = (
                f"ResNet: 3 x 2 x multiply-adds of every conv and Linear = {per_image / 1e9:.4g} GFLOP per "
                f"{size}² image ({n / 1e6:.2f}M parameters)"
            )
            g = torch.Generator().manual_seed(b)
            batches = [
                (torch.randn(b, 3, size, size, generator=g), torch.randint(0, cfg.num_classes, (b,), generator=g))
                for _ in range(n_steps)
            ]
            label = f"{b}x{size}²"
            out.append(
                Workload(name, b, label, b, "images/s", per_image * b, formula, n, base, cfg, resnet_loss, batches)
            )
    return out


# ---- FLOPs --------------------------------------------------------------------------


def gpt_flops_per_token(cfg: GPTConfig, n_params: int) -> int:
    """Training FLOPs per token: 6 N + 12 L T d (PaLM's count; N every parameter, as issue 34's figures)."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.block_size * cfg.n_embd


def resnet_flops_per_image(cfg: ResNetConfig) -> int:
    """Training FLOPs per image: 3 x the forward's 2 x multiply-adds of every conv and Linear
    (counted on a meta-device forward; ResNet-50 at 224²: 4.1 G multiply-adds, 8.2 GFLOPs)."""
    with torch.device("meta"):
        model = ResNet(cfg)
    macs = [0]

    def count(module, inputs, output):
        if isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            macs[0] += output[0].numel() * module.in_channels // module.groups * kh * kw
        elif isinstance(module, nn.Linear):
            macs[0] += module.in_features * module.out_features

    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m.register_forward_hook(count)
    model(torch.empty(1, 3, cfg.image_size, cfg.image_size, device="meta"))
    return 3 * 2 * macs[0]


# ---- the same models and AdamW in jax ----------------------------------------------


def jax_params(model: nn.Module, hwio: bool = False) -> tuple[dict, dict]:
    """(parameters, buffers) of `model` as float32 numpy arrays keyed by state-dict name;
    4-d (conv) weights transposed OIHW -> HWIO when `hwio`."""

    def arr(t: torch.Tensor) -> np.ndarray:
        a = t.detach().cpu().float().numpy()
        return a.transpose(2, 3, 1, 0).copy() if hwio and a.ndim == 4 else a

    params = {k: arr(p) for k, p in model.named_parameters()}
    buffers = {k: arr(b) for k, b in model.named_buffers() if not k.endswith("num_batches_tracked")}
    return params, buffers


def _jnp():
    import jax
    import jax.numpy as jnp

    return jax, jnp


def _linear(p: dict, name: str, x, bias: bool = True):
    _, jnp = _jnp()
    y = x.astype(jnp.bfloat16) @ p[name + ".weight"].astype(jnp.bfloat16).T
    return y + p[name + ".bias"].astype(jnp.bfloat16) if bias else y


def _layer_norm(p: dict, name: str, x):
    jax, jnp = _jnp()
    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p[name + ".weight"] + p[name + ".bias"]


def _cross_entropy(logits, targets):
    jax, jnp = _jnp()
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[:, None], axis=1).mean()


def _flash_attention(q, k, v):
    """Causal attention by jax's own Pallas TPU flash kernel; q, k, v (B, T, H, D) bfloat16. The
    kernel is written for 64-bit types off: trace it under `jax.enable_x64(False)` (torch_tpu
    turns them on process-wide)."""
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

    _, jnp = _jnp()
    q, k, v = (jnp.swapaxes(z, 1, 2) for z in (q, k, v))  # (B, H, T, D)
    out = flash_attention(q, k, v, causal=True, sm_scale=1.0 / math.sqrt(q.shape[-1]))
    return jnp.swapaxes(out, 1, 2)


def jax_gpt_loss(cfg: GPTConfig, flash: bool = False):
    """loss(params, idx int32 (B, T), targets int32 (B, T)) -> float32 scalar. `flash`: attention
    by jax's Pallas flash kernel (TPU only), else materialized (einsum and softmax)."""
    jax, jnp = _jnp()
    heads, head_dim = cfg.n_head, cfg.n_embd // cfg.n_head

    def loss(p, idx, targets):
        b, t = idx.shape
        x = p["wte.weight"][idx] + p["wpe.weight"][:t]
        causal = jnp.tril(jnp.ones((t, t), bool))
        for i in range(cfg.n_layer):
            pre = f"h.{i}."
            qkv = _linear(p, pre + "attn.c_attn", _layer_norm(p, pre + "ln_1", x))
            q, k, v = (z.reshape(b, t, heads, head_dim) for z in jnp.split(qkv, 3, axis=-1))
            if flash:
                y = _flash_attention(q, k, v).reshape(b, t, cfg.n_embd)
            else:
                s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(head_dim)
                a = jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1).astype(jnp.bfloat16)
                y = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, cfg.n_embd)
            x = x + _linear(p, pre + "attn.c_proj", y)
            h = jax.nn.gelu(_linear(p, pre + "mlp.c_fc", _layer_norm(p, pre + "ln_2", x)), approximate=False)
            x = x + _linear(p, pre + "mlp.c_proj", h)
        logits = _linear(p, "lm_head", _layer_norm(p, "ln_f", x), bias=False)
        return _cross_entropy(logits.reshape(b * t, -1), targets.reshape(-1))

    return loss


def jax_resnet_loss(cfg: ResNetConfig):
    """loss(params, buffers, images NHWC float32, labels int32) -> (float32 loss, new buffers)."""
    jax, jnp = _jnp()
    lax = jax.lax

    def conv(p, name, x, stride, pad):
        return lax.conv_general_dilated(
            x.astype(jnp.bfloat16),
            p[name + ".weight"].astype(jnp.bfloat16),
            (stride, stride),
            [(pad, pad), (pad, pad)],
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )

    def batch_norm(p, buffers, new_buffers, name, x):
        xf = x.astype(jnp.float32)
        mean = xf.mean((0, 1, 2))
        var = ((xf - mean) ** 2).mean((0, 1, 2))
        n = x.size // x.shape[-1]
        m, v = lax.stop_gradient(mean), lax.stop_gradient(var)
        new_buffers[name + ".running_mean"] = 0.9 * buffers[name + ".running_mean"] + 0.1 * m
        new_buffers[name + ".running_var"] = 0.9 * buffers[name + ".running_var"] + 0.1 * v * (n / (n - 1))
        y = (xf - mean) * lax.rsqrt(var + 1e-5) * p[name + ".weight"] + p[name + ".bias"]
        return y.astype(x.dtype)

    def loss(p, buffers, images, labels):
        new = {}
        relu = jax.nn.relu
        x = relu(batch_norm(p, buffers, new, "bn1", conv(p, "conv1", images, 2, 3)))
        x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), [(0, 0), (1, 1), (1, 1), (0, 0)])
        cin = cfg.stem
        for i, (width, depth) in enumerate(zip(cfg.widths, cfg.depths)):
            for j in range(depth):
                pre, stride = f"layers.{i}.{j}.", 2 if i > 0 and j == 0 else 1
                y = relu(batch_norm(p, buffers, new, pre + "bn1", conv(p, pre + "conv1", x, 1, 0)))
                y = relu(batch_norm(p, buffers, new, pre + "bn2", conv(p, pre + "conv2", y, stride, 1)))
                y = batch_norm(p, buffers, new, pre + "bn3", conv(p, pre + "conv3", y, 1, 0))
                if stride != 1 or cin != width * Bottleneck.expansion:
                    x = batch_norm(p, buffers, new, pre + "downsample.1", conv(p, pre + "downsample.0", x, stride, 0))
                x = relu(y + x)
                cin = width * Bottleneck.expansion
        logits = _linear(p, "fc", x.mean((1, 2)))
        return _cross_entropy(logits, labels), new

    return loss


def jax_adamw(params, grads, m, v, count):
    """torch.optim.AdamW's update (decoupled weight decay on every parameter); count is the
    float32 step number after this step."""
    jax, jnp = _jnp()
    b1, b2 = BETAS
    bc1, bc2 = 1 - b1**count, 1 - b2**count
    m = jax.tree.map(lambda m_, g: b1 * m_ + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, v, grads)

    def update(p, m_, v_):
        return p * (1 - LR * WEIGHT_DECAY) - (LR / bc1) * m_ / (jnp.sqrt(v_) / jnp.sqrt(bc2) + EPS)

    return jax.tree.map(update, params, m, v), m, v
