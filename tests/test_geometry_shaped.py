"""Views of shaped buffers (ops/geometry.py): a buffer that holds its tensor's shape (TPU's layout,
platforms.shaped_buffers()) reads and writes every view as the flat buffer does, and boxes and
transposes of it without going through a flat layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from torch_tpu.ops import geometry as geo

SHAPE = (6, 8, 10)
VIEWS = {
    "whole": lambda b: b,
    "transpose": lambda b: b.permute(2, 0, 1),
    "box": lambda b: b[1:4, 2:7, 3:9],
    "strided box": lambda b: b[::2, 1::3, ::4],
    "row": lambda b: b[3],
    "column": lambda b: b[:, :, 5],
    "narrow last": lambda b: b.narrow(2, 4, 5),
    "reshaped": lambda b: b.view(48, 10)[7:20],
    "expanded": lambda b: b[:, :1, :].expand(6, 8, 10),
    "diagonal": lambda b: b[0].diagonal(),
    "unfold": lambda b: b[0, 0].unfold(0, 4, 3),
}


def _geometry(view: torch.Tensor, buffer_shape: tuple) -> geo.Geometry:
    dtype = np.dtype(np.float32)
    return geo.Geometry(tuple(view.shape), tuple(view.stride()), view.storage_offset(), dtype, dtype, buffer_shape)


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_a_view_of_a_shaped_buffer_reads_as_of_the_flat_one(name):
    base = torch.arange(np.prod(SHAPE), dtype=torch.float32).reshape(SHAPE)
    view = VIEWS[name](base)
    flat, shaped = jnp.asarray(base.numpy().reshape(-1)), jnp.asarray(base.numpy())
    from_flat = jax.jit(lambda b: geo.read(b, _geometry(view, (base.numel(),))))(flat)
    from_shaped = jax.jit(lambda b: geo.read(b, _geometry(view, SHAPE)))(shaped)
    np.testing.assert_array_equal(np.asarray(from_shaped), view.numpy())
    np.testing.assert_array_equal(np.asarray(from_flat), view.numpy())


@pytest.mark.parametrize("name", sorted(n for n in VIEWS if n not in ("expanded", "unfold")))
def test_a_write_into_a_view_of_a_shaped_buffer_keeps_its_shape(name):
    base = torch.arange(np.prod(SHAPE), dtype=torch.float32).reshape(SHAPE)
    view = VIEWS[name](base)
    value = -torch.arange(view.numel(), dtype=torch.float32).reshape(view.shape)
    expected = base.clone()
    VIEWS[name](expected).copy_(value)
    new = jax.jit(lambda b, v: geo.write(b, _geometry(view, SHAPE), v))(jnp.asarray(base.numpy()), value.numpy())
    assert tuple(new.shape) == SHAPE
    np.testing.assert_array_equal(np.asarray(new), expected.numpy())


def test_a_whole_write_shapes_a_flat_buffer_where_buffers_are_shaped():
    view = torch.zeros(SHAPE)
    g = _geometry(view, (view.numel(),))
    value = np.ones(SHAPE, np.float32)
    assert geo.write(jnp.zeros(view.numel()), g, value, shaped=True).shape == SHAPE
    assert geo.write(jnp.zeros(view.numel()), g, value).shape == (view.numel(),)


def test_a_box_reads_without_a_flat_copy():
    base = torch.zeros(SHAPE)
    text = jax.jit(lambda b: geo.read(b, _geometry(base[1:4, 2:7, 3:9], SHAPE))).lower(jnp.zeros(SHAPE)).as_text()
    assert "reshape" not in text and "slice" in text
