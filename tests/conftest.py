import pytest

from core.user_cache import CACHE_ENV, COMPILE_CACHE_ENV


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    """The test session's own project cache (core.user_cache), never the user's: a reference rate measured while
    tests load the machine must not become the machine's MFU denominator. Trials started by module- and
    session-scoped fixtures (set up before any test's own fixtures) compile into it too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("user_cache")))
        mp.delenv(COMPILE_CACHE_ENV, raising=False)
        yield


@pytest.fixture(autouse=True)
def _own_compile_cache(tmp_path, monkeypatch):
    """Every test's own trials share a compile cache of their own: a graph loaded from a cache leaves a smaller
    memory peak than one compiled, and tests must not depend on their order."""
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "cache"))
