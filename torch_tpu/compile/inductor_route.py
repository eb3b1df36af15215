"""`torch.compile(model)` with the default backend: graphs on tpu tensors go to the "tpu" backend.

torch.compile's default backend is inductor, which calls
`torch._inductor.compile_fx.compile_fx(graph, example_inputs, config_patches=...)`
for each dynamo graph. Inductor would lower a tpu graph to its loop-level IR and
hand it to its own Pallas codegen (written for another package), so the graph
never reaches XLA as ATen ops. We wrap `compile_fx` at that one entry point:
a graph that touches a tpu tensor is compiled by our backend (aot_autograd ->
one XLA executable per graph, as `backend="tpu"`); every other graph (CPU,
CUDA) reaches inductor's own compile_fx with its arguments unchanged.

Why not an inductor device backend (`register_backend_for_device("tpu", ...)`)?
Its scheduling receives inductor's fused loop IR after inductor's own
decompositions; turning that back into whole-array XLA ops would throw away
what XLA fuses better itself and duplicate the lowering table. The
compile_fx entry is the last point where the graph is still ATen.

Inductor's modes map to ours (compile/options.py). Inductor `options=` have no
meaning for XLA: on a tpu graph they raise, naming `backend="tpu"` and its options.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

from torch.fx import GraphModule

_COMPILE_FX = "torch._inductor.compile_fx"
_ROUTED = "_torch_tpu_routed"


def _mode_of(config_patches: dict | None) -> str:
    """The torch.compile mode whose inductor config patches these are."""
    patches = dict(config_patches or {})
    if not patches:
        return "default"
    from torch._inductor import list_mode_options

    from torch_tpu.compile import options

    for mode in options.MODES:
        if mode != "default" and patches == list_mode_options(mode):
            return mode
    raise RuntimeError(
        f"torch.compile: inductor options {sorted(patches)} do not apply to graphs on tpu tensors "
        '(they are compiled by XLA, not inductor). Use torch.compile(model, backend="tpu", mode=..., '
        f"options={{...}}) with the options {', '.join(options.OPTION_NAMES)}"
    )


def _routed(original):
    @functools.wraps(original)
    def compile_fx(model_, example_inputs_, *args, **kwargs):
        from torch_tpu.compile import backend

        if isinstance(model_, GraphModule) and backend._touches_tpu(model_, example_inputs_):
            patches = kwargs.get("config_patches", args[1] if len(args) > 1 else None)
            return backend.tpu_backend(model_, example_inputs_, mode=_mode_of(patches))
        return original(model_, example_inputs_, *args, **kwargs)

    setattr(compile_fx, _ROUTED, True)
    return compile_fx


def _wrap(module) -> None:
    if not getattr(module.compile_fx, _ROUTED, False):
        module.compile_fx = _routed(module.compile_fx)


class _WrapAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps compile_fx once torch._inductor.compile_fx has been executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _COMPILE_FX:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_wrap(module):
            exec_module(module)
            _wrap(module)

        spec.loader.exec_module = exec_then_wrap
        return spec


def install() -> None:
    """Routes tpu graphs of the default backend to "tpu" (now, or when inductor's compile_fx loads)."""
    module = sys.modules.get(_COMPILE_FX)
    if module is not None and hasattr(module, "compile_fx"):
        _wrap(module)
    elif not any(isinstance(f, _WrapAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapAfterImport())
