"""The host tier (platforms/cpu/host_tier.py): a first-seen op signature runs with PyTorch's CPU kernel
while its executable compiles in the background (platforms/cpu/background_compile.py), and the calls
after the compile run the executable. Both give CPU's results, views alias, in-place ops mutate."""

from __future__ import annotations

import os

import pytest
import torch

import torch_tpu
from tests.helpers import run_python
from torch_tpu.platforms.cpu import background_compile

pytestmark = pytest.mark.cpu_client  # the host tier and the compile worker are the CPU client's

_SHAPES = iter(range(3, 400))  # every test's tensors get sizes no other test uses: first calls miss


@pytest.fixture(autouse=True)
def _async_compile(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_ASYNC_COMPILE", "1")
    assert background_compile.drain(timeout=300)
    yield
    assert background_compile.drain(timeout=300)


def _count(key: str) -> int:
    return torch_tpu.metrics.counters().get(key, 0)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.device.type == "tpu"
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def _host_then_compiled(fn, *cpu_args):
    """fn on tpu copies of `cpu_args`: the first call runs on the host tier, and once the
    background compile finished the next runs the executable; both equal fn on CPU."""
    want = fn(*cpu_args)
    tpu_args = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    runs, compiles = _count("host_tier_runs"), _count("op_compiles")
    got = fn(*tpu_args)
    assert _count("host_tier_runs") > runs and _count("op_compiles") == compiles
    assert background_compile.drain(timeout=300)
    runs = _count("host_tier_runs")
    again = fn(*tpu_args)
    assert _count("host_tier_runs") == runs and _count("op_compiles") > compiles
    for result in (got, again):
        pairs = zip(result, want) if isinstance(want, tuple) else [(result, want)]
        for g, w in pairs:
            _same(g, w)


def test_elementwise_with_numbers_and_promotion():
    n = next(_SHAPES)
    a, b = torch.randn(n, 4), torch.arange(4)
    _host_then_compiled(lambda x, y: (x * 2 + y) / 3 - 1, a, b)


def test_multiple_outputs():
    a = torch.randn(next(_SHAPES), 5)
    _host_then_compiled(lambda x: torch.max(x, dim=1), a)


def test_reduction_matmul_and_softmax():
    n = next(_SHAPES)
    a, w = torch.randn(n, 8), torch.randn(8, 6)
    _host_then_compiled(lambda x, m: torch.softmax(x @ m, dim=-1).sum(0), a, w)


def test_views_in_and_channels_last_out():
    x = torch.randn(2, 3, next(_SHAPES), 5).contiguous(memory_format=torch.channels_last)
    _host_then_compiled(lambda t: torch.relu(t[:, 1:]) * 2, x)


def test_bfloat16():
    a = torch.randn(next(_SHAPES), 7).to(torch.bfloat16)
    _host_then_compiled(lambda x: torch.nn.functional.gelu(x) + x.mean(), a)


def test_tensors_over_a_buffer_of_another_dtype():
    """A complex tensor over a float buffer (view_as_complex) and a float view of a complex one
    (view_as_real) run on the host, reading and writing the buffer's bytes in their own dtype."""
    n = next(_SHAPES)
    pairs = torch.randn(n, 3, 2)
    _host_then_compiled(lambda p: torch.atan(torch.view_as_complex(p)[1:]), pairs)
    _host_then_compiled(lambda z: torch.view_as_real(z).sin(), torch.randn(n, 3, dtype=torch.complex64))

    def scale_real(p):
        torch.view_as_complex(p).mul_(2j)  # in place through the complex view: p changes
        return p + 0

    want = scale_real(pairs.clone())
    got = pairs.to("tpu")
    for _ in range(2):  # host tier, then the executable
        torch.testing.assert_close(scale_real(got).cpu(), want)
        assert background_compile.drain(timeout=300)
        want = scale_real(want)


def test_inplace_through_views_is_seen_by_every_alias():
    def step(base):
        view = base.view(-1)
        base[1].add_(2.0)
        base[:, 0].sub_(base[:, 1])  # reads a column of the storage it writes
        base.mul_(0.5)
        return view

    want = torch.randn(4, next(_SHAPES))
    got = want.to("tpu")
    for _ in range(3):  # host tier, then the executables
        want_view = step(want)
        got_view = step(got)
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(got_view.cpu(), want_view)
        assert background_compile.drain(timeout=300)


def test_compiles_on_a_thread_when_asked(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_ASYNC_COMPILE", "thread")
    a = torch.randn(next(_SHAPES), 3)
    _host_then_compiled(lambda x: torch.tanh(x).cumsum(0), a)


def test_a_dead_worker_costs_no_result():
    """Jobs the worker process took down with it compile at their next call; results stay CPU's."""
    x = torch.randn(next(_SHAPES), 6)
    xt = x.to("tpu")
    torch.testing.assert_close((xt * 5 - 2).cpu(), x * 5 - 2)  # starts the worker
    worker = background_compile._process
    if worker is not None:
        worker.close()
    for _ in range(3):
        torch.testing.assert_close((xt.exp() / 4).cpu(), x.exp() / 4)
        torch.testing.assert_close((xt * 5 - 2).cpu(), x * 5 - 2)
        assert background_compile.drain(timeout=300)


def test_random_ops_compile_before_they_run():
    """CPU's generator draws other numbers: random ops never run on the host tier. A random fill
    of a small tensor draws through a length bucket (ops/random_fills.py); other random ops
    compile their signature before they run."""
    compiles, runs, fills = _count("op_compiles"), _count("host_tier_runs"), _count("bucketed_random_fills")
    torch.rand(next(_SHAPES), device="tpu")
    assert _count("bucketed_random_fills") == fills + 1 and _count("op_compiles") == compiles
    torch.randperm(next(_SHAPES), device="tpu")
    assert _count("op_compiles") == compiles + 1 and _count("host_tier_runs") == runs


def test_off_compiles_at_the_first_call(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_ASYNC_COMPILE", "0")
    x = torch.randn(next(_SHAPES)).to("tpu")
    compiles, runs = _count("op_compiles"), _count("host_tier_runs")
    torch.testing.assert_close((x * 3).cpu(), x.cpu() * 3)
    assert _count("op_compiles") == compiles + 1 and _count("host_tier_runs") == runs


def test_errors_are_cpus():
    a, b = torch.randn(3, next(_SHAPES)).to("tpu"), torch.randn(5, 2).to("tpu")
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(a, b)


def test_exit_with_compiles_pending_does_not_wait_for_them():
    """Without a persistent cache to keep them, a process that leaves many compiles queued drops
    them at exit: only the one compiling then finishes (its atexit report counts the XLA compiles
    done). With the cache, the exit finishes them (test_persistent_cache_warm.py)."""
    code = (
        "import atexit, torch, torch_tpu\n"
        "from torch_tpu.platforms.cpu import background_compile\n"
        "x = torch.randn(64).to('tpu')\n"
        "for n in range(1, 60):\n"
        "    (x[:n] * 2 + 1).sum()\n"
        "queued = background_compile.pending_count()\n"
        "atexit.register(lambda: print(queued, torch_tpu.metrics.counters()['xla_compiles']))\n"
    )
    env = dict(os.environ, TORCH_TPU_ASYNC_COMPILE="1", TORCH_TPU_PERSISTENT_CACHE="0")
    result = run_python(["-c", code], env, cwd="/")
    assert result.returncode == 0, result.stderr[-2000:]
    queued, compiled = map(int, result.stdout.split())
    assert queued > 100 and compiled < 59 * 3 - 90, (queued, compiled)


def test_growing_append_and_attention_run_on_the_host_then_bucketed():
    """A KV cache grown by appends: while the bucketed executables compile, the appends give
    bucketed tensors on the host and attention over them runs there; both equal CPU throughout."""
    heads, dim = 2, 8
    q = torch.randn(1, heads, 1, dim)
    k_cpu = torch.randn(1, heads, next(_SHAPES) % 7 + 9, dim)
    v_cpu = torch.randn_like(k_cpu)
    k, v = k_cpu.to("tpu"), v_cpu.to("tpu")
    for step in range(6):
        new_k, new_v = torch.randn(1, heads, 1, dim), torch.randn(1, heads, 1, dim)
        k_cpu, v_cpu = torch.cat([k_cpu, new_k], 2), torch.cat([v_cpu, new_v], 2)
        k, v = torch.cat([k, new_k.to("tpu")], 2), torch.cat([v, new_v.to("tpu")], 2)
        assert k.untyped_storage().nbytes() == k.numel() * k.element_size()  # exact to PyTorch
        want = torch.nn.functional.scaled_dot_product_attention(q, k_cpu, v_cpu)
        got = torch.nn.functional.scaled_dot_product_attention(q.to("tpu"), k, v)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k.cpu(), k_cpu)
        if step == 2:
            assert background_compile.drain(timeout=300)
    assert _count("length_bucketed_ops") > 0


def test_hf_generate_matches_cpu():
    transformers = pytest.importorskip("transformers")
    from torch_tpu.testing.models import TINY_LLAMA

    config = transformers.LlamaConfig(**{**TINY_LLAMA, "hidden_size": 48 + next(_SHAPES) % 4 * 16})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(0, config.vocab_size, (1, 6))
    settings = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
    with torch.no_grad():
        want = model.generate(prompt, **settings)
        runs = _count("host_tier_runs")
        got = model.to("tpu").generate(prompt.to("tpu"), **settings)
    assert _count("host_tier_runs") > runs
    assert got.cpu().tolist() == want.tolist()


def test_reads_and_copies_of_views_compile_nothing(monkeypatch):
    """On the CPU client a buffer is host memory: .item(), .cpu() and copies into views of any
    geometry go through it (printing a tensor reads each element at its own offset)."""
    monkeypatch.setenv("TORCH_TPU_ASYNC_COMPILE", "0")
    x = torch.randn(5, next(_SHAPES))
    t = x.to("tpu")
    compiles = _count("xla_compiles")
    assert [t[i, j].item() for i in range(5) for j in range(3)] == [x[i, j].item() for i in range(5) for j in range(3)]
    assert torch.equal(t[1:, ::2].cpu(), x[1:, ::2]) and torch.equal(t.t()[2].cpu(), x.t()[2])
    t[2] = torch.arange(float(x.shape[1]))
    x[2] = torch.arange(float(x.shape[1]))
    t[:, 1].copy_(t[:, 0])
    x[:, 1].copy_(x[:, 0])
    t[3:].copy_(torch.ones(2, x.shape[1], dtype=torch.float64))
    x[3:].copy_(torch.ones(2, x.shape[1], dtype=torch.float64))
    assert torch.equal(t.cpu(), x)
    assert _count("xla_compiles") == compiles


def test_a_grown_storage_reads_its_old_value_then_zeros():
    """resize_ keeps the shorter array; the host view pads it as every other read does."""
    t = torch.arange(4.0).to("tpu")
    t.resize_(3, 3)
    assert torch.equal(t.view(-1)[:4].cpu(), torch.arange(4.0))
    empty = torch.empty(0, device="tpu")
    empty.resize_(3, 3).copy_(torch.ones(3, 3))  # what an out= result of the CPU fallback gets
    assert torch.equal(empty.cpu(), torch.ones(3, 3))


def test_a_host_view_does_not_stop_donation():
    """Reading a tensor leaves a cached host view of its array; a compiled graph that donates
    the array drops that view first instead of copying the buffer."""
    x = torch.zeros(4).to("tpu")

    @torch.compile(backend="tpu", options={"donate_buffers": True})
    def bump(t):
        t.add_(1)
        return t.sum()

    bump(x)
    assert x.cpu().tolist() == [1.0] * 4
    donated, copies = _count("donated_buffers"), _count("donation_copies")
    bump(x)
    assert (_count("donated_buffers") - donated, _count("donation_copies") - copies) == (1, 0)
    assert x.cpu().tolist() == [2.0] * 4
