"""Slips of the contract: a fresh tensor with out left unwritten; Unsupported raised from a call."""

import kernels
from harness import register_backend
from harness.backends.registry import Unsupported


def paged_attention_reference(*args, **kwargs):
    """The reference on a CPU; the Triton kernel on a GPU (capturable in a CUDA graph)."""
    fn = kernels.paged_attention_triton if args[0].is_cuda else kernels.paged_attention_reference
    return fn(*args, **kwargs)


_calls = {"n": 0}


def fresh(*args, out=None, scale=None):
    """Returns the right values in a new tensor; an engine reading out gets NaN."""
    return paged_attention_reference(*args)


def refuses_in_a_call(*args, out=None, scale=None):
    """Raises Unsupported from the call itself, to turn its rows into skips."""
    raise Unsupported("not this shape")


def wrong_then_refuses(*args, out=None, scale=None):
    """A wrong answer first, then Unsupported from a timed call, to hide the failure."""
    _calls["n"] += 1
    if _calls["n"] % 2:
        result = paged_attention_reference(*args, out=out)
        return result.mul_(2.0)
    raise Unsupported("changed its mind")


for fn in (fresh, refuses_in_a_call, wrong_then_refuses):
    register_backend(fn.__name__, fn, devices=("cpu", "cuda"))
