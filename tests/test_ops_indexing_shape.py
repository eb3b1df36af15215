"""Indexing, gather/scatter, sort/unique and shape lowerings equal CPU; views alias."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import torch_tpu
from tests.helpers import data, same, same_error

NAN = float("nan")


DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
T = torch.tensor


def on(x, t):
    """`t` on the device of `x` (index tensors must be)."""
    return t.to(x.device)


# ---- views alias and match CPU --------------------------------------------------------


VIEWS = {
    "t": lambda x: x.t(),
    "transpose": lambda x: x.transpose(0, 1),
    "permute": lambda x: x.permute(1, 0),
    "unsqueeze_squeeze": lambda x: x.unsqueeze(0).squeeze(0),
    "view": lambda x: x.view(2, 6),
    "reshape_contig": lambda x: x.reshape(12),
    "flatten": lambda x: x.flatten(),
    "unflatten": lambda x: x.unflatten(1, (2, 2)),
    "movedim": lambda x: x.movedim(0, 1),
    "narrow": lambda x: x.narrow(1, 1, 2),
    "select": lambda x: x[1],
    "select_neg": lambda x: x[:, -1],
    "slice_step": lambda x: x[::2, 1::2],
    "diagonal": lambda x: x.diagonal(),
    "diagonal_off": lambda x: x.diagonal(1),
    "as_strided": lambda x: x.as_strided((2, 2), (1, 4), 1),
    "split0": lambda x: x.split(2, 1)[1],
    "chunk": lambda x: x.chunk(2, 0)[0],
    "unbind": lambda x: x.unbind(1)[2],
    "expand_select": lambda x: x[0:1].expand(3, 4)[2],
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_view_aliases_and_matches_cpu(name):
    view = VIEWS[name]
    base_c = torch.arange(12.0).reshape(3, 4)
    base_t = base_c.to("tpu")
    v_c, v_t = view(base_c), view(base_t)
    assert v_t._base is base_t or v_t.untyped_storage().data_ptr() == base_t.untyped_storage().data_ptr()
    torch.testing.assert_close(v_t.cpu(), v_c)
    torch.testing.assert_close(v_t.contiguous().cpu(), v_c.contiguous())
    if name != "expand_select":
        # In-place on the view changes the base ...
        v_c.mul_(10)
        v_t.mul_(10)
        torch.testing.assert_close(base_t.cpu(), base_c)
    # ... and in-place on the base shows through the view.
    base_c.add_(1)
    base_t.add_(1)
    torch.testing.assert_close(v_t.cpu(), v_c)


def test_reshape_of_noncontiguous_copies():
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    r = t.t().reshape(12)
    torch.testing.assert_close(r.cpu(), x.t().reshape(12))
    r.add_(100)  # a copy: the base is unchanged
    torch.testing.assert_close(t.cpu(), x)
    same(lambda x: x.t().flatten(), x)
    same(lambda x: x[:, ::2].reshape(-1, 3), x)
    same(lambda x: x.t().contiguous().view(-1), x)
    same(lambda x: x.t().reshape(2, 6), x, grad=True)


def test_split_chunk_unbind_alias():
    t = torch.arange(12.0).reshape(3, 4).to("tpu")
    for parts in (t.split(2, 1), t.chunk(3, 0), t.unbind(0), t.split([1, 3], 1)):
        for p in parts:
            assert p.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    _, b = t.split(2, 1)
    b.zero_()
    assert t.cpu()[:, 2:].abs().sum() == 0


def test_view_backward_uses_scatter_ops():
    x = torch.randn(3, 4)
    same(lambda x: x[1], x, grad=True)
    same(lambda x: x[:, 1:3], x, grad=True)
    same(lambda x: x[::2], x, grad=True)
    same(lambda x: x.diagonal(), x, grad=True)
    same(lambda x: x.diagonal(-1), x, grad=True)
    same(lambda x: x.as_strided((2, 2), (1, 4), 1), x, grad=True)
    same(lambda x: x.unbind(1), x, grad=True)
    same(lambda x: x.split(3, 1), x, grad=True)


def test_scatter_ops_direct():
    x, s = torch.randn(4, 5), torch.randn(4, 2)
    same(lambda x, s: torch.slice_scatter(x, s, 1, 1, 5, 2), x, s)
    same(lambda x, s: torch.slice_scatter(x, s, -1, -2), x, s)
    same(lambda x, s: torch.select_scatter(x, s[:, 0], 1, -1), x, s)
    same(lambda x, s: torch.diagonal_scatter(x, s.reshape(-1)[:4], 1), x, s)
    same(lambda x, s: torch.diagonal_scatter(x, s[:3, 0], -1, 0, 1), x, s)
    same(lambda x, s: torch.as_strided_scatter(x, s[:2], (2, 2), (5, 1), 3), x, s)


# ---- cat / stack -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat_stack(dtype):
    a, b = data(dtype, (2, 3)), data(dtype, (4, 3))
    same(lambda a, b: torch.cat([a, b]), a, b)
    same(lambda a, b: torch.cat([a.t(), b.t()], -1), a, b)
    same(lambda a, b: torch.stack([a, b[:2]], 1), a, b)
    same(lambda a, b: torch.stack([a, a], -1), a, b)


def test_cat_promotion_empty_and_out():
    a, b = torch.randn(2, 3), torch.arange(6).reshape(2, 3)
    out = same(lambda a, b: torch.cat([a, b], 1), a, b)
    assert out.dtype == torch.float32
    same(lambda a, b: torch.cat([b, b.bool()]), a, b)
    same(lambda a, b: torch.cat([a, torch.empty(0, device=a.device)]), a, b)
    same(lambda a, b: torch.cat([torch.empty(0, device=a.device), a, a[:0]]), a, b)
    same(lambda a, b: torch.cat([torch.empty(0, device=a.device, dtype=torch.int64), a]), a, b)
    same(lambda a: torch.cat([a[:, :1], a[:, 2:]], 1), a)
    out = torch.empty(4, 3, device="tpu")
    torch.cat([a.to("tpu"), a.to("tpu")], out=out)
    torch.testing.assert_close(out.cpu(), torch.cat([a, a]))
    same_error(lambda a, b: torch.cat([a, b.t()]), a, b)


def test_cat_stack_grad():
    a, b = torch.randn(2, 3), torch.randn(1, 3)
    same(lambda a, b: torch.cat([a, b]), a, b, grad=True)
    same(lambda a, b: torch.cat([a.t(), b.t()], 1), a, b, grad=True)
    same(lambda a, b: torch.stack([a[0], b[0]]), a, b, grad=True)


# ---- flip / roll / repeat / tril / triu ------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_flip_roll_repeat_tril(dtype):
    x = data(dtype, (3, 4))
    same(lambda x: x.flip(0), x)
    same(lambda x: x.flip((0, -1)), x)
    same(lambda x: x.t().flip(1), x)
    same(lambda x: x.roll(1, 0), x)
    same(lambda x: x.roll(-3), x)
    same(lambda x: x.roll((1, 2), (1, 0)), x)
    same(lambda x: x.repeat(2, 1), x)
    same(lambda x: x.repeat(2, 1, 3), x)
    same(lambda x: x.t().repeat(1, 2), x)
    same(lambda x: x.tril(), x)
    same(lambda x: x.triu(1), x)
    same(lambda x: x.tril(-1), x)
    same(lambda x: x.t().triu(), x)


def test_shape_ops_grad_and_inplace():
    x = torch.randn(3, 4)
    for fn in (
        lambda x: x.flip(1),
        lambda x: x.roll(1, 0),
        lambda x: x.repeat(2, 2),
        lambda x: x.tril(),
        lambda x: x.triu(-1),
    ):
        same(fn, x, grad=True)
    same(lambda x: x.tril_(), x)
    same(lambda x: x.t().triu_(1), x)
    same(lambda x: x.tril(0).triu(0), torch.randn(2, 3, 3))


# ---- padding ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,shape,pad",
    [
        ("constant", (3, 4), (1, 2)),
        ("constant", (3, 4), (1, 0, 2, 1)),
        ("constant", (3, 4), (-1, 1)),
        ("reflect", (2, 5), (2, 1)),
        ("reflect", (1, 2, 5), (1, 3)),
        ("reflect", (2, 3, 4), (1, 2, 2, 1)),
        ("reflect", (1, 2, 3, 4), (1, 1, 2, 0)),
        ("replicate", (2, 5), (2, 3)),
        ("replicate", (1, 2, 5), (0, 3)),
        ("replicate", (1, 2, 3, 4), (1, 2, 3, 1)),
        ("replicate", (1, 1, 2, 3, 4), (1, 1, 1, 1, 1, 1)),
        ("reflect", (1, 1, 3, 3, 4), (1, 1, 1, 2, 2, 1)),
        ("circular", (1, 2, 5), (1, 2)),
    ],
)
def test_pad(mode, shape, pad):
    same(lambda x: F.pad(x, pad, mode=mode), torch.randn(shape), grad=True)
    swapped = torch.randn((*shape[:-2], shape[-1], shape[-2]))
    same(lambda x: F.pad(x.transpose(-1, -2), pad, mode=mode), swapped, grad=True)  # non-contiguous


def test_constant_pad_value_and_dtypes():
    same(lambda x: F.pad(x, (1, 1), value=2.5), torch.randn(2, 3))
    same(lambda x: F.pad(x, (1, 1, 1, 1), value=7), torch.arange(6).reshape(2, 3))
    same(lambda x: F.pad(x, (0, 2), value=True), torch.ones(2, 2, dtype=torch.bool))
    same_error(lambda x: F.pad(x, (4, 4), mode="reflect"), torch.randn(1, 2, 3))


# ---- advanced indexing: index / index_put ------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_tensor(dtype):
    x = data(dtype, (4, 5, 3))
    i, j = T([0, 2, -1]), T([[1], [-4]])
    same(lambda x: x[i], x)
    same(lambda x: x[:, i], x)
    same(lambda x: x[i, :, i], x)  # non-adjacent advanced indices go first
    same(lambda x: x[j, i], x)  # broadcasting index tensors
    same(lambda x: x[None, i, 1:, None], x)
    same(lambda x: x[..., T([2, 0])], x)
    same(lambda x: x[T(1), T([0, 1])], x)
    same(lambda x: x.transpose(0, 2)[i[:2]], x)
    same(lambda x: x[i.int()], x)
    same(lambda x: x[[0, 3]], x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_bool_mask(dtype):
    x = data(dtype, (3, 4))
    m = torch.rand(3, 4) > 0.5
    same(lambda x, m: x[m], x, m)
    same(lambda x, m: x[m[:, 0]], x, m)
    same(lambda x, m: x[:, m[0]], x, m)
    same(lambda x, m: x[m[:, 0], 1:], x, m)
    same(lambda x, m: x[m[:, 0], T([1, 0, 2])[: int(m[:, 0].sum())]] if m[:, 0].sum() else x, x, m)
    same(lambda x: x[x > 0] if dtype != torch.bool else x[x], x)
    same(lambda x: x[torch.zeros(3, 4, dtype=torch.bool, device=x.device)], x)
    same(lambda x: x.t()[m.t().to(x.device)], x)  # CPU mask on a tpu tensor


def test_index_cpu_index_tensors_on_tpu_tensor():
    x = torch.randn(4, 3)
    t = x.to("tpu")
    torch.testing.assert_close(t[T([1, -1])].cpu(), x[T([1, -1])])
    torch.testing.assert_close(t[T([True, False, True, False])].cpu(), x[T([True, False, True, False])])


def test_index_errors_like_cpu():
    x = torch.randn(3, 4)
    same_error(lambda x: x[T([5])], x, match=True)
    same_error(lambda x: x[T([-4])], x, match=True)
    same_error(lambda x: x[:, T([0, 4])], x, match=True)
    same_error(lambda x: x[T([0, 1]), T([0, 1, 2])], x, match=True)
    same_error(lambda x: x[T([1.0])], x, match=True)
    same_error(lambda x: x[torch.ones(2, dtype=torch.bool)], x, match=True)
    same_error(lambda x: x[T([0]), T([0]), T([0])], x, match=True)
    t = x.to("tpu")
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 3"):
        t[T([5]).to("tpu")]
        torch.tpu.synchronize()  # where index checks are deferred (TPU), they report here
    with pytest.raises(IndexError):
        t[T([5])]  # CPU index tensor, checked on the host


def test_index_grad():
    x = torch.randn(4, 3)
    same(lambda x: x[T([0, 2, 2, -1])], x, grad=True)  # repeated indices accumulate
    same(lambda x: x[:, T([1, 1])], x, grad=True)
    same(lambda x: x[x > 0], x, grad=True)
    same(lambda x: x.t()[T([2, 0])], x, grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_setitem(dtype):
    x = data(dtype, (4, 3))
    v = data(dtype, (2, 3))
    m = torch.rand(4, 3) > 0.5

    def put_index(x, v):
        x[T([0, -1])] = v
        return x

    def put_scalar(x):
        x[T([1, 2]), T([0, 2])] = 1
        return x

    def put_mask_scalar(x, m):
        x[m] = 0
        return x

    def put_mask_row(x, m):
        x[m[:, 0]] = 1
        return x

    def put_mask_values(x, m):
        x[m] = x[m].flip(0)
        return x

    def put_mask_view(x, m):
        x.t()[m.t()] = 1
        return x

    def put_view(x, v):
        x.t()[T([2]), 1:3] = v[0, :2]
        return x

    same(put_index, x, v)
    same(put_scalar, x)
    same(put_mask_scalar, x, m)
    same(put_mask_row, x, m)
    same(put_mask_values, x, m)
    same(put_view, x, v)
    same(put_mask_view, x, m)


def test_index_put_accumulate():
    x, v = torch.randn(4, 3), torch.randn(3, 3)
    same(lambda x, v: x.index_put_((T([0, 2, 0]),), v, accumulate=True), x, v)
    same(lambda x, v: x.index_put((T([0, 2, 0]), T([1, 1, 1])), v[0], accumulate=True), x, v)
    same(lambda x, v: x.index_put_((T([3, 1]),), v[:2]), x, v)

    def add_at(x):
        x[T([1, 3])] += 1
        return x

    same(add_at, x)

    def add_mask(x):
        x[x > 0] += 2
        return x

    same(add_mask, x)
    same(lambda x: x.index_put_((x > 0,), torch.tensor(1.0, device=x.device), accumulate=True), x)
    same(lambda x, v: x.index_put_((T([0, 1]),), v[:2], accumulate=True), torch.arange(12).reshape(4, 3), v.long())
    same(lambda x: x.index_put_((T([0, 1]),), torch.tensor(5.0), accumulate=True), x)  # CPU scalar value


def test_index_put_errors_and_grad():
    x = torch.randn(3, 4)

    def oob(x):
        x[T([3])] = 1.0

    def oob_acc(x):
        x.index_put_((T([-4]),), torch.tensor(1.0, device=x.device), accumulate=True)

    def bad_dtype(x):
        x.long().index_put_((x > 0,), x[x > 0])

    def bad_dtype_index(x):
        x.long().index_put_((T([0]),), torch.tensor(1.5))

    same_error(oob, x, match=True)
    same_error(oob_acc, x, match=True)
    same_error(bad_dtype, x, match=True)
    same_error(bad_dtype_index, x, match=True)
    same(lambda x: x.index_put_((x > 0,), torch.tensor(2)), x)  # CPU scalar: cast, as on CPU
    same(lambda x, v: x.index_put((T([0, 2]),), v), x, torch.randn(2, 4), grad=True)
    same(lambda x, v: x.index_put((T([0, 0]),), v, accumulate=True), x, torch.randn(2, 4), grad=True)


# ---- gather / scatter family ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_scatter(dtype):
    x = data(dtype, (3, 4))
    src = data(dtype, (3, 4))
    idx = T([[0, 1], [2, 0], [1, 1]])
    perm = torch.stack([torch.randperm(4)[:2] for _ in range(3)])  # no duplicates per row
    same(lambda x: x.gather(1, on(x, idx)), x)
    same(lambda x: x.gather(0, on(x, idx[:2].clamp(max=2))), x)
    same(lambda x: x.t().gather(0, on(x, idx.t())), x)
    same(lambda x, s: x.scatter(1, on(x, perm), s), x, src)
    same(lambda x, s: x.scatter(0, on(x, T([[2, 0, 1, 0]])), s), x, src)
    same(lambda x: x.scatter(1, on(x, perm), 1), x)
    same(lambda x, s: x.t().scatter(0, on(x, perm.t()), s.t()), x, src)
    same(lambda x, s: x.scatter_(1, on(x, perm), s), x, src)
    if dtype != torch.bool:
        tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
        same(lambda x, s: x.scatter_add(1, on(x, idx), s), x, src, **tol)
        same(lambda x, s: x.scatter(1, on(x, idx), s, reduce="add"), x, src, **tol)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce(reduce, include_self, dtype):
    x = data(dtype, (2, 4))
    src = data(dtype, (2, 3))
    idx = T([[0, 1, 0], [2, 2, 1]])
    same(lambda x, s: x.scatter_reduce(1, on(x, idx), s, reduce, include_self=include_self), x, src)


def test_scatter_legacy_reduce_and_grad():
    x, src = torch.randn(3, 4), torch.randn(3, 4)
    idx = T([[0, 1], [2, 0], [1, 1]])
    same(lambda x, s: x.scatter(1, on(x, idx), s, reduce="multiply"), x, src)
    same(lambda x: x.scatter(1, on(x, idx), 2.0, reduce="add"), x)
    same(lambda x: x.gather(1, on(x, idx)), x, grad=True)
    same(lambda x, s: x.scatter_add(1, on(x, idx), s), x, src[:, :2], grad=True)
    same(lambda x, s: x.scatter(1, on(x, T([[0, 1], [2, 0], [1, 3]])), s), x, src[:, :2], grad=True)


def test_out_and_inplace_variants_through_views():
    x, src = torch.randn(3, 4), torch.randn(4, 3)
    perm = torch.stack([torch.randperm(3) for _ in range(4)])
    same(lambda x, s: x.t().scatter_(1, on(x, perm), s), x, src)  # writes through to the base
    same(lambda x, s: x.t().scatter_add_(1, on(x, perm), s), x, src)
    same(lambda x: x[1:].index_fill_(1, on(x, T([0, 2])), -1.0), x)
    same(lambda x, s: x.t().index_copy_(0, on(x, T([3, 0])), s[:2]), x, src)
    t = x.to("tpu")
    out = torch.empty(0, device="tpu")
    torch.index_select(t, 1, T([2, 0]).to("tpu"), out=out)
    torch.testing.assert_close(out.cpu(), x.index_select(1, T([2, 0])))
    out = torch.empty(0, device="tpu")
    torch.gather(t, 0, T([[2, 1, 0, 0]]).to("tpu"), out=out)
    torch.testing.assert_close(out.cpu(), x.gather(0, T([[2, 1, 0, 0]])))


def test_mask_fill_path_needs_no_host_sync():
    x = torch.randn(3, 4)
    t = x.to("tpu")
    m = t > 0
    torch_tpu.metrics.reset()
    t[m] = 0.0  # x[mask] = scalar is a select: no data-dependent shape
    t[:, m[0]] = 1.0
    assert torch_tpu.metrics.counters()["host_transfers"] == 0
    mc = x > 0
    x[mc] = 0.0
    x[:, mc[0]] = 1.0
    torch.testing.assert_close(t.cpu(), x)


def test_gather_scatter_errors():
    x = torch.randn(3, 4)
    same_error(lambda x: x.gather(1, on(x, T([[4]]))), x, match=True)
    same_error(lambda x: x.gather(0, on(x, T([[-1]]))), x, match=True)
    same_error(lambda x: x.scatter(1, on(x, T([[4]])), 1.0), x, match=True)
    same_error(lambda x: x.scatter_add(0, on(x, T([[3]])), x), x, match=True)
    same_error(lambda x: x.scatter_reduce(0, on(x, T([[3]])), x, "amax"), x, match=True)
    same_error(lambda x: x.gather(1, on(x, T([[0.5]]))), x)
    same_error(lambda x: x.gather(3, on(x, T([[0]]))), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_index_select_add_copy_fill(dtype):
    x = data(dtype, (4, 3))
    src = data(dtype, (2, 3))
    idx = T([3, 0])
    same(lambda x: x.index_select(0, on(x, idx)), x)
    same(lambda x: x.index_select(1, on(x, T([2, 2, 0]))), x)
    same(lambda x: x.index_select(-1, on(x, T(1))), x)
    same(lambda x: x.t().index_select(0, on(x, T([1]))), x)
    same(lambda x, s: x.index_copy(0, on(x, idx), s), x, src)
    same(lambda x: x.index_copy_(1, on(x, T([2, 0])), x[:, :2].clone()), x)
    same(lambda x: x.index_fill(1, on(x, T([0, -1])), 1), x)
    same(lambda x: x.index_fill_(0, on(x, idx), torch.tensor(0, dtype=dtype)), x)
    if dtype != torch.bool:
        same(lambda x, s: x.index_add(0, on(x, T([1, 1])), s), x, src)
        same(lambda x, s: x.index_add_(0, on(x, idx), s, alpha=2), x, src)


def test_index_select_etc_grad_and_errors():
    x, src = torch.randn(4, 3), torch.randn(2, 3)
    same(lambda x: x.index_select(0, on(x, T([1, 1, 3]))), x, grad=True)
    same(lambda x, s: x.index_add(0, on(x, T([1, 2])), s), x, src, grad=True)
    same(lambda x, s: x.index_copy(0, on(x, T([1, 2])), s), x, src, grad=True)
    same(lambda x: x.index_fill(1, on(x, T([0])), 0.0), x, grad=True)
    same_error(lambda x: x.index_select(0, on(x, T([4]))), x, match=True)
    same_error(lambda x: x.index_select(0, on(x, T([-1]))), x, match=True)
    same_error(lambda x, s: x.index_add(0, on(x, T([0, 4])), s), x, src, match=True)
    same_error(lambda x, s: x.index_copy(0, on(x, T([-1, 0])), s), x, src, match=True)
    same_error(lambda x: x.index_fill(0, on(x, T([4])), 1.0), x, match=True)
    same_error(lambda x: x.index_fill(0, on(x, T([-5])), 1.0), x, match=True)


def test_take_and_take_along_dim():
    x = torch.randn(3, 4)
    same(lambda x: x.take(on(x, T([0, -1, 5]))), x)
    same(lambda x: x.t().take(on(x, T([[1, 2], [3, 11]]))), x)
    same(lambda x: x.take(on(x, T([0, 5]))), x, grad=True)
    same_error(lambda x: x.take(on(x, T([12]))), x, match=True)
    same_error(lambda x: x.take(on(x, T([-13]))), x, match=True)
    idx = x.argsort(1)
    same(lambda x: torch.take_along_dim(x, idx.to(x.device), 1), x)


def test_embedding():
    w = torch.randn(6, 3)
    idx = T([[0, 2, 5], [2, 2, 1]])
    same(lambda w: F.embedding(idx.to(w.device), w), w, grad=True)
    same(lambda w: F.embedding(idx.to(w.device), w, padding_idx=2), w, grad=True)
    same_error(lambda w: F.embedding(T([6]).to(w.device), w), w, match=True)


# ---- masks / nonzero -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_nonzero_masked_select(dtype):
    x = data(dtype, (3, 4))
    m = torch.rand(3, 4) > 0.5
    same(lambda x: x.nonzero(), x)
    same(lambda x: x.t().nonzero(), x)
    same(lambda x: torch.nonzero(x, as_tuple=True), x)
    same(lambda x: torch.where(x != 0), x)
    same(lambda x: torch.argwhere(x), x)
    same(lambda x, m: x.masked_select(m), x, m)
    same(lambda x, m: x.masked_select(m[0]), x, m)  # mask broadcasts
    same(lambda x, m: x[0].masked_select(m), x, m)  # self broadcasts
    same(lambda x: x.nonzero(), torch.zeros(2, 3, dtype=dtype))
    same(lambda x: x.nonzero(), torch.ones((), dtype=dtype))
    same(lambda x: torch.nonzero_static(x, size=15), x)


def test_nonzero_and_masked_select_compile_once_per_length_bucket():
    """Each count of true elements is a result length: one executable serves every count in a
    length bucket (16 here), and the results are exactly CPU's, also after further ops; `x[mask]`
    likewise, for rows too."""
    from torch_tpu.ops.lowerings import indexing

    x = torch.randn(4, 4)
    t = x.to("tpu")
    jits = (indexing._nonzero, indexing._masked_select, indexing._mask_rows)
    before = [len(j._compiled) for j in jits]
    for count in range(1, 16):
        mask = torch.zeros(16, dtype=torch.bool)
        mask[torch.randperm(16)[:count]] = True
        mask = mask.reshape(4, 4)
        m = mask.to("tpu")
        coords, picked = m.nonzero(), t.masked_select(m)
        assert coords.shape == (count, 2) and picked.shape == (count,)
        assert torch.equal(coords.cpu(), mask.nonzero()) and torch.equal(picked.cpu(), x.masked_select(mask))
        assert torch.equal((picked * 2).cpu(), x.masked_select(mask) * 2)
        assert torch.equal(t[m].cpu(), x[mask])
        assert torch.equal(t.t()[m].cpu(), x.t()[mask])  # a strided self
    after = [len(j._compiled) for j in jits]
    assert all(a - b <= 1 for a, b in zip(after, before)), (before, after)
    rows, row_mask = torch.randn(5, 3, 2), torch.tensor([True, False, True, True, False])
    for i in range(1, 5):
        keep = torch.arange(5) < i
        assert torch.equal(rows.to("tpu")[keep.to("tpu")].cpu(), rows[keep])
    assert torch.equal(rows.to("tpu")[row_mask.to("tpu")].sum(0).cpu(), rows[row_mask].sum(0))
    with torch_tpu.eager_mode(False):  # lazy recording keeps exact lengths
        picked = t.masked_select(t > 0)
    assert torch.equal(picked.cpu(), x.masked_select(x > 0))


def test_masked_scatter_and_grad():
    x, src = torch.randn(3, 4), torch.randn(12)
    m = torch.rand(3, 4) > 0.5
    same(lambda x, m, s: x.masked_scatter(m, s), x, m, src)
    same(lambda x, m, s: x.masked_scatter_(m[0], s), x, m, src)
    same(lambda x, s: x.masked_scatter(x > 0.5, s[:8].reshape(2, 4)), torch.arange(12.0).reshape(3, 4) / 12, src)
    same(lambda x, m: x.masked_select(m), x, m, grad=True)
    same(lambda x, m, s: x.masked_scatter(m, s), x, m, src, grad=True)
    same_error(lambda x, s: x.masked_scatter(torch.ones_like(x, dtype=torch.bool), s[:3]), x, src, match=True)
    same_error(lambda x, m: x.masked_select(m.float()), x, m, match=True)


# ---- sort / topk / kthvalue / searchsorted ---------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_sort(dtype):
    x = data(dtype, (3, 6))
    x[:, 3] = x[:, 1]  # ties
    same(lambda x: tuple(x.sort(stable=True)), x)
    same(lambda x: tuple(x.sort(stable=True, descending=True)), x)
    same(lambda x: tuple(x.sort(dim=0, stable=True)), x)
    same(lambda x: tuple(x.t().sort(dim=-1, stable=True, descending=True)), x)
    same(lambda x: x.argsort(stable=True), x)
    same(lambda x: x.argsort(dim=0, descending=True, stable=True), x)
    same(lambda x: torch.msort(x), x)


def test_sort_nan_grad_out():
    x = torch.tensor([[3.0, NAN, 1.0, NAN, 2.0], [0.0, -0.0, 1.0, -1.0, 0.0]])
    same(lambda x: tuple(x.sort(stable=True)), x)
    same(lambda x: tuple(x.sort(stable=True, descending=True)), x)
    same(lambda x: x.sort(1).values, torch.randn(3, 5), grad=True)
    y = torch.randn(3, 5)
    v, i = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.long, device="tpu")
    torch.sort(y.to("tpu"), 1, out=(v, i))
    torch.testing.assert_close((v.cpu(), i.cpu()), tuple(y.sort(1)))


@pytest.mark.parametrize("largest", [True, False])
def test_topk_kthvalue(largest):
    x = torch.randn(4, 6)
    same(lambda x: tuple(x.topk(3, largest=largest)), x)
    same(lambda x: tuple(x.topk(2, 0, largest=largest)), x)
    same(lambda x: tuple(x.t().topk(1, largest=largest)), x)
    same(lambda x: x.topk(3, largest=largest).values, x, grad=True)
    v, i = x.to("tpu").topk(3, largest=largest, sorted=False)
    torch.testing.assert_close(v.cpu().sort(1).values, x.topk(3, largest=largest).values.sort(1).values)
    torch.testing.assert_close(x.gather(1, i.cpu()), v.cpu())
    same(lambda x: tuple(x.kthvalue(2)), x)
    same(lambda x: tuple(x.kthvalue(1, 0, keepdim=True)), x)
    same(lambda x: x.kthvalue(3).values, x, grad=True)
    same(lambda x: tuple(x.topk(2)), torch.tensor([[1.0, NAN, 3.0, NAN]]))
    same_error(lambda x: x.topk(7), x)
    same_error(lambda x: x.kthvalue(7), x)
    same(lambda x: tuple(x.topk(2)), torch.tensor([[5, 1, 5, 3]]))


def test_searchsorted_bucketize():
    seq = torch.tensor([1.0, 2.0, 2.0, 4.0, 7.0])
    v = torch.tensor([[0.0, 2.0, 3.0], [7.0, 8.0, 2.0]])
    same(lambda s, v: torch.searchsorted(s, v), seq, v)
    same(lambda s, v: torch.searchsorted(s, v, right=True), seq, v)
    same(lambda s, v: torch.searchsorted(s, v, side="right", out_int32=True), seq, v)
    same(lambda s, v: torch.searchsorted(s, 2.0), seq, v)
    s2 = torch.sort(torch.randn(2, 5)).values
    same(lambda s, v: torch.searchsorted(s, v), s2, v)
    unsorted = torch.tensor([4.0, 1.0, 7.0, 2.0])
    same(lambda s, v: torch.searchsorted(s, v, sorter=s.argsort()), unsorted, v)
    same(lambda s, v: torch.bucketize(v, s), seq, v)
    same(lambda s, v: torch.bucketize(v, s, right=True, out_int32=True), seq, v)
    same(lambda s: torch.searchsorted(s, torch.tensor([2, 5], device=s.device)), torch.tensor([1, 2, 5, 9]))
    same(lambda s: torch.searchsorted(s, torch.tensor([2.5], device=s.device)), torch.tensor([1, 2, 5, 9]))


def test_isin():
    x = torch.tensor([[1, 5, 2], [7, 2, 0]])
    same(lambda x, t: torch.isin(x, t), x, torch.tensor([2, 7, 9]))
    same(lambda x, t: torch.isin(x, t, invert=True), x, torch.tensor([2, 7, 9]))
    same(lambda x, t: torch.isin(x, t), x, torch.tensor([], dtype=torch.long))
    same(lambda x, t: torch.isin(x, t), x, torch.arange(0, 1000, 7))  # the sorted lookup
    same(lambda x, t: torch.isin(x, t), torch.tensor([1.0, NAN, 2.5]), torch.tensor([NAN, 2.5, 3]))
    same(lambda x: torch.isin(x, 2), x)
    same(lambda t: torch.isin(5, t), torch.tensor([1, 5]))
    same(lambda s: torch.searchsorted(s, 0.1, right=True), torch.tensor([0.1, 0.2]))  # scalar in float32
    same(lambda s: torch.bucketize(0.1, s, right=True), torch.tensor([0.1, 0.2]))


# ---- unique ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unique(dtype):
    x = data(dtype, (3, 5))
    x[1] = x[0]
    same(lambda x: x.unique(), x)
    same(lambda x: x.unique(return_inverse=True), x)
    same(lambda x: x.unique(return_counts=True), x)
    same(lambda x: x.unique(return_inverse=True, return_counts=True), x)
    same(lambda x: x.t().unique(sorted=True, return_inverse=True), x)
    same(lambda x: x.unique(dim=0, return_inverse=True, return_counts=True), x)
    same(lambda x: x.unique(dim=1), x)
    same(lambda x: x.unique_consecutive(), x)
    same(lambda x: x.unique_consecutive(return_inverse=True, return_counts=True), x)
    same(lambda x: x.unique_consecutive(dim=0, return_counts=True), x)
    same(lambda x: torch.ops.aten.unique_consecutive(x, False, False, 1), x)
    same(lambda x: x[:0].unique(return_counts=True, return_inverse=True), x)


def test_unique_nan():
    same(lambda x: x.unique(return_counts=True), torch.tensor([NAN, 1.0, NAN, 1.0]))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    x, src = torch.randn(4, 3), torch.randn(3, 3)
    same(lambda x, s: x.index_reduce(0, on(x, T([0, 2, 0])), s, reduce, include_self=include_self), x, src)
    same(lambda x, s: x.t().index_reduce_(1, on(x, T([3, 3, 1])), s, reduce), x, src)  # through a view


def test_repeat_interleave():
    x = torch.arange(6.0).reshape(3, 2)
    same(lambda r: torch.repeat_interleave(r), T([1, 0, 2]))
    same(lambda x: x.repeat_interleave(on(x, T([1, 0, 2])), 0), x, grad=True)
    same(lambda x: x.repeat_interleave(2, 1), x)
    same(lambda x: x.repeat_interleave(on(x, T([2, 1])), dim=1, output_size=3), x)
    same(lambda r: torch.repeat_interleave(r[:0]), T([1]))
    same_error(lambda r: torch.repeat_interleave(r), T([1, -1]), match=True)
    same_error(lambda r: torch.repeat_interleave(r, output_size=4), T([1, 2]), match=True)
