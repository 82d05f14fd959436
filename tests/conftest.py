import pytest

from core.user_cache import COMPILE_CACHE_ENV


@pytest.fixture(scope="session", autouse=True)
def _session_compile_cache(tmp_path_factory):
    """Trials started by module- and session-scoped fixtures (set up before any test's own fixtures) use a
    compile cache of the test session, never the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(COMPILE_CACHE_ENV, str(tmp_path_factory.mktemp("compile_cache")))
        yield


@pytest.fixture(autouse=True)
def _own_compile_cache(tmp_path, monkeypatch):
    """Every test's own trials share a compile cache of their own: a graph loaded from a cache leaves a smaller
    memory peak than one compiled, and tests must not depend on their order."""
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "cache"))
