"""The memory a case needs, estimated before it runs, and what the device has available.

    peak = inputs + expected + bound + max(oracle, error bound, each backend's call + out)

Per-sequence terms take the worst sequence: inputs are the pools, q and each sequence's keys/values;
the float64 oracle four logits-sized tensors plus K and V; the error bound three, in chunks of at most
2**26 logits; 64 MiB of allocator working memory. Reference gathers K and V in fp32; tlsim / triton /
cache pad q and keep every split's state; the padded peers pay for num_seqs x max_seq_len; a plugin is
charged like reference. tests/harness/test_reliability_memory.py checks it against the peak RSS."""

import contextlib
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
    return d * elt * (2 * slots * hkv + sum(case.q_lens) * case.num_q_heads + 2 * sum(case.seq_lens) * hkv)


def _oracle(case: Case) -> int:
    hq, hkv, d = case.num_q_heads, case.num_kv_heads, case.head_dim
    return max((4 * q * s * hq * F64 + 2 * s * hkv * d * F64 + q * hq * d * F64 for q, s in _pairs(case)), default=0)


def _bound(case: Case) -> int:
    """harness.run.grading.forward_error_bound: three chunk-sized float64 tensors, K and V in float64."""
    hq, hkv, d = case.num_q_heads, case.num_kv_heads, case.head_dim
    return max((3 * min(q * s * hq, max(BOUND_CHUNK_ELEMENTS, s * hq)) * F64 + 2 * s * hkv * d * F64
                for q, s in _pairs(case)), default=0)  # fmt: skip


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


def _padded(case: Case) -> int:
    elt, hq, hkv, d = case.element_bytes, case.num_q_heads, case.num_kv_heads, case.head_dim
    s_, qm, length = case.num_seqs, max(max(case.q_lens), 1), case.max_seq_len
    kv = 2 * s_ * hkv * length * d * elt
    gather = 3 * s_ * length * I64 + s_ * hkv * length * d * elt  # indices and the pre-mask copy
    scores = s_ * hq * qm * length * F32 + s_ * qm * length  # fp32 scores, and the bool mask
    return kv + gather + scores + s_ * hq * qm * d * elt


BACKEND_STEPS = {
    "reference": _reference, "tlsim": _tlsim, "triton": _tlsim,
    "cache": lambda case: (
        2 * case.blocks_needed * case.block_size * case.num_kv_heads * case.head_dim * case.element_bytes + _tlsim(case)
    ),
    "gather_sdpa": _padded, "sdpa_contiguous": _padded, "flex_attention": _padded,
}  # fmt: skip


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
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def too_large(cases: list[Case], device: str, backends: list[str] | None = None, fraction: float = 0.9) -> list[str]:
    """One message (file, case, field, the numbers) per case whose estimate exceeds ``fraction`` of the device's."""
    budget = available_bytes(device) * fraction
    return [f"{case.file}: case '{case.id}': field 'seq_lens': too large for {device} memory: needs "
            f"{need.describe()}, {fraction:.0%} of the {available_bytes(device) / 2**30:.1f} GiB available "
            f"is {budget / 2**30:.1f} GiB" for case in cases if (need := estimate(case, backends)).peak > budget]  # fmt: skip
