"""The dispatcher's rule: Triton on CUDA when it imports, tlsim elsewhere; forcing is explicit."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import kernels
from kernels import dispatch
from tests.fresh_python import run_fresh


def test_cuda_selects_triton_when_triton_imports(monkeypatch):
    monkeypatch.delenv(kernels.BACKEND_ENV, raising=False)
    monkeypatch.setattr(dispatch, "has_triton", lambda: True)
    assert kernels.select_backend("cuda") == "triton"
    monkeypatch.setattr(dispatch, "has_triton", lambda: False)
    assert kernels.select_backend("cuda") == "tlsim"


def test_environment_variable_forces_a_backend(monkeypatch):
    monkeypatch.setenv(kernels.BACKEND_ENV, "reference")
    assert kernels.select_backend("cpu") == "reference"
    assert kernels.select_backend("cpu", backend="tlsim") == "tlsim", "the argument wins over the environment"


def test_forcing_an_unknown_backend_or_triton_where_it_cannot_run_is_refused(monkeypatch):
    monkeypatch.delenv(kernels.BACKEND_ENV, raising=False)
    assert kernels.select_backend("cpu") == "tlsim", "unforced on a CPU: tlsim"
    with pytest.raises(ValueError, match="backend argument"):
        kernels.select_backend("cpu", "cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(kernels.BackendUnavailableError, match="TRITON_INTERPRET"):
        kernels.select_backend("cpu", backend="triton")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(kernels.BackendUnavailableError, match="needs a CUDA device"):
        kernels.select_backend("cpu", backend="triton")
    for other in ("tlsim", "reference"):  # only a forced triton asks whether Triton can run
        assert kernels.select_backend("cpu", backend=other) == other
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter serves the CPU, no other device
    assert dispatch.triton_unavailable_reason("cpu") is None
    assert "needs a CUDA device" in dispatch.triton_unavailable_reason("meta")
    monkeypatch.setattr(dispatch, "has_triton", lambda: False)
    with pytest.raises(kernels.BackendUnavailableError, match="Triton is not installed"):
        kernels.select_backend("cuda", backend="triton")
    monkeypatch.setenv(kernels.BACKEND_ENV, "cutlass")
    with pytest.raises(ValueError, match="PAGED_ATTENTION_BACKEND is 'cutlass'; expected one of triton, tlsim"):
        kernels.select_backend("cpu")


def test_import_kernels_does_not_import_triton_until_the_kernel_is_used():
    code = (
        "import sys, kernels\n"
        "assert 'triton' not in sys.modules, 'import kernels imported Triton'\n"
        "kernels.use_interpreter_if_no_gpu()\n"
        "fn = kernels.paged_attention_triton\n"
        "print(fn.__module__, kernels.has_triton() == ('triton' in sys.modules))\n"
    )
    result = run_fresh("-c", code)
    assert result.returncode == 0, result.stderr
    expected_module = "kernels.triton_paged" if kernels.has_triton() else "kernels"
    assert result.stdout.split() == [expected_module, "True"]


def test_use_interpreter_if_no_gpu_sets_triton_interpret_only_when_unset_and_without_a_gpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delitem(sys.modules, "triton", raising=False)  # as in a fresh interpreter: no warning
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert kernels.use_interpreter_if_no_gpu() is False, "a CUDA machine stays compiled"
    assert "TRITON_INTERPRET" not in os.environ
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kernels.use_interpreter_if_no_gpu() is True and os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert kernels.use_interpreter_if_no_gpu() is False, "a choice made by the user stays"
    assert os.environ["TRITON_INTERPRET"] == "0"
