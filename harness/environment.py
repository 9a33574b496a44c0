"""What a run records about where it ran: commit, host, device, versions, ceilings.

Everything needed to trust or reproduce a run later, and to judge how noisy it was.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import UTC, datetime

import torch


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def dirty() -> bool | None:
    """True when tracked files differ from HEAD; None when this is no git checkout."""
    if not git("rev-parse", "--git-dir"):
        return None
    return bool(git("status", "--porcelain", "--untracked-files=no"))


def collect_meta(device: str, argv: list[str], ceilings: dict[str, float]) -> dict:
    """Everything needed to trust or reproduce a run later."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    dev = torch.device(device)
    return {
        # HARNESS_COMMIT names the commit where the tree travels without .git (a lent GPU box).
        "commit": git("rev-parse", "HEAD") or os.environ.get("HARNESS_COMMIT") or None,
        "dirty": dirty(),
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "device": device,
        "device_name": torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        "command": " ".join(argv),
        "ceilings_gbps": ceilings,
    }
