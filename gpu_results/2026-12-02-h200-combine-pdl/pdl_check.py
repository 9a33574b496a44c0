"""The combine launched programmatically dependent (COMBINE_PDL) against the plain launch: bitwise the same
output on every split decode, eager 200 calls and a CUDA graph replayed 200 times. python3 gpu_results/2026-12-02-h200-combine-pdl/pdl_check.py"""

import fnmatch

import torch

import kernels
import kernels.triton_paged as tp
from harness.cases.inputs import make_inputs
from harness.cases.spec import load_case_file

bad = 0
for suite, pattern in [
    ("gpu_peers", "decode_32x4k_tp8_8q1kv"),
    ("gpu_peers", "decode_4x16k"),
    ("gpu_peers", "decode_1x128k"),
    ("gpu_peers", "decode_ragged*"),
    ("gpu", "llama3_8b_decode"),
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
        outs = {}
        for pdl in (False, True):
            tp.COMBINE_PDL = pdl
            tp.PLANS.clear()
            first = kernels.paged_attention_triton(*args, **hints).clone()
            recipes = tp.PLANS.plans()
            combine = recipes[-1].plan.combine if recipes else None
            print(case.name, "combine options:", None if combine is None else combine.options)
            same = all(torch.equal(kernels.paged_attention_triton(*args, **hints), first) for _ in range(200))
            out = torch.empty_like(first)
            graph = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                kernels.paged_attention_triton(*args, out=out, **hints)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(graph):
                kernels.paged_attention_triton(*args, out=out, **hints)
            replays = 0
            for _ in range(200):
                out.zero_()
                graph.replay()
                replays += torch.equal(out, first)
            outs[pdl] = first
            print(
                case.name, "pdl" if pdl else "plain", "eager 200 same:", same, "graph replays same:", replays, "/ 200"
            )
            bad += (not same) + (200 - replays)
        print(case.name, "pdl == plain bitwise:", torch.equal(outs[True], outs[False]))
        bad += not torch.equal(outs[True], outs[False])
print("MISMATCHES", bad)
