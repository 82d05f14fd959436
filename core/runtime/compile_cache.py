"""MindSpore's compile cache, keyed so that a trial loads only graphs compiled from the same code and graph config.

A trial's first step spends most of its time compiling its graphs (forward+backward, gradient sync, update:
benchmarks/RESULTS.md, "Start-up: what a trial compiles and waits for"). MindSpore can save compiled graphs and load
them in a later process (``MS_COMPILER_CACHE_ENABLE``/``MS_COMPILER_CACHE_PATH``). Its own change detection hashes the
entry script and the modules it imports from outside ``sys.path`` (not an installed ``core``), and a graph holds the
config's Python constants (shapes, hyperparameters), so without a key of our own a graph of other code or another
config could load. Here the cache lives in ``<root>/<key>/rank_<r>/``, where the key hashes everything that shapes a
rank's graphs:

- the config without what only the host uses (seed, learning-rate schedule, budgets, paths, checkpoints, logging;
  ``HOST_ONLY``), plus whether validation is compiled (``TrainConfig.eval_compiled``, which reads the step budget);
- the source of the ``core`` package (its C++ kernels too), MindSpore's version and the device.

A rank works in a private copy (``<trial>/compile_cache/``, kept only if the trial failed): a hit copies the entry
in, a miss compiles there and ``close`` moves it into the shared root only when the trial ended well, by one
rename, so concurrent trials never read a half-written entry. An entry whose graphs failed to load is dropped;
the ``MAX_ENTRIES`` most recently used entries are kept.

Graphs must be compiled as cells that own the Parameters they touch (``core.runtime.graphs.jit``'s ``owners``): a
loaded graph reads uninitialised memory for Parameters it only closes over (benchmarks/RESULTS.md, "Compile cache").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import uuid
from functools import cache
from importlib.metadata import version
from pathlib import Path

log = logging.getLogger("core.runtime.compile_cache")

# Config keys no graph depends on: the learning rate and its schedule reach the update graph as Tensors
# (core.optim.optimizer.Optimizer.step), the rest never enter a graph.
HOST_ONLY = (
    "seed",
    "trial",
    "checkpoint",
    "data.train_path",
    "data.val_path",
    "optim.lr",
    "optim.min_lr_ratio",
    "optim.warmup_steps",
    "optim.schedule",
    "optim.decay_ratio",
    "training.log_interval",
    "training.eval_interval",
    "training.eval_batches",
    "execution.compile_cache",
    "execution.compile_cache_dir",
)
MAX_ENTRIES = 200
_ENABLE, _PATH = "MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH"


def graph_key(cfg) -> str:
    """A hex digest of what shapes the graphs of a trial with ``cfg`` (a ``core.config.TrainConfig``)."""
    tree = dataclasses.asdict(cfg)
    for dotted in HOST_ONLY:
        *parents, leaf = dotted.split(".")
        node = tree
        for name in parents:
            node = node[name]
        node.pop(leaf)
    tree["eval_compiled"] = cfg.eval_compiled
    tree["code"], tree["mindspore"] = _code_digest(), version("mindspore")
    return hashlib.sha256(json.dumps(tree, sort_keys=True, default=str).encode()).hexdigest()[:20]


@cache
def _code_digest() -> str:
    root = Path(__file__).resolve().parents[1]  # the core package
    digest = hashlib.sha256()
    # .cc: the fused kernels' source (core/runtime/kernels), whose entry points the graphs call
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cc")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class CompileCache:
    """This rank's view of the cache: ``open`` before the first graph compiles, ``close(ok)`` when the trial ends."""

    def __init__(self, root: Path, key: str, *, rank: int, work_dir: Path):
        self.entry = Path(root) / key
        self.rank_dir = f"rank_{rank}"  # MindSpore's own subdirectory of MS_COMPILER_CACHE_PATH
        self.work_dir = Path(work_dir)
        self.loaded = False

    def open(self) -> bool:
        """Point MindSpore at a private copy: the entry's graphs if there is one (a hit), else an empty directory
        that the graphs compile into. False, with a warning, when the cache cannot be used (the trial then
        compiles as without it: a cache is never a reason for a trial to fail)."""
        source = self.entry / self.rank_dir
        target = self.work_dir / self.rank_dir
        try:
            shutil.rmtree(target, ignore_errors=True)
            if source.is_dir():
                shutil.copytree(source, target)
                os.utime(self.entry)  # most recently used: the last to be evicted
                self.loaded = True
            else:
                self.work_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.warning("compile cache: not used (%s)", e)
            return False
        os.environ[_ENABLE], os.environ[_PATH] = "1", str(self.work_dir)
        log.info(
            "compile cache: %s %s", "loading graphs from" if self.loaded else "graphs will be saved to", self.entry
        )
        return True

    def close(self, ok: bool, compile_failed: bool = False) -> None:
        """After the trial: publish what a successful trial compiled; drop an entry whose graphs did not load. The
        private copy stays only when the trial failed (it shows what was compiled)."""
        os.environ.pop(_ENABLE, None)
        os.environ.pop(_PATH, None)  # else the next process started from here inherits it (AKG writes there)
        try:
            self._close(ok, compile_failed)
        except OSError as e:  # the trial's result stands; only the cache missed an entry
            log.warning("compile cache: could not save or tidy up (%s)", e)

    def _close(self, ok: bool, compile_failed: bool) -> None:
        private = self.work_dir / self.rank_dir
        if self.loaded and compile_failed:
            log.warning("compile cache: dropping %s (its graphs failed to compile or load)", self.entry)
            shutil.rmtree(self.entry / self.rank_dir, ignore_errors=True)
        elif not self.loaded and ok and private.is_dir():
            self.entry.mkdir(parents=True, exist_ok=True)
            staging = self.entry / f".{self.rank_dir}.{uuid.uuid4().hex}"
            shutil.move(private, staging)  # a copy when the cache is on another file system
            try:
                staging.rename(self.entry / self.rank_dir)  # atomic; another trial may have published it first
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
            else:
                log.info("compile cache: saved to %s", self.entry)
            _evict(self.entry.parent, MAX_ENTRIES)
        if ok:
            shutil.rmtree(private, ignore_errors=True)
            try:
                self.work_dir.rmdir()  # unless another rank's copy is still there
            except OSError:
                pass


def _evict(root: Path, keep: int) -> None:
    """Remove all but the ``keep`` most recently used entries of ``root``."""
    entries = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in entries[keep:]:
        shutil.rmtree(stale, ignore_errors=True)
