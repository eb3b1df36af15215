"""Counters for compiles, cache hits, executions, transfers and CPU fallbacks."""

from __future__ import annotations

from collections import Counter

_COUNTER_KEYS = (
    "op_compiles",
    "op_cache_hits",
    "op_cache_evictions",
    "graph_compiles",
    "graph_cache_hits",
    "persistent_cache_hits",
    "traces",
    "xla_compiles",
    "executions",
    "host_transfers",
    "cpu_fallbacks",
    "async_compiles",
    "host_tier_runs",
    "aot_graphs_compiled",  # graphs aot_autograd traced and handed the "tpu" backend
    "aot_cache_loads",  # graphs the backend rebuilt from torch's AOTAutogradCache instead
    "op_tier_ups_queued",  # eager ops queued to compile again at XLA's default effort (ops/op_tier_up.py)
    "op_tier_ups",  # of those, recompiled and in place
)

_counts: Counter[str] = Counter()
_fallback_ops: Counter[str] = Counter()
_compile_seconds: Counter[str] = Counter()  # kind ("op", "graph") -> total seconds
_compile_counts: Counter[str] = Counter()  # kind -> compiles timed
_load_seconds = [0.0]  # executables read from the persistent cache: total wall seconds


def bump(key: str, n: int = 1) -> None:
    _counts[key] += n


def record_fallback(op_name: str) -> None:
    _counts["cpu_fallbacks"] += 1
    _fallback_ops[op_name] += 1


def record_compile(kind: str, seconds: float) -> None:
    """Adds one compile's wall time (trace + XLA compile) under `kind`: "op" or "graph"."""
    _compile_seconds[kind] += seconds
    _compile_counts[kind] += 1


def compile_seconds() -> dict[str, float]:
    return dict(_compile_seconds)


def record_load(seconds: float) -> None:
    """Adds one persistent-cache load's wall time (read, check, deserialize)."""
    _load_seconds[0] += seconds


def load_seconds() -> float:
    """Total wall seconds spent loading executables from the persistent cache."""
    return _load_seconds[0]


def _native_counts() -> dict[str, int]:
    """The C++ eager path's counters (csrc/eager_kernel.cc): its cache hits, executions and host-tier runs."""
    from torch_tpu import _C

    hits, executions, host_runs = _C._eager_counters()
    return {"op_cache_hits": hits, "executions": executions, "host_tier_runs": host_runs}


def counters() -> dict:
    """A snapshot: the integer counters plus "cpu_fallback_ops" (op name -> count)."""
    native = _native_counts()
    snapshot: dict = {key: _counts[key] + native.get(key, 0) for key in _COUNTER_KEYS}
    for key, value in _counts.items():
        snapshot.setdefault(key, value)
    snapshot["cpu_fallback_ops"] = dict(_fallback_ops)
    return snapshot


def reset() -> None:
    from torch_tpu import _C

    _C._reset_eager_counters()
    _counts.clear()
    _fallback_ops.clear()
    _compile_seconds.clear()
    _compile_counts.clear()
    _load_seconds[0] = 0.0


def _hit_rate(hits: int, misses: int) -> str:
    lookups = hits + misses
    return f"{hits / lookups:.1%} of {lookups} lookups" if lookups else "no lookups"


def report(top: int = 20) -> str:
    """Readable text: counters, cache hit rates, compile times and the `top` CPU-fallback ops."""
    snap = counters()
    lines = ["torch_tpu metrics", "  counters:"]
    for key in _COUNTER_KEYS:
        lines.append(f"    {key:24s} {snap[key]}")
    for key in sorted(k for k in snap if k not in _COUNTER_KEYS and k != "cpu_fallback_ops"):
        lines.append(f"    {key:24s} {snap[key]}")
    lines.append("  cache hit rates:")
    lines.append(f"    {'op executables':24s} {_hit_rate(snap['op_cache_hits'], snap['op_compiles'])}")
    lines.append(f"    {'graph executables':24s} {_hit_rate(snap['graph_cache_hits'], snap['graph_compiles'])}")
    compiles = snap["op_compiles"] + snap["graph_compiles"]
    persistent = snap["persistent_cache_hits"]
    if persistent or compiles:
        lines.append(
            f"    {'persistent cache':24s} {persistent} executables loaded from disk in {_load_seconds[0]:.3f} s "
            f"({compiles} compiles)"
        )
    if _compile_seconds:
        lines.append("  compile time (trace + XLA compile, wall):")
        for kind, seconds in sorted(_compile_seconds.items()):
            n = _compile_counts[kind]
            lines.append(f"    {kind:24s} {seconds:.3f} s in {n} compiles, {1000 * seconds / max(n, 1):.1f} ms each")
    if _fallback_ops:
        lines.append(f"  CPU fallbacks: {snap['cpu_fallbacks']} calls of {len(_fallback_ops)} ops (top {top}):")
        for name, count in _fallback_ops.most_common(top):
            lines.append(f"    {name:48s} {count}")
    else:
        lines.append("  CPU fallbacks: none")
    return "\n".join(lines)
