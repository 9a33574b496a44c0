"""A backend's calls, made where the backend runs (no oracle: a plugin's run in a worker): outputs and
timings come back as plain values, never a verdict. Every timed call is checked: V's sign bits flipped
every ``FLIP_EVERY``-th call, ``out`` poisoned with NaN before each, every timed output compared with the
first, the last graded on the driver's flip. What each catches: docs/contract.md, "Threat model"."""

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from harness.backends.registry import Backend, Prepared, Unsupported, timed_us
from harness.cases.inputs import PagedInputs
from harness.cases.spec import Case
from harness.run.guard import InputGuard, check_output, raised_by_backend
from harness.timing.measure import TimingSettings, timing_columns
from harness.timing.phases import phase

# The note of a row graded but not timed because its one call outlasted the timing budget (compare reads it).
NOT_TIMED = "not timed: one call took"
# The inputs change before the first timed call and then every FLIP_EVERY-th (a flip is a pass over V).
FLIP_EVERY = 16
_INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # by element size


def sign_mask(seed: int, case: Case) -> torch.Tensor:
    """[num_kv_heads, head_dim_v] bool: the V columns of ``case`` a flip negates, drawn from ``seed`` (about half)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(case.num_kv_heads, case.head_dim_v, generator=generator) < 0.5


def expected_under(expected: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The oracle's output [num_tokens, num_q_heads, head_dim_v] for inputs whose V columns ``mask``
    ([num_kv_heads, head_dim_v]) are negated: those columns of each q head's KV head negated."""
    group = expected.shape[1] // mask.shape[0]
    signs = 1.0 - 2.0 * mask.to(expected.device, expected.dtype).repeat_interleave(group, dim=0)
    return expected * signs


def _xor_pair(tensor: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``tensor`` viewed as integers, ``mask`` [H, D] as the sign bits to XOR into its ``[..., H, D]``)."""
    ints = tensor.view(_INTS[tensor.element_size()])
    return ints, torch.where(mask, torch.iinfo(ints.dtype).min, 0).to(ints.dtype).to(tensor.device)


class Flipper:
    """Flips V's columns (a latent cache: and q's) in place and back, by an XOR of the sign bits: exact in any dtype."""

    def __init__(self, inputs: PagedInputs, latent: bool):
        self.inputs, self.latent, self.state = inputs, latent, None  # state: the mask applied now
        self._bits: dict[int, tuple] = {}  # id(mask) -> (mask, [(tensor viewed as ints, bits)])

    def _pairs(self, mask: torch.Tensor) -> list:
        if id(mask) not in self._bits:
            pairs = [_xor_pair(self.inputs.v_cache, mask)]
            if self.latent:  # V is K's first columns: flip q's too, so every score stays as it was
                q = self.inputs.q
                wide = torch.zeros(q.shape[1], q.shape[2], dtype=torch.bool)
                wide[:, : mask.shape[1]] = mask.repeat_interleave(q.shape[1] // mask.shape[0], dim=0)
                pairs.append(_xor_pair(q, wide))
            self._bits[id(mask)] = (mask, pairs)
        return self._bits[id(mask)][1]

    def set(self, mask: torch.Tensor | None) -> None:
        """Make ``mask`` the flip in force (None: the pristine inputs)."""
        for applied in (self.state, mask):
            if applied is not None:
                for ints, bits in self._pairs(applied):
                    ints.bitwise_xor_(bits)
        self.state = mask


def split_result(raw, want_lse: bool) -> tuple[object, object, str]:
    """(out, lse or None, problem) of a call's result; with ``want_lse`` it must be a tuple (out, lse)."""
    if not want_lse:
        return raw, None, ""
    if isinstance(raw, tuple) and len(raw) == 2:
        return raw[0], raw[1], ""
    return raw, None, f"return_lse=True returned {type(raw).__name__}, not a tuple (out, lse)"


def out_contract(prepared: Prepared, packed) -> str:
    """'' unless the call was handed ``out`` and left it unwritten: the contract's result is ``out``, or
    at least its values are in ``out`` (an engine reads ``out``)."""
    out = prepared.out
    if out is None or not isinstance(packed, torch.Tensor) or packed is out:
        return ""
    if packed.shape == out.shape and (
        packed.data_ptr() == out.data_ptr() or torch.equal(packed.detach().to(out.dtype).nan_to_num(), out.nan_to_num())
    ):
        return ""
    return "returned a tensor other than out and left out unwritten (the contract: write out, return it)"


@dataclass
class Called:
    """What a backend's calls gave, before any grading (plain values: it crosses a process boundary)."""

    status: str = ""  # "" (called), "skip" or "error" (``out`` is kept when the graded call had returned)
    reason: str = ""
    note: str = ""
    out: torch.Tensor | None = None  # the graded call's output [num_tokens, num_q_heads, head_dim_v]
    lse: torch.Tensor | None = None  # [num_tokens, num_q_heads]
    problem: str = ""  # what was wrong with the graded call besides its values
    outputs: list[tuple[str, int | None, torch.Tensor]] = field(default_factory=list)  # (label, mask seed, out)
    timed_problem: str = ""  # the first timed call whose output differed from its inputs' graded output
    timing: dict = field(default_factory=dict)  # harness.timing.measure.timing_columns, when timed

    def to_message(self) -> dict:
        """A plain dict of CPU tensors, strings and numbers (what a worker sends)."""

        def cpu(t):
            return None if t is None else t.detach().cpu().clone()

        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "out": cpu(self.out), "lse": cpu(self.lse),
                "outputs": [[label, seed, cpu(t)] for label, seed, t in self.outputs]}  # fmt: skip

    @classmethod
    def from_message(cls, message: dict) -> "Called":
        outputs = [(str(label), seed, t) for label, seed, t in message.get("outputs", [])]
        return cls(**{**message, "outputs": outputs})


class Checks:
    """The sample hooks of one measurement: poison, flip, compare. A timed output is compared with the first by
    ``sum(w * out)``, w fixed and random: within tolerance, by ``sum(|w| * (atol + rtol * |first|))`` + round-off."""

    def __init__(self, what: str, prepared: Prepared, flipper: Flipper | None, refs: dict, called: Called,
                 case: Case, seeds: tuple[int, int], counter: list[int], want_lse: bool):  # fmt: skip
        self.what, self.prepared, self.flipper, self.refs, self.called = what, prepared, flipper, refs, called
        self.case, self.counter, self.want_lse = case, counter, want_lse
        self.alternate_seed, self.final_seed = seeds  # the flip of every other call, the last call's
        self.alternate, self.final = (sign_mask(seed, case) for seed in seeds)
        self.seed_now: int | None = None
        self.samples = 0
        self.sums: list[tuple[int, torch.Tensor, tuple]] = []  # (call number, its weighted sum, its reference)

    def before(self, final: bool) -> None:
        if self.flipper is not None:
            if final:
                self.seed_now = self.final_seed
                self.flipper.set(self.final)
            elif self.samples % FLIP_EVERY == 0:  # the first timed call on changed inputs, then every FLIP_EVERY-th
                self.seed_now = None if self.flipper.state is not None else self.alternate_seed
                self.flipper.set(None if self.seed_now is None else self.alternate)
        self.samples += 1
        if self.prepared.out is not None:
            self.prepared.out.fill_(float("nan"))

    def _reference(self, key, output: torch.Tensor) -> tuple:
        """(weights, weighted sum, allowed difference) of a reference output, kept in ``refs[key]``."""
        weights = self.refs.get("weights")
        if weights is None or weights.shape != output.shape or weights.device != output.device:
            generator = torch.Generator().manual_seed(self.alternate_seed)
            weights = torch.rand(output.shape, generator=generator, dtype=torch.float32).to(output.device)
            self.refs["weights"] = weights
        first = output.float()
        total = (weights * first).sum()
        scale = (weights * first.abs()).sum()
        allowed = (weights * (self.case.atol + self.case.rtol * first.abs())).sum() + 1e-5 * scale
        self.refs[("sum", key)] = (weights, total, allowed)
        return self.refs[("sum", key)]

    def _problem(self, what: str) -> None:
        self.called.timed_problem = self.called.timed_problem or f"{self.what} {what}"

    def after(self, result, final: bool) -> None:
        self.counter[0] += 1
        packed = self.prepared.to_packed(split_result(result, self.want_lse)[0])
        if not isinstance(packed, torch.Tensor):
            self._problem(f"call {self.counter[0]} returned {type(packed).__name__}")
            return
        key = self.seed_now
        if final or key not in self.refs:  # the driver grades it: a copy, on the timed stream right after the call
            snapshot = packed.detach().clone()
            if final:
                label = f"{self.what} call {self.counter[0]} (the last, on fresh inputs)"
            else:
                self.refs[key] = snapshot
                label = f"{self.what} call {self.counter[0]} (inputs changed)"
            self.called.outputs.append((label, key, snapshot))
            return
        reference = self.refs.get(("sum", key)) or self._reference(key, self.refs[key])
        if reference[0].shape != packed.shape:
            self._problem(f"call {self.counter[0]} returned shape {tuple(packed.shape)}")
            return
        self.sums.append((self.counter[0], (reference[0] * packed.float()).sum(), reference))

    def finish(self) -> None:
        """Read the comparisons (one sync) and put the inputs back as they were."""
        if self.flipper is not None:
            self.flipper.set(None)
        if self.sums:
            got = torch.stack([total for _, total, _ in self.sums])
            want = torch.stack([reference[1] for _, _, reference in self.sums])
            allowed = torch.stack([reference[2] for _, _, reference in self.sums])
            off = (~((got - want).abs() <= allowed)).tolist()  # NaN is off
            if True in off:
                number = self.sums[off.index(True)][0]
                self._problem(f"call {number} differs from the first output of its inputs (beyond atol "
                              f"{self.case.atol:g} + rtol {self.case.rtol:g}): right once, then not")  # fmt: skip
        self.sums.clear()


def call_backend(case: Case, inputs: PagedInputs, guard: InputGuard | None, backend: Backend, device: str,
                 settings: TimingSettings | None, seeds: tuple[int, int, int],
                 batch: Callable[[Prepared, Called], None] | None = None) -> Called:  # fmt: skip
    """Prepare ``backend`` on ``inputs``, make its graded call, time it (``settings``; None: not timed) checking every
    timed call (``seeds``: the driver's flips); ``batch(prepared, called)`` after: calls a worker's driver times."""
    called = Called()
    if reason := backend.skip_reason(case, device):
        return Called(status="skip", reason=reason)
    cuda, want_lse = torch.device(device).type == "cuda", "return_lse" in inputs.options
    out = inputs.new_out()  # NaN: an element the backend does not write fails
    try:
        with phase("graded call"):
            prepared = backend.prepare(case, inputs, out)
    except Unsupported as refusal:  # the backend cannot serve this case: a skip with its reason
        return Called(status="skip", reason=str(refusal))
    except BaseException as error:
        return _raised(called, error, guard)
    called.note = prepared.note
    try:
        with phase("graded call"):
            raw, graded_us = timed_us(prepared.run, cuda)
        raw, lse, lse_problem = split_result(raw, want_lse)
        packed = prepared.to_packed(raw)
        with phase("guard"):
            mutated = guard.check("in its graded call") if guard else ""
        problems = [mutated, check_output(packed, inputs.q, case.head_dim_v), out_contract(prepared, packed),
                    lse_problem]  # fmt: skip
        called.problem = "; ".join(filter(None, problems))
        called.out = packed.detach().clone() if isinstance(packed, torch.Tensor) else None
        called.lse = lse.detach().clone() if isinstance(lse, torch.Tensor) else None
        if settings is None:
            return called
        over_budget = settings.budget_s is not None and graded_us > settings.budget_s * 1e6
        if over_budget and cuda and not backend.model:
            # A graded call on a GPU may have compiled (Triton's JIT, torch.compile, cuDNN's plans): a second
            # call says what a call costs. On a CPU nothing compiles: the first call decides.
            with phase("graded call"):
                graded_us = timed_us(prepared.run, cuda)[1]
            over_budget = graded_us > settings.budget_s * 1e6
        if over_budget:
            why = "a Python model on a GPU is graded, not timed" if settings.budget_s == 0 else (
                f"past the row's {settings.budget_s:g} s timing budget")  # fmt: skip
            called.note = "; ".join(filter(None, [called.note, f"{NOT_TIMED} {graded_us / 1e6:.1f} s, {why}"]))
            return called
        flipper = Flipper(inputs, latent=bool(case.latent_kv)) if prepared.follows_inputs else None
        refs = {None: called.out} if called.out is not None else {}  # flip seed -> the first output it gave
        counter, checks = [0], []

        def make(what: str) -> Checks:
            final = seeds[1] if what == "latency" else seeds[2]
            checks.append(Checks(what, prepared, flipper, refs, called, case, (seeds[0], final), counter, want_lse))
            return checks[-1]

        try:
            called.timing = timing_columns(case, backend, prepared, settings, hooks=make)
        finally:
            for check in checks:
                check.finish()
            if flipper is not None:
                flipper.set(None)
        if batch is not None and called.timing:
            with phase("timing: batch"):
                batch(prepared, called)
        with phase("guard"):
            if timed_problem := guard.check("while timed") if guard else "":
                called.problem = "; ".join(filter(None, [called.problem, timed_problem]))
    except Unsupported as refusal:  # raised from a call, not from prepare: the backend broke its word
        return _raised(called, refusal, guard, what="Unsupported from a call (not from prepare)")
    except BaseException as error:
        return _raised(called, error, guard)
    return called


def error_reason(error: BaseException) -> str:
    """``Type: first line of the message (at file:line)``: an error row's reason."""
    last = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno})" if last else ""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message[:300]}{where}"


def _raised(called: Called, error: BaseException, guard: InputGuard | None, what: str = "") -> Called:
    """``called`` as an error row (the inputs restored); ``error`` raised again unless :func:`raised_by_backend`."""
    if not raised_by_backend(error):
        raise error  # the user's Ctrl-C, or SIGTERM
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    mutated = guard.check("before it raised") if guard else ""
    reason = f"{what}: {error_reason(error)}" if what else error_reason(error)
    called.status, called.reason = "error", "; ".join(filter(None, [reason, mutated]))
    return called
