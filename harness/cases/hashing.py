"""A tensor's bytes as one sha256 digest, hashed in parallel chunks on the host, whatever the thread count:
``sha256(sha256(chunk 0) || sha256(chunk 1) || ...)``, chunks of CHUNK_BYTES.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

import torch

CHUNK_BYTES = 64 * 2**20


def tensor_digest(tensor: torch.Tensor, threads: int | None = None) -> bytes:
    """sha256 tree digest (module docstring) of ``tensor``'s raw bytes, NaN payloads included: any shape, dtype
    and device (copied to the host first), hashed on ``threads`` threads (default torch's thread count)."""
    flat = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    chunks = [memoryview(flat[start : start + CHUNK_BYTES]) for start in range(0, flat.size, CHUNK_BYTES)]
    threads = min(threads or torch.get_num_threads(), len(chunks))
    if threads <= 1:
        leaves = [hashlib.sha256(chunk).digest() for chunk in chunks]
    else:
        with ThreadPoolExecutor(threads) as pool:
            leaves = list(pool.map(lambda chunk: hashlib.sha256(chunk).digest(), chunks))
    return hashlib.sha256(b"".join(leaves)).digest()
