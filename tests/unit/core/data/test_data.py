"""core.data: token files, the embedded corpus, stateless seeded batches."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core import data
from core.data import TokenDataset

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture
def text_files(tmp_path):
    a = tmp_path / "a.txt"
    b = tmp_path / "b.txt"
    a.write_text("The quick brown fox jumps over the lazy dog.\n" * 20, encoding="utf-8")
    b.write_text("Ünïcödé text: naïve café, 日本語.\n" * 10, encoding="utf-8")
    return a, b


def _all_bytes(*paths):
    return b"".join(p.read_bytes() for p in paths)


def test_prepare_round_trip_and_split(text_files, tmp_path):
    a, b = text_files
    train, val = data.prepare([a, b], tmp_path / "out", val_fraction=0.25)
    stream = _all_bytes(a, b)
    tr, va = TokenDataset(train), TokenDataset(val)
    # Bytes in = tokens out, and the split is exactly the tail: together they rebuild the stream, no overlap.
    n_val = round(len(stream) * 0.25)
    assert va.n_tokens == n_val
    assert tr.n_tokens == len(stream) - n_val
    assert bytes(np.asarray(tr.tokens, dtype=np.uint8)) + bytes(np.asarray(va.tokens, dtype=np.uint8)) == stream
    assert tr.vocab_size == va.vocab_size == 256 and tr.tokenizer == "byte"
    side = json.loads(data.sidecar_path(train).read_text())
    assert side == {
        "dtype": "uint16",
        "vocab_size": 256,
        "tokenizer": "byte",
        "n_tokens": tr.n_tokens,
        "max_token": max(stream[: tr.n_tokens]),
    }
    assert train.stat().st_size == 2 * tr.n_tokens
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_prepare_uint32(text_files, tmp_path):
    train, _ = data.prepare([text_files[0]], tmp_path / "o", dtype="uint32")
    ds = TokenDataset(train)
    assert ds.tokens.dtype == np.dtype("<u4") and train.stat().st_size == 4 * ds.n_tokens
    assert ds.decode(ds.tokens).startswith("The quick brown fox")


def test_uint32_tokens_beyond_uint16(tmp_path):
    ids = np.array([0, 70000, 123456, 5, 99999, 1] * 10, dtype=np.int64)
    path = data.write_tokens(tmp_path / "big.bin", ids, vocab_size=200000, dtype="uint32", tokenizer="custom")
    ds = TokenDataset(path)
    assert ds.n_tokens == 60 and ds.vocab_size == 200000 and ds.max_token() == 123456
    b = ds.batch(0, 4, 7, seed=0)
    assert b.dtype == np.int32 and b.shape == (4, 8)
    assert set(np.unique(b)) <= {0, 70000, 123456, 5, 99999, 1}
    with pytest.raises(ValueError, match="does not fit uint16"):
        data.write_tokens(tmp_path / "x.bin", ids, vocab_size=200000, dtype="uint16")


def test_batch_is_a_pure_function_of_seed_and_step(tmp_path):
    path = data.write_tokens(tmp_path / "t.bin", np.arange(5000) % 256, vocab_size=256)
    one, two = TokenDataset(path), TokenDataset(path)
    b = one.batch(7, 8, 16, seed=3)
    assert b.shape == (8, 17) and b.dtype == np.int32
    np.testing.assert_array_equal(b, two.batch(7, 8, 16, seed=3))  # another instance, same batch
    one.batch(8, 8, 16, seed=3)  # no hidden state advanced
    np.testing.assert_array_equal(b, one.batch(7, 8, 16, seed=3))
    assert not np.array_equal(b, one.batch(8, 8, 16, seed=3))
    assert not np.array_equal(b, one.batch(7, 8, 16, seed=4))
    # Each row is a contiguous window of the file: targets are inputs shifted by one.
    tokens = np.asarray(one.tokens)
    for row, start in zip(b, one.window_starts(7, 8, 16, seed=3), strict=True):
        np.testing.assert_array_equal(row, tokens[start : start + 17])


def test_windows_cover_the_whole_file(tmp_path):
    # n_tokens = seq_len + 1 leaves exactly one window; larger files reach their last token.
    path = data.write_tokens(tmp_path / "t.bin", np.arange(20) % 256, vocab_size=256)
    ds = TokenDataset(path)
    np.testing.assert_array_equal(ds.batch(0, 3, 19, seed=0), np.tile(np.arange(20), (3, 1)))
    starts = np.concatenate([ds.window_starts(s, 16, 4, seed=1) for s in range(50)])
    assert starts.min() == 0 and starts.max() == 20 - 5


def test_rank_slices_concatenate_to_the_global_batch(tmp_path):
    path = data.write_tokens(tmp_path / "t.bin", np.arange(3000) % 251, vocab_size=256)
    ds = TokenDataset(path)
    full = ds.batch(5, 8, 12, seed=11)
    for world in (1, 2, 4, 8):
        parts = [ds.batch(5, 8, 12, seed=11, rank=r, world_size=world) for r in range(world)]
        assert all(p.shape == (8 // world, 13) for p in parts)
        np.testing.assert_array_equal(np.concatenate(parts), full)
    with pytest.raises(ValueError, match="multiple of the data-parallel degree"):
        ds.batch(5, 8, 12, seed=11, rank=0, world_size=3)
    with pytest.raises(ValueError, match="rank 2 of world_size 2"):
        ds.batch(5, 8, 12, seed=11, rank=2, world_size=2)


def test_eval_batches_fixed_and_spread(tmp_path):
    path = data.write_tokens(tmp_path / "v.bin", np.arange(1000) % 256, vocab_size=256)
    ds = TokenDataset(path)
    ev = ds.eval_batches(3, 4, 9)
    assert ev.shape == (3, 4, 10) and ev.dtype == np.int32
    np.testing.assert_array_equal(ev, TokenDataset(path).eval_batches(3, 4, 9))
    tokens = np.asarray(ds.tokens)
    np.testing.assert_array_equal(ev[0, 0], tokens[:10])  # first window at the start
    np.testing.assert_array_equal(ev[-1, -1], tokens[-10:])  # last window at the end
    halves = [ds.eval_batches(3, 4, 9, rank=r, world_size=2) for r in range(2)]
    np.testing.assert_array_equal(np.concatenate(halves, axis=1), ev)


def test_max_token_scanned_and_cached(tmp_path):
    path = data.write_tokens(tmp_path / "t.bin", np.array([1, 2, 250, 3] * 5), vocab_size=256)
    side = json.loads(data.sidecar_path(path).read_text())
    del side["max_token"]
    data.sidecar_path(path).write_text(json.dumps(side))
    assert TokenDataset(path).max_token() == 250
    assert json.loads(data.sidecar_path(path).read_text())["max_token"] == 250


def test_raw_file_needs_dtype(tmp_path):
    raw = tmp_path / "raw.bin"
    np.arange(100, dtype="<u2").tofile(raw)
    with pytest.raises(ValueError, match="no sidecar.*data.token_dtype"):
        TokenDataset(raw)
    ds = TokenDataset(raw, dtype="uint16")
    assert ds.n_tokens == 100 and ds.vocab_size is None and ds.max_token() == 99
    assert not data.sidecar_path(raw).exists()  # nothing written beside a raw file


def test_errors(text_files, tmp_path):
    with pytest.raises(FileNotFoundError, match="core.data prepare"):
        TokenDataset(tmp_path / "nope.bin")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        data.prepare([text_files[0], tmp_path / "missing.txt"], tmp_path / "o")
    with pytest.raises(ValueError, match="val_fraction"):
        data.prepare([text_files[0]], tmp_path / "o", val_fraction=0.0)
    with pytest.raises(ValueError, match="unknown tokenizer 'gpt2'"):
        data.prepare([text_files[0]], tmp_path / "o", tokenizer="gpt2")
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("ab")
    with pytest.raises(ValueError, match="too few to split"):
        data.prepare([tiny], tmp_path / "o", val_fraction=0.1)

    path = data.write_tokens(tmp_path / "t.bin", np.arange(10), vocab_size=256)
    ds = TokenDataset(path)
    ds.batch(0, 2, 9, seed=0)  # seq_len + 1 == n_tokens: fits
    with pytest.raises(ValueError, match="seq_len\\+1 = 11 .* 10 tokens"):
        ds.batch(0, 2, 10, seed=0)
    with pytest.raises(ValueError, match="seq_len\\+1"):
        ds.eval_batches(1, 2, 10)
    with pytest.raises(ValueError, match="dtype 'uint32' was requested"):
        TokenDataset(path, dtype="uint32")
    with open(path, "ab") as f:  # a file that no longer matches its sidecar
        f.write(b"\x00\x00")
    with pytest.raises(ValueError, match="sidecar says 10 tokens but the file holds 11"):
        TokenDataset(path)


def test_cli_prepare_and_errors(text_files, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "cli"
    run = subprocess.run(
        [sys.executable, "-m", "core.data", "prepare", *map(str, text_files), str(out), "--val-fraction", "0.2"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    assert TokenDataset(out / "train.bin").n_tokens + TokenDataset(out / "val.bin").n_tokens == len(
        _all_bytes(*text_files)
    )
    bad = subprocess.run(
        [sys.executable, "-m", "core.data", "prepare", str(tmp_path / "missing.txt"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert bad.returncode == 2 and "not found" in bad.stderr and "missing.txt" in bad.stderr


def test_default_corpus_is_real_text_and_cached(tmp_path):
    train, val = data.default_corpus(tmp_path / "cache")
    tr, va = TokenDataset(train), TokenDataset(val)
    assert tr.n_tokens > 300_000 and va.n_tokens > 30_000
    assert abs(va.n_tokens / (tr.n_tokens + va.n_tokens) - 0.1) < 1e-3
    text = tr.decode(tr.tokens[:20000])
    words = text.lower().split()
    assert words.count("the") > 100 and "function" in words  # English prose, not noise
    expected = data.corpus_text().encode("utf-8")
    assert bytes(np.asarray(tr.tokens, np.uint8)) + bytes(np.asarray(va.tokens, np.uint8)) == expected
    # A second call reuses the cache (same paths, untouched files) and leaves no temporaries.
    mtime = train.stat().st_mtime_ns
    assert data.default_corpus(tmp_path / "cache") == (train, val)
    assert train.stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [train.parent.name]


def test_default_corpus_uses_msar_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MSAR_CACHE_DIR", str(tmp_path / "env"))
    train, _ = data.default_corpus()
    assert train.parent.parent == tmp_path / "env" / "corpus"


def test_default_corpus_concurrent_builders(tmp_path):
    # Several processes building at once: all succeed, all agree, one complete directory remains.
    code = "import sys; from core.data import default_corpus; print(*default_corpus(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "c")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    outs = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert len({out for out, _ in outs}) == 1
    assert len(list((tmp_path / "c").iterdir())) == 1
    train = Path(outs[0][0].split()[0])
    assert TokenDataset(train).n_tokens > 300_000


def test_default_corpus_without_pydoc_data(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)  # import now raises ImportError
    with pytest.raises(RuntimeError, match="data.train_path"):
        data.default_corpus()
