"""``harness list``: the expanded cases, as a table (what ``run`` would run, before it runs)."""

import argparse

from harness.cli.options import EXIT_OK, add_pattern, default_device, load


def add_parser(verbs) -> None:
    listing = verbs.add_parser("list", help="the expanded cases, as a table")
    listing.add_argument("cases", nargs="*", help="case files or folders, or a packaged suite's name; default: smoke")
    listing.add_argument("--tag", action="append", dest="harness_tags", help="only cases with this tag")
    add_pattern(listing)
    listing.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    import pandas as pd

    cases = load(args.cases, default_device(), args.harness_tags, pattern=args.pattern)
    table = pd.DataFrame(
        [{"case": c.id, "heads q/kv": f"{c.num_q_heads}/{c.num_kv_heads}", "head_dim": c.head_dim,
          "block_size": c.block_size, "dtype": c.dtype, "num_seqs": c.num_seqs, "max_seq_len": c.max_seq_len,
          "max_q_len": max(c.q_lens), "layout": c.layout, "tags": ",".join(c.tags)} for c in cases]
    )  # fmt: skip
    with pd.option_context("display.max_rows", None, "display.width", 200):
        print(table.to_string(index=False))
    print(f"{len(cases)} case{'' if len(cases) == 1 else 's'}")
    return EXIT_OK
