"""``harness backends``: what is registered, where it runs, its variants, and whether it runs here (on the
smoke suite's cases, on this machine's device or ``--device``)."""

import argparse

from harness.backends.builtin import REGISTRY
from harness.cases.variants import VARIANT_KEYS
from harness.cli.options import EXIT_OK, chosen_device, load
from harness.cli.run import load_plugins


def add_parser(verbs) -> None:
    listing = verbs.add_parser(
        "backends", help="the registered backends: kind, devices, declared variants, and whether each runs here",
        description="A backend that cannot run on the device (it needs CUDA, a library is missing, the "
        "interpreter runs only small cases) says why, in a run's skip words, over the smoke suite's cases.",
    )  # fmt: skip
    listing.add_argument("--device", choices=["cpu", "cuda"], help="judge availability there (default: this machine's)")
    listing.add_argument("--plugin", action="append", dest="harness_plugins", default=[], metavar="MODULE_OR_PATH",
                         help="list this plugin's backends too (imported in a worker process, as by run)")  # fmt: skip
    listing.set_defaults(handler=main)


def availability(backend, cases: list, device: str) -> str:
    """``yes``, ``no: REASON`` or ``N of M smoke cases (others: REASON)``: how a run here would treat it."""
    skipped = [reason for case in cases if (reason := backend.skip_reason(case, device)) is not None]
    if not skipped:
        return "yes"
    why = max(set(skipped), key=skipped.count).removeprefix(f"{backend.name} ")  # the most frequent reason
    runs = len(cases) - len(skipped)
    return f"{runs} of {len(cases)} smoke cases (others: {why})" if runs else f"no: {why}"


def main(args: argparse.Namespace) -> int:
    device = chosen_device(args.device)
    if (worker := load_plugins(args.harness_plugins, "plugins")[1]) is not None:
        worker.stop()
    cases = load([], device, None)
    rows = [("backend", "kind", "devices", f"runs here ({device})", "variants")]
    for b in REGISTRY.values():
        variants = "all" if b.variants == frozenset(VARIANT_KEYS) else ",".join(sorted(b.variants)) or "none"
        rows.append((b.name, b.kind, ",".join(b.devices), availability(b, cases, device), variants))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]))
    return EXIT_OK
