"""Legacy typed storage classes on tpu (`torch.tpu.FloatStorage`, ...), as torch.cuda has them.

`tensor.storage_type()` looks them up on `torch.tpu` by name, and `torch.tpu.FloatStorage(n)`
makes an n-element float32 storage on the tpu (TypedStorage reads the device off the class's
module name, which is why each class says it lives in `torch.tpu`)."""

from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal


class _TpuLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for TPU storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for TPU storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for TPU storage")

    @classproperty
    def dtype(cls) -> torch.dtype:
        _warn_typed_storage_removal()
        return cls._dtype


def _storage_class(name: str, dtype: torch.dtype) -> type:
    cls = type(name, (_TpuLegacyStorage,), {"_dtype": classproperty(lambda cls: dtype), "__module__": "torch.tpu"})
    cls.__qualname__ = name
    return cls


ByteStorage = _storage_class("ByteStorage", torch.uint8)
DoubleStorage = _storage_class("DoubleStorage", torch.double)
FloatStorage = _storage_class("FloatStorage", torch.float)
HalfStorage = _storage_class("HalfStorage", torch.half)
LongStorage = _storage_class("LongStorage", torch.long)
IntStorage = _storage_class("IntStorage", torch.int)
ShortStorage = _storage_class("ShortStorage", torch.short)
CharStorage = _storage_class("CharStorage", torch.int8)
BoolStorage = _storage_class("BoolStorage", torch.bool)
BFloat16Storage = _storage_class("BFloat16Storage", torch.bfloat16)
ComplexDoubleStorage = _storage_class("ComplexDoubleStorage", torch.cdouble)
ComplexFloatStorage = _storage_class("ComplexFloatStorage", torch.cfloat)

CLASSES = (
    ByteStorage,
    DoubleStorage,
    FloatStorage,
    HalfStorage,
    LongStorage,
    IntStorage,
    ShortStorage,
    CharStorage,
    BoolStorage,
    BFloat16Storage,
    ComplexDoubleStorage,
    ComplexFloatStorage,
)


def register() -> None:
    """Lets torch.is_storage know the classes (as torch.cuda does for its own)."""
    torch._storage_classes.update(CLASSES)
