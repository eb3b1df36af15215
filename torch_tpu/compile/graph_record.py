"""An aot_autograd ATen graph as plain data, and back: what compile/aot_cache.py stores.

torch's GraphPickler takes any FX graph, and pays for it: it regenerates the module's Python code
and maps every node's arguments through pytree before pickling one object per node (0.4-0.7 s on
the CPU client for a GPT-2 AdamW step's inference graph: 4,341 nodes, mostly `getitem`s of its
foreach ops' lists). The graphs aot_autograd hands the backend hold ATen operators, `getitem`
and arguments of a few plain types, so `encode` writes such a graph as one tuple per node of
strings, numbers and dtypes (another node as its position, a `NodeRef`), which pickle in C
(about 20x less time); anything else (constants, submodules, higher-order operators, symbolic
sizes, opaque objects) gives None, and the caller keeps GraphPickler.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import torch
from torch._ops import OpOverload
from torch.fx import CodeGen, Graph, GraphModule, Node
from torch.fx.immutable_collections import immutable_dict, immutable_list


class NodeRef(int):
    """An argument that is another node: that node's position in the graph."""

    __slots__ = ()


class _Unsupported(Exception):
    pass


_LEAVES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})
_SEQUENCES = (tuple, list, immutable_list)
_MAPPINGS = (dict, immutable_dict)
_functions: dict[Any, tuple | None] = {}  # a call target -> its name, None where it has none to import


def encode(gm: GraphModule) -> tuple | None:
    """The graph as (op, name, target, args, kwargs) per node, or None where it holds more than
    plain data can say (see the module's docstring)."""
    graph = gm.graph
    if type(graph._codegen) is not CodeGen or gm._parameters or gm._buffers or gm._modules:
        return None
    positions: dict[Node, NodeRef] = {}
    records = []
    try:
        for i, node in enumerate(graph.nodes):
            if node.op not in ("placeholder", "call_function", "output") or node.type is not None:
                return None
            target = node.target if node.op != "call_function" else _target_name(node.target)
            if target is None:
                return None
            args = _encoded(node.args, positions)
            kwargs = _encoded(node.kwargs, positions)
            records.append((node.op, node.name, target, args, kwargs))
            positions[node] = NodeRef(i)
    except _Unsupported:
        return None
    return tuple(records)


def decode(records: tuple) -> GraphModule:
    """`encode`'s graph back, as a GraphModule (node names as they were)."""
    graph = Graph()
    nodes: list[Node] = []
    for op, name, target, args, kwargs in records:
        if op == "call_function":
            target = _target_of(target)
        nodes.append(graph.create_node(op, target, _decoded(args, nodes), _decoded(kwargs, nodes), name))
    return GraphModule(torch.nn.Module(), graph)


def _encoded(value: Any, positions: dict[Node, NodeRef]) -> Any:
    kind = type(value)
    if kind is Node:
        return positions[value]
    if kind in _LEAVES:
        return value
    if kind in _SEQUENCES:
        items = [_encoded(v, positions) for v in value]
        return tuple(items) if kind is tuple else items
    if kind in _MAPPINGS and all(type(k) is str for k in value):
        return {k: _encoded(v, positions) for k, v in value.items()}
    raise _Unsupported


def _decoded(value: Any, nodes: list[Node]) -> Any:
    kind = type(value)
    if kind is NodeRef:
        return nodes[value]
    if kind is tuple:
        return tuple(_decoded(v, nodes) for v in value)
    if kind is list:
        return [_decoded(v, nodes) for v in value]
    if kind is dict:
        return {k: _decoded(v, nodes) for k, v in value.items()}
    return value


def _target_name(target: Any) -> tuple | None:
    """("op", namespace, name, overload) of an ATen-style operator, ("function", module, qualname)
    of a function that imports back as itself, else None."""
    if type(target) is OpOverload:
        return ("op", target.namespace, target._opname, target._overloadname)
    if not isinstance(target, (types.BuiltinFunctionType, types.FunctionType)):
        return None
    if target not in _functions:
        name = ("function", getattr(target, "__module__", None), getattr(target, "__qualname__", ""))
        try:
            found = _target_of(name) is target
        except (ImportError, AttributeError, TypeError, ValueError):
            found = False
        _functions[target] = name if found else None
    return _functions[target]


def _target_of(name: tuple) -> Any:
    kind, first, *rest = name
    if kind == "op":
        packet = getattr(getattr(torch.ops, first), rest[0])
        return getattr(packet, rest[1])
    target = importlib.import_module(first)
    for part in rest[0].split("."):
        target = getattr(target, part)
    return target
