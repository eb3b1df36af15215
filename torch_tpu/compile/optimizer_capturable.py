"""Compiled optimizers keep their step counts on tpu, as dynamo does for CUDA.

A torch.optim optimizer whose `capturable` is False keeps each parameter's step count on the
CPU. Traced by dynamo, its step then splits the graph at every step-count op (~10 per
parameter list), and the bias corrections enter the device executable as host scalars, one per
parameter, every step. Dynamo sets `capturable=True` for optimizers whose parameters are all on
cuda or xpu and whose state is not created yet; this makes it do the same for tpu (a device
`torch.optim` lists as capturable), so the whole update is one executable.

Dynamo runs an optimizer's `_init_group` eagerly while it traces the step, which creates the
state at the first step: a zero fill per parameter shape, each an eager op compiled on its own
(34 compiles, ~1 s each on TPU, in a ResNet-50's first step). For tpu optimizers that call is
recorded lazily (compile/lazy.py) and runs as one program, on a worker thread: its compile
overlaps dynamo's tracing of the step and aot_autograd's, until the step's graph reads the state.
"""

from __future__ import annotations

import contextlib


def _all_tpu_and_fresh(optimizer, group: dict) -> bool:
    params = group.get("params", [])
    return (
        "capturable" in group
        and bool(params)
        and all(p.device.type == "tpu" for p in params)
        and all(p not in optimizer.state for p in params)
    )


def _all_tpu(optimizer) -> bool:
    params = [p for group in optimizer.param_groups for p in group.get("params", [])]
    return bool(params) and all(p.device.type == "tpu" for p in params)


def _recorded_as_one_program(init):
    from torch_tpu.compile import lazy

    def init_group(*args, **kwargs):
        lazy.set_enabled(True)
        try:
            return init(*args, **kwargs)
        finally:  # the recorded state creation compiles and runs while dynamo traces the step
            lazy.set_enabled(False, in_background=True)

    return init_group


def _state_in_one_program(optimizer):
    """While dynamo calls `optimizer._init_group` eagerly, its ops are recorded and run as one
    program when it returns (unless ops are recorded already, or the state is placed by SPMD)."""
    from torch_tpu import fused_optimizer
    from torch_tpu.compile import lazy
    from torch_tpu.ops import spmd

    if lazy.enabled() or spmd.layer is not None:
        return contextlib.nullcontext()
    return fused_optimizer.wrapping_init_group(optimizer, _recorded_as_one_program)


def install() -> None:
    """Wraps dynamo's OptimizerVariable._set_capturable and its `_init_group` call (once)."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    original = getattr(OptimizerVariable, "_set_capturable", None)
    if original is None or getattr(original, "torch_tpu_wrapped", False):  # another torch, or done
        return
    call_method = OptimizerVariable.call_method

    def call_method_with_state_in_one_program(self, tx, name, args, kwargs):
        if name == "_init_group" and _all_tpu(self.value):
            with _state_in_one_program(self.value):
                return call_method(self, tx, name, args, kwargs)
        return call_method(self, tx, name, args, kwargs)

    OptimizerVariable.call_method = call_method_with_state_in_one_program

    def _set_capturable(self, tx) -> None:
        for group in self.value.param_groups:
            if _all_tpu_and_fresh(self.value, group):
                group["capturable"] = True
        original(self, tx)

    _set_capturable.torch_tpu_wrapped = True
    OptimizerVariable._set_capturable = _set_capturable
