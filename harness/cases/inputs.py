"""Deterministic paged inputs for one case, shared by its backends: the pool as a busy engine leaves it (blocks
shuffled or in order, an optional shared prefix, spare blocks, NaN in every slot no sequence owns), values from
:func:`draw_normal`, the same whatever the thread count or device."""

import hashlib
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from harness.cases.variants import VARIANTS
from harness.cases.vocab import DTYPES, Layout
from kernels.tiling import is_latent_view


@dataclass(frozen=True)
class PagedInputs:
    """One call's arguments, plus the logical (unpaged) KV the cache backend writes (:attr:`keys`, :attr:`values`)."""

    q: torch.Tensor  # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim], NaN where unowned
    v_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim_v], NaN where unowned
    block_table: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, -1 past each sequence's blocks
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    # The variants' keywords of every call (sinks / alibi_slopes [num_q_heads] fp32; k_scale / v_scale
    # [num_kv_heads] fp32); empty: plain causal attention.
    options: dict[str, Any] = field(default_factory=dict)
    unquantized: tuple[torch.Tensor, torch.Tensor] | None = None  # an fp8 case's pools before quantizing

    @property
    def keys(self) -> tuple[torch.Tensor, ...]:
        """Each sequence's keys [seq_len, num_kv_heads, head_dim] in q's dtype (a fresh gather)."""
        return self._sequences(self.k_cache if self.unquantized is None else self.unquantized[0])

    @property
    def values(self) -> tuple[torch.Tensor, ...]:
        """Each sequence's values [seq_len, num_kv_heads, head_dim_v] in q's dtype (a fresh gather)."""
        return self._sequences(self.v_cache if self.unquantized is None else self.unquantized[1])

    def _sequences(self, pool: torch.Tensor) -> tuple[torch.Tensor, ...]:
        lens = self.seq_lens.tolist()
        slots = token_slots(self.block_table.cpu(), lens, pool.shape[1]).to(pool.device)
        return tuple(pool.reshape(-1, *pool.shape[2:])[slots].split(lens))

    def args(self) -> tuple[torch.Tensor, ...]:
        """The positional arguments of the kernel contract, in order."""
        return (self.q, self.k_cache, self.v_cache, self.block_table, self.seq_lens, self.query_start_loc)

    def new_out(self) -> torch.Tensor:
        """A NaN-filled output buffer: [num_tokens, num_q_heads, head_dim_v] in q's dtype, on q's device."""
        shape = (*self.q.shape[:2], self.v_cache.shape[-1])
        return torch.full(shape, float("nan"), dtype=self.q.dtype, device=self.q.device)

    def to(self, device: torch.device | str) -> "PagedInputs":
        """These inputs with every tensor (the options' and the unquantized pools' too) on ``device``."""

        def move(x: Any) -> Any:
            return x.to(device) if isinstance(x, torch.Tensor) else x

        unquantized = None if self.unquantized is None else (move(self.unquantized[0]), move(self.unquantized[1]))
        options = {name: move(value) for name, value in self.options.items()}
        q, k_cache, v_cache, *rest = map(move, self.args())
        if is_latent_view(self.k_cache, self.v_cache):  # one cache stays one cache: V a view of the moved K
            v_cache = k_cache[..., : self.v_cache.shape[-1]]
        return PagedInputs(q, k_cache, v_cache, *rest, options=options, unquantized=unquantized)

    def dequantized_args(self) -> tuple[torch.Tensor, ...]:
        """args() with an fp8 case's pools as fp32 ``k_cache.float() * k_scale`` (the values the oracle attends over)."""
        if "k_scale" not in self.options:
            return self.args()
        k = self.k_cache.float() * self.options["k_scale"][:, None]
        v = self.v_cache.float() * self.options["v_scale"][:, None]
        return (self.q, k, v, *self.args()[3:])


def shared_prefix_blocks(seq_lens: list[int] | tuple[int, ...], block_size: int, layout: str) -> int:
    """Blocks every sequence shares: under "shared_prefix" with two or more sequences, [40, 90] by 16 -> 2; else 0."""
    return min(seq_lens) // block_size if layout == "shared_prefix" and len(seq_lens) > 1 else 0


def assign_blocks(seq_lens: list[int], block_size: int, layout: Layout, generator: torch.Generator) -> tuple[torch.Tensor, int]:  # fmt: skip
    """Block table [num_seqs, max_blocks] int32 (-1 padded) and the pool's num_blocks; "shared_prefix" shares
    the first :func:`shared_prefix_blocks`, and a spare eighth of the pool (at least one block) stays unowned."""
    per_seq = [-(-n // block_size) for n in seq_lens]
    shared = shared_prefix_blocks(seq_lens, block_size, layout)
    num_owned = shared + sum(n - shared for n in per_seq)
    num_blocks = num_owned + max(1, num_owned // 8)
    order = torch.arange(num_blocks) if layout == "contiguous" else torch.randperm(num_blocks, generator=generator)
    table = torch.full((len(seq_lens), max(per_seq, default=0) or 1), -1, dtype=torch.int32)
    next_free = shared
    for row, n in enumerate(per_seq):
        table[row, :n] = torch.cat([order[:shared], order[next_free : next_free + n - shared]]).to(torch.int32)
        next_free += n - shared
    return table, num_blocks


CHUNK_VALUES = 2**20  # values per chunk of a draw (whole rows: at least one row)


def chunk_seed(seed: int, name: str, chunk: int) -> int:
    """The 63-bit seed of chunk ``chunk`` of the tensor ``name``: blake2b of "seed/name/chunk"."""
    digest = hashlib.blake2b(f"{seed}/{name}/{chunk}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def draw_normal(name: str, shape: tuple[int, ...], seed: int, write: Callable[[int, torch.Tensor], None],
                dtype: torch.dtype, scale: float = 1.0, threads: int = 1) -> None:  # fmt: skip
    """Standard normals times ``scale`` in ``dtype`` for a tensor of ``shape`` [rows, ...]: chunk c (whole rows, about
    CHUNK_VALUES values) drawn in fp32 from :func:`chunk_seed` (seed, name, c), handed to ``write(first, rows)``."""
    rows, row_shape = shape[0], shape[1:]
    per_chunk = max(1, CHUNK_VALUES // max(1, math.prod(row_shape)))
    chunks = range(-(-rows // per_chunk))

    def one(chunk: int) -> None:
        generator = torch.Generator().manual_seed(chunk_seed(seed, name, chunk))
        values = torch.randn(min(per_chunk, rows - chunk * per_chunk), *row_shape, generator=generator)
        write(chunk * per_chunk, values.mul_(scale).to(dtype))

    intra_op = torch.get_num_threads()
    torch.set_num_threads(1)  # each chunk's ops run serially: idle OpenMP threads would spin on the pool's cores
    try:
        if threads <= 1 or len(chunks) <= 1:
            for chunk in chunks:
                one(chunk)
        else:
            with ThreadPoolExecutor(min(threads, len(chunks))) as pool:
                list(pool.map(one, chunks))  # list(): a chunk's exception is raised here
    finally:
        torch.set_num_threads(intra_op)


def token_positions(seq_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, position) of every token of every sequence, in order: two [sum(seq_lens)] int64
    tensors on the CPU. Example: seq_lens [2, 3]: ([0, 0, 1, 1, 1], [0, 1, 0, 1, 2])."""
    lens = torch.tensor(seq_lens, dtype=torch.long)
    seq = torch.repeat_interleave(torch.arange(len(seq_lens)), lens)
    return seq, torch.arange(int(lens.sum())) - (lens.cumsum(0) - lens)[seq]


def token_slots(block_table: torch.Tensor, seq_lens: list[int], block_size: int) -> torch.Tensor:
    """[sum(seq_lens)] int64 on the CPU: the pool slot of every token of every sequence, in order; token p of
    sequence s sits at slot ``block_table[s, p // block_size] * block_size + p % block_size``."""
    seq, pos = token_positions(seq_lens)
    return block_table.long()[seq, pos // block_size] * block_size + pos % block_size


def make_inputs(
    *, num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int, seq_lens: list[int], q_lens: list[int],
    dtype: str | torch.dtype = "float32", layout: Layout = "shuffled", input_scale: float = 1.0, seed: int = 0,
    device: torch.device | str = "cpu", head_dim_v: int | None = None, draw_threads: int | None = None, **variants: Any,
) -> PagedInputs:  # fmt: skip
    """A case's inputs from its seed, drawn on the CPU (q and K times ``input_scale``) and moved to ``device``;
    ``variants``: the variants' case fields, each turned on applying its input hook (no drawn value changes)."""
    if len(seq_lens) != len(q_lens):
        raise ValueError(f"seq_lens has {len(seq_lens)} entries but q_lens has {len(q_lens)}")
    defaults = {name: declared[1].default for v in VARIANTS for name, declared in v.fields.items()}
    if unknown := sorted(set(variants) - set(defaults)):
        raise TypeError(f"make_inputs got unexpected keyword(s) {unknown}; the variants' case fields: {list(defaults)}")
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    generator = torch.Generator().manual_seed(seed)
    table, num_blocks = assign_blocks(seq_lens, block_size, layout, generator)
    threads = draw_threads or torch.get_num_threads()
    q = torch.empty(sum(q_lens), num_q_heads, head_dim, dtype=torch_dtype)
    draw_normal("q", q.shape, seed, lambda i, rows: q[i : i + len(rows)].copy_(rows), torch_dtype, input_scale, threads)
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    num_slots = num_blocks * block_size
    # NaN stays in every slot no sequence owns; the draws below fill every owned one.
    k_slots = torch.full((num_slots, num_kv_heads, head_dim), float("nan"), dtype=torch_dtype)
    v_slots = torch.full((num_slots, num_kv_heads, head_dim_v), float("nan"), dtype=torch_dtype)
    slots = token_slots(table, seq_lens, block_size)  # [total_kv_tokens]: token i of the logical KV -> its slot
    first_writer = None  # a shared prefix block keeps the first sequence's values; later ones' rows are dropped
    if shared := shared_prefix_blocks(seq_lens, block_size, layout):
        seq, pos = token_positions(seq_lens)
        first_writer = (pos >= shared * block_size) | (seq == 0)

    def into_pool(pool: torch.Tensor) -> Callable[[int, torch.Tensor], None]:
        def write(first: int, rows: torch.Tensor) -> None:
            where = slots[first : first + rows.shape[0]]
            if first_writer is not None:
                keep = first_writer[first : first + rows.shape[0]]
                where, rows = where[keep], rows[keep]
            pool.index_copy_(0, where, rows)  # chunks own disjoint slots: the threads never overlap

        return write

    total_kv = len(slots)
    draw_normal("k", (total_kv, num_kv_heads, head_dim), seed, into_pool(k_slots), torch_dtype, input_scale, threads)
    draw_normal("v", (total_kv, num_kv_heads, head_dim_v), seed, into_pool(v_slots), torch_dtype, 1.0, threads)
    query_start_loc = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.tensor(q_lens, dtype=torch.int32).cumsum(0)
    pool = (num_blocks, block_size, num_kv_heads)
    inputs = PagedInputs(q, k_slots.view(*pool, head_dim), v_slots.view(*pool, head_dim_v), table,
                         torch.tensor(seq_lens, dtype=torch.int32), query_start_loc)  # fmt: skip
    fields = SimpleNamespace(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                             **{**defaults, **variants, "head_dim_v": head_dim_v})  # fmt: skip
    for variant in VARIANTS:  # on the CPU, so an input is the same on every device
        if variant.inputs is not None and variant.turned_on(fields):
            inputs = variant.inputs(inputs, fields)
    return inputs.to(device)
