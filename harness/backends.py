"""Backends the harness runs, each registered with where it runs and why it may not.

A backend's ``prepare(case, inputs, out)`` does its setup outside the timed region
(building a cache, a contiguous copy, a compiled function) and returns a
:class:`Prepared` whose ``run()`` is the call that is graded once and then timed.
Built in: the kernels (reference, tlsim, triton), the engine path (cache), and peers
(gather_sdpa, sdpa_contiguous, flex_attention). Users add their own with
:func:`register_backend`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import kernels

from .cases import Case
from .inputs import PagedInputs


@dataclass(frozen=True)
class Prepared:
    """What a backend times: ``run()``, and how its result becomes [num_tokens, num_q_heads, head_dim]."""

    run: Callable[[], Any]
    to_packed: Callable[[Any], torch.Tensor] = lambda result: result
    note: str = ""  # shown in the report, e.g. which backend a dispatch chose


@dataclass(frozen=True)
class Backend:
    name: str
    prepare: Callable[[Case, PagedInputs, torch.Tensor], Prepared]
    devices: tuple[str, ...]
    kind: str  # "kernel", "engine path", "peer" or "plugin"
    description: str = ""
    graphable: bool = False  # run() can be captured in a CUDA graph (no host syncs)
    unavailable: Callable[[Case, str], str | None] = field(default=lambda case, device: None)

    def skip_reason(self, case: Case, device: str) -> str | None:
        """Why this backend does not run ``case`` on ``device``, or None when it does."""
        device_type = torch.device(device).type
        if device_type not in self.devices:
            return f"{self.name} runs on {', '.join(self.devices)}, not {device_type}"
        if not case.wants(self.name):
            return "excluded by the case file"
        return self.unavailable(case, device)


REGISTRY: dict[str, Backend] = {}


def _contract_prepare(fn: Callable[..., torch.Tensor]) -> Callable[[Case, PagedInputs, torch.Tensor], Prepared]:
    def prepare(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
        args = inputs.args()
        return Prepared(run=lambda: fn(*args, out=out))

    return prepare


def register_backend(
    name: str,
    fn: Callable[..., torch.Tensor],
    devices: tuple[str, ...] = ("cpu", "cuda"),
    *,
    description: str = "",
    graphable: bool = False,
) -> None:
    """Add a kernel with the contract signature to every run that imports this module.

    ``fn(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None,
    out=None)`` must return [num_tokens, num_q_heads, head_dim] in q's dtype. ``devices``
    lists the device types it runs on; elsewhere its rows are skips with that reason.
    Set ``graphable`` when a call has no host synchronisation, so GPU timing may use a
    CUDA graph. Registering a taken name is an error (built-ins cannot be shadowed).
    """
    if name in REGISTRY:
        raise ValueError(f"backend {name!r} is already registered ({REGISTRY[name].kind})")
    REGISTRY[name] = Backend(
        name,
        _contract_prepare(fn),
        tuple(devices),
        "plugin",
        description or (fn.__doc__ or "").strip().split("\n")[0],
        graphable,
    )


def load_plugin(module_or_path: str) -> None:
    """Import a plugin module by dotted name or file path; it calls register_backend.

    Raises ValueError with the cause when the module cannot be found or fails to import.
    """
    path = Path(module_or_path)
    try:
        if path.suffix == ".py" or path.exists():
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {path}")
            module_name = f"harness_plugin_{path.stem}"
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        else:
            importlib.import_module(module_or_path)
    except Exception as error:  # any failure to import is bad input, reported with its cause
        raise ValueError(f"--plugin {module_or_path}: could not import it: {type(error).__name__}: {error}") from error


def _register_builtin(backend: Backend) -> None:
    REGISTRY[backend.name] = backend


# --- the kernels -------------------------------------------------------------------------


def _triton_unavailable(case: Case, device: str) -> str | None:
    if reason := kernels.triton_unavailable_reason(device):
        return reason
    if torch.device(device).type == "cpu" and "small" not in case.tags:
        return "the Triton interpreter is slow: on the CPU it runs only cases tagged 'small'"
    return None


_register_builtin(
    Backend("reference", _contract_prepare(kernels.paged_attention_reference), ("cpu", "cuda"), "kernel",
            "gather each sequence's slots, SDPA in fp32 (the engine's fallback oracle)")
)  # fmt: skip
_register_builtin(
    Backend("tlsim", _contract_prepare(kernels.paged_attention_tlsim), ("cpu", "cuda"), "kernel",
            "the Triton kernel's streaming algorithm in torch")
)  # fmt: skip


def _prepare_triton(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """The kernel with its host-side max_q_len given, as an engine calls it: no device sync, so
    GPU timing can replay it from a CUDA graph. The graded call itself is that same call."""
    args, lengths = inputs.args(), {"max_q_len": max(case.q_lens), "max_seq_len": case.max_seq_len}
    kernels.paged_attention_triton(*args)  # once with every value check, before the sync-free calls
    return Prepared(run=lambda: kernels.paged_attention_triton(*args, out=out, **lengths))


_register_builtin(
    Backend("triton", _prepare_triton, ("cpu", "cuda"), "kernel",
            "the @triton.jit kernel (interpreted on the CPU)", graphable=True, unavailable=_triton_unavailable)
)  # fmt: skip


# --- the engine path ---------------------------------------------------------------------


def _prepare_cache(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """Write every sequence through PagedKVCache's slot mapping; time its dispatched read."""
    device = inputs.q.device
    cache = kernels.PagedKVCache(
        num_layers=1,
        num_blocks=case.blocks_needed,
        block_size=case.block_size,
        num_kv_heads=case.num_kv_heads,
        head_dim=case.head_dim,
        dtype=inputs.q.dtype,
        device=device,
    )
    seq_ids = list(range(case.num_seqs))
    for seq_id, keys, values in zip(seq_ids, inputs.keys, inputs.values, strict=True):
        cache.allocate(seq_id)
        cache.write(0, cache.append(seq_id, keys.shape[0]), keys, values)
    chosen = kernels.select_backend(device)
    return Prepared(
        run=lambda: cache.paged_attention(0, inputs.q, seq_ids, inputs.query_start_loc, out=out),
        note=f"dispatch -> {chosen}",
    )


_register_builtin(
    Backend("cache", _prepare_cache, ("cpu", "cuda"), "engine path",
            "write through PagedKVCache's slot mapping, then its dispatched read")
)  # fmt: skip


# --- peers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Padded:
    """A batch padded to rectangles, for SDPA-style peers.

    q    [num_seqs, num_q_heads, max_q_len, head_dim]
    k/v  [num_seqs, num_kv_heads, max_seq_len, head_dim], zero past each sequence's end
    mask [num_seqs, 1, max_q_len, max_seq_len] bool, True where a query may attend
    rows [num_seqs, max_q_len] bool, True for real (not padding) query rows
    """

    q: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor

    def unpad(self, o: torch.Tensor) -> torch.Tensor:
        """[num_seqs, num_q_heads, max_q_len, head_dim] -> packed [num_tokens, num_q_heads, head_dim]."""
        return o.transpose(1, 2)[self.rows]


def pad_queries(inputs: PagedInputs) -> Padded:
    seq_lens = inputs.seq_lens.long()
    starts = inputs.query_start_loc.long()
    q_lens = starts[1:] - starts[:-1]
    max_q = max(int(q_lens.max()), 1)
    j = torch.arange(max_q, device=seq_lens.device)
    rows = j[None, :] < q_lens[:, None]
    index = (starts[:-1, None] + j[None, :]).clamp(max=max(inputs.q.shape[0] - 1, 0))
    q = torch.where(rows[..., None, None], inputs.q[index], 0).transpose(1, 2)
    keys = torch.arange(int(seq_lens.max()), device=seq_lens.device)
    q_pos = (seq_lens - q_lens)[:, None] + j[None, :]
    mask = (keys[None, None, :] <= q_pos[..., None]) & (keys[None, None, :] < seq_lens[:, None, None])
    return Padded(q=q, mask=mask[:, None], rows=rows)


def gather_padded(cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """[num_seqs, num_kv_heads, max_seq_len, head_dim] copy of each sequence's KV, zeros past its end.

    Zeros, not the pool's NaN: SDPA multiplies masked-out values by a zero weight, and
    0 * NaN would still be NaN.
    """
    block_size = cache.shape[1]
    seq_lens = seq_lens.long()
    pos = torch.arange(int(seq_lens.max()), device=cache.device)
    valid = pos[None, :] < seq_lens[:, None]
    blocks = torch.where(valid, block_table[:, pos // block_size].long(), 0)
    gathered = cache[blocks, (pos % block_size)[None, :].expand_as(blocks)]
    return torch.where(valid[..., None, None], gathered, 0).transpose(1, 2)


def _prepare_gather_sdpa(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """What a user writes by hand: gather the pages each call, then one batched SDPA."""
    padded = pad_queries(inputs)
    scale = case.head_dim**-0.5

    def run() -> torch.Tensor:
        k = gather_padded(inputs.k_cache, inputs.block_table, inputs.seq_lens)
        v = gather_padded(inputs.v_cache, inputs.block_table, inputs.seq_lens)
        return F.scaled_dot_product_attention(padded.q, k, v, attn_mask=padded.mask, scale=scale, enable_gqa=True)

    return Prepared(run=run, to_packed=padded.unpad)


def _padded_batch(inputs: PagedInputs) -> tuple[Padded, torch.Tensor, torch.Tensor]:
    """Padded queries and contiguous padded K and V, made once before timing."""
    k = gather_padded(inputs.k_cache, inputs.block_table, inputs.seq_lens)
    v = gather_padded(inputs.v_cache, inputs.block_table, inputs.seq_lens)
    return pad_queries(inputs), k, v


def _prepare_sdpa_contiguous(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """The non-paged floor: SDPA over a contiguous copy made before timing."""
    padded, k, v = _padded_batch(inputs)
    scale = case.head_dim**-0.5
    return Prepared(
        run=lambda: F.scaled_dot_product_attention(padded.q, k, v, attn_mask=padded.mask, scale=scale, enable_gqa=True),
        to_packed=padded.unpad,
    )


def _prepare_flex(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """FlexAttention (compiled) over the padded batch with a length-and-causal mask_mod."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    padded, k, v = _padded_batch(inputs)
    seq_lens = inputs.seq_lens.long()
    starts = inputs.query_start_loc.long()
    q_offset = seq_lens - (starts[1:] - starts[:-1])

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_offset[b] + q_idx) & (kv_idx < seq_lens[b])

    num_seqs, _, max_q, _ = padded.q.shape
    block_mask = create_block_mask(mask_mod, num_seqs, None, max_q, k.shape[2], device=inputs.q.device)
    compiled = torch.compile(flex_attention, dynamic=False)
    scale = case.head_dim**-0.5
    return Prepared(
        run=lambda: compiled(padded.q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True),
        to_packed=padded.unpad,
    )


def _flex_unavailable(case: Case, device: str) -> str | None:
    try:
        import torch.nn.attention.flex_attention
    except ImportError:
        return f"torch {torch.__version__} has no FlexAttention"
    if not kernels.has_triton():
        return "FlexAttention compiles through Triton, which is not installed"
    return None


_register_builtin(
    Backend("gather_sdpa", _prepare_gather_sdpa, ("cpu", "cuda"), "peer",
            "gather the pages, then batched SDPA (what a user writes by hand)")
)  # fmt: skip
_register_builtin(
    Backend("sdpa_contiguous", _prepare_sdpa_contiguous, ("cpu", "cuda"), "peer",
            "SDPA over a contiguous copy: the non-paged floor", graphable=True)
)  # fmt: skip
_register_builtin(
    Backend("flex_attention", _prepare_flex, ("cuda",), "peer",
            "FlexAttention over the padded batch, compiled", unavailable=_flex_unavailable)
)  # fmt: skip


def resolve_backends(names: list[str] | None) -> list[Backend]:
    """Backends by name (all registered, in registration order, when ``names`` is None)."""
    if not names:
        return list(REGISTRY.values())
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ValueError(f"--backend {unknown[0]}: unknown backend; registered: {', '.join(REGISTRY)}")
    return [REGISTRY[n] for n in names]
