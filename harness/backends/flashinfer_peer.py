"""The peer ``flashinfer``: FlashInfer's paged wrappers over the same pool the kernel reads (an optional extra,
``pip install '.[flashinfer]'``). docs/performance.md, "FlashInfer": the block table as its CSR page table
(:func:`page_table`, a worked example), decode on the faster of its two paths (:func:`faster_decode`), the rest
prefill. Sinks are not declared: its CUDA-core decode takes the keyword, unapplied."""

import dataclasses
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from harness.backends.peers import below_sm80
from harness.backends.registry import Backend, Prepared, Unsupported, add_backend, timed_us
from harness.cases.inputs import PagedInputs
from harness.cases.spec import Case

NAME = "flashinfer"
INSTALL = "pip install '.[flashinfer]'"
DECLARED_VARIANTS = frozenset({"sliding_window", "logit_softcap", "fp8_kv"})  # the variants it declares
WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's recommended float workspace (split-KV partial results)
HEAD_DIMS = (64, 128, 256)  # the head dims FlashInfer's decode and prefill kernels are built for
DECODE_TRIALS = 20  # calls of each decode path timed in prepare to pick the faster
FA3_MIN_Q_LEN = 65  # FlashInfer's auto backend takes FA2 when no sequence has more queries than 64


@dataclass(frozen=True)
class PageTable:
    """A block table in FlashInfer's CSR form (docs/performance.md, "FlashInfer": the example)."""

    indptr: torch.Tensor  # [num_seqs + 1] int32
    indices: torch.Tensor  # [indptr[-1]] int32, physical pages
    last_page_len: torch.Tensor  # [num_seqs] int32, in 0..block_size (0 only for a sequence without keys)


def page_table(block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> PageTable:
    """FlashInfer's pages of ``block_table`` [num_seqs, max_blocks_per_seq] int32 and ``seq_lens``
    [num_seqs] int32: the first ceil(seq_len / block_size) entries of each row, in order, on the
    table's device. Table entries past a sequence's pages (-1 or stale) are never read."""
    seq_lens = seq_lens.long()
    pages = (seq_lens + block_size - 1) // block_size  # [num_seqs]
    indptr = torch.zeros(len(pages) + 1, dtype=torch.int32, device=block_table.device)
    indptr[1:] = torch.cumsum(pages, 0)
    owned = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < pages[:, None]
    indices = block_table[owned].to(torch.int32)  # row-major: sequence by sequence, logical order
    last_page_len = (seq_lens - (pages - 1).clamp(min=0) * block_size).to(torch.int32)
    return PageTable(indptr=indptr, indices=indices, last_page_len=last_page_len)


def is_decode(case: Case) -> bool:
    return all(q_len == 1 for q_len in case.q_lens)


def module_key(case: Case) -> tuple:
    """What picks the compiled FlashInfer module a case runs: dtypes, head dim, wrapper, FA2/FA3, variants
    (lengths, head counts and the page size are run-time values; a decode builds both of its paths)."""
    return (case.dtype, case.kv_dtype, case.head_dim, is_decode(case),
            max(case.q_lens) >= FA3_MIN_Q_LEN, case.sliding_window is not None, case.logit_softcap is not None)  # fmt: skip


def warmup_cases(cases: Iterable[Case]) -> list[Case]:
    """One small twin per :func:`module_key` among the ``cases`` FlashInfer serves: running the twins
    compiles every module the cases need (scripts/flashinfer_warmup.py)."""
    twins: dict[tuple, Case] = {}
    for case in cases:
        if module_key(case) in twins or not serves(case):
            continue
        q_len = 1 if is_decode(case) else (FA3_MIN_Q_LEN if max(case.q_lens) >= FA3_MIN_Q_LEN else 2)
        seq_lens = (max(q_len, 3 * case.block_size) + 5, max(q_len, case.block_size) + 1)
        # a window and a cap that act on so few keys and such small logits (the module is the same)
        small = {"sliding_window": case.sliding_window and min(case.sliding_window, 20),
                 "logit_softcap": case.logit_softcap and min(case.logit_softcap, 1.0)}  # fmt: skip
        twins[module_key(case)] = dataclasses.replace(case, id=f"{case.id}~warmup", seq_lens=seq_lens,
                                                      q_lens=(q_len, q_len), spec=case.spec.model_copy(update=small))  # fmt: skip
    return list(twins.values())


def refusal(case: Case) -> str | None:
    """Why FlashInfer's paged kernels cannot take this case's shapes or dtypes, or None."""
    if case.dtype not in ("float16", "bfloat16"):
        return f"FlashInfer takes fp16/bf16 queries, not {case.dtype}"
    if case.head_dim not in HEAD_DIMS or case.head_dim_v != case.head_dim:
        return f"FlashInfer's paged kernels take head_dim {', '.join(map(str, HEAD_DIMS))} (K and V alike)"
    return None


def serves(case: Case) -> bool:
    """Whether the case asks for this peer, turns on only the variants it declares, and fits :func:`refusal`."""
    return case.wants(NAME) and case.variants <= DECLARED_VARIANTS and refusal(case) is None


def flashinfer_unavailable(case: Case, device: str) -> str | None:
    """Why FlashInfer cannot take this case (not installed, its dtypes, head dims, GPU), before any call."""
    if importlib.util.find_spec("flashinfer") is None:
        return f"FlashInfer is not installed: `{INSTALL}` on a CUDA machine"
    return refusal(case) or below_sm80(device, "FlashInfer's paged kernels")


def fp8_scales(inputs: PagedInputs) -> dict[str, float]:
    """An fp8 case's k_scale / v_scale as the floats FlashInfer takes; Unsupported for per-head scales."""
    if "k_scale" not in inputs.options:
        return {}
    scales = {name: inputs.options[name] for name in ("k_scale", "v_scale")}
    if any(bool((s != s[0]).any()) for s in scales.values()):
        raise Unsupported("FlashInfer takes one k_scale and one v_scale per tensor, not one per KV head")
    return {name: float(s[0]) for name, s in scales.items()}


def faster_decode(plan: Callable[[bool], Any], run: Callable[[Any], Any],
                  device: torch.device) -> tuple[Any, float, str]:  # fmt: skip
    """(wrapper, its plan's us, a note) of the faster of the decode wrapper planned on CUDA cores and on tensor
    cores (``plan(tensor_cores)``), by DECODE_TRIALS calls of each (``run(wrapper)``)."""
    timed = []
    for tensor_cores in (False, True):
        wrapper, plan_us = timed_us(lambda cores=tensor_cores: plan(cores), device.type == "cuda", device)
        run(wrapper)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(DECODE_TRIALS):
            run(wrapper)
        end.record()
        end.synchronize()
        timed.append((wrapper, plan_us, start.elapsed_time(end) * 1e3 / DECODE_TRIALS, tensor_cores))
    wrapper, plan_us, call_us, tensor_cores = min(timed, key=lambda row: row[2])
    other_us = max(row[2] for row in timed)
    note = f"decode wrapper, {'tensor' if tensor_cores else 'CUDA'} cores (the faster path: {call_us:.0f} us, the other {other_us:.0f} us)"
    return wrapper, plan_us, note


def prepare_flashinfer(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """Plan the decode or prefill wrapper for this input set (outside the timed region); run() is its call."""
    import flashinfer

    device = inputs.q.device
    table = page_table(inputs.block_table, inputs.seq_lens, case.block_size)
    scales = fp8_scales(inputs)
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    shape = (case.num_q_heads, case.num_kv_heads, case.head_dim, case.block_size)
    options = {"window_left": -1 if case.sliding_window is None else case.sliding_window - 1,
               "logits_soft_cap": case.logit_softcap, "q_data_type": inputs.q.dtype,
               "kv_data_type": inputs.k_cache.dtype, "sm_scale": case.head_dim**-0.5}  # fmt: skip
    kv = (inputs.k_cache, inputs.v_cache)
    if is_decode(case):

        def plan(tensor_cores: bool):
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
            wrapper.plan(table.indptr, table.indices, table.last_page_len, *shape, **options)
            return wrapper

        wrapper, plan_us, note = faster_decode(plan, lambda w: w.run(inputs.q, kv, out=out, **scales), device)
    else:
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="auto")
        pages = (inputs.query_start_loc, table.indptr, table.indices, table.last_page_len, *shape)
        _, plan_us = timed_us(lambda: wrapper.plan(*pages, causal=True, **options), device.type == "cuda", device)
        note = f"prefill wrapper, {getattr(wrapper, '_backend', 'auto')}, causal"
    return Prepared(run=lambda: wrapper.run(inputs.q, kv, out=out, **scales),
                    call=lambda: wrapper.run(inputs.q, kv, **scales), note=note + ", NHD pages, planned once",
                    out=out, follows_inputs=True, plan_us=plan_us)  # fmt: skip


add_backend(Backend(NAME, prepare_flashinfer, ("cuda",), "peer",
                    "FlashInfer's paged decode/prefill wrappers, planned once per input set",
                    unavailable=flashinfer_unavailable, variants=DECLARED_VARIANTS, plan_step=True))  # fmt: skip
