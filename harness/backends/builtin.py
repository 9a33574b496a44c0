"""The built-in backends: the kernels under test (reference, tlsim, triton, through the contract) and the engine
path (cache); the peers are in :mod:`harness.backends.peers`, the registry (re-exported here) in its own module."""

import difflib
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch

import kernels
from harness.backends.plugins import CaseFacts, Limits
from harness.backends.registry import (
    REGISTRY,
    Backend,
    Prepared,
    Unsupported,
    add_backend,
    contract_prepare,
    facts_of,
    load_plugin,
)
from harness.cases.inputs import PagedInputs
from harness.cases.spec import Case
from harness.cases.variants import VARIANT_KEYS, variant_key

__all__ = ["REGISTRY", "Backend", "CaseFacts", "Limits", "Prepared", "Unsupported", "load_plugin", "register_backend",
           "resolve_backends"]  # fmt: skip


def _triton_unavailable(case: Case, device: str) -> str | None:
    if reason := kernels.triton_unavailable_reason(device):
        return reason
    if torch.device(device).type == "cpu" and "small" not in case.tags:
        return "the Triton interpreter is slow: on the CPU it runs only cases tagged 'small'"
    return None


def _prepare_cache(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """Write every sequence through PagedKVCache's slot mapping; time its dispatched read."""
    device = inputs.q.device
    cache = kernels.PagedKVCache(num_layers=1, num_blocks=case.blocks_needed, block_size=case.block_size,
                                 num_kv_heads=case.num_kv_heads, head_dim=case.head_dim, dtype=inputs.k_cache.dtype,
                                 device=device, head_dim_v=case.head_dim_v, k_scale=inputs.options.get("k_scale"),
                                 v_scale=inputs.options.get("v_scale"))  # fmt: skip
    options = {name: value for name, value in inputs.options.items() if name not in ("k_scale", "v_scale")}
    seq_ids = list(range(case.num_seqs))
    for seq_id, keys, values in zip(seq_ids, inputs.keys, inputs.values, strict=True):
        cache.allocate(seq_id)
        cache.write(0, cache.append(seq_id, keys.shape[0]), keys, values)
    chosen = kernels.select_backend(device)
    # run(): a step's read with its metadata built once (as an engine does); call(): by sequence ids, built each call.
    step = cache.step_metadata(seq_ids, inputs.query_start_loc.cpu())
    return Prepared(run=lambda: cache.paged_attention(0, inputs.q, step, out=out, **options),
                    call=lambda: cache.paged_attention(0, inputs.q, seq_ids, inputs.query_start_loc, **options),
                    note=f"dispatch -> {chosen}; step metadata built once")  # fmt: skip


add_backend(Backend("reference", contract_prepare(kernels.paged_attention_reference), ("cpu", "cuda"), "kernel",
                    "gather each sequence's slots, SDPA in fp32 (the engine's fallback oracle)",
                    variants=frozenset(VARIANT_KEYS), model=True))  # fmt: skip
add_backend(Backend("tlsim", contract_prepare(kernels.paged_attention_tlsim), ("cpu", "cuda"), "kernel",
                    "the Triton kernel's streaming algorithm in torch", variants=frozenset(VARIANT_KEYS), model=True))  # fmt: skip


def _triton(*args, **kwargs) -> torch.Tensor:
    """kernels.paged_attention_triton, looked up at call time (Triton is imported only when a row runs)."""
    return kernels.paged_attention_triton(*args, **kwargs)


# run() passes the host-side lengths an engine knows, as an engine calls the kernel; call() does not.
add_backend(Backend("triton", contract_prepare(_triton, decode_form=False, max_q_len=lambda c: max(c.q_lens), max_seq_len=lambda c: c.max_seq_len),
                    ("cpu", "cuda"), "kernel", "the @triton.jit kernel (interpreted on the CPU)",
                    unavailable=_triton_unavailable, variants=frozenset(VARIANT_KEYS)))  # fmt: skip
# PagedKVCache keeps a K pool and a V pool of its own: it cannot serve a latent cache (V a view of K).
add_backend(Backend("cache", _prepare_cache, ("cpu", "cuda"), "engine path",
                    "write through PagedKVCache's slot mapping, then its dispatched read",
                    variants=frozenset(VARIANT_KEYS) - {"latent_kv"}))  # fmt: skip

# The peers register after the kernels, then flex_paged and flashinfer (the registry keeps this order).
from harness.backends import flex_paged, peers  # noqa: E402, F401, I001
from harness.backends import flashinfer_peer  # noqa: E402, F401


def _check_callable_as_the_contract(name: str, fn: Callable, planned: bool) -> None:
    """ValueError unless ``fn`` takes the call a run makes: six tensors positionally, then ``out=`` (and ``plan=``
    with a plan step); a function whose signature Python cannot read is left to its first call."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(6), out=None, **({"plan": None} if planned else {}))
    except TypeError as error:
        call = "q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None"
        raise ValueError(f"backend {name!r}: {getattr(fn, '__name__', fn)} cannot be called as the kernel contract's "
                         f"fn({call}{', *, plan' if planned else ''}): {error} (docs/contract.md#the-kernel-call)") from None  # fmt: skip


def register_backend(
    name: str, fn: Callable[..., torch.Tensor], devices: tuple[str, ...] = ("cpu", "cuda"), *, description: str = "",
    graphable: bool = True, variants: tuple[str, ...] | frozenset[str] = (), plan: Callable[[CaseFacts], Any] | None = None,
    limits: Limits | dict | None = None, supports: Callable[[CaseFacts], str | None] | None = None,
    options: tuple[str, ...] | frozenset[str] | None = None,
) -> Backend:  # fmt: skip
    """Add a kernel with the contract signature to every run that imports this module; a taken name is an error.
    ``fn(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None)`` returns
    [num_tokens, num_q_heads, head_dim] in q's dtype. The keywords: docs/contract.md, "Backends"."""

    def refused(case: Case, device: str) -> str | None:
        """supports(facts)'s refusal as a skip reason; one that raises or returns another type says so instead."""
        try:
            reason = supports(facts_of(case, device))
        except Exception as error:  # its own bug: a skip row saying so (the verdict lists it), not a dead worker
            return f"{name} supports(facts) raised {type(error).__name__}: {error}"
        if reason is not None and not isinstance(reason, str):
            return f"{name} supports(facts) returned {reason!r}, not a str (why not) or None"
        return f"{name} supports(facts): {reason}" if reason else None

    if options is not None:  # variants' earlier name
        if variants:
            raise TypeError(f"backend {name!r}: give variants= only (options= is its earlier name)")
        warnings.warn("register_backend(options=...) is now variants=...", DeprecationWarning, stacklevel=2)
        variants = options
    hook = {"unavailable": refused} if supports is not None else {}
    _check_callable_as_the_contract(name, fn, plan is not None)
    return add_backend(Backend(name, contract_prepare(fn, plan=plan), tuple(devices), "plugin",
                               description or (fn.__doc__ or "").strip().split("\n")[0], graphable, **hook,
                               variants=frozenset(map(variant_key, variants)),
                               limits=Limits.from_plain(limits or {}, f"backend {name!r}: limits"),
                               plan_step=plan is not None, supports_hook=supports is not None))  # fmt: skip


def resolve_backends(names: list[str] | None) -> list[Backend]:
    """Backends by name (all registered, in registration order, when ``names`` is None)."""
    if not names:
        return list(REGISTRY.values())
    if unknown := [n for n in names if n not in REGISTRY]:
        close = difflib.get_close_matches(unknown[0], REGISTRY, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"--backend {unknown[0]}: unknown backend; {hint}registered: {', '.join(REGISTRY)} "
                         "(a plugin's backends are registered once --plugin names its file)")  # fmt: skip
    return [REGISTRY[n] for n in names]
