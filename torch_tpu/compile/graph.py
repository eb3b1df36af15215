"""One ATen FX graph as one XLA executable.

The graph is lowered node by node through the same lowering table the eager
dispatcher uses (plus the graph-only ops in ops/lowerings/views.py), traced into one jax
function, and compiled once per concrete input signature: the geometry and
dtype of every tpu tensor, and the value of every Python number (SymInts are
static: a graph with symbolic sizes runs at bucketed sizes where its ops pad
safely, compile/buckets.py, and else recompiles per concrete size). Compiles go
through jax's compile path and so through the persistent cache.

Nodes no jax function covers (data-dependent ops, unlowered ops) split the
graph: they run eagerly through the dispatcher between jitted segments,
counted as "graph_eager_ops" and warned about once per op.

Data-dependent checks (an index out of range, integer division by zero) are the
graph form of each op's declared `check=` (ops/checks.py): traced error predicates
returned as one extra output of the executable, its verdict rows (failed?, value). They
raise CPU's error through ops/deferred_checks: at once on the CPU client, or at the next host
read where checks are deferred (TPU), so a graph never stops the host to check; segments
without checked ops return nothing extra.

Input mutations (functionalized `copy_` into a placeholder: optimizer state,
BatchNorm statistics) become buffer swaps on the input's storage, or a
scatter into its base when the input is a view.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src.lib import _jax
from torch._ops import OpOverload
from torch.fx import GraphModule, Node

from torch_tpu import _C, debug, metrics, platforms
from torch_tpu.compile import async_compile, buckets, donation, full_collections, saved_layouts
from torch_tpu.compile import options as compile_options
from torch_tpu.device import memory
from torch_tpu.ops import checks, deferred_checks, precision, registry, schema, storage_locks, tensors
from torch_tpu.ops import geometry as geo
from torch_tpu.ops.dtypes import NUMPY_TO_TORCH
from torch_tpu.ops.lowerings import copies
from torch_tpu.ops.rng import key_data, key_from_data
from torch_tpu.runtime import client, executable_cache
from torch_tpu.runtime.global_arrays import before_program

_plans: dict[OpOverload, schema.OpPlan] = {}


def _plan_of(op: OpOverload) -> schema.OpPlan:
    plan = _plans.get(op)
    if plan is None:
        plan = _plans[op] = schema.OpPlan(op, derived=False)
    return plan


def _fake(node: Any):
    return node.meta.get("val") if isinstance(node, Node) else None


def _fake_devices(fake) -> set[str]:
    if isinstance(fake, torch.Tensor):
        return {fake.device.type}
    if isinstance(fake, (list, tuple)):
        return set().union(*(_fake_devices(f) for f in fake)) if fake else set()
    return set()


def _has_bool_index(node: Node) -> bool:
    indices = node.args[1] if len(node.args) > 1 else []
    return any(isinstance(i, Node) and getattr(_fake(i), "dtype", None) in (torch.bool, torch.uint8) for i in indices)


# ---- classifying nodes ------------------------------------------------------


def _host_nodes(graph, constants: dict) -> tuple[list[Node], list[Node]]:
    """The nodes that compute on CPU tensors only from CPU inputs (an optimizer's step counter and
    bias corrections when its state is on the CPU), run with PyTorch's CPU kernels before the
    device segments, and the copy_ nodes writing their results back into CPU inputs, run after:
    computed on the device they would cost a transfer in and a host read (a sync) out, each step."""
    host: set[Node] = set()
    prelude, epilogue = [], []

    def on_host(n) -> bool:
        if not isinstance(n, Node) or n in host:
            return True
        if n.op == "placeholder" or n in constants:
            return not (_fake_devices(_fake(n)) - {"cpu"})
        return False

    for node in graph.nodes:
        if node.op != "call_function" or not node.all_input_nodes:
            continue
        inputs_on_host = all(on_host(a) for a in node.all_input_nodes)
        if node.target is torch.ops.aten.copy_.default:
            dst = node.args[0]
            if isinstance(dst, Node) and dst.op == "placeholder" and _fake_devices(_fake(dst)) == {"cpu"}:
                if inputs_on_host:
                    epilogue.append(node)
            continue
        if not (isinstance(node.target, OpOverload) or node.target is operator.getitem):
            continue
        if _fake_devices(_fake(node)) - {"cpu"} or not inputs_on_host:
            continue
        if isinstance(node.target, OpOverload) and any(
            a.alias_info is not None and a.alias_info.is_write for a in node.target._schema.arguments
        ):
            continue
        host.add(node)
        prelude.append(node)
    return prelude, epilogue


class _Lowered:
    """How one node evaluates inside a jitted segment."""

    __slots__ = ("check", "fn", "kind", "plan", "random_index")

    def __init__(self, kind: str, fn: Callable | None = None, plan=None, check: Callable | None = None):
        self.kind = kind  # "python", "graph", "copy_", "registry"
        self.fn = fn
        self.plan = plan
        self.check = check  # the graph form of the op's data-dependent check (a list of checks.Failure)
        self.random_index: int | None = None


def _classify(node: Node, eager_nodes: set[Node]) -> _Lowered | None:
    """The node's jax evaluation, or None if it must run eagerly."""
    target = node.target
    if node.op != "call_function":
        return None
    if target is operator.getitem:
        source = node.args[0]
        return None if isinstance(source, Node) and source in eager_nodes else _Lowered("python", target)
    if not isinstance(target, OpOverload):
        # Python arithmetic on sizes (operator.mul, sym_float, ...): static at trace time.
        if any(isinstance(a, Node) and isinstance(_fake(a), torch.Tensor) for a in node.all_input_nodes):
            return None
        return _Lowered("python", target)
    if _fake_devices(_fake(node)) - {"tpu", "cpu"}:
        return None
    if target is torch.ops.aten.copy_.default:
        dst = node.args[0]
        return _Lowered("copy_") if isinstance(dst, Node) and dst.op == "placeholder" else None
    if target is torch.ops.aten._to_copy.default:
        src = _fake(node.args[0])
        out = _fake(node)
        if not isinstance(src, torch.Tensor) or src.device != out.device or src.is_complex() or out.is_complex():
            return None
    if target in (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default) and _has_bool_index(node):
        return None  # a bool mask gives a data-dependent shape
    lowering = registry.lowering(target, platforms.lowering_platform())  # this platform's rule
    if lowering is None:
        return None
    if lowering.graph_only:
        lowered = _Lowered("graph", lowering.fn, check=lowering.graph_check)
        if lowering.random:
            lowered.random_index = -1  # numbered by the graph
        return lowered
    plan = _plan_of(target)
    if plan.mutable:
        return None  # functionalized graphs only hold in-place ops on inputs as copy_
    fn = lowering.graph_fn
    if fn is None:
        return None  # an eager lowering without a graph form: the graph splits
    lowered = _Lowered("registry", fn, plan, lowering.graph_check)
    if lowering.random:
        if plan.generator_index is not None:
            bound = plan.bind(node.args, node.kwargs)
            if bound[plan.generator_index] is not None:
                return None
        lowered.random_index = -1  # numbered by the graph
    return lowered


# ---- evaluating nodes inside the trace ----------------------------------------


def _weak(value):
    """A Python number given for a Tensor argument, traced as a weakly typed scalar (as eager does)."""
    if isinstance(value, (bool, int, float)) and not isinstance(value, torch.SymInt):
        return jnp.asarray(value)
    return value


def _map_args(args, env: dict):
    return torch.fx.node.map_aggregate(args, lambda a: env[a] if isinstance(a, Node) else a)


# ---- one jitted segment -------------------------------------------------------


class _Input:
    """How a segment reads one input: a tpu buffer through its geometry, a traced scalar, or a static value."""

    __slots__ = ("bits", "geom", "kind", "value")

    def __init__(self, kind: str, geom=None, value=None, bits: tuple[bool, bool] = (False, False)):
        self.kind = kind  # "buffer", "scalar", "array", "static"
        self.geom = geom
        self.value = value
        self.bits = bits  # a buffer's (conj, neg) bits: read (and written back) through them


class _Executable:
    __slots__ = (
        "check_errors",
        "checks",
        "compiled",
        "donated",
        "mutation_specs",
        "out_templates",
        "split",
        "temp_bytes",
    )

    def __init__(self):
        self.compiled = None
        self.temp_bytes = 0  # XLA's temporaries (device/memory.py: note_temp_bytes)
        self.donated: tuple[int, ...] = ()
        self.out_templates: list = []
        self.mutation_specs: list = []
        # (error, message) of each traced check; when any, the last output is their verdict rows
        # (failed?, offending value), int64 [n, 2], for deferred_checks.check.
        self.checks: list = []
        self.check_errors: list | None = None
        # (kept, free) flat output indices where saved tensors leave in XLA's layouts (saved_layouts.py)
        self.split: tuple[tuple[int, ...], tuple[int, ...]] | None = None


class Segment:
    """Consecutive lowerable nodes of a graph, compiled per input signature."""

    def __init__(self, name: str, nodes: list[Node], lowered: dict[Node, _Lowered], inputs: list[Node], outputs):
        self.name = name
        self.nodes = nodes
        self.lowered = lowered
        self.inputs = inputs
        self.outputs = outputs  # nodes whose values are needed after the segment
        self.mutations = [(n.args[0], n) for n in nodes if lowered[n].kind == "copy_"]
        self.mutated_positions = [inputs.index(placeholder) for placeholder, _ in self.mutations]
        self.has_random = any(lowered[n].random_index is not None for n in nodes)
        self.has_checks = any(lowered[n].check is not None for n in nodes)
        self.executables: dict[tuple, _Executable] = {}
        self.rules = platforms.lowering_platform()  # whose lowering rules its nodes were given
        self._last_signature: tuple | None = None
        self._text: str | None = None
        self.options = compile_options.DEFAULT  # set by GraphRunner
        self.shaped = platforms.shaped_buffers()  # fresh and written buffers keep their shapes
        self.free_layout: frozenset[Node] = frozenset()  # outputs only the backward reads (set by GraphRunner)

    # -- runtime --

    def run(self, values: list, rng_data) -> list:
        if not self.mutations:
            return self._run(values, rng_data, [])
        targets = [values[i] for i in self.mutated_positions]
        with storage_locks.held(targets):  # the mutated inputs' read, run and swap: atomic
            return self._run(values, rng_data, targets)

    def _run(self, values: list, rng_data, targets: list) -> list:
        """Runs the graph; `targets`: the inputs it mutates, in `self.mutations`' order."""
        dyn: list = []
        sig: list = []
        device = None
        for v in values:
            if isinstance(v, torch.Tensor):
                info = _C._arg_info(v)
                if info is not None:
                    index, buf, key = info
                    if device is None:
                        device = index
                    elif index != device:
                        raise RuntimeError(
                            "Expected all tensors to be on the same device, but found at least two "
                            f"devices, tpu:{device} and tpu:{index}!"
                        )
                    if buf is None:
                        buf = tensors.buffer_of(v)
                    dyn.append(buf)
                    if key is None:  # also for a tensor with the conj or neg bit (they join the key)
                        bits = tensors.math_bits(v)
                        key = tensors.tensor_geometry(v, buf)
                        key = key if bits == (False, False) else (key, bits)
                    sig.append(key)
                elif v.dim() == 0:
                    dyn.append(v.item())
                    sig.append(("cpu0", v.dtype))
                else:
                    metrics.bump("host_transfers")
                    dyn.append(v.detach().numpy())
                    sig.append(("cpu", tuple(v.shape), v.dtype))
            else:
                sig.append(("static", type(v), v))
        if self.has_random:
            dyn.append(rng_data)
        if device is None:
            device = _C._current_device()
        sig.append(device)
        sig.append(("matmul_precision", precision.cache_key()))
        signature = tuple(sig)
        exe = self.executables.get(signature)
        if exe is None and self.options.async_compile:
            outs = async_compile.run_while_compiling(self, values, dyn, signature, device)
            if outs is not None:
                return outs
            exe = self.executables[signature]
        elif exe is None:
            with full_collections.window():
                exe = self._compile(values, dyn, signature, device)
        else:
            metrics.bump("graph_cache_hits")
        if exe.donated:
            info = buf = None  # the loop's last buffer would count as another holder
            released = False
            for target in targets:  # a cached host view holds the array too
                released |= target.device.type == "tpu" and _C._release_host_view(target)
            if released:
                _jax.collect_garbage()  # where jax drops the views' references
            donation.guard(dyn, exe.donated)
        with memory.out_of_memory_as_torch(device, f"running the compiled graph {self.name}"):
            try:
                flat = exe.compiled(*dyn)
            except ValueError as error:  # saved tensors in other layouts than compiled for
                if not saved_layouts.is_layout_mismatch(error):
                    raise
                signature = (*signature, saved_layouts.layouts_of(dyn))
                exe = self.executables.get(signature) or self._compile(values, dyn, signature, device)
                flat = exe.compiled(*dyn)
        if exe.split is not None:
            flat = saved_layouts.joined(flat, exe.split)
        memory.note_temp_bytes(device or 0, exe.temp_bytes)
        metrics.bump("executions")
        if exe.checks:
            deferred_checks.check(flat[-1], _check_errors(exe), f"the compiled graph {self.name}")
        outs = [_rebuild(t, flat, device) for t in exe.out_templates]
        for target, spec in zip(targets, exe.mutation_specs):
            new = flat[spec[0]]
            if target.device.type == "tpu":
                _C._set_buffer(target, new, NUMPY_TO_TORCH[np.dtype(new.dtype)], new.size)
            else:
                target.copy_(copies.jax_to_cpu(new).reshape(target.shape))
        return outs

    # -- compiling --

    def _compile(self, values: list, dyn: list, signature: tuple, device: int) -> _Executable:
        readers = []
        for v, key in zip(values, signature):
            if isinstance(v, torch.Tensor) and v.device.type == "tpu":
                geom = key if isinstance(key, geo.Geometry) else tensors.tensor_geometry(v, tensors.buffer_of(v))
                readers.append(_Input("buffer", geom, bits=tensors.math_bits(v)))
            elif isinstance(v, torch.Tensor):
                readers.append(_Input("scalar" if v.dim() == 0 else "array"))
            else:
                readers.append(_Input("static", value=v))
        exe = _Executable()
        fn = self._traceable(readers, exe)
        opts = self.options
        exe.donated = donation.candidates(self, values, readers) if opts.donate_buffers else ()
        jit_kwargs: dict = {"donate_argnums": exe.donated} if exe.donated else {}
        free = [i for i, n in enumerate(self.outputs) if n in self.free_layout]
        placed = jax.sharding.SingleDeviceSharding(client.jax_device(device))
        if free:  # (default-layout outputs, saved tensors in XLA's layouts)
            fn = self._split_traceable(fn, exe, free)
            default = None if any(r.kind == "buffer" for r in readers) else placed
            jitted = jax.jit(fn, out_shardings=(default, saved_layouts.auto_format(default)), **jit_kwargs)
        elif any(r.kind == "buffer" for r in readers):
            jitted = jax.jit(fn, **jit_kwargs)
        else:
            jitted = jax.jit(fn, out_shardings=placed, **jit_kwargs)
        if debug.enabled() and self._last_signature is not None:
            debug.log("recompile", f"{self.name}: {_signature_change(self._last_signature, signature)}")
        start = time.perf_counter()
        persist = None
        if opts.dump_dir is None:  # a dump needs the lowering
            key = (self.text(), signature, exe.donated, repr(opts), self.shaped, tuple(free))
            persist = executable_cache.key_text("graph", key)
        found = executable_cache.load(persist)
        if found is not None:
            exe.compiled, (exe.out_templates, exe.mutation_specs, *rest) = found
            exe.checks = rest[0] if rest else []  # entries saved before checks had none
            exe.split = rest[1] if len(rest) > 1 else None
            # XLA's temporaries as measured at compile time (a loaded executable need not say)
            exe.temp_bytes = rest[2] if len(rest) > 2 else memory.temp_bytes_of(exe.compiled)
            debug.log(
                "compile", f"{self.name}: loaded from the persistent cache in {time.perf_counter() - start:.3f} s"
            )
        else:
            with opts.tracing():
                lowered = jitted.lower(*dyn)
            with memory.out_of_memory_as_torch(device, f"compiling the graph {self.name}"):
                exe.compiled = compile_options.compile_lowered(lowered, opts)
            compile_options.dump(opts, f"{self.name}.{len(self.executables)}", lowered, exe.compiled)
            exe.temp_bytes = memory.temp_bytes_of(exe.compiled)
            meta = (exe.out_templates, exe.mutation_specs, exe.checks, exe.split, exe.temp_bytes)
            executable_cache.save(persist, exe.compiled, meta)
            seconds = time.perf_counter() - start
            metrics.record_compile("graph", seconds)
            metrics.bump("graph_compiles")
            debug.log("compile", f"{self.name}: {len(self.nodes)} nodes in {seconds:.3f} s")
        self.executables[signature] = exe
        self._last_signature = signature
        return exe

    def text(self) -> str:
        """The segment's FX nodes as text (names, targets, arguments, fake values): with the input
        signature, the graph half of its persistent key."""
        if self._text is None:
            lines = [f"in {n.name}: {_fake_text(_fake(n))}" for n in self.inputs]
            for n in self.nodes:
                how = self.lowered[n]
                args = f"{n.args!r} {n.kwargs!r}"
                checked = " checked" if how.check is not None else ""
                lines.append(
                    f"{n.name} = {_target_text(n.target)}{args}: {_fake_text(_fake(n))} {how.kind} {how.random_index}"
                    + checked
                )
            lines.append(f"out {[n.name for n in self.outputs]} mutates {[p.name for p, _ in self.mutations]}")
            lines.append(f"rules {self.rules}")
            self._text = "\n".join(lines)
        return self._text

    @staticmethod
    def _split_traceable(fn: Callable, exe: _Executable, free: list[int]) -> Callable:
        """`fn` returning (default-layout outputs, the `free` outputs' arrays) for out_shardings."""

        def split(*dyn):
            flat = fn(*dyn)
            arrays = [exe.out_templates[i][1] for i in free if exe.out_templates[i][0] == "array"]
            exe.split = saved_layouts.split_outputs(flat, arrays)
            return [flat[i] for i in exe.split[0]], [flat[i] for i in exe.split[1]]

        return split

    def _traceable(self, readers: list[_Input], exe: _Executable) -> Callable:
        def fn(*dyn):
            env: dict = {}
            buffers: dict = {}
            k = 0
            for node, reader in zip(self.inputs, readers):
                if reader.kind == "static":
                    env[node] = reader.value
                    continue
                value = dyn[k]
                k += 1
                if reader.kind == "buffer":
                    buffers[node] = value
                    value = tensors.apply_bits(geo.read(value, reader.geom), *reader.bits)
                env[node] = value
            rng_data = dyn[k] if self.has_random else None
            failures: list[checks.Failure] = []
            for node in self.nodes:
                env[node] = self._evaluate(node, env, rng_data, failures)
            flat: list = []
            exe.out_templates = [_flatten(env[n], _fake(n), flat) for n in self.outputs]
            exe.mutation_specs = []
            for placeholder, copy_node in self.mutations:
                reader = readers[self.inputs.index(placeholder)]
                value = env[copy_node]
                if reader.kind == "buffer":
                    value = tensors.apply_bits(jnp.broadcast_to(value, reader.geom.sizes), *reader.bits)
                    value = geo.write(buffers[placeholder], reader.geom, value, self.shaped)
                exe.mutation_specs.append((len(flat),))
                flat.append(value)
            exe.checks = [(f.error, f.message) for f in failures]
            if failures:
                rows = [jnp.stack([jnp.asarray(f.bad, jnp.int64), jnp.asarray(f.value, jnp.int64)]) for f in failures]
                flat.append(jnp.stack(rows))
            return flat

        return fn

    def _evaluate(self, node: Node, env: dict, rng_data, failures: list | None = None):
        """The node's value; its check's failures go to `failures` (None: not checked)."""
        lowered = self.lowered[node]
        args = _map_args(node.args, env)
        kwargs = _map_args(node.kwargs, env)
        if lowered.kind == "python":
            return lowered.fn(*args, **kwargs)
        fake = _fake(node)
        rng = None
        if lowered.random_index is not None:
            rng = key_from_data(rng_data[lowered.random_index])
        if lowered.kind == "graph":
            if lowered.check is not None and failures is not None:
                failures += lowered.check(fake, *args, **kwargs)
            if rng is not None:
                kwargs = {**kwargs, "rng": rng}
            return lowered.fn(fake, *args, **kwargs)
        if lowered.kind == "copy_":
            dst = jnp.asarray(args[0])
            return jnp.broadcast_to(jnp.asarray(args[1]).astype(dst.dtype), dst.shape)
        plan = lowered.plan
        bound = plan.bind(args, kwargs)
        for i in plan.tensor_args:
            bound[i] = _weak(bound[i])
        if lowered.check is not None and failures is not None:
            failures += schema.call_lowering(lowered.check, plan, bound)
        result = schema.call_lowering(lowered.fn, plan, bound, rng)
        result = result[0] if plan.num_fresh == 1 else tuple(result[: plan.num_fresh])
        return schema.conform_tree(result, fake, node.target, keep_shape=True)


def _check_errors(exe: _Executable) -> list:
    """Per traced check of `exe`, value -> CPU's exception (made once per executable)."""
    if exe.check_errors is None:
        exe.check_errors = [
            lambda value, error=error, message=message: error(message.format(value=value))
            for error, message in exe.checks
        ]
    return exe.check_errors


def _target_text(target) -> str:
    if isinstance(target, OpOverload):
        return str(target)
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', target)}"


def _fake_text(fake) -> str:
    if isinstance(fake, torch.Tensor):
        return f"{fake.dtype}{list(fake.shape)}{list(fake.stride())}{fake.device.type}"
    if isinstance(fake, (list, tuple)):
        return "[" + ", ".join(_fake_text(f) for f in fake) + "]"
    return repr(fake)


def _dense_order(fake, shape: tuple) -> tuple[int, ...] | None:
    """The dims of a dense but non-contiguous fake result (a transposed output), outermost
    first, so the buffer can be laid out with eager's strides; None when row-major will do."""
    if not isinstance(fake, torch.Tensor) or len(shape) < 2:
        return None
    strides = fake.stride()
    if not all(isinstance(st, int) for st in strides) or geo.is_contiguous(shape, tuple(strides)):
        return None
    order = tuple(sorted(range(len(shape)), key=lambda d: -strides[d]))
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return order


def _flatten(value, fake, flat: list):
    """A template of `value` whose arrays are moved to `flat` (as buffers: flat, or shaped where
    the platform keeps buffers shaped)."""
    if isinstance(value, (list, tuple)):
        fakes = fake if isinstance(fake, (list, tuple)) else [None] * len(value)
        return (type(value), [_flatten(v, f, flat) for v, f in zip(value, fakes)])
    if isinstance(value, jax.Array):
        shape = tuple(value.shape)
        order = _dense_order(fake, shape)
        value = value if order is None else jnp.transpose(value, order)
        flat.append(value if platforms.shaped_buffers() else value.reshape(-1))
        dtype = fake.dtype if isinstance(fake, torch.Tensor) else NUMPY_TO_TORCH[np.dtype(value.dtype)]
        on_cpu = isinstance(fake, torch.Tensor) and fake.device.type == "cpu"
        return ("array", len(flat) - 1, shape, dtype, on_cpu and order is None, order)
    return ("static", value)


def _rebuild(template, flat: list, device: int):
    kind = template[0]
    if kind == "static":
        return template[1]
    if kind == "array":
        _, index, shape, dtype, on_cpu, order = template
        if on_cpu:
            return copies.jax_to_cpu(flat[index]).reshape(shape)
        if order is None:
            return _C._wrap(flat[index], list(shape), dtype, device)
        physical = _C._wrap(flat[index], [shape[d] for d in order], dtype, device)
        return physical.permute([order.index(d) for d in range(len(shape))])
    container, items = template
    return container(_rebuild(t, flat, device) for t in items)


def _to_default_layout(t: torch.Tensor) -> None:
    """`t`'s buffer in the default layout, in place (the same values): a saved tensor the forward
    left in XLA's layout, read by an eager op between a backward's segments."""
    buf = tensors.buffer_of(t)
    if not saved_layouts.is_default(buf):
        new = saved_layouts.to_default(buf)
        _C._set_buffer(t, new, NUMPY_TO_TORCH[np.dtype(new.dtype)], new.size)


def _signature_change(old: tuple, new: tuple) -> str:
    changes = []
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            changes.append(f"input {i}: {_describe_key(a)} -> {_describe_key(b)}")
    if len(old) != len(new):
        changes.append(f"{len(old)} -> {len(new)} inputs")
    return "; ".join(changes[:8]) or "new signature"


def _describe_key(key) -> str:
    if isinstance(key, geo.Geometry):
        return f"{np.dtype(key.dtype).name}{list(key.sizes)} strides {list(key.strides)} offset {key.offset}"
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], tuple):
        return f"{key[1]}{list(key[0])}"
    return repr(key)


# ---- the whole graph ------------------------------------------------------------


class GraphRunner:
    """A compiled FX graph: jitted segments and the eager nodes between them."""

    def __init__(
        self,
        gm: GraphModule,
        name: str,
        options: compile_options.CompileOptions | None = None,
        host_work: bool = True,
        saved_outputs: tuple[int, ...] = (),
    ):
        # aot_autograd passes the arguments as one list. An instance attribute, so that
        # wrappers made with functools.wraps (dynamo's disable) keep it.
        self._boxed_call = True
        self.gm = gm
        self.name = name
        graph = gm.graph
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self.output = next(n for n in graph.nodes if n.op == "output")
        self.constants: dict[Node, Any] = {}
        self.steps: list = []  # Segment or an eager Node, in order
        # CPU work on CPU inputs, run with PyTorch (_host_nodes); not for one-module export.
        self.host_nodes: set[Node] = set()
        self._host_work = host_work
        self._partition(graph)
        # a forward's outputs only the backward reads leave in XLA's layouts (saved_layouts.py)
        on = platforms.saved_tensor_layouts()
        saved = frozenset(self.output.args[0][i] for i in saved_outputs) if on else frozenset()
        for step in self.steps:
            if isinstance(step, Segment):
                step.options = options or compile_options.DEFAULT
                step.free_layout = saved.intersection(step.outputs)
        self.num_random = sum(
            1 for s in self.steps if isinstance(s, Segment) for n in s.nodes if s.lowered[n].random_index is not None
        )
        # Symbolic sizes: run at bucketed sizes where every op pads safely (compile/buckets.py).
        opts = options or compile_options.DEFAULT
        self.buckets = (
            buckets.Buckets(self, opts) if opts.dynamic_buckets != () and buckets.Buckets.applies(self) else None
        )

    def _partition(self, graph) -> None:
        lowered: dict[Node, _Lowered] = {}
        eager: set[Node] = set()
        groups: list = []
        current: list[Node] = []
        random_count = 0
        for node in graph.nodes:
            if node.op == "get_attr":
                self.constants[node] = getattr(self.gm, node.target)
        prelude, epilogue = _host_nodes(graph, self.constants) if self._host_work else ([], [])
        for node in prelude:  # CPU work from CPU inputs: run first, with PyTorch on the host
            eager.add(node)
            groups.append(node)
        on_host = self.host_nodes = set(prelude) | set(epilogue)
        for node in graph.nodes:
            if node.op in ("placeholder", "output", "get_attr") or node in on_host:
                continue
            how = _classify(node, eager)
            if how is None:
                eager.add(node)
                if current:
                    groups.append(current)
                    current = []
                groups.append(node)
                self._note_eager(node)
                continue
            if how.random_index is not None:
                how.random_index = random_count
                random_count += 1
            lowered[node] = how
            current.append(node)
        if current:
            groups.append(current)
        for node in epilogue:  # results written back into CPU inputs, after everything read them
            eager.add(node)
            groups.append(node)
        # Values each segment needs from before it, and values needed after it.
        position = {}
        for i, group in enumerate(groups):
            for n in group if isinstance(group, list) else [group]:
                position[n] = i
        needed_after: dict[Node, int] = {}
        for node in graph.nodes:
            user_pos = len(groups) if node.op == "output" else position.get(node)
            if user_pos is None:
                continue
            for used in node.all_input_nodes:
                needed_after[used] = max(needed_after.get(used, -1), user_pos)
        for i, group in enumerate(groups):
            if not isinstance(group, list):
                self.steps.append(group)
                continue
            members = set(group)
            inputs: list[Node] = []
            for n in group:
                for used in n.all_input_nodes:
                    if used not in members and used not in inputs:
                        inputs.append(used)
            outputs = [n for n in group if needed_after.get(n, -1) > i]
            self.steps.append(Segment(f"{self.name}[{i}]", group, lowered, inputs, outputs))

    def _note_eager(self, node: Node) -> None:
        name = str(node.target)
        if node.target is not operator.getitem:
            debug.warn_once(
                f"graph split {name}",
                f"torch_tpu: {name} in a compiled graph has no jax lowering; the graph is split and it runs "
                "eagerly (counted in torch_tpu.metrics.counters()['graph_eager_ops'])",
                stacklevel=2,
            )
        debug.log("graph-split", f"{self.name}: {name} runs eagerly between jitted segments")

    def __call__(self, *args) -> list:
        if len(args) == 1 and type(args[0]) is list:  # boxed: one list, which we may clear
            args = args[0]
        if tensors.lazy is not None:  # lazy mode: run what is recorded, the graph reads it
            tensors.lazy.flush()
        if self.buckets is not None:
            outs = self.buckets(list(args))
            if outs is not None:
                if type(args) is list:
                    args.clear()
                return outs
        env: dict[Node, Any] = dict(zip(self.placeholders, args))
        env.update(self.constants)
        if type(args) is list:
            args.clear()
        rng_data = None
        if self.num_random:
            device = next((v.device.index for v in env.values() if isinstance(v, torch.Tensor)), 0) or 0
            rng_data = key_data(None, device, self.num_random)
        for step in self.steps:
            if isinstance(step, Segment):
                before_program()
                outs = step.run([env[n] for n in step.inputs], rng_data)
                env.update(zip(step.outputs, outs))
            else:
                env[step] = self._run_eager(step, env)
        return list(_map_args(self.output.args[0], env))

    def _run_eager(self, node: Node, env: dict):
        if node.target is not operator.getitem and node not in self.host_nodes:
            metrics.bump("graph_eager_ops")
        args = _map_args(node.args, env)
        kwargs = _map_args(node.kwargs, env)
        if platforms.saved_tensor_layouts():  # eager ops read buffers in the default layout
            for value in (*args, *kwargs.values()):
                if isinstance(value, torch.Tensor) and value.device.type == "tpu":
                    _to_default_layout(value)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if node.op == "call_module":
            return getattr(self.gm, node.target)(*args, **kwargs)
        return node.target(*args, **kwargs)
