"""Per-kernel device time of the Triton backend's split decodes (torch.profiler, CUDA activity): how much
of each call the combine launch takes. python3 gpu_results/2026-12-02-h200-split-tiles-2/kernel_times.py"""

import collections
import fnmatch

import torch
from torch.profiler import ProfilerActivity, profile

import kernels
from harness.cases.inputs import make_inputs
from harness.cases.spec import load_case_file

for suite, pattern in [
    ("gpu_peers", "decode_32x4k_tp8_8q1kv"),
    ("gpu_peers", "decode_4x16k"),
    ("gpu_peers", "decode_1x128k"),
    ("gpu_long", "llama3_70b_tp8_decode_128k"),
]:
    for case in load_case_file(f"cases/{suite}.toml"):
        if not fnmatch.fnmatch(case.name, pattern):
            continue
        inputs = make_inputs(
            num_q_heads=case.num_q_heads,
            num_kv_heads=case.num_kv_heads,
            head_dim=case.head_dim,
            block_size=case.block_size,
            seq_lens=list(case.seq_lens),
            q_lens=[1] * case.num_seqs,
            dtype="bfloat16",
            device="cuda",
        )
        args = inputs.args()
        hints = dict(max_q_len=1, max_seq_len=max(case.seq_lens))
        for _ in range(5):
            kernels.paged_attention_triton(*args, **hints)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                kernels.paged_attention_triton(*args, **hints)
            torch.cuda.synchronize()
        totals = collections.defaultdict(float)
        counts = collections.Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                totals[e.name] += e.device_time
                counts[e.name] += 1
        print(case.name, {k[:40]: round(v / counts[k], 2) for k, v in totals.items()})
