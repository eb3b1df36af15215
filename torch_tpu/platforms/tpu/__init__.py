"""TPU's own facts: Mosaic's block rules (mosaic.py), libtpu's runtime metrics (monitoring.py) and
jax's TPU lowering rules for what XLA:TPU cannot compile, or computes wrongly, in complex128
(complex128.py)."""
