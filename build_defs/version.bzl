"""The torch_tpu distribution version, written into the wheel's METADATA and file name.

Keep torch_tpu.__version__ equal to it.
"""

TORCH_TPU_VERSION = "0.1.0"
