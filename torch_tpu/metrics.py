"""Counters for compiles, cache hits, executions, transfers and CPU fallbacks."""

from __future__ import annotations

from collections import Counter

_COUNTER_KEYS = (
    "op_compiles",
    "op_cache_hits",
    "graph_compiles",
    "graph_cache_hits",
    "persistent_cache_hits",
    "executions",
    "host_transfers",
    "cpu_fallbacks",
)

_counts: Counter[str] = Counter()
_fallback_ops: Counter[str] = Counter()
_compile_seconds: Counter[str] = Counter()  # kind ("op", "graph") -> total seconds


def bump(key: str, n: int = 1) -> None:
    _counts[key] += n


def record_fallback(op_name: str) -> None:
    _counts["cpu_fallbacks"] += 1
    _fallback_ops[op_name] += 1


def record_compile(kind: str, seconds: float) -> None:
    """Adds one compile's wall time (trace + XLA compile) under `kind`: "op" or "graph"."""
    _compile_seconds[kind] += seconds


def compile_seconds() -> dict[str, float]:
    return dict(_compile_seconds)


def counters() -> dict:
    """A snapshot: the integer counters plus "cpu_fallback_ops" (op name -> count)."""
    snapshot: dict = {key: _counts[key] for key in _COUNTER_KEYS}
    for key, value in _counts.items():
        snapshot.setdefault(key, value)
    snapshot["cpu_fallback_ops"] = dict(_fallback_ops)
    return snapshot


def reset() -> None:
    _counts.clear()
    _fallback_ops.clear()
    _compile_seconds.clear()


def report() -> str:
    """Readable text of the counters and the most frequent CPU-fallback ops."""
    snap = counters()
    lines = ["torch_tpu metrics"]
    for key in _COUNTER_KEYS:
        lines.append(f"  {key:22s} {snap[key]}")
    lookups = snap["op_compiles"] + snap["op_cache_hits"]
    if lookups:
        lines.append(f"  {'op cache hit rate':22s} {snap['op_cache_hits'] / lookups:.1%}")
    for kind, seconds in sorted(_compile_seconds.items()):
        lines.append(f"  {kind + ' compile time':22s} {seconds:.3f} s")
    if _fallback_ops:
        lines.append("  CPU fallback ops:")
        for name, count in _fallback_ops.most_common(20):
            lines.append(f"    {name:40s} {count}")
    return "\n".join(lines)
