"""Many hosts, one run: ``harness run --shard I/N`` picks a host's slice of the cases, and
``harness merge OUT RUN...`` joins the hosts' run folders into one (docs/scaling.md)."""

from pathlib import Path

import pandas as pd

from harness.cases.spec import Case
from harness.results.storage import load_run
from harness.timing.ceilings import mixed_models_note
from harness.timing.metrics import case_cost


class MergeError(ValueError):
    """The runs cannot be merged as one; the message names the run folder and why."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 0 <= I < N; ValueError with the reason otherwise. Example: "1/4" -> (1, 4)."""
    index, slash, count = text.partition("/")
    if not slash or not index.isdigit() or not count.isdigit() or int(count) < 1 or int(index) >= int(count):
        raise ValueError(f"--shard {text}: give I/N with 0 <= I < N, e.g. --shard 0/4 on the first of four hosts")
    return int(index), int(count)


def shard_cases(cases: list[Case], index: int, count: int) -> list[Case]:
    """Shard ``index`` of ``count``: cases by cost, largest first (ties by id), dealt round robin, so every host
    computes the same split alone; returned in their original order."""
    ranked = sorted(range(len(cases)), key=lambda i: (-case_cost(cases[i]), cases[i].id))
    mine = {i for rank, i in enumerate(ranked) if rank % count == index}
    return [case for i, case in enumerate(cases) if i in mine]


def merge_runs(run_dirs: list[Path], allow_mixed_commits: bool = False) -> tuple[pd.DataFrame, dict, list[str]]:
    """The joined rows and meta of ``run_dirs``, and warnings (shards missing from an I/N set); RunFolderError for a
    folder that is not a run, MergeError on a pair in two runs, mixed commits (unless ``allow_mixed_commits``), mixed
    devices, or timed beside untimed."""
    if len(run_dirs) < 2:
        raise MergeError("merge needs at least two run folders")
    loaded = [(Path(run_dir), *load_run(Path(run_dir))) for run_dir in run_dirs]  # RunFolderError: not a run
    owner: dict[tuple[str, str], Path] = {}
    for run_dir, frame, _ in loaded:
        for pair in zip(frame["case"], frame["backend"], strict=True):
            if pair in owner:
                raise MergeError(f"{run_dir}: case {pair[0]!r} with backend {pair[1]!r} is also in {owner[pair]}: "
                                 "shards must not overlap (give each host its own --shard I/N)")  # fmt: skip
            owner[pair] = run_dir
    _refuse_mixed(loaded, "commit", "commits", "--allow-mixed-commits", allow_mixed_commits)
    _refuse_mixed(loaded, "device", "devices (cpu and cuda rows do not make one run)")
    timed = {run_dir: bool("latency_us" in f and f["latency_us"].notna().any()) for run_dir, f, _ in loaded}
    if len(set(timed.values())) > 1:
        untimed = ", ".join(str(run_dir) for run_dir, was in timed.items() if not was)
        raise MergeError(f"{untimed}: not timed (--no-timing), while the other runs are: merge timed with timed")
    frame = pd.concat([frame for _, frame, _ in loaded], ignore_index=True)
    case_order = {case: i for i, case in enumerate(dict.fromkeys(frame["case"]))}
    frame = frame.iloc[frame["case"].map(case_order).argsort(kind="stable")].reset_index(drop=True)
    meta = dict(loaded[0][2])
    meta["gpus"] = _gpus(loaded)
    meta["merged_from"] = [
        {"run": str(run_dir), "host": m.get("host"), "commit": m.get("commit"), "dirty": m.get("dirty"),
         "shard": m.get("shard"), "rows": len(f), "incomplete": "incomplete" in m, "time": m.get("time"),
         "scale": m.get("scale")}
        for run_dir, f, m in loaded
    ]  # fmt: skip
    meta["case_files"] = sorted({c for _, _, m in loaded for c in m.get("case_files") or []})
    meta["host"] = ", ".join(dict.fromkeys(str(m.get("host")) for _, _, m in loaded))
    meta["dirty"] = any(m.get("dirty") for _, _, m in loaded)
    for key in ("scale", "resumed", "shard", "incomplete"):  # each run's own is in merged_from
        meta.pop(key, None)
    if note := mixed_models_note(meta["gpus"]):
        meta["device_name"] = note
    elif len(names := {m.get("device_name") for _, _, m in loaded}) > 1:
        meta["device_name"] = f"mixed devices: {' + '.join(sorted(str(n) for n in names))}"
    if len(commits := {m.get("commit") for _, _, m in loaded}) > 1:
        meta["commit"] = "mixed: " + " + ".join(sorted(str(c)[:12] for c in commits))
    warnings = _shard_warnings(loaded)
    incomplete = [(run_dir, m["incomplete"]) for run_dir, _, m in loaded if "incomplete" in m]
    if incomplete or warnings:
        missing = [pair for _, record in incomplete for pair in record.get("missing") or []]
        meta["incomplete"] = {
            "runs": [str(run_dir) for run_dir, _ in incomplete],
            "missing_pairs": None if any(r.get("missing") is None for _, r in incomplete) else len(missing),
            "missing": missing, "shards": warnings,
            "note": "merged from runs that stopped early (each run's 'incomplete' record) or from an incomplete set of shards",
        }  # fmt: skip
    return frame, meta, warnings


def _refuse_mixed(loaded, key: str, what: str, allow_flag: str | None = None, allowed: bool = False) -> None:
    """MergeError when the runs' meta ``key`` differs (unless ``allowed``), listing each run's value."""
    if len({m.get(key) for _, _, m in loaded}) > 1 and not allowed:
        listed = ", ".join(f"{run_dir}: {str(m.get(key))[:12]}" for run_dir, _, m in loaded)
        hint = f"; pass {allow_flag} to merge anyway" if allow_flag else ""
        raise MergeError(f"the runs are of different {what} ({listed}){hint}")


def _gpus(loaded) -> list[dict]:
    """Every run's GPU records: one per (host, index, model), the first run's."""
    records: dict[tuple, dict] = {}
    for _, _, m in loaded:
        for gpu in m.get("gpus") or []:
            key = (str(gpu.get("host")), str(gpu.get("gpu_index")), gpu.get("gpu_name"))
            records.setdefault(key, dict(gpu))
    return [records[key] for key in sorted(records, key=lambda k: (k[0], k[1], str(k[2])))]


def _shard_warnings(loaded) -> list[str]:
    """What is off in the runs' --shard I/N set (none given: nothing to check)."""
    shards = [m.get("shard") for _, _, m in loaded]
    if not any(shards):
        return []
    if not all(shards):
        return ["some runs were not --shard runs: whether every case ran is not known"]
    parsed = [parse_shard(text) for text in shards]
    counts = {count for _, count in parsed}
    if len(counts) > 1:
        return [f"the runs are shards of different splits ({', '.join(shards)})"]
    count = counts.pop()
    absent = sorted(set(range(count)) - {index for index, _ in parsed})
    return [f"shards {', '.join(f'{i}/{count}' for i in absent)} are not among the runs"] if absent else []
