"""The ATen lowerings, one module per op family; `torch_tpu.ops.install` loads every module here."""
