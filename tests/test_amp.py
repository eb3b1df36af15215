"""Mixed precision on tpu against CPU: autocast (CUDA's policy), GradScaler, torch.tpu.amp,
the float32 matmul precision and bf16 numerics (Python scalars in opmath)."""

from __future__ import annotations

import copy
import math

import jax
import jax.numpy as jnp
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import torch_tpu
from examples.mingpt.model import GPT, GPTConfig
from tests.helpers import platform_rounding_tol
from torch_tpu.ops import autocast_linear
from torch_tpu.ops.lowerings import linalg
from torch_tpu.testing.models import TINY_LLAMA

# Where CUDA's policy (tpu's) and CPU's differ in minGPT, the dtype CUDA's gives: softmax and
# layer_norm run in float32 on CUDA (bfloat16 on CPU); cross_entropy's log_softmax gets an explicit
# dtype, so CUDA keeps it in bfloat16 and casts for nll_loss (CPU casts before log_softmax).
CUDA_POLICY_DTYPES = {"_softmax": torch.float32, "native_layer_norm": torch.float32, "_log_softmax": torch.bfloat16}


class _DtypeLog(TorchDispatchMode):
    """Records (op, output dtypes) of every op that produces floating tensors."""

    def __init__(self):
        super().__init__()
        self.log: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = out if isinstance(out, (tuple, list)) else (out,)
        dtypes = tuple(t.dtype for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point())
        if dtypes:
            self.log.append((func.overloadpacket.__name__, dtypes))
        return out


def _mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def _gpt():
    return GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=32))


def _mlp_loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def _gpt_loss(model, batch):
    idx, targets = batch
    return model(idx, targets)[1]


def _batches(kind, steps):
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(steps)]
    return [tuple(torch.randint(0, 32, (4, 16), generator=g) for _ in range(2)) for _ in range(steps)]


def _train(model, loss_fn, batches, device, compiled=False, dtype=torch.bfloat16):
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step_loss = torch.compile(loss_fn, backend="tpu") if compiled else loss_fn
    losses = []
    for batch in batches:
        batch = tuple(t.to(device) for t in batch)
        with torch.autocast(device, dtype=dtype):
            loss = step_loss(model, batch)
        assert loss.dtype == torch.float32
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _dtype_log(model, loss_fn, batch, device):
    model = copy.deepcopy(model).to(device)
    batch = tuple(t.to(device) for t in batch)
    with torch.autocast(device, dtype=torch.bfloat16), _DtypeLog() as mode:
        loss_fn(model, batch)
    return mode.log


# ---- autocast ----------------------------------------------------------------


def test_default_dtype_and_supported():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    with torch.autocast("tpu"):
        out = nn.functional.linear(torch.randn(2, 3, device="tpu"), torch.randn(4, 3, device="tpu"))
    assert out.dtype == torch.bfloat16


def test_policy_is_cuda_policy():
    """Every op with a CUDA autocast kernel has a tpu one (but cuDNN's own), and no other op does."""
    names = {"AutocastCUDA": set(), "AutocastPrivateUse1": set()}
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        for key, found in names.items():
            if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
                found.add(name)
    cudnn = {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose"}
    assert names["AutocastPrivateUse1"] == names["AutocastCUDA"] - cudnn
    assert {"aten::linear", "aten::softmax.int", "aten::layer_norm"} <= names["AutocastPrivateUse1"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_policy_lists(dtype):
    a = torch.randn(4, 8, device="tpu")
    b = torch.randn(8, 4, device="tpu")
    with torch.autocast("tpu", dtype=dtype):
        assert (a @ b).dtype == dtype  # lower precision list
        assert torch.addmm(a[:, :4], a, b).dtype == dtype
        low = (a @ b).float().to(dtype)
        assert torch.softmax(low, -1).dtype == torch.float32  # fp32 list (set_opt_dtype)
        assert F.layer_norm(low, (4,)).dtype == torch.float32
        assert torch.exp(low).dtype == torch.float32
        assert (low + 1).dtype == dtype  # falls through
        assert torch.addcmul(a, low.repeat(1, 2), a).dtype == torch.float32  # promote
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(torch.rand(3, device="tpu"), torch.rand(3, device="tpu"))
    with torch.autocast("tpu", dtype=dtype, enabled=False):
        assert (a @ b).dtype == torch.float32


@pytest.fixture
def unfused_linear(monkeypatch):
    """Autocast's linear as its casts and product, the ops CPU's log lists (the fused op's own
    results are tests/test_autocast_linear.py's)."""
    monkeypatch.setattr(autocast_linear, "FUSED", False)


def test_mlp_dtypes_match_cpu_op_by_op(unfused_linear):
    model, batch = _mlp(), _batches("mlp", 1)[0]
    cpu = _dtype_log(model, _mlp_loss, batch, "cpu")
    tpu = _dtype_log(model, _mlp_loss, batch, "tpu")
    assert [op for op, _ in tpu if op in ("addmm", "mm", "mse_loss")]
    assert tpu == cpu


def test_mingpt_dtypes_match_cpu_op_by_op(unfused_linear):
    """CPU autocast's dtypes, except where CUDA's policy (tpu's) differs from CPU's."""
    model, batch = _gpt(), _batches("gpt", 1)[0]
    cpu = _dtype_log(model, _gpt_loss, batch, "cpu")
    tpu = _dtype_log(model, _gpt_loss, batch, "tpu")
    compute = {"addmm", "mm", "bmm", "_softmax", "native_layer_norm", "gelu", "_log_softmax", "nll_loss_forward"}
    cpu_ops = [(op, d) for op, d in cpu if op in compute]
    tpu_ops = [(op, d) for op, d in tpu if op in compute]
    assert [op for op, _ in tpu_ops] == [op for op, _ in cpu_ops]
    for (op, tpu_dtypes), (_, cpu_dtypes) in zip(tpu_ops, cpu_ops):
        if op in CUDA_POLICY_DTYPES:
            assert tpu_dtypes[0] == CUDA_POLICY_DTYPES[op], op
        else:
            assert tpu_dtypes == cpu_dtypes, op
    assert ("addmm", (torch.bfloat16,)) in tpu_ops


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_mlp_losses_match_cpu(compiled):
    model, batches = _mlp(), _batches("mlp", 20)
    cpu = _train(model, _mlp_loss, batches, "cpu")
    tpu = _train(model, _mlp_loss, batches, "tpu", compiled=compiled)
    torch.testing.assert_close(torch.tensor(tpu), torch.tensor(cpu), rtol=2e-2, atol=2e-2)
    assert tpu[-1] < tpu[0]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_mingpt_losses_match_cpu(compiled):
    model, batches = _gpt(), _batches("gpt", 20)
    cpu = _train(model, _gpt_loss, batches, "cpu")
    tpu = _train(model, _gpt_loss, batches, "tpu", compiled=compiled)
    torch.testing.assert_close(torch.tensor(tpu), torch.tensor(cpu), rtol=2e-2, atol=2e-2)
    assert tpu[-1] < tpu[0]


def test_compiled_graph_is_autocast(monkeypatch):
    """Dynamo traces autocast: the ATen graph the tpu backend gets has bf16 matmuls."""
    from torch_tpu.compile import graph

    graphs = []
    init = graph.GraphRunner.__init__

    def capture(self, gm, *args, **kwargs):
        graphs.append(gm)
        init(self, gm, *args, **kwargs)

    monkeypatch.setattr(graph.GraphRunner, "__init__", capture)
    torch._dynamo.reset()
    model = _mlp().to("tpu")

    @torch.compile(backend="tpu")
    def forward(x):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            return model(x)

    with torch.no_grad():
        out = forward(torch.randn(8, 16, device="tpu"))
    assert out.dtype == torch.bfloat16
    nodes = [n for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    matmuls = (torch.ops.aten.addmm.default, torch.ops.aten.mm.default)
    matmul_dtypes = {n.meta["val"].dtype for n in nodes if n.target in matmuls}
    assert matmul_dtypes == {torch.bfloat16}


def test_tpu_amp_mirrors_cuda_amp():
    with torch.tpu.amp.autocast():
        assert torch.is_autocast_enabled("tpu")
        assert torch.get_autocast_dtype("tpu") == torch.bfloat16
        out = torch.randn(2, 3, device="tpu") @ torch.randn(3, 2, device="tpu")
    assert out.dtype == torch.bfloat16
    with torch.tpu.amp.autocast(dtype=torch.float16):
        assert (torch.randn(2, 3, device="tpu") @ torch.randn(3, 2, device="tpu")).dtype == torch.float16
    model = nn.Linear(4, 4).to("tpu")

    @torch.compile(backend="tpu", fullgraph=True)
    def forward(x):
        with torch.tpu.amp.autocast():
            return model(x)

    assert forward(torch.randn(2, 4, device="tpu")).dtype == torch.bfloat16
    assert isinstance(torch.tpu.amp.GradScaler(), torch.amp.GradScaler)
    assert torch.tpu.amp.GradScaler()._device == "tpu"


# ---- GradScaler ----------------------------------------------------------------


def _scaler_run(device, dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
    x = torch.randn(6, 8).to(device)
    scales, weights = [], []
    for step in range(5):
        with torch.autocast(device, dtype=dtype):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        if step == 2:
            model[0].weight.grad[0, 0] = float("inf")
        before = model[0].weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
        weights.append(torch.equal(before.cpu(), model[0].weight.detach().cpu()))
    return scales, weights, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_grad_scaler_skips_inf_step_like_cpu(dtype):
    cpu_scales, cpu_skipped, cpu_params = _scaler_run("cpu", dtype)
    tpu_scales, tpu_skipped, tpu_params = _scaler_run("tpu", dtype)
    assert tpu_scales == cpu_scales == [256.0, 512.0, 256.0, 256.0, 512.0]
    assert tpu_skipped == cpu_skipped == [False, False, True, False, False]
    for t, c in zip(tpu_params, cpu_params):
        torch.testing.assert_close(t, c, rtol=2e-2, atol=2e-3)


def test_unscale_and_update_scale_ops_match_cpu():
    grads = [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([[8.0, float("nan")]], dtype=torch.bfloat16)]
    for device_grads, inject in ((grads[:1], False), (grads, True)):
        results = []
        for device in ("cpu", "tpu"):
            g = [t.clone().to(device) for t in device_grads]
            found = torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(g, found, torch.full((1,), 0.25, device=device))
            results.append(([t.cpu() for t in g], found.cpu()))
        assert results[1][1].item() == results[0][1].item() == float(inject)
        for t, c in zip(results[1][0], results[0][0]):
            torch.testing.assert_close(t, c, equal_nan=True)
    for found_inf, tracker, interval in ((0.0, 1, 2), (0.0, 0, 3), (1.0, 1, 2)):
        results = []
        for device in ("cpu", "tpu"):
            scale = torch.full((1,), 1024.0, device=device)
            growth = torch.full((1,), tracker, dtype=torch.int32, device=device)
            torch._amp_update_scale_(scale, growth, torch.full((1,), found_inf, device=device), 2.0, 0.5, interval)
            results.append((scale.item(), growth.item()))
        assert results[0] == results[1]


# ---- matmul precision ---------------------------------------------------------


@pytest.fixture
def restore_precision():
    old = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(old)


def _lowered_dot(fn, *shapes):
    args = [jnp.ones(s, jnp.float32) for s in shapes]
    fresh = jax.jit(lambda *a: fn(*a))  # a new function: jax caches traces per function
    return [line for line in fresh.lower(*args).as_text().splitlines() if "dot_general" in line]


def test_matmul_precision_lowers_to_xla_precision(restore_precision):
    for setting, level in (("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")):
        torch.set_float32_matmul_precision(setting)
        lines = _lowered_dot(linalg.mm, (4, 8), (8, 4)) + _lowered_dot(linalg.bmm, (2, 4, 8), (2, 8, 4))
        assert lines and all(f"precision = [{level}, {level}]" in line for line in lines), (setting, lines)
    torch.set_float32_matmul_precision("medium")  # only float32 follows it
    half = jnp.ones((4, 8), jnp.bfloat16)
    half = jax.jit(lambda a, b: linalg.mm(a, b)).lower(half, half.T).as_text()
    assert "precision = [HIGHEST, HIGHEST]" in half


def test_matmul_precision_is_part_of_the_cache_keys(restore_precision):
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    ta, tb = a.to("tpu"), b.to("tpu")
    f = torch.compile(lambda x, y: x @ y + 1, backend="tpu")
    torch.set_float32_matmul_precision("highest")
    torch.testing.assert_close((ta @ tb).cpu(), a @ b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f(ta, tb).cpu(), a @ b + 1, rtol=1e-5, atol=1e-5)
    torch.set_float32_matmul_precision("medium")
    torch_tpu.metrics.reset()
    ta @ tb
    assert torch_tpu.metrics.counters()["op_compiles"] == 1
    torch_tpu.metrics.reset()
    f(ta, tb)
    counters = torch_tpu.metrics.counters()  # a new executable (compiled or from the disk cache)
    assert counters["graph_cache_hits"] == 0
    assert counters["graph_compiles"] + counters["persistent_cache_hits"] >= 1
    torch_tpu.metrics.reset()
    ta @ tb
    f(ta, tb)
    counters = torch_tpu.metrics.counters()
    assert counters["op_compiles"] == counters["graph_compiles"] == 0


# ---- bf16 numerics like CPU's ---------------------------------------------------


def _assert_float32_rounding_apart(got: torch.Tensor, want: torch.Tensor, case, terms=None) -> None:
    """A half-float result as CPU's up to a float32 last-bit difference (a TPU's): that flips the
    half-float rounding of rare elements, each by one unit in the last place, so at most 1% may
    differ. A Python scalar rounded to the half dtype before use changes 4-40% of them, some by more
    (test_the_tpu_check_of_opmath_fails_a_scalar_rounded_to_the_half_dtype). `terms`: for a sum
    of float32 terms (addmm's beta * self + alpha * product), the sum of their magnitudes, whose
    float32 last bits a result smaller than them (cancellation) may exceed one ulp by. Such an
    element flips often, so each adds its chance to the count allowed (a v5e flipped 2 of
    _addmm's 64 float16 results, whose sums differed in the last bits: 1% of 64 allowed one)."""
    eps, tiny = torch.finfo(want.dtype).eps, torch.finfo(want.dtype).tiny
    atol = eps * tiny  # a subnormal's ulp
    allowed = max(1, want.numel() // 100)
    if terms is not None:
        last_bits = 8 * torch.finfo(torch.float32).eps * terms
        atol = atol + last_bits
        # the chance that a difference of up to last_bits crosses a half-float rounding boundary
        chance = (2 * last_bits / (eps * want.float().abs()).clamp_min(tiny)).clamp(max=1)
        allowed += math.ceil(chance.sum().item())
    within_ulp = (got.float() - want.float()).abs() <= eps * want.float().abs() + atol
    assert within_ulp.all(), (case, "off by more than one unit in the last place")
    differ = (got != want).sum().item()
    assert differ <= allowed, (case, f"{differ} of {want.numel()} elements differ ({allowed} allowed)")


def _addmm(t, u, beta, alpha):
    return torch.addmm(t[:64].view(8, 8), t[:64].view(8, 8), u[:64].view(8, 8), beta=beta, alpha=alpha)


def _addmm_terms(t, u, beta, alpha):
    """|beta * self| + |alpha| * (|mat1| @ |mat2|) of _addmm, in float32 on the CPU."""
    a, b = t[:64].view(8, 8).cpu().float().abs(), u[:64].view(8, 8).cpu().float().abs()
    return abs(beta) * a + abs(alpha) * (a @ b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_tpu_check_of_opmath_fails_a_scalar_rounded_to_the_half_dtype(dtype):
    """On the CPU: _assert_float32_rounding_apart can fail the bug the test below looks for."""
    x, y = torch.randn(4096).to(dtype), torch.randn(4096).to(dtype)
    cases = [
        (lambda t, u, s: t * s[0], (0.1234567,), None),
        (lambda t, u, s: _addmm(t, u, *s), (-4.775, 2.0315), _addmm_terms),
        (lambda t, u, s: torch.lerp(t, u, s[0]), (0.05,), None),
    ]
    for i, (fn, scalars, terms_of) in enumerate(cases):
        want = fn(x, y, scalars)
        terms = terms_of(x, y, *scalars) if terms_of else None
        _assert_float32_rounding_apart(want.clone(), want, i, terms)
        rounded = [torch.tensor(s, dtype=dtype).item() for s in scalars]
        with pytest.raises(AssertionError):
            _assert_float32_rounding_apart(fn(x, y, rounded), want, i, terms)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_python_scalars_stay_in_opmath(dtype):
    x = torch.randn(4096).to(dtype)
    y = torch.randn(4096).to(dtype)
    cases = [
        lambda t, u: t * 0.1234567,
        lambda t, u: 0.1234567 * t,
        lambda t, u: t * torch.tensor(0.1234567).to(t.device),
        lambda t, u: t.clone().mul_(1 - 0.02 * 0.01),
        lambda t, u: 0.1234567 / t,
        lambda t, u: torch.add(t, u, alpha=-0.0123456),
        lambda t, u: _addmm(t, u, beta=-4.775, alpha=2.0315),
        lambda t, u: torch.lerp(t, u, 0.05),
    ]
    terms = {6: _addmm_terms(x, y, beta=-4.775, alpha=2.0315)}
    for i, fn in enumerate(cases):
        got, want = fn(x.to("tpu"), y.to("tpu")).cpu(), fn(x, y)
        if torch_tpu.platform() == "tpu":
            _assert_float32_rounding_apart(got, want, i, terms.get(i))
        else:
            assert torch.equal(got, want), i


def test_muon_bit_exact_in_bf16():
    w = torch.randn(16, 32).bfloat16()
    grads = [torch.randn(16, 32).bfloat16() for _ in range(3)]
    results = []
    for device in ("cpu", "tpu"):
        p = nn.Parameter(w.clone().to(device))
        opt = torch.optim.Muon([p], lr=0.02, weight_decay=0.01)
        for g in grads:
            p.grad = g.to(device)
            opt.step()
        results.append(p.detach().cpu())
    if torch_tpu.platform() == "tpu":
        # The MXU sums the Newton-Schulz bf16 matmuls in another order than CPU's, and each of the
        # five per step rounds to bf16, so a one-ulp difference carries: each weight within two bf16
        # ulps (measured on a v5e: 6 of 512 by two; a wrong lr, momentum, step count or coefficient
        # moves many by more).
        torch.testing.assert_close(results[1], results[0], **platform_rounding_tol(torch.bfloat16, roundings=2))
    else:
        assert torch.equal(results[0], results[1])


# ---- device queries ---------------------------------------------------------------


def test_bf16_supported_and_capability():
    assert torch.tpu.is_bf16_supported() is True
    major, minor = torch.tpu.get_device_capability()
    assert isinstance(major, int) and isinstance(minor, int)
    if torch.tpu.get_device_properties().platform == "cpu":
        assert (major, minor) == (0, 0)
    dtypes = torch.accelerator.get_device_capability("tpu:0")["supported_dtypes"]
    assert {torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool} <= dtypes
    assert torch.qint8 not in dtypes


def test_hf_llama_autocast_steps_match_cpu():
    """Trainer(bf16=True)'s training step (accelerate is not installed here): 5 AdamW steps of a tiny
    Llama under torch.autocast(bfloat16), against CPU's autocast."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**TINY_LLAMA)
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    losses = {}
    for device in ("cpu", "tpu"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        losses[device] = []
        for _ in range(5):
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = m(input_ids=ids.to(device), labels=ids.to(device)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[device].append(loss.item())
    torch.testing.assert_close(torch.tensor(losses["tpu"]), torch.tensor(losses["cpu"]), rtol=2e-2, atol=2e-2)
    assert losses["tpu"][-1] < losses["tpu"][0]


def test_precision_options_from_the_environment():
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCH_TPU_MATMUL_PRECISION="medium", TORCH_TPU_ALLOW_EXCESS_PRECISION="0")
    env.pop("XLA_FLAGS", None)
    code = "import os, torch, torch_tpu; print(torch.get_float32_matmul_precision(), os.environ['XLA_FLAGS'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    precision, *flags = out.stdout.split()
    assert precision == "medium" and "--xla_allow_excess_precision=false" in flags
    env["TORCH_TPU_MATMUL_PRECISION"] = "fast"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "TORCH_TPU_MATMUL_PRECISION='fast'" in out.stderr


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_reductions_accumulate_in_float32_like_cpu(dtype):
    x = torch.randn(4, 300).to(dtype)
    exact = {
        "sum": lambda t: t.sum(-1),
        "mean": lambda t: t.mean(-1),
        "norm": lambda t: t.norm(dim=-1),
        "var": lambda t: t.var(-1),
        "mm": lambda t: t @ t.T,
    }
    for name, fn in exact.items():
        assert torch.equal(fn(x.to("tpu")).cpu(), fn(x)), name
    # float32 inside too, but XLA orders the adds (and exp/log) differently: within an ulp or so
    close = {
        "cumsum": lambda t: t.cumsum(-1),
        "softmax": lambda t: t.softmax(-1),
        "layer_norm": lambda t: F.layer_norm(t, (300,)),
        "logsumexp": lambda t: t.logsumexp(-1),
    }
    for name, fn in close.items():
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), fn(x), rtol=1e-2, atol=1e-2, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_sort_values_like_cpu_and_stable_order(dtype):
    """Values equal CPU's; among ties tpu gives the stable order (CPU's stable=True order: CPU's
    unstable order is its std::sort's, which tpu does not reproduce)."""
    x = torch.randn(3, 200).to(dtype)
    x[1, 5:40] = 0.0
    for descending in (False, True):
        values, indices = torch.sort(x.to("tpu"), dim=-1, descending=descending)
        cpu_values, cpu_indices = torch.sort(x, dim=-1, descending=descending, stable=True)
        assert torch.equal(values.cpu(), cpu_values) and torch.equal(indices.cpu(), cpu_indices)
    top = torch.topk(x.to("tpu"), 50, dim=-1)
    assert torch.equal(top.values.cpu(), torch.topk(x, 50, dim=-1).values)
