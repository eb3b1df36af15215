"""A paged KV cache: fixed-size pages from one pool per layer, a page table per sequence.

Pages are handed out as sequences grow and returned when they finish, so sequences of very
different lengths share one pool without reserving their maximum length up front.
"""

from __future__ import annotations

import torch


class PagedKVCache:
    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        num_pages: int,
        page_size: int,
        pages_per_sequence: int,
        device: str | torch.device = "tpu",
        dtype: torch.dtype = torch.float32,
    ):
        shape = (kv_heads, num_pages, page_size, head_dim)
        self.k_pages = [torch.zeros(shape, dtype=dtype).to(device) for _ in range(layers)]
        self.v_pages = [torch.zeros(shape, dtype=dtype).to(device) for _ in range(layers)]
        self.page_size, self.pages_per_sequence, self.device = page_size, pages_per_sequence, device
        self._free = list(range(num_pages - 1, -1, -1))
        self._pages: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._next_id = 0

    def add_sequence(self) -> int:
        seq = self._next_id
        self._next_id += 1
        self._pages[seq], self._lengths[seq] = [], 0
        return seq

    def release(self, seq: int) -> None:
        self._free.extend(reversed(self._pages.pop(seq)))
        del self._lengths[seq]

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def reserve(self, seq: int, tokens: int) -> list[int]:
        """Room for `tokens` more tokens of `seq` (new pages as needed); returns their positions."""
        start = self._lengths[seq]
        end = start + tokens
        needed = -(-end // self.page_size)
        if needed > self.pages_per_sequence:
            raise RuntimeError(f"sequence {seq} would need {needed} pages, more than {self.pages_per_sequence}")
        while len(self._pages[seq]) < needed:
            if not self._free:
                raise RuntimeError("the KV cache is out of pages")
            self._pages[seq].append(self._free.pop())
        self._lengths[seq] = end
        return list(range(start, end))

    def slots(self, seqs: list[int], positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(page, offset in page) of each (sequence, position), as device index tensors."""
        pages = [self._pages[s][p // self.page_size] for s, p in zip(seqs, positions)]
        offsets = [p % self.page_size for p in positions]
        return torch.tensor(pages).to(self.device), torch.tensor(offsets).to(self.device)

    def write(self, layer: int, slots: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor) -> None:
        """Stores k, v [kv_heads, tokens, head_dim] at `slots` (from `slots()`, one per token)."""
        pages, offsets = slots
        self.k_pages[layer][:, pages, offsets] = k
        self.v_pages[layer][:, pages, offsets] = v

    def page_table(self, seqs: list[int]) -> torch.Tensor:
        """[len(seqs), pages_per_sequence] int32 page indices; unused entries are 0."""
        rows = [self._pages[s] + [0] * (self.pages_per_sequence - len(self._pages[s])) for s in seqs]
        return torch.tensor(rows, dtype=torch.int32).to(self.device)

    def lengths(self, seqs: list[int]) -> torch.Tensor:
        return torch.tensor([self._lengths[s] for s in seqs], dtype=torch.int32).to(self.device)
