"""Time source-level variants of the Triton kernel against each other and the peers, side by side.

    python .gpu/kernel_probe.py --out $OUT/probe.json [--quick]

Each variant is kernels/triton_paged.py with textual patches applied, written to
kernels/_probe_<name>.py and imported as its own module (own kernels, own launch plans);
the registry's "triton" backend is pointed at it (``kernels.paged_attention_triton``) and
timed by harness.timing.time_call exactly as a run times it. Every variant's output must
match the unpatched kernel's within the case's tolerance (else dropped). Peers are timed
before and after the variants; the ratio uses their mean.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.registry import resolve_backends  # noqa: E402
from harness.runner import case_inputs  # noqa: E402
from harness.suite_files import resolve_case_arg  # noqa: E402

import kernels  # noqa: E402
from harness.cases import load_cases  # noqa: E402
from harness.timing import time_call  # noqa: E402
from kernels.tuning import TileConfig, override  # noqa: E402

FMA = [
    (
        "        alpha = tl.exp2((m_i - m_safe) * qk_scale_log2)\n"
        "        p = tl.exp2((s - m_safe[:, None]) * qk_scale_log2)\n",
        "        m_scaled = m_safe * qk_scale_log2\n"
        "        alpha = tl.exp2(m_i * qk_scale_log2 - m_scaled)\n"
        "        p = tl.exp2(s * qk_scale_log2 - m_scaled[:, None])\n",
    )
]
NAN_WHERE = [
    (
        "        bad_keys = tl.sum((k_valid & ~block_ok).to(tl.int32), 0)  # a bad index: NaN out, no stray read\n",
        "        bad_key = k_valid & ~block_ok\n",
    ),
    (
        '        l_i = l_i * alpha + tl.sum(p, 1) + tl.where(bad_keys > 0, float("nan"), 0.0)\n',
        '        p = tl.where(bad_key[None, :], float("nan"), p)\n        l_i = l_i * alpha + tl.sum(p, 1)\n',
    ),
]
REVERSE = [
    (
        "        seq, q_tile = _find_seq(query_start_loc_ptr, tl.program_id(0), num_seqs, BLOCK_Q)\n",
        "        seq, q_tile = _find_seq(query_start_loc_ptr, tl.num_programs(0) - 1 - tl.program_id(0), num_seqs, BLOCK_Q)\n",
    )
]
HEAD_SOURCE = ROOT / ".gpu" / "triton_paged_head.py"  # the kernel before this change (git show HEAD:...)
TREE_SOURCE = ROOT / "kernels" / "triton_paged.py"
VARIANTS = {  # name -> (source, patches)
    "head": (HEAD_SOURCE, []),
    "prepass": (TREE_SOURCE, []),
    "prepass_fma": (TREE_SOURCE, FMA),
}
TUNED = None  # no override: the tuned table's config
PREFILL_CONFIGS = [
    TileConfig(128, 32, 64, 8, 2),  # the tuned one
    TileConfig(128, 32, 128, 8, 2),
    TileConfig(128, 32, 64, 8, 3),
    TileConfig(128, 32, 128, 8, 3),
]
VERIFY_CONFIGS = [
    TileConfig(64, 8, 128, 4, 2),  # the tuned one
    TileConfig(32, 8, 128, 4, 3),
    TileConfig(64, 8, 128, 4, 3),
    TileConfig(64, 8, 64, 4, 3),
]
HD64_CONFIGS = [TileConfig(16, 1, 128, 4, 3), TileConfig(16, 1, 256, 4, 2), TileConfig(16, 1, 256, 4, 3)]
SPLIT_CONFIGS = [TileConfig(16, 1, 32, 4, 3), TileConfig(16, 1, 64, 4, 3), TileConfig(16, 1, 64, 4, 4)]
ALL = list(VARIANTS)
PLAN = [  # (case id, configs, variants)
    ("prefill_4x4k", PREFILL_CONFIGS, ALL),
    ("prefill_1x8k", PREFILL_CONFIGS, ALL),
    ("prefill_16x1k", PREFILL_CONFIGS, ALL),
    ("prefill_8x2k", PREFILL_CONFIGS, ALL),
    ("chunked_8x512_over_2k_6k", PREFILL_CONFIGS, ALL),
    ("spec_verify_32x4k/q_lens=2", VERIFY_CONFIGS, ["head", "prepass"]),
    ("spec_verify_32x4k/q_lens=4", VERIFY_CONFIGS, ["head", "prepass"]),
    ("spec_verify_32x4k/q_lens=8", VERIFY_CONFIGS, ["head", "prepass"]),
    ("decode_32x4k_hd64", HD64_CONFIGS, ["head", "prepass"]),
    ("decode_4x16k", SPLIT_CONFIGS, ["head", "prepass"]),
    ("decode_1x128k", SPLIT_CONFIGS, ["head", "prepass"]),
    ("decode_32x4k_tp8_8q1kv", SPLIT_CONFIGS, ["head", "prepass"]),
    ("decode_32x4k/block_size=16", [TUNED], ["head", "prepass"]),
    ("decode_32x4k/block_size=64", [TUNED], ["head", "prepass"]),
    ("decode_32x4k_64q8kv", [TUNED], ["head", "prepass"]),
    ("decode_16x2k_mha40", [TUNED], ["head", "prepass"]),
    ("decode_64x8k", [TUNED], ["head", "prepass"]),
    ("decode_256x2k", [TUNED], ["head", "prepass"]),
    ("decode_ragged_64x1k_8k", [TUNED], ["head", "prepass"]),
]
PEERS = ["sdpa_contiguous", "varlen_flash"]


def build_variant(name: str, source: Path, patches: list[tuple[str, str]]):
    """kernels/_probe_<name>.py: ``source`` with ``patches`` applied, imported."""
    text = source.read_text()
    for old, new in patches:
        if text.count(old) != 1:
            raise SystemExit(f"variant {name}: patch target found {text.count(old)} times: {old[:60]!r}")
        text = text.replace(old, new)
    (ROOT / "kernels" / f"_probe_{name}.py").write_text(text)
    return importlib.import_module(f"kernels._probe_{name}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target-s", type=float, default=0.15)
    parser.add_argument("--quick", action="store_true", help="first case, two configs (a dry run)")
    parser.add_argument("--check", action="store_true", help="build and import the variants only")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    modules = {name: build_variant(name, *spec) for name, spec in VARIANTS.items()}
    if args.check:
        print("variants built:", ", ".join(modules))
        return 0
    cases = {c.id: c for c in load_cases([resolve_case_arg("gpu_peers")], device=device, backends=["triton", *PEERS])}
    (triton_backend,) = resolve_backends(["triton"])
    peers = resolve_backends(PEERS)
    records = []
    plan = PLAN[:1] if args.quick else PLAN
    for case_id, configs, variants in plan:
        case = cases[case_id]
        if args.quick:
            configs = configs[:2]
        inputs = case_inputs(case, device)

        def time_peers(case=case, inputs=inputs) -> dict[str, float]:
            got = {}
            for peer in peers:
                if not case.wants(peer.name):
                    continue
                try:
                    out = torch.full_like(inputs.q, float("nan"))
                    prepared = peer.prepare(case, inputs, out)
                    got[peer.name] = time_call(prepared.run, device, target_s=args.target_s).median_us
                except Exception as error:  # a peer that cannot run this case
                    print(f"  peer {peer.name}: {type(error).__name__}: {str(error)[:80]}", flush=True)
            return got

        before = time_peers()
        expected = None
        for config in configs:
            for name in variants:
                kernels.paged_attention_triton = modules[name].paged_attention_triton
                out = torch.full_like(inputs.q, float("nan"))
                began = time.monotonic()
                with override(config) if config else contextlib.nullcontext():
                    prepared = triton_backend.prepare(case, inputs, out)
                    try:
                        got = prepared.to_packed(prepared.run()).float()
                        us = time_call(prepared.run, device, target_s=args.target_s).median_us
                    except Exception as error:
                        print(f"  {name} {config}: {type(error).__name__}: {str(error).splitlines()[0][:100]}")
                        continue
                if expected is None:
                    expected = got
                ok = bool(torch.allclose(got, expected, atol=case.atol, rtol=case.rtol))
                records.append({"case": case_id, "variant": name, "config": vars(config) if config else "tuned", "us": us, "ok": ok,
                                "wall_s": round(time.monotonic() - began, 2)})  # fmt: skip
                print(
                    f"{case_id:28s} {name:10s} {tuple(vars(config).values()) if config else 'tuned'} {us:9.1f} us ok={ok}",
                    flush=True,
                )
        after = time_peers()
        peer_us = {k: statistics.mean([before[k], after[k]]) for k in before if k in after}
        best = min(peer_us.values()) if peer_us else float("nan")
        print(f"{case_id:28s} peers before {before} after {after}; best {best:.1f} us", flush=True)
        records.append({"case": case_id, "peers_before": before, "peers_after": after, "best_peer_us": best})
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                                        "torch": torch.__version__, "records": records}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
