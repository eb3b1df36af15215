"""Bounded dynamic shapes for graph mode: one executable per size bucket, not per size.

A graph dynamo traced with symbolic sizes (`torch.compile(..., dynamic=True)`, or its
automatic dynamic shapes after a size changed) has SymInt placeholders and tensors whose
sizes are expressions of symbols (s0, 4*s1, ...). Each symbol's size n is rounded up to
a bucket N (the next power of two, or the next of `options={"dynamic_buckets": [...]}`),
and the graph is compiled once per bucket at the padded sizes.

Padding never changes a result. Every value is computed in the padded world with this
invariant: the value restricted to its exact sizes (a prefix along every dim) equals the
exact-size value, and the padding is zero. Each op is admitted only by a rule that keeps
the invariant (`_rule`), given which of its dims are padded:
- pointwise ops (torch.Tag.pointwise), copies, factories, transposes, unsqueeze/squeeze,
  expand: position by position; the result's padding is masked back to zero;
- sums and matmuls, over padded dims too: zeros add nothing;
- mean over a padded dim: the padded sum rescaled by padded/exact count; amax, amin,
  all, prod: the padding is set to the reduction's identity first;
- softmax / log_softmax over a padded dim: the padding is -inf first (their backward ops
  read zero-padded gradients and outputs, which is exact);
- layer norm and its backward when the normalized dims are not padded;
- the fused attention ops (TPU's flash kernel) when the head dim is not padded: query rows are
  independent, and keys padded past the exact length are masked by the kernel;
- views and reshapes when, in each group of merged or split dims, only the outermost
  dim is padded (then the exact elements stay a prefix);
- slicing, selecting, splitting, concatenating along a dim that is not padded, or a
  slice that keeps a padded dim whole;
- a symbolic size used as a size argument (view, expand, full, ...); used as a value
  (`x / x.size(0)`) it would read the padded size, so it is refused.
A graph with any other op on a padded value (or a random op, an input mutation, a CPU
input, an eager node) is compiled at its exact sizes instead, counted in
`bucket_exact_graphs` and warned about once per op. Inputs are padded with zeros by a
small per-shape executable (`bucket_pads`, `bucket_pad_compiles`); outputs are exact-size
strided views of the padded result (no copy). A view this module returned, fed back (a
saved activation reaching the backward graph), is used as it is, without padding again.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import sympy
import torch
from jax import lax
from torch._ops import OpOverload
from torch.fx import Node

from torch_tpu import _C, debug, metrics, platforms
from torch_tpu.compile import options as compile_options
from torch_tpu.device import memory
from torch_tpu.kernels import sdpa
from torch_tpu.ops import geometry as geo
from torch_tpu.ops import precision, tensors
from torch_tpu.ops.dtypes import TORCH_TO_NUMPY

aten = torch.ops.aten
_logged: set[str] = set()  # refusals already logged

# ---- buckets --------------------------------------------------------------------------


def _smallest(n_bucket: int, buckets: tuple[int, ...] | None) -> int:
    """The smallest size that pads up to bucket `n_bucket`."""
    if buckets is None:
        return n_bucket // 2 + 1 if n_bucket > 2 else n_bucket
    lower = [b for b in buckets if b < n_bucket]
    return lower[-1] + 1 if lower else 1


def bucket(n: int, buckets: tuple[int, ...] | None) -> int | None:
    """The padded size of a dynamic size n: the next power of two, or the next given bound
    (None above the largest: that size compiles exactly)."""
    if buckets is None:
        return 1 << max(n - 1, 0).bit_length() if n > 0 else 0
    return next((b for b in buckets if b >= n), None)


# ---- symbolic sizes ----------------------------------------------------------------------


def _expr(size):
    if isinstance(size, torch.SymInt):
        return size.node.expr
    return sympy.Integer(int(size))


def _exprs(fake) -> tuple | None:
    return tuple(_expr(s) for s in fake.shape) if isinstance(fake, torch.Tensor) else None


def _traced(expr, values: dict):
    """`expr` with symbols bound to traced (or plain) ints; Add, Mul, integer powers only."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return values[expr]
    if expr.is_Add:
        return sum((_traced(a, values) for a in expr.args[1:]), _traced(expr.args[0], values))
    if expr.is_Mul:
        return math.prod((_traced(a, values) for a in expr.args[1:]), start=_traced(expr.args[0], values))
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 0:
        return _traced(expr.base, values) ** int(expr.exp)
    raise _Refused(f"size expression {expr}")


class _Refused(Exception):
    """A node the padded world cannot compute exactly."""


def _contiguous(sizes) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


# ---- op rules ----------------------------------------------------------------------------

# Factories: their size arguments may be symbolic; a padded size gives a padded result.
_FACTORIES = {
    aten.full.default,
    aten.zeros.default,
    aten.ones.default,
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_full.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.arange.default,
    aten.arange.start,
    aten.arange.start_step,
}
_SIZE_ARG_OPS = _FACTORIES | {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.view_copy.default,
    aten.expand.default,
    aten.slice.Tensor,
    aten.sym_size.int,
    aten._assert_scalar.default,
}
_POSITIONAL = _FACTORIES | {
    aten.clone.default,
    aten._to_copy.default,
    aten.detach.default,
    aten.alias.default,
    aten.lift_fresh_copy.default,
    aten.t.default,
    aten.transpose.int,
    aten.permute.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.expand.default,
    aten.full_like.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.empty_like.default,
    aten.scalar_tensor.default,
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten.mv.default,
    aten.dot.default,
    aten.sum.dim_IntList,
    aten.sum.default,
    aten.any.dim,
    aten.any.dims,
    aten.any.default,
    aten._softmax_backward_data.default,
    aten._log_softmax_backward_data.default,
    aten.embedding.default,
    aten.sym_size.int,
    aten._assert_scalar.default,
    aten._assert_tensor_metadata.default,
    aten.stack.default,
}
# Reductions whose padding must first hold the identity: op -> identity(dtype).
_IDENTITY: dict[OpOverload, Callable] = {
    aten.amax.default: lambda dt: _lowest(dt),
    aten.amin.default: lambda dt: -_lowest(dt) if jnp.issubdtype(dt, jnp.floating) else jnp.iinfo(dt).max,
    aten.all.dim: lambda dt: True,
    aten.all.dims: lambda dt: True,
    aten.all.default: lambda dt: True,
    aten.prod.dim_int: lambda dt: 1,
    aten.prod.default: lambda dt: 1,
    aten.logsumexp.default: lambda dt: -jnp.inf,
    aten._softmax.default: lambda dt: -jnp.inf,
    aten._log_softmax.default: lambda dt: -jnp.inf,
}
_MEAN = {aten.mean.dim, aten.mean.default}
_ALONG = {  # op -> index of its `dim` argument and default: fine unless that dim is padded
    aten.select.int: (1, 0),
    aten.split.Tensor: (2, 0),
    aten.split_with_sizes.default: (2, 0),
    aten.unbind.int: (1, 0),
    aten.cat.default: (1, 0),
    aten.select_scatter.default: (2, None),
    aten.slice_scatter.default: (2, 0),
    aten.index_select.default: (1, None),
}
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default}
# op -> (index of the normalized input, index of normalized_shape)
_LAYER_NORM = {aten.native_layer_norm.default: (0, 1), aten.native_layer_norm_backward.default: (1, 2)}
# The fused attention ops (TPU's flash kernel) -> (query, key, attn_bias, dropout_p) argument
# indices. Queries are independent rows; keys padded past their exact length are masked in the
# kernel (kernels/sdpa.keys_valid_to). The backward's max_q/max_k sizes are not read.
_ATTENTION = {
    aten._scaled_dot_product_fused_attention_overrideable.default: (0, 1, 3, 4),
    aten._scaled_dot_product_fused_attention_overrideable_backward.default: (1, 2, 4, 12),
}


_WHOLE = {aten.all.default, aten.prod.default, aten.mean.default}  # reduce all dims; args[1] is not a dim


def _reduced_dims(node: Node):
    """The `dim` argument of a reduction (None: all dims)."""
    if node.target in _WHOLE:
        return None
    return node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")


def _lowest(dt):
    return -jnp.inf if jnp.issubdtype(dt, jnp.floating) else jnp.iinfo(dt).min


class _Shapes:
    """Padded and exact sizes of every tensor value of the graph, for one bucket."""

    def __init__(self, padded: dict, exact: dict):
        self.padded = padded  # symbol -> N
        self.exact = exact  # symbol -> a size below N where the bucket holds several, else N

    def of(self, node) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        return self.of_fake(node.meta.get("val") if isinstance(node, Node) else None)

    def of_fake(self, fake) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        exprs = _exprs(fake)
        if exprs is None:
            return None
        return (
            tuple(int(e.xreplace(self.padded)) for e in exprs),
            tuple(int(e.xreplace(self.exact)) for e in exprs),
        )

    def padded_dims(self, node) -> set[int]:
        shapes = self.of(node)
        return set() if shapes is None else {d for d, (p, v) in enumerate(zip(*shapes)) if p != v}


def _tensor_nodes(node: Node) -> list[Node]:
    return [n for n in node.all_input_nodes if isinstance(n.meta.get("val"), torch.Tensor)]


def _fake_list(node: Node) -> list:
    fake = node.meta.get("val")
    return list(fake) if isinstance(fake, (list, tuple)) else [fake]


def _norm_dims(dims, ndim: int) -> set[int]:
    if dims is None or dims == []:
        return set(range(ndim))
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return {d + ndim if d < 0 else d for d in dims}


def _view_groups(src: tuple, dst: tuple) -> list[tuple[list[int], list[int]]] | None:
    """Consecutive dims of `src` and `dst` with equal products (size-1 dims join a group)."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj = [], []
        pi = pj = 1
        while True:
            if pi <= pj and i < len(src):
                pi *= src[i]
                gi.append(i)
                i += 1
            elif j < len(dst):
                pj *= dst[j]
                gj.append(j)
                j += 1
            else:
                break
            if pi == pj and (i == len(src) or src[i] != 1) and (j == len(dst) or dst[j] != 1):
                break
        if pi != pj:
            return None
        groups.append((gi, gj))
    return groups


def _view_ok(shapes: _Shapes, node: Node) -> bool:
    src_p, src_v = shapes.of(node.args[0])
    dst_p, dst_v = shapes.of(node)
    groups = _view_groups(src_p, dst_p)
    if groups is None:
        return False
    for gi, gj in groups:
        for g, pad, val in ((gi, src_p, src_v), (gj, dst_p, dst_v)):
            big = [d for d in g if pad[d] != 1]
            if any(pad[d] != val[d] for d in big[1:]):
                return False  # an inner dim of the group is padded: exact elements are not a prefix
        if math.prod(src_v[d] for d in gi) != math.prod(dst_v[d] for d in gj):
            return False
    return True


def _rule(node: Node, shapes: _Shapes, sym_nodes: set[Node]) -> str | None:
    """How the node runs padded: None (as it is, then masked), or raises _Refused."""
    target = node.target
    if not isinstance(target, OpOverload):
        if any(isinstance(n.meta.get("val"), torch.Tensor) for n in node.all_input_nodes):
            raise _Refused(str(target))
        return None  # size arithmetic, on the padded sizes
    inputs = _tensor_nodes(node)
    padded_in = {n: shapes.padded_dims(n) for n in inputs}
    padded_out = any(
        shapes.of_fake(f)[0] != shapes.of_fake(f)[1] for f in _fake_list(node) if isinstance(f, torch.Tensor)
    )
    if target in _ATTENTION:
        return _attention_rule(node, padded_in)
    if target not in _SIZE_ARG_OPS and any(n in sym_nodes for n in node.all_input_nodes):
        raise _Refused(f"{target} with a symbolic size as a value")
    if not padded_out and not any(padded_in.values()):
        return None
    name = str(target)
    if torch.Tag.nondeterministic_seeded in target.tags:
        raise _Refused(f"{name} (random)")
    if torch.Tag.pointwise in target.tags or target in _POSITIONAL:
        return None
    x = node.args[0] if node.args else None
    x_pad = padded_in.get(x, set()) if isinstance(x, Node) else set()
    ndim = len(shapes.of(x)[0]) if isinstance(x, Node) and shapes.of(x) is not None else 0
    if target in _IDENTITY or target in _MEAN:
        dims = _reduced_dims(node)
        reduced = _norm_dims(dims, ndim) & x_pad
        if not reduced:
            return None
        return "mean" if target in _MEAN else "identity"
    if target in _VIEWS:
        if _view_ok(shapes, node):
            return None
        raise _Refused(f"{name} merging a padded dim under another")
    if target is aten.slice.Tensor:
        dim = node.args[1] if len(node.args) > 1 else 0
        dim = dim + ndim if dim < 0 else dim
        if dim not in x_pad:
            return None
        in_expr = _exprs(x.meta["val"])[dim]
        out_expr = _exprs(node.meta["val"])[dim]
        start = node.args[2] if len(node.args) > 2 else None
        if out_expr == in_expr and start in (None, 0):
            return None
        raise _Refused(f"{name} of part of a padded dim")
    if target in _ALONG:
        index, default = _ALONG[target]
        dim = node.args[index] if len(node.args) > index else node.kwargs.get("dim", default)
        if target is aten.cat.default:
            tensors = node.args[0]
            first = tensors[0] if tensors else None
            ndim = len(shapes.of(first)[0]) if isinstance(first, Node) else 0
            pads = set().union(*(padded_in.get(t, set()) for t in tensors if isinstance(t, Node)))
        else:
            pads = x_pad
        if dim is None:
            raise _Refused(name)
        if (dim + ndim if dim < 0 else dim) in pads:
            raise _Refused(f"{name} along a padded dim")
        if target is aten.index_select.default and padded_in.get(node.args[2], set()):
            raise _Refused(f"{name} with padded indices")
        return None
    if target in _LAYER_NORM:
        src_index, shape_index = _LAYER_NORM[target]
        src, k = node.args[src_index], len(node.args[shape_index])
        src_ndim = len(shapes.of(src)[0])
        if padded_in.get(src, set()) & set(range(src_ndim - k, src_ndim)):
            raise _Refused(f"{name} over a padded dim")
        return None
    if target is aten.embedding_dense_backward.default:
        if node.args[4] if len(node.args) > 4 else False:
            raise _Refused(f"{name} with scale_grad_by_freq")
        return None
    raise _Refused(name)


def _attention_rule(node: Node, padded_in: dict) -> str | None:
    query, key, bias, dropout = (node.args[i] if len(node.args) > i else None for i in _ATTENTION[node.target])
    if bias is not None or dropout not in (None, 0, 0.0):
        raise _Refused(f"{node.target} with a bias or dropout")
    if 3 in padded_in.get(query, set()) | padded_in.get(key, set()):
        raise _Refused(f"{node.target} over a padded head dim")
    return "attention" if 2 in padded_in.get(key, set()) else None


# ---- the bucketed runner ---------------------------------------------------------------

# id(flat padded buffer) -> (weakref to it, padded sizes): outputs of bucketed graphs.
_padded_buffers: dict[int, tuple] = {}
_pad_fns: dict[tuple, Callable] = {}


def _remember(buf: jax.Array, sizes: tuple[int, ...]) -> None:
    key = id(buf)
    _padded_buffers[key] = (weakref.ref(buf, lambda _ref, key=key: _padded_buffers.pop(key, None)), sizes)


def _as_buffer(value):
    """A padded value as its buffer: flat, or as it is where buffers are shaped."""
    return value if platforms.shaped_buffers() else value.reshape(-1)


def _pad_fn(geom, padded: tuple[int, ...]) -> Callable:
    key = (geom, padded, platforms.shaped_buffers())
    fn = _pad_fns.get(key)
    if fn is None:
        widths = [(0, p - s) for s, p in zip(geom.sizes, padded)]
        fn = _pad_fns[key] = jax.jit(lambda b: _as_buffer(jnp.pad(geo.read(b, geom), widths)))
        metrics.bump("bucket_pad_compiles")
    return fn


class _Plan:
    """A bucket's admitted graph: per node, how it runs padded."""

    def __init__(self, rules: dict, shapes: _Shapes):
        self.rules = rules
        self.shapes = shapes
        self.executables: dict[tuple, object] = {}
        self.templates: list = []  # how each graph output is rebuilt, set when traced


class Buckets:
    """Runs a GraphRunner with symbolic sizes at bucketed sizes (see the module docstring)."""

    def __init__(self, runner, options: compile_options.CompileOptions):
        self.runner = runner
        self.options = options
        from torch_tpu.compile.graph import Segment

        segments = [s for s in runner.steps if isinstance(s, Segment)]
        self.segment = segments[0] if len(runner.steps) == 1 and len(segments) == 1 else None
        self.symbols: list = []  # in first-seen order
        self.sources: dict = {}  # symbol -> (placeholder index, dim or None)
        for i, p in enumerate(runner.placeholders):
            fake = p.meta.get("val")
            if isinstance(fake, torch.SymInt) and fake.node.expr.is_Symbol:
                self.sources.setdefault(fake.node.expr, (i, None))
            elif isinstance(fake, torch.Tensor):
                for d, e in enumerate(_exprs(fake)):
                    if e.is_Symbol:
                        self.sources.setdefault(e, (i, d))
        for node in runner.gm.graph.nodes:
            for f in _fake_list(node):
                for e in _exprs(f) or ():
                    for s in e.free_symbols:
                        if s not in self.symbols:
                            self.symbols.append(s)
            fake = node.meta.get("val")
            if isinstance(fake, torch.SymInt):
                for s in fake.node.expr.free_symbols:
                    if s not in self.symbols:
                        self.symbols.append(s)
        self.sym_nodes = {
            n
            for n in runner.gm.graph.nodes
            if isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))
        }
        self.plans: dict[tuple, _Plan | None] = {}

    @staticmethod
    def applies(runner) -> bool:
        return any(
            isinstance(p.meta.get("val"), torch.SymInt)
            or (
                isinstance(p.meta.get("val"), torch.Tensor)
                and any(isinstance(s, torch.SymInt) for s in p.meta["val"].shape)
            )
            for p in runner.placeholders
        )

    def __call__(self, args: list) -> list | None:
        """The graph's outputs, or None where this call must run at its exact sizes."""
        if self.segment is None or self.segment.has_random or self.segment.mutations:
            return self._refuse("a graph with eager nodes, random ops or input mutations")
        if self.segment.has_checks:  # padding would trip them (a zero divisor); exact sizes check
            return self._refuse("a graph with data-dependent checks")
        if any(isinstance(a, torch.Tensor) and (a.is_conj() or a.is_neg()) for a in args):
            return self._refuse("a conj or neg view input")  # the exact-size segment reads its bit
        exact: dict = {}
        for s in self.symbols:
            source = self.sources.get(s)
            if source is None:
                return self._refuse(f"symbol {s} has no input that gives its size")
            i, d = source
            exact[s] = int(args[i]) if d is None else int(args[i].shape[d])
        padded = {}
        for s, n in exact.items():
            b = bucket(n, self.options.dynamic_buckets)
            if b is None:
                return self._refuse(f"size {n} is above the largest bucket")
            padded[s] = b
        key = tuple(padded[s] for s in self.symbols)
        if key not in self.plans:
            # One executable serves every size of the bucket: a symbol counts as padded when
            # its bucket holds more than one size (then a size below the bucket stands for all).
            smaller = {s: _smallest(b, self.options.dynamic_buckets) for s, b in padded.items()}
            self.plans[key] = self._admit(
                _Shapes(padded, {s: b - 1 if smaller[s] < b else b for s, b in padded.items()})
            )
        plan = self.plans[key]
        if plan is None:
            return None
        return self._run(plan, args, exact, padded)

    def _refuse(self, why: str) -> None:
        if why not in _logged:
            _logged.add(why)
            debug.log("buckets", f"{self.runner.name}: exact sizes: {why}")
        return None

    def _admit(self, shapes: _Shapes) -> _Plan | None:
        rules = {}
        try:
            for node in self.segment.nodes:
                rules[node] = _rule(node, shapes, self.sym_nodes)
        except _Refused as why:
            metrics.bump("bucket_exact_graphs")
            text = str(why)
            debug.warn_once(
                f"unpaddable {text}",
                f"torch_tpu: {text} cannot be padded safely; graph {self.runner.name} compiles at exact "
                "sizes for this bucket (counted in torch_tpu.metrics.counters()['bucket_exact_graphs'])",
                stacklevel=3,
            )
            return None
        return _Plan(rules, shapes)

    # -- running padded --

    def _run(self, plan: _Plan, args: list, exact: dict, padded: dict) -> list:
        runner = self.runner
        dyn: list = [np.asarray([exact[s] for s in self.symbols], np.int64)]
        sig: list = [tuple(padded[s] for s in self.symbols)]
        readers: list = []
        device = None
        for p, v in zip(runner.placeholders, args):
            if isinstance(v, torch.Tensor):
                if v.device.type != "tpu":
                    return self._refuse("a CPU tensor input")
                device = v.device.index if device is None else device
                buf, geom = self._padded_input(p, v, padded, exact)
                dyn.append(buf)
                sig.append(geom)
                readers.append(("buffer", geom))
            elif isinstance(p.meta.get("val"), torch.SymInt):
                readers.append(("size", p.meta["val"].node.expr))
                sig.append("size")
            else:
                readers.append(("static", v))
                sig.append(("static", type(v), v))
        if device is None:
            device = _C._current_device()
        sig.append(device)
        sig.append(("matmul_precision", precision.cache_key()))
        signature = tuple(sig)
        compiled = plan.executables.get(signature)
        if compiled is None:
            with memory.out_of_memory_as_torch(device, f"compiling the graph {runner.name} for bucket {sig[0]}"):
                compiled = self._compile(plan, readers, dyn, signature)
        else:
            metrics.bump("graph_cache_hits")
        with memory.out_of_memory_as_torch(device, f"running the compiled graph {runner.name}"):
            flat = compiled(*dyn)
        metrics.bump("executions")
        metrics.bump("bucket_runs")
        return [self._rebuild(t, flat, args, exact, device) for t in plan.templates]

    def _padded_input(self, p: Node, v: torch.Tensor, padded: dict, exact: dict):
        buf = tensors.buffer_of(v)
        padded_sizes, exact_sizes = _Shapes(padded, exact).of(p)
        dtype = TORCH_TO_NUMPY[v.dtype]
        whole = geo.Geometry(padded_sizes, _contiguous(padded_sizes), 0, dtype, buf.dtype, tuple(buf.shape))
        if padded_sizes == exact_sizes:
            return buf, tensors.tensor_geometry(v, buf)
        known = _padded_buffers.get(id(buf))
        if (
            known is not None
            and known[0]() is buf
            and known[1] == padded_sizes
            and v.storage_offset() == 0
            and tuple(v.stride()) == _contiguous(padded_sizes)
            and tuple(v.shape) == exact_sizes
            and buf.dtype == dtype
        ):
            return buf, whole  # our own padded output: its padding is zero
        debug.log("buckets", f"{self.runner.name}: pads input {p.name} {exact_sizes} -> {padded_sizes}")
        metrics.bump("bucket_pads")
        new = _pad_fn(tensors.tensor_geometry(v, buf), padded_sizes)(buf)
        return new, geo.Geometry(padded_sizes, _contiguous(padded_sizes), 0, dtype, new.dtype, tuple(new.shape))

    def _compile(self, plan: _Plan, readers: list, dyn: list, signature: tuple):
        fn = self._traceable(plan, readers)
        start = time.perf_counter()
        loaded_before = metrics.counters()["persistent_cache_hits"]
        with self.options.tracing():
            lowered = jax.jit(fn).lower(*dyn)
        compiled = compile_options.compile_lowered(lowered, self.options)
        compile_options.dump(self.options, f"{self.runner.name}.bucket{len(plan.executables)}", lowered, compiled)
        seconds = time.perf_counter() - start
        metrics.record_compile("graph", seconds)
        if metrics.counters()["persistent_cache_hits"] == loaded_before:
            metrics.bump("graph_compiles")
        metrics.bump("bucket_compiles")
        debug.log("compile", f"{self.runner.name}: bucket {signature[0]} in {seconds:.3f} s")
        plan.executables[signature] = compiled
        return compiled

    def _traceable(self, plan: _Plan, readers: list) -> Callable:
        runner, segment, symbols = self.runner, self.segment, self.symbols
        shapes = plan.shapes

        def fn(valid_vec, *bufs):
            valid = {s: valid_vec[i] for i, s in enumerate(symbols)}
            env: dict = dict(runner.constants)
            k = 0
            for p, (kind, info) in zip(runner.placeholders, readers):
                if kind == "buffer":
                    env[p] = geo.read(bufs[k], info)
                    k += 1
                elif kind == "size":
                    env[p] = int(info.xreplace(shapes.padded))
                else:
                    env[p] = info
            for node in segment.nodes:
                rule = plan.rules[node]
                if rule == "identity":
                    x = node.args[0]
                    identity = _IDENTITY[node.target](env[x].dtype)
                    env[x] = _mask(env[x], x, shapes, valid, identity)
                    value = segment._evaluate(node, env, None)
                    env[x] = _mask(env[x], x, shapes, valid, 0)  # other users see zero padding again
                elif rule == "attention":
                    key = node.args[_ATTENTION[node.target][1]]
                    with sdpa.keys_valid_to(_traced(_exprs(key.meta["val"])[2], valid)):
                        value = segment._evaluate(node, env, None)
                else:
                    value = segment._evaluate(node, env, None)
                if rule == "mean":
                    value = (value * _mean_scale(node, shapes, valid)).astype(value.dtype)
                env[node] = _mask_all(value, node, shapes, valid)
            flat: list = []
            plan.templates = [_template(env, a, flat, shapes) for a in runner.output.args[0]]
            return flat

        return fn

    def _rebuild(self, template, flat, args, exact, device):
        kind = template[0]
        if kind == "list":
            return template[1](self._rebuild(t, flat, args, exact, device) for t in template[2])
        if kind == "tensor":
            _, index, padded_sizes, exprs, dtype = template
            exact_sizes = tuple(int(e.xreplace(exact)) for e in exprs)
            buf = flat[index]
            _remember(buf, padded_sizes)
            t = _C._wrap(buf, list(padded_sizes), dtype, device)
            if padded_sizes == exact_sizes:
                return t
            return t.as_strided(exact_sizes, _contiguous(padded_sizes), 0)
        if kind == "placeholder":
            return args[template[1]]
        if kind == "size":
            return int(template[1].xreplace(exact))
        return template[1]


def _mask_fake(value, fake, shapes: _Shapes, valid: dict, fill):
    """`value` (of fake tensor `fake`) with its padding set to `fill`."""
    exprs = _exprs(fake)
    mask = None
    for d, e in enumerate(exprs):
        if int(e.xreplace(shapes.padded)) != int(e.xreplace(shapes.exact)):
            m = lax.broadcasted_iota(jnp.int64, tuple(value.shape), d) < _traced(e, valid)
            mask = m if mask is None else mask & m
    return value if mask is None else jnp.where(mask, value, jnp.asarray(fill, value.dtype))


def _mask(value, node: Node, shapes: _Shapes, valid: dict, fill):
    fake = node.meta.get("val")
    if not isinstance(fake, torch.Tensor) or not hasattr(value, "shape"):
        return value
    return _mask_fake(value, fake, shapes, valid, fill)


def _mask_all(value, node: Node, shapes: _Shapes, valid: dict):
    """`value` with the padding of each of its tensors set to zero."""
    fake = node.meta.get("val")
    if isinstance(fake, torch.Tensor):
        return _mask(value, node, shapes, valid, 0)
    if isinstance(fake, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(value)(
            _mask_fake(v, f, shapes, valid, 0) if isinstance(f, torch.Tensor) and hasattr(v, "shape") else v
            for f, v in zip(fake, value)
        )
    return value


def _mean_scale(node: Node, shapes: _Shapes, valid: dict):
    x = node.args[0]
    dims = _reduced_dims(node)
    padded_sizes, exact_sizes = shapes.of(x)
    exprs = _exprs(x.meta["val"])
    scale = 1.0
    for d in _norm_dims(dims, len(padded_sizes)):
        if padded_sizes[d] != exact_sizes[d]:
            scale = scale * (padded_sizes[d] / _traced(exprs[d], valid).astype(jnp.float32))
    return scale


def _template(env: dict, arg, flat: list, shapes: _Shapes):
    """How one graph output is rebuilt from the flat results."""
    if isinstance(arg, (list, tuple)):
        return (
            ("static", arg)
            if not any(isinstance(a, Node) for a in arg)
            else ("list", type(arg), [_template(env, a, flat, shapes) for a in arg])
        )
    if not isinstance(arg, Node):
        return ("static", arg)
    fake = arg.meta.get("val")
    if arg.op == "placeholder" and isinstance(fake, torch.Tensor):
        return ("placeholder", _placeholder_index(arg))
    if isinstance(fake, torch.SymInt):
        return ("size", fake.node.expr)
    if isinstance(fake, torch.Tensor):
        padded_sizes = shapes.of(arg)[0]
        flat.append(_as_buffer(jnp.asarray(env[arg]).astype(TORCH_TO_NUMPY[fake.dtype])))
        return ("tensor", len(flat) - 1, padded_sizes, _exprs(fake), fake.dtype)
    return ("static", env[arg])


def _placeholder_index(node: Node) -> int:
    index = 0
    for n in node.graph.nodes:
        if n is node:
            return index
        if n.op == "placeholder":
            index += 1
    raise KeyError(node)


__all__ = ["Buckets", "bucket"]
