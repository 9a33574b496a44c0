"""Where a scripts/gpu_run.sh call's time went, from its stamps: tests, the run's start-up, each suite, the write.

    python scripts/self/gpu_phases.py OUT     # OUT: gpu_run.sh's output folder

A suite runs from the previous suite's last row (the first: from launching ``harness run``) to its own
last row, rows mapped to suites by ``results.csv`` or the journal; the write is the last row to the exit."""

from __future__ import annotations

import argparse
import csv
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

ROW = re.compile(r"^(\d+\.\d+) \[\s*[\d.]+s\] (\S+) (\S+): (\w+)")


def main(out: Path) -> None:
    raw = {words[0]: words[1:] for words in map(str.split, (out / "phases.raw").read_text().splitlines()) if words}
    start = float(raw["start"][0])
    lines = []
    if "tests_start" in raw and "tests_end" in raw:
        lines.append(f"tests          {float(raw['tests_end'][0]) - float(raw['tests_start'][0]):7.1f} s")
    if "run_start" in raw:
        run_start = float(raw["run_start"][0])
        rows = [m.groups() for line in (out / "run.log").read_text().splitlines() if (m := ROW.match(line))]
        suite_of = _suites(out)
        previous = run_start
        spans: dict[str, float] = defaultdict(float)
        counts: dict[str, Counter] = defaultdict(Counter)
        for stamp, case, _backend, status in rows:
            suite = suite_of.get(case, "?")
            spans[suite] += float(stamp) - previous
            counts[suite][status] += 1
            previous = float(stamp)
        lines.append(f"run start-up, first suite's oracle included below: launch to first row "
                     f"{float(rows[0][0]) - run_start if rows else 0:.1f} s")  # fmt: skip
        for suite, seconds in spans.items():
            tally = ", ".join(f"{n} {s}" for s, n in sorted(counts[suite].items()))
            lines.append(f"suite {suite:<22} {seconds:7.1f} s  ({tally})")
        if run_end := raw.get("run_end"):
            lines.append(f"write          {float(run_end[0]) - previous:7.1f} s  "
                         f"(last row to exit; exit code {run_end[1]})")  # fmt: skip
        meta = out / "run" / "meta.json"
        if meta.is_file():
            scale = json.loads(meta.read_text()).get("scale", {})
            lines.append(f"rows' phases (meta.json scale.phase_s): {json.dumps(scale.get('phase_s', {}))}")
    end = max(float(v[0]) for k, v in raw.items() if k.endswith("_end") or k == "start")
    lines.append(f"total          {end - start:7.1f} s")
    print("\n".join(lines))


def _suites(out: Path) -> dict[str, str]:
    """case id -> its suite's file name, from the run folder's results.csv or the journal."""
    found = {}
    csv_path = out / "run" / "results.csv"
    if csv_path.is_file():
        with csv_path.open() as file:
            for row in csv.DictReader(file):
                found[row["case"]] = Path(row["case_file"]).name
    journal = out / "run.journal.jsonl"
    if journal.is_file():
        for line in journal.read_text().splitlines():
            record = json.loads(line)
            if "case" in record and "case_file" in record:
                found.setdefault(record["case"], Path(record["case_file"]).name)
    return found


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="scripts/gpu_run.sh's output folder")
    main(parser.parse_args().out)
