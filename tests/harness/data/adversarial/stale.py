"""Right once, then stale: three ways of answering a later call without computing it."""

import torch

import kernels
from harness import register_backend


def paged_attention_reference(*args, **kwargs):
    """The reference on a CPU; the Triton kernel on a GPU (capturable in a CUDA graph)."""
    fn = kernels.paged_attention_triton if args[0].is_cuda else kernels.paged_attention_reference
    return fn(*args, **kwargs)


_answers: dict = {}


def _first(args, out, who: str):
    key = (who, *(t.data_ptr() for t in args[:3]))  # the inputs by pointer, as a careless cache keys them
    if key not in _answers:
        _answers[key] = paged_attention_reference(*args).clone()
        if out is not None:
            out.copy_(_answers[key])
        return key, True
    return key, False


def cached(*args, out=None, scale=None):
    """Later calls copy the first answer."""
    key, _ = _first(args, out, "cached")
    if out is None:
        return _answers[key].clone()
    return out.copy_(_answers[key])


def untouched(*args, out=None, scale=None):
    """Later calls leave out as it is."""
    key, _ = _first(args, out, "untouched")
    return out if out is not None else _answers[key].clone()


def zeros(*args, out=None, scale=None):
    """Later calls write zeros."""
    key, first = _first(args, out, "zeros")
    if first:
        return out if out is not None else _answers[key].clone()
    if out is None:
        return torch.zeros_like(_answers[key])
    return out.zero_()


for fn in (cached, untouched, zeros):
    register_backend(f"stale_{fn.__name__}", fn, devices=("cpu", "cuda"))
