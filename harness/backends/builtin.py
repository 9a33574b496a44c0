"""The built-in backends: the kernels under test and the engine path; the peers live in
:mod:`harness.backends.peers`, the registry in :mod:`harness.backends.registry` (re-exported here).

* reference, tlsim, triton -- the kernels, called through the contract. ``run`` passes the
  NaN-poisoned ``out``; ``call`` is the bare default call a user makes.
* cache -- the path an engine takes: every sequence written through PagedKVCache's slot
  mapping, the step's metadata built once, then the dispatched read of a layer.
"""

from __future__ import annotations

import torch

import kernels
from harness.backends.registry import (
    REGISTRY,
    VARIANT_OPTIONS,
    Backend,
    Prepared,
    Unsupported,
    add_backend,
    contract_prepare,
    load_plugin,
    register_backend,
    resolve_backends,
)
from harness.cases.inputs import PagedInputs
from harness.cases.spec import Case

__all__ = [
    "REGISTRY",
    "Backend",
    "Prepared",
    "Unsupported",
    "load_plugin",
    "register_backend",
    "resolve_backends",
]


def _triton_unavailable(case: Case, device: str) -> str | None:
    if reason := kernels.triton_unavailable_reason(device):
        return reason
    if torch.device(device).type == "cpu" and "small" not in case.tags:
        return "the Triton interpreter is slow: on the CPU it runs only cases tagged 'small'"
    return None


def _prepare_cache(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    """Write every sequence through PagedKVCache's slot mapping; time its dispatched read."""
    device = inputs.q.device
    cache = kernels.PagedKVCache(
        num_layers=1,
        num_blocks=case.blocks_needed,
        block_size=case.block_size,
        num_kv_heads=case.num_kv_heads,
        head_dim=case.head_dim,
        dtype=inputs.k_cache.dtype,  # an fp8 case: fp8 pools, quantized on write with the case's scales
        device=device,
        head_dim_v=case.head_dim_v,
        k_scale=inputs.options.get("k_scale"),
        v_scale=inputs.options.get("v_scale"),
    )
    options = {name: value for name, value in inputs.options.items() if name not in ("k_scale", "v_scale")}
    seq_ids = list(range(case.num_seqs))
    for seq_id, keys, values in zip(seq_ids, inputs.keys, inputs.values, strict=True):
        cache.allocate(seq_id)
        cache.write(0, cache.append(seq_id, keys.shape[0]), keys, values)
    chosen = kernels.select_backend(device)
    # The engine builds a step's metadata once (on the host it knows the query lengths) and
    # every layer's read reuses it: that read is run(). call() is the one-off read by
    # sequence ids, which builds the metadata on every call.
    step = cache.step_metadata(seq_ids, inputs.query_start_loc.cpu())
    return Prepared(
        run=lambda: cache.paged_attention(0, inputs.q, step, out=out, **options),
        call=lambda: cache.paged_attention(0, inputs.q, seq_ids, inputs.query_start_loc, **options),
        note=f"dispatch -> {chosen}; step metadata built once",
    )


add_backend(Backend("reference", contract_prepare(kernels.paged_attention_reference), ("cpu", "cuda"), "kernel",
                    "gather each sequence's slots, SDPA in fp32 (the engine's fallback oracle)",
                    options=frozenset(VARIANT_OPTIONS)))  # fmt: skip
add_backend(Backend("tlsim", contract_prepare(kernels.paged_attention_tlsim), ("cpu", "cuda"), "kernel",
                    "the Triton kernel's streaming algorithm in torch", options=frozenset(VARIANT_OPTIONS)))  # fmt: skip


def _triton(*args, **kwargs) -> torch.Tensor:
    """kernels.paged_attention_triton, looked up at call time (Triton is imported only when a row runs)."""
    return kernels.paged_attention_triton(*args, **kwargs)


# run() passes the host-side lengths an engine knows, as an engine calls the kernel; call() does not.
add_backend(Backend("triton", contract_prepare(_triton, max_q_len=lambda c: max(c.q_lens), max_seq_len=lambda c: c.max_seq_len),
                    ("cpu", "cuda"), "kernel", "the @triton.jit kernel (interpreted on the CPU)",
                    unavailable=_triton_unavailable, options=frozenset(VARIANT_OPTIONS)))  # fmt: skip
add_backend(Backend("cache", _prepare_cache, ("cpu", "cuda"), "engine path",
                    "write through PagedKVCache's slot mapping, then its dispatched read",
                    options=frozenset(VARIANT_OPTIONS)))  # fmt: skip

from harness.backends import peers  # noqa: E402, F401  (registers the peers, after the kernels)
