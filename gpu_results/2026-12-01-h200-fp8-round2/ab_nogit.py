"""scripts/kernel_ab.py on a copy of the tree without git: the base kernel comes from a file.

    PYTHONPATH=. python gpu_results/2026-12-01-h200-fp8-round2/ab_nogit.py BASE_KERNEL.py [kernel_ab arguments]

kernel_ab reads the base revision's kernel with ``git show REV:kernels/triton_paged.py``; here that
one command answers with BASE_KERNEL.py's text (the same file, taken from the base commit before
the tree was copied), and everything else runs as kernel_ab runs it.
"""

import subprocess
import sys
from pathlib import Path

BASE_TEXT = Path(sys.argv[1]).read_text()
_run = subprocess.run


def _run_without_git(args, *rest, **kwargs):
    if list(args[:2]) == ["git", "show"]:
        return subprocess.CompletedProcess(args, 0, stdout=BASE_TEXT, stderr="")
    return _run(args, *rest, **kwargs)


subprocess.run = _run_without_git
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts import kernel_ab  # noqa: E402

sys.exit(kernel_ab.main(sys.argv[2:]))
