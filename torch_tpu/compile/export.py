"""`torch_tpu.export(model, example_args)`: a model as StableHLO text and portable jax bytecode.

The model is traced on CPU with fake tensors into one functional ATen graph
(PyTorch's decompositions for ops without a lowering, as in graph mode), the
graph is lowered through the same lowering table as `torch.compile(backend="tpu")`,
and the resulting jax function is exported with `jax.export`. The result runs
under jax alone (`jax.export.deserialize(bytecode).call(...)`), without torch.

weights="arguments": parameters and buffers are the first arguments of the
exported function (in `weight_names` order; `weights` holds their values).
weights="constants": they are baked into the module as constants.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torch_tpu.compile import graph
from torch_tpu.ops.dtypes import TORCH_TO_NUMPY


@dataclasses.dataclass
class ExportedModel:
    """A model exported to StableHLO. Calling it runs the jax executable on jax arrays or numpy."""

    exported: jax.export.Exported
    weight_names: list[str]
    weights: list[np.ndarray]  # empty when weights="constants"
    output_structure: Any  # the model's output with each array replaced by its position
    weights_as_arguments: bool = True

    @property
    def stablehlo(self) -> str:
        """The StableHLO module as MLIR text."""
        return self.exported.mlir_module()

    @property
    def bytecode(self) -> bytes:
        """The module as a portable StableHLO artifact (versioned MLIR bytecode, stable across releases)."""
        return bytes(self.exported.mlir_module_serialized)

    def serialize(self) -> bytes:
        """jax's serialized Exported (bytecode plus calling convention): `jax.export.deserialize` restores
        it. Needs the `flatbuffers` package, as jax's serialization does."""
        return bytes(self.exported.serialize())

    def __call__(self, *args):
        arrays = [_to_jax(a) for a in args]
        if self.weights_as_arguments:
            flat = self.exported.call(self.weights, arrays)
        else:
            flat = self.exported.call(arrays)
        return _restructure(self.output_structure, flat)


def _to_jax(value):
    if isinstance(value, torch.Tensor):
        return jnp.asarray(value.detach().cpu().numpy())
    return value


def _restructure(structure, flat):
    if isinstance(structure, int):
        return flat[structure]
    if isinstance(structure, (list, tuple)):
        return type(structure)(_restructure(s, flat) for s in structure)
    return structure


def _natural(template, flat: list, out: list):
    """The output `template` of a segment as natural-shaped arrays, appended to `out`."""
    kind = template[0]
    if kind == "static":
        return template[1]
    if kind == "array":
        _, index, shape, _, _, order = template
        value = flat[index]
        if order is None:
            value = value.reshape(shape)
        else:
            value = jnp.transpose(value.reshape([shape[d] for d in order]), [order.index(d) for d in range(len(shape))])
        out.append(value)
        return len(out) - 1
    container, items = template
    return container(_natural(t, flat, out) for t in items)


def export(
    model: torch.nn.Module, example_args: Sequence, weights: str = "arguments", example_kwargs: dict | None = None
) -> ExportedModel:
    """Exports `model(*example_args)` (inference: no autograd, no RNG) to StableHLO."""
    if weights not in ("arguments", "constants"):
        raise ValueError(f'torch_tpu.export: weights must be "arguments" or "constants", got {weights!r}')
    from torch_tpu.compile import backend

    kwargs = dict(example_kwargs or {})
    state = {k: v.detach().cpu() for k, v in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items()}
    args = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in example_args]
    names = list(state)
    tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    cpu_model = model  # functional_call swaps in the CPU copies of its weights

    def forward(*flat):
        full = list(args)
        for i, value in zip(tensor_positions, flat[len(names) :]):
            full[i] = value
        return torch.func.functional_call(cpu_model, dict(zip(names, flat[: len(names)])), tuple(full), kwargs)

    was_training = cpu_model.training
    cpu_model.eval()
    try:
        with torch.no_grad():
            gm = make_fx(forward, decomposition_table=backend.decompositions(), tracing_mode="fake")(
                *state.values(), *(args[i] for i in tensor_positions)
            )
    finally:
        cpu_model.train(was_training)
    runner = graph.GraphRunner(gm, "export", host_work=False)  # one module: its CPU work included
    segments = [s for s in runner.steps if isinstance(s, graph.Segment)]
    eager = [s for s in runner.steps if not isinstance(s, graph.Segment)]
    if eager or len(segments) != 1:
        ops = sorted({str(n.target) for n in eager})
        raise NotImplementedError(
            f"torch_tpu.export: these ops have no jax lowering, so the graph cannot be one module: {ops}"
        )
    segment = segments[0]
    if segment.has_random:
        raise NotImplementedError("torch_tpu.export: the model draws random numbers (dropout in train mode?)")
    placeholder_values = dict(zip(runner.placeholders, [*state.values(), *(args[i] for i in tensor_positions)]))
    placeholder_values.update(runner.constants)
    readers = []
    for node in segment.inputs:
        value = placeholder_values[node]
        if isinstance(value, torch.Tensor):
            readers.append(graph._Input("scalar" if value.dim() == 0 else "array"))
        else:
            readers.append(graph._Input("static", value=value))
    exe = graph._Executable()
    traced = segment._traceable(readers, exe)
    input_nodes = [n for n, r in zip(segment.inputs, readers) if r.kind != "static"]
    weight_nodes = {n: i for i, n in enumerate(runner.placeholders[: len(names)])}
    structure: list = []

    def run(weight_arrays, arg_arrays):
        arg_iter = iter(arg_arrays)
        dyn = []
        for node in input_nodes:
            if node in weight_nodes:
                dyn.append(weight_arrays[weight_nodes[node]])
            elif node in runner.constants:
                dyn.append(jnp.asarray(runner.constants[node].numpy()))
            else:
                dyn.append(next(arg_iter))
        flat = traced(*dyn)
        env = dict(zip(segment.outputs, exe.out_templates))
        out: list = []
        structure.append(_natural_output(runner, env, placeholder_values, flat, out))
        return out

    weight_values = [v.numpy() for v in state.values()]
    arg_nodes = [n for n in input_nodes if n not in weight_nodes and n not in runner.constants]
    arg_specs = [_spec(placeholder_values[n]) for n in arg_nodes]
    if weights == "arguments":
        fn = jax.jit(lambda w, a: run(w, a))
        exported = jax.export.export(fn)([_spec(state[k]) for k in names], arg_specs)
        kept = weight_values
    else:
        constants = [jnp.asarray(w) for w in weight_values]
        fn = jax.jit(lambda a: run(constants, a))
        exported = jax.export.export(fn)(arg_specs)
        kept = []
    return ExportedModel(exported, names, kept, structure[-1], weights == "arguments")


def _spec(value: torch.Tensor) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(value.shape), TORCH_TO_NUMPY[value.dtype])


def _natural_output(runner, env, placeholder_values, flat, out):
    def convert(item):
        if isinstance(item, torch.fx.Node):
            if item in env:
                return _natural(env[item], flat, out)
            raise NotImplementedError(f"torch_tpu.export: output {item} is an input of the model, not a result")
        if isinstance(item, (list, tuple)):
            return type(item)(convert(i) for i in item)
        return item

    return convert(runner.output.args[0])
