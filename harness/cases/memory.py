"""The memory a case needs, estimated before it runs, and what the device has available.

A case's peak is what stays for the whole case plus the largest transient of the steps
that run one after the other:

    peak = inputs + expected + bound + max(oracle, error bound, each backend's call + out)

with (elt = the case dtype's bytes; T tokens; S sequences; L = max_seq_len; Qm = max
q_len; Hq/Hkv heads; D head_dim; per-sequence terms take the worst sequence):

* inputs: the two pools (owned blocks plus the spare eighth) and q, plus each sequence's
  keys/values in order (the cache backend's writes): 2 * slots * Hkv * D * elt + T * Hq *
  D * elt + 2 * sum(seq_lens) * Hkv * D * elt. expected and bound: T * Hq * D * 8 each.
* oracle (float64): per sequence, the logits q_len x seq_len x Hq four times at once
  (logits, scaled, logits - max, exp; 3.6x measured) plus K and V in float64.
* error bound (harness.run.grading): three logits-sized float64 tensors, in chunks of query
  rows of at most 2**26 logits (so at most about 1.5 GiB plus K and V in float64).
* a fixed 64 MiB for the allocator's and torch's working memory (what a tiny case adds
  to the RSS of a warmed-up process, measured: 30-35 MiB).
* reference: per sequence, K and V gathered, in fp32, repeated to Hq heads (2 * seq_len *
  Hq * D * 4, twice while copying) and SDPA's fp32 scores q_len x seq_len x Hq, three times.
* tlsim / triton / cache (dispatches to tlsim on the CPU): q padded to S x Qm (fp32), the
  (max, sum, acc) state of every KV split (S x Hq x Qm x (D + 2) fp32 each), and one KV
  tile gathered for every sequence (S x TILE_N x Hkv x D, fp32, a few copies); cache also
  holds its own pools.
* gather_sdpa / sdpa_contiguous / flex_attention: the batch padded to rectangles: K and V
  as S x Hkv x L x D (elt, built by a gather with int64 indices S x L and one pre-mask
  copy), the bool mask S x Qm x L and SDPA's fp32 scores S x Hq x Qm x L once (torch's
  SDPA reads GQA's K/V heads without repeating them: measured, no Hq-sized copy). A ragged
  batch (one long sequence and many short ones) is charged S x L, which is the point:
  padded peers pay for the padding.
* plugins: unknown code; charged like reference.

Checked against the CPU's measured peak RSS in tests/harness/test_reliability_memory.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from harness.cases.spec import Case
from kernels.tiling import choose_tiling

F32, F64, I64 = 4, 8, 8
OVERHEAD = 64 * 2**20


@dataclass(frozen=True)
class Estimate:
    """Bytes: what stays for the whole case, and the transient peak of each step."""

    resident: int
    steps: dict[str, int]

    @property
    def peak(self) -> int:
        return self.resident + max(self.steps.values(), default=0)

    @property
    def worst_step(self) -> str:
        return max(self.steps, key=self.steps.get) if self.steps else ""

    def describe(self) -> str:
        gib = 2**30
        return (f"about {self.peak / gib:.1f} GiB (inputs and oracle output {self.resident / gib:.1f} GiB, "
                f"then {self.worst_step} {self.steps[self.worst_step] / gib:.1f} GiB)")  # fmt: skip


BOUND_CHUNK_ELEMENTS = 2**26  # logits per chunk of query rows in the error bound: 512 MiB of float64


def _pairs(case: Case):
    return [(q, s) for q, s in zip(case.q_lens, case.seq_lens, strict=True) if q > 0]


def _inputs(case: Case) -> int:
    elt, hkv, d = case.element_bytes, case.num_kv_heads, case.head_dim
    owned = case.blocks_needed
    slots = (owned + max(1, owned // 8)) * case.block_size
    return (
        2 * slots * hkv * d * elt
        + sum(case.q_lens) * case.num_q_heads * d * elt
        + 2 * sum(case.seq_lens) * hkv * d * elt
    )


def _oracle(case: Case) -> int:
    hq, hkv, d = case.num_q_heads, case.num_kv_heads, case.head_dim
    return max((4 * q * s * hq * F64 + 2 * s * hkv * d * F64 + q * hq * d * F64 for q, s in _pairs(case)), default=0)


def _bound(case: Case) -> int:
    """harness.run.grading.forward_error_bound: three chunk-sized float64 tensors, K and V in float64."""
    hq, hkv, d = case.num_q_heads, case.num_kv_heads, case.head_dim
    return max(
        (3 * min(q * s * hq, max(BOUND_CHUNK_ELEMENTS, s * hq)) * F64 + 2 * s * hkv * d * F64 for q, s in _pairs(case)),
        default=0,
    )


def _reference(case: Case) -> int:
    hq, d = case.num_q_heads, case.head_dim
    return max((4 * s * hq * d * F32 + 3 * q * s * hq * F32 + s for q, s in _pairs(case)), default=0)


def _tlsim(case: Case) -> int:
    hq, hkv, d = case.num_q_heads, case.num_kv_heads, case.head_dim
    s_, qm = case.num_seqs, max(case.q_lens)
    tiling = choose_tiling(d, case.group_size, qm, s_, hkv, case.max_seq_len, fp32=case.dtype == "float32")
    state = s_ * hq * max(qm, 1) * (d + 2) * F32
    tile = s_ * tiling.TILE_N * hkv * d * F32 * 6 + 4 * s_ * hq * max(qm, 1) * tiling.TILE_N * F32
    return s_ * qm * hq * d * F32 + (tiling.NUM_SPLITS + 1) * state + tile


def _cache(case: Case) -> int:
    pools = 2 * case.blocks_needed * case.block_size * case.num_kv_heads * case.head_dim * case.element_bytes
    return pools + _tlsim(case)


def _padded(case: Case) -> int:
    elt, hq, hkv, d = case.element_bytes, case.num_q_heads, case.num_kv_heads, case.head_dim
    s_, qm, length = case.num_seqs, max(max(case.q_lens), 1), case.max_seq_len
    kv = 2 * s_ * hkv * length * d * elt
    gather = 3 * s_ * length * I64 + s_ * hkv * length * d * elt  # indices and the pre-mask copy
    scores = s_ * hq * qm * length * F32 + s_ * qm * length  # fp32 scores, and the bool mask
    return kv + gather + scores + s_ * hq * qm * d * elt


BACKEND_STEPS = {
    "reference": _reference,
    "tlsim": _tlsim,
    "triton": _tlsim,
    "cache": _cache,
    "gather_sdpa": _padded,
    "sdpa_contiguous": _padded,
    "flex_attention": _padded,
}


def estimate(case: Case, backends: list[str] | None = None) -> Estimate:
    """The case's peak memory on its device; ``backends`` None: every built-in one."""
    out = sum(case.q_lens) * case.num_q_heads * case.head_dim * case.element_bytes
    expected = sum(case.q_lens) * case.num_q_heads * case.head_dim * F64
    steps = {"oracle": _oracle(case), "error bound": _bound(case)}
    for name in BACKEND_STEPS if backends is None else backends:
        if case.wants(name):
            steps[name] = BACKEND_STEPS.get(name, _reference)(case) + out
    return Estimate(resident=OVERHEAD + _inputs(case) + 2 * expected, steps=steps)


def available_bytes(device: str) -> int:
    """Memory the device can give now: free GPU memory, or the CPU's MemAvailable."""
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def too_large(cases: list[Case], device: str, backends: list[str] | None = None, fraction: float = 0.9) -> list[str]:
    """One message (file, case, field, the numbers) per case whose estimate exceeds
    ``fraction`` of the device's available memory."""
    budget = available_bytes(device) * fraction
    messages = []
    for case in cases:
        need = estimate(case, backends)
        if need.peak > budget:
            messages.append(
                f"{case.file}: case '{case.id}': field 'seq_lens': too large for {device} memory: needs "
                f"{need.describe()}, {fraction:.0%} of the {available_bytes(device) / 2**30:.1f} GiB available "
                f"is {budget / 2**30:.1f} GiB"
            )
    return messages
