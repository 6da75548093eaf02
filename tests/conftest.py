"""Shared fixtures: the runtime (interpreter + float32 on a CPU, bf16 on a GPU) and seeded inputs."""

import os
import sys

import pytest
import torch

import qwen_lab  # noqa: F401  (sets TRITON_INTERPRET=1 on a CPU-only machine before any kernel is defined)
from qwen_lab import runtime
from xdist_quiet import pytest_runtest_protocol  # noqa: F401  (a hook: `quiet` tests run alone)

# No tuning read from or written to disk (qwen_lab.tunings), unless the environment asks for it: each test times what
# it tests, and test workers sharing one GPU leave no picks timed under contention for later processes. The notebooks
# nbval runs inherit it. (tests/test_tunings.py turns the store on in a folder of its own.)
os.environ.setdefault("QWEN_LAB_TUNING_CACHE", "0")

HAS_GPU = torch.cuda.is_available() and not runtime.interpreter_active()


def pytest_configure(config):
    # nbval gives a notebook's Jupyter kernel 60 s to start. On a 2-core machine running two test workers through
    # the interpreter, one start took longer and the whole notebook failed without running a cell; 300 s unless
    # the command line sets it. (This conftest is loaded whenever `tests` is among the paths, as in the README.)
    if getattr(config.option, "nbval_kernel_startup_timeout", None) == 60:
        config.option.nbval_kernel_startup_timeout = 300


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        # The tests that share a costly module fixture (marked xdist_group) build it inside the first test's time:
        # capturing every prefill bucket of the 0.8B model tunes each bucket's GEMMs, which passed 300 s while other
        # workers tuned beside it. Where pytest-timeout is active they get twice its limit.
        limit = getattr(config.option, "timeout", None)
        if config.pluginmanager.hasplugin("timeout") and limit:
            for item in items:
                if item.get_closest_marker("xdist_group") and not item.get_closest_marker("timeout"):
                    item.add_marker(pytest.mark.timeout(2 * float(limit)))
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU; this machine runs the CPU tests through the interpreter")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rt():
    """The device and dtype the kernels run in here."""
    return runtime.choose()


@pytest.fixture
def gen(request):
    """A torch.Generator seeded from the test's name: fresh per test, reproducible per test."""
    seed = sum(map(ord, request.node.nodeid)) % (2**31)
    return torch.Generator().manual_seed(seed)


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield


@pytest.fixture
def benchmark_module():
    """load(name) -> a script of benchmarks/ as a module. The probes' kernels are tested beside the library's: their
    timings only mean something if they compute what the library (or the reference) does."""
    import importlib.util

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")

    def load(name: str):
        if folder not in sys.path:  # the probes import what they share from beside them (probe_ab), as when run
            sys.path.insert(0, folder)
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


class _SwitchSetter:
    """switch(name=value, ...) sets qwen_lab.switches until the test ends; switch.force(kernel, config) forces a
    kernel's config until then (the switches' own `with` blocks, entered for the rest of the test)."""

    def __init__(self, stack):
        self._stack = stack

    def __call__(self, **values):
        from qwen_lab.switches import switches

        self._stack.enter_context(switches.set(**values))

    def force(self, kernel: str, config):
        from qwen_lab.switches import switches

        self._stack.enter_context(switches.force_config(kernel, config))


@pytest.fixture
def switch():
    import contextlib

    with contextlib.ExitStack() as stack:
        yield _SwitchSetter(stack)


_SUMMARIES: list = []


def pytest_runtest_logreport(report):
    # tests/test_mutations.py records its count as a property; the report carries it back from an xdist worker
    for name, value in getattr(report, "user_properties", ()):
        if name == "mutation_summary" and report.when == "call":
            _SUMMARIES.append(value)


def pytest_terminal_summary(terminalreporter):
    for line in _SUMMARIES:
        terminalreporter.write_line(line)
