"""torch_tpu.eager_mode: op by op (the default) or lazy, fused at sync or when a value is read."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torch_tpu
from tests.helpers import platform_tol


@pytest.fixture(autouse=True)
def _eager_after(monkeypatch):
    # These tests count a trace's executions: one trace per sync, as on the CPU client (TPU runs
    # a trace in segments; test_a_lazy_loop_in_segments_matches_one_trace checks them).
    monkeypatch.setenv("TORCH_TPU_LAZY_SEGMENT_OPS", "0")
    torch_tpu.metrics.reset()
    yield
    torch_tpu.eager_mode(True)


def _counts() -> dict:
    return torch_tpu.metrics.counters()


def test_mode_switch_and_context_manager():
    assert torch_tpu.is_eager_mode()
    with torch_tpu.eager_mode(False):
        assert not torch_tpu.is_eager_mode()
        with torch_tpu.eager_mode(True):
            assert torch_tpu.is_eager_mode()
        assert not torch_tpu.is_eager_mode()
    assert torch_tpu.is_eager_mode()
    torch_tpu.eager_mode(False)
    assert not torch_tpu.is_eager_mode()
    torch_tpu.eager_mode(True)
    assert torch_tpu.is_eager_mode()


def test_ops_run_only_when_read_and_fuse():
    a = torch.randn(8, 8)
    b = torch.randn(8, 8)
    x, y = a.to("tpu"), b.to("tpu")
    torch_tpu.metrics.reset()
    with torch_tpu.eager_mode(False):
        z = torch.relu(x @ y + 1.0).sum(0) * 2
        before = _counts()
        assert before["executions"] == 0 and before["op_compiles"] == 0
        assert before["lazy_ops"] == 4 + 1  # mm, add, relu, sum, mul
        got = z.cpu()  # reading the value runs the trace: one executable
    after = _counts()
    assert after["executions"] == 1 and after["graph_compiles"] == 1
    torch.testing.assert_close(got, torch.relu(a @ b + 1.0).sum(0) * 2)


def test_same_sequence_hits_the_cache():
    x = torch.randn(16).to("tpu")
    results = []
    with torch_tpu.eager_mode(False):
        for i in range(3):
            results.append((x * (i + 1)).exp().sum().item())
    c = _counts()
    assert c["graph_compiles"] == 1 and c["graph_cache_hits"] == 2
    cpu = x.cpu()
    tol = platform_tol({"rtol": 1e-6})  # a TPU's exp
    want = [(cpu * (i + 1)).exp().sum().item() for i in range(3)]
    assert results == pytest.approx(want, rel=tol["rtol"], abs=tol.get("atol"))


def test_never_written_storage_reads_as_zeros_made_in_the_trace():
    """An op recorded on a never-written storage (an optimizer state's `zeros_like`: empty, then
    zero_) reads zeros made inside the trace: no zeros executable, no run, while recording."""
    x = torch.empty(1237, device="tpu")  # a size no other test makes zeros of
    view = torch.empty(3, 5, device="tpu")[1:]
    before = _counts()
    with torch_tpu.eager_mode(False):
        x.add_(2)
        y = torch.zeros_like(x, memory_format=torch.preserve_format).add(1)
        view.mul_(3)
        recording = _counts()
        assert recording["xla_compiles"] == before["xla_compiles"], recording
        assert recording["executions"] == before["executions"], recording
    torch.testing.assert_close(x.cpu(), torch.full((1237,), 2.0))
    torch.testing.assert_close(y.cpu(), torch.ones(1237))
    torch.testing.assert_close(view.cpu(), torch.zeros(2, 5))


def test_views_and_inplace_keep_their_semantics():
    base_cpu = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    base = base_cpu.to("tpu")
    with torch_tpu.eager_mode(False):
        row = base[1]
        col = base[:, 2]
        row.mul_(10)  # writes through the view into the base
        col.add_(0.5)  # sees the row's write where they cross
        t = base.t()
        t[0].fill_(-1)
        alias = base.view(24)
        total = alias.sum()
        assert _counts()["executions"] == 0
        row_c, col_c, t_c = base_cpu[1], base_cpu[:, 2], base_cpu.t()
        row_c.mul_(10)
        col_c.add_(0.5)
        t_c[0].fill_(-1)
        torch.testing.assert_close(base.cpu(), base_cpu)
        torch.testing.assert_close(row.cpu(), row_c)
        torch.testing.assert_close(total.item(), base_cpu.sum().item())


def test_sync_runs_pending_work_and_print_reads():
    x = torch.ones(3).to("tpu")
    with torch_tpu.eager_mode(False):
        y = x + 1
        torch_tpu.sync()
        assert _counts()["executions"] == 1
        z = y * 3
        assert _counts()["executions"] == 1
        assert "6., 6., 6." in str(z)  # printing reads the value


def test_host_checked_op_reads_and_raises_like_cpu():
    x = torch.arange(5.0).to("tpu")
    with torch_tpu.eager_mode(False):
        idx = torch.tensor([1, 7]).to("tpu") - 1  # pending: 6 is out of range
        with pytest.raises(IndexError):
            x[idx].cpu()
        good = torch.tensor([4, 1]).to("tpu") - 1
        torch.testing.assert_close(x[good].cpu(), torch.tensor([3.0, 0.0]))


def test_random_ops_draw_as_eager_does():
    torch.manual_seed(7)
    eager = torch.rand(4, 4, device="tpu") * 2
    torch.manual_seed(7)
    with torch_tpu.eager_mode(False):
        lazy = torch.rand(4, 4, device="tpu") * 2
        torch.testing.assert_close(lazy.cpu(), eager.cpu(), rtol=0, atol=0)


def test_compiled_graph_reads_pending_inputs():
    fn = torch.compile(lambda a: (a * 2).sin(), backend="tpu")
    x = torch.randn(8).to("tpu")
    with torch_tpu.eager_mode(False):
        y = x + 1
        out = fn(y)
        torch.testing.assert_close(out.cpu(), ((x.cpu() + 1) * 2).sin())


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def _mlps_and_data(steps: int):
    """The same MLP on CPU and tpu, an AdamW for each, `steps` batches on CPU, and the CPU
    model's losses over them (its parameters then hold the CPU result)."""
    torch.manual_seed(0)
    model_cpu = _mlp()
    model = copy.deepcopy(model_cpu).to("tpu")
    opt_cpu = torch.optim.AdamW(model_cpu.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(steps)]
    losses_cpu = []
    for x, y in data:
        loss = nn.functional.mse_loss(model_cpu(x), y)
        loss.backward()
        opt_cpu.step()
        opt_cpu.zero_grad()
        losses_cpu.append(loss.item())
    return model_cpu, model, opt, data, losses_cpu


# Training vs CPU: a TPU's tanh and AdamW's sqrt differ from CPU's, compounded over the steps.
_TRAINING_TOL = {"rtol": 1e-5, "atol": 1e-6}


def _assert_same_losses(losses, losses_cpu) -> None:
    tol = platform_tol(_TRAINING_TOL)
    assert losses == pytest.approx(losses_cpu, rel=tol["rtol"], abs=tol["atol"])


def _assert_same_parameters(model, model_cpu) -> None:
    for p, p_cpu in zip(model.parameters(), model_cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), p_cpu.detach(), **platform_tol(_TRAINING_TOL))


def test_lazy_mlp_training_matches_cpu_with_few_executables():
    model_cpu, model, opt, data, losses_cpu = _mlps_and_data(20)
    batches = [(x.to("tpu"), y.to("tpu")) for x, y in data]

    torch_tpu.metrics.reset()
    losses, compiles, runs = [], [], []
    with torch_tpu.eager_mode(False):
        for x, y in batches:
            before = _counts()
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())  # the one read per step: runs the step as one executable
            after = _counts()
            runs.append(after["executions"] - before["executions"])
            compiles.append(
                after["graph_compiles"] + after["op_compiles"] - before["graph_compiles"] - before["op_compiles"]
            )
    counts = _counts()
    assert counts["cpu_fallbacks"] == 0
    # forward and backward, then the update (the optimizer's state is created apart, at step 1)
    assert compiles[1:] == [0] * 19, compiles
    assert runs == [3] + [2] * 19, runs
    assert counts["graph_cache_hits"] == 38
    _assert_same_losses(losses, losses_cpu)
    _assert_same_parameters(model, model_cpu)


def test_a_lazy_loop_in_segments_matches_one_trace(monkeypatch):
    """A trace runs every TORCH_TPU_LAZY_SEGMENT_OPS ops (TPU's default lets the chip run one
    segment while the host records the next): the same results, cut at the same ops every step,
    so from step 2 every segment is a cached executable."""
    monkeypatch.setenv("TORCH_TPU_LAZY_SEGMENT_OPS", "4")
    model_cpu, model, opt, data, losses_cpu = _mlps_and_data(5)
    losses, steps = [], []
    with torch_tpu.eager_mode(False):
        for x, y in data:
            before = _counts()
            loss = nn.functional.mse_loss(model(x.to("tpu")), y.to("tpu"))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            after = _counts()
            steps.append({k: after.get(k, 0) - before.get(k, 0) for k in ("lazy_runs", "lazy_ops", "graph_compiles")})
    ops = steps[1]["lazy_ops"]
    assert steps[1]["lazy_runs"] > 2 + ops // 8, steps  # segments of at most 4 ops, and the update's
    assert steps[2:] == [steps[1]] * 3, steps
    assert [s["graph_compiles"] for s in steps[1:]] == [0] * 4, steps
    _assert_same_losses(losses, losses_cpu)
    _assert_same_parameters(model, model_cpu)


class _TinyLM(nn.Module):
    """Embeddings with arange positions, attention, and a cross-entropy loss: the ops whose index
    checks and out= copies used to read values mid-step."""

    def __init__(self, vocab: int = 32, width: int = 16, length: int = 8):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.qkv, self.head = nn.Linear(width, 3 * width), nn.Linear(width, vocab)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        q, k, v = (z.unsqueeze(1) for z in self.qkv(x).split(x.shape[-1], 2))
        x = x + nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def test_a_lazy_forward_and_backward_with_index_checks_is_one_executable():
    # Index checks are recorded with the ops (ops/deferred_checks.py), an arange's out= copy too:
    # reading values mid-step would run the trace so far and split the step's executable.
    torch.manual_seed(0)
    model_cpu = _TinyLM()
    model = copy.deepcopy(model_cpu).to("tpu")
    opt_cpu, opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model_cpu, model))
    idx, targets = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
    idx_tpu, targets_tpu = idx.to("tpu"), targets.to("tpu")
    losses, losses_cpu, runs = [], [], []
    for _ in range(3):
        loss = model_cpu(idx, targets)
        loss.backward()
        opt_cpu.step()
        opt_cpu.zero_grad()
        losses_cpu.append(loss.item())
    with torch_tpu.eager_mode(False):
        for _ in range(3):
            torch_tpu.metrics.reset()
            loss = model(idx_tpu, targets_tpu)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            counters = torch_tpu.metrics.counters()
            runs.append((counters["lazy_runs"], counters["host_transfers"]))
    # forward and backward as one executable, then the update; one transfer: the loss read
    assert runs[1:] == [(2, 1), (2, 1)], runs
    torch.testing.assert_close(losses, losses_cpu, rtol=1e-5, atol=1e-6)
    with torch_tpu.eager_mode(False):  # and a bad index still raises CPU's error at the read
        with pytest.raises(IndexError, match="index out of range in self"):
            model.tok(torch.tensor([40]).to("tpu")).cpu()


def test_a_trace_run_in_the_background_gives_its_values_and_its_error_at_the_read(monkeypatch):
    """`set_enabled(False, in_background=True)` (a compiled step's optimizer state creation) runs
    the trace on a worker thread: eager mode at once, the values at their first read, and the
    run's error raised there."""
    import threading

    from torch_tpu.compile import lazy

    x_cpu = torch.randn(8)
    x = x_cpu.to("tpu")
    threads = []
    run = lazy._run
    monkeypatch.setattr(lazy, "_run", lambda *a: (threads.append(threading.current_thread()), run(*a))[1])
    lazy.set_enabled(True)
    y = (x * 2).exp()
    lazy.set_enabled(False, in_background=True)
    assert torch_tpu.is_eager_mode()
    torch.testing.assert_close(y.cpu(), (x_cpu * 2).exp(), **platform_tol({}))
    assert threads and threads[0] is not threading.current_thread()

    def fail(*args):
        raise RuntimeError("the compile failed")

    monkeypatch.setattr(lazy, "_compile", fail)
    lazy.set_enabled(True)
    z = x.sin().mul(3)  # a trace not compiled before
    lazy.set_enabled(False, in_background=True)
    with pytest.raises(RuntimeError, match="the compile failed"):
        z.cpu()
    with pytest.raises(RuntimeError, match="failed to run"):
        z.cpu()
    torch.testing.assert_close((x + 1).cpu(), x_cpu + 1)  # eager ops go on
