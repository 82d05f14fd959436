"""Token files, the embedded default corpus, and stateless seeded batches.

A token file is a raw little-endian array of ``uint16`` or ``uint32`` token ids (``train.bin``) with a small JSON
sidecar beside it (``train.bin.json``: dtype, vocab_size, tokenizer, n_tokens, max_token), so that nothing about
the file has to be guessed from its size. Files are read through ``numpy.memmap``: opening one costs nothing and
only the windows a batch touches are paged in.

Batches are a pure function of ``(seed, step)``: there is no sampler state to checkpoint (the data position of a
run is its step), and a data-parallel rank ``r`` of ``R`` takes rows ``[r*B/R, (r+1)*B/R)`` of the same global
batch, so that the ranks together see exactly the batch one process would have seen.

Command line::

    python -m core.data prepare a.txt b.txt out_dir [--val-fraction 0.1] [--tokenizer byte] [--dtype uint16]
    python -m core.data info out_dir/train.bin
    python -m core.data corpus            # build (once) and print the embedded corpus's paths

This module must not import MindSpore: the agent and the tests use it without paying for that import.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from core.user_cache import cache_root

SIDECAR_SUFFIX = ".json"
TOKEN_DTYPES = ("uint16", "uint32")
_SCAN_CHUNK = 1 << 24          # tokens per chunk when scanning a file (bounded memory for max_token)
_CORPUS_FORMAT = 1             # bump when the corpus layout changes, so old caches are not reused


def sidecar_path(path: str | Path) -> Path:
    return Path(str(path) + SIDECAR_SUFFIX)


# ---------------------------------------------------------------------------------------------- tokenizers


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocab 256): no vocabulary file, lossless, works on any text."""

    name = "byte"
    vocab_size = 256

    def encode(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.uint8)

    def decode(self, tokens: Iterable[int]) -> str:
        return bytes(np.asarray(tokens, dtype=np.uint8)).decode("utf-8", errors="replace")


TOKENIZERS = {"byte": ByteTokenizer}


def get_tokenizer(name: str) -> ByteTokenizer:
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; available: {', '.join(sorted(TOKENIZERS))}")
    return TOKENIZERS[name]()


# ---------------------------------------------------------------------------------------------- writing


def _check_dtype(dtype: str, vocab_size: int) -> np.dtype:
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"token dtype must be one of {TOKEN_DTYPES} (got {dtype!r})")
    limit = np.iinfo(dtype).max + 1
    if not 0 < vocab_size <= limit:
        raise ValueError(f"vocab_size {vocab_size} does not fit {dtype} (max {limit}); use uint32")
    return np.dtype(dtype).newbyteorder("<")


def _write_sidecar(path: Path, info: dict) -> None:
    """Atomically (temp + rename), so a reader never sees half a sidecar."""
    side = sidecar_path(path)
    tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(info, indent=1) + "\n")
    os.replace(tmp, side)


def write_tokens(path: str | Path, tokens: np.ndarray, *, vocab_size: int, dtype: str = "uint16",
                 tokenizer: str = "byte") -> Path:
    """Write a token array and its sidecar (for tests, or tokens made by another tool)."""
    path = Path(path)
    np_dtype = _check_dtype(dtype, vocab_size)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array (got shape {tokens.shape})")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}) (got {tokens.min()}..{tokens.max()})")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tokens.astype(np_dtype).tofile(tmp)
    os.replace(tmp, path)
    _write_sidecar(path, {"dtype": dtype, "vocab_size": int(vocab_size), "tokenizer": tokenizer,
                          "n_tokens": int(tokens.size), "max_token": int(tokens.max())})
    return path


def prepare(inputs: list[str | Path], out_dir: str | Path, *, val_fraction: float = 0.1,
            tokenizer: str = "byte", dtype: str = "uint16") -> tuple[Path, Path]:
    """Tokenise text files (concatenated in the given order) into ``out_dir/{train,val}.bin``.

    The validation split is the last ``val_fraction`` of the token stream, so train and val never share a token
    position. Input files are read one at a time and tokens streamed to disk, so the corpus may exceed memory.
    """
    tok = get_tokenizer(tokenizer)
    np_dtype = _check_dtype(dtype, tok.vocab_size)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1) (got {val_fraction})")
    paths = [Path(p) for p in inputs]
    if not paths:
        raise ValueError("no input text files given")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"input text file(s) not found: {', '.join(missing)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    # Pass 1: stream every file's tokens into one file; pass 2 moves the tail into val.bin and truncates.
    train_path, val_path = out_dir / "train.bin", out_dir / "val.bin"
    tmp_train = out_dir / f".train.bin.{os.getpid()}.tmp"
    tmp_val = out_dir / f".val.bin.{os.getpid()}.tmp"
    try:
        n_tokens = 0
        with open(tmp_train, "wb") as f:
            for p in paths:
                ids = tok.encode(p.read_bytes()).astype(np_dtype)
                ids.tofile(f)
                n_tokens += ids.size
        n_val = int(round(n_tokens * val_fraction))
        n_train = n_tokens - n_val
        if n_val < 1 or n_train < 1:
            raise ValueError(f"{n_tokens} tokens are too few to split with val_fraction={val_fraction}: "
                             "give more text or change --val-fraction")
        all_ids = np.memmap(tmp_train, dtype=np_dtype, mode="r")
        all_ids[n_train:].tofile(tmp_val)
        max_train, max_val = _chunked_max(all_ids[:n_train]), _chunked_max(all_ids[n_train:])
        del all_ids                                  # close the map before truncating the file under it
        os.truncate(tmp_train, n_train * np_dtype.itemsize)
        os.replace(tmp_train, train_path)
        os.replace(tmp_val, val_path)
    finally:
        for tmp in (tmp_train, tmp_val):
            tmp.unlink(missing_ok=True)
    for path, n, mx in ((train_path, n_train, max_train), (val_path, n_val, max_val)):
        _write_sidecar(path, {"dtype": dtype, "vocab_size": tok.vocab_size, "tokenizer": tok.name,
                              "n_tokens": n, "max_token": mx})
    return train_path, val_path


def _chunked_max(ids: np.ndarray) -> int:
    return max(int(ids[i:i + _SCAN_CHUNK].max()) for i in range(0, ids.size, _SCAN_CHUNK))


# ---------------------------------------------------------------------------------------------- reading


class TokenDataset:
    """A memory-mapped token file with stateless, seeded batch sampling.

    ``dtype`` is only needed for a raw file without a sidecar; with a sidecar it must agree with it.
    """

    def __init__(self, path: str | Path, dtype: Optional[str] = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"token file not found: {self.path} "
                                    "(make one with `python -m core.data prepare <text files> <out_dir>`)")
        side = sidecar_path(self.path)
        if side.is_file():
            self.info = json.loads(side.read_text())
            if dtype is not None and dtype != self.info["dtype"]:
                raise ValueError(f"{self.path}: dtype {dtype!r} was requested but the sidecar {side.name} says "
                                 f"{self.info['dtype']!r}; drop the override or fix the file")
        elif dtype is not None:
            self.info = {"dtype": dtype, "vocab_size": None, "tokenizer": None}
        else:
            raise ValueError(f"{self.path}: no sidecar {side.name} saying the token dtype; write the file with "
                             "`python -m core.data prepare`, or pass the dtype (data.token_dtype)")
        np_dtype = _check_dtype(self.info["dtype"], self.info.get("vocab_size") or 1)
        size = self.path.stat().st_size
        if size == 0 or size % np_dtype.itemsize:
            raise ValueError(f"{self.path}: {size} bytes is not a whole, non-empty array of {self.info['dtype']}")
        n = size // np_dtype.itemsize
        if self.info.get("n_tokens", n) != n:
            raise ValueError(f"{self.path}: the sidecar says {self.info['n_tokens']} tokens but the file holds {n} "
                             "(truncated or replaced?); prepare it again")
        self.tokens = np.memmap(self.path, dtype=np_dtype, mode="r")

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def vocab_size(self) -> Optional[int]:
        """From the sidecar; None for a raw file opened with an explicit dtype."""
        return self.info.get("vocab_size")

    @property
    def tokenizer(self) -> Optional[str]:
        return self.info.get("tokenizer")

    def max_token(self) -> int:
        """Largest token id (the trainer checks it against model.vocab_size); scanned once, then cached."""
        if self.info.get("max_token") is None:
            self.info["max_token"] = _chunked_max(self.tokens)
            if sidecar_path(self.path).is_file():
                try:
                    _write_sidecar(self.path, self.info)
                except OSError:
                    pass                                 # a read-only dataset: the scan is repeated next time
        return int(self.info["max_token"])

    def _check_window(self, seq_len: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1 (got {seq_len})")
        if seq_len + 1 > self.n_tokens:
            raise ValueError(f"{self.path}: a window of seq_len+1 = {seq_len + 1} tokens does not fit in "
                             f"{self.n_tokens} tokens; lower training.seq_len or use a larger file")

    def _gather(self, starts: np.ndarray, seq_len: int) -> np.ndarray:
        idx = starts[:, None] + np.arange(seq_len + 1)[None, :]     # (B, S+1)
        return self.tokens[idx].astype(np.int32)

    def window_starts(self, step: int, batch_size: int, seq_len: int, seed: int) -> np.ndarray:
        """Start offsets of the global batch of ``step``: a pure function of (seed, step)."""
        self._check_window(seq_len)
        if step < 0 or seed < 0 or batch_size < 1:
            raise ValueError(f"need step >= 0, seed >= 0, batch_size >= 1 (got {step}, {seed}, {batch_size})")
        rng = np.random.default_rng([seed, step])
        return rng.integers(0, self.n_tokens - seq_len, size=batch_size, dtype=np.int64)

    def batch(self, step: int, batch_size: int, seq_len: int, seed: int, *, rank: int = 0,
              world_size: int = 1) -> np.ndarray:
        """(batch_size / world_size, seq_len + 1) int32 windows; inputs = [:, :-1], targets = [:, 1:].

        ``batch_size`` is the global batch; ``rank`` of ``world_size`` data-parallel ranks gets its contiguous
        share of rows, so the ranks' batches concatenated in rank order equal the single-process batch.
        """
        if world_size < 1 or not 0 <= rank < world_size or batch_size % world_size:
            raise ValueError(f"rank {rank} of world_size {world_size} cannot split a batch of {batch_size} rows "
                             "evenly; the global batch must be a multiple of the data-parallel degree")
        starts = self.window_starts(step, batch_size, seq_len, seed)
        per = batch_size // world_size
        return self._gather(starts[rank * per:(rank + 1) * per], seq_len)

    def eval_batches(self, n_batches: int, batch_size: int, seq_len: int, *, rank: int = 0,
                     world_size: int = 1) -> np.ndarray:
        """(n_batches, batch_size / world_size, seq_len + 1) int32: fixed windows evenly spaced over the file.

        The same windows at every evaluation and in every run, so validation losses compare directly.
        """
        self._check_window(seq_len)
        if n_batches < 1 or world_size < 1 or not 0 <= rank < world_size or batch_size % world_size:
            raise ValueError(f"need n_batches >= 1 and batch_size ({batch_size}) divisible by world_size "
                             f"({world_size}), 0 <= rank < world_size")
        total = n_batches * batch_size
        starts = np.linspace(0, self.n_tokens - seq_len - 1, total).round().astype(np.int64)
        starts = starts.reshape(n_batches, batch_size)
        per = batch_size // world_size
        mine = starts[:, rank * per:(rank + 1) * per].reshape(-1)
        return self._gather(mine, seq_len).reshape(n_batches, per, seq_len + 1)

    def decode(self, tokens: Iterable[int]) -> str:
        if self.tokenizer is None:
            raise ValueError(f"{self.path}: no tokenizer recorded in a sidecar, cannot decode")
        return get_tokenizer(self.tokenizer).decode(tokens)

    def __repr__(self) -> str:
        return (f"TokenDataset({str(self.path)!r}, n_tokens={self.n_tokens}, dtype={self.info['dtype']}, "
                f"vocab_size={self.vocab_size})")


# ---------------------------------------------------------------------------------------------- default corpus


def corpus_text() -> str:
    """The Python documentation's topic texts that ship with CPython: real English prose, no download."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:
        raise RuntimeError("the embedded corpus needs the standard-library module pydoc_data, which this Python "
                           "lacks; set data.train_path (and data.val_path) to token files made with "
                           "`python -m core.data prepare`") from exc
    # Sorted keys: the dict's order is an implementation detail, the corpus must not depend on it.
    return "\n\n".join(topics[k].strip() for k in sorted(topics)) + "\n"


def default_corpus(cache_dir: str | Path | None = None, val_fraction: float = 0.1) -> tuple[Path, Path]:
    """(train_path, val_path) of the embedded corpus, tokenised once into ``<cache>/corpus/<hash>/``.

    The directory name hashes the text and the split, so a different Python version (different docs) gets its
    own files. It is built in a temporary directory and renamed into place: concurrent builders (several ranks or
    trials starting together) each build a complete copy, one rename wins, the others discard theirs.
    """
    text = corpus_text().encode("utf-8")
    key = hashlib.sha256(text + f"|format={_CORPUS_FORMAT}|val={val_fraction}".encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "corpus"
    final = root / key
    if not (final / "val.bin.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".tmp", dir=root))
        try:
            (tmp / "corpus.txt").write_bytes(text)
            prepare([tmp / "corpus.txt"], tmp, val_fraction=val_fraction)
            (tmp / "corpus.txt").unlink()
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "val.bin.json").is_file():   # not a lost race: a real failure
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final / "train.bin", final / "val.bin"


# ---------------------------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m core.data", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenise text files into train.bin / val.bin")
    p.add_argument("inputs", nargs="+", help="text files, concatenated in this order")
    p.add_argument("out_dir", help="directory for train.bin, val.bin and their .json sidecars")
    p.add_argument("--val-fraction", type=float, default=0.1, help="held-out tail of the token stream")
    p.add_argument("--tokenizer", default="byte", choices=sorted(TOKENIZERS))
    p.add_argument("--dtype", default="uint16", choices=TOKEN_DTYPES)
    i = sub.add_parser("info", help="print a token file's sidecar and checks")
    i.add_argument("path")
    c = sub.add_parser("corpus", help="build (once) the embedded default corpus and print its paths")
    c.add_argument("--cache-dir", default=None)
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        if args.command == "prepare":
            train, val = prepare(args.inputs, args.out_dir, val_fraction=args.val_fraction,
                                 tokenizer=args.tokenizer, dtype=args.dtype)
            for path in (train, val):
                print(f"{path}: {TokenDataset(path).n_tokens} tokens")
        elif args.command == "info":
            ds = TokenDataset(args.path)
            print(json.dumps({**ds.info, "max_token": ds.max_token(), "n_tokens": ds.n_tokens}, indent=1))
        else:
            for path in default_corpus(args.cache_dir):
                print(path)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "ByteTokenizer", "TOKENIZERS", "TOKEN_DTYPES", "TokenDataset", "cache_root", "corpus_text", "default_corpus",
    "get_tokenizer", "main", "prepare", "sidecar_path", "write_tokens",
]
