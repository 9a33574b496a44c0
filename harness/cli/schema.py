"""``harness schema``: the JSON Schema of the case files (for an editor's completion and checks)."""

import argparse
import json

from harness.cases.spec import case_file_schema
from harness.cli.options import EXIT_OK


def add_parser(verbs) -> None:
    verbs.add_parser("schema", help="JSON Schema of the case files").set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    print(json.dumps(case_file_schema(), indent=2))
    return EXIT_OK
