"""optimizer.step() on tpu runs as one fused executable (torch_tpu/fused_optimizer.py): the same
numbers as CPU and as the op-by-op step (TORCH_TPU_FUSE_OPTIMIZER=0), one execution per step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_tpu
from tests.helpers import platform_tol
from torch_tpu import platforms

FUSE = "TORCH_TPU_FUSE_OPTIMIZER"


class SignedMomentum(torch.optim.Optimizer):
    """A custom optimizer: a for-loop update and a Python int step in its state."""

    def __init__(self, params, lr: float = 1e-2, beta: float = 0.9):
        super().__init__(params, {"lr": lr, "beta": beta})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["buf"] = torch.zeros_like(p)
                state["step"] += 1
                state["buf"].mul_(group["beta"]).add_(p.grad, alpha=1 - group["beta"])
                p.add_(state["buf"].sign() * state["buf"].abs().sqrt(), alpha=-group["lr"] / state["step"] ** 0.5)
        return loss


OPTIMIZERS = {
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adam_for_loop": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
    "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    "custom": lambda ps: SignedMomentum(ps, lr=1e-2),
}
LRS = [1e-2, 7e-3, 5e-3, 3e-3, 2e-3]  # a new Python float every step


@pytest.fixture(autouse=True)
def _eager_after():
    torch_tpu.metrics.reset()
    yield
    torch_tpu.eager_mode(True)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _counters() -> dict:
    return torch_tpu.metrics.counters()


def _train(make, device: str, steps: int = len(LRS)):
    """`steps` steps with a new lr each; the last one without the first layer's gradients.
    Returns the model, the optimizer and each step's counter deltas over `optimizer.step()`."""
    model = _model().to(device)
    opt = make(model.parameters())
    torch.manual_seed(1)
    x, y = torch.randn(4, 8).to(device), torch.randn(4, 4).to(device)
    deltas = []
    for i in range(steps):
        for group in opt.param_groups:
            group["lr"] = LRS[i]
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if i == steps - 1:
            model[0].weight.grad = model[0].bias.grad = None
        torch_tpu.sync()
        before = _counters()
        opt.step()
        after = _counters()
        deltas.append({k: after.get(k, 0) - before.get(k, 0) for k in ("executions", "xla_compiles", "host_transfers")})
        deltas[-1]["fused"] = after.get("fused_optimizer_steps", 0) - before.get("fused_optimizer_steps", 0)
    return model, opt, deltas


def _assert_same_state(opt, reference, devices: bool = True, **tol) -> None:
    """Same parameters and state: types, dtypes, values and (`devices`) which state tensors are
    on their parameter's device."""
    for group, ref_group in zip(opt.param_groups, reference.param_groups):
        assert group["lr"] == ref_group["lr"]
        for p, ref in zip(group["params"], ref_group["params"]):
            torch.testing.assert_close(p.detach().cpu(), ref.detach().cpu(), **tol)
            state, ref_state = opt.state[p], reference.state[ref]
            assert state.keys() == ref_state.keys()
            for key, value in state.items():
                ref_value = ref_state[key]
                assert type(value) is type(ref_value), key
                if isinstance(value, torch.Tensor):
                    assert value.dtype == ref_value.dtype, key
                    assert not devices or (value.device == p.device) == (ref_value.device == ref.device), key
                    torch.testing.assert_close(value.cpu(), ref_value.cpu(), **tol)
                else:
                    assert value == ref_value, key


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_step_is_one_execution_with_cpu_numbers(name, monkeypatch):
    make = OPTIMIZERS[name]
    _, cpu_opt, _ = _train(make, "cpu")
    _, opt, fused = _train(make, "tpu")
    monkeypatch.setenv(FUSE, "0")
    _, eager_opt, eager = _train(make, "tpu")

    assert [d["fused"] for d in fused] == [1] * len(LRS)
    assert [d["executions"] for d in fused[1:]] == [1] * (len(LRS) - 1), fused
    # steps 3 and 4 repeat step 2 with another lr: no compile (the lr is an input, not a constant)
    assert [d["xla_compiles"] for d in fused[2:4]] == [0, 0], fused
    assert all(d["host_transfers"] == 0 for d in fused), fused
    assert [d["fused"] for d in eager] == [0] * len(LRS)
    assert all(d["executions"] > 1 for d in eager[1:]), eager  # op by op: the counts above can fail
    assert torch_tpu.is_eager_mode()
    _assert_same_state(opt, cpu_opt, devices=False, **platform_tol({}))
    _assert_same_state(opt, eager_opt, **platform_tol({}))


class _Failing(torch.optim.Optimizer):
    """Updates its first parameter, then fails (with `error`, or with an op's own error)."""

    def __init__(self, params, error: BaseException | None):
        super().__init__(params, {})
        self.error = error

    @torch.no_grad()
    def step(self, closure=None):
        p = self.param_groups[0]["params"][0]
        p.mul_(2)
        if self.error is not None:
            raise self.error
        p.add_(torch.ones(3, device=p.device))  # a size mismatch: PyTorch's RuntimeError at the call


def test_an_error_in_step_restores_eager_mode_and_propagates(monkeypatch):
    weight = torch.arange(4.0).reshape(2, 2)
    p = nn.Parameter(weight.to("tpu"))
    error = ValueError("the step's own error")
    opt = _Failing([p], error)
    with pytest.raises(ValueError) as raised:
        opt.step()
    assert raised.value is error
    assert torch_tpu.is_eager_mode()
    torch.testing.assert_close(p.detach().cpu(), weight * 2)  # the update before the error ran
    before = _counters()["executions"]
    q = p.detach() + 1  # eager again: runs at once
    assert _counters()["executions"] == before + 1
    torch.testing.assert_close(q.cpu(), weight * 2 + 1)

    with pytest.raises(RuntimeError) as raised:  # an op's error, raised while recording
        _Failing([p], None).step()
    assert torch_tpu.is_eager_mode()
    torch.testing.assert_close(p.detach().cpu(), weight * 4)
    monkeypatch.setenv(FUSE, "0")
    with pytest.raises(RuntimeError) as unfused:
        _Failing([p], None).step()
    assert str(raised.value) == str(unfused.value)
    monkeypatch.delenv(FUSE)
    assert _counters().get("fused_optimizer_steps", 0) == 0  # a failed step is not counted


def test_closure_steps_are_not_fused_and_match_cpu():
    results = {}
    for device in ("cpu", "tpu"):
        model = _model().to(device)
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
        torch.manual_seed(1)
        x, y = torch.randn(4, 8).to(device), torch.randn(4, 4).to(device)

        def closure(model=model, opt=opt, x=x, y=y):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        torch_tpu.metrics.reset()
        losses = [opt.step(closure).item() for _ in range(2)]
        results[device] = (losses, [p.detach().cpu() for p in model.parameters()])
        assert _counters().get("fused_optimizer_steps", 0) == 0
    torch.testing.assert_close(results["tpu"], results["cpu"], **platform_tol({}))


def test_lr_scheduler_made_before_the_first_step_keeps_the_fusion():
    model = _model().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # wraps opt.step
    cpu_model = _model()
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    cpu_scheduler = torch.optim.lr_scheduler.StepLR(cpu_opt, step_size=1, gamma=0.5)
    x = torch.randn(4, 8)
    torch_tpu.metrics.reset()
    for m, o, s, inp in ((model, opt, scheduler, x.to("tpu")), (cpu_model, cpu_opt, cpu_scheduler, x)):
        for _ in range(3):
            o.zero_grad()
            m(inp).square().mean().backward()
            o.step()
            s.step()
    assert _counters()["fused_optimizer_steps"] == 3
    _assert_same_state(opt, cpu_opt, devices=False, **platform_tol({}))


def test_a_step_recorded_lazily_runs_its_recording_in_two_parts(monkeypatch):
    """Under eager_mode(False) the step is not fused on its own: the caller's recording (forward
    and backward) runs where the optimizer gathers its state, and the update when step returns."""
    monkeypatch.setenv("TORCH_TPU_LAZY_SEGMENT_OPS", "0")  # one trace per sync, on TPU too
    model = _model().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cpu_model = _model()
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 8)
    cpu_model(x).square().mean().backward()
    cpu_opt.step()
    torch_tpu.metrics.reset()
    with torch_tpu.eager_mode(False):
        model(x.to("tpu")).square().mean().backward()
        assert _counters().get("lazy_runs", 0) == 0
        opt.step()
        assert not torch_tpu.is_eager_mode()
        assert _counters()["lazy_runs"] == 2  # forward and backward; the update
    assert _counters().get("fused_optimizer_steps", 0) == 0
    _assert_same_state(opt, cpu_opt, devices=False, **platform_tol({}))


@pytest.mark.usefixtures("fresh_dynamo")
def test_step_under_torch_compile_is_left_to_dynamo():
    model = _model().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cpu_model = _model()
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    x = torch.randn(4, 8)

    def train_step(m, o, inp):
        o.zero_grad()
        m(inp).square().mean().backward()
        o.step()

    train_step(model, opt, x.to("tpu"))  # an eager step first: the fused step is in place
    train_step(cpu_model, cpu_opt, x)
    compiled = torch.compile(train_step, backend="tpu")
    torch_tpu.metrics.reset()
    for _ in range(2):
        compiled(model, opt, x.to("tpu"))
        train_step(cpu_model, cpu_opt, x)
    assert _counters().get("fused_optimizer_steps", 0) == 0
    assert _counters()["graph_compiles"] + _counters()["graph_cache_hits"] > 0  # dynamo ran the step
    assert torch_tpu.is_eager_mode()
    _assert_same_state(opt, cpu_opt, devices=False, **platform_tol({}))


def _scaled_steps(make):
    """Three GradScaler steps (the second with an inf gradient, skipped) on tpu."""
    model = _model().to("tpu")
    opt = make(model.parameters())
    scaler = torch.amp.GradScaler("tpu", init_scale=2.0**8)
    x = torch.randn(4, 8).to("tpu")
    for step in range(3):
        scaler.scale(model(x).square().mean()).backward()
        if step == 1:
            model[0].weight.grad[0, 0] = float("inf")
        scaler.step(opt)  # a fused optimizer gets grad_scale and found_inf as tensors
        scaler.update()
        opt.zero_grad()
    return opt


FUSED_KERNELS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, fused=True),
}


@pytest.mark.parametrize("name", sorted(FUSED_KERNELS))
def test_grad_scaler_with_fused_kernels_matches_the_unfused_step(name, monkeypatch):
    make = FUSED_KERNELS[name]
    opt = _scaled_steps(make)
    assert _counters()["fused_optimizer_steps"] == 3  # the kernel skips the inf step on the device
    monkeypatch.setenv(FUSE, "0")
    _assert_same_state(opt, _scaled_steps(make), **platform_tol({}))


def test_a_fused_step_donates_the_buffers_it_overwrites(monkeypatch):
    """Where no host view may hold an array (TPU; here TPU's buffer layout), the fused step hands
    the parameters and state it overwrites to XLA instead of keeping old and new values live at
    once; a tensor that still holds an old value (a clone sharing its array) keeps it."""
    monkeypatch.setattr(platforms, "shaped_buffers", lambda: True)  # TORCH_TPU_SHAPED_BUFFERS=1, for this test
    cpu = _model()
    tpu = _model().to("tpu")
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2, weight_decay=0.1)
    opt_tpu = torch.optim.AdamW(tpu.parameters(), lr=1e-2, weight_decay=0.1)
    x = torch.randn(4, 8)
    donated = []
    for _ in range(3):
        for model, device in ((cpu, "cpu"), (tpu, "tpu")):
            model(x.to(device)).square().mean().backward()
        kept = torch._lazy_clone(tpu[0].weight.detach())  # shares the weight's array (copy on write)
        before = kept.cpu()
        torch_tpu.metrics.reset()
        for opt in (opt_cpu, opt_tpu):
            opt.step()
            opt.zero_grad()
        torch_tpu.sync()
        donated.append(torch_tpu.metrics.counters().get("donated_buffers", 0))
        assert torch.equal(kept.cpu(), before)
    for a, b in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(a.cpu(), b)
    # from the second step on, every parameter (less the cloned one) and both AdamW states per parameter
    n = len(list(tpu.parameters()))
    assert donated[1] == donated[2] == 3 * n - 1, donated


@pytest.mark.parametrize("groups", [1, 2])
def test_step_two_compiles_nothing(groups):
    """The state's creation runs apart from the update (flushed around `_init_group`), so step 1's
    update program is every later step's: one execution per param group, no compile at step 2."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(11, 13), nn.Tanh(), nn.Linear(13, 5)).to("tpu")  # shapes no other test uses
    params = list(model.parameters())
    split = [{"params": params[::2]}, {"params": params[1::2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(split if groups == 2 else params, lr=1e-2, weight_decay=0.1)
    x = torch.randn(6, 11).to("tpu")
    steps = []
    for _ in range(3):
        opt.zero_grad()
        model(x).square().mean().backward()
        torch_tpu.sync()
        before = _counters()
        opt.step()
        torch_tpu.sync()
        after = _counters()
        steps.append({k: after.get(k, 0) - before.get(k, 0) for k in ("xla_compiles", "executions")})
    assert steps[0]["xla_compiles"] > 0, steps  # fresh programs: the counts below can fail
    assert [s["xla_compiles"] for s in steps[1:]] == [0, 0], steps
    assert [s["executions"] for s in steps[1:]] == [groups, groups], steps
