"""Buffer donation for compiled graphs: inputs the graph overwrites hand their buffers to XLA.

A functionalized graph that mutates an input (a parameter, optimizer state,
BatchNorm statistics) writes a new buffer and swaps it into the input's storage.
Without donation the old and the new buffer are live at once during the call;
donating the old one lets XLA write the result in place.

Every tensor and view of that storage reads the swapped-in buffer afterwards,
so they never see a deleted one. What donation must not touch is a jax array
that something other than this storage still holds (another storage that
shares it, an input given twice): before each call, such an argument is
replaced by a private copy (counted in `donation_copies`), so the held array
stays intact.
"""

from __future__ import annotations

import collections
import sys

import jax.numpy as jnp

from torch_tpu import metrics

# A buffer held only by its tensor's storage: that reference, the argument
# list's and the two of the check itself (the argument and the loop variable).
_PRIVATE_REFS = 1


def candidates(segment, values: list, readers: list) -> tuple[int, ...]:
    """Argument positions (into the jitted function) of the tpu inputs the segment overwrites."""
    mutated = {placeholder for placeholder, _ in segment.mutations}
    positions = []
    position = 0
    for node, value, reader in zip(segment.inputs, values, readers):
        if reader.kind == "static":
            continue
        if reader.kind == "buffer" and node in mutated and value.device.type == "tpu":
            positions.append(position)
        position += 1
    return tuple(positions)


def guard(dyn: list, donated: tuple[int, ...]) -> None:
    """Replaces each donated argument that something else still holds with a private copy."""
    given = collections.Counter(map(id, dyn))  # once per call: an optimizer's step donates ~1000
    for index in donated:
        buffer = dyn[index]
        occurrences = given[id(buffer)]
        # getrefcount's argument and the local `buffer` are two more references.
        others = sys.getrefcount(buffer) - 2 - occurrences - _PRIVATE_REFS
        if others > 0 or occurrences > 1:
            dyn[index] = jnp.array(buffer, copy=True)
            metrics.bump("donation_copies")
        else:
            metrics.bump("donated_buffers")
