"""What a compiled forward keeps in HBM for its backward: no value the backward reads only the
shape of (the float32 log-probs an autocast cross_entropy hands nll_loss are vocabulary x tokens
x 4 bytes, 0.8 GB for a GPT-2 batch of 4 x 1024), no max pool indices (int64: a pair of u32
words on TPU), which the backward finds again from the pool's input, and across conv -> batch
norm -> ReLU only the convolution's output, from which the backward recomputes the rest."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from tests.helpers import graph_runners, platform_tol, tol_for


def test_autocast_cross_entropy_keeps_no_float32_log_probs(monkeypatch):
    runners = graph_runners(monkeypatch)
    torch.manual_seed(0)
    eager = torch.nn.Linear(16, 96).to("tpu")
    tpu = torch.nn.Linear(16, 96).to("tpu")
    tpu.load_state_dict(eager.state_dict())
    x, y = torch.randn(8, 16), torch.randint(0, 96, (8,))

    def loss_of(model):
        def fn(x, y):
            with torch.autocast("tpu", dtype=torch.bfloat16):
                return F.cross_entropy(model(x), y)

        return fn

    x, y = x.to("tpu"), y.to("tpu")
    loss = torch.compile(loss_of(tpu), backend="tpu")(x, y)
    loss.backward()
    expected = loss_of(eager)(x, y)  # the same autocast policy, op by op
    expected.backward()

    (forward,) = [r for r in runners if r.name.startswith("forward")]
    saved = [n.meta.get("val") for n in forward.gm.graph.output_node().args[0] if isinstance(n, torch.fx.Node)]
    logits_sized = [v for v in saved if isinstance(v, torch.Tensor) and tuple(v.shape) == (8, 96)]
    assert logits_sized and all(v.dtype == torch.bfloat16 for v in logits_sized), [v.dtype for v in logits_sized]
    tol = platform_tol({})  # on a TPU the compiled and the eager bf16 cross entropy (exp, log) differ
    torch.testing.assert_close(loss.cpu(), expected.cpu(), **tol)
    torch.testing.assert_close(tpu.weight.grad.cpu(), eager.weight.grad.cpu(), **tol)
    torch.testing.assert_close(tpu.bias.grad.cpu(), eager.bias.grad.cpu(), **tol)


def _saved(runners) -> list:
    (forward,) = [r for r in runners if r.name.startswith("forward")]
    return [n.meta.get("val") for n in forward.gm.graph.output_node().args[0] if isinstance(n, torch.fx.Node)]


@pytest.mark.parametrize(
    "nd,k,stride,padding,dilation,ceil_mode",
    [
        (2, 3, 2, 1, 1, False),  # ResNet's stem pool: overlapping windows, stride 2
        (2, [3], [1], [1], [1], False),  # one size for both dims; every input in several windows
        (2, 2, 3, 0, 1, True),  # gaps between windows; a last window past the input
        (3, (2, 3, 2), (1, 2, 2), (1, 1, 0), (2, 1, 1), True),
    ],
)
@pytest.mark.parametrize("nan_and_inf", [False, True], ids=["finite", "nan_and_inf"])
def test_compiled_max_pool_keeps_no_indices_and_matches_cpu(
    monkeypatch, nd, k, stride, padding, dilation, ceil_mode, nan_and_inf
):
    """Finite inputs take XLA's select-and-scatter; a nan or -inf, the taps (CPU's last nan)."""
    torch._dynamo.reset()  # the same code with other inputs: compiled again, graphs captured
    runners = graph_runners(monkeypatch)
    pool = torch.nn.functional.max_pool2d if nd == 2 else torch.nn.functional.max_pool3d
    x = torch.randint(0, 3, (2, 3, *[9] * nd)).float()  # ties in most windows
    if nan_and_inf:
        x.view(-1)[7] = float("nan")
        x.view(-1)[[12, 40]] = -float("inf")
        x.view(-1)[13] = float("nan")  # two nans in one window
    weights = torch.randn(pool(x, k, stride, padding, dilation, ceil_mode).shape)

    def fn(x, weights):
        return (pool(x, k, stride, padding, dilation, ceil_mode) * weights).sum()

    expected = x.clone().requires_grad_()
    fn(expected, weights).backward()
    tpu = x.to("tpu").requires_grad_()
    torch.compile(fn, backend="tpu")(tpu, weights.to("tpu")).backward()

    assert not [v for v in _saved(runners) if isinstance(v, torch.Tensor) and v.dtype == torch.int64]
    (backward,) = [r for r in runners if r.name.startswith("backward")]
    targets = {str(n.target) for n in backward.gm.graph.nodes if n.op == "call_function"}
    assert "tpu_kernels.max_pool_backward_from_input.default" in targets, targets
    torch.testing.assert_close(tpu.grad.cpu(), expected.grad, equal_nan=True)


class _ResidualBlock(torch.nn.Module):
    """ResNet's pattern: conv -> batch norm -> ReLU, a second conv -> batch norm, the residual add
    and its ReLU, pooled into a linear head."""

    def __init__(self, channels: int = 8, track_running_stats: bool = True):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bns = nn.ModuleList(nn.BatchNorm2d(channels, track_running_stats=track_running_stats) for _ in range(3))
        self.fc = nn.Linear(channels, 5)

    def forward(self, x):
        x = F.relu(self.bns[0](self.stem(x)))
        y = F.relu(self.bns[1](self.conv1(x)))
        x = F.relu(x + self.bns[2](self.conv2(y)))
        return self.fc(x.mean((2, 3)))


def _producers(runners) -> list[tuple[str, torch.Tensor]]:
    (forward,) = [r for r in runners if r.name.startswith("forward")]
    saved = []
    for node in forward.gm.graph.output_node().args[0]:
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(value, torch.Tensor) and node.op != "placeholder":
            saved.append((str(node.target), value))
    return saved


def test_autocast_conv_batch_norm_relu_keeps_conv_outputs_only(monkeypatch):
    """The backward of conv -> batch norm -> ReLU needs the batch norm's input and the ReLU's
    output; the forward keeps the first (bfloat16) and per-channel statistics, and the backward
    recomputes the normalization and ReLU from them (ops/batch_norm_graph.py), as XLA does in
    jax's one-module step: no conv -> batch norm -> ReLU output and no bfloat16 copy of a weight
    crosses (ResNet-50 kept 42.2 MB per 224² image, now 31.0: benchmarks/saved_tensors.py)."""
    torch._dynamo.reset()
    runners = graph_runners(monkeypatch)
    torch.manual_seed(0)
    eager = _ResidualBlock().to("tpu")
    tpu = _ResidualBlock().to("tpu")
    tpu.load_state_dict(eager.state_dict())
    x, y = torch.randn(4, 3, 8, 8).to("tpu"), torch.randint(0, 5, (4,)).to("tpu")

    def loss_of(model):
        def fn(x, y):
            with torch.autocast("tpu", dtype=torch.bfloat16):
                return F.cross_entropy(model(x), y)

        return fn

    loss = torch.compile(loss_of(tpu), backend="tpu")(x, y)
    loss.backward()
    expected = loss_of(eager)(x, y)  # the same autocast policy, op by op
    expected.backward()

    saved = _producers(runners)
    activations = sorted((op, tuple(v.shape), v.dtype) for op, v in saved if v.dim() == 4 and v.shape[0] == 4)
    act = ((4, 8, 8, 8), torch.bfloat16)
    assert activations == [
        ("aten._to_copy.default", (4, 3, 8, 8), torch.bfloat16),  # the input, for the stem's weight gradient
        *[("aten.convolution.default", *act)] * 3,
        ("aten.detach.default", *act),  # the block's output (the residual sum's ReLU), as XLA keeps it
    ], activations
    weights = [(op, v.shape) for op, v in saved if v.dtype == torch.bfloat16 and v.shape[0] != 4]
    assert not weights, weights  # their bfloat16 casts are recomputed from the parameters
    kept = sum(v.numel() * v.element_size() for _, v in saved)
    assert kept < 4 * 3 * 8 * 8 * 2 + 4 * (4 * 8 * 8 * 8 * 2) + 1024, kept  # + per-channel statistics

    # On a TPU, XLA fuses the compiled graph's bfloat16 ops and keeps their intermediates in float32
    # (excess precision), where eager rounds each op's output to bfloat16: bfloat16's tolerance
    # there (a v5e's losses differed by 1.1e-3 relative, under half a bfloat16 ulp).
    tol = tol_for(torch.bfloat16) if torch_tpu.platform() == "tpu" else {}
    torch.testing.assert_close(loss.cpu(), expected.cpu(), **tol)
    for (name, got), want in zip(tpu.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got.grad.cpu(), want.grad.cpu(), **tol, msg=name)
    for got, want in zip(tpu.buffers(), eager.buffers()):
        torch.testing.assert_close(got.cpu(), want.cpu(), **tol)


@pytest.mark.parametrize("kind", ["train", "no_stats", "frozen", "1d"])
def test_compiled_batch_norm_matches_cpu(monkeypatch, kind):
    """Batch norm in compiled graphs is decomposed (ops/batch_norm_graph.py): output, gradients
    and running statistics over two training steps are CPU's, for each of aten's forms."""
    torch._dynamo.reset()
    runners = graph_runners(monkeypatch)
    torch.manual_seed(0)
    nn = torch.nn
    if kind == "1d":
        model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
        inputs = [torch.randn(5, 6) for _ in range(2)]
    else:
        model = _ResidualBlock(track_running_stats=kind != "no_stats")
        inputs = [torch.randn(3, 3, 6, 6) for _ in range(2)]
    if kind == "frozen":  # a frozen batch norm in a model that trains: normalized by running stats
        model.bns[1].running_mean.uniform_(-0.5, 0.5)
        model.bns[1].running_var.uniform_(0.5, 2.0)
        model.bns[1].eval()
    tpu = copy.deepcopy(model).to("tpu")
    step = torch.compile(lambda m, x: m(x).square().mean(), backend="tpu")
    for x in inputs:
        expected = model(x).square().mean()
        expected.backward()
        loss = step(tpu, x.to("tpu"))
        loss.backward()
        tol = platform_tol({"rtol": 1e-5, "atol": 1e-5})  # float32 sums in XLA's order, not CPU's
        torch.testing.assert_close(loss.cpu(), expected, **tol)
        for (name, got), want in zip(tpu.named_parameters(), model.parameters()):
            torch.testing.assert_close(got.grad.cpu(), want.grad, **tol, msg=name)
        for (name, got), want in zip(tpu.named_buffers(), model.buffers()):
            torch.testing.assert_close(got.cpu(), want, **tol, msg=name)
    targets = {str(n.target) for r in runners for n in r.gm.graph.nodes if n.op == "call_function"}
    assert not [t for t in targets if "batch_norm" in t and "backward" not in t], targets


@pytest.mark.parametrize(
    "settings, kept_relus, kept_sums",
    [
        ({"ban_recompute_materialized_backward": True}, 2, 1),  # inductor's choice
        ({"ban_recompute_long_fusible_chains": False, "ban_recompute_used_far_apart": False}, 0, 0),
    ],
    ids=["inductor", "chains"],
)
def test_partitioner_option_sets_the_split(monkeypatch, settings, kept_relus, kept_sums):
    """options={"partitioner": {...}} sets torch._functorch.config for the graph's split: with
    inductor's ban on recomputing what a convolution's backward reads, the ReLU outputs are kept;
    without min-cut's bans on long chains and on values used far apart, the residual sum's ReLU
    is recomputed too and the forward keeps only the convolutions' outputs and its input."""
    torch._dynamo.reset()
    runners = graph_runners(monkeypatch)
    torch.manual_seed(0)
    model = _ResidualBlock().to("tpu")
    x = torch.randn(4, 3, 8, 8).to("tpu")

    @torch.compile(backend="tpu", options={"partitioner": settings})
    def loss_of(x):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            return model(x).square().mean()

    loss_of(x).backward()
    kept = sorted(op for op, v in _producers(runners) if v.dim() == 4 and v.shape[0] == 4)
    assert kept.count("aten.convolution.default") == 3 and "aten._to_copy.default" in kept, kept
    assert kept.count("aten.relu.default") == kept_relus, kept
    assert kept.count("aten.detach.default") == kept_sums, kept


def test_compiled_gathers_are_kept_not_recomputed(monkeypatch):
    """A gather whose indices are checked is not recomputed in the backward (its check would run
    again: a host read per step where checks are not deferred); its output crosses instead."""
    torch._dynamo.reset()
    runners = graph_runners(monkeypatch)
    torch.manual_seed(0)
    table = torch.randn(10, 6)
    norm = torch.nn.LayerNorm(6)
    idx = torch.randint(0, 10, (32, 16))  # gathered: 12 KB; the table and indices: 4.3 KB
    weights = torch.randn(32, 16, 6)

    def fn(table, idx, weights):
        return (norm(table[idx] + 1) * weights).sum()

    expected = table.clone().requires_grad_()
    fn(expected, idx, weights).backward()
    norm.to("tpu")
    tpu = table.to("tpu").requires_grad_()
    torch.compile(fn, backend="tpu")(tpu, idx.to("tpu"), weights.to("tpu")).backward()
    (backward,) = [r for r in runners if r.name.startswith("backward")]
    targets = {str(n.target) for n in backward.gm.graph.nodes if n.op == "call_function"}
    assert "aten.index.Tensor" not in targets, targets
    torch.testing.assert_close(tpu.grad.cpu(), expected.grad, **platform_tol({}))
