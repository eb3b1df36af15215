"""Compiled optimizers keep their step counts on tpu, as dynamo does for CUDA.

A torch.optim optimizer whose `capturable` is False keeps each parameter's step count on the
CPU. Traced by dynamo, its step then splits the graph at every step-count op (~10 per
parameter list), and the bias corrections enter the device executable as host scalars, one per
parameter, every step. Dynamo sets `capturable=True` for optimizers whose parameters are all on
cuda or xpu and whose state is not created yet; this makes it do the same for tpu (a device
`torch.optim` lists as capturable), so the whole update is one executable.
"""

from __future__ import annotations


def _all_tpu_and_fresh(optimizer, group: dict) -> bool:
    params = group.get("params", [])
    return (
        "capturable" in group
        and bool(params)
        and all(p.device.type == "tpu" for p in params)
        and all(p not in optimizer.state for p in params)
    )


def install() -> None:
    """Wraps dynamo's OptimizerVariable._set_capturable (once)."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    original = getattr(OptimizerVariable, "_set_capturable", None)
    if original is None or getattr(original, "torch_tpu_wrapped", False):  # another torch, or done
        return

    def _set_capturable(self, tx) -> None:
        for group in self.value.param_groups:
            if _all_tpu_and_fresh(self.value, group):
                group["capturable"] = True
        original(self, tx)

    _set_capturable.torch_tpu_wrapped = True
    OptimizerVariable._set_capturable = _set_capturable
