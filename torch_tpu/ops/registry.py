"""The lowering table: one registration per ATen op, its properties stated on the line.

    @lower(aten.add.Tensor)
    def add(x, y, *, alpha=1):
        return x + y * alpha

A jit lowering receives jax arrays where the op takes tensors and plain Python
values elsewhere; it returns jax arrays. Its in-place (`add_.Tensor`) and
out= (`add.out`) variants are derived unless lowered explicitly. Every other
property is a keyword of `lower` (the way jax's lax states a primitive's
rules next to it): see `Lowering`, and docs/lowerings.md.

A lowering that differs by platform is a rule for that platform beside the
portable one, as jax registers `mlir.register_lowering(p, rule, platform="cpu")`:

    @lower(aten.foo.default)
    def foo(x): ...                       # every platform without its own rule

    @lower(aten.foo.default, platform="tpu")
    def foo_tpu(x): ...                   # TPU's

`lowering(op, platform)` picks the rule; the eager dispatcher asks it per call and
graph mode per node, for `torch_tpu.platforms.lowering_platform()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch._ops import OpOverload

aten = torch.ops.aten

PRIVATEUSE1 = "PrivateUse1"
# The platforms a rule can be registered for: the clients torch_tpu runs on.
PLATFORMS = ("tpu", "cuda", "cpu")


@dataclasses.dataclass(frozen=True)
class Check:
    """A data-dependent check: CPU's error for an input XLA would turn into a wrong number."""

    # Eager: the op's own torch arguments, before it runs; raises CPU's error (a host sync), or
    # returns replacement (args, kwargs) for the kernel.
    host: Callable | None = None
    # Graph: the arguments graph mode passes the op's jax function; returns a list of
    # `checks.Failure` (a traced bool each), read after the graph's executable runs.
    graph: Callable | None = None


@dataclasses.dataclass(frozen=True)
class FrontPath:
    """A path in front of a jit lowering that some of the op's calls take instead (a growing-length
    append, a transfer between devices). `run(*args, **kwargs)` runs a call it takes and returns
    None for the others; `takes(*args, **kwargs)` says which it takes, from what the call's
    signature holds (the C++ eager path asks it on each hit)."""

    takes: Callable[..., bool]
    run: Callable


class SignatureCheck:
    """A host check whose outcome the call's signature decides (shapes, dtypes and the types of
    numbers, not their values): the C++ eager path runs it once per signature, on the miss."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def signature_check(fn: Callable) -> SignatureCheck:
    """Declares host check `fn` a signature check (see SignatureCheck)."""
    return SignatureCheck(fn)


@dataclasses.dataclass(frozen=True)
class Lowering:
    fn: Callable
    # Runs in Python on torch tensors (host transfers, data-dependent shapes).
    eager: bool = False
    # Receives a jax PRNG key as `rng=`, drawn from the op's tpu generator.
    random: bool = False
    # Called with the op's own arguments before it runs; raises CPU's error for
    # data-dependent failures jax cannot report (a host sync, so use sparingly).
    check: Callable | None = None
    # The jax form of the check, for compiled graphs (`Check.graph`).
    graph_check: Callable | None = None
    # The jax function graph mode uses for an eager (host-side) lowering; None: the op splits the graph.
    graph: Callable | None = None
    # No tpu kernel: `fn` is a graph-mode jax function that takes the node's fake result first
    # (ops eager runs as C++ metadata kernels or decomposes: views, sym_size, ...).
    graph_only: bool = False
    # The dispatch key of the kernel (NestedTensorPrivateUse1 for a nested-tensor kernel).
    dispatch_key: str = PRIVATEUSE1
    # (meta args, meta result) -> the meta result with CPU's output strides, where the meta
    # kernel leaves them contiguous (convolution: channels_last in, channels_last out).
    layout: Callable | None = None
    # Scalar arguments the eager path traces (a weakly typed 0-d jax value, like a wrapped number)
    # instead of keying the executable on their value: one compile for every value. The lowering
    # must then not branch on them in Python (a schema-default value still comes as a Python number).
    traced: tuple[str, ...] = ()
    # Calls the eager kernel hands to another path before the jit lowering: a growing-length
    # append (ops/growing.py), a transfer between devices. Not used by derived variants or graphs.
    front: FrontPath | None = None
    # Whether the host tier may run the op's CPU kernel while its executable compiles
    # (platforms/cpu/host_tier.py); False where the lowering's results differ from CPU's on purpose.
    host_tier: bool = True
    # Arguments whose memory the tensor an in-place or out= form writes must not share (CPU's
    # assert_no_overlap: cat's inputs, index_copy_'s index and source). The functional op skips it.
    apart_from: tuple[str, ...] = ()

    @property
    def graph_fn(self) -> Callable | None:
        """The jax function graph mode evaluates, or None when the op runs eagerly in a graph."""
        if self.graph_only or not self.eager:
            return self.fn
        return self.graph


_TABLES: dict[str, dict[OpOverload, Lowering]] = {PRIVATEUSE1: {}}  # the portable rules
# dispatch key -> op -> platform -> that platform's rule
_PLATFORM_RULES: dict[str, dict[OpOverload, dict[str, Lowering]]] = {}


def lower(
    *ops: OpOverload,
    eager: bool = False,
    random: bool = False,
    check: Callable | Check | None = None,
    graph: Callable | None = None,
    graph_only: bool = False,
    dispatch_key: str = PRIVATEUSE1,
    layout: Callable | None = None,
    traced: tuple[str, ...] = (),
    front: FrontPath | None = None,
    host_tier: bool = True,
    apart_from: tuple[str, ...] = (),
    platform: str | None = None,
) -> Callable:
    """Registers the decorated function as the lowering of `ops`, with the properties of `Lowering`.
    `check` is a host check (a callable) or a `Check` with a host and a graph form. `platform`
    (one of PLATFORMS): the rule of that platform, beside the op's portable rule (None), which
    every op has; both are jit lowerings or both eager."""
    if platform is not None and platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r} is not one of {', '.join(PLATFORMS)}")
    host, graph_check = (check.host, check.graph) if isinstance(check, Check) else (check, None)
    if graph is not None and not eager:
        raise ValueError("graph= is the graph-mode function of an eager lowering")
    if dispatch_key != PRIVATEUSE1 and not eager:
        raise ValueError(f"a {dispatch_key} kernel runs in Python: eager=True")
    if traced and eager:
        raise ValueError("traced= names Scalar arguments of a jit lowering")
    if front is not None and eager:
        raise ValueError("front= is a path in front of a jit lowering")
    properties = dict(
        eager=eager,
        random=random,
        check=host,
        graph_check=graph_check,
        graph=graph,
        graph_only=graph_only,
        dispatch_key=dispatch_key,
        layout=layout,
        traced=tuple(traced),
        front=front,
        host_tier=host_tier,
        apart_from=tuple(apart_from),
    )

    def register(fn: Callable) -> Callable:
        table = _TABLES.setdefault(dispatch_key, {})
        for op in ops:
            rules = table if platform is None else _PLATFORM_RULES.setdefault(dispatch_key, {}).setdefault(op, {})
            slot = op if platform is None else platform
            if slot in rules:
                raise ValueError(f"{op} is lowered twice" + (f" for {platform}" if platform else ""))
            rules[slot] = Lowering(fn, **properties)
        return fn

    return register


def table(dispatch_key: str = PRIVATEUSE1) -> dict[OpOverload, Lowering]:
    """The portable lowerings registered for `dispatch_key` (graph-only ones included)."""
    return dict(_TABLES.get(dispatch_key, {}))


def platform_rules(op: OpOverload, dispatch_key: str = PRIVATEUSE1) -> dict[str, Lowering]:
    """`op`'s platform rules ({platform: rule}); {} for an op with its portable rule alone.
    Raises if the rules and the portable rule are not all jit lowerings or all eager."""
    rules = dict(_PLATFORM_RULES.get(dispatch_key, {}).get(op, {}))
    portable = _TABLES.get(dispatch_key, {}).get(op)
    if rules and portable is None:
        raise ValueError(f"{op} has platform rules ({', '.join(rules)}) but no portable rule")
    for platform, rule in rules.items():
        if (rule.eager, rule.graph_only) != (portable.eager, portable.graph_only):
            raise ValueError(f"{op}: its {platform} rule and its portable rule are of different kinds")
    return rules


def check_platform_rules() -> None:
    """Raises for a platform rule without a portable rule beside it, or of another kind."""
    for dispatch_key, ops in _PLATFORM_RULES.items():
        for op in ops:
            platform_rules(op, dispatch_key)


def lowering(op: OpOverload, platform: str | None, dispatch_key: str = PRIVATEUSE1) -> Lowering | None:
    """`op`'s rule on `platform`: that platform's rule where it has one, else the portable rule
    (None: `op` is not lowered)."""
    if platform is not None:
        rule = _PLATFORM_RULES.get(dispatch_key, {}).get(op, {}).get(platform)
        if rule is not None:
            return rule
    return _TABLES.get(dispatch_key, {}).get(op)


def dispatch_keys() -> list[str]:
    return list(_TABLES)


def _non_out_arguments(schema) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if not a.is_out]


def inplace_variant(op: OpOverload) -> OpOverload | None:
    packet = getattr(aten, op._schema.name.split("::")[1] + "_", None)
    if packet is None:
        return None
    variant = getattr(packet, op._overloadname, None)
    if variant is None or _non_out_arguments(variant._schema)[1:] != _non_out_arguments(op._schema)[1:]:
        return None
    return variant


def out_variant(op: OpOverload) -> OpOverload | None:
    packet = getattr(aten, op._schema.name.split("::")[1])
    wanted = _non_out_arguments(op._schema)
    for name in packet.overloads():
        candidate = getattr(packet, name)
        schema = candidate._schema
        if any(a.is_out for a in schema.arguments) and _non_out_arguments(schema) == wanted:
            return candidate
    return None


def is_composite_implicit(op: OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
