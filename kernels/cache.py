"""A paged KV cache as an engine keeps one: pools per layer, a block allocator, writes
through a slot mapping, and an attention read that goes through the dispatcher.

A slot is ``block * block_size + offset``. With block_size 16, a sequence whose blocks
are [7, 2, 9] keeps token 40 in slot 9 * 16 + 8 = 152 (40 = 2 * 16 + 8).
"""

from __future__ import annotations

import torch

from .dispatch import paged_attention_dispatch


class CacheFullError(RuntimeError):
    """The pool has too few free blocks for a request; nothing was changed."""


class PagedKVCache:
    """KV pools for ``num_layers`` layers sharing one block allocator.

    k_caches[layer], v_caches[layer]: [num_blocks, block_size, num_kv_heads, head_dim].
    Floating pools start filled with NaN, and freed blocks are NaN-filled again, so a
    read of a slot no live sequence owns shows up in the output instead of passing
    silently.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float16,
        device: torch.device | str = "cpu",
        backend: str | None = None,
    ):
        if min(num_layers, num_blocks, block_size, num_kv_heads, head_dim) < 1:
            raise ValueError("num_layers, num_blocks, block_size, num_kv_heads and head_dim must all be >= 1")
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.backend = backend
        self.k_caches = [torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_caches = [torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in range(num_layers)]
        self._free_blocks = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self._blocks: dict[int, list[int]] = {}
        self._lens: dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    def allocate(self, seq_id: int) -> None:
        """Start an empty sequence."""
        if seq_id in self._blocks:
            raise ValueError(f"sequence {seq_id} is already allocated")
        self._blocks[seq_id] = []
        self._lens[seq_id] = 0

    def append(self, seq_id: int, num_tokens: int) -> torch.Tensor:
        """Reserve slots for ``num_tokens`` more tokens of ``seq_id``.

        Returns the slot mapping, [num_tokens] int64, to pass to :meth:`write`. Raises
        CacheFullError, before changing anything, when the free blocks do not suffice.
        """
        if seq_id not in self._blocks:
            raise KeyError(f"sequence {seq_id} is not allocated")
        old_len = self._lens[seq_id]
        new_len = old_len + num_tokens
        blocks = self._blocks[seq_id]
        needed = -(-new_len // self.block_size) - len(blocks)
        if needed > len(self._free_blocks):
            raise CacheFullError(
                f"sequence {seq_id} needs {needed} more blocks for {num_tokens} tokens "
                f"but only {len(self._free_blocks)} of {self.num_blocks} are free"
            )
        blocks.extend(self._free_blocks.pop() for _ in range(needed))
        self._lens[seq_id] = new_len
        positions = torch.arange(old_len, new_len)
        block_ids = torch.tensor(blocks, dtype=torch.int64)[positions // self.block_size]
        return block_ids * self.block_size + positions % self.block_size

    def free(self, seq_id: int) -> None:
        """Return the sequence's blocks to the pool, poisoned with NaN again."""
        blocks = self._blocks.pop(seq_id)
        del self._lens[seq_id]
        if blocks:
            index = torch.tensor(blocks, device=self.k_caches[0].device)
            for pool in (*self.k_caches, *self.v_caches):
                if pool.is_floating_point():
                    pool[index] = float("nan")
        self._free_blocks.extend(reversed(blocks))

    def write(self, layer: int, slot_mapping: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store key/value [num_tokens, num_kv_heads, head_dim] at slot_mapping [num_tokens]."""
        k_pool, v_pool = self.k_caches[layer], self.v_caches[layer]
        slots = slot_mapping.to(k_pool.device, torch.int64)
        k_pool.view(-1, *k_pool.shape[2:])[slots] = key.to(k_pool.dtype)
        v_pool.view(-1, *v_pool.shape[2:])[slots] = value.to(v_pool.dtype)

    def block_table(self, seq_ids: list[int]) -> torch.Tensor:
        """[len(seq_ids), max_blocks_per_seq] int32, -1 past each sequence's last block."""
        width = max((len(self._blocks[s]) for s in seq_ids), default=0) or 1
        table = torch.full((len(seq_ids), width), -1, dtype=torch.int32)
        for row, seq_id in enumerate(seq_ids):
            blocks = self._blocks[seq_id]
            table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        return table.to(self.k_caches[0].device)

    def seq_lens(self, seq_ids: list[int]) -> torch.Tensor:
        """[len(seq_ids)] int32 KV lengths."""
        return torch.tensor([self._lens[s] for s in seq_ids], dtype=torch.int32, device=self.k_caches[0].device)

    def paged_attention(self, layer, q, seq_ids, query_start_loc=None, scale=None, out=None) -> torch.Tensor:
        """Attention of q [num_tokens, num_q_heads, head_dim] over this layer's pools.

        The sequences are ``seq_ids`` in q's packing order; query_start_loc, scale and
        out are as in the kernel contract. The read goes through
        ``paged_attention_dispatch``, so the backend is the one the engine would run.
        """
        return paged_attention_dispatch(
            q,
            self.k_caches[layer],
            self.v_caches[layer],
            self.block_table(seq_ids),
            self.seq_lens(seq_ids),
            query_start_loc,
            scale,
            out,
            backend=self.backend,
        )
