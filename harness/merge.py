"""Many hosts, one run: ``harness run --shard I/N`` picks a host's slice of the cases, and
``harness merge OUT RUN...`` joins the hosts' run folders into one.

Sharding is deterministic from the case files alone, so every host computes the same split
without talking to the others: the expanded cases are ordered by estimated cost, largest first
(:func:`harness.parallel.case_cost`; ties by case id), and dealt round robin, case ``k`` to shard
``k % N``. Every shard so gets a similar mix of large and small cases.

Merging refuses what would make the joined run a guess (:class:`MergeError`, naming the run
folder): a (case, backend) pair in two runs; runs of different commits (``--allow-mixed-commits``
records them instead); a run folder that is not one. What it joins:

* rows: concatenated, in the first run's case order, then each later run's new cases;
* meta.json: the first run's meta, with ``gpus`` the union of every run's GPUs (each keyed by its
  host and index, so rows keep their own ceilings), ``merged_from`` (each run's folder, host,
  commit, row count and ``scale``), and ``device_name`` the mixed-models note where the GPU
  models differ (then ``compare`` treats the run as another device, as for a mixed sharded run);
* report.html, rendered as for any run.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .cases import Case


class MergeError(ValueError):
    """The runs cannot be merged as one; the message names the run folder and why."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 0 <= I < N; ValueError with the reason otherwise. Example: "1/4" -> (1, 4)."""
    index, slash, count = text.partition("/")
    if not slash or not index.isdigit() or not count.isdigit() or int(count) < 1 or int(index) >= int(count):
        raise ValueError(f"--shard {text}: give I/N with 0 <= I < N, e.g. --shard 0/4 on the first of four hosts")
    return int(index), int(count)


def shard_cases(cases: list[Case], index: int, count: int) -> list[Case]:
    """Shard ``index`` of ``count``: cases by cost, largest first (ties by id), dealt round robin;
    returned in their original order."""
    from .parallel import case_cost

    ranked = sorted(range(len(cases)), key=lambda i: (-case_cost(cases[i]), cases[i].id))
    mine = {i for rank, i in enumerate(ranked) if rank % count == index}
    return [case for i, case in enumerate(cases) if i in mine]


def merge_runs(run_dirs: list[Path], allow_mixed_commits: bool = False) -> tuple[pd.DataFrame, dict]:
    """The joined rows and meta of ``run_dirs`` (module docstring); MergeError on a conflict."""
    from .scale import mixed_models_note
    from .storage import RunFolderError, load_run

    if len(run_dirs) < 2:
        raise MergeError("merge needs at least two run folders")
    loaded = []
    for run_dir in run_dirs:
        try:
            loaded.append((Path(run_dir), *load_run(Path(run_dir))))
        except RunFolderError as error:
            raise MergeError(str(error)) from None
    owner: dict[tuple[str, str], Path] = {}
    for run_dir, frame, _ in loaded:
        for pair in zip(frame["case"], frame["backend"], strict=True):
            if pair in owner:
                raise MergeError(
                    f"{run_dir}: case {pair[0]!r} with backend {pair[1]!r} is also in {owner[pair]}: "
                    "shards must not overlap (give each host its own --shard I/N)"
                )
            owner[pair] = run_dir
    commits = {meta.get("commit") for _, _, meta in loaded}
    if len(commits) > 1 and not allow_mixed_commits:
        listed = ", ".join(f"{run_dir}: {str(meta.get('commit'))[:12]}" for run_dir, _, meta in loaded)
        raise MergeError(f"the runs are of different commits ({listed}); pass --allow-mixed-commits to merge anyway")
    frame = pd.concat([frame for _, frame, _ in loaded], ignore_index=True)
    case_order = {case: i for i, case in enumerate(dict.fromkeys(frame["case"]))}
    frame = frame.iloc[frame["case"].map(case_order).argsort(kind="stable")].reset_index(drop=True)
    meta = dict(loaded[0][2])
    gpus = {(g.get("host"), str(g.get("gpu_index"))): g for _, _, m in loaded for g in m.get("gpus") or []}
    meta["gpus"] = [gpus[key] for key in sorted(gpus, key=lambda k: (str(k[0]), k[1]))]
    meta["merged_from"] = [
        {"run": str(run_dir), "host": m.get("host"), "commit": m.get("commit"), "rows": len(f), "scale": m.get("scale")}
        for run_dir, f, m in loaded
    ]
    meta["case_files"] = sorted({c for _, _, m in loaded for c in m.get("case_files") or []})
    meta.pop("scale", None)  # each run's own is in merged_from
    names = {m.get("device_name") for _, _, m in loaded}
    if note := mixed_models_note(meta["gpus"]):
        meta["device_name"] = note
    elif len(names) > 1:
        meta["device_name"] = f"mixed devices: {' + '.join(sorted(str(n) for n in names))}"
    if len(commits) > 1:
        meta["commit"] = "mixed: " + " + ".join(sorted(str(c)[:12] for c in commits))
    return frame, meta
