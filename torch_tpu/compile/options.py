"""`torch.compile(backend="tpu", mode=..., options={...})`: what the modes and options mean for XLA.

Every graph is already one XLA executable launched once per call, so the
inductor modes map to what they can mean here:

- "default": XLA's default optimizations; buffer donation where buffers are device memory
  (`platforms.donates_buffers()`: TPU, GPU; not the CPU client's host tier), as lazy traces do:
  a compiled optimizer step would otherwise hold old and new parameters and state at once.
- "reduce-overhead": what CUDA graphs buy inductor (fewer copies and launches per
  step) is here buffer donation: inputs the graph overwrites are donated, so a
  training step updates parameters and optimizer state in place.
- "max-autotune" (and "max-autotune-no-cudagraphs"): spend compile time for
  speed: the platform's autotuning flags (`platforms.autotune_flags()`; GPU:
  `xla_gpu_autotune_level=4`; TPU and CPU have no autotuner flag, so only
  donation is added, as in "reduce-overhead" for "max-autotune").

Options (all optional; an unknown key raises ValueError listing these):

- "dynamic_buckets": None (the default: powers of two), strictly increasing positive
  ints (a size above the largest compiles at its exact size), or False (off): a
  symbolic (dynamic) size is padded up to its bucket, so that sizes share executables
  (compile/buckets.py).
- "donate_buffers": bool; donate inputs the graph overwrites to XLA (never a
  buffer another live tensor or view can still read). Default: `platforms.donates_buffers()`.
- "matmul_precision": "default" | "high" | "highest" (also jax's names
  "bfloat16", "tensorfloat32", "float32"): precision of matmuls and convolutions
  traced in this graph.
- "xla_flags": {"xla_flag_name": value} (or "--xla_a=1 --xla_b=true"): XLA debug
  options for this graph's compiles only. Names must look like XLA flags; XLA
  itself rejects names it does not know at the first compile.
- "async_compile": bool; a new input signature runs the graph op by op while its
  executable compiles on a background thread; later calls use the executable
  once it is ready.
- "partitioner": {"name": value}: `torch._functorch.config` settings for this graph's split
  into forward and backward (aot_autograd's min-cut partitioner), over the backend's own
  (`backend.PARTITIONER_DEFAULTS`), e.g. {"ban_recompute_materialized_backward": True} for
  inductor's choice (keep what a convolution's or matmul's backward reads),
  {"ban_recompute_used_far_apart": False, "ban_recompute_long_fusible_chains": False} to also
  recompute residual sums, or {"activation_memory_budget": 0.9} to recompute more.
- "dump_dir": a directory; every compiled graph writes `<graph>.stablehlo.mlir`
  (the lowered StableHLO), `<graph>.hlo.txt` (XLA's optimized HLO) and
  `<graph>.memory.txt` (XLA's buffer sizes: arguments, outputs, temporaries) there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
from collections.abc import Mapping
from typing import Any

from torch_tpu import platforms

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Option values (torch's names and jax's) -> torch_tpu.ops.precision levels.
_PRECISIONS = {
    "default": "medium",
    "medium": "medium",
    "high": "high",
    "highest": "highest",
    "bfloat16": "medium",
    "tensorfloat32": "high",
    "float32": "highest",
}
_FLAG_NAME = re.compile(r"^xla_[a-z0-9_]+$")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """The validated mode and options of one `torch.compile(backend="tpu")` call."""

    mode: str = "default"
    dynamic_buckets: tuple[int, ...] | None = None
    donate_buffers: bool = False
    matmul_precision: str | None = None
    xla_flags: tuple[tuple[str, Any], ...] = ()
    async_compile: bool = False
    dump_dir: str | None = None
    partitioner: tuple[tuple[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The options as `options=` would give them (round-trips through `parse`)."""
        return {
            "dynamic_buckets": _buckets_option(self.dynamic_buckets),
            "donate_buffers": self.donate_buffers,
            "matmul_precision": self.matmul_precision,
            "xla_flags": dict(self.xla_flags),
            "async_compile": self.async_compile,
            "dump_dir": self.dump_dir,
            "partitioner": dict(self.partitioner),
        }

    def compiler_options(self) -> dict[str, Any] | None:
        """XLA debug options for `Lowered.compile(compiler_options=...)`."""
        return dict(self.xla_flags) or None

    def tracing(self):
        """A context for lowering this graph (its matmul precision)."""
        if self.matmul_precision is None:
            return contextlib.nullcontext()
        from torch_tpu.ops import precision

        return precision.overridden(_PRECISIONS[self.matmul_precision])


def _buckets_option(buckets: tuple[int, ...] | None):
    if buckets is None or buckets == ():
        return None if buckets is None else False
    return list(buckets)


DEFAULT = CompileOptions()
OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CompileOptions) if f.name != "mode")


def _mode_defaults(mode: str) -> dict[str, Any]:
    if mode == "default":
        return {}
    defaults: dict[str, Any] = {}
    if mode in ("reduce-overhead", "max-autotune"):
        defaults["donate_buffers"] = True
    flags = platforms.autotune_flags() if mode.startswith("max-autotune") else {}
    if flags:
        defaults["xla_flags"] = flags
    return defaults


def _bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f'torch.compile(backend="tpu") option "{name}" must be a bool, got {value!r}')
    return value


def _buckets(value) -> tuple[int, ...] | None:
    if value is None:
        return None
    if value is False:
        return ()
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f'option "dynamic_buckets" must be a sequence of positive ints, got {value!r}')
    buckets = tuple(value)
    if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in buckets):
        raise ValueError(f'option "dynamic_buckets" must be non-empty positive ints, got {value!r}')
    if any(a >= b for a, b in itertools.pairwise(buckets)):
        raise ValueError(f'option "dynamic_buckets" must be strictly increasing, got {value!r}')
    return buckets


def _precision(value) -> str | None:
    if value is None:
        return None
    if value not in _PRECISIONS:
        raise ValueError(f'option "matmul_precision" must be one of {sorted(_PRECISIONS)}, got {value!r}')
    return value


def _flags(value) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        parsed: dict[str, Any] = {}
        for item in value.split():
            name, sep, text = item.removeprefix("--").partition("=")
            if not sep:
                raise ValueError(f'option "xla_flags": {item!r} is not of the form --xla_name=value')
            parsed[name] = text
        value = parsed
    if not isinstance(value, Mapping):
        raise TypeError(f'option "xla_flags" must be a dict of flag name -> value or a string, got {value!r}')
    flags = []
    for name, flag_value in value.items():
        if not isinstance(name, str) or not _FLAG_NAME.match(name):
            raise ValueError(f'option "xla_flags": {name!r} is not an XLA flag name (xla_lowercase_words)')
        if not isinstance(flag_value, (bool, int, float, str)):
            raise TypeError(f'option "xla_flags": {name} must be a bool, int, float or str, got {flag_value!r}')
        flags.append((name, flag_value))
    return tuple(sorted(flags))


def _partitioner(value) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise TypeError(f'option "partitioner" must be a dict of torch._functorch.config name -> value, got {value!r}')
    import torch._functorch.config as functorch_config

    settings = []
    for name, setting in value.items():
        if not isinstance(name, str) or name.startswith("_") or not hasattr(functorch_config, name):
            raise ValueError(f'option "partitioner": {name!r} is not a torch._functorch.config setting')
        if not isinstance(setting, (bool, int, float, str)):
            raise TypeError(f'option "partitioner": {name} must be a bool, int, float or str, got {setting!r}')
        settings.append((name, setting))
    return tuple(sorted(settings))


def _dump_dir(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f'option "dump_dir" must be a path, got {value!r}')
    path = os.fspath(value)
    os.makedirs(path, exist_ok=True)
    return path


def parse(mode: str | None = None, options: Mapping[str, Any] | None = None) -> CompileOptions:
    """Validates `mode=` and `options=`; the mode's defaults apply under the explicit options."""
    mode = mode or "default"
    if mode not in MODES:
        raise ValueError(f'torch.compile(backend="tpu"): unknown mode {mode!r}; the modes are {", ".join(MODES)}')
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f'torch.compile(backend="tpu"): options must be a dict, got {type(options).__name__}')
    given = {k.replace("-", "_"): v for k, v in (options or {}).items()}
    unknown = sorted(set(given) - set(OPTION_NAMES))
    if unknown:
        raise ValueError(
            f'torch.compile(backend="tpu"): unknown option(s) {", ".join(map(repr, unknown))}; '
            f"the options are {', '.join(OPTION_NAMES)}"
        )
    merged = {**_mode_defaults(mode), **given}
    return CompileOptions(
        mode=mode,
        dynamic_buckets=_buckets(merged.get("dynamic_buckets")),
        donate_buffers=_bool("donate_buffers", merged.get("donate_buffers", platforms.donates_buffers())),
        matmul_precision=_precision(merged.get("matmul_precision")),
        xla_flags=_flags(merged.get("xla_flags")),
        async_compile=_bool("async_compile", merged.get("async_compile", False)),
        dump_dir=_dump_dir(merged.get("dump_dir")),
        partitioner=_partitioner(merged.get("partitioner")),
    )


def dump(options: CompileOptions, name: str, lowered, compiled) -> None:
    """Writes a graph's StableHLO and optimized HLO to the dump directory."""
    if options.dump_dir is None:
        return
    stem = os.path.join(options.dump_dir, re.sub(r"[^A-Za-z0-9_.-]", "_", name))
    with open(f"{stem}.stablehlo.mlir", "w") as f:
        f.write(lowered.as_text())
    with open(f"{stem}.hlo.txt", "w") as f:
        f.write(compiled.as_text())
    with open(f"{stem}.memory.txt", "w") as f:
        f.write(f"{compiled.memory_analysis()}\n")


def compile_lowered(lowered, options: CompileOptions):
    """Compiles a lowered graph with this graph's XLA flags (a flag XLA does not know raises ValueError)."""
    flags = options.compiler_options()
    if flags is None:
        return lowered.compile()
    try:
        return lowered.compile(compiler_options=flags)
    except Exception as error:  # jaxlib raises its own error types for bad debug options
        if "RESOURCE_EXHAUSTED" in str(error):  # out of memory, not a bad flag: the caller reports it
            raise
        raise ValueError(f'torch.compile(backend="tpu") option "xla_flags" {flags} rejected by XLA: {error}') from error
