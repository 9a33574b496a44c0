"""What a run prints on the terminal: a line a row (or the progress bar), the summary, the verdict."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

import pandas as pd

from harness.cases.vocab import FAILING, GRADED, STATUSES
from harness.cli.options import EXIT_FAIL
from harness.run.runner import exit_code


def _finite(value) -> bool:
    return isinstance(value, float | int) and math.isfinite(value)


def failure_detail(row) -> str:
    """Where a failing row is wrong, as the page says it (``worst at seq 0, query 0, head 0, 311 elements
    outside the tolerance, error 9.77x the tolerance``); '' for a row that has none of these."""
    parts = []
    if row.get("worst_location"):
        parts.append(f"worst at {row['worst_location']}")
    if _finite(row.get("fail_count")) and row["fail_count"] > 0:
        count = int(row["fail_count"])
        parts.append(f"{count} element{'s' if count != 1 else ''} outside the tolerance")
    if _finite(row.get("tol_ratio")) and row["tol_ratio"] > 1:
        parts.append(f"error {row['tol_ratio']:.3g}x the tolerance")
    return ", ".join(parts)


def summarize(frame: pd.DataFrame) -> str:
    """A short text summary: status counts per backend, the worst error, the slowest case, the failures."""
    if frame.empty:
        return "no rows"
    counts = pd.crosstab(frame["backend"], frame["status"]).reindex(columns=list(STATUSES), fill_value=0)
    graded = frame[frame["status"].isin(GRADED)]
    lines = [counts.to_string()]
    if graded["tol_ratio"].notna().any():
        worst = graded.loc[graded["tol_ratio"].idxmax()]
        ratio = worst["tol_ratio"]
        said = f"{ratio:.2f}x over it" if ratio > 1 else f"within it, at {ratio:.2f} of it"
        lines.append(
            f"{'furthest over' if ratio > 1 else 'closest to'} its tolerance: {worst['backend']} on {worst['case']}: "
            f"{said} (max abs {worst['max_abs_err']:.3g}, atol {worst['atol']:g}, rtol {worst['rtol']:g})"
        )
    timed = frame.dropna(subset=["latency_us"])
    if not timed.empty:
        slow = timed.loc[timed["latency_us"].idxmax()]
        lines.append(f"slowest: {slow['backend']} on {slow['case']}: {slow['latency_us']:.1f} us")
    bad = frame[frame["status"].isin(FAILING)]
    for _, row in bad.head(10).iterrows():
        detail = failure_detail(row)
        lines.append(f"{row['status'].upper()}: {row['backend']} on {row['case']}: "
                     + (f"{detail}: " if detail else "") + str(row["reason"]))  # fmt: skip
    if len(bad) > 10:
        lines.append(f"... and {len(bad) - 10} more failures/errors (see the report)")
    return "\n".join(lines)


def verdict_lines(frame: pd.DataFrame, code: int, *, most: int = 8, width: int = 110) -> str:
    """``PASS: 212 rows: 150 pass, 62 skip`` (``FAIL`` unless ``code`` is 0, ``INCOMPLETE`` for 4), then the ``most``
    most frequent skip reasons, cut to ``width``; one reason but for the backend's name shares a line."""
    counts = frame["status"].value_counts()
    order = ("fail", "error", "pass", "skip") if code == 1 else ("pass", "skip", "fail", "error")
    order += tuple(s for s in counts.index if s not in order)
    tally = ", ".join(f"{int(counts[s])} {s}" for s in order if counts.get(s, 0))
    word = {0: "PASS", 4: "INCOMPLETE"}.get(code, "FAIL")
    lines = [f"{word}: {len(frame)} row{'s' if len(frame) != 1 else ''}" + (f": {tally}" if tally else "")]
    skips = frame[frame["status"] == "skip"]
    groups = skips.groupby(["backend", "reason"], sort=False).size().sort_values(ascending=False, kind="stable")
    shared: dict[tuple[str, int], list[tuple[str, str]]] = {}  # (reason less the backend's name, count) -> rows
    for (backend, reason), count in groups.items():
        own = str(reason).removeprefix(f"{backend} ")  # a reason that names its backend may be shared
        shared.setdefault((own if own != reason else f"{backend}: {reason}", int(count)), []).append((backend, reason))
    for (reason, count), named in list(shared.items())[:most]:
        if len(named) > 1:
            line = f"skip {', '.join(b for b, _ in named)} ({count} each): {reason}"
        else:
            line = f"skip {named[0][0]} ({count}): {named[0][1] or 'no reason given'}"
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    if len(shared) > most:
        rest = sum(count * len(named) for (_, count), named in list(shared.items())[most:])
        lines.append(f"... and {rest} more skips for {len(shared) - most} other reasons (the report lists them)")
    return "\n".join(lines)


def verdict(frame: pd.DataFrame, requested: list[str] | None) -> tuple[int, list[str]]:
    code, messages = exit_code(frame), []
    status = frame["status"]
    if not status.isin(GRADED).any():
        code = EXIT_FAIL
        messages.append(
            f"error: nothing was graded: {int((status == 'skip').sum())} skip and "
            f"{int((status == 'error').sum())} error rows; a run that grades nothing is not a success"
        )
    for name in dict.fromkeys(requested or []):
        mine = frame[frame["backend"] == name]
        if not mine["status"].isin([*GRADED, "error"]).any():
            code = EXIT_FAIL
            why = mine["reason"].iloc[0] if len(mine) else "no case selected it"
            messages.append(f"error: --backend {name} ran on no case (every row a skip): {why}")
    return code, messages


def row_printer(skipped: dict[str, str], cases: int) -> Callable[[dict], None]:
    """on_row for runs without a progress bar (logs, CI): one line a row as it finishes, with the time so far;
    the backends in ``skipped`` (name -> why it cannot run here) are said once per reason, not row by row."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in skipped.items():
        by_reason.setdefault(reason, []).append(name)
    for reason, names in by_reason.items():
        each = " each" if len(names) > 1 else ""
        print(f"skip {', '.join(names)} ({cases} case{'s' if cases != 1 else ''}{each}): {reason}", file=sys.stderr)
    start = time.perf_counter()

    def show(row: dict) -> None:
        if row["backend"] in skipped and row["status"] == "skip":
            return
        timed = f" {row['latency_us']:.1f} us" if _finite(row.get("latency_us")) else ""
        timed += f" (call {row['call_us']:.1f} us)" if _finite(row.get("call_us")) else ""
        elapsed = time.perf_counter() - start
        print(f"[{elapsed:7.1f}s] {row['case']} {row['backend']}: {row['status']}{timed}", file=sys.stderr, flush=True)

    return show


def finish(frame: pd.DataFrame, code: int, messages: list[str], report: str) -> None:
    print(summarize(frame))
    for message in messages:
        print(message, file=sys.stderr)
    sys.stderr.flush()
    print(verdict_lines(frame, code))
    print(f"report: {report}")
