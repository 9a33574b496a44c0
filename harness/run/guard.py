"""Guards of a backend's call: pristine inputs, an output of q's shape, dtype and device; only the user stops a run."""

import signal
import threading
from collections.abc import Callable

import torch

from harness.cases.inputs import PagedInputs
from harness.run.oracle_cache import ARG_NAMES, CHUNK_BYTES, tensor_digest


class Terminated(BaseException):
    """SIGTERM arrived: stop the run like Ctrl-C (the journal is kept), exit 143."""


USER_INTERRUPT = threading.Event()  # set by the SIGINT handler: this KeyboardInterrupt is the user's


def install_signal_handlers() -> Callable[[], None]:
    """Ctrl-C flags itself as the user's; SIGTERM raises :class:`Terminated`. Returns a restorer."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    USER_INTERRUPT.clear()

    def on_sigint(signum, frame):
        USER_INTERRUPT.set()
        raise KeyboardInterrupt

    def on_sigterm(signum, frame):
        raise Terminated

    saved = [(sig, signal.signal(sig, new)) for sig, new in ((signal.SIGINT, on_sigint), (signal.SIGTERM, on_sigterm))]
    return lambda: [signal.signal(sig, old) for sig, old in saved]  # the restorer


def raised_by_backend(error: BaseException) -> bool:
    """Whether ``error`` from a backend's code is that backend's fault (an error row), not a stop."""
    if isinstance(error, Exception | SystemExit):
        return True
    return isinstance(error, KeyboardInterrupt) and not USER_INTERRUPT.is_set()


def fingerprint(tensor: torch.Tensor) -> tuple:
    """(shape, stride, dtype, digest of the bytes): equal iff unchanged (NaN == NaN here). A device tensor's
    digest is :func:`device_digest`, computed where it lives so that no pool is copied to the host."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if flat.device.type != "cpu":
        return tuple(tensor.shape), tensor.stride(), tensor.dtype, device_digest(flat)
    return tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor_digest(flat).hex()


def device_digest(flat: torch.Tensor) -> tuple[int, int]:
    """(sum, position-weighted sum) of a uint8 tensor's bytes as int32 words, computed on its device."""
    words = torch.nn.functional.pad(flat, (0, -flat.numel() % 4)).view(torch.int32)
    total = weighted = 0
    step = CHUNK_BYTES // 4  # device tensors are summed in chunks of the host digest's size
    for start in range(0, words.numel(), step):
        chunk = words[start : start + step].long()
        position = torch.arange(start, start + chunk.numel(), device=chunk.device) % 65521 + 1
        total += int(chunk.sum())
        weighted += int((chunk * position).sum())
    return total, weighted


def named_inputs(inputs: PagedInputs) -> dict[str, torch.Tensor]:
    return dict(zip(ARG_NAMES, inputs.args(), strict=True))


class InputGuard:
    """Fingerprints of a case's pristine inputs; finds and undoes a backend's changes."""

    def __init__(self, inputs: PagedInputs, rebuild: Callable[[], PagedInputs]):
        self.inputs = inputs
        self.rebuild = rebuild  # the same inputs again, from the case's seed
        self.prints = {name: fingerprint(t) for name, t in named_inputs(inputs).items()}

    def mutated(self) -> list[str]:
        return [name for name, t in named_inputs(self.inputs).items() if fingerprint(t) != self.prints[name]]

    def check(self, when: str) -> str:
        """'' when the inputs are pristine; else the reason, after copying pristine values back in place."""
        if not (names := self.mutated()):
            return ""
        pristine, current = named_inputs(self.rebuild()), named_inputs(self.inputs)
        with torch.no_grad():
            for name in names:
                if current[name].shape != pristine[name].shape or current[name].dtype != pristine[name].dtype:
                    current[name].set_(pristine[name].clone())
                else:
                    current[name].copy_(pristine[name])
        if still := self.mutated():
            raise RuntimeError(f"could not restore the inputs {still} after a backend changed them")
        return f"mutated its input {', '.join(names)} {when} (restored for the next backend)"


def check_output(result, q: torch.Tensor, head_dim_v: int | None = None) -> str:
    """'' when ``result`` is a tensor of q's shape (last dim head_dim_v when given), dtype and device; else what differs."""
    if not isinstance(result, torch.Tensor):
        return f"returned {type(result).__name__}, not a tensor [num_tokens, num_q_heads, head_dim]"
    problems = []
    shape = (*q.shape[:2], q.shape[2] if head_dim_v is None else head_dim_v)
    if tuple(result.shape) != shape:
        problems.append(f"shape {tuple(result.shape)}, expected {shape}")
    if result.dtype != q.dtype:
        problems.append(f"dtype {str(result.dtype).removeprefix('torch.')}, expected q's "
                        f"{str(q.dtype).removeprefix('torch.')}")  # fmt: skip
    if result.device != q.device:
        problems.append(f"device {result.device}, expected q's {q.device}")
    return f"output has {'; '.join(problems)}" if problems else ""
