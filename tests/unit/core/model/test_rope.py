"""RoPE's scaled frequencies (Llama 3.1's and YaRN's) against per-dimension NumPy float64 loops written from the
papers' rules, and the config rules that guard them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.config import ConfigError, load_config
from core.model.layers import rope_frequencies, rope_tables

BASE = ["model=tiny", "model.d_model=256", "model.n_heads=2", "model.rope_theta=500000", "model.max_seq_len=512"]


def llama3_reference(theta, E, factor, low, high, L):
    """Llama 3.1's rule, one dimension at a time."""
    out = []
    for i in range(0, E, 2):
        f = theta ** (-i / E)
        wavelength = 2 * math.pi / f
        if wavelength < L / high:
            out.append(f)
        elif wavelength > L / low:
            out.append(f / factor)
        else:
            s = (L / wavelength - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return np.array(out)


def yarn_reference(theta, E, factor, L, beta_fast=32, beta_slow=1):
    """YaRN's NTK-by-parts rule: by the rotations r(d) = L f_d / (2 pi) each dimension makes over the original
    context, the ramp between the (rounded) dimensions where r equals beta_fast and beta_slow."""
    rotations_at = [L * theta ** (-i / E) / (2 * math.pi) for i in range(0, E, 2)]
    # first index whose rotations fall to beta: solve L theta^(-2d/E) / (2 pi) = beta for d
    d_fast = math.floor(E * math.log(L / (beta_fast * 2 * math.pi)) / (2 * math.log(theta)))
    d_slow = math.ceil(E * math.log(L / (beta_slow * 2 * math.pi)) / (2 * math.log(theta)))
    d_fast, d_slow = max(d_fast, 0), min(d_slow, E - 1)
    out = []
    for d, r in enumerate(rotations_at):
        f = 2 * math.pi * r / L
        ramp = min(max((d - d_fast) / (d_slow - d_fast), 0.0), 1.0)
        out.append(f * (1 - ramp) + f / factor * ramp)
    return np.array(out), 0.1 * math.log(factor) + 1


def test_llama3_scaling_matches_the_per_dimension_rule():
    cfg = load_config(
        [*BASE, "model.rope_scaling=llama3", "model.rope_factor=8", "model.rope_original_max_len=64"]
    ).model
    got, scale = rope_frequencies(cfg)
    want = llama3_reference(500000, 128, 8, 1.0, 4.0, 64)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert scale == 1.0
    # the three regimes all occur at these shapes: kept, divided, blended
    plain = 500000 ** (-np.arange(0, 128, 2) / 128)
    ratio = got / plain
    assert (
        np.isclose(ratio, 1).any()
        and np.isclose(ratio, 1 / 8).any()
        and ((ratio > 1 / 8 + 1e-9) & (ratio < 1 - 1e-9)).any()
    )


def test_yarn_scaling_matches_the_per_dimension_rule_and_scales_the_tables():
    cfg = load_config(
        [*BASE, "model.rope_scaling=yarn", "model.rope_factor=4", "model.rope_original_max_len=128"]
    ).model
    got, scale = rope_frequencies(cfg)
    want, want_scale = yarn_reference(500000, 128, 4, 128)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert scale == pytest.approx(want_scale, rel=1e-12)
    cos, sin = rope_tables(cfg)
    np.testing.assert_allclose(cos[5], np.cos(5 * want) * want_scale, rtol=1e-12)
    np.testing.assert_allclose(sin[5], np.sin(5 * want) * want_scale, rtol=1e-12)


def test_no_scaling_is_plain_rope():
    got, scale = rope_frequencies(load_config(BASE).model)
    np.testing.assert_allclose(got, 500000 ** (-np.arange(0, 128, 2) / 128), rtol=1e-15)
    assert scale == 1.0


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.rope_scaling=ntk"], "model.rope_scaling"),
        (["model.rope_scaling=llama3", "model.rope_factor=8"], "model.rope_original_max_len"),
        (["model.rope_scaling=yarn", "model.rope_factor=0.5", "model.rope_original_max_len=64"], "model.rope_factor"),
        (
            ["model.rope_scaling=llama3", "model.rope_original_max_len=64", "model.rope_high_freq_factor=0.5"],
            "model.rope_high_freq_factor",
        ),
    ],
)
def test_bad_scaling_is_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        load_config([*BASE, *overrides])
    assert err.value.field == field
