"""Training text that exists offline on every machine: the Python standard library's source.

Byte-level: the vocabulary is the 256 byte values, no tokenizer files, nothing to download.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

__all__ = ["ByteBatches", "stdlib_bytes"]


def stdlib_bytes(max_bytes: int = 4_000_000) -> bytes:
    """Concatenated .py files of the stdlib, in sorted path order (deterministic)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if not chunks:
        raise RuntimeError(f"no Python sources found under {root}")
    return b"".join(chunks)[:max_bytes]


class ByteBatches:
    """Random (x, y) windows of a byte stream, y shifted by one, from a seeded generator."""

    def __init__(self, data: bytes, block_size: int, batch_size: int, seed: int = 0) -> None:
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.block_size, self.batch_size = block_size, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        high = self.data.numel() - self.block_size - 1
        start = torch.randint(high, (self.batch_size,), generator=self.generator)
        offsets = torch.arange(self.block_size + 1)
        window = self.data[start[:, None] + offsets]  # (B, T+1)
        return window[:, :-1], window[:, 1:]
