"""The control: the reference kernel behind the contract, nothing else."""

from harness import register_backend
from kernels import paged_attention_reference

register_backend("honest", paged_attention_reference, devices=("cpu", "cuda"))
