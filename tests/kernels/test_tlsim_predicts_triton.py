"""tlsim models the kernel: both choose one tiling from the same host-known sizes and hints, and tlsim predicts
the device split the kernel decides from seq_lens (tests/kernels/test_backends_match_oracle.py holds tlsim to the
kernel on every kernel case)."""

from __future__ import annotations

import functools

import pytest
import torch

import kernels
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.oracle import paged_attention_oracle
from kernels import tiling, tuning
from kernels.contract import prepare_call
from kernels.fp8 import quantize_kv
from kernels.launch_plan import plans_enabled
from tests.kernels.kernel_cases import (
    KERNEL_CASES,
    KernelCase,
    KernelRecorder,
    assert_passes,
    assert_tlsim_close,
    needs_triton,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Where CUDA is, the kernel runs compiled and the test is a GPU test: `pytest -m gpu` (nox -s gpu) runs it.
ON_GPU = [pytest.mark.gpu] if DEVICE == "cuda" else []


@functools.cache
def _call_args(case) -> tuple[torch.Tensor, ...]:
    return case.inputs().args()


class _TilingChosen(Exception):
    """Raised once a backend has asked for its tiling: the rest of its work is not needed here."""


@pytest.mark.parametrize(
    "hints",
    [{}, {"max_q_len": 1}, {"max_seq_len": 1024}, {"wide_table": 8}],
    ids=["no_hints", "q1", "kv1024", "wide_table"],
)
@pytest.mark.parametrize("case", KERNEL_CASES, ids=str)
def test_tlsim_and_the_launcher_choose_the_same_tiling(case, hints, monkeypatch):
    """Both ask kernels.tiling.tiling_for, from host-known sizes and the same hints (nothing runs)."""
    if not kernels.has_triton():
        pytest.skip("Triton is not installed")
    from kernels import tlsim, triton_paged

    chosen = {}

    def record(module, real):
        def tiling_for(*args, **kwargs):
            chosen[module] = real(*args, **kwargs)
            raise _TilingChosen

        return tiling_for

    for module in (tlsim, triton_paged):
        monkeypatch.setattr(module, "tiling_for", record(module, module.tiling_for))
    monkeypatch.setattr(triton_paged, "paged_attention_kernel", KernelRecorder())
    args, hints = list(_call_args(case)), dict(hints)
    if widen := hints.pop("wide_table", 0):  # capacity far above every seq_len, as in an engine's table
        args[3] = torch.nn.functional.pad(args[3], (0, widen * args[3].shape[1]), value=-1)
    # The full path, not a launch plan from an earlier test (tests/kernels/test_launch_plans.py pins that a
    # plan's tiling is tiling_for's).
    with plans_enabled(False):
        for fn in (kernels.paged_attention_triton, kernels.paged_attention_tlsim):
            with pytest.raises(_TilingChosen):
                fn(*args, **hints)
    assert chosen[tlsim] == chosen[triton_paged]


# The device split (kernels.tiling.DEVICE_SPLIT), name: (seq_lens, q_lens (None: decode, query_start_loc None),
# TARGET_PROGRAMS, the split counts the rule gives). 8 q heads over 2 KV heads; the bounds are lowered to fit
# the interpreter (pieces of at least 64 keys, 32-key tiles, a "GPU" of TARGET_PROGRAMS slots) so that every
# case takes the device split.
DEVICE_SPLIT_CASES = {
    "ragged_outlier": ((3000, 1, 17, 1300, 600, 2000, 64, 33), None, 32, [4, 1, 1, 3, 2, 4, 1, 1]),  # 3000: 6, clamped
    "all_equal": ((300,) * 8, None, 16, [1] * 8),  # every row written by its program, the combine skips them all
    "zero_length": ((2000, 0, 5, 700), (1, 0, 1, 1), 8, [3, 1, 1, 1]),  # query_start_loc given: 3 tiles, 4 sequences
    "offsets_given": ((600, 3000, 33, 2000), (1, 1, 1, 1), 8, [1, 2, 1, 2]),  # one query each: the reordered launch
    # the last sequence without a query: 3 tiles for 4 sequences, so the tiles keep their order (the longest-first
    # order would hand the second slot to that sequence and leave the 33-key one unwritten)
    "last_empty": ((600, 3000, 33, 2000), (1, 1, 1, 0), 8, [1, 2, 1, 2]),
    "one_sequence": ((3000,), None, 3, [2]),  # NUM_SPLITS 2
    # 15 sequences (seq_lens read through a mask: 16 lanes); the piece from the total (25 keys) is under the
    # 64-key floor, so 120 takes 2 splits of 64 keys, not 4 of 32
    "piece_floor": ((300, 120) + (10,) * 13, None, 56, [4, 2] + [1] * 13),
    # twice the mean (2675 keys) over the slack's 836: only the 3000-key sequence is cut (the cases above set the
    # mean's factor to 0, to pin the slack, the floor and the clamp alone)
    "twice_the_mean": ((3000, 1400, 1300, 1200, 1100, 1000, 900, 800), None, 32, [2] + [1] * 7),
}
DEVICE_SPLIT_MEAN = {"twice_the_mean": 2}
DEVICE_SPLIT_PARAMS = [
    (name, dtype, kv, options)
    for name in DEVICE_SPLIT_CASES
    for dtype, kv in (("bfloat16", None), ("float32", None), ("bfloat16", "fp8_e4m3"))
    for options in ([{}, {"sinks": True, "return_lse": True}] if name == "ragged_outlier" and kv is None else [{}])
]


@pytest.mark.parametrize(
    "name, dtype, kv, options",
    [
        pytest.param(*p, marks=ON_GPU, id="-".join([p[0], p[1], p[2] or "same_cache", *sorted(p[3])]))
        for p in DEVICE_SPLIT_PARAMS
    ],
)
@pytest.mark.slow  # long interpreted split-KV calls, a grid of them
def test_tlsim_predicts_the_device_split(name, dtype, kv, options, monkeypatch):
    """The device split (decided in the kernel from seq_lens): oracle, tlsim and the counts the rule names."""
    needs_triton(DEVICE)
    seq_lens, q_lens, target, counts = DEVICE_SPLIT_CASES[name]
    monkeypatch.setattr(tiling, "TARGET_PROGRAMS", target)
    monkeypatch.setattr(tiling, "DEVICE_SPLIT_MIN_KEYS", 64)
    monkeypatch.setattr(tiling, "DEVICE_SPLIT_MEAN_FACTOR", DEVICE_SPLIT_MEAN.get(name, 0))
    case = KernelCase(name, num_q_heads=8, num_kv_heads=2, head_dim=32, seq_lens=seq_lens,
                      q_lens=q_lens or (1,) * len(seq_lens), dtype=dtype)  # fmt: skip
    inputs = case.inputs(DEVICE)
    args, kwargs = list(inputs.args()), dict(options)
    if q_lens is None:
        args[5] = None
    if kv is not None:  # one amax scale a pool, as the fp8 cases take
        scales = [float(c.float().abs().nan_to_num(0.0).amax()) / 448 for c in (inputs.k_cache, inputs.v_cache)]
        args[1], args[2] = (quantize_kv(c, torch.full((2,), s, device=c.device), torch.float8_e4m3fn)
                            for c, s in zip((inputs.k_cache, inputs.v_cache), scales, strict=True))  # fmt: skip
        kwargs.update(k_scale=scales[0], v_scale=scales[1])
    if kwargs.pop("sinks", False):
        kwargs["sinks"] = torch.tensor([4.0, -3.0, 0.5, 100.0, 1.0, 0.0, -1.0, 2.0], device=inputs.q.device)
    lse = {"return_lse": True} if kwargs.pop("return_lse", False) else {}
    hints = {"max_q_len": 1, "max_seq_len": max(seq_lens), **lse}
    with plans_enabled(False), tuning.override(tuning.TileConfig(16, 1, 32, 4, 2)):
        chosen = tiling.tiling_for(prepare_call(*args, check=False, **kwargs), max_q_len=1, max_seq_len=max(seq_lens))
        assert chosen.DEVICE_SPLIT is not None and chosen.NUM_SPLITS > 1 and chosen.TILE_N == 32
        splits, _ = tiling.device_splits(inputs.seq_lens, chosen.NUM_SPLITS, chosen.TILE_N, *chosen.DEVICE_SPLIT)
        assert splits.tolist() == counts
        real = kernels.paged_attention_triton(*args, out=inputs.new_out(), **hints, **kwargs)
        sim = kernels.paged_attention_tlsim(*args, **hints, **kwargs)
    oracle = paged_attention_oracle(*args, **kwargs, **lse)
    pairs = list(zip(real, sim, oracle, strict=True)) if lse else [(real, sim, oracle)]
    for got, predicted, expected in pairs:
        assert_passes(got, expected.double(), DEFAULT_TOLERANCES[dtype], name)
        if DEVICE == "cpu" and kv is None and "sinks" not in kwargs and got.dtype != torch.float32:
            assert torch.equal(got, predicted), f"{name}: tlsim is not the kernel's bits"  # the same roundings
        else:  # fp32: the dots' sum order is not tlsim's; with sinks or an fp8 cache's fp16 dots 1 ulp off unsplit too
            assert_tlsim_close(predicted, got, got.dtype, what=name)
