"""A reader that leaves early (``harness schema | head``) ends the command quietly, not as a harness bug."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_closed_stdout_is_exit_141_without_a_traceback():
    child = subprocess.Popen([sys.executable, "-m", "harness", "schema"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)  # fmt: skip
    child.stdout.close()  # the pipe's reader is gone before the schema is written (importing torch takes seconds)
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141, stderr
    assert "internal error" not in stderr and "Traceback" not in stderr
