"""The Triton kernel at a base revision against the working tree's, timed side by side in one process.

    python scripts/kernel_ab.py [SUITE ...] [--base REV | --base-dir DIR] [--case PATTERN] [--rounds 9] [--out ab.json]
    python scripts/kernel_ab.py [SUITE ...] --with tiling tuning   # the base's split choice and tuning too
    python scripts/kernel_ab.py --dry          # CPU: one tiny case under the interpreter (CI)

Exit 0: nothing slower; 1: a case slower or its output different; 2: a side that does not build or run
(docs/performance.md has the details)."""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels
from harness.backends.builtin import resolve_backends
from harness.cases.loading import load_cases
from harness.cases.packaged import resolve_case_arg
from harness.cases.spec import load_case_file
from harness.review import stats
from harness.run.runner import case_inputs
from harness.timing.timer import time_call

ROOT = Path(__file__).resolve().parents[1]
KERNEL = Path("kernels") / "triton_paged.py"
MIN_ROUNDS = 6  # 2 / 2^6 < 0.05: six pairs all one way exclude 1 from the exact signed-rank interval
SIDES = ("base", "new")
WITH = ("tuning", "tiling", "gluon_prefill")  # modules --with can take from the base, in the order they are imported


class ABError(Exception):
    """A side that cannot be built or run: exit 2, not a verdict."""


def _git_show(rev: str | Path, path: Path) -> str:
    """``path`` as of ``rev``: a git revision, or (a Path, ``--base-dir``) a folder holding the base tree."""
    if isinstance(rev, Path):
        if not (rev / path).is_file():
            raise ABError(f"{rev / path}: no such file in the base folder {rev}")
        return (rev / path).read_text()
    done = subprocess.run(["git", "show", f"{rev}:{path.as_posix()}"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise ABError(f"git show {rev}:{path}: {done.stderr.strip()}")
    return done.stdout


def _import(name: str, path: Path, text: str, what: str):
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    sys.modules[name] = module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # a half-edited kernel, or a revision that does not import here
        raise ABError(f"{what} does not import: {type(error).__name__}: {error}") from None
    return module


def _rebind(module, swapped: dict) -> None:
    """Point the names ``module`` took from a working-tree module of ``swapped`` at the base module's objects."""
    for old_name, base in swapped.items():
        tree = importlib.import_module(f"kernels.{old_name}")
        for attr, value in list(vars(module).items()):
            if value is tree:  # `from . import name`
                setattr(module, attr, base)
            elif attr in vars(tree) and value is vars(tree)[attr] and attr in vars(base):
                setattr(module, attr, vars(base)[attr])


def kernel_modules(base_rev: str | Path, folder: Path, with_modules: tuple[str, ...] = ()) -> dict:
    """{"base": module, "new": module} imported from ``folder`` as ``kernels._ab_<side>``, ``with_modules``
    at ``base_rev`` rebound into them (:func:`_rebind`); the caller calls :func:`remove_modules`."""
    sources = {"base": _git_show(base_rev, KERNEL), "new": (ROOT / KERNEL).read_text()}
    base_parts = {name: _git_show(base_rev, KERNEL.with_name(f"{name}.py")) for name in WITH if name in with_modules}
    if "tuning" in base_parts and "tiling" not in base_parts:  # the kernel reads tuning through tiling only
        base_parts["tiling"] = (ROOT / KERNEL.with_name("tiling.py")).read_text()
    swapped = {}
    for name, text in base_parts.items():
        module = _import(f"kernels._ab_base_{name}", folder / f"_ab_base_{name}.py", text, f"the base's {name}.py")
        _rebind(module, swapped)
        swapped[name] = module
    modules = {
        side: _import(f"kernels._ab_{side}", folder / f"_ab_{side}.py", text, f"the {side} kernel")
        for side, text in sources.items()
    }
    _rebind(modules["base"], swapped)
    return modules


def remove_modules() -> None:
    for name in [*(f"_ab_{side}" for side in SIDES), *(f"_ab_base_{name}" for name in WITH)]:
        sys.modules.pop(f"kernels.{name}", None)


def timeable(cases) -> list:
    """The cases the triton backend runs, options and all (both sides get the same options)."""
    (backend,) = resolve_backends(["triton"])
    return [c for c in cases if c.wants("triton") and set(c.variants) <= backend.variants]


def dry_case():
    """The smallest timeable smoke case: ``--dry``'s one case."""
    return min(timeable(load_case_file(resolve_case_arg("smoke"))), key=lambda c: sum(c.seq_lens))


def time_case(case, modules: dict, device: str, rounds: int, reps: dict) -> dict:
    """One case: outputs compared, then ``rounds`` paired rounds (``reps``: time_call's budget); its record."""
    (backend,) = resolve_backends(["triton"])
    inputs = case_inputs(case, device)
    prepared, outputs = {}, {}
    record = {"case": case.id}

    def failed(what: str, error: Exception) -> dict:
        return {**record, "verdict": "error", "why": f"{what}: {type(error).__name__}: {error}"}

    for side in SIDES:
        kernels.paged_attention_triton = modules[side].paged_attention_triton
        try:
            prepared[side] = backend.prepare(case, inputs, inputs.new_out())
            outputs[side] = prepared[side].to_packed(prepared[side].run()).float()
        except Exception as error:  # e.g. a base revision whose entry takes other arguments
            return failed(f"the {side} kernel failed", error)
    if not torch.allclose(outputs["new"], outputs["base"], atol=case.atol, rtol=case.rtol):
        return {**record, "verdict": "output differs", "why": "new output leaves the case's tolerance of the base's"}
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    for k in range(rounds):
        for side in SIDES if k % 2 == 0 else SIDES[::-1]:
            kernels.paged_attention_triton = modules[side].paged_attention_triton
            try:
                samples[side].append(time_call(prepared[side].run, device, **reps).median_us)
            except Exception as error:  # e.g. a graph capture one side cannot make
                return failed(f"timing the {side} kernel", error)
    test = stats.paired_ratio(samples["base"], samples["new"])
    verdict = stats.decide_paired(test, min_effect=stats.default_effect(device))
    return {
        **record, "base_us": statistics.median(samples["base"]), "new_us": statistics.median(samples["new"]),
        "ratio": test.ratio, "ci_low": test.ci_low, "ci_high": test.ci_high, "verdict": verdict.verdict,
        "why": verdict.reason, "samples": samples,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="*", default=["gpu_peers"])
    parser.add_argument("--base", default="HEAD", help="the revision whose kernel is the base (HEAD)")
    parser.add_argument("--base-dir", type=Path, help="instead of --base: a folder holding the base tree (no git)")
    parser.add_argument("--case", default="*", help="fnmatch pattern on case ids")
    parser.add_argument("--rounds", type=int, default=9,
                        help="paired rounds a case (9; at least 6, the fewest whose 95%% interval can exclude 1)")  # fmt: skip
    parser.add_argument("--target-s", type=float, default=0.05, help="timing budget of one side's sample a round")
    parser.add_argument("--out", type=Path, help="write every record as JSON")
    parser.add_argument("--with", dest="with_modules", nargs="+", choices=WITH, default=[],
                        help="kernels/ modules the base side takes from --base too (default: the working tree's)")  # fmt: skip
    parser.add_argument("--dry", action="store_true",
                        help="the smallest smoke case on the CPU, one call a sample (ignores suites and --case)")  # fmt: skip
    args = parser.parse_args(argv)
    kernels.use_interpreter_if_no_gpu()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.dry:
        parser.error("no CUDA device: pass --dry for the CPU run")
    if args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds {args.rounds}: at least {MIN_ROUNDS} (fewer pairs cannot exclude 1 at 95%)")
    if args.dry:
        cases = [dry_case()]
    else:
        loaded = load_cases([resolve_case_arg(s) for s in args.suites], device=device, backends=["triton"])
        cases = timeable(c for c in loaded if fnmatch.fnmatch(c.id, args.case))
    if not cases:
        parser.error(f"no case of {args.suites} matches --case {args.case!r} and runs the triton backend")
    reps = {"min_reps": 1, "max_reps": 2, "target_s": 0.0} if args.dry else {"target_s": args.target_s}
    records, base = [], args.base_dir or args.base
    try:
        with tempfile.TemporaryDirectory(prefix="kernel-ab-") as folder:
            modules = kernel_modules(base, Path(folder), tuple(args.with_modules))
            also = "".join(f" + {name}.py" for name in WITH if name in args.with_modules)
            print(f"# kernel{also} {base} (base) against the working tree (new), {args.rounds} paired rounds, {device}")
            print("| case | base us | new us | new / base | paired CI | verdict |\n|---|---|---|---|---|---|")
            for case in cases:
                r = time_case(case, modules, device, args.rounds, reps)
                records.append(r)
                if "ratio" in r:
                    print(f"| {r['case']} | {r['base_us']:.1f} | {r['new_us']:.1f} | {r['ratio']:.3f} | "
                          f"{r['ci_low']:.3f}-{r['ci_high']:.3f} | {r['verdict']} |", flush=True)  # fmt: skip
                else:
                    print(f"| {r['case']} | | | | | {r['verdict']}: {r['why']} |", flush=True)
    except ABError as error:
        print(f"kernel_ab: {error}", file=sys.stderr)
        return 2
    finally:
        remove_modules()
    if args.out:
        args.out.write_text(json.dumps({"device": device, "base": str(base), "records": records}, indent=1))
    if any(r["verdict"] == "error" for r in records):
        return 2
    return 1 if any(r["verdict"] in ("slower", "output differs") for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
