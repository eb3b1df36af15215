"""Train a small Qwen2 on tpu, then generate text.

Qwen2's traits on top of the Llama family's RMSNorm, rotary embeddings and SwiGLU: grouped-query
attention (4 query heads share each K/V head), biases on the Q/K/V projections, a large rotary
base and the output head tied to the token embedding.

python examples/qwen/train.py --steps 20 [--compile] [--check] [--device cpu]
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # examples/common
from common import harness
from common.lm import lm_example
from common.transformer import DecoderConfig, DecoderLM

CONFIG = DecoderConfig(
    block_size=64,
    n_layer=2,
    dim=64,
    n_head=8,
    n_kv_head=2,
    hidden_dim=192,
    rope_theta=1_000_000.0,
    norm_eps=1e-6,
    qkv_bias=True,
    tie_embeddings=True,
)

EXAMPLE = lm_example("Qwen2", lambda: DecoderLM(CONFIG), CONFIG.block_size)

if __name__ == "__main__":
    sys.exit(harness.main(EXAMPLE))
