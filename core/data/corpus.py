"""The embedded default corpus: CPython's own documentation topics, tokenised once into the project's cache (no
download), with a held-out validation split.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from core.data.tokens import prepare
from core.runtime.cache_dirs import cache_root

_CORPUS_FORMAT = 1  # bump when the corpus layout changes, so old caches are not reused


def corpus_text() -> str:
    """The Python documentation's topic texts that ship with CPython: real English prose, no download."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:
        raise RuntimeError(
            "the embedded corpus needs the standard-library module pydoc_data, which this Python "
            "lacks; set data.train_path (and data.val_path) to token files made with "
            "`python -m core.data prepare`"
        ) from exc
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
                if not (final / "val.bin.json").is_file():  # not a lost race: a real failure
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final / "train.bin", final / "val.bin"
