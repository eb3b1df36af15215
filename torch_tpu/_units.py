"""Byte counts as text and back ("512M" -> 536870912 -> "512.00 MiB")."""

from __future__ import annotations

import re

_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """ "1048576", "512M", "8G" or "1.5GiB" as a number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if match is None:
        raise ValueError(f"TORCH_TPU_MEMORY_LIMIT={text!r} is not a byte count such as 1073741824, 512M or 8G")
    return int(float(match.group(1)) * _SUFFIXES[match.group(2).upper()])


def format_bytes(n: int) -> str:
    """Bytes for people: 512 B, 3.00 KiB, 1.50 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
