"""The C++ steady-state eager path (csrc/eager_kernel.cc): hits give CPU's results, its key holds
everything the Python kernel's does, and what it cannot run goes to the Python kernel."""

from __future__ import annotations

import threading

import pytest
import torch

import torch_tpu
from torch_tpu import _C


def _native_hits() -> int:
    return _C._eager_counters()[0]


def _repeat_on_hits(fn, *cpu_args):
    """fn on tpu copies of `cpu_args`, three times: the first misses, the later ones must be C++
    hits and all must equal fn on CPU (values, dtype, shape and strides)."""
    want = fn(*cpu_args)
    tpu_args = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    fn(*tpu_args)
    before = _native_hits()
    for _ in range(2):
        got = fn(*tpu_args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert g.device.type == "tpu"
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
    assert _native_hits() >= before + 2, "the repeated calls did not run on the C++ path"


g = torch.Generator().manual_seed(0)
A, B = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
M = torch.randn(3, 4, generator=g)


@pytest.mark.parametrize(
    "name, fn, args",
    [
        ("add", lambda a, b: a + b, (A, B)),
        ("add_alpha", lambda a, b: torch.add(a, b, alpha=0.5), (A, B)),
        ("wrapped_number", lambda a: a * 3 - 1.5, (A,)),
        ("mm_of_transposed_view", lambda a, m: torch.mm(a[:, :3], m) + torch.mm(m.t(), a.t().t().t()).sum(), (A, M)),
        ("softmax", lambda a: torch.softmax(a, dim=1), (A,)),
        ("max_dim_two_outputs", lambda a: torch.max(a, dim=1), (A,)),
        ("view_with_offset", lambda a: a[2:, 1:] * 2, (A,)),
        ("int_with_float_number", lambda a: (a * 10).long() + 2.5, (A,)),
        ("conj_view", lambda a, b: torch.complex(a, b).conj() + 1, (A, B)),
        ("neg_view", lambda a, b: torch.complex(a, b).conj().imag * 2, (A, B)),
    ],
)
def test_hits_match_cpu(name, fn, args):
    _repeat_on_hits(fn, *args)


def test_key_holds_the_math_bits_of_a_view():
    z = torch.complex(A, B)
    zt = z.to("tpu")
    for _ in range(3):  # the same geometry with and without the conj bit: two programs
        torch.testing.assert_close((zt[1:] + 1).cpu(), z[1:] + 1)
        torch.testing.assert_close((zt[1:].conj() + 1).cpu(), z[1:].conj() + 1)
        torch.testing.assert_close((zt[1:].conj().imag + 1).cpu(), z[1:].conj().imag + 1)
        torch.testing.assert_close((zt[1:].imag + 1).cpu(), z[1:].imag + 1)


def test_channels_last_result_keeps_its_strides_on_hits():
    x = torch.randn(2, 3, 4, 5, generator=g).contiguous(memory_format=torch.channels_last)
    _repeat_on_hits(lambda t: torch.relu(t) + 1, x)


def test_inplace_on_whole_tensor_and_view():
    def step(base):
        base.mul_(1.5)
        base[1].add_(2.0)
        base[:, 0].sub_(base[:, 1])

    want, got = A.clone(), A.clone().to("tpu")
    for _ in range(3):
        step(want)
        step(got)
        torch.testing.assert_close(got.cpu(), want)


def test_inplace_through_the_fast_path_is_seen_by_views():
    t = torch.zeros(4).to("tpu")
    view = t.view(2, 2)
    for _ in range(3):
        t.add_(1.0)
    assert view.cpu().tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_inplace_calls_reading_self_s_buffer_get_cpus_overlap_rules():
    """An in-place call whose input is self itself stays on the C++ path; one whose input is
    another tensor over self's buffer goes to the Python kernel, which applies CPU's overlap
    checks: disjoint parts and the whole of it run, a partial overlap raises, on every call."""
    want, got = torch.arange(6.0), torch.arange(6.0).to("tpu")
    for _ in range(3):
        for t in (want, got):
            t[:3].add_(t[3:])  # disjoint parts of one buffer
            t.view(2, 3).mul_(t.view(2, 3))  # the whole buffer, another tensor
        torch.testing.assert_close(got.cpu(), want)
        with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
            got.view(2, 3).add_(got[:3])
        torch.testing.assert_close(got.cpu(), want)
    for t in (want, got):
        t.add_(t)  # the miss: the Python kernel offers its entry
    before = _native_hits()
    for _ in range(2):
        got.add_(got)  # self as its own input: C++ hits
        want.add_(want)
    assert _native_hits() == before + 2
    torch.testing.assert_close(got.cpu(), want)


def test_key_holds_the_default_dtype():
    x = torch.arange(4).to("tpu")
    assert (x + 2.5).dtype == torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for _ in range(2):
            y = x + 2.5
            assert y.dtype == torch.float64
            assert y.cpu().tolist() == [2.5, 3.5, 4.5, 5.5]
    finally:
        torch.set_default_dtype(previous)
    assert (x + 2.5).dtype == torch.float32


def test_key_holds_the_matmul_precision():
    a = torch.randn(8, 8, generator=g).to("tpu")
    for _ in range(2):
        a @ a
    previous = torch.get_float32_matmul_precision()
    compiles = torch_tpu.metrics.counters()["op_compiles"]
    try:
        torch.set_float32_matmul_precision("medium")
        a @ a
        assert torch_tpu.metrics.counters()["op_compiles"] == compiles + 1  # a new program, not a hit
    finally:
        torch.set_float32_matmul_precision(previous)


def test_traced_scalar_values_share_one_executable():
    x = A.to("tpu")
    torch.add(x, x, alpha=0.25)
    compiles = torch_tpu.metrics.counters()["op_compiles"]
    for alpha in (0.5, 1.5, -2.0, 3.25):
        torch.testing.assert_close(torch.add(x, x, alpha=alpha).cpu(), torch.add(A, A, alpha=alpha))
    assert torch_tpu.metrics.counters()["op_compiles"] == compiles


def test_errors_still_raise_after_hits():
    a = torch.randn(3, 3).to("tpu")
    for _ in range(2):
        torch.mm(a, a)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.mm(a, a.double())
    if torch.tpu.device_count() >= 2:
        with pytest.raises(RuntimeError, match="same device"):
            a + torch.randn(3, 3).to("tpu:1")
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        a[0].add_(a)


def test_threads_adding_in_place_to_one_tensor_lose_no_writes():
    t = torch.zeros(16).to("tpu")
    t.add_(1.0)  # warm: later adds are C++ hits
    t.sub_(1.0)

    def work():
        for _ in range(50):
            t.add_(1.0)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert t.cpu().tolist() == [200.0] * 16


def test_metrics_count_native_hits_and_reset_them():
    x = A.to("tpu")
    x + x
    torch_tpu.metrics.reset()
    assert torch_tpu.metrics.counters()["op_cache_hits"] == 0
    x + x
    counts = torch_tpu.metrics.counters()
    assert counts["op_cache_hits"] == 1 and counts["executions"] == 1 and counts["op_compiles"] == 0


def test_entries_are_bounded_by_the_op_cache_size(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_OP_CACHE_SIZE", "3")
    for n in range(300, 306):
        x = torch.arange(n, dtype=torch.float32).to("tpu")
        assert (x * 0.5).cpu().tolist() == (torch.arange(n, dtype=torch.float32) * 0.5).tolist()
    assert _C._eager_entry_count() <= 3


def test_precision_change_keeps_the_hits_of_ops_that_do_not_read_it():
    x = A.to("tpu")
    for _ in range(2):
        x * x
    previous = torch.get_float32_matmul_precision()
    compiles, hits = torch_tpu.metrics.counters()["op_compiles"], _native_hits()
    try:
        torch.set_float32_matmul_precision("medium")
        torch.testing.assert_close((x * x).cpu(), A * A)
    finally:
        torch.set_float32_matmul_precision(previous)
    assert torch_tpu.metrics.counters()["op_compiles"] == compiles and _native_hits() == hits + 1


def test_one_signature_on_two_devices_hits_on_both():
    if torch.tpu.device_count() < 2:
        pytest.skip("needs two tpu devices")
    x0, x1 = A.to("tpu:0"), A.to("tpu:1")
    for _ in range(2):
        x0 + x0, x1 + x1
    before = _native_hits()
    for _ in range(2):
        r0, r1 = x0 + x0, x1 + x1
    assert _native_hits() == before + 4
    assert r0.device == torch.device("tpu:0") and r1.device == torch.device("tpu:1")
    torch.testing.assert_close(r1.cpu(), A + A)


def test_jax_nan_checks_apply_to_hits():
    jax = pytest.importorskip("jax")
    x = torch.zeros(3).to("tpu")
    for _ in range(2):
        x / x
    jax.config.update("jax_debug_nans", True)
    try:
        with pytest.raises(Exception, match="nan"):  # as jax raises it
            x / x
    finally:
        jax.config.update("jax_debug_nans", False)
    assert torch.isnan(x / x).all()


def test_value_checks_run_on_every_call_the_cpp_path_takes():
    """Ops whose host check depends on values (pow's exponent, full's fill value, index_select's
    indices) are C++ hits, and the check still raises CPU's error on a call that hits."""
    x = torch.arange(4)
    _repeat_on_hits(lambda t: t**2, x)
    with pytest.raises(RuntimeError, match="negative integer powers"):
        x.to("tpu") ** -1  # the signature of ** 2: the exponent is traced
    for value in (7, 8):
        torch.full((3,), value, dtype=torch.uint8, device="tpu")
    before = _native_hits()
    full = torch.full((3,), 9, dtype=torch.uint8, device="tpu")
    assert _native_hits() == before + 1
    assert full.cpu().tolist() == [9, 9, 9]
    with pytest.raises(RuntimeError, match="overflow"):
        torch.full((3,), 300, dtype=torch.uint8, device="tpu")
    _repeat_on_hits(lambda w, i: torch.index_select(w, 0, i), A, torch.tensor([0, 2]))
    with pytest.raises(IndexError, match="index out of range"):
        torch.index_select(A.to("tpu"), 0, torch.tensor([0, 9]).to("tpu")).cpu()  # (a deferred check: here)


def test_a_repeated_python_number_is_one_cached_device_scalar(monkeypatch):
    # Traced numbers (x * 0.5, add_'s alpha, layer_norm's eps) go in as device scalars cached by
    # value (ops/scalars.py): the repeated call puts nothing on the device and runs the executable
    # directly. Results and dtypes stay CPU's (the scalar is weakly typed, as a Python number).
    from torch_tpu.ops import scalars

    put = []
    real_put = scalars.jax.device_put
    monkeypatch.setattr(scalars.jax, "device_put", lambda *a, **k: put.append(a[0]) or real_put(*a, **k))
    monkeypatch.setattr(scalars, "_cache", type(scalars._cache)())
    x = torch.randn(4, 4)
    t = x.to("tpu")
    for _ in range(5):
        y = t * 0.375
        z = t.add(t, alpha=-0.0)
    assert [v for v in put if isinstance(v, float)].count(0.375) == 1, put  # (arrays: the copy to tpu)
    torch.testing.assert_close(y.cpu(), x * 0.375)
    torch.testing.assert_close(z.cpu(), x.add(x, alpha=-0.0))
    ints = torch.arange(4, dtype=torch.int32)
    assert (ints.to("tpu") * 3).dtype == (ints * 3).dtype == torch.int32
    assert (x.bfloat16().to("tpu") * 2.5).dtype == torch.bfloat16


def test_torch_tpu_kernel_ops_hit_the_cpp_path():
    """Ops of torch_tpu's own namespace (tpu_kernels: autocast's fused linear, Pallas kernels) take
    the C++ path as aten's do: autocast linear with the CPU result of autocast."""
    from torch_tpu.ops import autocast_linear

    x, w, b = torch.randn(4, 6), torch.randn(5, 6), torch.randn(5)
    expected = torch.nn.functional.linear(x.bfloat16(), w.bfloat16(), b.bfloat16())
    op = autocast_linear._INFERENCE
    for _ in range(2):  # the first misses
        op(x.to("tpu"), w.to("tpu"), b.to("tpu"), torch.bfloat16)
    before = _native_hits()
    got = op(x.to("tpu"), w.to("tpu"), b.to("tpu"), torch.bfloat16)
    assert _native_hits() == before + 1, "the call did not run on the C++ path"
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), expected, rtol=1.6e-2, atol=1e-2)
