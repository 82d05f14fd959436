import os

import pytest

from core.runtime import native_env

native_env.apply()  # the test process loads MindSpore's libraries as a trial does (core.train)
# Imports MindSpore, whose import sets variables of its own (LD_LIBRARY_PATH, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION,
# ...): here, before any test's environment snapshot, not inside the first test that happens to import it.
from core.runtime.cache_dirs import CACHE_ENV, COMPILE_CACHE_ENV
from core.runtime.settings import HOST_BLOCKING_ENV

# The test process runs MindSpore as a trial on the CPU does (core.runtime.settings._host_pipeline: no spinning host
# queues). MindSpore reads this at the first op it queues, once per process: set before any test module is even
# collected. Trials the tests start set it again from their own config.
os.environ.setdefault(HOST_BLOCKING_ENV, "1")


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    """The test session's own project cache (core.runtime.cache_dirs), never the user's: a reference rate measured while
    tests load the machine must not become the machine's MFU denominator. pytest-xdist's workers share it (the
    reference rate and the corpus are built once, under their own locks, instead of once per worker), but each
    worker compiles into a cache of its own: trials started by module- and session-scoped fixtures (set up
    before any test's own fixtures) compile there, and a graph loaded from another worker's trial would make a
    fixture's memory peak depend on the order in which workers ran."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "user_cache"
    shared.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(shared))
        mp.setenv(COMPILE_CACHE_ENV, str(base / "session_compile_cache"))
        yield


@pytest.fixture(autouse=True)
def _environment_unchanged():
    """A test leaves os.environ as it found it: the test process's environment is every later trial's (a
    MS_COMPILER_CACHE_PATH left behind by a unit test once sent later graph-kernel-fusion trials' kernels into
    that test's directory). Set up before the other fixtures, so it checks after monkeypatch has undone its own."""
    before = dict(os.environ)
    yield
    changed = sorted(
        k
        for k in before.keys() | os.environ.keys()
        if before.get(k) != os.environ.get(k) and k != "PYTEST_CURRENT_TEST"
    )  # pytest's own
    assert not changed, f"the test left os.environ changed: {changed}; set variables with monkeypatch"


@pytest.fixture(autouse=True)
def _own_compile_cache(tmp_path, monkeypatch):
    """Every test's own trials share a compile cache of their own: a graph loaded from a cache leaves a smaller
    memory peak than one compiled, and tests must not depend on their order."""
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "cache"))
