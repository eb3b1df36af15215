"""PyTorch's OpInfo database (op_db) run on tpu and compared with CPU.

For each OpInfo entry, `check_op` runs:
- forward: the sample inputs for float32, int64 and bool (those the op supports on CPU), on tpu
  and on CPU, compared with assert_close (atol=rtol=1e-3 as PyTorch's own test_compare_cpu, or
  the op's float32 toleranceOverride where larger); a sample that raises on CPU must raise the
  same exception class on tpu. Random and uninitialized-memory ops compare shape and dtype only.
- native: no op fell back to CPU during the forward samples.
- grad: for ops with autograd, on float32 samples, the gradients (random cotangents) equal CPU
  autograd's, and the backward ran without CPU fallback.
- errors: every `error_inputs` sample raises on tpu the exception class it raises on CPU.

Each aspect is "pass", "fail" (with a reason) or absent (does not apply). Nothing here raises:
a crash or a timeout in one op is that op's failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import signal
import time
import warnings
from collections.abc import Iterable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_map

import torch_tpu

ASPECTS = ("forward", "native", "grad", "errors")
DTYPES = (torch.float32, torch.int64, torch.bool)

# Samples per op and dtype: enough to cover the op's main paths, few enough for CI.
FORWARD_SAMPLES = 4
OTHER_DTYPE_SAMPLES = 2
GRAD_SAMPLES = 2
ERROR_SAMPLES = 12
OP_TIMEOUT_S = 300.0  # a hang guard, not a speed limit: loaded CI machines are slow

# The low-precision sweep: bfloat16 and float16 samples against CPU's, at bf16 tolerance.
LOW_PRECISION_DTYPES = (torch.bfloat16, torch.float16)
LOW_PRECISION_SAMPLES = 2
LOW_PRECISION_TOL = 2e-2

# PyTorch's test_compare_cpu (accelerator vs CPU) tolerance.
BASE_TOL = 1e-3

# Ops whose values are random or uninitialized memory: only shape and dtype are compared.
_NONDETERMINISTIC = re.compile(
    r"^(normal|bernoulli|multinomial|uniform|cauchy|exponential|geometric|log_normal|rand\w*|"
    r"randint\w*|randn\w*|randperm|empty\w*|new_empty\w*|nn\.functional\.\w*dropout\w*|"
    r"nn\.functional\.rrelu|nn\.functional\.fractional_max_pool\dd|torch\.empty\w*)$"
)


@dataclasses.dataclass
class OpResult:
    name: str
    results: dict[str, str] = dataclasses.field(default_factory=dict)  # aspect -> "pass" | "fail"
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)  # aspect -> why it failed
    fallback_ops: set[str] = dataclasses.field(default_factory=set)
    seconds: float = 0.0

    def failures(self) -> set[str]:
        return {a for a, r in self.results.items() if r == "fail"}

    def passed(self, aspect: str) -> bool:
        return self.results.get(aspect) == "pass"


def entry_name(op) -> str:
    """`name` or `name.variant`: the key of an OpInfo entry in tables and expected-failure lists."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def op_db() -> list:
    from torch.testing._internal.common_methods_invocations import op_db as db

    return list(db)


def select(ops: Iterable, patterns: Iterable[str] | None) -> list:
    """The entries whose name matches any of the regexes in `patterns` (all if none)."""
    ops = list(ops)
    patterns = list(patterns or [])
    if not patterns:
        return ops
    regexes = [re.compile(p) for p in patterns]
    return [op for op in ops if any(r.fullmatch(entry_name(op)) or r.fullmatch(op.name) for r in regexes)]


def tested_dtypes(op) -> list[torch.dtype]:
    supported = op.supported_dtypes("cpu")
    return [d for d in DTYPES if d in supported]


class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout("timed out")


# ---- moving samples -----------------------------------------------------------


def _to_tpu(x):
    if isinstance(x, torch.Tensor):
        t = x.detach().to("tpu")
        return t.requires_grad_(x.requires_grad) if x.requires_grad else t
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("tpu")
    return x


def _tpu_kwargs(kwargs: dict) -> dict:
    out = tree_map(_to_tpu, kwargs)
    if out.get("device") == "cpu":
        out["device"] = "tpu"
    return out


def _tpu_sample(sample):
    args = tree_map(_to_tpu, tuple(sample.args))
    return _to_tpu_tree(sample.input), args, _tpu_kwargs(dict(sample.kwargs))


def _to_tpu_tree(x):
    return tree_map(_to_tpu, x)


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        if x.device.type != "tpu":
            raise AssertionError(f"a result tensor is on {x.device}, not tpu")
        return x.detach().cpu()
    return x


def _detach(x):
    return x.detach() if isinstance(x, torch.Tensor) else x


def _clone_cpu(sample):
    """The sample's arguments as fresh CPU copies (the op may mutate them)."""

    def copy(x):
        if isinstance(x, torch.Tensor):
            c = x.detach().clone()
            return c.requires_grad_(x.requires_grad) if x.requires_grad else c
        return x

    return tree_map(copy, sample.input), tree_map(copy, tuple(sample.args)), tree_map(copy, dict(sample.kwargs))


# ---- comparing ------------------------------------------------------------------


def _tolerance(op, dtype: torch.dtype, base: float = BASE_TOL) -> dict:
    """Tolerance for the floating results of samples of `dtype` (other results compare exactly)."""
    dtype = dtype if dtype.is_floating_point else torch.float32
    atol = rtol = base
    for info in op.decorators:
        if getattr(info, "test_name", "?") not in (None, "test_compare_cpu"):
            continue
        if info.device_type not in (None, "cpu") or not info.active_if:
            continue
        for d in info.decorators:
            overrides = getattr(d, "d", None)
            if isinstance(overrides, dict) and dtype in overrides:
                atol = max(atol, overrides[dtype].atol)
                rtol = max(rtol, overrides[dtype].rtol)
    return {"atol": atol, "rtol": rtol}


def _shape_only(x):
    return tree_map(lambda t: (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t), x)


# Ops returning indices of equal elements, where any of them is right (CPU's own choice among
# ties is unspecified): an index result passes if it selects the same input values as CPU's.
_TIE_INDEX_OPS = {"sort", "argsort", "topk", "kthvalue", "mode", "median", "nanmedian", "max", "min"}


def _same_selection(source: torch.Tensor, got: torch.Tensor, expected: torch.Tensor) -> bool:
    if got.shape != expected.shape or got.dtype != torch.int64 or source.ndim == 0:
        return False
    for dim in range(source.ndim):
        g, e = (got, expected) if got.ndim == source.ndim else (got.unsqueeze(dim), expected.unsqueeze(dim))
        try:
            picked_g = torch.take_along_dim(source, g, dim)
            picked_e = torch.take_along_dim(source, e, dim)
        except (RuntimeError, IndexError):
            continue
        if torch.equal(picked_g.nan_to_num(0), picked_e.nan_to_num(0)) and torch.equal(
            picked_g.isnan(), picked_e.isnan()
        ):
            return True
    return False


def _compare(got, expected, tol: dict, values: bool, source=None) -> None:
    got = tree_map(_to_cpu, got)
    if not values:
        if _shape_only(got) != _shape_only(expected):
            raise AssertionError(f"shape/dtype {_shape_only(got)} != CPU's {_shape_only(expected)}")
        return
    got_leaves, got_spec = tree_flatten(got)
    expected_leaves, expected_spec = tree_flatten(tree_map(_detach, expected))
    if got_spec != expected_spec:
        raise AssertionError(f"result structure {got_spec} != CPU's {expected_spec}")
    for i, (g, e) in enumerate(zip(got_leaves, expected_leaves)):
        exact = not (isinstance(e, torch.Tensor) and (e.is_floating_point() or e.is_complex()))
        leaf_tol = {"atol": 0.0, "rtol": 0.0} if exact and isinstance(e, torch.Tensor) else tol
        if source is not None and isinstance(e, torch.Tensor) and e.dtype == torch.int64:
            if torch.equal(g, e) or _same_selection(source, g, e):
                continue
        torch.testing.assert_close(g, e, equal_nan=True, msg=lambda m, i=i: f"result {i}: {m}", **leaf_tol)


def _short(e: BaseException) -> str:
    text = str(e).strip().split("\n")[0]
    return f"{type(e).__name__}: {text[:160]}"


# ---- the checks -----------------------------------------------------------------------


def _fallbacks() -> dict[str, int]:
    return dict(torch_tpu.metrics.counters()["cpu_fallback_ops"])


def _new_fallbacks(before: dict[str, int]) -> set[str]:
    after = _fallbacks()
    return {k for k, v in after.items() if v > before.get(k, 0)}


def _limited(samples, n: int) -> Iterator:
    for i, s in enumerate(samples):
        if i >= n:
            return
        yield s


def _run_forward(op, dtype: torch.dtype, n: int, values: bool, tol: dict | None = None) -> None:
    tol = tol or _tolerance(op, dtype)
    for sample in _limited(op.sample_inputs("cpu", dtype), n):
        t_input, t_args, t_kwargs = _tpu_sample(sample)
        c_input, c_args, c_kwargs = _clone_cpu(sample)
        try:
            expected = op(c_input, *c_args, **c_kwargs)
        except Exception as cpu_error:
            try:
                op(t_input, *t_args, **t_kwargs)
            except Exception as tpu_error:
                if not isinstance(tpu_error, type(cpu_error)):
                    raise AssertionError(f"CPU raised {_short(cpu_error)}, tpu {_short(tpu_error)}") from None
                continue
            raise AssertionError(f"CPU raised {_short(cpu_error)}, tpu did not") from None
        got = op(t_input, *t_args, **t_kwargs)
        expected = sample.output_process_fn_grad(expected)
        got = sample.output_process_fn_grad(got)
        ties = c_input if op.name in _TIE_INDEX_OPS and isinstance(c_input, torch.Tensor) else None
        try:
            _compare(got, expected, tol, values, ties)
        except AssertionError:
            # CPU's half-float kernels differ by machine (oneDNN accumulates a bf16 conv in
            # float32 only where the CPU has bf16 instructions): also accept CPU's float32 result.
            opmath = _opmath_expected(op, sample, dtype)
            if opmath is None:
                raise
            _compare(got, sample.output_process_fn_grad(opmath), tol, values, ties)
        if isinstance(t_input, torch.Tensor) and isinstance(c_input, torch.Tensor):
            _compare(t_input, c_input, tol, values)  # in-place ops must mutate alike


def _opmath_expected(op, sample, dtype: torch.dtype):
    """CPU's result for `sample` computed in float32 and rounded to `dtype`; None for other
    dtypes, or where CPU cannot run it in float32."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None

    def up(x):
        return x.detach().float() if isinstance(x, torch.Tensor) and x.dtype == dtype else x

    def down(x):
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x

    c_input, c_args, c_kwargs = _clone_cpu(sample)
    try:
        out = op(tree_map(up, c_input), *tree_map(up, c_args), **tree_map(up, c_kwargs))
    except Exception:
        return None
    return tree_map(down, out)


def _grad_inputs(sample_parts) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(sample_parts)
    return [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]


def _grads(op, sample, inputs, args, kwargs, seed: int):
    out = sample.output_process_fn_grad(op(inputs, *args, **kwargs))
    outs = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor) and x.requires_grad]
    leaves = _grad_inputs((inputs, args, kwargs))
    if not outs or not leaves:
        return None
    gen = torch.Generator().manual_seed(seed)
    cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs]
    grads = torch.autograd.grad(outs, leaves, cots, allow_unused=True)
    return [None if g is None else g for g in grads]


def _run_grad(op, n: int, values: bool) -> bool:
    """True if at least one sample had something to differentiate."""
    tol = _tolerance(op, torch.float32)
    checked = False
    for i, sample in enumerate(_limited(op.sample_inputs("cpu", torch.float32, requires_grad=True), n)):
        c_input, c_args, c_kwargs = _clone_cpu(sample)
        try:
            expected = _grads(op, sample, c_input, c_args, c_kwargs, seed=i)
        except Exception:
            continue  # not differentiable on CPU either (e.g. integer outputs)
        if expected is None:
            continue
        t_input, t_args, t_kwargs = _tpu_sample(sample)
        got = _grads(op, sample, t_input, t_args, t_kwargs, seed=i)
        if got is None:
            raise AssertionError("tpu output does not require grad")
        if [g is None for g in got] != [g is None for g in expected]:
            raise AssertionError("gradients defined for different inputs than on CPU")
        _compare(got, expected, tol, values)
        checked = True
    return checked


def _run_errors(op, n: int) -> None:
    for error in _limited(op.error_inputs("cpu"), n):
        sample = error.sample_input
        c_input, c_args, c_kwargs = _clone_cpu(sample)
        try:
            op(c_input, *c_args, **c_kwargs)
        except Exception as e:
            cpu_error = e
        else:
            continue  # not an error on CPU in this build: nothing to match
        try:
            t_input, t_args, t_kwargs = _tpu_sample(sample)
            op(t_input, *t_args, **t_kwargs)
        except Exception as tpu_error:
            if not isinstance(tpu_error, type(cpu_error)):
                raise AssertionError(f"CPU raised {_short(cpu_error)}, tpu {_short(tpu_error)}") from None
            continue
        raise AssertionError(f"CPU raised {_short(cpu_error)}, tpu did not")


def _attempt(result: OpResult, aspect: str, fn) -> bool:
    try:
        fn()
    except _Timeout:
        result.results[aspect] = "fail"
        result.reasons[aspect] = "timeout"
        return False
    except Exception as e:
        result.results[aspect] = "fail"
        result.reasons[aspect] = _short(e)
        return False
    result.results[aspect] = "pass"
    return True


def check_op(
    op,
    forward_samples: int = FORWARD_SAMPLES,
    other_dtype_samples: int = OTHER_DTYPE_SAMPLES,
    grad_samples: int = GRAD_SAMPLES,
    error_samples: int = ERROR_SAMPLES,
    timeout_s: float = OP_TIMEOUT_S,
) -> OpResult:
    """Runs the forward, grad and error-input checks of one OpInfo entry."""
    result = OpResult(entry_name(op))
    values = not _NONDETERMINISTIC.match(op.name)
    with _time_limited(result, timeout_s, ASPECTS):
        dtypes = tested_dtypes(op)
        if dtypes:
            torch.manual_seed(0)
            before = _fallbacks()

            def forward():
                for dtype in dtypes:
                    n = forward_samples if dtype == torch.float32 else other_dtype_samples
                    _run_forward(op, dtype, n, values)

            _forward_and_native(result, before, forward)
        if op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu"):
            torch.manual_seed(0)
            before = _fallbacks()
            checked = [False]

            def grad():
                checked[0] = _run_grad(op, grad_samples, values)
                used = _new_fallbacks(before)
                if used:
                    result.fallback_ops.update(used)
                    raise AssertionError("CPU fallback: " + ", ".join(sorted(used)))

            ok = _attempt(result, "grad", grad)
            if ok and not checked[0]:
                del result.results["grad"]  # no float32 sample had a differentiable output
        if op.error_inputs_func is not None:
            torch.manual_seed(0)
            _attempt(result, "errors", lambda: _run_errors(op, error_samples))
    return result


@contextlib.contextmanager
def _time_limited(result: OpResult, timeout_s: float, aspects: Iterable[str]) -> Iterator[None]:
    """Runs the body with warnings off and a SIGALRM limit; on timeout, the aspects not yet
    decided fail with the reason "timeout". Records the time taken in `result.seconds`."""
    start = time.perf_counter()
    use_alarm = timeout_s > 0 and hasattr(signal, "setitimer")
    old_handler = signal.signal(signal.SIGALRM, _on_alarm) if use_alarm else None
    if use_alarm:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    except _Timeout:
        for aspect in aspects:
            if aspect not in result.results:
                result.results[aspect] = "fail"
                result.reasons[aspect] = "timeout"
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler)
        result.seconds = time.perf_counter() - start


def _forward_and_native(result: OpResult, before, forward) -> None:
    """The forward aspect, and the native one: whether it ran without the CPU fallback."""
    if _attempt(result, "forward", forward):
        used = _new_fallbacks(before)
        result.fallback_ops |= used
        result.results["native"] = "fail" if used else "pass"
        if used:
            result.reasons["native"] = "CPU fallback: " + ", ".join(sorted(used))


def low_precision_dtypes(op) -> list[torch.dtype]:
    supported = op.supported_dtypes("cpu")
    return [d for d in LOW_PRECISION_DTYPES if d in supported]


def check_op_low_precision(
    op, dtype: torch.dtype, samples: int = LOW_PRECISION_SAMPLES, timeout_s: float = OP_TIMEOUT_S
) -> OpResult:
    """The forward and native aspects for `dtype` (bfloat16, float16) samples: values against
    CPU's in the same dtype at LOW_PRECISION_TOL (or the op's larger override)."""
    result = OpResult(entry_name(op))
    values = not _NONDETERMINISTIC.match(op.name)
    tol = _tolerance(op, dtype, base=LOW_PRECISION_TOL)
    with _time_limited(result, timeout_s, ("forward", "native")):
        torch.manual_seed(0)
        before = _fallbacks()
        _forward_and_native(result, before, lambda: _run_forward(op, dtype, samples, values, tol))
    return result


# ---- expected failures -------------------------------------------------------------------


def parse_expected(text: str) -> dict[str, set[str]]:
    """`name aspect` lines (blank lines and # comments ignored) -> {name: {aspects}}."""
    expected: dict[str, set[str]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or parts[1] not in ASPECTS:
            raise ValueError(f"line {lineno}: expected 'op_name aspect' with aspect in {ASPECTS}: {line!r}")
        expected.setdefault(parts[0], set()).add(parts[1])
    return expected


def format_expected(results: Iterable[OpResult]) -> str:
    lines = []
    for r in sorted(results, key=lambda r: r.name):
        for aspect in ASPECTS:
            if aspect in r.failures():
                lines.append(f"{r.name} {aspect}  # {r.reasons.get(aspect, '')}".rstrip())
    return "\n".join(lines) + "\n"


def totals(results: Iterable[OpResult]) -> dict[str, tuple[int, int]]:
    """aspect -> (passed, applicable); "native_forward" counts forward and native both passing."""
    results = list(results)
    out = {}
    for aspect in ASPECTS:
        applicable = [r for r in results if aspect in r.results or (aspect == "native" and "forward" in r.results)]
        out[aspect] = (sum(r.passed(aspect) for r in applicable), len(applicable))
    fwd = [r for r in results if "forward" in r.results]
    out["native_forward"] = (sum(r.passed("forward") and r.passed("native") for r in fwd), len(fwd))
    return out
