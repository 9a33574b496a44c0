"""Guards around a backend's call: its inputs stay pristine, its output has q's shape, dtype
and device, and only the user (not a backend) can stop the run.

* Inputs: every input tensor (q, k_cache, v_cache, block_table, seq_lens,
  query_start_loc, and the cache backend's per-sequence keys/values) is fingerprinted when
  the case's inputs are built (a pristine copy on the same device) and checked after each
  backend's graded call and after its timing (bitwise, NaN-safe). A backend that changed
  one fails with "mutated its input k_cache", and the inputs are restored in place
  (copied back into the same tensors, so every reference sees them pristine) before the
  next backend runs. A check is one on-device comparison; the copy doubles the inputs' memory.
* Output: a result that is not a tensor, or whose shape, dtype or device differs from q's,
  fails with the reason (a float64 result for fp16 inputs would otherwise pass).
* Stops: ``SystemExit`` and ``KeyboardInterrupt`` raised by a backend are error rows. The
  user's Ctrl-C (SIGINT, flagged by :func:`install_signal_handlers`) and SIGTERM
  (:class:`Terminated`) still stop the run.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import torch

from .inputs import PagedInputs


class Terminated(BaseException):
    """SIGTERM arrived: stop the run like Ctrl-C (the journal is kept), exit 143."""


USER_INTERRUPT = threading.Event()  # set by the SIGINT handler: this KeyboardInterrupt is the user's


def _on_sigint(signum, frame):
    USER_INTERRUPT.set()
    raise KeyboardInterrupt


def _on_sigterm(signum, frame):
    raise Terminated


def install_signal_handlers() -> Callable[[], None]:
    """Ctrl-C flags itself as the user's; SIGTERM raises :class:`Terminated`. Returns a restorer."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    USER_INTERRUPT.clear()
    saved = signal.signal(signal.SIGINT, _on_sigint), signal.signal(signal.SIGTERM, _on_sigterm)

    def restore() -> None:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])

    return restore


def raised_by_backend(error: BaseException) -> bool:
    """Whether ``error`` from a backend's code is that backend's fault (an error row), not a stop."""
    if isinstance(error, Exception | SystemExit):
        return True
    return isinstance(error, KeyboardInterrupt) and not USER_INTERRUPT.is_set()


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(tensor: torch.Tensor, pristine: torch.Tensor) -> bool:
    """Whether ``tensor`` holds exactly ``pristine``'s bits (NaN equals NaN here), on its own device.

    Compared as integers of the element's width, so a NaN payload counts and -0.0 != 0.0.
    """
    if tensor.shape != pristine.shape or tensor.dtype != pristine.dtype or tensor.stride() != pristine.stride():
        return False
    as_int = _SAME_SIZE_INT[tensor.element_size()]
    return torch.equal(tensor.detach().contiguous().view(as_int), pristine.contiguous().view(as_int))


def named_inputs(inputs: PagedInputs) -> dict[str, torch.Tensor]:
    """Every tensor a backend is handed, by the name an error message uses."""
    named = dict(
        zip(("q", "k_cache", "v_cache", "block_table", "seq_lens", "query_start_loc"), inputs.args(), strict=True)
    )
    named.update({f"keys[{i}]": t for i, t in enumerate(inputs.keys)})
    named.update({f"values[{i}]": t for i, t in enumerate(inputs.values)})
    return named


class InputGuard:
    """A pristine copy of a case's inputs, on their device; finds and undoes a backend's changes.

    The copy doubles the inputs' memory but makes a check one on-device comparison (a
    millisecond for gigabytes on a GPU) instead of a hash of every byte on the host.
    """

    def __init__(self, inputs: PagedInputs, rebuild: Callable[[], PagedInputs] | None = None):
        self.inputs = inputs
        self.pristine = {name: t.detach().clone() for name, t in named_inputs(inputs).items()}

    def mutated(self) -> list[str]:
        """Names of the inputs that differ from the pristine ones."""
        return [name for name, t in named_inputs(self.inputs).items() if not same_bits(t, self.pristine[name])]

    def restore(self, names: list[str]) -> None:
        """Copy pristine values back into the named input tensors, in place."""
        for name, tensor in named_inputs(self.inputs).items():
            if name in names:
                with torch.no_grad():
                    pristine = self.pristine[name]
                    if tensor.shape != pristine.shape or tensor.dtype != pristine.dtype:
                        tensor.set_(pristine.clone())
                    else:
                        tensor.copy_(pristine)
        if still := self.mutated():
            raise RuntimeError(f"could not restore the inputs {still} after a backend changed them")

    def check(self, when: str) -> str:
        """'' when the inputs are pristine; else the reason, after restoring them."""
        names = self.mutated()
        if not names:
            return ""
        self.restore(names)
        return f"mutated its input {', '.join(names)} {when} (restored for the next backend)"


def check_output(result, q: torch.Tensor) -> str:
    """'' when ``result`` is a tensor of q's shape, dtype and device; else what differs."""
    if not isinstance(result, torch.Tensor):
        return f"returned {type(result).__name__}, not a tensor [num_tokens, num_q_heads, head_dim]"
    problems = []
    if tuple(result.shape) != tuple(q.shape):
        problems.append(f"shape {tuple(result.shape)}, expected {tuple(q.shape)}")
    if result.dtype != q.dtype:
        problems.append(f"dtype {str(result.dtype).removeprefix('torch.')}, expected q's "
                        f"{str(q.dtype).removeprefix('torch.')}")  # fmt: skip
    if result.device != q.device:
        problems.append(f"device {result.device}, expected q's {q.device}")
    return f"output has {'; '.join(problems)}" if problems else ""
