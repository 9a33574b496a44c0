"""Chosen shapes for the kernel tests, one dimension varied at a time around a base, each named for
what it pins (lengths around a block boundary, q_len 0 and > 1 rows, shuffled and shared tables);
the edge tests' cases (:class:`Edge`, :class:`Edges`) as make_inputs keywords with launch hints."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, replace

import pytest
import torch

import kernels
from harness.cases.inputs import PagedInputs, make_inputs
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from kernels.contract import prepare_call
from kernels.tiling import tiling_for


@dataclass(frozen=True)
class KernelCase:
    name: str
    num_q_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 64
    block_size: int = 16
    seq_lens: tuple[int, ...] = (1, 15, 16, 17, 35)
    q_lens: tuple[int, ...] = (1, 0, 1, 2, 4)
    dtype: str = "float32"
    layout: str = "shuffled"
    input_scale: float = 1.0
    seed: int = 0
    q_scale: float = 1.0  # q alone multiplied by it after drawing (logits grow linearly)
    head_dim_v: int | None = None
    latent: bool = False  # v_cache a view of k_cache's first head_dim_v columns (MLA's latent cache)

    def __str__(self) -> str:
        return self.name

    def inputs(self, device: str = "cpu") -> PagedInputs:
        fields = asdict(self)
        del fields["name"], fields["q_scale"], fields["latent"]
        fields["seq_lens"], fields["q_lens"] = list(self.seq_lens), list(self.q_lens)
        inputs = make_inputs(**fields, device=device)
        if self.latent:
            inputs = replace(inputs, v_cache=inputs.k_cache[..., : inputs.v_cache.shape[-1]])
        return inputs if self.q_scale == 1.0 else replace(inputs, q=inputs.q * self.q_scale)


BASE = KernelCase("base")


def _vary(name: str, **changes) -> KernelCase:
    return replace(BASE, name=name, **changes)


MANY_TILES = {"num_q_heads": 4, "num_kv_heads": 4, "seq_lens": (90, 5), "q_lens": (40, 3)}  # a chunked prefill
KERNEL_CASES: list[KernelCase] = [
    BASE,
    # seq_lens around the block size (q_lens the base's 1, 0, 1, 2, 4); the base is block size 16's row
    *(
        _vary(f"block{bs}", block_size=bs, seq_lens=(1, max(bs - 1, 1), bs, bs + 1, 2 * bs + 3))
        for bs in (1, 5, 64, 256)
    ),
    _vary("mha", num_q_heads=4, num_kv_heads=4),
    _vary("mqa", num_q_heads=8, num_kv_heads=1),
    _vary("gqa_group6", num_q_heads=12, num_kv_heads=2),
    *(_vary(f"head_dim{d}", head_dim=d) for d in (32, 80, 96, 128, 256)),
    _vary("layout_contiguous", layout="contiguous"),
    _vary("layout_shared_prefix", layout="shared_prefix", seq_lens=(40, 35, 33, 48), q_lens=(1, 3, 0, 2)),
    _vary("prefill_full", seq_lens=(37, 20), q_lens=(37, 20)),
    _vary("prefill_chunk_many_tiles", **MANY_TILES),
    _vary("spec_verify", seq_lens=(50, 51, 52), q_lens=(5, 5, 5)),
    _vary("large_logits", input_scale=6.0),
    # 4 splits of 576 keys: the second sequence ends one key past a tile in its third split (its fourth empty)
    _vary("long", num_q_heads=4, num_kv_heads=1, seq_lens=(2100, 1665), q_lens=(1, 5)),
    # Few programs and long histories: the kernel splits the KV range (see choose_tiling).
    _vary("split_kv_decode", num_q_heads=8, num_kv_heads=1, seq_lens=(2500, 700, 1), q_lens=(1, 1, 1)),
    # The table's 1100-key capacity splits the KV range at 576: the first sequence's prefill
    # rows at positions 560..575 see no key of its second split (576..583): their partial max
    # stays -inf and must weigh nothing in the combine. The second's rows see both splits.
    _vary("split_kv_prefill_early_rows", num_q_heads=2, num_kv_heads=1, seq_lens=(584, 1100), q_lens=(24, 8)),
    *(
        _vary(f"{dt}_split_kv", dtype=dt, num_kv_heads=1, seq_lens=(1500, 1030), q_lens=(3, 1))
        for dt in ("float16", "bfloat16")
    ),
    # fp16 runs the half-precision tile loop on the CPU too (bf16 is interpreted with IEEE dots, which keeps
    # k_valid in the unmasked tiles, as fp32 does): a chunked prefill over many unmasked tiles in fp16
    _vary("float16_prefill_chunk_many_tiles", dtype="float16", **MANY_TILES),
    *(
        _vary(f"{dt}_prefill", dtype=dt, seq_lens=(1, 15, 40, 17), q_lens=(1, 0, 6, 2))
        for dt in ("float16", "bfloat16")
    ),
    *(_vary(f"{dt}_mqa_block5", dtype=dt, num_kv_heads=1, block_size=5) for dt in ("float16", "bfloat16")),
    _vary("bfloat16_large_logits", dtype="bfloat16", input_scale=6.0),
    # MLA's latent cache: V a view of K's first 512 of 576 columns, read from the K tile (kernels.tiling.latent_kv)
    _vary(
        "bfloat16_mla_latent",
        dtype="bfloat16",
        num_q_heads=32,
        num_kv_heads=1,
        head_dim=576,
        head_dim_v=512,
        latent=True,
    ),
]

# fp32 at logits near 150 (q scaled by 40) pins the softmax's own rounding against the oracle only:
# the two dots' summation orders differ by more than the tlsim-vs-triton closeness bound here.
FP32_PRECISION_CASES: list[KernelCase] = [
    _vary("large_logits_q40", seq_lens=(9, 20), q_lens=(3, 5), q_scale=40.0, seed=43),
]

CASES_BY_NAME = {case.name: case for case in (*KERNEL_CASES, *FP32_PRECISION_CASES)}


@functools.cache
def graded_inputs(case, device: str = "cpu", return_lse: bool = False) -> tuple[PagedInputs, torch.Tensor | tuple]:
    """A KernelCase's inputs, or a variant case's (its ``base`` and ``kwargs()``), and the oracle's output on them
    (with the lse if asked): made once a process for the backends of a grid, which only read them."""
    inputs = getattr(case, "base", case).inputs(device)
    options = case.kwargs(device) if hasattr(case, "kwargs") else {}
    return inputs, paged_attention_oracle(*inputs.args(), return_lse=return_lse, **options)


ARG_NAMES = ("q", "k_cache", "v_cache", "block_table", "seq_lens", "query_start_loc")


def base_args(**changes) -> list:
    """The base case's call arguments (ARG_NAMES; seq_lens 1, 15, 16, 17, 35, block_size 16), freshly made,
    each argument named in ``changes`` replaced by ``change(argument)``."""
    args = list(BASE.inputs().args())
    for name, change in changes.items():
        args[ARG_NAMES.index(name)] = change(args[ARG_NAMES.index(name)])
    return args


# Calls every backend refuses with a ValueError before any kernel runs: name -> (arguments, words of the message).
BAD_CALLS = {
    "q_not_3d": (base_args(q=lambda q: q[0]), "q must be"),
    "heads_not_multiple": (base_args(q=lambda q: q[:, :7].contiguous()), "multiple of num_kv_heads"),
    "dtype_mismatch": (base_args(k_cache=lambda k: k.half()), "must share one of"),
    "block_table_int64": (base_args(block_table=lambda bt: bt.long()), "must be int32"),
    "qsl_wrong_total": (base_args(query_start_loc=lambda qsl: torch.cat([qsl[:1], qsl[1:] - 1])), "query_start_loc"),
    "qsl_not_starting_at_zero": (
        base_args(query_start_loc=lambda qsl: torch.cat([qsl[:1] + 1, qsl[1:]])),
        r"query_start_loc\[0\] must be 0, got 1",
    ),
    "seq_len_past_table": (base_args(seq_lens=lambda s: s * 100), "exceeds max_blocks_per_seq"),
    # every seq_len 1; a sequence has q_len 4
    "q_len_past_seq_len": (base_args(seq_lens=torch.ones_like), "q_len <= seq_len"),
    "decode_default_with_prefill_rows": (base_args(query_start_loc=lambda qsl: None), "one query per sequence"),
}


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values, every other element of a twice-as-large buffer (its last dim's stride 2: not contiguous)."""
    view = torch.stack([t, torch.full_like(t, 12345)], dim=-1)[..., 0]
    assert not view.is_contiguous()
    return view


def needs_triton(device: str = "cpu"):
    """kernels.triton_paged; the calling test skips, with the reason, where the kernel cannot run on ``device``."""
    if reason := kernels.triton_unavailable_reason(device):
        pytest.skip(reason)
    from kernels import triton_paged

    return triton_paged


def describe_launch_arg(arg):
    """A launch argument as the kernel sees it: a tensor's metadata (its values are the caller's), else the value."""
    if isinstance(arg, torch.Tensor):
        return ("tensor", tuple(arg.shape), arg.stride(), arg.dtype, arg.data_ptr() % 16 == 0)
    return arg


class KernelRecorder:
    """Stands in for a @triton.jit kernel: records (grid, described arguments, keywords) in ``launches``, then runs
    ``kernel`` if given, with value reads allowed by ``guard`` (tests/conftest.py's ValueReadGuard), else nothing."""

    def __init__(self, kernel=None, guard=None):
        self.kernel, self.guard, self.launches = kernel, guard, []

    @property
    def grids(self) -> list:
        return [grid for grid, _, _ in self.launches]

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, tuple(map(describe_launch_arg, args)), kwargs))
            if self.kernel is not None:
                with self.guard.allowed():
                    return self.kernel[grid](*args, **kwargs)

        return launch


def backend_fn(name: str, device: str = "cpu"):
    """``kernels.paged_attention_<name>``; the test skips where that is the Triton kernel and it cannot run on
    ``device``."""
    if name == "triton":
        needs_triton(device)
    return getattr(kernels, f"paged_attention_{name}")


ON_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICES = ["cpu", pytest.param("cuda", marks=ON_CUDA)]
BACKENDS = ("reference", "tlsim", "triton", "dispatch", "cache")  # cache: the engine's path, through dispatch


def backend_grid(cases: list, with_device: bool = False) -> list:
    """(case, backend[, device]) rows, ids ``case-backend[-device]``: every backend on every case, but "dispatch" on
    the CPU on the first case only. There it calls tlsim with the row's own arguments: its other rows would repeat
    the tlsim rows. With ``with_device``, CUDA rows too (every one kept)."""
    devices = [("cpu", ()), ("cuda", ON_CUDA)][: 1 + with_device]
    return [
        pytest.param(case, backend, *[device][:with_device], marks=marks,
                     id="-".join([str(case), backend, *[device][:with_device]]))
        for case in cases
        for backend in BACKENDS
        for device, marks in devices
        if backend != "dispatch" or device == "cuda" or case is cases[0]
    ]  # fmt: skip


def run_backend(name: str, inputs: PagedInputs, args: tuple | None = None, **kwargs):
    """Backend ``name`` on ``args`` (default: the inputs') into a NaN out it must return; "cache": the engine's path,
    layer 1 of a kernels.PagedKVCache of the dtype of ``args``' k_cache written with the inputs, then read."""
    args = args or inputs.args()
    if name == "cache":
        scales = {key: kwargs.pop(key) for key in ("k_scale", "v_scale") if key in kwargs}
        k_cache, block_size = inputs.k_cache, inputs.k_cache.shape[1]
        cache = kernels.PagedKVCache(
            num_layers=2, num_blocks=sum(-(-n // block_size) for n in inputs.seq_lens.tolist()) + 3,
            block_size=block_size, num_kv_heads=k_cache.shape[2], head_dim=k_cache.shape[3],
            dtype=args[1].dtype, device=k_cache.device, head_dim_v=inputs.v_cache.shape[3], **scales,
        )  # fmt: skip
        seq_ids = list(range(100, 100 + inputs.seq_lens.shape[0]))
        for seq_id, keys, values in zip(seq_ids, inputs.keys, inputs.values, strict=True):
            cache.allocate(seq_id)
            cache.write(1, cache.append(seq_id, keys.shape[0]), keys, values)
        return cache.paged_attention(1, inputs.q, seq_ids, inputs.query_start_loc, out=inputs.new_out(), **kwargs)
    out = inputs.new_out()
    result = backend_fn(name, inputs.q.device.type)(*args, out=out, **kwargs)
    assert (result[0] if isinstance(result, tuple) else result) is out, "out must be written in place and returned"
    return result


def assert_passes(got, expected, tolerance: tuple[float, float], what: str = "") -> None:
    """``got`` passes the grade against the oracle's ``expected`` at (atol, rtol); each may be an (out, lse) pair."""
    pairs = zip(*(x if isinstance(x, tuple) else (x,) for x in (got, expected)), strict=True)
    for name, (result, truth) in zip(("out", "lse"), pairs, strict=False):
        graded = grade(result, truth, *tolerance)
        assert graded.passed, f"{what} {name}: {graded.reason} (tol_ratio {graded.tol_ratio:.2f})"


def assert_tlsim_close(sim, real, dtype: torch.dtype, share: float = 0.5, ulps: int = 2, what: str = "") -> None:
    """tlsim within ``share`` of the kernel's fp32 tolerance, or in half precision ``ulps`` output ulps."""
    gap = (sim.double() - real.double()).abs()
    if dtype == torch.float32:
        atol, rtol = DEFAULT_TOLERANCES["float32"]
        allowed = share * (atol + rtol * real.double().abs())
    else:
        allowed = ulps * torch.finfo(dtype).eps * real.double().abs().clamp_min(2**-6)
    assert bool((gap <= allowed).all()), f"{what}: tlsim is {float(gap.max()):.3g} from the kernel"


@dataclass(frozen=True)
class Edge:
    """An edge case: its lengths, make_inputs keywords over its set's base, launch hints (default: the true)."""

    name: str
    seq_lens: tuple[int, ...]
    q_lens: tuple[int, ...]
    fields: dict = field(default_factory=dict)
    hints: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


def call_hints(case: Edge) -> dict:
    """The launch hints of ``case``: the true max q_len and seq_len unless the case gives its own."""
    return {"max_q_len": max(case.q_lens), "max_seq_len": max(case.seq_lens), **case.hints}


class Edges:
    """Edge cases over one base (make_inputs keywords), by name; inputs and oracle outputs built once a process."""

    def __init__(self, base: dict, cases: list[Edge]):
        self.base, self.cases = base, cases
        self.by_name = {case.name: case for case in cases}
        self.inputs, self.expected = functools.cache(self._inputs), functools.cache(self._expected)

    def _inputs(self, name: str) -> PagedInputs:
        case = self.by_name[name]
        return make_inputs(**{**self.base, **case.fields, "seq_lens": list(case.seq_lens), "q_lens": list(case.q_lens)})

    def _expected(self, name: str) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The oracle's output (with the lse where the case asks for it)."""
        inputs = self.inputs(name)
        return paged_attention_oracle(*inputs.args(), **inputs.options)

    def tiling(self, name: str):
        """The tiling of the case's call with its hints and options (the lse aside: it changes no tile)."""
        options = {k: v for k, v in self.inputs(name).options.items() if k != "return_lse"}
        return tiling_for(prepare_call(*self.inputs(name).args(), **options), **call_hints(self.by_name[name]))

    def assert_matches_oracle(self, backend: str, case: Edge) -> None:
        """Backend ``backend`` on the case (its launch hints and options, a NaN out): the output passes the grade at
        the case dtype's tolerance, and its lse (if asked) at fp32's."""
        inputs, expected = self.inputs(case.name), self.expected(case.name)
        got = backend_fn(backend)(*inputs.args(), out=inputs.new_out(), **call_hints(case), **inputs.options)
        if isinstance(expected, tuple):
            assert_passes(got[1], expected[1], DEFAULT_TOLERANCES["float32"], f"{backend} lse:")
            got, expected = got[0], expected[0]
        assert_passes(got, expected, DEFAULT_TOLERANCES[case.fields.get("dtype", "float32")], backend)
