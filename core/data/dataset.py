"""A token file as stateless, seeded batches: the batch of step k is a pure function of (seed, k).

There is no sampler state to checkpoint (the data position of a run is its step), and a data-parallel rank ``r``
of ``R`` takes rows ``[r*B/R, (r+1)*B/R)`` of the same global batch, so that the ranks together see exactly the
batch one process would have seen. Files are read through ``numpy.memmap``: opening one costs nothing and only
the windows a batch touches are paged in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from core.config import ConfigError, TrainConfig
from core.data import indexed
from core.data.corpus import default_corpus
from core.data.tokens import check_dtype, chunked_max, get_tokenizer, sidecar_path, write_sidecar


class TokenDataset:
    """A memory-mapped token file with stateless, seeded batch sampling.

    ``dtype`` is only needed for a raw file without a sidecar; with a sidecar it must agree with it.
    """

    def __init__(self, path: str | Path, dtype: str | None = None):
        self.path = Path(path)
        self.index = None
        if indexed.is_indexed(self.path):  # Megatron's .bin + .idx (named by prefix or by either file)
            self._open_indexed(dtype)
            return
        if not self.path.is_file():
            raise FileNotFoundError(
                f"token file not found: {self.path} "
                "(make one with `python -m core.data prepare <text files> <out_dir>`)"
            )
        side = sidecar_path(self.path)
        if side.is_file():
            self.info = json.loads(side.read_text())
            if dtype is not None and dtype != self.info["dtype"]:
                raise ValueError(
                    f"{self.path}: dtype {dtype!r} was requested but the sidecar {side.name} says "
                    f"{self.info['dtype']!r}; drop the override or fix the file"
                )
        elif dtype is not None:
            self.info = {"dtype": dtype, "vocab_size": None, "tokenizer": None}
        else:
            raise ValueError(
                f"{self.path}: no sidecar {side.name} saying the token dtype; write the file with "
                "`python -m core.data prepare`, or pass the dtype (data.token_dtype)"
            )
        np_dtype = check_dtype(self.info["dtype"], self.info.get("vocab_size") or 1)
        size = self.path.stat().st_size
        if size == 0 or size % np_dtype.itemsize:
            raise ValueError(f"{self.path}: {size} bytes is not a whole, non-empty array of {self.info['dtype']}")
        n = size // np_dtype.itemsize
        if self.info.get("n_tokens", n) != n:
            raise ValueError(
                f"{self.path}: the sidecar says {self.info['n_tokens']} tokens but the file holds {n} "
                "(truncated or replaced?); prepare it again"
            )
        self.tokens = np.memmap(self.path, dtype=np_dtype, mode="r")

    def _open_indexed(self, dtype: str | None) -> None:
        self.index = indexed.read_index(self.path)
        self.path = indexed.paths(self.path)[0]
        side = sidecar_path(self.path)  # ``prepare`` leaves one with the vocabulary; Megatron's tools do not
        info = json.loads(side.read_text()) if side.is_file() else {"vocab_size": None, "tokenizer": None}
        self.info = {**info, "dtype": self.index.dtype.name, "documents": self.index.n_documents}
        if dtype is not None and dtype != self.index.dtype.name:
            raise ValueError(
                f"{self.path}: dtype {dtype!r} was requested but its index says {self.index.dtype.name!r}; drop "
                "data.token_dtype"
            )
        self.tokens = np.memmap(self.path, dtype=self.index.dtype, mode="r")

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def vocab_size(self) -> int | None:
        """From the sidecar; None for a raw file opened with an explicit dtype."""
        return self.info.get("vocab_size")

    @property
    def tokenizer(self) -> str | None:
        return self.info.get("tokenizer")

    def max_token(self) -> int:
        """Largest token id (the trainer checks it against model.vocab_size); scanned once, then cached."""
        if self.info.get("max_token") is None:
            self.info["max_token"] = chunked_max(self.tokens)
            if sidecar_path(self.path).is_file() and self.index is None:
                try:
                    write_sidecar(self.path, self.info)
                except OSError:
                    pass  # a read-only dataset: the scan is repeated next time
        return int(self.info["max_token"])

    def _check_window(self, seq_len: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1 (got {seq_len})")
        if seq_len + 1 > self.n_tokens:
            raise ValueError(
                f"{self.path}: a window of seq_len+1 = {seq_len + 1} tokens does not fit in "
                f"{self.n_tokens} tokens; lower training.seq_len or use a larger file"
            )

    def windows(self, starts: np.ndarray, seq_len: int) -> np.ndarray:
        """(len(starts), seq_len + 1) int32: the windows of seq_len + 1 tokens beginning at ``starts``."""
        self._check_window(seq_len)
        idx = starts[:, None] + np.arange(seq_len + 1)[None, :]  # (B, S+1)
        return self.tokens[idx].astype(np.int32)

    def window_starts(self, step: int, batch_size: int, seq_len: int, seed: int) -> np.ndarray:
        """Start offsets of the global batch of ``step``: a pure function of (seed, step)."""
        self._check_window(seq_len)
        if step < 0 or seed < 0 or batch_size < 1:
            raise ValueError(f"need step >= 0, seed >= 0, batch_size >= 1 (got {step}, {seed}, {batch_size})")
        rng = np.random.default_rng([seed, step])
        return rng.integers(0, self.n_tokens - seq_len, size=batch_size, dtype=np.int64)

    def batch(
        self, step: int, batch_size: int, seq_len: int, seed: int, *, rank: int = 0, world_size: int = 1
    ) -> np.ndarray:
        """(batch_size / world_size, seq_len + 1) int32 windows; inputs = [:, :-1], targets = [:, 1:].

        ``batch_size`` is the global batch; ``rank`` of ``world_size`` data-parallel ranks gets its contiguous
        share of rows, so the ranks' batches concatenated in rank order equal the single-process batch.
        """
        if world_size < 1 or not 0 <= rank < world_size or batch_size % world_size:
            raise ValueError(
                f"rank {rank} of world_size {world_size} cannot split a batch of {batch_size} rows "
                "evenly; the global batch must be a multiple of the data-parallel degree"
            )
        starts = self.window_starts(step, batch_size, seq_len, seed)
        per = batch_size // world_size
        return self.windows(starts[rank * per : (rank + 1) * per], seq_len)

    def eval_batches(
        self, n_batches: int, batch_size: int, seq_len: int, *, rank: int = 0, world_size: int = 1
    ) -> np.ndarray:
        """(n_batches, batch_size / world_size, seq_len + 1) int32: fixed windows evenly spaced over the file.

        The same windows at every evaluation and in every run, so validation losses compare directly.
        """
        self._check_window(seq_len)
        if n_batches < 1 or world_size < 1 or not 0 <= rank < world_size or batch_size % world_size:
            raise ValueError(
                f"need n_batches >= 1 and batch_size ({batch_size}) divisible by world_size "
                f"({world_size}), 0 <= rank < world_size"
            )
        total = n_batches * batch_size
        starts = np.linspace(0, self.n_tokens - seq_len - 1, total).round().astype(np.int64)
        starts = starts.reshape(n_batches, batch_size)
        per = batch_size // world_size
        mine = starts[:, rank * per : (rank + 1) * per].reshape(-1)
        return self.windows(mine, seq_len).reshape(n_batches, per, seq_len + 1)

    def decode(self, tokens: Iterable[int]) -> str:
        if self.tokenizer is None:
            raise ValueError(f"{self.path}: no tokenizer recorded in a sidecar, cannot decode")
        return get_tokenizer(self.tokenizer).decode(tokens)

    def __repr__(self) -> str:
        return (
            f"TokenDataset({str(self.path)!r}, n_tokens={self.n_tokens}, dtype={self.info['dtype']}, "
            f"vocab_size={self.vocab_size})"
        )


class BlendedDataset:
    """Datasets sampled in proportion to weights (Megatron's ``--data-path 0.7 a 0.3 b``; ``data.blend``), with the
    stateless, seeded batches of ``TokenDataset``.

    Which dataset row ``i`` of the run's global batches comes from is a low-discrepancy sequence (Weyl's: the
    fractional parts of ``offset + (i + 1) phi``, phi the golden ratio, looked up in the cumulative weights), so
    every prefix of the run has the weights' proportions within a few rows, like Megatron's greedy blend, while
    staying a pure function of (seed, step); each dataset's windows in the batch are drawn from its own generator
    of (seed, step, dataset).
    """

    PHI = (5**0.5 - 1) / 2

    def __init__(self, datasets: list[TokenDataset], weights: list[float]):
        self.datasets, total = datasets, float(sum(weights))
        self.weights = [w / total for w in weights]
        self.path = " + ".join(f"{w:.3g} x {d.path}" for w, d in zip(self.weights, datasets, strict=True))

    @property
    def n_tokens(self) -> int:
        return sum(d.n_tokens for d in self.datasets)

    def max_token(self) -> int:
        return max(d.max_token() for d in self.datasets)

    def sources(self, step: int, batch_size: int, seed: int) -> np.ndarray:
        """(batch_size,) index of the dataset each row of step ``step``'s global batch comes from."""
        rows = np.arange(step * batch_size, (step + 1) * batch_size, dtype=np.float64)
        offset = np.random.default_rng([seed, 1 << 20]).random()
        u = np.mod(offset + (rows + 1) * self.PHI, 1.0)
        return np.minimum(np.searchsorted(np.cumsum(self.weights), u, side="right"), len(self.datasets) - 1)

    def batch(
        self, step: int, batch_size: int, seq_len: int, seed: int, *, rank: int = 0, world_size: int = 1
    ) -> np.ndarray:
        """As ``TokenDataset.batch``: (batch_size / world_size, seq_len + 1) int32, rank ``rank``'s rows."""
        if world_size < 1 or not 0 <= rank < world_size or batch_size % world_size:
            raise ValueError(f"rank {rank} of world_size {world_size} cannot split a batch of {batch_size} rows")
        source = self.sources(step, batch_size, seed)
        rows = np.empty((batch_size, seq_len + 1), np.int32)
        for d, ds in enumerate(self.datasets):
            mine = np.flatnonzero(source == d)
            if mine.size:
                rng = np.random.default_rng([seed, step, d])
                starts = rng.integers(0, max(ds.n_tokens - seq_len, 1), size=mine.size, dtype=np.int64)
                rows[mine] = ds.windows(starts, seq_len)
        per = batch_size // world_size
        return rows[rank * per : (rank + 1) * per]

    def eval_batches(self, n_batches: int, batch_size: int, seq_len: int, **kw) -> np.ndarray:
        """The first dataset's evaluation windows: a blend has no validation split of its own (``data.val_path``
        gives one)."""
        return self.datasets[0].eval_batches(n_batches, batch_size, seq_len, **kw)


def datasets_for(cfg: TrainConfig) -> tuple[TokenDataset | BlendedDataset, TokenDataset | BlendedDataset]:
    """(train, validation) datasets of a trial: ``data.blend``, ``data.train_path`` / ``data.val_path``, or the
    embedded corpus; refuses a file with token ids past ``model.vocab_size`` (ConfigError naming the key)."""
    d = cfg.data
    val_path = Path(d.val_path) if d.val_path else None
    if d.blend:
        weights, paths = d.blend_pairs()
        train = BlendedDataset([_open(p, d.token_dtype, "data.blend") for p in paths], weights)
        val = _open(val_path, d.token_dtype, "data.val_path") if val_path else train
    else:
        if d.train_path is None:
            train_path, val_path = default_corpus()
        else:
            train_path = Path(d.train_path)
        train = _open(train_path, d.token_dtype, "data.train_path")
        val = _open(val_path, d.token_dtype, "data.val_path") if val_path else train
    vocab = cfg.model.vocab_size
    for ds in {id(train): train, id(val): val}.values():
        if ds.max_token() >= vocab:
            raise ConfigError(
                "model.vocab_size",
                f"{vocab} is too small for {ds.path} (max token id "
                f"{ds.max_token()}); raise it or use a matching tokenizer",
            )
    return train, val


def _open(path: str | Path, dtype: str | None, field: str) -> TokenDataset:
    """The dataset at ``path``; a file that cannot be read is a ConfigError naming ``field``."""
    try:
        return TokenDataset(path, dtype=dtype)
    except (OSError, ValueError) as e:
        raise ConfigError(field, str(e)) from None
