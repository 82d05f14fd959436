"""Megatron's indexed datasets and weighted blends: a dataset written here by the test's own writer of the published
format (struct, byte by byte) read back; the core's writer producing the same bytes; a blend's sampled proportions
against its weights, the same batches on every layout; documents through a Hugging Face tokenizer made by the
``tokenizers`` library into the indexed format; and the config's rules."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from core.config import ConfigError, load_config
from core.data import indexed
from core.data.dataset import BlendedDataset, TokenDataset, datasets_for
from core.data.tokens import prepare_indexed


def write_megatron(prefix, docs: list[list[int]], code: int, dtype: str) -> None:
    """The published format, spelled out: header, version, dtype code, counts, lengths (int32), byte pointers
    (int64), document boundaries (int64, 0 first) — one sequence per document, as preprocess_data writes it."""
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype=dtype).tobytes())
    item = np.dtype(dtype).itemsize
    pointers, at = [], 0
    for d in docs:
        pointers.append(at)
        at += len(d) * item
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
        f.write(b"".join(struct.pack("<i", len(d)) for d in docs))
        f.write(b"".join(struct.pack("<q", p) for p in pointers))
        f.write(b"".join(struct.pack("<q", i) for i in range(len(docs) + 1)))


DOCS = [[5, 6, 7], [8, 9], list(range(10, 40)), [1] * 7]


@pytest.mark.parametrize(("code", "dtype"), [(8, "uint16"), (4, "int32")])
def test_a_megatron_dataset_reads_as_its_token_stream(tmp_path, code, dtype):
    write_megatron(tmp_path / "corpus_text_document", DOCS, code, dtype)
    stream = np.concatenate([np.asarray(d) for d in DOCS])
    for name in ("corpus_text_document", "corpus_text_document.bin", "corpus_text_document.idx"):
        ds = TokenDataset(tmp_path / name)  # the prefix, as Megatron's --data-path names it, or either file
        assert ds.n_tokens == len(stream) and ds.info["dtype"] == dtype and ds.info["documents"] == len(DOCS)
        np.testing.assert_array_equal(ds.index.document_starts(), [0, 3, 5, 35])
        assert ds.max_token() == 39
        rows = ds.batch(3, 4, 8, seed=1)
        starts = ds.window_starts(3, 4, 8, seed=1)
        np.testing.assert_array_equal(rows, [stream[s : s + 9] for s in starts])


def test_the_cores_writer_writes_the_published_bytes(tmp_path):
    write_megatron(tmp_path / "theirs", DOCS, 8, "uint16")
    indexed.write_indexed(tmp_path / "ours", [np.asarray(d) for d in DOCS], "uint16")
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"theirs{ext}").read_bytes()


def test_a_damaged_index_is_refused_saying_why(tmp_path):
    write_megatron(tmp_path / "d", DOCS, 8, "uint16")
    raw = (tmp_path / "d.bin").read_bytes()
    (tmp_path / "d.bin").write_bytes(raw[:-2])
    with pytest.raises(ValueError, match="truncated"):
        TokenDataset(tmp_path / "d")
    (tmp_path / "d.idx").write_bytes(b"NOTANIDX" + bytes(40))
    with pytest.raises(ValueError, match="not a Megatron indexed dataset"):
        TokenDataset(tmp_path / "d")
    write_megatron(tmp_path / "f", DOCS, 7, "float32")
    with pytest.raises(ValueError, match="dtype code 7"):
        TokenDataset(tmp_path / "f")


def _two_sources(tmp_path) -> list[TokenDataset]:
    """Two datasets whose tokens tell them apart: [0, 100) and [100, 200)."""
    rng = np.random.default_rng(0)
    out = []
    for k in range(2):
        docs = [rng.integers(100 * k, 100 * (k + 1), size=rng.integers(50, 200)) for _ in range(30)]
        indexed.write_indexed(tmp_path / f"src{k}", docs, "uint16")
        out.append(TokenDataset(tmp_path / f"src{k}"))
    return out


def test_a_blend_samples_in_proportion_to_its_weights(tmp_path):
    blend = BlendedDataset(_two_sources(tmp_path), [0.7, 0.3])
    B, S = 8, 16
    shares = []
    for step in range(200):
        rows = blend.batch(step, B, S, seed=4)
        source = blend.sources(step, B, seed=4)
        # each row's tokens come from the dataset the blend says
        assert ((rows >= 100).all(axis=1) == (source == 1)).all() and ((rows < 100).all(axis=1) == (source == 0)).all()
        shares.append(source)
    source = np.concatenate(shares)
    running = np.cumsum(source == 0) / np.arange(1, len(source) + 1)
    assert abs(running[-1] - 0.7) < 0.005  # over 1,600 rows
    assert np.abs(running[99:] - 0.7).max() < 0.03  # and every prefix of 100 rows or more


def test_a_blend_gives_every_layout_the_same_global_batch(tmp_path):
    blend = BlendedDataset(_two_sources(tmp_path), [1, 3])
    whole = blend.batch(7, 8, 16, seed=2)
    np.testing.assert_array_equal(whole, blend.batch(7, 8, 16, seed=2))  # a pure function of (seed, step)
    parts = [blend.batch(7, 8, 16, seed=2, rank=r, world_size=4) for r in range(4)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    assert not np.array_equal(whole, blend.batch(8, 8, 16, seed=2))


def test_a_blend_in_the_config(tmp_path):
    _two_sources(tmp_path)
    cfg = load_config([f"data.blend=[0.25,{tmp_path / 'src0'},0.75,{tmp_path / 'src1.bin'}]"])
    train, val = datasets_for(cfg)
    assert isinstance(train, BlendedDataset) and train.weights == [0.25, 0.75] and val is train
    for bad, says in (
        ("data.blend=[0.5]", "weight, path"),
        ("data.blend=[heavy,/x,0.5,/y]", "numbers > 0"),
        ("data.blend=[-1,/x]", "numbers > 0"),
    ):
        with pytest.raises(ConfigError, match=says) as err:
            load_config([bad])
        assert err.value.field == "data.blend"
    with pytest.raises(ConfigError) as err:
        load_config([f"data.blend=[1,{tmp_path / 'src0'}]", f"data.train_path={tmp_path / 'src0.bin'}"])
    assert err.value.field == "data.blend"
    with pytest.raises(ConfigError) as err:  # a path that is no dataset: named, before any step
        datasets_for(load_config([f"data.blend=[1,{tmp_path / 'nothing'}]"]))
    assert err.value.field == "data.blend"


def test_prepare_with_a_hugging_face_tokenizer_writes_megatron_documents(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<eos>", "<unk>", "the", "cat", "sat", "on", "mat", "a", "dog"]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    texts = ["the cat sat", "a dog sat on the mat", "the mat", "cat", "a cat on a dog"]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:4]))
    (tmp_path / "last.txt").write_text(texts[4])

    train, val = prepare_indexed(
        [tmp_path / "docs.jsonl", tmp_path / "last.txt"], tmp_path / "out", tokenizer=tmp_path / "tok", val_fraction=0.4
    )
    expected = [tok.encode(t).ids + [0] for t in texts]  # each document, then its end
    for path, docs in ((train, expected[:3]), (val, expected[3:])):
        ds = TokenDataset(path)
        assert ds.info["documents"] == len(docs) and ds.vocab_size == len(words)
        np.testing.assert_array_equal(np.asarray(ds.tokens), np.concatenate(docs))
        np.testing.assert_array_equal(ds.index.lengths, [len(d) for d in docs])
