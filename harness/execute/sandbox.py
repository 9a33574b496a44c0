"""The walls around a plugin's worker process: a private mount namespace (Linux ``unshare``) where the
oracle cache folder is an empty tmpfs and the harness's package folder is read-only."""

import ctypes
import os
import sys
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18


def _mount(libc, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def wall_off(hidden: list[Path], read_only: list[Path]) -> str:
    """Enter a private mount namespace with ``hidden`` folders empty and ``read_only`` ones read-only;
    '' when done, otherwise why not (the run then does without the oracle cache)."""
    if not sys.platform.startswith("linux"):
        return f"no mount namespaces on {sys.platform}"
    for folder in hidden:
        folder.mkdir(parents=True, exist_ok=True)  # a folder to cover, so the plugin cannot make one first
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWNS if root else CLONE_NEWUSER | CLONE_NEWNS) != 0:
        errno = ctypes.get_errno()
        return f"unshare: {os.strerror(errno)} (user namespaces may be turned off on this machine)"
    try:
        if not root:  # map this user to itself inside the namespace
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the user's mounts
        for folder in hidden:
            _mount(libc, "tmpfs", str(folder), "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=0700")
        for folder in read_only:
            _mount(libc, str(folder), str(folder), None, MS_BIND | MS_REC)
            _mount(libc, None, str(folder), None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    except OSError as error:
        return str(error)
    return ""
