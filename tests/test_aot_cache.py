"""aot_autograd's results kept across processes (compile/aot_cache.py): a whole training step
compiled again (dynamo reset, or a new process) loads its forward, backward and optimizer graphs
from torch's AOTAutogradCache instead of tracing them with aot_autograd, and runs as the first
compile did; the key holds torch_tpu's part (the compile options, the build), so another
configuration traces again."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.nn import functional as F

import torch_tpu
from tests.helpers import run_python


def _train(device: str, compile_options: dict | None, steps: int = 2) -> list[float]:
    """Losses of a small autocast MLP trained by a step compiled whole (forward, backward,
    AdamW); eager on CPU when `compile_options` is None."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    batches = [(torch.randn(4, 8), torch.randint(0, 4, (4,))) for _ in range(steps)]

    def step(x, y):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "tpu"):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    if compile_options is not None:
        step = torch.compile(step, backend="tpu", options=compile_options)
    return [step(x.to(device), y.to(device)).item() for x, y in batches]


def _aot_counts() -> dict[str, int]:
    c = torch_tpu.metrics.counters()
    return {
        "hits": counters["aot_autograd"]["autograd_cache_hit"],
        "misses": counters["aot_autograd"]["autograd_cache_miss"],
        "traced": c["aot_graphs_compiled"],  # graphs aot_autograd traced and handed the backend
        "loaded": c["aot_cache_loads"],  # graphs rebuilt from a stored entry
        "graph_compiles": c["graph_compiles"],
    }


@pytest.fixture
def torch_cache(tmp_path, monkeypatch):
    """torch's cache directory (where the AOTAutogradCache entries go) of this test alone."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch"))
    torch._dynamo.reset()
    counters.clear()
    torch_tpu.metrics.reset()
    yield tmp_path / "torch"
    torch._dynamo.reset()


def test_step_compiled_again_loads_aot_results(torch_cache):
    cold = _train("tpu", {})
    first = _aot_counts()
    # the forward+backward graph and the optimizer's: traced by aot_autograd (3 graphs) and stored
    assert first["misses"] == 2 and first["hits"] == 0
    assert first["traced"] == 3 and first["loaded"] == 0
    assert counters["aot_autograd"]["autograd_cache_saved"] == 2

    torch._dynamo.reset()  # dynamo and aot_autograd forget everything held in memory
    warm = _train("tpu", {})
    second = _aot_counts()
    assert second["hits"] - first["hits"] == 2 and second["misses"] == first["misses"]
    assert second["traced"] == first["traced"], "aot_autograd traced a graph again"
    assert second["loaded"] == 3
    assert second["graph_compiles"] == first["graph_compiles"], "a graph's executable was compiled again"
    assert warm == cold
    reference = _train("cpu", None)
    torch.testing.assert_close(torch.tensor(warm), torch.tensor(reference), rtol=1.6e-2, atol=1e-2)


def test_step_graphs_stored_as_plain_data(torch_cache, monkeypatch):
    """The forward, backward and optimizer-step graphs (an AdamW step: foreach ops over each
    parameter list, their results read back by getitem) are stored as plain data
    (compile/graph_record.py), not through torch's GraphPickler, which regenerates each graph's
    code and maps every node through pytree (seconds per optimizer step of a GPT); a warm run
    rebuilds them from it."""
    from torch.fx._graph_pickler import GraphPickler

    from torch_tpu.compile import aot_cache

    stored, pickled = [], []
    prepare = aot_cache.GraphOutput.prepare_for_serialization
    dumps = GraphPickler.dumps

    def keep(self):
        nodes = len(self.gm.graph.nodes)
        prepare(self)
        stored.append((self.kind, nodes, self))

    monkeypatch.setattr(aot_cache.GraphOutput, "prepare_for_serialization", keep)
    monkeypatch.setattr(GraphPickler, "dumps", classmethod(lambda cls, *a, **k: pickled.append(1) or dumps(*a, **k)))
    cold = _train("tpu", {})
    assert sorted(kind for kind, _, _ in stored) == ["backward", "forward", "inference"]
    assert not pickled, "a graph went through GraphPickler"
    for kind, nodes, output in stored:
        assert output.pickled_graph is None and len(output.graph_record) == nodes, kind
    (step,) = [output for kind, _, output in stored if kind == "inference"]
    targets = {target[2] for _, _, target, _, _ in step.graph_record if target[0] == "op"}
    assert {"_foreach_mul", "_foreach_addcmul", "copy_"} <= targets

    torch._dynamo.reset()
    warm = _train("tpu", {})
    assert _aot_counts()["loaded"] == 3
    assert warm == cold


def test_other_compile_options_miss(torch_cache):
    _train("tpu", {})
    before = _aot_counts()
    torch._dynamo.reset()
    _train("tpu", {"matmul_precision": "highest"})  # torch_tpu's part of the key changed, the graph did not
    after = _aot_counts()
    assert after["hits"] == before["hits"] and after["misses"] - before["misses"] == 2
    assert after["traced"] - before["traced"] == 3


def test_off_without_persistent_cache(torch_cache, monkeypatch):
    from torch_tpu.compile import aot_cache

    monkeypatch.setattr(aot_cache.persistent_cache, "store", lambda: None)
    _train("tpu", {})
    torch._dynamo.reset()
    _train("tpu", {})
    counts = _aot_counts()
    assert counts["hits"] == 0 and counts["traced"] == 6 and counts["loaded"] == 0
    assert not torch_cache.joinpath("aotautograd").exists()


_WARM_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch, torch_tpu
from torch._dynamo.utils import counters
import test_aot_cache as t
losses = t._train("tpu", {})
print(json.dumps({"losses": losses, **t._aot_counts(), "xla_compiles": torch_tpu.metrics.counters()["xla_compiles"]}))
"""


def _run(tmp_path: pathlib.Path, script: str = _WARM_SCRIPT) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_TPU_DEBUG",)}
    env.update(
        TORCH_TPU_CACHE_DIR=str(tmp_path / "tpu"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "torch"),
        TORCH_TPU_PLATFORM="cpu",
        TORCH_TPU_ASYNC_COMPILE="0",
    )
    result = run_python(["-c", script, str(pathlib.Path(__file__).parent)], env, cwd=str(tmp_path), timeout=300)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_second_process_traces_and_compiles_nothing(tmp_path):
    cold = _run(tmp_path)
    warm = _run(tmp_path)
    assert cold["misses"] == 2 and cold["traced"] == 3 and cold["graph_compiles"] > 0
    assert warm["hits"] == 2 and warm["misses"] == 0
    assert warm["traced"] == 0 and warm["loaded"] == 3
    assert warm["graph_compiles"] == 0
    assert warm["losses"] == cold["losses"]


_FIRST_COMPILE_SCRIPT = r"""
import json
import torch, torch_tpu
x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
y = torch.compile(lambda x: (x * 2).sin().sum(), backend="tpu")(x.to("tpu"))  # torch._inductor not yet imported
y.backward()
print(json.dumps({"grad": x.grad.tolist()}))
"""


def test_torch_compile_first_thing_in_a_process(tmp_path):
    """torch.compile imports torch._inductor, whose import registers the backend: the backend
    must not need torch._inductor whole at that moment."""
    out = _run(tmp_path, _FIRST_COMPILE_SCRIPT)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.tensor(out["grad"]), 2 * (2 * x).cos())


def test_symbolic_sizes_graph_loads(torch_cache):
    """A graph with symbolic sizes keeps its fake values pickled whole (symbols and all)."""

    def f(x, w):
        return (x @ w).relu().sum(0)

    g = torch.compile(f, backend="tpu", dynamic=True)
    w = torch.randn(3, 5, requires_grad=True)
    xs = [torch.randn(n, 3) for n in (4, 7)]
    cold = [g(x.to("tpu"), w.detach().to("tpu")).cpu() for x in xs]
    before = _aot_counts()
    torch._dynamo.reset()
    warm = [g(x.to("tpu"), w.detach().to("tpu")).cpu() for x in xs]
    after = _aot_counts()
    assert after["hits"] - before["hits"] == 1 and after["traced"] == before["traced"]
    for x, a, b in zip(xs, cold, warm):
        torch.testing.assert_close(b, a)
        torch.testing.assert_close(b, f(x, w.detach()))


def test_backward_with_retain_graph_twice(torch_cache):
    """With the backward compiled at once, aot_autograd refuses retain_graph=True where saved
    tensors would be donated: the backend donates none, cold or loaded from the cache."""
    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    reference = w.clone().requires_grad_()
    (x @ reference).sin().sum().backward()
    for _ in range(2):  # compiled, then loaded from torch's cache
        torch._dynamo.reset()
        f = torch.compile(lambda x, w: (x @ w).sin().sum(), backend="tpu")
        tpu_w = w.to("tpu").requires_grad_()
        y = f(x.to("tpu"), tpu_w)
        y.backward(retain_graph=True)
        y.backward()
        torch.testing.assert_close(tpu_w.grad.cpu(), 2 * reference.grad)
    assert _aot_counts()["hits"] == 1
