"""What a run records about where it ran: commit, host, device, versions, ceilings."""

import contextlib
import importlib.metadata
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
    return bool(git("status", "--porcelain", "--untracked-files=no")) if git("rev-parse", "--git-dir") else None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform knows."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
        for line in cpuinfo:
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (runnable processes); None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


GPU_QUERY = "clocks.sm,clocks.mem,temperature.gpu,power.draw"


def gpu_state() -> list[dict[str, str]] | None:
    """Per GPU: SM and memory clocks, temperature, power (nvidia-smi, read only); None if unreadable."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True, timeout=10).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    keys = GPU_QUERY.split(",")
    rows = [line for line in out.splitlines() if line.strip()]
    return [dict(zip(keys, (v.strip() for v in line.split(",")), strict=False)) for line in rows]


def harness_version() -> str | None:
    try:
        return importlib.metadata.version("paged-attention-harness")
    except importlib.metadata.PackageNotFoundError:
        return None


def commit_record() -> dict:
    """The run's commit and its source: ``HARNESS_COMMIT`` wins over git's (a copy may carry a stale ``.git``)."""
    from_git = git("rev-parse", "HEAD") or None
    declared = os.environ.get("HARNESS_COMMIT") or None
    if declared and from_git and declared != from_git:
        stale = f"HARNESS_COMMIT; git here says {from_git[:12]} (a stale copy of .git)"
        return {"commit": declared, "commit_source": stale, "dirty": None}
    if from_git:
        return {"commit": from_git, "commit_source": "git"}
    if declared:
        return {"commit": declared, "commit_source": "HARNESS_COMMIT (no git checkout here)"}
    return {"commit": None, "commit_source": "no git checkout and no HARNESS_COMMIT"}


def collect_meta(device: str, argv: list[str], ceilings: dict[str, float], oracle_cache: dict | None = None) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    dev = torch.device(device)
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    return {
        "dirty": dirty(), **commit_record(),  # after dirty: a stale .git makes both unknown
        "time": datetime.now(UTC).isoformat(timespec="seconds"), "host": socket.gethostname(), "device": device,
        "device_name": device_name, "torch": torch.__version__, "triton": triton_version,
        "python": platform.python_version(), "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        "command": " ".join(argv), "ceilings_gbps": ceilings, "harness_version": harness_version(),
        "oracle_cache": oracle_cache,  # harness.run.oracle_cache.meta_record(): off, on or verify, and the folder
        # what says how quiet the machine was
        "cpu_model": cpu_model(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average": load_average(), **({"gpu_state": gpu_state()} if dev.type == "cuda" else {}),
    }  # fmt: skip
