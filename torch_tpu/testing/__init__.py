"""Test support that ships with the wheel (the OpInfo sweep behind `python -m torch_tpu.tools.coverage`)."""
