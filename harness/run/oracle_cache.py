"""The float64 oracle's outputs, kept on disk by a sha256 of the inputs they were computed from.

The key hashes the oracle's source, the device type and each input tensor's dtype, shape and bytes:
a renamed case hits, a changed seed misses, an oracle edit invalidates all. Only the CPU oracle is
cached, one file per output (magic, the payload's sha256, the payload), written atomically, least
recently used pruned past ``$HARNESS_ORACLE_CACHE_MAX_BYTES``. The folder must be private (0700, yours);
``--verify-oracle-cache`` recomputes a fraction of the hits (:class:`PoisonedCacheError`). docs/scaling.md."""

import contextlib
import hashlib
import io
import os
import random
import stat
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ENV_DIR = "HARNESS_ORACLE_CACHE"
ENV_MAX_BYTES = "HARNESS_ORACLE_CACHE_MAX_BYTES"
ENV_VERIFY = "HARNESS_ORACLE_CACHE_VERIFY"  # a fraction of the hits to recompute and compare, in (0, 1]
DEFAULT_DIR = Path("~/.cache/paged-attention-harness/oracle")
DEFAULT_MAX_BYTES = 2 << 30  # 2 GiB
MAGIC = b"PAORC001"
KEY_VERSION = 2  # 2: tensors hashed as sha256 trees of 64 MiB chunks (1: flat sha256)
SUFFIX = ".oracle"
DERIVED_SUFFIX = ".derived"  # another result of the same inputs (lookup), e.g. the error bound
ARG_NAMES = ("q", "k_cache", "v_cache", "block_table", "seq_lens", "query_start_loc")
CHUNK_BYTES = 64 * 2**20


def tensor_digest(tensor: torch.Tensor) -> bytes:
    """A tensor's raw bytes (NaN payloads included) as one sha256 digest, the same whatever the thread count:
    ``sha256(sha256(chunk 0) || sha256(chunk 1) || ...)``, chunks of CHUNK_BYTES hashed on torch's threads."""
    flat = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    chunks = [memoryview(flat[start : start + CHUNK_BYTES]) for start in range(0, flat.size, CHUNK_BYTES)]
    threads = min(torch.get_num_threads(), len(chunks))
    if threads <= 1:
        leaves = [hashlib.sha256(chunk).digest() for chunk in chunks]
    else:
        with ThreadPoolExecutor(threads) as pool:
            leaves = list(pool.map(lambda chunk: hashlib.sha256(chunk).digest(), chunks))
    return hashlib.sha256(b"".join(leaves)).digest()


def _oracle_source_hash() -> str:
    """sha256 of the oracle's source: harness/run/oracle.py and the variants' oracle hooks (harness/cases/variants.py)."""
    harness = Path(__file__).parents[1]
    digest = hashlib.sha256()
    try:
        for source in (harness / "run" / "oracle.py", harness / "cases" / "variants.py"):
            digest.update(source.read_bytes())
    except OSError:
        return "unknown"
    return digest.hexdigest()


ORACLE_SOURCE_HASH = _oracle_source_hash()


def cache_dir() -> Path | None:
    value = os.environ.get(ENV_DIR, "").strip()
    return None if value.lower() == "off" else Path(value or DEFAULT_DIR).expanduser()


class PoisonedCacheError(ValueError):
    """A cache entry differs from the oracle recomputed from the same inputs; names the entry."""


_warned: set[Path] = set()


def private_folder(folder: Path) -> bool:
    """Whether ``folder`` may hold this user's cache: created 0700 when missing; an existing one must be
    this user's and not group- or world-writable (else a warning, once per folder, and False)."""
    try:
        if not folder.exists():
            folder.mkdir(parents=True, mode=0o700)
            folder.chmod(0o700)  # the umask may have taken bits mkdir's mode asked for; never adds any
        info = folder.lstat()
    except OSError:
        return False  # cannot create or read it: a miss, as the cache never fails a run
    why = ""
    if not stat.S_ISDIR(info.st_mode):
        why = "is not a folder (a symbolic link or a file)"
    elif info.st_uid != os.getuid():
        why = f"belongs to another user (uid {info.st_uid})"
    elif info.st_mode & 0o022:
        why = f"may be written by group or others (mode {stat.S_IMODE(info.st_mode):03o})"
    if why:
        if folder not in _warned:
            _warned.add(folder)
            print(f"warning: oracle cache {folder} {why}: not used, every oracle is computed "
                  f"(chmod 700 it, or choose another with --oracle-cache DIR)", file=sys.stderr)  # fmt: skip
        return False
    return True


def verify_fraction() -> float:
    """The share of hits recomputed and compared (``$HARNESS_ORACLE_CACHE_VERIFY``); 0 when unset."""
    value = os.environ.get(ENV_VERIFY, "").strip()
    try:
        fraction = float(value) if value else 0.0
    except ValueError:
        fraction = -1.0
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"{ENV_VERIFY}={value!r}: give a fraction in (0, 1]")
    return fraction


def meta_record() -> dict:
    """meta.json's ``oracle_cache``: the mode (off, on, verify) and the folder."""
    if (folder := cache_dir()) is None:
        return {"mode": "off", "folder": None}
    if fraction := verify_fraction():
        return {"mode": "verify", "folder": str(folder), "verify_fraction": fraction}
    return {"mode": "on", "folder": str(folder)}


def cache_key(args: Sequence[torch.Tensor | None], device: str, options: dict | None = None) -> str:
    """sha256 hex of the call's content: args (:data:`ARG_NAMES`, any device) and options, tensors by their bytes."""
    digest = hashlib.sha256()
    digest.update(f"key={KEY_VERSION};oracle={ORACLE_SOURCE_HASH};device={torch.device(device).type}".encode())
    named = list(zip(ARG_NAMES, args, strict=False))
    for name, value in sorted((options or {}).items()):
        if isinstance(value, torch.Tensor) or value is None:
            named.append((name, value))
        else:
            digest.update(f";{name}={value!r}".encode())
    for name, tensor in named:
        if tensor is None:
            digest.update(f";{name}=None".encode())
            continue
        digest.update(f";{name}:{tensor.dtype}:{tuple(tensor.shape)}:".encode())
        digest.update(tensor_digest(tensor))  # raw bytes, NaN payloads included
    return digest.hexdigest()


class OracleCache:
    def __init__(self, folder: Path, limit_bytes: int = DEFAULT_MAX_BYTES):
        self.folder, self.limit_bytes = Path(folder), limit_bytes

    def path(self, key: str, suffix: str = SUFFIX) -> Path:
        return self.folder / f"{key}{suffix}"

    def get(self, key: str, device: str, suffix: str = SUFFIX) -> torch.Tensor | None:
        """The stored output on ``device``, or None (absent, or a file that does not verify: removed)."""
        path = self.path(key, suffix)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # an entry is a file, never a link elsewhere
            with os.fdopen(fd, "rb") as file:
                blob = file.read()
        except OSError:
            return None
        payload = blob[len(MAGIC) + 32 :]
        tensor = None
        if blob[: len(MAGIC)] == MAGIC and hashlib.sha256(payload).digest() == blob[len(MAGIC) : len(MAGIC) + 32]:
            with contextlib.suppress(Exception):
                tensor = torch.load(io.BytesIO(payload), map_location=device, weights_only=True)
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float64:
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # a hit makes it the most recently used
        return tensor

    def put(self, key: str, tensor: torch.Tensor, suffix: str = SUFFIX) -> None:
        """Store ``tensor`` (atomically); then prune to the cap. Failures are ignored."""
        buffer = io.BytesIO()
        torch.save(tensor.detach().cpu(), buffer)
        payload = buffer.getvalue()
        if len(payload) > self.limit_bytes:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, temp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.folder)
            try:
                with os.fdopen(fd, "wb") as file:
                    file.write(MAGIC + hashlib.sha256(payload).digest() + payload)
                os.replace(temp, self.path(key, suffix))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
        except OSError:
            return
        self.prune()

    def entries(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every entry, oldest first."""
        found = []
        with contextlib.suppress(OSError):
            for path in [*self.folder.glob(f"*{SUFFIX}"), *self.folder.glob(f"*{DERIVED_SUFFIX}")]:
                with contextlib.suppress(OSError):
                    stat = path.stat()
                    found.append((stat.st_mtime, stat.st_size, path))
        return sorted(found)

    def prune(self) -> None:
        """Remove the least recently used entries while the folder holds more than the cap."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        if total <= self.limit_bytes:
            return
        target = int(self.limit_bytes * 0.9)
        for _, size, path in entries:
            if total <= target:
                break
            with contextlib.suppress(OSError):
                path.unlink()
            total -= size


def oracle_key(args: Sequence[torch.Tensor | None], device: str, options: dict | None = None) -> str | None:
    return None if cache_dir() is None or torch.device(device).type != "cpu" else cache_key(args, device, options)


def lookup(key: str | None, name: str, device: str, shape: Sequence[int],
           compute: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, bool]:  # fmt: skip
    """(the float64 result ``name`` of the call ``key`` (:func:`oracle_key`), of ``shape``, on ``device``; whether
    it came from the cache), else ``compute()``, stored unless ``key`` is None: "out" as ``<key>.oracle``, another
    as ``<sha256(key, name)>.derived``. Verify mode: a sampled hit that differs raises :class:`PoisonedCacheError`."""
    folder = cache_dir()
    if key is None or folder is None or not private_folder(folder):
        return compute(), False
    suffix = SUFFIX
    if name != "out":
        key, suffix = hashlib.sha256(f"{key};result={name}".encode()).hexdigest(), DERIVED_SUFFIX
    limit = os.environ.get(ENV_MAX_BYTES, "").strip()
    cache = OracleCache(folder, int(limit) if limit.isdigit() else DEFAULT_MAX_BYTES)
    found = cache.get(key, device, suffix)
    if found is not None and tuple(found.shape) == tuple(shape):
        fraction = verify_fraction()
        if fraction and random.random() < fraction:
            fresh = compute()
            if not torch.allclose(found, fresh, rtol=1e-9, atol=1e-12, equal_nan=True):
                with contextlib.suppress(OSError):
                    cache.path(key, suffix).unlink()
                worst = float((found - fresh).abs().nan_to_num(float("inf")).max()) if fresh.numel() else 0.0
                raise PoisonedCacheError(
                    f"oracle cache entry {cache.path(key, suffix)} ({name}) differs from the oracle recomputed "
                    f"from its inputs (max abs difference {worst:.3g}); removed. Something other than the "
                    "harness wrote it: check who can write the cache folder"
                )
            return fresh, False
        return found, True
    result = compute()
    cache.put(key, result, suffix)
    return result, False
