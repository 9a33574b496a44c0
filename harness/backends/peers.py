"""Peers: what the kernel is raced against, each at its best and named for what it is (``flex_paged``
and ``flashinfer`` have modules of their own). On CUDA each row records the kernels it ran."""

import inspect
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from harness.backends.registry import Backend, Prepared, Unsupported, add_backend
from harness.cases.inputs import PagedInputs
from harness.cases.spec import Case
from kernels import has_triton


@dataclass(frozen=True)
class Padded:
    q: torch.Tensor  # [num_seqs, num_q_heads, max_q_len, head_dim]
    mask: torch.Tensor  # [num_seqs, 1, max_q_len, max_seq_len] bool, True where a query may attend
    rows: torch.Tensor  # [num_seqs, max_q_len] bool, True for real (not padding) query rows

    def unpad(self, o: torch.Tensor) -> torch.Tensor:
        """[num_seqs, num_q_heads, max_q_len, head_dim] -> packed [num_tokens, num_q_heads, head_dim]."""
        return o.transpose(1, 2)[self.rows]


def padded_q(inputs: PagedInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q padded per sequence [num_seqs, num_q_heads, max(max_q_len, 1), head_dim] with zero rows, the real rows
    [num_seqs, max_q_len] bool, each row's query position in its sequence [num_seqs, max_q_len] int64)."""
    seq_lens = inputs.seq_lens.long()
    starts = inputs.query_start_loc.long()
    q_lens = starts[1:] - starts[:-1]
    j = torch.arange(max(int(q_lens.max()) if len(q_lens) else 0, 1), device=seq_lens.device)
    rows = j[None, :] < q_lens[:, None]
    index = (starts[:-1, None] + j[None, :]).clamp(max=max(inputs.q.shape[0] - 1, 0))
    q = torch.where(rows[..., None, None], inputs.q[index], 0).transpose(1, 2)
    return q, rows, (seq_lens - q_lens)[:, None] + j[None, :]


def pad_queries(inputs: PagedInputs, sliding_window: int | None = None) -> Padded:
    """The batch padded to max_q_len; the mask is causal, and with ``sliding_window`` W also
    hides keys more than W - 1 positions before each query (docs/contract.md)."""
    q, rows, q_pos = padded_q(inputs)
    seq_lens = inputs.seq_lens.long()
    keys = torch.arange(int(seq_lens.max()), device=seq_lens.device)
    mask = (keys[None, None, :] <= q_pos[..., None]) & (keys[None, None, :] < seq_lens[:, None, None])
    if sliding_window is not None:
        mask &= keys[None, None, :] > q_pos[..., None] - sliding_window
    return Padded(q=q, mask=mask[:, None], rows=rows)


def gather_padded(cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """[num_seqs, num_kv_heads, max_seq_len, head_dim] copy of each sequence's KV, zero (0 * NaN is NaN) past its end"""
    block_size = cache.shape[1]
    seq_lens = seq_lens.long()
    pos = torch.arange(int(seq_lens.max()), device=cache.device)
    valid = pos[None, :] < seq_lens[:, None]
    blocks = torch.where(valid, block_table[:, pos // block_size].long(), 0)
    gathered = cache[blocks, (pos % block_size)[None, :].expand_as(blocks)]
    return torch.where(valid[..., None, None], gathered, 0).transpose(1, 2)


def _prepare_gather_sdpa(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """What a user writes by hand: gather the pages each call, then one batched SDPA (a window in its mask)."""
    padded = pad_queries(inputs, case.sliding_window)
    scale = case.head_dim**-0.5

    def run() -> torch.Tensor:
        k, v = _gathered(inputs)
        return F.scaled_dot_product_attention(padded.q, k, v, attn_mask=padded.mask, scale=scale, enable_gqa=True)

    return Prepared(run=run, to_packed=padded.unpad, note="padded batch, boolean mask, pages gathered per call")


def _gathered(inputs: PagedInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(gather_padded(x, inputs.block_table, inputs.seq_lens) for x in (inputs.k_cache, inputs.v_cache))


def _prepare_sdpa_contiguous(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """The non-paged floor: SDPA over a contiguous copy made before timing, in its fastest form."""
    padded, (k, v) = pad_queries(inputs), (x.contiguous() for x in _gathered(inputs))
    scale = case.head_dim**-0.5
    if len(set(case.q_lens)) > 1 or len(set(case.seq_lens)) > 1 or case.q_lens[0] == 0:
        return Prepared(run=lambda: F.scaled_dot_product_attention(padded.q, k, v, attn_mask=padded.mask, scale=scale,
                                                                   enable_gqa=True),
                        to_packed=padded.unpad, note="ragged lengths: padded to the longest, boolean mask")  # fmt: skip
    q_len, seq_len = case.q_lens[0], case.seq_lens[0]
    num_seqs = case.num_seqs
    q = inputs.q.view(num_seqs, q_len, case.num_q_heads, case.head_dim).transpose(1, 2).contiguous()
    options: dict = {"scale": scale, "enable_gqa": True}
    if q_len == seq_len:
        options["is_causal"] = True
        note = "equal lengths: is_causal, no mask"
    elif q_len > 1:
        from torch.nn.attention.bias import causal_lower_right

        options["attn_mask"] = causal_lower_right(q_len, seq_len)
        note = "equal lengths: lower-right causal bias, no mask tensor"
    else:
        note = "equal lengths, decode: no mask"

    def to_packed(o: torch.Tensor) -> torch.Tensor:
        return o.transpose(1, 2).reshape(num_seqs * q_len, case.num_q_heads, case.head_dim)

    return Prepared(run=lambda: F.scaled_dot_product_attention(q, k, v, **options), to_packed=to_packed, note=note)


def _varlen_attn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _varlen_options(case: Case) -> dict:
    """Causal (lower-right), window (``window_size = (W - 1, 0)``) and GQA options, as this varlen_attn spells them."""
    params = inspect.signature(_varlen_attn()).parameters
    options: dict = {"scale": case.head_dim**-0.5}
    if case.sliding_window is not None and "window_size" not in params:
        raise Unsupported(f"torch {torch.__version__}'s varlen_attn takes no window_size")
    if "window_size" in params:
        options["window_size"] = (-1 if case.sliding_window is None else case.sliding_window - 1, 0)
    elif "is_causal" in params:
        options["is_causal"] = True
    else:
        raise Unsupported(f"torch {torch.__version__}'s varlen_attn takes no causal option")
    if case.group_size > 1 and "enable_gqa" in params:
        options["enable_gqa"] = True
    return options


def _heads_for_varlen(case: Case, kv: torch.Tensor) -> tuple[torch.Tensor, str]:
    """(KV [tokens, num_kv_heads, head_dim] as varlen_attn takes it, a note): without enable_gqa, heads repeated."""
    if case.group_size == 1 or "enable_gqa" in inspect.signature(_varlen_attn()).parameters:
        return kv, ""
    repeated = kv.repeat_interleave(case.group_size, dim=1).contiguous()
    return repeated, "; KV heads repeated (this torch's varlen_attn has no GQA)"


def _varlen_unavailable(case: Case, device: str) -> str | None:
    """Why FlashAttention's varlen kernel cannot take this case, by its documented limits (a broken call errors)."""
    if _varlen_attn() is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"
    if case.dtype == "float32":
        return "FlashAttention's varlen kernel takes fp16/bf16 only"
    if case.head_dim > 256 or case.head_dim % 8:
        return f"FlashAttention takes head_dim a multiple of 8 up to 256, not {case.head_dim}"
    return below_sm80(device, "FlashAttention")


def below_sm80(device: str, who: str) -> str | None:
    """'``who`` needs sm80 or newer, not sm75' on an older CUDA device; None otherwise."""
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        if major < 8:
            return f"{who} needs sm80 or newer, not sm{major}{minor}"
    return None


def _prepare_varlen(case: Case, inputs: PagedInputs, out: torch.Tensor, paged: bool = False) -> Prepared:
    """FlashAttention varlen, q packed: over the packed contiguous KV (made before timing), or (``paged``) reading
    the pool through the block table, the same pages the kernel reads."""
    params = inspect.signature(_varlen_attn()).parameters
    if paged and "block_table" not in params:
        raise Unsupported(f"torch {torch.__version__}'s varlen_attn takes no block_table")
    if paged and case.group_size > 1 and "enable_gqa" not in params:
        raise Unsupported(f"torch {torch.__version__}'s varlen_attn takes no enable_gqa, and a pool cannot be expanded")
    lengths, options = (max(case.q_lens), case.max_seq_len), _varlen_options(case)
    window = "" if case.sliding_window is None else f", window_size ({case.sliding_window - 1}, 0)"
    if paged:
        run = partial(_varlen_attn(), inputs.q, inputs.k_cache, inputs.v_cache, inputs.query_start_loc, None, *lengths,
                      seqused_k=inputs.seq_lens, block_table=inputs.block_table, **options)  # fmt: skip
        return Prepared(run=run, note="paged pool through the block table, lower-right causal" + window)
    k, expanded = _heads_for_varlen(case, torch.cat(inputs.keys))  # [total_kv_tokens, heads, head_dim]
    v, _ = _heads_for_varlen(case, torch.cat(inputs.values))
    cu_seq_k = torch.zeros(case.num_seqs + 1, dtype=torch.int32, device=k.device)
    cu_seq_k[1:] = torch.cumsum(inputs.seq_lens, 0)
    run = partial(_varlen_attn(), inputs.q, k, v, inputs.query_start_loc, cu_seq_k, *lengths, **options)
    return Prepared(run=run, note="packed contiguous KV, lower-right causal" + window + expanded)


def _prepare_flex(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """FlexAttention (compiled) over the padded contiguous copy with a length-and-causal mask_mod (and window);
    the softcap and ALiBi in a score_mod, cap first. Sinks have no spelling here."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    padded, (k, v) = pad_queries(inputs), _gathered(inputs)
    seq_lens = inputs.seq_lens.long()
    starts = inputs.query_start_loc.long()
    q_offset = seq_lens - (starts[1:] - starts[:-1])
    window = case.sliding_window
    cap = case.logit_softcap
    slopes = inputs.options.get("alibi_slopes")

    def mask_mod(b, h, q_idx, kv_idx):
        seen = (kv_idx <= q_offset[b] + q_idx) & (kv_idx < seq_lens[b])
        return seen if window is None else seen & (kv_idx > q_offset[b] + q_idx - window)

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        if slopes is not None:
            score = score + slopes[h] * (kv_idx - (q_offset[b] + q_idx))
        return score

    num_seqs, _, max_q, _ = padded.q.shape
    block_mask = create_block_mask(mask_mod, num_seqs, None, max_q, k.shape[2], device=inputs.q.device)
    mods = {"score_mod": score_mod} if cap is not None or slopes is not None else {}
    options = {"block_mask": block_mask, "scale": case.head_dim**-0.5, "enable_gqa": True, **mods}
    compiled = compiled_flex(flex_attention, lambda fn: fn(padded.q, k, v, **options))
    return Prepared(run=lambda: compiled(padded.q, k, v, **options), to_packed=padded.unpad,
                    note="padded contiguous copy (not paged), block mask" + (", score_mod" if mods else ""))  # fmt: skip


def compiled_flex(flex_attention, first_call):
    """torch.compile(flex_attention), its first call (the compile) made here under a raised recompile limit:
    past dynamo's limit (8) flex would quietly run eagerly."""
    config = torch._dynamo.config
    names = (  # the limits' names since torch 2.6, and before
        ("recompile_limit", "accumulated_recompile_limit")
        if hasattr(config, "recompile_limit")
        else ("cache_size_limit", "accumulated_cache_size_limit")
    )
    compiled = torch.compile(flex_attention, dynamic=False)
    with config.patch(**dict.fromkeys(names, 4096)):
        first_call(compiled)
    return compiled


def flex_unavailable(case: Case, device: str) -> str | None:
    try:
        import torch.nn.attention.flex_attention
    except ImportError:
        return f"torch {torch.__version__} has no FlexAttention"
    return None if has_triton() else "FlexAttention compiles through Triton, which is not installed"


add_backend(Backend("gather_sdpa", _prepare_gather_sdpa, ("cpu", "cuda"), "peer",
                    "gather the pages, then batched SDPA (what a user writes by hand)",
                    variants=frozenset({"sliding_window"})))  # fmt: skip
add_backend(Backend("sdpa_contiguous", _prepare_sdpa_contiguous, ("cpu", "cuda"), "peer",
                    "SDPA over a contiguous copy, in its fastest form: the non-paged floor"))  # fmt: skip
add_backend(Backend("varlen_flash", _prepare_varlen, ("cuda",), "peer",
                    "FlashAttention varlen over the packed contiguous KV", unavailable=_varlen_unavailable,
                    variants=frozenset({"sliding_window"})))  # fmt: skip
add_backend(Backend("varlen_flash_paged", partial(_prepare_varlen, paged=True), ("cuda",), "peer",
                    "FlashAttention varlen over the paged pool (block table)", unavailable=_varlen_unavailable,
                    variants=frozenset({"sliding_window"})))  # fmt: skip
add_backend(Backend("flex_attention", _prepare_flex, ("cuda",), "peer",
                    "FlexAttention, compiled, over a padded contiguous copy (not paged)",
                    unavailable=flex_unavailable,
                    variants=frozenset({"sliding_window", "logit_softcap", "alibi_slopes"})))  # fmt: skip
