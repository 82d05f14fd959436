"""Trials on the data users bring: a blend of Megatron indexed datasets trains, and a data-parallel layout sees
the batches one process sees (its losses equal the 1-process run's)."""

from __future__ import annotations

import numpy as np
import pytest

from core.data import indexed
from core.data.corpus import default_corpus
from core.data.dataset import TokenDataset
from tests.integration.conftest import losses, run_trial

pytestmark = pytest.mark.slow


def test_a_blend_of_indexed_datasets_trains_alike_on_every_layout(tmp_path):
    corpus = np.asarray(TokenDataset(default_corpus()[0]).tokens)
    half = len(corpus) // 2  # two "sources" of real text, documents of 2,000 tokens
    for k, part in enumerate((corpus[:half], corpus[half:])):
        indexed.write_indexed(tmp_path / f"src{k}", np.array_split(part, len(part) // 2000), "uint16")
    common = (
        "model=tiny",
        "seed=2",
        "trial.max_steps=4",
        f"data.blend=[0.6,{tmp_path / 'src0'},0.4,{tmp_path / 'src1'}]",
    )
    one = run_trial(tmp_path / "one", *common)
    assert one.code == 0, one.output[-3000:]
    two = run_trial(tmp_path / "two", *common, "parallel.dp_replicate=2")
    assert two.code == 0, two.output[-3000:]
    got, want = losses(two), losses(one)
    assert sorted(want) == [1, 2, 3, 4]
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5)
