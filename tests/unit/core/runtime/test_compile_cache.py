"""core.runtime.compile_cache: which configs share graphs, and how entries are loaded, published, dropped and evicted
(the directories MindSpore writes are stood in for by files; tests/integration/test_compile_cache.py runs trials)."""

import dataclasses
import os
import time
from unittest import mock

import pytest

from core.config import TrainConfig, load_config
from core.runtime import cache_dirs as user_cache
from core.runtime import compile_cache as cc


def config(*overrides: str) -> TrainConfig:
    return load_config(["model=tiny", *overrides])


SAME_GRAPHS = [
    "seed=3",
    "optim.lr=1e-4",
    "optim.warmup_steps=0",
    "optim.schedule=wsd",
    "trial.max_steps=7",
    "trial.dir=/elsewhere",
    "checkpoint.interval=2",
    "training.log_interval=5",
    "data.train_path=/some/tokens.bin",
    "execution.compile_cache_dir=/tmp/x",
]
OTHER_GRAPHS = [
    "model.d_model=64",
    "optim.weight_decay=0.0",
    "optim.grad_clip=0.5",
    "optim=muon",
    "parallel.tp=2",
    "training.seq_len=32",
    "training.global_batch_size=4",
    "execution.jit_level=O1",
    "memory.recompute=full",
    "training.mode=pynative",
    "execution.kernel_threads=1",
    "training.eval_interval=2",
]  # validating every 2 of 20 steps compiles the validation graph


@pytest.fixture(scope="module")
def base_key():
    return cc.graph_key(config())


@pytest.mark.parametrize("override", SAME_GRAPHS)
def test_what_only_the_host_uses_shares_the_graphs(base_key, override):
    assert cc.graph_key(config(override)) == base_key


@pytest.mark.parametrize("override", OTHER_GRAPHS)
def test_what_shapes_a_graph_changes_the_key(base_key, override):
    assert cc.graph_key(config(override)) != base_key


def test_every_host_only_key_names_a_config_field():
    tree = dataclasses.asdict(TrainConfig())
    for dotted in cc.HOST_ONLY:
        node = tree
        for name in dotted.split("."):
            assert name in node, dotted
            node = node[name]


def test_the_key_follows_the_code(base_key, monkeypatch):
    monkeypatch.setattr(cc, "_code_digest", lambda: "another version of core")
    assert cc.graph_key(config()) != base_key


def _compile(cache: cc.CompileCache, text: str = "graph") -> None:
    """What MindSpore does under MS_COMPILER_CACHE_PATH: write <path>/rank_<r>/graph_cache/..."""
    out = cache.work_dir / cache.rank_dir / "graph_cache"
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_cache_0.mindir").write_text(text)


@pytest.fixture
def env():
    """os.environ without MindSpore's cache variables, restored whole afterwards (monkeypatch.delenv of an absent
    variable records nothing, so what a test then sets would outlive it)."""
    with mock.patch.dict(os.environ):
        os.environ.pop("MS_COMPILER_CACHE_ENABLE", None)
        os.environ.pop("MS_COMPILER_CACHE_PATH", None)
        yield os.environ


def test_a_miss_compiles_privately_and_publishes_only_when_the_trial_ended_well(tmp_path, env):
    first = cc.CompileCache(tmp_path / "root", "k", rank=1, work_dir=tmp_path / "t1" / "compile_cache")
    first.open()
    assert not first.loaded and env["MS_COMPILER_CACHE_ENABLE"] == "1"
    assert env["MS_COMPILER_CACHE_PATH"] == str(tmp_path / "t1" / "compile_cache")
    _compile(first)
    first.close(ok=False)
    assert not (tmp_path / "root" / "k").exists()
    assert "MS_COMPILER_CACHE_ENABLE" not in env and "MS_COMPILER_CACHE_PATH" not in env  # nothing for a child
    assert (tmp_path / "t1" / "compile_cache" / "rank_1").is_dir()  # a failed trial keeps what it compiled

    second = cc.CompileCache(tmp_path / "root", "k", rank=1, work_dir=tmp_path / "t2" / "compile_cache")
    second.open()
    assert not second.loaded
    _compile(second, "good")
    second.close(ok=True)
    assert [p.name for p in (tmp_path / "root" / "k").iterdir()] == ["rank_1"]  # no staging left behind
    assert not (tmp_path / "t2" / "compile_cache").exists()  # a trial that ended well keeps no copy

    third = cc.CompileCache(tmp_path / "root", "k", rank=1, work_dir=tmp_path / "t3" / "compile_cache")
    third.open()
    assert third.loaded
    assert (
        tmp_path / "t3" / "compile_cache" / "rank_1" / "graph_cache" / "compile_cache_0.mindir"
    ).read_text() == "good"
    (tmp_path / "t3" / "compile_cache" / "rank_1" / "graph_cache" / "compile_cache_9.mindir").write_text("new")
    third.close(ok=True)  # a hit publishes nothing: the entry stays as it was
    assert sorted(p.name for p in (tmp_path / "root" / "k" / "rank_1" / "graph_cache").iterdir()) == [
        "compile_cache_0.mindir"
    ]
    assert not (tmp_path / "t3" / "compile_cache").exists()


def test_the_first_of_two_concurrent_misses_wins(tmp_path, env):
    a = cc.CompileCache(tmp_path / "root", "k", rank=0, work_dir=tmp_path / "a")
    b = cc.CompileCache(tmp_path / "root", "k", rank=0, work_dir=tmp_path / "b")
    a.open(), b.open()
    _compile(a, "from a"), _compile(b, "from b")
    a.close(ok=True), b.close(ok=True)
    assert [p.name for p in (tmp_path / "root" / "k").iterdir()] == ["rank_0"]
    assert (tmp_path / "root" / "k" / "rank_0" / "graph_cache" / "compile_cache_0.mindir").read_text() == "from a"


def test_an_entry_whose_graphs_failed_is_dropped(tmp_path, env):
    seed = cc.CompileCache(tmp_path / "root", "k", rank=0, work_dir=tmp_path / "a")
    seed.open(), _compile(seed), seed.close(ok=True)
    hit = cc.CompileCache(tmp_path / "root", "k", rank=0, work_dir=tmp_path / "b")
    hit.open()
    assert hit.loaded
    hit.close(ok=False, compile_failed=True)
    assert not (tmp_path / "root" / "k" / "rank_0").exists()


def test_only_the_most_recently_used_entries_are_kept(tmp_path, env, monkeypatch):
    monkeypatch.setattr(cc, "MAX_ENTRIES", 2)
    root = tmp_path / "root"
    for age, key in ((300, "old"), (200, "middle"), (100, "new")):  # entries published that many seconds ago
        (root / key / "rank_0").mkdir(parents=True)
        os.utime(root / key, (time.time() - age,) * 2)
    cc.CompileCache(root, "old", rank=0, work_dir=tmp_path / "again").open()  # a hit makes "old" the most recently used
    c = cc.CompileCache(root, "newest", rank=0, work_dir=tmp_path / "newest")
    c.open(), _compile(c), c.close(ok=True)
    assert sorted(p.name for p in root.iterdir()) == ["newest", "old"]


def test_the_default_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MSAR_COMPILE_CACHE_DIR", str(tmp_path / "graphs"))
    assert user_cache.compile_cache_root() == tmp_path / "graphs"
    monkeypatch.delenv("MSAR_COMPILE_CACHE_DIR")
    monkeypatch.setenv("MSAR_CACHE_DIR", str(tmp_path / "mine"))
    assert user_cache.compile_cache_root() == tmp_path / "mine" / "compile"
    monkeypatch.delenv("MSAR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache.compile_cache_root() == tmp_path / "xdg" / "mindspore-autoresearch" / "compile"


def test_a_cache_that_cannot_be_written_is_skipped_not_fatal(tmp_path, env):
    (tmp_path / "file").write_text("not a directory")
    c = cc.CompileCache(tmp_path / "file" / "root", "k", rank=0, work_dir=tmp_path / "t")
    assert c.open()  # a miss compiles into the trial's own directory
    _compile(c)
    c.close(ok=True)  # publishing under a file fails: warned, not raised
    assert not (tmp_path / "file").is_dir()
    unusable = cc.CompileCache(tmp_path / "root", "k", rank=0, work_dir=tmp_path / "file" / "work")
    assert not unusable.open() and "MS_COMPILER_CACHE_ENABLE" not in env
