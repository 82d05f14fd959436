import pytest


@pytest.fixture(autouse=True)
def _own_compile_cache(tmp_path, monkeypatch):
    """Every test's trials share a compile cache of their own (core.compile_cache), never the user's: a graph
    loaded from a cache leaves a smaller memory peak than one compiled, and tests must not depend on their order."""
    monkeypatch.setenv("MINDSPORE_AUTORESEARCH_CACHE", str(tmp_path / "cache"))
