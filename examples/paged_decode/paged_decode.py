"""Greedy decoding with a tiny Llama on tpu: a batched flash-attention prefill of the prompts
into a paged KV cache, then batched decode steps with paged attention.

python examples/paged_decode/paged_decode.py --steps 8 [--check]

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
from paged_kv_cache import PagedKVCache
from paged_llama import Llama, LlamaConfig

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
    # Prefill: all prompts in one batch, right-padded. Causal attention keeps the padding out
    # of every real token's view; only real tokens go into the cache.
    longest = max(map(len, prompts))
    tokens = torch.tensor([p + [0] * (longest - len(p)) for p in prompts]).to("tpu")
    positions = torch.arange(longest).repeat(len(prompts), 1).to("tpu")
    real = [(b, t) for b, p in enumerate(prompts) for t in range(len(p))]
    rows, cols = (torch.tensor(ix).to("tpu") for ix in zip(*real))
    for seq, prompt in zip(seqs, prompts):
        cache.reserve(seq, len(prompt))
    slots = cache.slots([seqs[b] for b, _ in real], [t for _, t in real])

    def prefill(layer, q, k, v):
        cache.write(layer, slots, k[rows, :, cols].transpose(0, 1), v[rows, :, cols].transpose(0, 1))
        return flash_attention(q, k, v, causal=True)

    logits = model(tokens, positions, prefill)
    last_index = torch.tensor([len(p) - 1 for p in prompts]).to("tpu")
    first = logits[torch.arange(len(prompts)).to("tpu"), last_index].argmax(-1)
    out = [[t] for t in first.cpu().tolist()]
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
