"""Matrix products, linear algebra and optimizer (_foreach_*, fused) lowerings equal CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torch_tpu
from tests.helpers import compare as _compare
from tests.helpers import native_only, platform_tol


def compare(fn, *inputs, decomposition=False, **kwargs):
    """tests.helpers.compare. decomposition=True (solves, inverses and factorizations: their
    divisions, sqrt and rsqrt): platform_tol widens rtol/atol on a TPU, and only there."""
    tol = {k: kwargs.pop(k) for k in ("rtol", "atol") if k in kwargs}
    return _compare(fn, *inputs, **(platform_tol(tol) if decomposition else tol), **kwargs)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


# ---- matrix products --------------------------------------------------------


@pytest.mark.parametrize(
    "a,b",
    [
        ((3, 4), (4, 5)),
        ((4,), (4,)),
        ((3, 4), (4,)),
        ((4,), (4, 3)),
        ((2, 3, 4), (2, 4, 5)),
        ((2, 3, 4), (4,)),
        ((4,), (2, 4, 3)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((2, 3, 4), (4, 5)),
    ],
)
def test_matmul_shapes(a, b):
    compare(torch.matmul, rand(*a), rand(*b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_mm_dtypes_and_noncontiguous(dtype):
    grad = dtype.is_floating_point
    a = (torch.randn(5, 3) * 4).to(dtype)
    b = (torch.randn(4, 5) * 4).to(dtype)
    compare(lambda a, b: a.t() @ b.t(), a, b, grad=grad)  # transposed operands
    compare(lambda a, b: torch.mm(a[::2], b.t()[:, 1:4]), a.t().contiguous(), b, grad=grad)  # sliced


def test_matmul_bfloat16():
    compare(
        torch.matmul,
        rand(2, 8, 16, dtype=torch.bfloat16),
        rand(16, 4, dtype=torch.bfloat16),
        grad=False,
        rtol=2e-2,
        atol=2e-2,
    )


def test_addmm_family():
    compare(lambda s, a, b: torch.addmm(s, a, b, beta=0.5, alpha=2.0), rand(3, 5), rand(3, 4), rand(4, 5))
    compare(lambda s, a, b: torch.addmm(s, a, b), rand(5), rand(3, 4), rand(4, 5))  # broadcast bias
    nan_self = torch.full((3, 5), float("nan"))
    compare(lambda s, a, b: torch.addmm(s, a, b, beta=0), nan_self, rand(3, 4), rand(4, 5), grad=False)
    compare(lambda s, a, b: torch.baddbmm(s, a, b, beta=0.3, alpha=-1.5), rand(2, 3, 5), rand(2, 3, 4), rand(2, 4, 5))
    compare(lambda s, a, b: torch.addbmm(s, a, b, alpha=0.7), rand(3, 5), rand(2, 3, 4), rand(2, 4, 5))
    compare(lambda s, a, v: torch.addmv(s, a, v, beta=2.0), rand(3), rand(3, 4), rand(4))
    compare(torch.mv, rand(3, 4), rand(4))
    compare(torch.dot, rand(6), rand(6))
    compare(torch.vdot, rand(6), rand(6))
    compare(torch.outer, rand(3), rand(4))
    compare(torch.bmm, rand(2, 3, 4), rand(2, 4, 2))


def test_linear_module():
    compare(lambda x, w, b: F.linear(x, w, b), rand(2, 3, 4), rand(5, 4), rand(5))


def test_einsum_and_trace():
    compare(lambda a, b: torch.einsum("bij,bjk->bik", a, b), rand(2, 3, 4), rand(2, 4, 5))
    compare(lambda a, b: torch.einsum("ij,kj->ik", a, b), rand(3, 4), rand(5, 4))
    compare(lambda a: torch.einsum("ii->", a), rand(4, 4))
    compare(torch.trace, rand(3, 4))
    compare(torch.trace, torch.arange(9).reshape(3, 3), grad=False)


# ---- linear algebra ---------------------------------------------------------


def well_conditioned(*shape):
    n = shape[-1]
    return torch.randn(*shape) + 3 * torch.eye(n)


def spd(*shape):
    a = torch.randn(*shape)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


def test_det_inv_solve():
    a = well_conditioned(2, 3, 3)
    compare(torch.linalg.det, a, decomposition=True)
    compare(lambda a: torch.linalg.slogdet(a)[1], a, decomposition=True)
    compare(torch.linalg.inv, a, decomposition=True)
    compare(torch.linalg.solve, a, rand(2, 3, 2), decomposition=True)
    compare(torch.linalg.solve, a, rand(3), decomposition=True)  # vector right-hand side, broadcast
    compare(lambda a, b: torch.linalg.solve(a, b, left=False), a, rand(2, 4, 3), decomposition=True)
    compare(torch.linalg.inv, well_conditioned(4, 4).t(), decomposition=True)  # non-contiguous


def test_lu_family():
    a = well_conditioned(2, 4, 4)
    compare(lambda a: torch.linalg.lu_factor(a), a, grad=False, decomposition=True)
    compare(lambda a: torch.linalg.lu_factor(a)[0], a, decomposition=True)
    compare(torch.linalg.lu, rand(2, 4, 3), decomposition=True)
    lu, piv = torch.linalg.lu_factor(a)
    compare(lambda lu, piv: torch.lu_unpack(lu, piv), lu, piv, grad=False)
    compare(lambda lu, b: torch.linalg.lu_solve(lu, piv.to(lu.device), b), lu, rand(2, 4, 2), decomposition=True)
    compare(
        lambda lu, b: torch.linalg.lu_solve(lu, piv.to(lu.device), b, adjoint=True),
        lu,
        rand(2, 4, 2),
        grad=False,
        decomposition=True,
    )
    compare(
        lambda lu, b: torch.linalg.lu_solve(lu, piv.to(lu.device), b, left=False),
        lu,
        rand(2, 3, 4),
        grad=False,
        decomposition=True,
    )


def test_cholesky_and_triangular():
    a = spd(2, 4, 4)
    compare(torch.linalg.cholesky, a, decomposition=True)
    compare(lambda a: torch.linalg.cholesky(a, upper=True), a, decomposition=True)
    compare(lambda a: torch.linalg.cholesky_ex(a).info, -torch.eye(3), grad=False)
    compare(lambda b, a: torch.cholesky_solve(b, torch.linalg.cholesky(a)), rand(2, 4, 3), a, decomposition=True)
    t = torch.randn(4, 4).triu() + 4 * torch.eye(4)
    compare(lambda t, b: torch.linalg.solve_triangular(t, b, upper=True), t, rand(4, 2), decomposition=True)
    compare(
        lambda t, b: torch.linalg.solve_triangular(t.mT, b, upper=False, left=False), t, rand(3, 4), decomposition=True
    )
    compare(
        lambda t, b: torch.linalg.solve_triangular(t, b, upper=True, unitriangular=True),
        t,
        rand(4, 2),
        decomposition=True,
    )
    compare(lambda b, t: torch.triangular_solve(b, t, upper=True, transpose=True), rand(2, 4, 3), t, decomposition=True)


def test_qr_svd_eigh():
    # Factor signs are a convention: compare sign-free quantities and reconstructions.
    a = rand(5, 3)
    compare(lambda a: torch.linalg.qr(a)[1].abs(), a, decomposition=True)
    compare(lambda a: torch.matmul(*torch.linalg.qr(a)), a, decomposition=True)
    compare(lambda a: torch.matmul(*torch.linalg.qr(a, mode="complete")), a, grad=False, decomposition=True)
    compare(lambda a: torch.linalg.qr(a, mode="r")[1].abs(), a, grad=False, decomposition=True)
    compare(torch.linalg.svdvals, a, decomposition=True)
    compare(lambda a: _reconstruct_svd(*torch.linalg.svd(a, full_matrices=False)), a, decomposition=True)
    s = spd(3, 3)
    compare(torch.linalg.eigvalsh, s, decomposition=True)
    compare(lambda s: torch.linalg.eigvalsh(s, UPLO="U"), s, decomposition=True)
    compare(lambda s: _reconstruct_eigh(*torch.linalg.eigh(s)), s, decomposition=True)


def _reconstruct_svd(u, s, vh):
    return (u * s) @ vh


def _reconstruct_eigh(w, v):
    return (v * w) @ v.mT


def test_matrix_exp_cross_householder_cholesky_inverse():
    compare(torch.linalg.matrix_exp, rand(2, 3, 3) * 0.5, rtol=1e-4, atol=1e-5, decomposition=True)  # a solve
    compare(torch.linalg.cross, rand(4, 3), rand(1, 3))
    compare(lambda a, b: torch.linalg.cross(a, b, dim=0), rand(3, 2), rand(3, 2))
    compare(
        lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a)), spd(3, 3), rtol=1e-4, atol=1e-5, decomposition=True
    )
    compare(
        lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a, upper=True), upper=True),
        spd(3, 3),
        rtol=1e-4,
        atol=1e-5,
        grad=False,
        decomposition=True,
    )
    compare(torch.linalg.householder_product, rand(4, 3), rand(2), grad=False)


# ---- optimizers -------------------------------------------------------------


def _tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _train(model, device, make_opt, steps=3, clip=None):
    model = model.to(device)
    opt = make_opt(model.parameters())
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 4, generator=g).to(device)
        y = torch.randn(5, 3, generator=g).to(device)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return [p.detach() for p in model.parameters()]


OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd_momentum_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-2, foreach=True),
    "sgd_nesterov_loop": lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2, foreach=False
    ),
    "sgd_fused": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2, fused=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adamw_foreach_amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True, amsgrad=True),
    "adamw_loop": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False, fused=False),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "adamw_fused_amsgrad_tensor_lr": lambda p: torch.optim.AdamW(
        p, lr=torch.tensor(1e-2), fused=True, amsgrad=True, maximize=True
    ),
    "adam_fused_l2": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adam_foreach_l2": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, foreach=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_match_cpu(name):
    model = _tiny_model()
    cpu = _train(copy.deepcopy(model), "cpu", OPTIMIZERS[name])
    tpu = native_only(lambda: _train(model, "tpu", OPTIMIZERS[name]))
    for a, b in zip(tpu, cpu):  # trained through _tiny_model's tanh (and Adam's sqrt)
        torch.testing.assert_close(a.cpu(), b, **platform_tol({"rtol": 1e-5, "atol": 1e-5}))


def test_optimizer_defaults_to_foreach_on_tpu():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [torch.zeros(2, device="tpu")]
    fused, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    assert foreach and not fused


def test_clip_grad_norm():
    model = _tiny_model()
    sgd = OPTIMIZERS["sgd_momentum"]
    cpu = _train(copy.deepcopy(model), "cpu", sgd, clip=0.1)
    tpu = native_only(lambda: _train(model, "tpu", sgd, clip=0.1))
    for a, b in zip(tpu, cpu):  # trained through _tiny_model's tanh
        torch.testing.assert_close(a.cpu(), b, **platform_tol({"rtol": 1e-5, "atol": 1e-5}))
    grads = [torch.randn(3, 2), torch.randn(4)]
    for norm_type in (2.0, 1.0, float("inf")):
        total = native_only(lambda n=norm_type: torch.nn.utils.get_total_norm([g.to("tpu") for g in grads], n))
        tol = platform_tol({}) if norm_type == 2.0 else {}  # sqrt
        torch.testing.assert_close(total.cpu(), torch.nn.utils.get_total_norm(grads, norm_type), **tol)


def _lists(n=3, dtype=torch.float32):
    g = torch.Generator().manual_seed(2)
    return [torch.randn(2 + i, 3, generator=g).to(dtype) for i in range(n)]


def _check_foreach(fn, *lists, inplace=None, rtol=1e-6, atol=1e-6):
    """fn's results, or with inplace=i the i-th list it updated, on tpu vs CPU."""
    cpu = [[t.clone() for t in ts] for ts in lists]
    tpu = [[t.to("tpu") for t in ts] for ts in lists]
    expected = fn(*cpu)
    got = native_only(lambda: fn(*tpu))
    if inplace is not None:
        expected, got = cpu[inplace], tpu[inplace]
    for a, b in zip(got, expected):
        assert a.device.type == "tpu"
        torch.testing.assert_close(a.cpu(), b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foreach_binary_and_scalar_ops(dtype):
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    a, b = _lists(dtype=dtype), _lists(dtype=dtype)[::-1]
    b = [t[: s.shape[0]] if t.shape[0] >= s.shape[0] else t.repeat(2, 1)[: s.shape[0]] for t, s in zip(b, a)]
    c = [t.abs() + 0.5 for t in _lists(dtype=dtype)]
    for fn in (
        lambda x, y: torch._foreach_add(x, y, alpha=0.5),
        lambda x, y: torch._foreach_sub(x, y),
        lambda x, y: torch._foreach_mul(x, y),
        lambda x, y: torch._foreach_div(x, y),
        lambda x, y: torch._foreach_maximum(x, y),
        lambda x, y: torch._foreach_minimum(x, y),
        lambda x, y: torch._foreach_clamp_min(x, 0.1),
        lambda x, y: torch._foreach_clamp_max(x, [0.1, 0.2, -0.3]),
        lambda x, y: torch._foreach_add(x, 2.5),
        lambda x, y: torch._foreach_mul(x, [1.5, -2.0, 3.0]),
        lambda x, y: torch._foreach_div(x, 3.0),
        lambda x, y: torch._foreach_sub(x, [1, 2, 3]),
        lambda x, y: torch._foreach_mul(x, torch.tensor(1.5)),
        lambda x, y: torch._foreach_mul(x, torch.tensor(0.5, device=x[0].device)),
        lambda x, y: torch._foreach_lerp(x, y, 0.3),
        lambda x, y: torch._foreach_lerp(x, y, [0.1, 0.7, 0.9]),
        lambda x, y: torch._foreach_lerp(x, y, y),
    ):
        _check_foreach(fn, a, b, rtol=tol, atol=tol)
    pow_tol = {"rtol": max(tol, 1e-5), "atol": max(tol, 1e-5)}
    _check_foreach(lambda x, y: torch._foreach_pow(y, 2), a, c, **pow_tol)
    for fn in (  # float exponents: TPU's exp and log units
        lambda x, y: torch._foreach_pow(y, 0.5),
        lambda x, y: torch._foreach_pow(y, [2.0, 1.5, 3.0]),
        lambda x, y: torch._foreach_pow(2.0, x),
        lambda x, y: torch._foreach_pow(y, x),
    ):
        _check_foreach(fn, a, c, **platform_tol(pow_tol))


def test_foreach_inplace_and_ternary():
    a, b, c = _lists(), _lists(), [t.abs() + 0.5 for t in _lists()]
    for fn in (
        lambda x, y, z: torch._foreach_add_(x, y, alpha=-2),
        lambda x, y, z: torch._foreach_mul_(x, 0.5),
        lambda x, y, z: torch._foreach_mul_(x, torch.tensor(3.0, device=x[0].device)),
        lambda x, y, z: torch._foreach_addcmul_(x, y, z, value=0.3),
        lambda x, y, z: torch._foreach_addcdiv_(x, y, z, value=-0.2),
        lambda x, y, z: torch._foreach_addcdiv_(x, y, z, [0.1, 0.2, 0.3]),
        lambda x, y, z: torch._foreach_addcdiv_(x, y, z, torch.tensor([0.1, 0.2, 0.3])),
        lambda x, y, z: torch._foreach_addcmul_(x, y, z, [0.1, -0.2, 0.3]),
        lambda x, y, z: torch._foreach_lerp_(x, y, 0.9),
        lambda x, y, z: torch._foreach_maximum_(x, y),
        lambda x, y, z: torch._foreach_copy_(x, y),
        lambda x, y, z: torch._foreach_zero_(x),
        lambda x, y, z: torch._foreach_neg_(x),
        lambda x, y, z: torch._foreach_div_(x, z),
    ):
        _check_foreach(fn, a, b, c, inplace=0)
    _check_foreach(
        lambda x, y, z: torch._foreach_sqrt_(z), a, b, c, inplace=2, **platform_tol({"rtol": 1e-6, "atol": 1e-6})
    )


def test_foreach_inplace_into_views():
    base = torch.randn(4, 6)

    def views(t):
        return [t[:, :3], t[1:, 3:]]

    tpu_base = base.to("tpu")
    native_only(
        lambda: torch._foreach_add_(
            views(tpu_base), [torch.ones(4, 3, device="tpu"), torch.ones(3, 3, device="tpu")], alpha=2
        )
    )
    torch._foreach_add_(views(base), [torch.ones(4, 3), torch.ones(3, 3)], alpha=2)
    torch.testing.assert_close(tpu_base.cpu(), base)


def test_foreach_unary_and_norm():
    a = _lists()
    pos = [t.abs() + 0.1 for t in a]
    tol = {"rtol": 1e-6, "atol": 1e-6}
    for fn in (torch._foreach_neg, torch._foreach_abs, torch._foreach_sign):
        _check_foreach(fn, a, **tol)
    for fn in (torch._foreach_exp, torch._foreach_tanh, torch._foreach_sigmoid):
        _check_foreach(fn, a, **platform_tol(tol))
    for fn in (torch._foreach_sqrt, torch._foreach_reciprocal, torch._foreach_log, torch._foreach_rsqrt):
        _check_foreach(fn, pos, **(tol if fn is torch._foreach_reciprocal else platform_tol(tol)))
    for ord in (2, 1, float("inf"), 3.0, 0):
        norm_tol = {"rtol": 1e-5, "atol": 1e-5}
        norm_tol = platform_tol(norm_tol) if ord in (2, 3.0) else norm_tol  # sqrt, a cube root
        _check_foreach(lambda x, o=ord: torch._foreach_norm(x, o), a, **norm_tol)
    _check_foreach(torch._foreach_max, a)
    _check_foreach(lambda x: torch._foreach_norm(x), _lists(dtype=torch.bfloat16), rtol=1e-2, atol=1e-2)


def test_adamw_steady_state_does_not_recompile():
    # Adam's per-step bias corrections arrive as Scalar[] lists: they must not key new executables.
    model = nn.Linear(4, 3).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(5):
        if step == 2:
            torch_tpu.metrics.reset()
        model(torch.randn(2, 4).to("tpu")).sum().backward()
        opt.step()
        opt.zero_grad()
    assert torch_tpu.metrics.counters()["op_compiles"] == 0


@pytest.mark.parametrize("fused", [False, True])
def test_grad_scaler_skips_inf_steps_like_cpu(fused):
    def run(device):
        torch.manual_seed(0)
        model = nn.Linear(4, 3).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
        scaler = torch.amp.GradScaler(device, init_scale=16.0, growth_interval=2)
        g = torch.Generator().manual_seed(1)
        for step in range(4):
            x = torch.randn(2, 4, generator=g).to(device)
            loss = model(x).pow(2).sum() * (float("inf") if step == 1 else 1.0)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach() for p in model.parameters()], scaler.get_scale()

    cpu, cpu_scale = run("cpu")
    tpu, tpu_scale = native_only(lambda: run("tpu"))
    assert tpu_scale == cpu_scale
    for a, b in zip(tpu, cpu):
        torch.testing.assert_close(a.cpu(), b, **platform_tol({"rtol": 1e-5, "atol": 1e-5}))  # AdamW's sqrt


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_lr_scheduler_does_not_recompile(name):
    # The learning rate reaches _foreach_add_(alpha=-lr) and _foreach_mul_(1 - lr * wd): traced, not keyed.
    torch.manual_seed(0)
    cpu_model = nn.Linear(4, 3)
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    losses = {}
    for model, device in ((cpu_model, "cpu"), (tpu_model, "tpu")):
        if name == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7)
        g = torch.Generator().manual_seed(3)
        losses[device] = []
        for step in range(5):
            if step == 2 and device == "tpu":
                torch_tpu.metrics.reset()
            loss = model(torch.randn(2, 4, generator=g).to(device)).square().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            losses[device].append(loss.item())
    assert torch_tpu.metrics.counters()["op_compiles"] == 0
    tol = {"rtol": 1e-5, "atol": 1e-5}
    tol = platform_tol(tol) if name == "adamw" else tol  # AdamW's sqrt
    torch.testing.assert_close(losses["tpu"], losses["cpu"], **tol)
    for p_cpu, p_tpu in zip(cpu_model.parameters(), tpu_model.parameters()):
        torch.testing.assert_close(p_tpu.detach().cpu(), p_cpu.detach(), **tol)
