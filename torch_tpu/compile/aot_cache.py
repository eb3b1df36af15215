"""aot_autograd's results kept across processes: a warm process skips aot_autograd's tracing.

Each graph aot_autograd hands the backend (forward, backward, inference) becomes a `GraphOutput`:
torch's `OutputCode`, which its AOTAutogradCache stores in bundled form, with the runtime
metadata aot_autograd's wrappers need (input mutations, aliased outputs, what the backward
saves). A later process with the same dynamo graph loads that entry instead of tracing the joint
graph, partitioning and decomposing again; each GraphOutput rebuilds its GraphRunner from the
stored ATen graph, whose executables then load from torch_tpu's persistent cache
(runtime/executable_cache.py): nothing is traced by aot_autograd or jax, nothing compiled.

torch's key covers the dynamo graph and its inputs' metadata, grad mode, autocast state,
torch's sources and its configs, but not what the backend does with the graph: torch_tpu's
part (`cache_tag`: the executable cache's fingerprint, which holds torch_tpu's build identity,
so its decompositions and lowerings, and the compile options) joins it through
`torch.compiler.config.cache_key_tag`. The entries live where torch keeps its own (under
torch's cache directory, TORCHINDUCTOR_CACHE_DIR); they are used while torch_tpu's persistent
cache is on (TORCH_TPU_PERSISTENT_CACHE) and torch's AOTAutogradCache is
(torch._functorch.config.enable_autograd_cache).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch._inductor.output_code import OutputCode
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import GraphModule
from torch.utils._mode_utils import no_dispatch

from torch_tpu import metrics
from torch_tpu.compile import graph_record, saved_layouts
from torch_tpu.compile import options as compile_options
from torch_tpu.compile.graph import GraphRunner
from torch_tpu.runtime import executable_cache, persistent_cache

graph_ids = itertools.count()

# torch functions dynamo puts in graphs that torch's AOTAutogradCache does not list as safe to
# key by the graph: their behaviour is torch's source, which the key holds (torch's own hash).
_TORCH_FUNCTIONS = ("torch.amp.autocast_mode._enter_autocast", "torch.amp.autocast_mode._exit_autocast")


class GraphOutput(OutputCode):
    """One graph aot_autograd compiled, as torch's OutputCode: a GraphRunner over the ATen graph,
    pickled as that graph (with its fake values) and rebuilt from it in `post_compile`."""

    def __init__(
        self, gm: GraphModule, kind: str, options: compile_options.CompileOptions, saved_outputs: tuple[int, ...] = ()
    ):
        super().__init__()
        self._boxed_call = True
        self.kind = kind
        self.options = options
        self.saved_outputs = saved_outputs  # a forward's outputs only the backward reads
        self.gm: GraphModule | None = gm
        name = f"{kind}{next(graph_ids)}"
        self.runner: GraphRunner | None = GraphRunner(gm, name, options, saved_outputs=saved_outputs)
        self.graph_record: tuple | None = None  # the graph as plain data (graph_record.py), or
        self.pickled_graph: bytes | None = None  # as GraphPickler's bytes
        self.fake_values: list | None = None  # the nodes' fake values as _described, or in pickled_graph

    def __call__(self, inputs: Sequence[Any]) -> Any:
        return self.runner(inputs)

    def prepare_for_serialization(self) -> None:
        """Called on a shallow copy before torch pickles it: the graph as data, no runner. Where
        every node's fake value is of static shape (`_described`) and the graph holds only plain
        arguments, it is kept as tuples (graph_record.py); else as GraphPickler's bytes, fake values
        as metadata where they can be (torch's pickler of fake tensors costs about a second per
        thousand nodes to load)."""
        from torch.fx._graph_pickler import GraphPickler, Options

        described = [_described(node.meta.get("val")) for node in self.gm.graph.nodes]
        if any(d is _NOT_DESCRIBED for d in described):
            self.pickled_graph = GraphPickler.dumps(self.gm, Options(ops_filter=None))
            self.fake_values = None
        else:
            self.graph_record = graph_record.encode(self.gm)
            if self.graph_record is None:
                options = Options(ops_filter=None, node_metadata_key_filter=lambda key: False)
                self.pickled_graph = GraphPickler.dumps(self.gm, options)
            self.fake_values = described
        self.gm = None
        self.runner = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        """After a load: the graph back from its data (fake values in the caller's fake mode)."""
        if self.runner is not None:
            return
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler

        fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode()
        if self.graph_record is not None:
            gm = graph_record.decode(self.graph_record)
        else:
            gm = GraphPickler.loads(self.pickled_graph, fake_mode)
        if self.fake_values is not None:
            for node, value in zip(gm.graph.nodes, self.fake_values, strict=True):
                node.meta["val"] = _fake_of(value, fake_mode)
        if self.graph_record is None:
            gm.recompile()
        self.gm = gm
        name = f"{self.kind}{next(graph_ids)}"
        self.runner = GraphRunner(gm, name, self.options, saved_outputs=self.saved_outputs)
        metrics.bump("aot_cache_loads")

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass


_NOT_DESCRIBED = object()


class _TensorMeta(NamedTuple):
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: str
    requires_grad: bool


def _described(value: Any) -> Any:
    """A node's fake value as plain data (tensors as _TensorMeta), or _NOT_DESCRIBED where it
    holds something else (a symbolic size, a tensor subclass, an opaque object)."""
    if value is None or type(value) in (bool, int, float, str, torch.dtype, torch.device):
        return value
    if type(value) in (list, tuple):
        items = [_described(v) for v in value]
        return _NOT_DESCRIBED if any(i is _NOT_DESCRIBED for i in items) else type(value)(items)
    if isinstance(value, FakeTensor) and value.layout == torch.strided and not value.is_quantized:
        sizes = (*value.shape, *value.stride(), value.storage_offset())
        if all(type(n) is int for n in sizes):
            return _TensorMeta(
                tuple(value.shape),
                tuple(value.stride()),
                value.storage_offset(),
                value.dtype,
                str(value.device),
                value.requires_grad,
            )
    return _NOT_DESCRIBED


def _fake_of(value: Any, fake_mode) -> Any:
    """`_described`'s value back, tensors as fake tensors of `fake_mode`."""
    if isinstance(value, _TensorMeta):
        extent = 1 + sum((n - 1) * st for n, st in zip(value.shape, value.stride)) if all(value.shape) else 0
        with no_dispatch():
            storage = torch.empty(value.offset + extent, dtype=value.dtype, device="meta")
            elem = storage.as_strided(value.shape, value.stride, value.offset)
        return FakeTensor(fake_mode, elem, torch.device(value.device), requires_grad=value.requires_grad)
    if type(value) in (list, tuple):
        return type(value)(_fake_of(v, fake_mode) for v in value)
    return value


def compiler(kind: str, options: compile_options.CompileOptions):
    """aot_autograd's compiler for `kind` graphs ("forward", "backward", "inference")."""
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    def compile_graph(gm: GraphModule, example_inputs) -> GraphOutput:
        metrics.bump("aot_graphs_compiled")
        saved = saved_layouts.saved_output_positions(gm) if kind == "forward" else ()
        if kind == "forward":
            _keep_saved_tensors()
        return GraphOutput(gm, kind, options, saved)

    return SerializableAOTDispatchCompiler(GraphOutput, compile_graph)


def _keep_saved_tensors() -> None:
    """The backward donates none of the saved tensors: aot_autograd's list of donatable ones is
    emptied (in place: its inner and outer metadata share the list). With the backward compiled
    at once (`settings`), aot_autograd refuses a `backward(retain_graph=True)` while that list
    is not empty, as if the buffers were donated."""
    context = torch._guards.TracingContext.try_get()
    donated = getattr(getattr(context, "fw_metadata", None), "bw_donated_idxs", None)
    if donated:
        donated.clear()


def cache_tag(options: compile_options.CompileOptions) -> str:
    """torch_tpu's part of the key: what a stored graph's meaning depends on besides the dynamo graph."""
    text = f"{executable_cache.fingerprint()}\n{options!r}"
    return "torch_tpu " + hashlib.sha256(text.encode()).hexdigest()[:32]


@contextlib.contextmanager
def settings(options: compile_options.CompileOptions) -> Iterator[None]:
    """torch's configuration for one aot_autograd call of the backend: bundled entries, compiled
    backward at once (the entry is saved when both graphs are, inside this call), torch_tpu's tag."""
    if persistent_cache.store() is None:
        with torch._functorch.config.patch(enable_autograd_cache=False):
            yield
        return
    user_tag = torch.compiler.config.cache_key_tag
    tag = f"{user_tag} {cache_tag(options)}".strip()
    marked = dict.fromkeys(_TORCH_FUNCTIONS, f"torch {torch.__version__}")
    marked |= torch._inductor.config.unsafe_marked_cacheable_functions
    with (
        torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True),
        torch.compiler.config.patch(cache_key_tag=tag),
        torch._inductor.config.patch(unsafe_marked_cacheable_functions=marked),
    ):
        yield
