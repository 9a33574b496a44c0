"""A paged KV cache as an engine keeps one: pools per layer, a block allocator, writes through a slot mapping,
a block table kept on the device, and an attention read that goes through the dispatcher.

A slot is ``block * block_size + offset``: with block_size 16, a sequence whose blocks are [7, 2, 9] keeps token
40 in slot 9 * 16 + 8 = 152. The device table has one row per live sequence, updated as blocks are handed out, so
a step's metadata (docs/contract.md, "The engine's path") gathers its rows instead of rebuilding the table.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass

import torch

from .contract import check_kv_scale, checks_enabled
from .dispatch import paged_attention_dispatch
from .fp8 import FP8_DTYPES, quantize_kv


class CacheFullError(RuntimeError):
    """The pool has too few free blocks for a request; nothing was changed."""


@dataclass(frozen=True)
class StepMetadata:
    """One step's read metadata, built once by :meth:`PagedKVCache.step_metadata` and shared by every layer's read.

    block_table     [num_seqs, max_blocks_per_seq] int32 on the cache's device, -1 past each
                    sequence's blocks (max_blocks_per_seq: the cache's table width)
    seq_lens        [num_seqs] int32 on the device
    query_start_loc [num_seqs + 1] int32 on the device, or None: one query per sequence (decode)
    max_q_len       host int, an upper bound of every q_len (None: unknown, a device-only
                    query_start_loc); a launch hint, never read from the device
    max_seq_len     host int, the longest seq_len; a launch hint
    seq_ids         the sequences, in q's packing order
    """

    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor | None
    max_q_len: int | None
    max_seq_len: int
    seq_ids: tuple[int, ...]


class PagedKVCache:
    """KV pools for ``num_layers`` layers sharing one block allocator.

    k_caches[layer]: [num_blocks, block_size, num_kv_heads, head_dim]; v_caches[layer] the same with head_dim_v
    (default head_dim). Floating pools start NaN and freed blocks are NaN again, so a read of a slot no live
    sequence owns shows in the output. An fp8 ``dtype`` makes fp8 pools: :meth:`write` stores ``key / k_scale``
    saturated (``k_scale`` / ``v_scale`` a float, or [num_kv_heads] fp32; default 1.0), and reads pass the scales
    on. max_seqs, max_blocks_per_seq: the device table's size; given, it never moves (what a captured CUDA graph
    needs) and outgrowing it is a CacheFullError; left out, it grows by doubling.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float16, device: torch.device | str = "cpu", backend: str | None = None,
                 max_seqs: int | None = None, max_blocks_per_seq: int | None = None,
                 k_scale: float | torch.Tensor | None = None, v_scale: float | torch.Tensor | None = None,
                 head_dim_v: int | None = None):  # fmt: skip
        if min(num_layers, num_blocks, block_size, num_kv_heads, head_dim) < 1:
            raise ValueError("num_layers, num_blocks, block_size, num_kv_heads and head_dim must all be >= 1")
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        v_shape = (*shape[:3], head_dim if head_dim_v is None else head_dim_v)
        if v_shape[3] < 1:
            raise ValueError(f"head_dim_v must be >= 1, got {head_dim_v}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_layers = num_layers
        self.backend = backend
        self.device = torch.device(device)
        kv_fp8 = dtype in FP8_DTYPES
        # [num_kv_heads] fp32 on the device for an fp8 cache (None otherwise); checked as a call checks them.
        self.k_scale = check_kv_scale("k_scale", k_scale, kv_fp8, num_kv_heads, self.device)
        self.v_scale = check_kv_scale("v_scale", v_scale, kv_fp8, num_kv_heads, self.device)
        self.k_caches = [torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_caches = [torch.full(v_shape, float("nan"), dtype=dtype, device=device) for _ in range(num_layers)]
        self._free_blocks = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self._owned = torch.zeros(num_blocks, dtype=torch.bool)  # host: blocks some live sequence holds
        self._blocks: dict[int, list[int]] = {}
        self._lens: dict[int, int] = {}
        # The device-resident table: row _rows[seq_id] holds that sequence's blocks, -1 after.
        self._fixed_size = (max_seqs, max_blocks_per_seq)
        self._table = torch.full((max_seqs or 8, max_blocks_per_seq or 4), -1, dtype=torch.int32, device=device)
        self._device_lens = torch.zeros(self._table.shape[0], dtype=torch.int32, device=device)
        self._rows: dict[int, int] = {}
        self._free_rows = list(range(self._table.shape[0] - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    # --- allocator ---------------------------------------------------------------------

    def allocate(self, seq_id: int) -> None:
        """Start an empty sequence (and give it a row of the device table)."""
        if seq_id in self._blocks:
            raise ValueError(f"sequence {seq_id} is already allocated")
        if not self._free_rows:
            self._grow(rows=2 * self._table.shape[0])
        self._rows[seq_id] = self._free_rows.pop()
        self._blocks[seq_id] = []
        self._lens[seq_id] = 0

    def append(self, seq_id: int, num_tokens: int) -> torch.Tensor:
        """Reserve slots for ``num_tokens`` (>= 0) more tokens of ``seq_id``: the slot mapping, [num_tokens] int64
        on the CPU, for :meth:`write`. A bad count (ValueError) or too few blocks (CacheFullError) changes nothing."""
        if seq_id not in self._blocks:
            raise KeyError(f"sequence {seq_id} is not allocated")
        try:
            count = operator.index(num_tokens)
        except TypeError:
            count = -1
        if count < 0 or isinstance(num_tokens, bool | torch.Tensor):
            raise ValueError(f"num_tokens must be a non-negative int, got {num_tokens!r}")
        num_tokens = count
        old_len = self._lens[seq_id]
        new_len = old_len + num_tokens
        blocks = self._blocks[seq_id]
        needed = -(-new_len // self.block_size) - len(blocks)
        if needed > len(self._free_blocks):
            raise CacheFullError(
                f"sequence {seq_id} needs {needed} more blocks for {num_tokens} tokens "
                f"but only {len(self._free_blocks)} of {self.num_blocks} are free"
            )
        width = len(blocks) + needed
        if width > self._table.shape[1]:
            self._grow(width=max(width, 2 * self._table.shape[1]))
        new_blocks = [self._free_blocks.pop() for _ in range(needed)]
        row = self._rows[seq_id]
        if new_blocks:
            self._owned[new_blocks] = True
            self._table[row, len(blocks) : width] = self._upload(torch.tensor(new_blocks, dtype=torch.int32))
        blocks.extend(new_blocks)
        self._lens[seq_id] = new_len
        self._device_lens[row] = new_len
        positions = torch.arange(old_len, new_len)
        block_ids = torch.tensor(blocks, dtype=torch.int64)[positions // self.block_size]
        return block_ids * self.block_size + positions % self.block_size

    def free(self, seq_id: int) -> None:
        """Return the sequence's blocks to the pool, poisoned with NaN again."""
        blocks = self._blocks.pop(seq_id)
        del self._lens[seq_id]
        row = self._rows.pop(seq_id)
        self._table[row] = -1
        self._device_lens[row] = 0
        self._free_rows.append(row)
        if blocks:
            self._owned[blocks] = False
            index = torch.tensor(blocks, device=self.device)
            for pool in (*self.k_caches, *self.v_caches):
                if pool.is_floating_point():
                    pool[index] = float("nan")
        self._free_blocks.extend(reversed(blocks))

    def _grow(self, rows: int | None = None, width: int | None = None) -> None:
        rows, width = rows or self._table.shape[0], width or self._table.shape[1]
        fixed_rows, fixed_width = self._fixed_size
        if (fixed_rows and rows > fixed_rows) or (fixed_width and width > fixed_width):
            raise CacheFullError(
                f"the device block table was fixed at max_seqs={fixed_rows}, max_blocks_per_seq={fixed_width}; "
                f"this needs {rows} rows of {width} blocks"
            )
        old_rows, old_width = self._table.shape
        table = torch.full((rows, width), -1, dtype=torch.int32, device=self.device)
        table[:old_rows, :old_width] = self._table
        lens = torch.zeros(rows, dtype=torch.int32, device=self.device)
        lens[:old_rows] = self._device_lens
        self._table, self._device_lens = table, lens
        self._free_rows = list(range(rows - 1, old_rows - 1, -1)) + self._free_rows

    def _upload(self, host: torch.Tensor) -> torch.Tensor:
        """A host tensor on the cache's device without a sync: staged in pinned memory, copied async."""
        if self.device.type != "cuda" or host.device.type != "cpu":
            return host.to(self.device)
        return host.pin_memory().to(self.device, non_blocking=True)

    # --- writes ------------------------------------------------------------------------

    def _check_layer(self, layer: int) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")
        return layer

    def write(self, layer: int, slot_mapping: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
              check: bool | None = None) -> None:  # fmt: skip
        """Store key/value [num_tokens, num_kv_heads, head_dim] at slot_mapping [num_tokens] (integer dtype).

        A bad argument, or a slot in a block no live sequence owns, is refused with a ValueError naming it before
        anything is written. The slots are read on the host: always for a CPU slot_mapping (what :meth:`append`
        returns), for a device one (a sync) only when value checks are on (``check``, else $PAGED_ATTENTION_CHECK).
        """
        k_pool, v_pool = self.k_caches[self._check_layer(layer)], self.v_caches[layer]
        dtype = slot_mapping.dtype
        if slot_mapping.dim() != 1 or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise ValueError(f"slot_mapping must be a 1-d integer tensor, got {dtype} {tuple(slot_mapping.shape)}")
        for name, tensor, pool in (("key", key, k_pool), ("value", value, v_pool)):
            expected = (slot_mapping.shape[0], *pool.shape[2:])
            if tuple(tensor.shape) != expected:
                raise ValueError(
                    f"{name} must be [num_tokens, num_kv_heads, head_dim] = {list(expected)}, got {list(tensor.shape)}"
                )
        if slot_mapping.device.type == "cpu" or checks_enabled(check):
            self._check_slots(slot_mapping)
        slots = slot_mapping.to(k_pool.device, torch.int64)
        if self.k_scale is not None:  # an fp8 pool: quantize on write
            key, value = quantize_kv(key, self.k_scale, k_pool.dtype), quantize_kv(value, self.v_scale, v_pool.dtype)
        k_pool.view(-1, *k_pool.shape[2:])[slots] = key.to(k_pool.dtype)
        v_pool.view(-1, *v_pool.shape[2:])[slots] = value.to(v_pool.dtype)

    def _check_slots(self, slot_mapping: torch.Tensor) -> None:
        slots = slot_mapping.to("cpu", torch.int64)
        num_slots = self.num_blocks * self.block_size
        outside = (slots < 0) | (slots >= num_slots)
        if bool(outside.any()):
            bad = int(slots[outside][0])
            raise ValueError(f"slot_mapping holds slot {bad}, outside [0, num_blocks * block_size = {num_slots})")
        unowned = ~self._owned[slots // self.block_size]
        if bool(unowned.any()):
            bad = int(slots[unowned][0])
            raise ValueError(
                f"slot_mapping holds slot {bad} of block {bad // self.block_size}, which no live sequence owns "
                "(slots come from append())"
            )

    # --- reads -------------------------------------------------------------------------

    def block_table(self, seq_ids: list[int]) -> torch.Tensor:
        """[len(seq_ids), the longest one's blocks] int32, -1 past each sequence's last block, built on the host."""
        width = max((len(self._blocks[s]) for s in seq_ids), default=0) or 1
        table = torch.full((len(seq_ids), width), -1, dtype=torch.int32)
        for row, seq_id in enumerate(seq_ids):
            blocks = self._blocks[seq_id]
            table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        return table.to(self.device)

    def seq_lens(self, seq_ids: list[int]) -> torch.Tensor:
        """[len(seq_ids)] int32 KV lengths, built on the host."""
        return torch.tensor([self._lens[s] for s in seq_ids], dtype=torch.int32, device=self.device)

    def step_metadata(self, seq_ids, query_start_loc: torch.Tensor | None = None, *,
                      into: StepMetadata | None = None) -> StepMetadata:  # fmt: skip
        """One step's metadata for the sequences ``seq_ids`` (q's packing order); reads no device value.

        query_start_loc [len(seq_ids) + 1] int32, or None for one query per sequence; a CPU one also gives the
        max_q_len hint. into: an earlier step's metadata of as many sequences (and the same kind of
        query_start_loc), refilled in place, so a CUDA graph captured with its tensors replays this step (its
        baked-in launch hints cost speed, never correctness).
        """
        seq_ids = tuple(seq_ids)
        missing = [s for s in seq_ids if s not in self._rows]
        if missing:
            raise KeyError(f"sequences {missing} are not allocated")
        rows = self._upload(torch.tensor([self._rows[s] for s in seq_ids], dtype=torch.int64))
        max_q_len = 1 if query_start_loc is None else None
        if query_start_loc is not None:
            if query_start_loc.shape != (len(seq_ids) + 1,) or query_start_loc.dtype != torch.int32:
                raise ValueError(
                    f"query_start_loc must be int32 [num_seqs + 1] = [{len(seq_ids) + 1}], "
                    f"got {query_start_loc.dtype} {tuple(query_start_loc.shape)}"
                )
            if query_start_loc.device.type == "cpu":
                max_q_len = int((query_start_loc[1:] - query_start_loc[:-1]).max()) if seq_ids else 0
            query_start_loc = self._upload(query_start_loc)
        max_seq_len = max((self._lens[s] for s in seq_ids), default=0)
        if into is None:
            table, lens = self._table.index_select(0, rows), self._device_lens.index_select(0, rows)
            return StepMetadata(table, lens, query_start_loc, max_q_len, max_seq_len, seq_ids)
        shape = (len(seq_ids), self._table.shape[1])
        if into.block_table.shape != shape or (into.query_start_loc is None) != (query_start_loc is None):
            raise ValueError(
                f"into holds {tuple(into.block_table.shape)} tables and query_start_loc "
                f"{'None' if into.query_start_loc is None else 'given'}; this step needs "
                f"{shape} and {'None' if query_start_loc is None else 'given'}"
            )
        torch.index_select(self._table, 0, rows, out=into.block_table)
        torch.index_select(self._device_lens, 0, rows, out=into.seq_lens)
        if query_start_loc is not None:
            into.query_start_loc.copy_(query_start_loc)
        return dataclasses.replace(into, max_q_len=max_q_len, max_seq_len=max_seq_len, seq_ids=seq_ids)

    def paged_attention(
        self, layer, q, seqs, query_start_loc=None, scale=None, out=None, *, check: bool | None = None, **variants
    ) -> torch.Tensor:
        """Attention of q [num_tokens, num_q_heads, head_dim] over this layer's pools, through the dispatcher.
        ``seqs``: a :class:`StepMetadata` (the engine's path: no host sync) or sequence ids in q's packing order;
        the rest goes to ``paged_attention_dispatch`` as the kernel contract has it."""
        self._check_layer(layer)
        if isinstance(seqs, StepMetadata):
            if query_start_loc is not None:
                raise ValueError("query_start_loc is part of the StepMetadata; pass it to step_metadata()")
            meta = seqs
        else:
            meta = self.step_metadata(seqs, query_start_loc)
        scales = {} if self.k_scale is None else {"k_scale": self.k_scale, "v_scale": self.v_scale}
        return paged_attention_dispatch(
            q, self.k_caches[layer], self.v_caches[layer], meta.block_table, meta.seq_lens, meta.query_start_loc,
            scale, out, backend=self.backend, max_q_len=meta.max_q_len, max_seq_len=meta.max_seq_len, check=check,
            **variants, **scales,
        )  # fmt: skip
