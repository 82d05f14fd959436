"""Memory: measurement from /proc and the analytic estimate the agent's memory gate starts from."""

import numpy as np
import pytest

from core import memory
from core.config import load_config


@pytest.mark.parametrize("model", ["tiny", "small"])
def test_estimated_params_are_the_models_params(model):
    from core.model import GPT, count_params

    cfg = load_config([f"model={model}"])
    est = memory.estimate_memory(cfg)
    assert est.params == 4 * count_params(GPT(cfg.model))
    assert est.grads == est.params and est.optimizer == 2 * est.params          # AdamW: m and v


def test_estimate_follows_the_settings():
    base = memory.estimate_memory(load_config(["training.micro_batch_size=4"]))
    bigger = memory.estimate_memory(load_config(["training.micro_batch_size=8"]))
    recompute = memory.estimate_memory(load_config(["training.micro_batch_size=8", "memory.recompute=full"]))
    muon = memory.estimate_memory(load_config(["optim=muon"]))
    assert bigger.activations == 2 * base.activations                          # linear in the micro-batch
    assert recompute.activations < bigger.activations / 2
    assert muon.optimizer == muon.params                                       # one momentum buffer
    assert base.runtime == memory.RUNTIME_BASELINE_BYTES["CPU"]
    assert memory.estimate_memory(load_config(["device=Ascend"])).runtime == 0  # unknown there: learned instead


def test_peak_is_measured_and_resettable():
    assert memory.reset_peak()
    base = memory.current_rss_bytes()
    hog = np.ones(64 * 2**20 // 8)                                              # 64 MiB, every page touched
    assert memory.peak_rss_bytes() >= base + 60 * 2**20
    del hog                                                                     # a large block goes back to the OS
    assert memory.reset_peak()
    assert memory.peak_rss_bytes() < base + 60 * 2**20
