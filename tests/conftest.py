"""Shared pytest setup: without a GPU the Triton interpreter is switched on before anything imports Triton
(``import kernels`` does not); the kernels' value checks are on (PAGED_ATTENTION_CHECK=1) unless a test unsets them."""

import contextlib
import os
import tempfile

import pytest
import torch

import kernels
from tests.fresh_python import git_in
from tests.tiny_cases import write_cases

kernels.use_interpreter_if_no_gpu()
os.environ.setdefault(kernels.CHECK_ENV, "1")
# The oracle cache of a test session lives in a temporary folder, not the user's ~/.cache.
os.environ.setdefault("HARNESS_ORACLE_CACHE", tempfile.mkdtemp(prefix="harness-oracle-tests-"))

pytest_plugins = ["harness.pytest_plugin"]


def pytest_collection_modifyitems(config, items):
    """The tests marked slow run first, so that under `pytest -n 2 --dist worksteal` the short ones left at the end
    are shared and the workers finish together."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: False (slow) first


# --- a guard that makes every host read of a tensor value fail ------------------------------

VALUE_READERS = ("item", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__", "__complex__", "__array__")


class ValueReadGuard:
    """Every Python-level read of a tensor's value onto the host (VALUE_READERS) raises while :meth:`forbidden`
    is active; :meth:`allowed` lifts it inside (for the Triton interpreter). C++-internal syncs are out of its reach."""

    def __init__(self):
        self.originals = {name: getattr(torch.Tensor, name) for name in VALUE_READERS if hasattr(torch.Tensor, name)}
        self.reads: list[str] = []

    def _raiser(self, name):
        def read(tensor, *args, **kwargs):
            self.reads.append(name)
            raise AssertionError(f"the call read a tensor value on the host: Tensor.{name}")

        return read

    @contextlib.contextmanager
    def _readers(self, readers: dict):
        with pytest.MonkeyPatch.context() as patch:  # undone on leaving, to what was there on entering
            for name, reader in readers.items():
                patch.setattr(torch.Tensor, name, reader)
            yield self

    def forbidden(self):
        return self._readers({name: self._raiser(name) for name in self.originals})

    def allowed(self):
        return self._readers(self.originals)


@pytest.fixture
def value_reads():
    """A :class:`ValueReadGuard`; its patches are undone as each of its blocks ends."""
    return ValueReadGuard()


@pytest.fixture
def triton_launches(monkeypatch, value_reads):
    """The Triton kernel's launches recorded (grids in ``.grids``), value checks off; skips where it cannot run."""
    from tests.kernels.kernel_cases import KernelRecorder, needs_triton

    triton_paged = needs_triton()
    main = KernelRecorder(triton_paged.paged_attention_kernel, value_reads)
    monkeypatch.setattr(triton_paged, "paged_attention_kernel", main)
    monkeypatch.setattr(
        triton_paged, "combine_splits_kernel", KernelRecorder(triton_paged.combine_splits_kernel, value_reads)
    )
    monkeypatch.delenv(kernels.CHECK_ENV, raising=False)
    return main


@pytest.fixture
def recorded(monkeypatch):
    """Both Triton kernels replaced by one recorder (tests/kernels/kernel_cases.py's KernelRecorder) that runs
    nothing (``plans``: the launcher's, emptied); value checks off; skips where the kernel cannot run."""
    from tests.kernels.kernel_cases import KernelRecorder, needs_triton

    triton_paged = needs_triton()
    recorder = KernelRecorder()
    recorder.plans = triton_paged.PLANS
    monkeypatch.setattr(triton_paged, "paged_attention_kernel", recorder)
    monkeypatch.setattr(triton_paged, "combine_splits_kernel", recorder)
    monkeypatch.delenv(kernels.CHECK_ENV, raising=False)
    triton_paged.PLANS.clear()
    yield recorder
    triton_paged.PLANS.clear()


PLOTS = ("latency_and_bandwidth", "error_vs_tolerance", "scaling_fit", "trend")


@pytest.fixture(scope="session", autouse=True)
def _plots_not_drawn():
    """Pages render without their plots (about a second a page), in the runs of module and session fixtures too:
    each drawing function of :mod:`harness.results.plots` answers None, "nothing to draw". Yields the drawing
    functions by name, for :func:`drawn_plots`."""
    try:
        from harness.results import plots
    except ImportError:  # no matplotlib: the pages draw nothing anyway
        yield {}
        return
    drawing = {name: getattr(plots, name) for name in PLOTS}
    with pytest.MonkeyPatch.context() as patch:
        for name in PLOTS:
            patch.setattr(plots, name, lambda *args, **kwargs: None)
        yield drawing


@pytest.fixture
def drawn_plots(_plots_not_drawn, monkeypatch):
    """The pages' plots drawn for real, for this test (every other test leaves them out: :func:`_plots_not_drawn`)."""
    if _plots_not_drawn:
        from harness.results import plots

        for name, draw in _plots_not_drawn.items():
            monkeypatch.setattr(plots, name, draw)


@pytest.fixture
def plot_text_as_text(monkeypatch):
    """Plots keep their text as SVG ``<text>`` (``svg.fonttype`` 'none'), for :mod:`tests.harness.plot_text`."""
    try:
        import matplotlib
    except ImportError:  # no matplotlib: the pages draw nothing, and the tests that read plots skip
        return
    monkeypatch.setitem(matplotlib.rcParams, "svg.fonttype", "none")


@pytest.fixture
def clean_registry():
    """Restore the backend registry after a test that registers backends of its own."""
    from harness.backends.registry import REGISTRY

    saved = dict(REGISTRY)
    yield
    REGISTRY.clear()
    REGISTRY.update(saved)


@pytest.fixture
def case_file(tmp_path):
    """tiny.toml: one case, ``tiny`` (tagged ``small``), of :data:`tests.tiny_cases.TINY`'s fields."""
    return write_cases(tmp_path / "tiny.toml", {"name": "tiny", "tags": ["small"]})


@pytest.fixture
def git_history(tmp_path) -> dict[str, str]:
    """A git repository at ``tmp_path / "repo"``: name -> commit id of "head", "branch" (a local branch beside
    HEAD), "fetched" (only on a remote-tracking branch) and "loose" (reachable from no ref)."""
    git = git_in(tmp_path / "repo")
    git("commit", "-q", "--allow-empty", "-m", "head")
    head = git("rev-parse", "HEAD")
    tree = git("rev-parse", "HEAD^{tree}")
    made = {name: git("commit-tree", tree, "-p", head, "-m", name) for name in ("branch", "fetched", "loose")}
    git("branch", "side", made["branch"])
    git("update-ref", "refs/remotes/colleague/pr", made["fetched"])
    return {"head": head, **made}
