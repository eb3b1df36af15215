"""Eager optimizer steps on tpu run as one fused executable.

A torch optimizer's step is many ops: AdamW's default (foreach) form runs about nine
`_foreach_*` ops, each one a pass over every parameter-sized buffer, and the for-loop forms
run several ops per parameter. When every parameter of an optimizer is on one tpu device and
ops run one by one (the default `eager_mode(True)`, outside `torch.compile`), `step()` records
its ops lazily (compile/lazy.py) and runs them as one executable when it returns, dispatched
as an eager op is (no host wait). A steady loop reuses that executable: the step's Python
numbers (lr, bias corrections) are runtime arguments of it, not constants.

How: torch calls every optimizer's own step through a wrapper (`Optimizer.profile_hook_step`)
that runs the step hooks around it. A global step pre-hook (torch's public
`register_optimizer_step_pre_hook`) finds each optimizer class whose step runs with tpu
parameters and puts `fused_step` in place of the step function that wrapper calls (its
closure cell), once per class. So the fusion is inside every way `step` is reached (an LR
scheduler's wrapper, a subclass's `super().step()`), and its `try` restores eager mode when
the step raises (running the updates recorded before the error, as eager mode made them,
then re-raising the step's own exception). A torch whose wrapper is laid out otherwise
fuses nothing (`TORCH_TPU_DEBUG=1` says so).

The first step creates the optimizer's state (AdamW's moments) and later steps read it: recorded
as one trace, step 1 and step 2 would be two programs, the second compiled at step 2 (9 s for
a GPT-2's AdamW on TPU). So the recording is run (flushed) before and after each `_init_group`
call (torch's optimizers gather, and on the first step create, a group's state there): the
state's creation runs as its own small program and every step's update records alike, one
program per param group, compiled at step 1. A step recorded under `eager_mode(False)` is split
the same way within the caller's recording: what was recorded before `_init_group` (a lazy
loop's forward and backward) runs there and the update runs when `step` returns, so a lazy
loop's step 2 compiles nothing either, and the chip runs the update while the host records the
next step.

Not fused: a step given a closure (LBFGS; a closure that runs forward and backward would be
recorded with the step), a step while ops are already recorded (`eager_mode(False)`) or
dynamo traces (`torch.compiler.is_compiling()`), optimizers with parameters off tpu or on two
devices, SPMD placement, and `TORCH_TPU_FUSE_OPTIMIZER=0`. Counter: `fused_optimizer_steps`.

This module is not on dynamo's skip list (torch_tpu.compile is): dynamo inlines the hook and
`fused_step` in a compiled `step()`, and both do nothing there but call through.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator

import torch
from torch.optim.optimizer import Optimizer, register_optimizer_step_pre_hook

from torch_tpu import debug, metrics

ENV = "TORCH_TPU_FUSE_OPTIMIZER"

_fusing: set[Callable] = set()  # torch's step wrappers whose step function is fused_step
_refused: set[Callable] = set()  # wrappers whose layout is not the one known
_installed = False


def install() -> None:
    """Registers the global step pre-hook (once; at `import torch_tpu`)."""
    global _installed
    if not _installed:
        register_optimizer_step_pre_hook(_find_step)
        _installed = True


def enabled() -> bool:
    """False with TORCH_TPU_FUSE_OPTIMIZER=0 (read at each step)."""
    return os.environ.get(ENV, "1").strip() != "0"


def _find_step(optimizer: Optimizer, args: tuple, kwargs: dict) -> None:
    """torch's global step pre-hook: the first step of a tpu optimizer's class makes its step
    function fused_step (that step included: the wrapper reads the function after the hooks)."""
    if torch.compiler.is_compiling():
        return
    wrapper = type(optimizer).step
    if wrapper in _fusing or wrapper in _refused or _device_of(optimizer) is None:
        return
    cell = _step_cell(wrapper)
    if cell is None:
        _refused.add(wrapper)
        debug.log("optimizer", f"{type(optimizer).__name__}.step is not torch's step wrapper: not fused")
        return
    cell.cell_contents = _fused(cell.cell_contents)
    _fusing.add(wrapper)


def _step_cell(wrapper: Callable):
    """The closure cell of torch's step wrapper holding the step function, or None."""
    code = getattr(wrapper, "__code__", None)
    inner = getattr(wrapper, "__wrapped__", None)
    if code is None or inner is None or not getattr(wrapper, "hooked", False) or "func" not in code.co_freevars:
        return None
    cell = wrapper.__closure__[code.co_freevars.index("func")]
    return cell if cell.cell_contents is inner else None


def _fused(step: Callable) -> Callable:
    @functools.wraps(step)
    def fused_step(*args, **kwargs):
        if torch.compiler.is_compiling():
            return step(*args, **kwargs)
        if _recorded_by_caller(args):
            with _state_apart(args[0]):
                result = step(*args, **kwargs)
            _flush_recording()  # the update runs while the caller records its next step
            return result
        if not _fusable(args, kwargs):
            return step(*args, **kwargs)
        return _run_fused(step, args, kwargs)

    return fused_step


@contextlib.contextmanager
def wrapping_init_group(optimizer: Optimizer, wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """While inside, `optimizer._init_group` is `wrap(its own _init_group)` (an instance attribute,
    deleted on exit); an optimizer without one, or wrapped already, stays as it is."""
    init = getattr(optimizer, "_init_group", None)
    if init is None or "_init_group" in vars(optimizer):
        yield
        return
    optimizer._init_group = wrap(init)
    try:
        yield
    finally:
        del optimizer._init_group


def _flushed_around(init: Callable) -> Callable:
    from torch_tpu.ops import tensors

    def init_group(*args, **kwargs):
        tensors.lazy.flush()
        result = init(*args, **kwargs)
        tensors.lazy.flush()
        return result

    return init_group


def _state_apart(optimizer: Optimizer):
    """Runs what is recorded before and after each `_init_group` call of `optimizer` (see the
    module's docstring); an optimizer without one records as it is."""
    return wrapping_init_group(optimizer, _flushed_around)


def _flush_recording() -> None:
    from torch_tpu.ops import tensors

    tensors.lazy.flush()


def _recorded_by_caller(args: tuple) -> bool:
    """A tpu optimizer's step under the caller's `eager_mode(False)`."""
    from torch_tpu.ops import tensors

    return tensors.lazy is not None and bool(args) and isinstance(args[0], Optimizer) and enabled()


def _fusable(args: tuple, kwargs: dict) -> bool:
    from torch_tpu.ops import spmd, tensors

    if not enabled() or tensors.lazy is not None or spmd.layer is not None:
        return False
    if not args or not isinstance(args[0], Optimizer):
        return False
    if any(callable(a) for a in args[1:]) or any(callable(v) for v in kwargs.values()):
        return False  # a closure
    return _device_of(args[0]) is not None


def _device_of(optimizer: Optimizer) -> torch.device | None:
    """The one tpu device every parameter of `optimizer` is on, or None."""
    device = None
    for group in optimizer.param_groups:
        for p in group["params"]:
            d = p.device
            if d.type != "tpu" or (device is not None and d != device):
                return None
            device = d
    return device


def _run_fused(step: Callable, args: tuple, kwargs: dict):
    from torch_tpu.compile import lazy

    lazy.set_enabled(True)
    try:
        with _state_apart(args[0]):
            result = step(*args, **kwargs)
    except BaseException:
        try:
            lazy.set_enabled(False)  # runs what was recorded before the error; eager mode again
        except Exception as error:  # the step's own exception is the one that propagates
            debug.log("optimizer", f"running a failed step's recorded ops raised {error!r}")
        raise
    lazy.set_enabled(False)  # runs the step: one executable, dispatched without a wait
    metrics.bump("fused_optimizer_steps")
    return result
