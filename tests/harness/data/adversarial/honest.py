"""The control: the reference kernel (the Triton kernel on a GPU) behind the contract, nothing else."""

import kernels
from harness import register_backend


def paged_attention_reference(*args, **kwargs):
    """The reference on a CPU; the Triton kernel on a GPU (capturable in a CUDA graph)."""
    fn = kernels.paged_attention_triton if args[0].is_cuda else kernels.paged_attention_reference
    return fn(*args, **kwargs)


register_backend("honest", paged_attention_reference, devices=("cpu", "cuda"))
