"""A tensor's bytes as one sha256 digest, the same whatever the thread count: ``sha256(sha256(chunk 0) ||
sha256(chunk 1) || ...)``, chunks of CHUNK_BYTES hashed in parallel on the host."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

import torch

CHUNK_BYTES = 64 * 2**20


def tensor_digest(tensor: torch.Tensor, threads: int | None = None) -> bytes:
    """The tree digest of ``tensor``'s raw bytes (NaN payloads included), on ``threads`` threads (default torch's)."""
    flat = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    chunks = [memoryview(flat[start : start + CHUNK_BYTES]) for start in range(0, flat.size, CHUNK_BYTES)]
    threads = min(threads or torch.get_num_threads(), len(chunks))
    if threads <= 1:
        leaves = [hashlib.sha256(chunk).digest() for chunk in chunks]
    else:
        with ThreadPoolExecutor(threads) as pool:
            leaves = list(pool.map(lambda chunk: hashlib.sha256(chunk).digest(), chunks))
    return hashlib.sha256(b"".join(leaves)).digest()
