"""Megatron's indexed datasets (``<prefix>.bin`` + ``<prefix>.idx``, the "MMIDIDX" format that Megatron-LM,
NeMo and MindFormers write with their ``preprocess_data.py``): read, and written by ``core.data prepare``.

``.bin`` holds every document's token ids back to back. ``.idx`` (little-endian) describes them:

    9 bytes   b"MMIDIDX\\x00\\x00"
    uint64    version (1)
    uint8     dtype code of the ids: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    uint64    S, the number of sequences
    uint64    N, the number of document indices
    int32[S]  each sequence's length in tokens
    int64[S]  each sequence's byte offset in .bin
    int64[N]  document boundaries as sequence indices: 0, the end of document 1, ..., S

A trial reads the ``.bin`` as one token stream (the windows of ``TokenDataset`` cross documents, as Megatron's
GPT dataset concatenates them); the index says how long it is, in which dtype, and where documents begin.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.runtime.files import atomic_path

MAGIC, VERSION = b"MMIDIDX\x00\x00", 1
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
CODES = {name: code for code, name in DTYPES.items()}
_HEAD = struct.Struct("<9sQBQQ")


@dataclass(frozen=True)
class Index:
    dtype: np.dtype
    lengths: np.ndarray  # (S,) int32
    pointers: np.ndarray  # (S,) int64, bytes
    documents: np.ndarray  # (N,) int64, sequence indices

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))

    @property
    def n_documents(self) -> int:
        return max(len(self.documents) - 1, 0)

    def document_starts(self) -> np.ndarray:
        """Token offset of each document's first token in the stream."""
        starts = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)])
        return starts[self.documents[:-1]]


def paths(prefix: str | Path) -> tuple[Path, Path]:
    """(``.bin``, ``.idx``) of a dataset named by its prefix (Megatron's ``--data-path`` form) or by either file."""
    p = Path(prefix)
    if p.suffix in (".bin", ".idx"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".bin"), p.with_name(p.name + ".idx")


def is_indexed(path: str | Path) -> bool:
    return all(p.is_file() for p in paths(path))


def read_index(path: str | Path) -> Index:
    """The index of the dataset at ``path`` (prefix, .bin or .idx); a ValueError saying what is wrong."""
    bin_path, idx_path = paths(path)
    data = np.memmap(idx_path, dtype=np.uint8, mode="r")
    if data.size < _HEAD.size or bytes(data[:9]) != MAGIC:
        raise ValueError(f"{idx_path} is not a Megatron indexed dataset (no {MAGIC!r} header)")
    _, version, code, n_seq, n_doc = _HEAD.unpack(bytes(data[: _HEAD.size]))
    if version != VERSION:
        raise ValueError(f"{idx_path}: index version {version} is not read (version {VERSION} is)")
    if code not in DTYPES or DTYPES[code].startswith("float"):
        raise ValueError(f"{idx_path}: dtype code {code} is not a token id type (integer codes 1-5 and 8 are)")
    at = _HEAD.size
    lengths = np.frombuffer(data, np.dtype("<i4"), n_seq, at)
    pointers = np.frombuffer(data, np.dtype("<i8"), n_seq, at + 4 * n_seq)
    documents = np.frombuffer(data, np.dtype("<i8"), n_doc, at + 12 * n_seq)
    dtype = np.dtype(DTYPES[code]).newbyteorder("<")
    index = Index(dtype, lengths, pointers, documents)
    expected = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]) * dtype.itemsize
    if not np.array_equal(pointers, expected):
        raise ValueError(f"{idx_path}: sequences are not stored back to back in {bin_path.name}; not read")
    if bin_path.stat().st_size != index.n_tokens * dtype.itemsize:
        raise ValueError(
            f"{bin_path}: {bin_path.stat().st_size} bytes, but {idx_path.name} describes {index.n_tokens} tokens of "
            f"{dtype.name} (truncated or replaced?)"
        )
    return index


def write_indexed(prefix: str | Path, documents: Iterable[np.ndarray], dtype: str = "uint16") -> Path:
    """Write ``documents`` (token id arrays, one sequence each) as the dataset ``<prefix>.bin``/``.idx``, each file
    whole or not at all; returns the ``.bin`` path."""
    bin_path, idx_path = paths(prefix)
    np_dtype = np.dtype(dtype).newbyteorder("<")
    lengths = []
    with atomic_path(bin_path) as tmp, open(tmp, "wb") as f:
        for doc in documents:
            np.asarray(doc).astype(np_dtype).tofile(f)
            lengths.append(len(doc))
    n = len(lengths)
    sizes = np.asarray(lengths, np.dtype("<i4"))
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1], dtype=np.int64)]).astype("<i8") * np_dtype.itemsize
    documents_index = np.arange(n + 1, dtype="<i8")  # one sequence per document
    with atomic_path(idx_path) as tmp, open(tmp, "wb") as f:
        f.write(_HEAD.pack(MAGIC, VERSION, CODES[np_dtype.name], n, n + 1))
        f.write(sizes.tobytes() + pointers[:n].tobytes() + documents_index.tobytes())
    return bin_path
