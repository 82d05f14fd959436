"""Token files: a raw little-endian array of ``uint16`` or ``uint32`` token ids (``train.bin``) with a small JSON
sidecar beside it (``train.bin.json``: dtype, vocab_size, tokenizer, n_tokens, max_token), so that nothing about
the file has to be guessed from its size; tokenizers, and ``prepare``, which turns text files into them
(``prepare_indexed``: documents through a Hugging Face tokenizer into Megatron's indexed format).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from core.runtime.files import atomic_path, write_atomic

SIDECAR_SUFFIX = ".json"
TOKEN_DTYPES = ("uint16", "uint32")
_SCAN_CHUNK = 1 << 24  # tokens per chunk when scanning a file (bounded memory for max_token)


def sidecar_path(path: str | Path) -> Path:
    return Path(str(path) + SIDECAR_SUFFIX)


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


def check_dtype(dtype: str, vocab_size: int) -> np.dtype:
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"token dtype must be one of {TOKEN_DTYPES} (got {dtype!r})")
    limit = np.iinfo(dtype).max + 1
    if not 0 < vocab_size <= limit:
        raise ValueError(f"vocab_size {vocab_size} does not fit {dtype} (max {limit}); use uint32")
    return np.dtype(dtype).newbyteorder("<")


def write_sidecar(path: Path, info: dict) -> None:
    """Atomically, so a reader never sees half a sidecar."""
    write_atomic(sidecar_path(path), json.dumps(info, indent=1) + "\n")


def write_tokens(
    path: str | Path, tokens: np.ndarray, *, vocab_size: int, dtype: str = "uint16", tokenizer: str = "byte"
) -> Path:
    """Write a token array and its sidecar (for tests, or tokens made by another tool)."""
    path = Path(path)
    np_dtype = check_dtype(dtype, vocab_size)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array (got shape {tokens.shape})")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}) (got {tokens.min()}..{tokens.max()})")
    with atomic_path(path) as tmp:
        tokens.astype(np_dtype).tofile(tmp)
    write_sidecar(
        path,
        {
            "dtype": dtype,
            "vocab_size": int(vocab_size),
            "tokenizer": tokenizer,
            "n_tokens": int(tokens.size),
            "max_token": int(tokens.max()),
        },
    )
    return path


def prepare(
    inputs: list[str | Path],
    out_dir: str | Path,
    *,
    val_fraction: float = 0.1,
    tokenizer: str = "byte",
    dtype: str = "uint16",
) -> tuple[Path, Path]:
    """Tokenise text files (concatenated in the given order) into ``out_dir/{train,val}.bin``.

    The validation split is the last ``val_fraction`` of the token stream, so train and val never share a token
    position. Input files are read one at a time and tokens streamed to disk, so the corpus may exceed memory.
    """
    tok = get_tokenizer(tokenizer)
    np_dtype = check_dtype(dtype, tok.vocab_size)
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
            raise ValueError(
                f"{n_tokens} tokens are too few to split with val_fraction={val_fraction}: "
                "give more text or change --val-fraction"
            )
        all_ids = np.memmap(tmp_train, dtype=np_dtype, mode="r")
        all_ids[n_train:].tofile(tmp_val)
        max_train, max_val = chunked_max(all_ids[:n_train]), chunked_max(all_ids[n_train:])
        del all_ids  # close the map before truncating the file under it
        os.truncate(tmp_train, n_train * np_dtype.itemsize)
        os.replace(tmp_train, train_path)
        os.replace(tmp_val, val_path)
    finally:
        for tmp in (tmp_train, tmp_val):
            tmp.unlink(missing_ok=True)
    for path, n, mx in ((train_path, n_train, max_train), (val_path, n_val, max_val)):
        write_sidecar(
            path, {"dtype": dtype, "vocab_size": tok.vocab_size, "tokenizer": tok.name, "n_tokens": n, "max_token": mx}
        )
    return train_path, val_path


def chunked_max(ids: np.ndarray) -> int:
    return max(int(ids[i : i + _SCAN_CHUNK].max()) for i in range(0, ids.size, _SCAN_CHUNK))


def hf_tokenizer(path: str | Path):
    """(tokenizer, end-of-document id or None) of a Hugging Face tokenizer directory: its ``tokenizer.json`` read
    by the ``tokenizers`` library (no download, no ``transformers``), the EOD its ``tokenizer_config.json``'s
    ``eos_token``."""
    from tokenizers import Tokenizer  # function-level: only this command reads HF tokenizers

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}; give a Hugging Face tokenizer directory or the file")
    tok = Tokenizer.from_file(str(file))
    config = file.with_name("tokenizer_config.json")
    eos = json.loads(config.read_text()).get("eos_token") if config.is_file() else None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    return tok, (None if eos is None else tok.token_to_id(eos))


def documents(paths: list[Path]) -> Iterable[str]:
    """The documents of text files: each line's ``text`` of a ``.jsonl`` file (Megatron's preprocess_data input),
    each other file whole."""
    for p in paths:
        if p.suffix == ".jsonl":
            with open(p, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        record = json.loads(line)
                        if "text" not in record:
                            raise ValueError(f"{p}:{n}: a JSON line without a 'text' key")
                        yield record["text"]
        else:
            yield p.read_text(encoding="utf-8")


def prepare_indexed(
    inputs: list[str | Path], out_dir: str | Path, *, tokenizer: str | Path, val_fraction: float = 0.1
) -> tuple[Path, Path]:
    """Tokenise documents with a Hugging Face tokenizer into Megatron indexed datasets ``out_dir/{train,val}``
    (``.bin`` + ``.idx``, ``core.data.indexed``; a sidecar with the vocabulary beside each ``.bin``): the end of
    document appended to each (Megatron's ``--append-eod``), the last ``val_fraction`` of the documents held out.
    Ids in uint16 when the vocabulary fits, else int32 (Megatron's choice)."""
    from core.data import indexed  # function-level: indexed imports this module

    tok, eod = hf_tokenizer(tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = "uint16" if vocab <= 65536 else "int32"
    paths = [Path(p) for p in inputs]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or not paths:
        raise FileNotFoundError(f"input file(s) not found: {', '.join(missing) or '(none given)'}")
    n_docs = sum(1 for _ in documents(paths))
    n_val = max(1, round(n_docs * val_fraction))
    if not 0.0 < val_fraction < 1.0 or n_docs - n_val < 1:
        raise ValueError(f"{n_docs} documents cannot be split with val_fraction={val_fraction}")

    def encoded(start: int, stop: int | None):
        for text in itertools.islice(documents(paths), start, stop):
            ids = tok.encode(text, add_special_tokens=False).ids
            yield np.asarray(ids + ([eod] if eod is not None else []), np.int64)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for name, (start, stop) in (("train", (0, n_docs - n_val)), ("val", (n_docs - n_val, None))):
        path = indexed.write_indexed(out_dir / name, encoded(start, stop), dtype)
        ids = np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")
        info = {"vocab_size": vocab, "tokenizer": str(tokenizer), "n_tokens": int(ids.size), "eod": eod}
        write_sidecar(path, {**info, "dtype": dtype, "max_token": chunked_max(ids)})
        made.append(path)
    return made[0], made[1]
