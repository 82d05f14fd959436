"""core.optim against float64 NumPy re-implementations of the papers' rules (AdamW: Loshchilov & Hutter 2019;
Muon: Jordan et al. 2024 with Liu et al. 2025's RMS matching), plus schedules, clipping and checkpoint state."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, ops
from safetensors.numpy import load_file, save_file

from core.config import OptimConfig
from core.optim import (
    ADAMW_NAME_PATTERNS,
    NS_COEFFS,
    STEP_KEY,
    build_optimizer,
    lr_at,
    newton_schulz,
    rms_match_scale,
    uses_muon,
)

# A miniature of the model's parameter list: tall, wide and square hidden matrices, embedding, head and norms.
SHAPES = [
    ("embed.weight", (24, 8)),
    ("layers.0.attn.wq.weight", (8, 8)),
    ("layers.0.mlp.w1.weight", (20, 8)),
    ("layers.0.mlp.w2.weight", (8, 20)),
    ("layers.0.attn_norm.weight", (8,)),
    ("norm.weight", (8,)),
    ("lm_head.weight", (24, 8)),
]


def make_params(seed: int = 0, shapes=SHAPES) -> list[tuple[str, Parameter]]:
    rng = np.random.default_rng(seed)
    return [
        (name, Parameter(Tensor(rng.standard_normal(shape).astype(np.float32)), name=name)) for name, shape in shapes
    ]


def make_grads(seed: int, shapes=SHAPES, scale: float = 0.1) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 + seed)
    return [(scale * rng.standard_normal(shape)).astype(np.float32) for _, shape in shapes]


def ns_reference(g: np.ndarray, steps: int) -> np.ndarray:
    a, b, c = NS_COEFFS
    transposed = g.shape[0] > g.shape[1]
    x = g.T if transposed else g
    x = x / (np.sqrt((x * x).sum()) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if transposed else x


class ReferenceOptimizer:
    """The update rules written out in float64 NumPy, one parameter at a time."""

    def __init__(self, named, cfg: OptimConfig):
        self.cfg, self.t = cfg, 0
        self.names = [n for n, _ in named]
        self.p = {n: p.asnumpy().astype(np.float64) for n, p in named}
        self.muon = {
            n: cfg.name == "muon" and self.p[n].ndim == 2 and "embed" not in n and "lm_head" not in n
            for n in self.names
        }
        self.m = {n: np.zeros_like(self.p[n]) for n in self.names}
        self.v = {n: np.zeros_like(self.p[n]) for n in self.names}

    def step(self, grads, lr):
        c = self.cfg
        self.t += 1
        for n, g in zip(self.names, grads, strict=True):
            g = g.astype(np.float64)
            p = self.p[n]
            wd = c.weight_decay if p.ndim >= 2 else 0.0
            if self.muon[n]:
                self.m[n] = c.momentum * self.m[n] + g
                o = ns_reference(g + c.momentum * self.m[n], c.ns_steps)
                self.p[n] = p - lr * wd * p - lr * 0.2 * math.sqrt(max(p.shape)) * o
            else:
                self.m[n] = c.beta1 * self.m[n] + (1 - c.beta1) * g
                self.v[n] = c.beta2 * self.v[n] + (1 - c.beta2) * g * g
                m_hat = self.m[n] / (1 - c.beta1**self.t)
                v_hat = self.v[n] / (1 - c.beta2**self.t)
                self.p[n] = p - lr * wd * p - lr * m_hat / (np.sqrt(v_hat) + c.eps)


def run_both(cfg: OptimConfig, lrs, jit: bool = True, fused: bool = False, scales=None):
    """The optimizer and the reference through the same steps; ``scales``: each step's gradient factor (passed
    to ``step`` as a Tensor, applied to the reference's gradients beforehand)."""
    named = make_params()
    ref = ReferenceOptimizer(named, cfg)
    opt = build_optimizer(named, cfg, jit=jit, fused=fused)
    for i, lr in enumerate(lrs):
        grads = make_grads(i)
        if scales is None:
            opt.step([Tensor(g) for g in grads], lr)
        else:
            opt.step([Tensor(g) for g in grads], lr, Tensor(scales[i], ms.float32))
            grads = [g.astype(np.float64) * np.float32(scales[i]) for g in grads]
        ref.step(grads, lr)
    return named, opt, ref


# fused: AdamW by core.runtime.kernels.adamw (one kernel for all parameters), as trials on CPU run it.
@pytest.mark.parametrize("jit, fused", [(True, False), (False, False), (True, True), (False, True)])
def test_adamw_matches_numpy(jit, fused):
    cfg = OptimConfig(name="adamw", weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8)
    named, opt, ref = run_both(
        cfg, [1e-2, 3e-2, 2e-2, 5e-3, 1e-2], jit=jit, fused=fused, scales=[1.0, 0.5, 0.25, 1.0, 0.125]
    )
    assert set(opt.route.values()) == {"adamw"}
    state = opt.state_dict()
    for name, p in named:
        # Each step moves a weight by ~lr (Adam's normalised step); float32 keeps ~1e-7 of the O(1) weights.
        np.testing.assert_allclose(p.asnumpy(), ref.p[name], rtol=1e-6, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(state[f"adamw.m.{name}"], ref.m[name], rtol=1e-5, atol=1e-8, err_msg=name)
        np.testing.assert_allclose(state[f"adamw.v.{name}"], ref.v[name], rtol=1e-5, atol=1e-10, err_msg=name)
    assert int(state[STEP_KEY]) == 5


@pytest.mark.parametrize("jit, fused", [(True, False), (False, False), (True, True)])
def test_muon_matches_numpy(jit, fused):
    """Muon's matrices, and AdamW for the rest (by the fused kernel with ``fused``), with gradient factors."""
    cfg = OptimConfig(name="muon", weight_decay=0.1, momentum=0.95, ns_steps=5)
    named, opt, ref = run_both(cfg, [2e-2, 1e-2, 2e-2, 1e-2], jit=jit, fused=fused, scales=[1.0, 0.5, 2.0, 1.0])
    state = opt.state_dict()
    for name, p in named:
        # Newton–Schulz amplifies float32 rounding (its slope at 0 is a = 3.4); the update is lr * 0.2 * sqrt(20)
        # times an O(1/sqrt(20)) matrix, so 2e-6 absolute on O(1) weights is ~1e-4 of one update.
        np.testing.assert_allclose(p.asnumpy(), ref.p[name], rtol=1e-6, atol=2e-6, err_msg=name)
        if opt.route[name] == "muon":
            np.testing.assert_allclose(state[f"muon.momentum.{name}"], ref.m[name], rtol=1e-6, atol=1e-7)


def test_newton_schulz_puts_singular_values_near_one():
    rng = np.random.default_rng(3)
    for shape in [(64, 32), (32, 96)]:
        g = rng.standard_normal(shape).astype(np.float32) * 1e-3  # the scale must not matter
        out = newton_schulz(Tensor(g), 5).asnumpy()
        assert out.shape == shape
        s = np.linalg.svd(out.astype(np.float64), compute_uv=False)
        # The quintic does not converge to 1: it settles singular values in a band of about [0.68, 1.13].
        assert 0.65 <= s.min() and s.max() <= 1.2, (shape, s.min(), s.max())
        np.testing.assert_allclose(out, ns_reference(g.astype(np.float64), 5), atol=2e-5)
        # Same singular vectors as the input: out ~ U V^T.
        u, _, vt = np.linalg.svd(g.astype(np.float64), full_matrices=False)
        assert np.abs(out - u @ vt).max() < 0.35


def test_newton_schulz_of_zero_is_zero():
    out = newton_schulz(Tensor(np.zeros((8, 12), np.float32)), 5).asnumpy()
    assert np.all(out == 0.0)


def test_muon_update_rms_matches_adamw_scale():
    """One Muon step moves a matrix by RMS ~0.2 * lr whatever its shape (Liu et al. 2025)."""
    assert rms_match_scale((688, 256)) == pytest.approx(0.2 * math.sqrt(688))
    assert rms_match_scale((256, 256)) == pytest.approx(3.2)
    shapes = [
        ("layers.0.mlp.w1.weight", (96, 32)),
        ("layers.0.mlp.w2.weight", (32, 96)),
        ("layers.0.attn.wo.weight", (48, 48)),
    ]
    named = make_params(5, shapes)
    before = [p.asnumpy().copy() for _, p in named]
    opt = build_optimizer(named, OptimConfig(name="muon", weight_decay=0.0))
    lr = 0.01
    opt.step([Tensor(g) for g in make_grads(5, shapes)], lr)
    for (name, p), b in zip(named, before, strict=True):
        rms = np.sqrt(np.mean((p.asnumpy().astype(np.float64) - b) ** 2)) / lr
        # RMS of an (A, B) matrix with singular values s is sqrt(mean(s^2) / max(A, B)); NS leaves s in about
        # [0.68, 1.13], so after the 0.2 * sqrt(max(A, B)) scale the RMS is 0.2 * [0.68, 1.13] = [0.136, 0.226].
        assert 0.13 <= rms <= 0.23, (name, rms)


def test_routing_by_name_and_shape():
    assert ADAMW_NAME_PATTERNS == ("embed", "lm_head", "router")
    assert not uses_muon("layers.1.mlp.router.weight", (8, 256))  # an MoE router scores experts
    assert not uses_muon("layers.1.mlp.experts.w_gate", (8, 344, 256))  # 3-D expert stacks: AdamW
    assert uses_muon("layers.0.attn.wq.weight", (256, 256))
    assert uses_muon("layers.3.mlp.w2.weight", (256, 688))
    assert not uses_muon("embed.weight", (4096, 256))
    assert not uses_muon("lm_head.weight", (4096, 256))
    assert not uses_muon("layers.0.attn_norm.weight", (256,))
    assert not uses_muon("norm.weight", (256,))
    named = make_params()
    muon = build_optimizer(named, OptimConfig(name="muon"))
    assert [n for n, k in muon.route.items() if k == "muon"] == [
        "layers.0.attn.wq.weight",
        "layers.0.mlp.w1.weight",
        "layers.0.mlp.w2.weight",
    ]
    assert set(build_optimizer(named, OptimConfig(name="adamw")).route.values()) == {"adamw"}
    keys = set(muon.state_dict())
    assert "muon.momentum.layers.0.attn.wq.weight" in keys and "adamw.m.embed.weight" in keys
    assert "adamw.v.norm.weight" in keys and "adamw.m.layers.0.attn.wq.weight" not in keys


@pytest.mark.parametrize("name, fused", [("adamw", False), ("muon", False), ("adamw", True)])
def test_weight_decay_is_decoupled_and_skips_1d(name, fused):
    """With zero gradients the only change is the decay: matrices shrink by (1 - lr * wd), vectors stay."""
    named = make_params()
    before = {n: p.asnumpy().copy() for n, p in named}
    opt = build_optimizer(named, OptimConfig(name=name, weight_decay=0.5), fused=fused)
    lr = 0.1
    opt.step([Tensor(np.zeros(p.shape, np.float32)) for _, p in named], lr)
    for n, p in named:
        factor = 1.0 - lr * 0.5 if p.ndim >= 2 else 1.0
        np.testing.assert_allclose(p.asnumpy(), before[n] * factor, rtol=1e-6, atol=1e-7, err_msg=n)


def test_schedules_at_key_steps():
    def at(step, schedule, total=13, **kw):
        cfg = OptimConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=kw.pop("warmup", 4), schedule=schedule, **kw)
        return lr_at(step, cfg, total)

    for kind in ("cosine", "linear", "wsd", "constant"):
        assert at(0, kind) == pytest.approx(0.25)  # warmup: lr * (step + 1) / warmup_steps
        assert at(3, kind) == pytest.approx(1.0)
        assert at(50, kind, total=None) == pytest.approx(1.0)  # unknown horizon: constant after warmup
        assert at(1, kind, total=None) == pytest.approx(0.5)
    # cosine, 13 steps: decay over steps 4..12
    assert at(4, "cosine") == pytest.approx(1.0)
    assert at(6, "cosine") == pytest.approx(0.1 + 0.45 * (1 + math.sqrt(0.5)))  # a quarter of the way: 0.8682
    assert at(8, "cosine") == pytest.approx(0.55)
    assert at(12, "cosine") == pytest.approx(0.1)
    assert at(30, "cosine") == pytest.approx(0.1)
    assert at(0, "cosine", warmup=0) == pytest.approx(1.0)
    # linear
    assert at(4, "linear") == pytest.approx(1.0)
    assert at(6, "linear") == pytest.approx(0.775)
    assert at(8, "linear") == pytest.approx(0.55)
    assert at(12, "linear") == pytest.approx(0.1)
    # wsd, 20 steps, decay_ratio 0.2: stable through step 15, then 4 decay steps ending at the floor
    wsd = [at(s, "wsd", total=20, decay_ratio=0.2) for s in (4, 15, 16, 17, 18, 19)]
    assert wsd == pytest.approx([1.0, 1.0, 0.775, 0.55, 0.325, 0.1])
    # constant
    assert at(12, "constant") == pytest.approx(1.0)
    assert at(0, "constant", warmup=0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        at(-1, "cosine")


@pytest.mark.parametrize("name, fused", [("adamw", False), ("muon", False), ("adamw", True)])
def test_state_dict_round_trip_continues_bit_identically(name, fused, tmp_path):
    cfg = OptimConfig(name=name)
    named = make_params()
    opt = build_optimizer(named, cfg, fused=fused)
    for i in range(3):
        opt.step([Tensor(g) for g in make_grads(i)], 1e-2)
    # Through a safetensors file, as a checkpoint would store it.
    save_file(opt.state_dict(), str(tmp_path / "optim.safetensors"))
    saved_params = {n: p.asnumpy().copy() for n, p in named}

    resumed = [(n, Parameter(Tensor(saved_params[n]), name=n)) for n, _ in named]
    opt2 = build_optimizer(resumed, cfg, fused=fused)
    opt2.load_state_dict(load_file(str(tmp_path / "optim.safetensors")))
    assert opt2.step_count == 3
    for i in range(3, 6):
        grads = make_grads(i)
        opt.step([Tensor(g) for g in grads], 1e-2)
        opt2.step([Tensor(g) for g in grads], 1e-2)
    for (n, p), (_, q) in zip(named, resumed, strict=True):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy(), err_msg=n)
    a, b = opt.state_dict(), opt2.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)

    # Loading into an optimizer whose update graph is already compiled rewinds it just as well. (Weights are
    # restored with ops.assign: set_data would detach them from the compiled graph.)
    for n, p in named:
        ops.assign(p, Tensor(saved_params[n]))
    opt.load_state_dict(load_file(str(tmp_path / "optim.safetensors")))
    for i in range(3, 6):
        opt.step([Tensor(g) for g in make_grads(i)], 1e-2)
    for (n, p), (_, q) in zip(named, resumed, strict=True):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy(), err_msg=n)


def test_load_state_dict_refuses_mismatches():
    opt = build_optimizer(make_params(), OptimConfig(name="muon"))
    good = opt.state_dict()
    with pytest.raises(KeyError):
        opt.load_state_dict({k: v for k, v in good.items() if k != "adamw.m.embed.weight"})
    with pytest.raises(KeyError):
        opt.load_state_dict({**good, "adamw.m.extra": np.zeros(3, np.float32)})
    bad = dict(good)
    bad["adamw.v.norm.weight"] = np.zeros(9, np.float32)
    with pytest.raises(ValueError):
        opt.load_state_dict(bad)


def test_rejects_a_parameter_listed_twice():
    named = make_params()
    with pytest.raises(ValueError):
        build_optimizer(named + [("tied.weight", named[0][1])], OptimConfig())


@pytest.mark.parametrize(
    "shape, tp_dim, tp, fsdp",
    [
        ((6, 8), 0, 2, 2),
        ((6, 8), 1, 2, 2),
        ((6, 10), 1, 2, 3),
        ((5, 7), None, 2, 2),
        ((4, 6), 0, 2, 1),
        ((3, 5), None, 1, 4),
    ],
)
def test_sharded_muon_moves_whole_matrices_to_and_from_every_ranks_shards(shape, tp_dim, tp, fsdp):
    """``cut`` gives each group index g = fsdp_index * tp + tp_index the flat shard that rank stores
    (``Placement.shard``, FSDP padding included) and ``assemble`` puts those shards back together."""
    from core.optim.sharded_muon import assemble, cut
    from core.parallel.placement import Placement

    full = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    places = [
        Placement(shape, tp_dim, tp if tp_dim is not None else 1, t if tp_dim is not None else 0, fsdp, f)
        for f in range(fsdp)
        for t in range(tp)
    ]
    shards = np.stack([p.shard(full).reshape(-1) for p in places])  # (tp * fsdp, size)
    np.testing.assert_array_equal(cut(Tensor(full), places[0], tp, fsdp).asnumpy(), shards)
    np.testing.assert_array_equal(assemble(Tensor(shards), places[0], tp, fsdp).asnumpy(), full)


def test_sharded_muon_owners_balance_newton_schulz_cost():
    from core.optim.sharded_muon import assign_owners

    # small's hidden matrices per block: wq, wk, wv, wo (256 x 256) and the MLP (688 x 256, 256 x 688)
    shapes = [(256, 256)] * 4 + [(688, 256), (688, 256), (256, 688)]
    cost = [a * b * min(a, b) for a, b in shapes]
    for ranks in (1, 2, 4):
        owners = assign_owners(shapes * 4, ranks)
        assert set(owners) == set(range(ranks))  # every rank takes a share
        load = [sum(c for c, o in zip(cost * 4, owners, strict=True) if o == r) for r in range(ranks)]
        assert max(load) - min(load) <= max(cost)  # greedy: within one matrix of even
    assert assign_owners([(4, 4)], 3) == [0]
