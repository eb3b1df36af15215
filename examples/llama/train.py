"""Train a small Llama (RMSNorm, rotary embeddings, SwiGLU, multi-head attention) on tpu, then
generate text.

python examples/llama/train.py --steps 20 [--compile] [--check] [--device cpu]
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # examples/common
from common import harness
from common.lm import lm_example
from common.transformer import DecoderConfig, DecoderLM

# Llama-2 style: as many K/V heads as query heads, no biases, separate output head.
CONFIG = DecoderConfig(block_size=64, n_layer=2, dim=64, n_head=4, n_kv_head=4, hidden_dim=176)

EXAMPLE = lm_example("Llama", lambda: DecoderLM(CONFIG), CONFIG.block_size)

if __name__ == "__main__":
    sys.exit(harness.main(EXAMPLE))
