"""Hopper's prefill (kernels.gluon_prefill): the launches it takes pass the oracle and compute what the Triton
kernel computes (the same tiles and roundings, so tlsim models both); the launches it cannot do stay with the
Triton kernel. GPU tests (sm_90)."""

from __future__ import annotations

import pytest
import torch

import kernels
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.oracle import paged_attention_oracle
from kernels import gluon_prefill
from kernels.contract import prepare_call
from kernels.launch_plan import clear_plans
from kernels.tiling import tiling_for
from tests.kernels.kernel_cases import KernelCase, assert_passes, assert_tlsim_close, needs_triton


def _case(name: str, **fields) -> KernelCase:
    base = dict(num_q_heads=8, num_kv_heads=2, head_dim=128, block_size=16, dtype="bfloat16")
    return KernelCase(name, **{**base, **fields})


CASES = [
    _case("dense_2x256", seq_lens=(256, 256), q_lens=(256, 256)),
    # chunks whose q_len and seq_len end mid-tile and mid-block (keys past seq_len in the last box)
    _case("chunked_ragged", seq_lens=(1000, 333), q_lens=(300, 200)),
    _case("varlen_with_an_empty_sequence", seq_lens=(700, 50, 400), q_lens=(300, 0, 140)),
    _case("block256_tile_inside_a_block", block_size=256, seq_lens=(600, 300), q_lens=(300, 300)),
    _case("block32_float16", block_size=32, dtype="float16", seq_lens=(513, 257), q_lens=(513, 257)),
    _case("head_dim64_float16", head_dim=64, dtype="float16", seq_lens=(384, 200), q_lens=(256, 200)),
    _case("mha", num_q_heads=4, num_kv_heads=4, seq_lens=(300, 260), q_lens=(300, 130)),
    _case("mqa", num_q_heads=8, num_kv_heads=1, seq_lens=(257, 129), q_lens=(257, 129)),
    _case("layout_contiguous", layout="contiguous", seq_lens=(384, 130), q_lens=(200, 130)),
    _case("large_logits", input_scale=6.0, seq_lens=(300, 170), q_lens=(300, 170)),
    # a sequence shorter than a tile (its first tile is its last), beside a long one
    _case("a_sequence_shorter_than_a_tile", seq_lens=(300, 50), q_lens=(300, 50)),
    _case("block64_two_boxes_a_tile", block_size=64, seq_lens=(500, 260), q_lens=(500, 131)),
    _case(
        "eight_sequences",
        seq_lens=(130, 257, 1000, 64, 300, 129, 512, 700),
        q_lens=(130, 257, 200, 64, 300, 129, 512, 100),
    ),
]
# (case, call keywords): every case plain, and windows that start an item's walk at tile 0, mid-sequence, on a
# tile edge (W 129: the first visible key of a row at 128k + 128 is 128k) and at one key
RUNS = (
    [(case, {}) for case in CASES]
    + [(CASES[1], {"sliding_window": w}) for w in (1, 100, 129, 700, 5000)]
    + [(CASES[-1], {"sliding_window": 200})]
)


def _run_id(run) -> str:
    case, options = run
    return case.name + "".join(f"-{key}{value}" for key, value in options.items())


def needs_hopper():
    if not torch.cuda.is_available() or not gluon_prefill.on_hopper(torch.device("cuda")):
        pytest.skip(f"Hopper's prefill runs on sm_90 under Triton {gluon_prefill.GLUON_TRITON}x only")
    needs_triton("cuda")


@pytest.fixture
def gluon_launches(monkeypatch):
    """Counts GluonPrefill launches (plans made by earlier tests included)."""
    launches = []
    launch = gluon_prefill.GluonPrefill.launch
    monkeypatch.setattr(gluon_prefill.GluonPrefill, "launch", lambda self, *a: (launches.append(1), launch(self, *a)))
    return launches


@pytest.mark.gpu
@pytest.mark.parametrize("run", RUNS, ids=_run_id)
def test_hoppers_prefill_takes_the_launch_passes_the_oracle_and_computes_what_the_triton_kernel_does(
    run, gluon_launches, monkeypatch
):
    needs_hopper()
    case, options = run
    inputs = case.inputs("cuda")
    got = kernels.paged_attention_triton(*inputs.args(), out=inputs.new_out(), **options)
    assert gluon_launches, "the launch ran the Triton kernel, not Hopper's prefill"
    assert_passes(got, paged_attention_oracle(*inputs.args(), **options), DEFAULT_TOLERANCES[case.dtype], case.name)
    monkeypatch.setattr(gluon_prefill, "ENABLED", False)
    clear_plans()
    triton_kernel = kernels.paged_attention_triton(*inputs.args(), out=inputs.new_out(), **options)
    clear_plans()
    assert len(gluon_launches) == 1
    # the same tiles and roundings: within an output ulp (only the tensor cores' summation order differs)
    assert_tlsim_close(got, triton_kernel, got.dtype, ulps=1, what=f"{case.name}, against the Triton kernel")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("column", "programs"), [(0, None), (50, None), (50, 1)], ids=["key0", "key800", "one_program"]
)
def test_a_bad_block_id_turns_the_rows_that_see_it_into_nan_and_leaves_the_other_sequence(
    column, programs, gluon_launches, cap_programs
):
    """CASES[1] (sequence 0: 300 queries at positions 700..999, blocks of 16) with a block id past the pool at
    ``column`` of sequence 0 (keys 16 * column..): the rows that reach it are NaN, the other sequence passes. With
    one program, that program walks every item: an item of NaN rows among attended ones keeps the walk in step."""
    needs_hopper()
    case = CASES[1]
    inputs = case.inputs("cuda")
    args = list(inputs.args())
    args[3] = inputs.block_table.clone()
    args[3][0, column] = inputs.k_cache.shape[0] + 5
    if programs:
        cap_programs(programs)
    got = kernels.paged_attention_triton(*args, out=inputs.new_out(), check=False)
    assert gluon_launches
    assert got[max(16 * column - 700, 0) : case.q_lens[0]].isnan().all()
    rest = case.q_lens[0]
    expected = paged_attention_oracle(*inputs.args())
    assert_passes(got[rest:], expected[rest:], DEFAULT_TOLERANCES[case.dtype], "the other sequence")


@pytest.mark.gpu
def test_a_head_major_q_stays_with_the_triton_kernel_and_passes():
    needs_hopper()
    inputs = CASES[0].inputs("cuda")
    q = inputs.q.transpose(0, 1).contiguous().transpose(0, 1)  # the same values, each head's tokens contiguous
    args = (q, *inputs.args()[1:])
    call = prepare_call(*args)
    assert not gluon_prefill.applies(call, tiling_for(call), None)
    got = kernels.paged_attention_triton(*args, out=inputs.new_out())
    assert_passes(got, paged_attention_oracle(*inputs.args()), DEFAULT_TOLERANCES[CASES[0].dtype], "head-major q")


# Launches Hopper's prefill must leave to the Triton kernel: name -> (case, call keywords, lse, q's change)
NOT_TAKEN = {
    "logit_softcap": (CASES[0], {"logit_softcap": 30.0}, False, None),
    "window_with_softcap": (CASES[0], {"sliding_window": 64, "logit_softcap": 30.0}, False, None),
    "lse": (CASES[0], {}, True, None),
    "float32": (_case("f32", dtype="float32", seq_lens=(256,), q_lens=(256,)), {}, False, None),
    "head_dim96": (_case("hd96", head_dim=96, seq_lens=(256,), q_lens=(256,)), {}, False, None),
    "decode": (_case("decode", seq_lens=(256, 300), q_lens=(1, 1)), {}, False, None),
    "mean_q_len_below_a_tile": (_case("mixed", seq_lens=(300, 40, 40), q_lens=(300, 1, 1)), {}, False, None),
    "block_size8": (_case("bs8", block_size=8, seq_lens=(256,), q_lens=(256,)), {}, False, None),
    "head_major_q": (CASES[0], {}, False, lambda q: q.transpose(0, 1).contiguous().transpose(0, 1)),
    "q_base_off_16_bytes": (
        CASES[0],
        {},
        False,
        lambda q: torch.cat([q.new_zeros(1), q.reshape(-1)])[1:].view(q.shape),
    ),
}


@pytest.fixture
def as_if_on_hopper(monkeypatch):
    """applies() judged as on an sm_90 GPU under the Triton release it is written for, on any machine."""
    if gluon_prefill.gluon is None:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(gluon_prefill, "on_hopper", lambda device: True)


@pytest.mark.parametrize("name", NOT_TAKEN)
def test_a_launch_hoppers_prefill_cannot_do_stays_with_the_triton_kernel(name, as_if_on_hopper):
    case, options, lse, change = NOT_TAKEN[name]
    args = list(case.inputs().args())
    args[0] = change(args[0]) if change else args[0]
    call = prepare_call(*args, **options)
    assert not gluon_prefill.applies(call, tiling_for(call), torch.empty(1) if lse else None)


@pytest.mark.parametrize("run", RUNS, ids=_run_id)
def test_every_run_above_takes_hoppers_prefill(run, as_if_on_hopper):
    case, options = run
    call = prepare_call(*case.inputs().args(), **options)
    assert gluon_prefill.applies(call, tiling_for(call), None)


def test_the_cpu_never_takes_hoppers_prefill():
    call = prepare_call(*CASES[0].inputs("cpu").args())
    assert not gluon_prefill.applies(call, tiling_for(call), None)


@pytest.fixture
def cap_programs(monkeypatch):
    """cap_programs(n): plans made after it launch at most n programs, so each walks many work items."""

    def cap(programs: int) -> None:
        init = gluon_prefill.GluonPrefill.__init__

        def capped(self, call, tiling):
            init(self, call, tiling)
            self.grid = (min(self.grid[0], programs),)

        monkeypatch.setattr(gluon_prefill.GluonPrefill, "__init__", capped)
        clear_plans()

    yield cap
    clear_plans()


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [1, 3])
@pytest.mark.parametrize("run", [RUNS[0], RUNS[2], RUNS[-1], (CASES[1], {"sliding_window": 100})], ids=_run_id)
def test_a_grid_of_few_programs_walks_every_item_and_computes_what_the_full_grid_does(run, programs, cap_programs):
    """Each program walks many items: Q's buffer, the K/V ring and the turns carry their phases from item to item,
    spare items fall among them, and the output is the full grid's bit for bit."""
    needs_hopper()
    case, options = run
    inputs = case.inputs("cuda")
    clear_plans()
    full = kernels.paged_attention_triton(*inputs.args(), out=inputs.new_out(), **options)
    cap_programs(programs)
    got = kernels.paged_attention_triton(*inputs.args(), out=inputs.new_out(), **options)
    assert torch.equal(got, full), f"{_run_id(run)} on {programs} programs differs from the full grid"
