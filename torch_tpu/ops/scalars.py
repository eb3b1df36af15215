"""Python numbers as device scalars, cached by value.

An op's traced Python number (`x * 0.5`, `add_(y, alpha=lr)`, layer_norm's eps) is an input of
its executable, one compile for every value. Handed to jax as a number, it is put on the device
at every call: on TPU that costs about as much as the op's own dispatch. The C++ eager path
(csrc/eager_kernel.cc) asks `device_scalar` instead, which keeps the last few thousand numbers
as weakly typed device arrays (the type jax gives a Python number), so a repeated number costs a
dictionary lookup, and the call runs the executable directly.
"""

from __future__ import annotations

import collections
import struct

import jax

from torch_tpu.runtime import client

MAX_CACHED = 4096

_cache: collections.OrderedDict = collections.OrderedDict()


def _key(value, device: int) -> tuple:
    if type(value) is float:  # by its bits: -0.0 and 0.0 differ, and a nan is a nan
        return (float, struct.pack("<d", value), device)
    return (type(value), value, device)


def device_scalar(value: bool | int | float, device: int) -> jax.Array:
    """`value` as a weakly typed scalar array on tpu device `device` (cached)."""
    key = _key(value, device)
    array = _cache.get(key)
    if array is not None:
        _cache.move_to_end(key)
        return array
    array = jax.device_put(value, client.jax_device(device))
    _cache[key] = array
    if len(_cache) > MAX_CACHED:
        _cache.popitem(last=False)
    return array
