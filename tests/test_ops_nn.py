"""nn lowerings (conv, pooling, softmax, losses, norms, upsampling, ...) equal CPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from tests.helpers import compare as _compare
from tests.helpers import native_only, platform_tol


def compare(fn, *inputs, transcendental=False, **kwargs):
    """tests.helpers.compare. transcendental=True (fn goes through exp, log, rsqrt or a root:
    softmax, the log losses, the norms, cdist): platform_tol widens rtol/atol on a TPU, and only there."""
    tol = {k: kwargs.pop(k) for k in ("rtol", "atol") if k in kwargs}
    return _compare(fn, *inputs, **(platform_tol(tol) if transcendental else tol), **kwargs)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


# ---- convolution ------------------------------------------------------------


@pytest.mark.parametrize(
    "cin,cout,k,stride,padding,dilation,groups,bias",
    [
        (3, 4, 3, 1, 0, 1, 1, True),
        (4, 6, 3, 2, 1, 1, 2, False),
        (4, 4, (3, 2), (2, 1), (1, 0), (2, 1), 4, True),
        (2, 3, 1, 1, 0, 1, 1, True),
    ],
)
def test_conv2d(cin, cout, k, stride, padding, dilation, groups, bias):
    kh, kw = (k, k) if isinstance(k, int) else k
    x, w = rand(2, cin, 9, 8), rand(cout, cin // groups, kh, kw)
    b = rand(cout) if bias else None
    compare(
        lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups),
        x,
        w,
        b,
        rtol=1e-4,
        atol=1e-4,
    )


def test_conv2d_noncontiguous_input():
    x = rand(2, 8, 7, 3).permute(0, 3, 1, 2)  # channels-last layout
    compare(lambda x, w: F.conv2d(x, w, padding=1), x, rand(5, 3, 3, 3), rtol=1e-4, atol=1e-4)


def test_conv1d_and_conv3d():
    compare(
        lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1),
        rand(2, 3, 11),
        rand(4, 3, 3),
        rand(4),
        rtol=1e-4,
        atol=1e-4,
    )
    compare(
        lambda x, w: F.conv3d(x, w, padding=1, groups=2), rand(1, 4, 4, 5, 3), rand(2, 2, 3, 3, 3), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize(
    "stride,padding,output_padding,groups,dilation", [(2, 1, 1, 1, 1), (1, 0, 0, 2, 1), (3, 2, 2, 1, 2)]
)
def test_conv_transpose2d(stride, padding, output_padding, groups, dilation):
    x, w = rand(2, 4, 5, 4), rand(4, 3, 3, 3)
    compare(
        lambda x, w, b: F.conv_transpose2d(
            x, w, b, stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation
        ),
        x,
        w,
        rand(3 * groups),
        rtol=1e-4,
        atol=1e-4,
    )


def test_conv_transpose1d():
    compare(
        lambda x, w: F.conv_transpose1d(x, w, stride=2, output_padding=1),
        rand(2, 3, 6),
        rand(3, 2, 4),
        rtol=1e-4,
        atol=1e-4,
    )


def test_conv2d_bfloat16():
    x, w = rand(1, 3, 6, 6, dtype=torch.bfloat16), rand(4, 3, 3, 3, dtype=torch.bfloat16)
    compare(lambda x, w: F.conv2d(x, w), x, w, grad=False, rtol=2e-2, atol=2e-2)


# ---- pooling ----------------------------------------------------------------


@pytest.mark.parametrize(
    "k,stride,padding,dilation,ceil_mode",
    [(2, None, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 1, True), ((3, 2), (2, 1), (1, 0), (2, 1), True)],
)
def test_max_pool2d(k, stride, padding, dilation, ceil_mode):
    x = rand(2, 3, 9, 8)
    compare(lambda x: F.max_pool2d(x, k, stride, padding, dilation, ceil_mode=ceil_mode, return_indices=True), x)


def test_max_pool2d_ties_and_3d_input():
    x = torch.tensor([[[1.0, 1.0, 0.0], [1.0, -float("inf"), 2.0], [2.0, 2.0, 2.0]]])  # (1, 3, 3), ties
    compare(lambda x: F.max_pool2d(x, 2, 1, return_indices=True), x)
    compare(
        lambda x: F.max_pool2d(x, 3, 2, padding=1, return_indices=True),
        torch.full((1, 1, 4, 4), -float("inf")),
        grad=False,
    )


@pytest.mark.parametrize(
    "nd,k,stride,padding,dilation,ceil_mode",
    [
        (2, 3, 1, 1, 1, False),  # overlapping windows: one input gets several grads
        (2, 2, 3, 0, 1, False),  # gaps between windows: inputs no window reads
        (2, 3, 2, 1, 1, True),  # ceil_mode: a last window over the padding
        (3, (2, 3, 2), (1, 2, 2), (1, 1, 0), (2, 1, 1), True),
    ],
)
def test_max_pool_backward_with_ties_and_nan(nd, k, stride, padding, dilation, ceil_mode):
    pool = F.max_pool2d if nd == 2 else F.max_pool3d
    x = torch.randint(0, 3, (2, 2, *[7] * nd)).float()  # many ties
    x.view(-1)[5] = float("nan")
    fn = lambda x: pool(x, k, stride, padding, dilation, ceil_mode=ceil_mode, return_indices=True)
    compare(fn, x, equal_nan=True)


def test_max_pool_lowers_without_gather_or_scatter():
    """XLA:TPU runs a gather or scatter over every output element ~100x slower than a copy
    (ResNet-50's first max pool took 1.1 s of a 1.2 s step), so the lowering must use neither."""
    import jax

    from torch_tpu.ops.lowerings import pooling

    x = jax.ShapeDtypeStruct((2, 4, 12, 12), jax.numpy.bfloat16)
    fwd, bwd = pooling.max_pool2d_with_indices, pooling.max_pool2d_with_indices_backward
    out, idx = jax.eval_shape(lambda x: fwd(x, [3, 3], [2, 2], [1, 1]), x)
    from_input = pooling.max_pool_backward_from_input  # compiled graphs' backward
    jaxprs = [
        jax.make_jaxpr(lambda x: fwd(x, [3, 3], [2, 2], [1, 1]))(x),
        jax.make_jaxpr(lambda g, x, i: bwd(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, i))(out, x, idx),
        jax.make_jaxpr(lambda g, x: from_input(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False))(out, x),
    ]
    for jaxpr in jaxprs:
        text = str(jaxpr).replace("select_and_scatter_add", "")  # XLA's windowed one: fast on TPU
        assert "gather" not in text and "scatter" not in text, text
    backward = jax.jit(lambda g, x: from_input(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False))
    tpu_module = backward.trace(out, x).lower(lowering_platforms=("tpu",)).as_text()
    assert "stablehlo.select_and_scatter" in tpu_module


def test_max_pool_int_and_3d():
    x = torch.randint(-50, 50, (2, 2, 6, 6))
    compare(lambda x: F.max_pool2d(x, 2, return_indices=True), x, grad=False)
    compare(lambda x: F.max_pool3d(x, 2, return_indices=True), rand(1, 2, 4, 4, 5))


@pytest.mark.parametrize(
    "k,stride,padding,ceil_mode,count_include_pad,divisor_override",
    [
        (2, None, 0, False, True, None),
        (3, 2, 1, False, True, None),
        (3, 2, 1, True, False, None),
        (3, 2, 1, True, True, None),
        (2, 1, 1, False, True, 3),
    ],
)
def test_avg_pool2d(k, stride, padding, ceil_mode, count_include_pad, divisor_override):
    compare(
        lambda x: F.avg_pool2d(x, k, stride, padding, ceil_mode, count_include_pad, divisor_override),
        rand(2, 3, 7, 8),
    )


def test_avg_pool3d():
    compare(lambda x: F.avg_pool3d(x, 2, padding=1, ceil_mode=True), rand(1, 2, 4, 5, 3))


@pytest.mark.parametrize("out", [(2, 3), (3, 3), (5, 7), (4, 1)])
def test_adaptive_pools(out):
    x = rand(2, 3, 7, 6)
    compare(lambda x: F.adaptive_avg_pool2d(x, out), x)
    compare(lambda x: F.adaptive_max_pool2d(x, out, return_indices=True), x)


# ---- softmax ----------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_log_softmax(dim):
    x = rand(3, 4, 5)
    compare(lambda x: F.softmax(x, dim), x, transcendental=True)
    compare(lambda x: F.log_softmax(x, dim), x, transcendental=True)
    compare(lambda x: F.softmax(x.transpose(0, 2), dim), x, transcendental=True)


def test_softmax_half_to_float_and_bfloat16():
    x = rand(4, 6, dtype=torch.bfloat16)
    compare(lambda x: F.softmax(x, -1), x, rtol=1e-2, atol=1e-2)
    compare(lambda x: F.log_softmax(x, -1, dtype=torch.float32), x, rtol=1e-5, atol=1e-5, transcendental=True)
    # CPU has no half_to_float kernel: compare with the float32 softmax of the same values.
    out = native_only(lambda: torch.ops.aten._softmax(x.to("tpu"), 1, True))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), torch.softmax(x.float(), 1), **platform_tol({}))


# ---- losses -----------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy(reduction):
    x = rand(6, 5)
    y = torch.tensor([0, 4, 2, -100, 1, 4])
    w = torch.rand(5) + 0.5
    compare(lambda x: F.cross_entropy(x, y.to(x.device), reduction=reduction), x, transcendental=True)
    compare(lambda x: F.cross_entropy(x, y.to(x.device), w.to(x.device), reduction=reduction), x, transcendental=True)
    compare(
        lambda x: F.cross_entropy(x, y.clamp(min=0).to(x.device), ignore_index=4, reduction=reduction),
        x,
        transcendental=True,
    )


def test_cross_entropy_label_smoothing_and_probabilities():
    x = rand(6, 5)
    y = torch.tensor([0, 4, 2, 3, 1, 4])
    compare(lambda x: F.cross_entropy(x, y.to(x.device), label_smoothing=0.1), x, transcendental=True)
    p = torch.softmax(rand(6, 5), -1)
    compare(lambda x, p: F.cross_entropy(x, p, label_smoothing=0.2), x, p, transcendental=True)


def test_cross_entropy_2d_and_nll():
    x = rand(2, 4, 3, 5)
    y = torch.randint(0, 4, (2, 3, 5))
    y[0, 0, 0] = -100
    w = torch.rand(4) + 0.5
    for reduction in ("none", "mean", "sum"):
        compare(
            lambda x, r=reduction: F.cross_entropy(x, y.to(x.device), w.to(x.device), reduction=r),
            x,
            transcendental=True,
        )
    compare(lambda x: F.nll_loss(x, torch.tensor(2, device=x.device)), rand(5))
    compare(
        lambda x: F.nll_loss(torch.log_softmax(x, 1), torch.tensor([1, 0, 2], device=x.device)),
        rand(3, 3),
        transcendental=True,
    )


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_regression_losses(reduction):
    x, t = rand(4, 5), rand(4, 5)
    compare(lambda x, t: F.mse_loss(x, t, reduction=reduction), x, t)
    compare(lambda x, t: F.l1_loss(x, t, reduction=reduction), x, t)
    compare(lambda x, t: F.smooth_l1_loss(x, t, reduction=reduction, beta=0.5), x, t)
    compare(lambda x, t: F.smooth_l1_loss(x, t, reduction=reduction, beta=0.0), x, t)
    compare(lambda x, t: F.huber_loss(x, t, reduction=reduction, delta=0.7), x, t)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_binary_cross_entropy(reduction):
    p = torch.rand(4, 5) * 0.98 + 0.01
    t = torch.rand(4, 5)
    w = torch.rand(5)
    pw = torch.rand(5) + 0.5

    def on(v, x):
        return v.to(x.device)

    compare(lambda p: F.binary_cross_entropy(p, on(t, p), reduction=reduction), p, transcendental=True)
    compare(lambda p: F.binary_cross_entropy(p, on(t, p), on(w, p), reduction=reduction), p, transcendental=True)
    x = rand(4, 5)
    compare(lambda x: F.binary_cross_entropy_with_logits(x, on(t, x), reduction=reduction), x, transcendental=True)
    compare(
        lambda x: F.binary_cross_entropy_with_logits(x, on(t, x), on(w, x), reduction=reduction, pos_weight=on(pw, x)),
        x,
        transcendental=True,
    )


# ---- normalization ----------------------------------------------------------


def test_layer_norm():
    x = rand(3, 4, 6)
    compare(lambda x, w, b: F.layer_norm(x, (6,), w, b), x, rand(6), rand(6), transcendental=True)
    compare(lambda x, w, b: F.layer_norm(x, (4, 6), w, b, eps=1e-3), x, rand(4, 6), rand(4, 6), transcendental=True)
    compare(lambda x: F.layer_norm(x.transpose(0, 1), (3, 6)), x, transcendental=True)
    compare(lambda x: F.layer_norm(x, (6,)), rand(2, 6, dtype=torch.bfloat16), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5)])
def test_batch_norm_train_updates_running_stats(shape):
    x = rand(*shape)
    stats = {}

    def run(x, w, b):
        rm = torch.zeros(3, device=x.device)
        rv = torch.ones(3, device=x.device)
        out = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3, eps=1e-4)
        stats[x.device.type] = (rm, rv)
        return out

    compare(run, x, rand(3), rand(3), transcendental=True)
    for tpu, cpu in zip(stats["tpu"], stats["cpu"]):  # a mean and a variance: no rsqrt
        torch.testing.assert_close(tpu.cpu(), cpu, rtol=1e-5, atol=1e-6)


def test_batch_norm_eval_and_no_stats():
    x = rand(4, 3, 5)
    rm, rv = rand(3), torch.rand(3) + 0.5
    compare(
        lambda x, w, b: F.batch_norm(x, rm.to(x.device), rv.to(x.device), w, b, training=False),
        x,
        rand(3),
        rand(3),
        transcendental=True,
    )
    compare(lambda x: F.batch_norm(x, None, None, training=True), x, transcendental=True)


def test_batch_norm_module():
    m = torch.nn.BatchNorm2d(3, momentum=0.2)
    mt = torch.nn.BatchNorm2d(3, momentum=0.2).to("tpu")
    x = rand(2, 3, 4, 4)

    def steps():
        for _ in range(2):
            mt(x.to("tpu"))
        mt.eval()
        return mt(x.to("tpu"))

    out = native_only(steps)
    for _ in range(2):
        m(x)
    m.eval()
    torch.testing.assert_close(out.cpu(), m(x), **platform_tol({"rtol": 1e-5, "atol": 1e-5}))  # rsqrt
    torch.testing.assert_close(mt.running_mean.cpu(), m.running_mean)
    torch.testing.assert_close(mt.running_var.cpu(), m.running_var)
    assert mt.num_batches_tracked.item() == 2


def test_group_norm():
    x = rand(2, 6, 4, 3)
    compare(lambda x, w, b: F.group_norm(x, 3, w, b), x, rand(6), rand(6), transcendental=True)
    compare(lambda x: F.group_norm(x, 2, eps=1e-3), rand(3, 4, 5), transcendental=True)


# ---- embedding, upsampling, grid sampling, cdist ------------------------------


def test_embedding_backward():
    idx = torch.tensor([[0, 2, 2], [4, 0, 1]])
    compare(lambda w: F.embedding(idx.to(w.device), w), rand(5, 3))
    compare(lambda w: F.embedding(idx.to(w.device), w, padding_idx=2), rand(5, 3))
    compare(lambda w: F.embedding(idx.to(w.device), w, scale_grad_by_freq=True), rand(5, 3))


@pytest.mark.parametrize("kwargs", [{"scale_factor": 2}, {"size": (7, 5)}, {"scale_factor": 1.7}, {"size": (3, 2)}])
def test_upsample_nearest(kwargs):
    compare(lambda x: F.interpolate(x, mode="nearest", **kwargs), rand(2, 3, 4, 5))


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("kwargs", [{"scale_factor": 2}, {"size": (7, 9)}, {"scale_factor": 0.6}, {"size": (1, 3)}])
def test_upsample_bilinear(align_corners, kwargs):
    compare(lambda x: F.interpolate(x, mode="bilinear", align_corners=align_corners, **kwargs), rand(2, 3, 4, 5))


def test_upsample_1d_3d():
    compare(lambda x: F.interpolate(x, scale_factor=1.5, mode="linear"), rand(2, 3, 5))
    compare(lambda x: F.interpolate(x, size=7, mode="nearest"), rand(2, 3, 5))
    compare(lambda x: F.interpolate(x, size=(3, 4, 5), mode="trilinear", align_corners=True), rand(1, 2, 2, 3, 4))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample(mode, padding_mode, align_corners):
    x = rand(2, 3, 5, 4)
    grid = torch.rand(2, 3, 6, 2) * 2.4 - 1.2
    compare(
        lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners),
        x,
        grid,
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, 0.5, float("inf")])
def test_cdist(p):
    x1, x2 = rand(2, 4, 3), rand(2, 5, 3)
    x2[0, 1] = x1[0, 2]  # a zero distance
    root = p not in (0.0, 1.0, float("inf"))  # sqrt or a float power
    compare(lambda a, b: torch.cdist(a, b, p=p), x1, x2, rtol=1e-4, atol=1e-5, grad=p != 0.5, transcendental=root)


def test_unfold_fold():
    compare(lambda x: F.unfold(x, (3, 2), dilation=(1, 2), padding=1, stride=(2, 1)), rand(2, 3, 6, 7))
    compare(lambda c: F.fold(c, (5, 6), 3, padding=1, stride=2), rand(2, 2 * 9, 9))


def test_adaptive_max_pool3d_and_unpool():
    compare(lambda x: F.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True), rand(1, 2, 5, 4, 3))
    compare(lambda x: F.adaptive_max_pool1d(x, 3, return_indices=True), rand(2, 3, 8))

    def pool_unpool(x):
        out, idx = F.max_pool2d(x, 2, return_indices=True)
        return F.max_unpool2d(out, idx, 2, output_size=x.shape[-2:])

    compare(pool_unpool, rand(2, 3, 5, 6))

    def pool_unpool3d(x):
        out, idx = F.max_pool3d(x, 2, return_indices=True)
        return F.max_unpool3d(out, idx, 2)

    compare(pool_unpool3d, rand(1, 2, 4, 4, 4))


@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_bicubic_and_nearest_exact(align_corners):
    x = rand(2, 3, 4, 5)
    compare(
        lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=align_corners), x, rtol=1e-4, atol=1e-5
    )
    compare(
        lambda x: F.interpolate(x, size=(3, 7), mode="bicubic", align_corners=align_corners), x, rtol=1e-4, atol=1e-5
    )
    compare(lambda x: F.interpolate(x, scale_factor=1.7, mode="nearest-exact"), x)
    compare(lambda x: F.interpolate(x, size=(3, 2), mode="nearest-exact"), x)
    compare(lambda x: F.interpolate(x, size=7, mode="nearest-exact"), rand(2, 3, 5))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_margin_losses(reduction):
    x, y = rand(4, 5), torch.tensor([1, 0, 4, 2])
    w = torch.rand(5) + 0.5
    for p in (1, 2):
        compare(lambda x, p=p: F.multi_margin_loss(x, y.to(x.device), p=p, margin=0.7, reduction=reduction), x)
    compare(lambda x: F.multi_margin_loss(x, y.to(x.device), weight=w.to(x.device), reduction=reduction), x)
    target = torch.tensor([[3, 0, -1, 1, 2], [1, 2, 3, -1, 0], [4, 4, -1, 0, 0], [-1, 1, 2, 3, 4]])
    compare(lambda x: F.multilabel_margin_loss(x, target.to(x.device), reduction=reduction), x)
    compare(
        lambda x: F.multilabel_margin_loss(x, torch.tensor([2, 0, -1, 1], device=x.device), reduction=reduction),
        rand(4),
    )


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode):
    w = rand(6, 3)
    idx = torch.tensor([1, 2, 0, 3, 4, 2, 5])
    offsets = torch.tensor([0, 2, 2, 5])

    def on(v, ref):
        return v.to(ref.device)

    compare(lambda w: F.embedding_bag(on(idx, w), w, on(offsets, w), mode=mode), w)
    compare(lambda w: F.embedding_bag(on(idx, w), w, on(offsets, w), mode=mode, padding_idx=2), w)
    compare(lambda w: F.embedding_bag(on(idx[:6].reshape(2, 3), w), w, mode=mode), w)
    compare(
        lambda w: F.embedding_bag(on(idx, w), w, on(torch.tensor([0, 3, 7]), w), mode=mode, include_last_offset=True), w
    )
    if mode == "sum":
        psw = torch.rand(7)
        compare(
            lambda w, psw: F.embedding_bag(on(idx, w), w, on(offsets, w), mode="sum", per_sample_weights=psw), w, psw
        )

        # CPU mis-scales rows next to repeated ones (row 3 here gets 1/2): check against the definition.
        def scaled_grad(w):
            w = w.detach().requires_grad_()
            F.embedding_bag(on(idx, w), w, on(offsets, w), scale_grad_by_freq=True).backward(on(g, w))
            return w.grad

        g = torch.randn(4, 3)
        counts = torch.bincount(idx, minlength=6).clamp(min=1).float()[:, None]
        w_ref = w.detach().requires_grad_()
        F.embedding_bag(idx, w_ref, offsets).backward(g)
        got = native_only(lambda: scaled_grad(w.to("tpu")))
        torch.testing.assert_close(got.cpu(), w_ref.grad / counts)


@pytest.mark.parametrize(
    "name",
    [
        "max_pool",
        "avg_pool",
        "adaptive_avg",
        "batch_norm",
        "group_norm",
        "cross_entropy",
        "mse",
        "bilinear",
        "conv_transpose",
        "embedding",
    ],
)
def test_bfloat16(name):
    x = rand(2, 4, 6, 6, dtype=torch.bfloat16)
    fns = {
        "max_pool": lambda x: F.max_pool2d(x, 3, 2, 1),
        "avg_pool": lambda x: F.avg_pool2d(x, 2, ceil_mode=True),
        "adaptive_avg": lambda x: F.adaptive_avg_pool2d(x, (4, 3)),
        "batch_norm": lambda x: F.batch_norm(x, None, None, training=True),
        "group_norm": lambda x: F.group_norm(x, 2),
        "cross_entropy": lambda x: F.cross_entropy(
            x, torch.randint(0, 4, (2, 6, 6), generator=torch.Generator().manual_seed(0)).to(x.device)
        ),
        "mse": lambda x: F.mse_loss(x, torch.ones_like(x)),
        "bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
        "conv_transpose": lambda x: F.conv_transpose2d(x, torch.ones(4, 2, 3, 3, dtype=x.dtype, device=x.device)),
        "embedding": lambda x: F.embedding(torch.tensor([[0, 2], [1, 0]], device=x.device), x.reshape(-1, 6)[:3]),
    }
    compare(fns[name], x, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize(
    "targets,target_lengths,input_lengths,reduction,zero_infinity",
    [
        ([[1, 2, 2], [3, 1, 1], [4, 0, 0]], [2, 3, 1], [7, 5, 6], "none", False),
        ([1, 2, 3, 1, 1, 4], [2, 3, 1], [7, 5, 6], "mean", False),  # concatenated targets
        ([[1, 1, 1], [2, 2, 2], [3, 3, 3]], [3, 3, 0], [7, 3, 4], "sum", True),  # an impossible alignment, empty target
    ],
)
def test_ctc_loss(targets, target_lengths, input_lengths, reduction, zero_infinity):
    targets = torch.tensor(targets)

    def loss(x):
        return F.ctc_loss(
            x.log_softmax(2),
            targets.to(x.device),
            torch.tensor(input_lengths),
            torch.tensor(target_lengths),
            reduction=reduction,
            zero_infinity=zero_infinity,
        )

    compare(loss, rand(7, 3, 5), transcendental=True)


def test_fractional_max_pool2d():
    samples = torch.rand(2, 3, 2)

    def pool(x, kernel, out):
        return F.fractional_max_pool2d(
            x,
            kernel,
            output_size=out,
            return_indices=True,
            _random_samples=samples.to(x.device)[: x.shape[0] if x.ndim == 4 else 1],
        )

    compare(lambda x: pool(x, 2, (4, 5)), rand(2, 3, 7, 8))
    compare(lambda x: pool(x, (3, 2), (3, 1)), rand(2, 3, 7, 8))
    compare(lambda x: pool(x, 2, 3), rand(3, 6, 6))


def test_batch_norm_functional_form():
    x, w, b = rand(4, 3, 5), rand(3), rand(3)
    rm, rv = rand(3), torch.rand(3) + 0.5
    op = torch.ops.aten._native_batch_norm_legit_functional.default
    for training in (True, False):
        expected = op(x, w, b, rm, rv, training, 0.1, 1e-5)
        got = native_only(lambda t=training: op(*(v.to("tpu") for v in (x, w, b, rm, rv)), t, 0.1, 1e-5))
        torch.testing.assert_close(got[0].cpu(), expected[0], **platform_tol({}))  # rsqrt
        for g, e in zip(got[3:], expected[3:]):
            torch.testing.assert_close(g.cpu(), e)
        if training:
            torch.testing.assert_close(got[1].cpu(), expected[1])


@pytest.mark.parametrize("shape,target", [((3, 4), [0, 5, 1]), ((3, 4), [0, -2, 1]), ((2, 4, 2), [[0, 1], [9, 2]])])
def test_cross_entropy_target_out_of_range_raises_like_cpu(shape, target):
    logits, target = torch.randn(shape), torch.tensor(target)
    with pytest.raises(IndexError, match="out of bounds"):
        F.cross_entropy(logits, target)
    with pytest.raises(IndexError, match="out of bounds"):
        F.cross_entropy(logits.to("tpu"), target.to("tpu")).item()  # (a deferred check reports at the read)


def test_cross_entropy_ignore_index_is_not_out_of_range():
    logits, target = torch.randn(3, 4), torch.tensor([0, -100, 3])
    torch.testing.assert_close(
        F.cross_entropy(logits.to("tpu"), target.to("tpu")).cpu(), F.cross_entropy(logits, target), **platform_tol({})
    )
