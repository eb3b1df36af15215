"""TPU's own facts: Mosaic's block rules (mosaic.py), libtpu's runtime metrics (monitoring.py) and
jax's TPU lowering rules for what XLA:TPU cannot compile, or computes wrongly, in 64-bit types
(x64_types.py)."""
