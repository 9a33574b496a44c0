"""The peer ``flex_paged``: FlexAttention reading the paged pool itself (viewed as one key sequence), steered by a
BlockMask built from the block table, whose KV block is the page; docs/performance.md says how it is built and timed."""

import math
from dataclasses import dataclass

import torch

from harness.backends.peers import compiled_flex, flex_unavailable, padded_q
from harness.backends.registry import Backend, Prepared, Unsupported, add_backend
from harness.cases.inputs import PagedInputs
from harness.cases.spec import Case

PER_SEQUENCE_MAX_Q = 64  # every q_len at most this: one query block per sequence
PACKED_Q_BLOCK = 128  # FlexAttention's default Q block; a multiple of every default BLOCK_M


@dataclass(frozen=True)
class QueryRows:
    q: torch.Tensor  # [batch, num_q_heads, rows, head_dim], what flex_attention is given
    row_seq: torch.Tensor  # [batch, rows] int32, the row's sequence; -1 for a padding row
    row_pos: torch.Tensor  # [batch, rows] int32, the row's query position in its sequence; -1 for padding
    q_block: int  # the BlockMask's Q_BLOCK_SIZE
    form: str  # "packed" or "per_sequence"

    def to_packed(self, o: torch.Tensor) -> torch.Tensor:
        """flex_attention's [batch, num_q_heads, rows, head_dim] -> [num_tokens, num_q_heads, head_dim]."""
        return o.transpose(1, 2)[self.row_seq >= 0]


def query_rows(inputs: PagedInputs, group_size: int) -> QueryRows:
    """The packed view of q, or q padded per sequence when every q_len <= PER_SEQUENCE_MAX_Q."""
    seq_lens = inputs.seq_lens.long()
    starts = inputs.query_start_loc.long()
    q_lens = starts[1:] - starts[:-1]
    max_q = int(q_lens.max()) if len(q_lens) else 0
    if max_q > PER_SEQUENCE_MAX_Q:
        seq = torch.repeat_interleave(torch.arange(len(q_lens), device=q_lens.device), q_lens)
        pos = (seq_lens - q_lens)[seq] + torch.arange(len(seq), device=seq.device) - starts[seq]  # in its sequence
        q = inputs.q.permute(1, 0, 2)[None]  # a view: [1, num_q_heads, num_tokens, head_dim]
        return QueryRows(q, seq[None].int(), pos[None].int(), PACKED_Q_BLOCK, "packed")
    q, real, q_pos = padded_q(inputs)
    seq = torch.where(real, torch.arange(len(q_lens), device=q_lens.device)[:, None], -1)
    # flex's decoding kernel needs its BLOCK_M (max_q_len * group, to a power of two) to divide Q_BLOCK_SIZE
    q_block = max(PACKED_Q_BLOCK, 1 << (max(max_q, 1) * group_size - 1).bit_length())
    return QueryRows(q.contiguous(), seq.int(), torch.where(real, q_pos, -1).int(), q_block, "per_sequence")


def page_logical_table(block_table: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int, block_size: int):
    """[num_blocks] int32: each physical page's logical block index, -1 where nobody owns it; Unsupported when a
    page sits at two logical indices (a slot then has no single position for a mask_mod)."""
    col = torch.arange(block_table.shape[1], device=block_table.device)
    owned = (col[None, :] < (seq_lens.long()[:, None] + block_size - 1) // block_size) & (block_table >= 0)
    pages = block_table.long()[owned]
    logical = col.expand_as(block_table)[owned]
    table = torch.full((num_blocks,), -1, dtype=torch.long, device=block_table.device)
    table[pages] = logical
    if not bool((table[pages] == logical).all()):
        raise Unsupported("a physical page sits at two logical positions; no slot-to-position map exists")
    return table.int()


def paged_block_mask(rows: QueryRows, block_table: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int,
                     block_size: int, sliding_window: int | None):  # fmt: skip
    """(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices) for BlockMask.from_kv_blocks: [batch,
    1, num_q_blocks] and [batch, 1, num_q_blocks, num_blocks] int32, pages listed first in increasing order.
    A page is partial where the last page, the diagonal or a window edge cuts it."""
    batch, num_rows = rows.row_seq.shape
    device = rows.row_seq.device
    num_q_blocks = -(-num_rows // rows.q_block)
    seq, pos = rows.row_seq.long(), rows.row_pos.long()
    block = (torch.arange(num_rows, device=device) // rows.q_block).expand(batch, -1)
    cell = torch.arange(batch, device=device)[:, None] * num_q_blocks + block  # (batch, q block), flat
    rows_in_cell = torch.zeros(batch * num_q_blocks, dtype=torch.long, device=device)
    rows_in_cell.scatter_add_(0, cell.reshape(-1), torch.ones_like(cell).reshape(-1))
    real = seq >= 0
    num_seqs = block_table.shape[0]
    key = (cell * num_seqs + seq)[real]  # one entry per (cell, sequence) with rows in the cell
    pairs, which = torch.unique(key, return_inverse=True)
    lo = torch.full_like(pairs, torch.iinfo(torch.long).max).scatter_reduce(0, which, pos[real], "amin")
    hi = torch.full_like(pairs, -1).scatter_reduce(0, which, pos[real], "amax")
    count = torch.zeros_like(pairs).scatter_add(0, which, torch.ones_like(which))
    pair_cell, pair_seq = pairs // num_seqs, pairs % num_seqs
    length = seq_lens.long()[pair_seq][:, None]
    first = torch.arange(block_table.shape[1], device=device)[None, :] * block_size  # [1, max_blocks]
    last = torch.minimum(first + block_size, length) - 1
    lo, hi = lo[:, None], hi[:, None]
    visible = (first < length) & (first <= hi)
    full = visible & (count == rows_in_cell[pair_cell])[:, None] & (first + block_size <= length) & (last <= lo)
    if sliding_window is not None:
        visible &= last > lo - sliding_window
        full &= first > hi - sliding_window
    # Scatter into [cell, page] maps. A page is marked at most once per (cell, sequence) and
    # is full only where the cell holds one sequence, so the two maps never overlap.
    slot = pair_cell[:, None] * num_blocks + block_table.long()[pair_seq].clamp(min=0)  # [pairs, max_blocks]
    partial = torch.zeros(batch * num_q_blocks * num_blocks, dtype=torch.bool, device=device)
    complete = torch.zeros_like(partial)
    partial[slot[visible & ~full]] = True
    complete[slot[full]] = True

    def listed(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = chosen.view(batch * num_q_blocks, num_blocks)
        indices = torch.argsort((~chosen).to(torch.uint8), dim=-1, stable=True)  # chosen pages first, in order
        shape = (batch, 1, num_q_blocks)
        return chosen.sum(-1).int().view(shape), indices.int().view(*shape, num_blocks)

    return (*listed(partial), *listed(complete))


def kernel_options_for(block_size: int, device: torch.device, form: str = "per_sequence") -> dict:
    """Triton kernel options for a page size and query form (none on the CPU). BLOCK_N must divide the page
    and be at least 16 (tl.dot): pages not a multiple of 128 get gcd(page, 64). The packed form forces the
    main kernel (flex's decoding kernel needs its BLOCK_M to divide Q_BLOCK_SIZE = 128)."""
    if device.type != "cuda":
        return {}
    if block_size % 16:
        raise Unsupported(f"FlexAttention's Triton kernel needs the page size a multiple of 16, not {block_size}")
    options = {} if block_size % 128 == 0 else {"BLOCK_N": math.gcd(block_size, 64)}
    if form == "packed":
        options["FORCE_USE_FLEX_ATTENTION"] = True
    return options


def paged_flex_mask(case: Case, inputs: PagedInputs):
    """(query rows, BlockMask, page_logical: the inverse page table) for a case, built before timing."""
    from torch.nn.attention.flex_attention import BlockMask

    num_blocks, block_size = inputs.k_cache.shape[:2]
    rows = query_rows(inputs, case.group_size)
    page_logical = page_logical_table(inputs.block_table, inputs.seq_lens, num_blocks, block_size)
    window = case.sliding_window
    masks = paged_block_mask(rows, inputs.block_table, inputs.seq_lens, num_blocks, block_size, window)
    block_table, row_seq, row_pos = inputs.block_table, rows.row_seq, rows.row_pos

    def mask_mod(b, h, q_idx, kv_idx):
        seq, p = row_seq[b, q_idx], row_pos[b, q_idx]
        page = kv_idx // block_size
        logical = page_logical[page]
        key_pos = logical * block_size + kv_idx % block_size
        owner = block_table[seq.clamp(min=0), logical.clamp(min=0)] == page
        seen = (seq >= 0) & (logical >= 0) & owner & (key_pos <= p)
        return seen if window is None else seen & (key_pos > p - window)

    block_mask = BlockMask.from_kv_blocks(*masks, BLOCK_SIZE=(rows.q_block, block_size), mask_mod=mask_mod,
                                          seq_lengths=(rows.q.shape[2], num_blocks * block_size))  # fmt: skip
    return rows, block_mask, page_logical


def prepare_flex_paged(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """Build the query rows, the inverse page table and the BlockMask; time one flex_attention call."""
    from torch.nn.attention.flex_attention import flex_attention

    device = inputs.q.device
    num_blocks, block_size, num_kv_heads, head_dim = inputs.k_cache.shape
    rows, block_mask, page_logical = paged_flex_mask(case, inputs)
    kernel_options = kernel_options_for(block_size, device, rows.form)
    cap, slopes, row_pos = case.logit_softcap, inputs.options.get("alibi_slopes"), rows.row_pos

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        if slopes is not None:
            key_pos = page_logical[kv_idx // block_size] * block_size + kv_idx % block_size
            score = score + slopes[h] * (key_pos - row_pos[b, q_idx])
        return score

    def pool(cache: torch.Tensor) -> torch.Tensor:  # [1, num_kv_heads, num_blocks * block_size, head_dim], a view
        return cache.view(num_blocks * block_size, num_kv_heads, head_dim).permute(1, 0, 2)[None]

    k, v = pool(inputs.k_cache), pool(torch.nan_to_num(inputs.v_cache, nan=0.0))
    options = {"block_mask": block_mask, "scale": head_dim**-0.5, "enable_gqa": True}
    if cap is not None or slopes is not None:
        options["score_mod"] = score_mod
    if kernel_options:
        options["kernel_options"] = kernel_options
    attend = flex_attention
    if device.type == "cuda":
        attend = compiled_flex(flex_attention, lambda fn: fn(rows.q, k, v, **options))
    note = (
        f"{rows.form}: q [{', '.join(map(str, rows.q.shape))}], K/V the pool viewed [1, {num_kv_heads}, "
        f"{num_blocks * block_size}, {head_dim}]; BlockMask from the block table (KV block = page {block_size}, "
        f"Q block {rows.q_block}) built before timing; timed: one {'compiled ' if device.type == 'cuda' else ''}"
        f"flex_attention call" + (f"; kernel_options {kernel_options}" if kernel_options else "")
        + ("; score_mod" if "score_mod" in options else "") + "; V read from a copy with the NaN poison zeroed"
    )  # fmt: skip
    return Prepared(run=lambda: attend(rows.q, k, v, **options), to_packed=rows.to_packed, note=note)


def _unavailable(case: Case, device: str) -> str | None:
    if reason := flex_unavailable(case, device):
        return reason
    if case.head_dim < 16:
        return f"FlexAttention's Triton kernel needs head_dim >= 16, not {case.head_dim}"
    if case.block_size % 16:
        return f"FlexAttention's Triton kernel needs the page size a multiple of 16, not {case.block_size}"
    return None


add_backend(Backend("flex_paged", prepare_flex_paged, ("cuda",), "peer",
                    "FlexAttention, compiled, over the paged pool (BlockMask from the block table, KV block = page)",
                    unavailable=_unavailable,
                    variants=frozenset({"sliding_window", "logit_softcap", "alibi_slopes"})))  # fmt: skip
