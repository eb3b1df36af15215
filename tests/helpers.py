"""Shared helpers of the op tests: run a function on tpu and on CPU and compare.

Import them as `from tests.helpers import same, ...` (the workspace root is on sys.path, both
under the Bazel test runner and with PYTHONPATH=<repo> for a local pytest run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

import torch_tpu

# assert_close tolerances for low-precision floats (their own defaults are tighter than these ops).
LOW_PRECISION_TOL = {"rtol": 2e-2, "atol": 2e-2}


def tol_for(*items) -> dict:
    """LOW_PRECISION_TOL if any of `items` (tensors or dtypes; others are ignored) is bfloat16 or
    float16, else {} (assert_close's defaults)."""
    dtypes = {
        x.dtype if isinstance(x, torch.Tensor) else x for x in items if isinstance(x, (torch.Tensor, torch.dtype))
    }
    return dict(LOW_PRECISION_TOL) if dtypes & {torch.bfloat16, torch.float16} else {}


def platform_tol(tol: dict) -> dict:
    """`tol` where tpu tensors run on the XLA CPU client (never loosened there); on a TPU at least
    5e-4: its transcendental units (exp, log, tanh, rsqrt) differ from CPU's by up to ~2.5e-4
    relative in float32, and a model compounds that over its layers and training steps."""
    if torch_tpu.platform() != "tpu":
        return dict(tol)
    return {"rtol": max(tol.get("rtol", 0.0), 5e-4), "atol": max(tol.get("atol", 0.0), 5e-4)}


_TPU_ROUNDING_TOL = {
    # XLA:TPU rounds a*b+c twice where CPU's kernels fuse it into one multiply-add (and the
    # reverse), and sums in its own order: float32 results differ from CPU's in the last bits.
    torch.float32: {"rtol": 1e-6, "atol": 1e-6},
    # TPUs have no float64 units: XLA:TPU emulates float64 with pairs of float32 (~48 bits).
    torch.float64: {"rtol": 1e-14, "atol": 1e-14},
    torch.complex64: {"rtol": 1e-6, "atol": 1e-6},
    torch.complex128: {"rtol": 1e-14, "atol": 1e-14},
    # The float32 difference above flips a half-float rounding: one unit in the last place.
    torch.bfloat16: {"rtol": 2**-7, "atol": 1e-5},
    torch.float16: {"rtol": 2**-10, "atol": 1e-5},
}


def platform_rounding_tol(dtype: torch.dtype, roundings: int = 1) -> dict:
    """assert_close tolerances for a result CPU's kernels give bit for bit: exact where tpu
    tensors run on the XLA CPU client (never loosened there); on a TPU a few units in the last
    place of `dtype` (integers and bool stay exact), for the reasons in _TPU_ROUNDING_TOL, times
    `roundings` where a result carries that many such differences (each rounded to `dtype`)."""
    if torch_tpu.platform() != "tpu":
        return {"rtol": 0, "atol": 0}
    tol = _TPU_ROUNDING_TOL.get(dtype, {"rtol": 0, "atol": 0})
    return {name: roundings * value for name, value in tol.items()}


def run_python(args: list[str], env: dict, cwd, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python *args` in a fresh process (stdout and stderr captured as text) that imports the
    torch_tpu under test from any cwd (its package root goes first on `env`'s PYTHONPATH) and
    this `tests` package (the folder holding it comes next). The
    process runs in its own process group, killed whole on a timeout (TimeoutExpired raised)."""
    root = os.path.dirname(os.path.dirname(torch_tpu.__file__))
    tests_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # `import tests.helpers`
    env = {**env, "PYTHONPATH": os.pathsep.join([root, tests_parent, env.get("PYTHONPATH", "")])}
    command = [sys.executable, *args]
    proc = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def as_tuple(x) -> tuple:
    """A tuple or list as a tuple; anything else as a 1-tuple."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def plain(x):
    """x with its (nested) tuples and lists, named tuples included, turned into plain tuples."""
    return tuple(plain(v) for v in x) if isinstance(x, (tuple, list)) else x


def to_cpu(x):
    """plain(x) with every tensor moved to CPU, asserting that each one was a tpu tensor."""
    if isinstance(x, torch.Tensor):
        assert x.device.type == "tpu", f"expected a tpu result, got {x.device}"
        return x.cpu()
    if isinstance(x, (tuple, list)):
        return tuple(to_cpu(v) for v in x)
    return x


def graph_runners(monkeypatch) -> list:
    """The GraphRunners (compiled graphs) built from now on, captured as they are made."""
    from torch_tpu.compile import graph

    runners = []
    init = graph.GraphRunner.__init__

    def capture(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runners.append(self)

    monkeypatch.setattr(graph.GraphRunner, "__init__", capture)
    return runners


def assert_no_fallbacks() -> None:
    """Fails if any op fell back to CPU since the last torch_tpu.metrics.reset()."""
    fallbacks = torch_tpu.metrics.counters()["cpu_fallback_ops"]
    assert not fallbacks, f"ops fell back to CPU: {fallbacks}"


def native_only(fn):
    """Runs fn() and fails if any op it ran fell back to CPU; returns fn's result."""
    torch_tpu.metrics.reset()
    result = fn()
    assert_no_fallbacks()
    return result


def _copy(x, device: str, grad: bool):
    """A detached copy of the tensors in x on `device`; floating/complex top-level tensors
    require grad when `grad`, tensors inside lists and tuples keep their flag."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(device).requires_grad_(grad and (x.is_floating_point() or x.is_complex()))
    if isinstance(x, (list, tuple)):
        return type(x)(
            v.detach().to(device).requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v for v in x
        )
    return x


def same(fn, *inputs, grad=False, seed=None, equal_nan=True, device_arg=False, **tol):
    """fn on tpu copies of `inputs` equals fn on the CPU inputs, with no op falling back to CPU.

    Compares fn's results (tensors or nested tuples/lists of them; every result tensor must be on
    tpu) and the tensor inputs afterwards (fn may mutate them; NaN inputs compare equal). If fn
    raises on CPU it must raise the same exception type on tpu, and nothing else is checked.

    grad=True: floating (and complex) tensor inputs require grad; every result that requires
    grad gets a random cotangent (from the global RNG, or from a generator seeded with `seed`),
    and the inputs' gradients must match too (the backward pass must not fall back either).
    equal_nan: whether NaN results and gradients count as equal.
    device_arg=True: fn is called as fn(device, *inputs) with device "cpu" or "tpu".
    tol: rtol/atol for every comparison (default: assert_close's, by dtype).
    Returns fn's tpu result (None if it raised).
    """
    cpu_in = [_copy(x, "cpu", grad) for x in inputs]
    tpu_in = [_copy(x, "tpu", grad) for x in inputs]

    def call(device, args):
        return fn(device, *args) if device_arg else fn(*args)

    try:
        expected = call("cpu", cpu_in)
    except Exception as e:
        with pytest.raises(type(e)):
            call("tpu", tpu_in)
        return None
    torch_tpu.metrics.reset()
    got = call("tpu", tpu_in)
    got_cpu = to_cpu(got)
    if grad:
        pairs = [
            (c, t)
            for c, t in zip(as_tuple(expected), as_tuple(got), strict=True)
            if isinstance(c, torch.Tensor) and c.requires_grad
        ]
        assert pairs, "grad=True, but no result requires grad"
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        cots = [torch.randn(c.shape, generator=generator, dtype=c.dtype) for c, _ in pairs]
        torch.autograd.backward([c for c, _ in pairs], cots)
        torch.autograd.backward([t for _, t in pairs], [g.to("tpu") for g in cots])
    assert_no_fallbacks()
    torch.testing.assert_close(got_cpu, plain(expected), equal_nan=equal_nan, **tol)
    for c, t in zip(cpu_in, tpu_in, strict=True):
        if not isinstance(c, torch.Tensor):
            continue
        torch.testing.assert_close(to_cpu(t.detach()), c.detach(), equal_nan=True, **tol)
        if grad and c.requires_grad:
            if c.grad is None:
                assert t.grad is None, "the tpu input got a gradient, the CPU one none"
            else:
                assert t.grad is not None, "the CPU input got a gradient, the tpu one none"
                torch.testing.assert_close(to_cpu(t.grad), c.grad, equal_nan=equal_nan, **tol)
    return got


def compare(fn, *inputs, grad=True, rtol=1e-5, atol=1e-5, **kwargs):
    """`same` with the defaults of the nn and linalg tests: gradients on, cotangents from a
    generator seeded 0, rtol=atol=1e-5, and NaN results or gradients never equal."""
    kwargs = {"seed": 0, "equal_nan": False, **kwargs}
    return same(fn, *inputs, grad=grad, rtol=rtol, atol=atol, **kwargs)


def same_error(fn, *inputs, match=False):
    """fn raises on CPU, and raises the same exception class on tpu; with match=True the first
    lines of the two messages are equal."""
    with pytest.raises(Exception) as cpu_exc:
        fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    tpu_in = [x.to("tpu") if isinstance(x, torch.Tensor) else x for x in inputs]
    with pytest.raises(type(cpu_exc.value)) as tpu_exc:
        fn(*tpu_in)
        torch.tpu.synchronize()  # where index checks are deferred (TPU), they report here
    if match:
        assert str(cpu_exc.value).split("\n")[0] == str(tpu_exc.value).split("\n")[0]


def data(dtype, shape=(3, 4)):
    """Test data of `dtype`: random booleans, normal floats or integers in [-5, 5]."""
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(-5, 6, shape, dtype=dtype)
