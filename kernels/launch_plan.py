"""Launch plans: what a repeated call with the same shapes may skip on the host.

A kernel call's host work (the contract's checks, the tiling, the grid, Triton's binding of ~60 arguments)
depends on the arguments' metadata and the host options only, never on tensor values. So the first call of a
kind builds a *plan* and files it under a key of exactly those inputs (:func:`call_key`): each tensor's shape,
strides, dtype, device and data_ptr mod 16 (Triton specializes on it), whether v_cache starts where k_cache
does, each host scalar with its exact type and value (``True`` never meets ``1``), the keyword options in the
caller's order, the tuning override and, on CUDA, the current device. An argument of another type makes the
call uncacheable: the full path checks (and usually rejects) it. A hit skips the metadata checks (they passed
for this key); the value checks run on every call that asks for them.

The key does not see ``kernels.tuning.TUNED``, ``kernels.tiling``'s WIDE_HEADS, V_PART_DIM or LATENT_KV, or
``kernels.triton_paged``'s KV_TMA edited at run time: call :func:`clear_plans` after such an edit. Each kernel's
cache keeps :data:`MAX_PLANS` plans, least recently used dropped first; ``PAGED_ATTN_PLAN_CACHE=0`` in the
environment (read at import) or :func:`plans_enabled` turns them off.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

from . import tuning
from .contract import CALL_OPTION_TABLE, DEVICE_OPTIONS, contiguous_strides

MAX_PLANS = 256

_enabled = os.environ.get("PAGED_ATTN_PLAN_CACHE", "1") != "0"
_caches: list[PlanCache] = []
_SCALARS = (int, float, bool)


class _Uncacheable(Exception):
    """An argument the key cannot describe exactly: the call takes the full path."""


@contextlib.contextmanager
def plans_enabled(flag: bool) -> Iterator[None]:
    """Inside the block the plan caches are on (``flag`` True) or off (and emptied); the previous state after."""
    global _enabled
    saved, _enabled = _enabled, bool(flag)
    if not _enabled:
        clear_plans()
    try:
        yield
    finally:
        _enabled = saved
        if not saved:
            clear_plans()


def clear_plans() -> None:
    """Forget every plan of every cache (after editing kernels.tuning.TUNED in place, say)."""
    for cache in _caches:
        cache.clear()


def _describe_host_scalar(x: Any) -> Any:
    """A host-scalar argument's part of the key: None or (type, value). A tensor there is read for its value by the
    full path (``float(scale)``), which a key of its metadata would not see change: not cached."""
    if x is None:
        return None
    if type(x) in _SCALARS:
        return (type(x), x)
    raise _Uncacheable


def _describe(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15)
    return _describe_host_scalar(x)


# Each call option's part of the key, by name: a host option is read for its value, a device option
# for its metadata (kernels.contract.OptionKind).
_OPTION_KEY = {o.name: _describe_host_scalar if o.kind.host else _describe for o in CALL_OPTION_TABLE}


def call_key(
    q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out, max_q_len, max_seq_len, return_lse,
    options,
) -> tuple | None:  # fmt: skip
    """The plan key of a contract call (``options``: its keyword options), or None: not cacheable, or the plans
    are off. Spelled out flat rather than as a loop: it runs on every call, and its cost is the floor of a hit's.
    """
    if not _enabled:
        return None
    if not (type(q) is type(k_cache) is type(v_cache) is type(block_table) is type(seq_lens) is torch.Tensor):
        return None  # a subclass or another type: the full path decides
    k_ptr, v_ptr = k_cache.data_ptr(), v_cache.data_ptr()
    try:
        key = (
            q.shape, q.stride(), q.dtype, q.device, q.data_ptr() & 15,
            k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device, k_ptr & 15,
            v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.device, v_ptr & 15,
            v_ptr == k_ptr,  # V a view of K's first columns (kernels.tiling.latent_kv)
            block_table.shape, block_table.stride(), block_table.dtype, block_table.device, block_table.data_ptr() & 15,
            seq_lens.shape, seq_lens.stride(), seq_lens.dtype, seq_lens.device, seq_lens.data_ptr() & 15,
            None if query_start_loc is None else _describe(query_start_loc),
            None if scale is None else _describe_host_scalar(scale),
            None if out is None else _describe(out),
            None if max_q_len is None else _describe_host_scalar(max_q_len),
            None if max_seq_len is None else _describe_host_scalar(max_seq_len),
            return_lse if type(return_lse) is bool else _describe(return_lse),  # True, False, or (type, value)
            tuple([(name, _OPTION_KEY[name](value)) for name, value in options.items()]) if options else (),
            tuning._override,
            # a compiled kernel belongs to the device current at its first launch
            torch.cuda.current_device() if q.is_cuda else None,
        )  # fmt: skip
    except (_Uncacheable, KeyError):  # KeyError: no such option
        return None
    return key


# The device options' checks in DEVICE_OPTIONS order, and what a call without them hands the launch.
_DEVICE_CHECKS = tuple((o.name, o.check) for o in CALL_OPTION_TABLE if not o.kind.host)
_NO_DEVICE_OPTIONS = (None,) * len(DEVICE_OPTIONS)


class CallRecipe:
    """A plan hit's whole replay: the per-call work of ``prepare_call``, ``prepare_out`` and ``prepare_lse``,
    decided once from the key's metadata, then ``plan.launch``. ``run(q, k_cache, v_cache, block_table, seq_lens,
    query_start_loc, out, options)`` makes the tensors the full path would have made, launches, and returns
    ``out`` or ``(out, lse)``; a call with nothing to do but allocate ``out`` runs a shorter method.
    """

    __slots__ = ("convert", "copy_index", "lse_shape", "out_like_q", "out_shape", "plan", "run")

    def __init__(self, call, out_given: bool, lse: torch.Tensor | None, raw_index, raw_options, plan):
        """``call``: the checked PagedCall; ``raw_index`` (block_table, seq_lens, query_start_loc) and
        ``raw_options``: as the caller passed them; ``plan``: what the kernel's entry returned."""
        self.copy_index = tuple(t is not None and not t.is_contiguous() for t in raw_index)
        q = call.q
        self.out_shape = None if out_given else (*q.shape[:2], call.head_dim_v)
        # empty_like(q) is a little cheaper than q.new_empty(out_shape) and the same when q is contiguous of that shape.
        self.out_like_q = self.out_shape == tuple(q.shape) and q.stride() == contiguous_strides(q.shape)
        self.lse_shape = None if lse is None else tuple(lse.shape)
        self.plan = plan
        # Per device option, its check where that handed the kernel another object than the one given (a copy, a
        # scale made a tensor), else None: the key's metadata decides which. None: nothing to convert.
        convert = tuple((name, None if getattr(call, name) is raw_options.get(name) else check)
                        for name, check in _DEVICE_CHECKS)  # fmt: skip
        self.convert = convert if any(check for _, check in convert) else None
        plain = self.convert is None and not any(self.copy_index) and lse is None
        self.run = self._run_plain if plain else self._run

    def _run_plain(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, options):
        """``run`` when nothing is copied, every device option goes as given and no lse is asked for."""
        if out is None:  # the key says: out was not given when the plan was made either
            out = torch.empty_like(q) if self.out_like_q else q.new_empty(self.out_shape)
        device_options = map(options.get, DEVICE_OPTIONS) if options else _NO_DEVICE_OPTIONS
        self.plan.launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, None, *device_options)
        return out

    def _run(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, options):
        copy_bt, copy_sl, copy_qsl = self.copy_index
        block_table = block_table.contiguous() if copy_bt else block_table
        seq_lens = seq_lens.contiguous() if copy_sl else seq_lens
        query_start_loc = query_start_loc.contiguous() if copy_qsl else query_start_loc
        if self.convert is None:
            device_options = tuple(map(options.get, DEVICE_OPTIONS)) if options else _NO_DEVICE_OPTIONS
        else:  # the checks passed for this key: here they only convert (contiguous; a host float becomes a device fill)
            device_options = tuple([options.get(name) if check is None else check(name, options.get(name), q, k_cache)
                                    for name, check in self.convert])  # fmt: skip
        if self.out_shape is not None:
            out = torch.empty_like(q) if self.out_like_q else q.new_empty(self.out_shape)
        lse = None if self.lse_shape is None else q.new_empty(self.lse_shape, dtype=torch.float32)
        self.plan.launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, lse, *device_options)
        return out if lse is None else (out, lse)


class PlanCache:
    """Up to ``size`` plans by :func:`call_key`, the least recently used dropped first, kept the "second chance"
    way so that a hit costs one dict lookup: a hit marks its entry; when full, the oldest entry is dropped if
    unmarked, else unmarked and moved to the back. Inserts hold a lock; the hit and miss counts are approximate.
    """

    def __init__(self, size: int = MAX_PLANS):
        self.size = size
        self._plans: dict[tuple, list] = {}  # key -> [plan, used since it last reached the front]
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        _caches.append(self)

    # A staticmethod so that ``plans.key(...)`` is one Python call, not a bound method forwarding *args.
    key = staticmethod(call_key)
    recipe = CallRecipe  # what a hit of this call replays: the thing to file

    def get(self, key: tuple):
        entry = self._plans.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        entry[1] = True
        return entry[0]

    def put(self, key: tuple, plan) -> None:
        with self._lock:
            self._plans.pop(key, None)
            self._plans[key] = [plan, False]
            while len(self._plans) > self.size:
                oldest = next(iter(self._plans))
                entry = self._plans.pop(oldest)
                if entry[1]:  # used since it was filed or last moved: a second chance at the back
                    entry[1] = False
                    self._plans[oldest] = entry

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self.hits = self.misses = 0

    def plans(self) -> list:
        """The plans kept (their :class:`CallRecipe`, whose ``plan`` is the kernel's), oldest first."""
        with self._lock:
            return [entry[0] for entry in self._plans.values()]

    def __len__(self) -> int:
        return len(self._plans)


# --- the launch itself: Triton's JIT entry once, then its compiled kernel -----------------------

_fast_launch_error: str | None = None  # why the compiled-kernel launch was given up, if it was


def fast_launch_status() -> str:
    """How plan hits launch on CUDA: "compiled kernel", or why they fell back to Triton's JIT entry."""
    return "compiled kernel" if _fast_launch_error is None else f"JIT entry ({_fast_launch_error})"


class KernelLaunch:
    """One @triton.jit kernel's launch in a plan: the grid, the plan's scalars, constexprs and launch options.

    ``launch(kernel, *tensors)``: the first launch (and every one under the interpreter) is ``kernel[grid](
    *tensors, *scalars, **constexprs, **options)``; later CUDA launches call the CompiledKernel it returned
    directly (``compiled[grid]`` with every argument in signature order, on the device's current stream), valid
    because the plan's key fixes everything Triton specializes on, and only while ``kernel`` is still that JIT
    function. If that launch raises, every plan falls back to the JIT entry for the rest of the process.
    """

    __slots__ = ("compiled", "constexpr_values", "constexprs", "device_index", "grid", "grid3", "jit", "options",
                 "runner", "scalars", "stream_of", "tail", "want_compiled")  # fmt: skip

    def __init__(self, grid: tuple, constexprs: dict, options: dict, cuda: bool, scalars: tuple = ()):
        self.grid, self.grid3 = grid, (*grid, 1, 1)[:3]
        self.constexprs, self.options, self.scalars = constexprs, options, scalars
        self.want_compiled = cuda
        self.compiled = self.jit = self.constexpr_values = self.runner = self.tail = None
        self.device_index, self.stream_of = 0, None

    def __call__(self, kernel, *tensors) -> None:
        global _fast_launch_error
        if kernel is self.jit and _fast_launch_error is None:  # jit: None until a compiled kernel is adopted
            try:
                if self.runner is None:  # tail first: another thread sees a runner only with its tail
                    self.tail = (*self.scalars, *self.constexpr_values)
                    self.runner = self.compiled[self.grid3]
                if self.stream_of is None:
                    self.runner(*tensors, *self.tail)
                else:  # the current stream of the plan's device, as the runner would look it up itself
                    self.runner(*tensors, *self.tail, stream=self.stream_of(self.device_index))
                return
            except Exception as error:  # an API this Triton lacks: the JIT entry from now on
                _fast_launch_error = f"{type(error).__name__}: {error}"
        compiled = kernel[self.grid](*tensors, *self.scalars, **self.constexprs, **self.options)
        if self.want_compiled and self.compiled is None and _fast_launch_error is None:
            self._adopt(kernel, compiled, len(tensors) + len(self.scalars))

    def _adopt(self, kernel, compiled, num_runtime: int) -> None:
        """Keep ``compiled`` for later launches if it is a CompiledKernel of the JIT function ``kernel``
        whose parameters after the runtime ones are exactly this launch's constexprs."""
        global _fast_launch_error
        try:
            from triton.compiler import CompiledKernel
            from triton.runtime import JITFunction

            names = list(kernel.arg_names) if isinstance(kernel, JITFunction) else None
        except Exception as error:  # any import or attribute failure: no fast launch
            _fast_launch_error = f"{type(error).__name__}: {error}"
            return
        if names is None or not isinstance(compiled, CompiledKernel) or not hasattr(compiled, "__getitem__"):
            return
        if sorted(names[num_runtime:]) != sorted(self.constexprs):
            return
        self.constexpr_values = tuple(self.constexprs[name] for name in names[num_runtime:])
        self.compiled, self.jit = compiled, kernel
        # The key fixes the device, so a hit passes the current raw stream itself, as Triton's runner would look it up.
        self.device_index = torch.cuda.current_device()
        self.stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)
