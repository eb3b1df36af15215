"""The conj and neg bits of tpu tensors read, write and copy as on CPU: `t.conj()` and
`t.conj().imag` are lazy views whose values are their buffer's conjugated or negated."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401
from tests.helpers import platform_tol

TPU = "tpu"


def _pair(data, dtype=torch.complex64) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.tensor(data, dtype=dtype)
    return t, t.to(TPU)


def _same(got: torch.Tensor, expected: torch.Tensor, transcendental: bool = False) -> None:
    """transcendental=True (exp, abs's sqrt, angle's atan2, an FFT's sin and cos twiddles): within
    platform_tol (TPU's units differ from CPU's)."""
    assert got.device.type == TPU
    tol = platform_tol({}) if transcendental else {}
    torch.testing.assert_close(got.cpu().resolve_conj().resolve_neg(), expected.resolve_conj().resolve_neg(), **tol)


V = [1 + 2j, -3 - 1j, 0.5 + 0j, -2j]
M = [[1 + 2j, 3j], [4 + 0j, -1 - 1j]]


def test_conj_view_to_cpu():
    t, d = _pair(V)
    assert d.conj().is_conj()
    assert torch.equal(d.conj().cpu(), t.conj())
    assert torch.equal(d.conj().to("cpu"), t.conj())


@pytest.mark.parametrize(
    "fn,transcendental",
    [
        (lambda x: x + x.conj(), False),
        (lambda x: x.conj() * x, False),
        (lambda x: x.conj() - 1j, False),
        (lambda x: torch.exp(x.conj()), True),
        (lambda x: x.conj().abs(), True),
        (lambda x: x.conj().angle(), True),
    ],
    ids=["add", "mul", "sub_scalar", "exp", "abs", "angle"],
)
def test_arithmetic_on_conj_views(fn, transcendental):
    t, d = _pair(V)
    _same(fn(d), fn(t), transcendental=transcendental)


def test_sum_and_mean_of_conj_view():
    t, d = _pair(M)
    _same(d.conj().sum(), t.conj().sum())
    _same(d.conj().mean(dim=0), t.conj().mean(dim=0))


def test_neg_view():
    t, d = _pair(V)
    n, e = d.conj().imag, t.conj().imag
    assert n.is_neg() and e.is_neg()
    assert torch.equal(n.cpu(), e)
    _same(n * 2 + 1, e * 2 + 1)
    _same(torch.neg(n), torch.neg(e))
    _same(d._neg_view() + d, t._neg_view() + t)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_matmul_of_conj_inputs(dtype):
    t, d = _pair(M, dtype)
    _same(d.conj() @ d, t.conj() @ t)
    _same(d @ d.mH, t @ t.mH)
    _same(torch.mm(d.conj(), d.conj()), torch.mm(t.conj(), t.conj()))
    _same(torch.bmm(d.conj()[None], d[None]), torch.bmm(t.conj()[None], t[None]))
    _same(torch.vdot(d.conj()[0], d[1]), torch.vdot(t.conj()[0], t[1]))
    _same(torch.dot(d[0].conj(), d[1]), torch.dot(t[0].conj(), t[1]))


def test_adjoint_and_transposes():
    t, d = _pair(M)
    for name in ("mH", "H"):
        assert torch.equal(getattr(d, name).cpu(), getattr(t, name))
    assert torch.equal(d.adjoint().cpu(), t.adjoint())
    assert torch.equal(d.conj().T.cpu(), t.conj().T)


def test_resolve_and_conj_physical_clear_the_bits():
    t, d = _pair(V)
    for got, expected in [
        (d.conj().resolve_conj(), t.conj().resolve_conj()),
        (d.conj().conj_physical(), t.conj().conj_physical()),
        (d.conj().imag.resolve_neg(), t.conj().imag.resolve_neg()),
    ]:
        assert not got.is_conj() and not got.is_neg()
        assert torch.equal(got.cpu(), expected)
    c = d.conj()
    c_cpu = t.conj()
    torch.conj_physical_(c)
    torch.conj_physical_(c_cpu)
    assert torch.equal(c.cpu(), c_cpu) and torch.equal(d.cpu(), t)
    out_t, out_d = torch.empty(0, dtype=t.dtype), torch.empty(0, dtype=t.dtype, device=TPU)
    torch.conj_physical(t.conj(), out=out_t)
    torch.conj_physical(d.conj(), out=out_d)
    assert torch.equal(out_d.cpu(), out_t)
    p_t, p_d = t.clone(), d.clone()
    p_t.conj_physical_()
    p_d.conj_physical_()
    assert torch.equal(p_d.cpu(), p_t)


def test_clone_and_contiguous_of_conj_view():
    t, d = _pair(M)
    for got, expected in [(d.conj().clone(), t.conj().clone()), (d.conj().T.contiguous(), t.conj().T.contiguous())]:
        assert torch.equal(got.cpu().resolve_conj(), expected.resolve_conj())
    cl = d.conj().clone()
    d.add_(1)  # the clone holds its own values
    assert torch.equal(cl.cpu().resolve_conj(), t.conj().resolve_conj())


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.conj().add_(1j),
        lambda x: x.conj().mul_(2j),
        lambda x: x.conj()[1:3].zero_(),
        lambda x: x.conj().imag.add_(1),
        lambda x: x.conj().imag.mul_(3),
        lambda x: x.conj().real.sub_(2),
    ],
    ids=["add_", "mul_", "slice_zero_", "neg_imag_add_", "neg_imag_mul_", "real_sub_"],
)
def test_inplace_through_a_conj_view_writes_the_base(fn):
    t, d = _pair(V)
    fn(t)
    fn(d)
    assert torch.equal(d.cpu(), t)


def test_copy_into_and_from_conj_views():
    t, d = _pair(V)
    src = torch.tensor([5 + 5j, 1j, -1 - 1j, 2 + 0j])
    for dst in (t, d):
        dst.conj().copy_(src)
    assert torch.equal(d.cpu(), t)
    # tpu -> tpu, conj source into a plain tensor and into a conj view
    t2, d2 = _pair(V)
    out_t, out_d = torch.empty_like(t2), torch.empty_like(d2)
    out_t.copy_(t2.conj())
    out_d.copy_(d2.conj())
    assert torch.equal(out_d.cpu(), out_t)
    out_t.conj().copy_(t2.conj())
    out_d.conj().copy_(d2.conj())
    assert torch.equal(out_d.cpu(), out_t)
    # tpu conj view -> CPU tensor, CPU conj view -> tpu
    host = torch.empty_like(t2)
    host.copy_(d2.conj())
    assert torch.equal(host, t2.conj())
    dev = torch.empty_like(d2)
    dev.copy_(t2.conj())
    assert torch.equal(dev.cpu(), t2.conj().resolve_conj())
    # a neg view as a copy target
    t3, d3 = _pair(V)
    t3.conj().imag.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    d3.conj().imag.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert torch.equal(d3.cpu(), t3)


def test_indexing_conj_views():
    t, d = _pair(M)
    for fn in (
        lambda x: x.conj()[1],
        lambda x: x.conj()[:, 1],
        lambda x: x.conj()[torch.tensor([1, 0], device=x.device)],
        lambda x: x.conj().flatten()[[3, 0, 2]],
        lambda x: x.conj()[x.abs() > 3],
        lambda x: torch.index_select(x.conj(), 1, torch.tensor([1, 1], device=x.device)),
    ):
        _same(fn(d), fn(t))


def test_dtype_casts_of_conj_and_neg_views():
    t, d = _pair(V)
    _same(d.conj().to(torch.complex128), t.conj().to(torch.complex128))
    _same(d.conj().imag.to(torch.float64), t.conj().imag.to(torch.float64))


def test_fft_of_conj_view():
    t, d = _pair([V, V[::-1]])
    _same(torch.fft.fft(d.conj()), torch.fft.fft(t.conj()), transcendental=True)
    _same(torch.fft.ifft(d.conj(), dim=0), torch.fft.ifft(t.conj(), dim=0), transcendental=True)
    _same(torch.fft.hfft(d), torch.fft.hfft(t), transcendental=True)


def test_compiled_graph_reads_conj_inputs():
    def f(x, y):
        return x * 2 + y

    t, d = _pair(V)
    compiled = torch.compile(f, backend="tpu")
    _same(compiled(d.conj(), d), f(t.conj(), t))
    _same(compiled(d.conj().imag, d.real), f(t.conj().imag, t.real))


def test_compiled_graph_mutating_a_conj_input():
    def f(x):
        x.add_(1j)
        return x.abs()

    t, d = _pair(V)
    compiled = torch.compile(f, backend="tpu")
    expected = f(t.conj())
    got = compiled(d.conj())
    _same(got, expected, transcendental=True)  # abs
    assert torch.equal(d.cpu(), t)
