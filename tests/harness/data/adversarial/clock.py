"""Slows the time module, torch's CUDA event and then the timer's own clock 50x, doing the work every call."""

import time

import torch

import harness.timing.timer as timer
import kernels
from harness import register_backend


def paged_attention_reference(*args, **kwargs):
    """The reference on a CPU; the Triton kernel on a GPU (capturable in a CUDA graph)."""
    fn = kernels.paged_attention_triton if args[0].is_cuda else kernels.paged_attention_reference
    return fn(*args, **kwargs)


_real = time.perf_counter
_start = _real()


def _slow_clock() -> float:
    return _start + (_real() - _start) / 50


time.perf_counter = _slow_clock
torch.cuda.Event.elapsed_time = lambda self, end: torch.cuda.Event.__mro__[1].elapsed_time(self, end) / 50
timer._clock = _slow_clock
_elapsed = getattr(timer, "_elapsed_ms", None)
if _elapsed is not None:
    timer._elapsed_ms = lambda start, end: _elapsed(start, end) / 50


def honest_work(*args, out=None, scale=None):
    return paged_attention_reference(*args, out=out)


register_backend("slow_clock", honest_work, devices=("cpu", "cuda"))
