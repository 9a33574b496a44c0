"""``harness variants``: each attention variant's case field, key and the keywords a kernel receives."""

import argparse

from harness.cases.variants import variants_text
from harness.cli.options import EXIT_OK


def add_parser(verbs) -> None:
    verbs.add_parser(
        "variants", help="the attention variants: case field, key, the keywords a kernel receives"
    ).set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    print(variants_text())
    return EXIT_OK
