"""The dispatcher's rule: Triton on CUDA when it imports, tlsim elsewhere; forcing is explicit."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import dispatch
from tests.kernel_cases import BASE


def test_cpu_selects_tlsim(monkeypatch):
    monkeypatch.delenv(kernels.BACKEND_ENV, raising=False)
    assert kernels.select_backend("cpu") == "tlsim"


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


def test_unknown_backend_name_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(kernels.BACKEND_ENV, "cutlass")
    with pytest.raises(ValueError, match="PAGED_ATTENTION_BACKEND is 'cutlass'; expected one of triton, tlsim"):
        kernels.select_backend("cpu")


def test_forcing_triton_where_it_cannot_run_is_an_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(kernels.BackendUnavailableError, match="needs a CUDA device"):
        kernels.select_backend("cpu", backend="triton")
    monkeypatch.setattr(dispatch, "has_triton", lambda: False)
    with pytest.raises(kernels.BackendUnavailableError, match="Triton is not installed"):
        kernels.select_backend("cuda", backend="triton")


@pytest.mark.parametrize("backend", ["tlsim", "reference"])
def test_dispatch_calls_the_selected_backend(monkeypatch, backend):
    calls = []
    real = dispatch._backend_fn(backend)

    def spy(*args, **kwargs):
        calls.append(backend)
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "_backend_fn", lambda name: spy if name == backend else pytest.fail(name))
    inputs = BASE.inputs()
    out = kernels.paged_attention_dispatch(*inputs.args(), backend=backend)
    assert calls == [backend]
    torch.testing.assert_close(out, real(*inputs.args()), rtol=0, atol=0)
