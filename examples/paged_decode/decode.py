"""Greedy decoding with a tiny Llama on tpu: flash-attention prefill of each prompt into a
paged KV cache, then batched decode steps with paged attention.

python examples/paged_decode/decode.py --steps 8 [--check]

--check also decodes on CPU by recomputing every sequence in full (no cache) and asserts the
same tokens come out.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu.kernels import flash_attention, paged_attention

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from kv_cache import PagedKVCache
from llama import Llama, LlamaConfig

PROMPTS = [[1, 5, 9], [2, 7, 3, 11, 4, 8], [6, 10, 12, 14, 1]]


def build_model(seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig()).eval()


@torch.no_grad()
def generate_paged(model: Llama, prompts: list[list[int]], steps: int, page_size: int = 4) -> list[list[int]]:
    cfg = model.cfg
    max_len = max(map(len, prompts)) + steps
    pages_per_sequence = -(-max_len // page_size)
    cache = PagedKVCache(
        cfg.layers, cfg.kv_heads, cfg.head_dim, len(prompts) * pages_per_sequence, page_size, pages_per_sequence
    )
    seqs = [cache.add_sequence() for _ in prompts]
    last = []
    for seq, prompt in zip(seqs, prompts):  # prefill: one causal flash attention per prompt
        positions = cache.reserve(seq, len(prompt))
        slots = cache.slots([seq] * len(prompt), positions)

        def prefill(layer, q, k, v, slots=slots):
            cache.write(layer, slots, k[0], v[0])
            return flash_attention(q, k, v, causal=True)

        tokens = torch.tensor([prompt]).to("tpu")
        logits = model(tokens, torch.tensor([positions]).to("tpu"), prefill)
        last.append(logits[0, -1].argmax())
    out = [[int(t)] for t in torch.stack(last).cpu()]
    for _ in range(steps - 1):  # decode: every sequence's next token in one batch
        positions = [cache.reserve(seq, 1)[0] for seq in seqs]
        slots = cache.slots(seqs, positions)
        table, lengths = cache.page_table(seqs), cache.lengths(seqs)

        def decode(layer, q, k, v, slots=slots, lengths=lengths, table=table):
            cache.write(layer, slots, k[:, :, 0].transpose(0, 1), v[:, :, 0].transpose(0, 1))
            o = paged_attention(
                q[:, :, 0], cache.k_pages[layer], cache.v_pages[layer], lengths, table, check_values=False
            )
            return o.unsqueeze(2)

        tokens = torch.tensor([[o[-1]] for o in out]).to("tpu")
        logits = model(tokens, torch.tensor(positions)[:, None].to("tpu"), decode)
        for o, t in zip(out, logits[:, -1].argmax(-1).cpu().tolist()):
            o.append(t)
    for seq in seqs:
        cache.release(seq)
    return out


@torch.no_grad()
def generate_reference(model: Llama, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Each sequence recomputed in full at every step, plain SDPA (wherever the model lives)."""

    def attend(layer, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    out = []
    for prompt in prompts:
        seq = list(prompt)
        for _ in range(steps):
            logits = model(torch.tensor([seq]), torch.arange(len(seq))[None], attend)
            seq.append(int(logits[0, -1].argmax()))
        out.append(seq[len(prompt) :])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    model = build_model()
    tokens = generate_paged(model.to("tpu"), PROMPTS, args.steps)
    for prompt, new in zip(PROMPTS, tokens):
        print(prompt, "->", new)
    if args.check:
        expected = generate_reference(model.cpu(), PROMPTS, args.steps)
        assert tokens == expected, f"paged decode {tokens} != reference {expected}"
        print("matches the CPU reference")
    print(torch_tpu.metrics.report())


if __name__ == "__main__":
    main()
