"""The MoE block against a NumPy float64 loop over tokens and experts: routing, gates, capacity slots and dropped
pairs, shared experts; the load-balance loss's gradient against finite differences; counts and config rules."""

from __future__ import annotations

import numpy as np
import pytest

from core.config import ConfigError, load_config

ms = pytest.importorskip("mindspore")
from mindspore import Tensor  # noqa: E402

from core.model import GPT, count_params, matmul_params  # noqa: E402
from core.model.moe import moe_layers  # noqa: E402


def _silu(x):
    return x / (1.0 + np.exp(-x))


def reference(moe, x: np.ndarray):
    """(y, dropped pairs, aux) of ``moe`` on x (B, S, D), token by token and expert by expert in float64."""
    w = {p.name.rsplit("mlp.", 1)[1]: p.asnumpy().astype(np.float64) for p in moe.trainable_params()}
    B, S, D = x.shape
    T, X, k = B * S, moe.n_experts, moe.top_k
    xt = x.reshape(T, D).astype(np.float64)
    logits = xt @ w["router.weight"].T
    if moe.sigmoid:
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        scores = np.exp(logits - logits.max(1, keepdims=True))
        scores /= scores.sum(1, keepdims=True)
    choice = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # (T, k)
    top = np.take_along_axis(scores, choice, 1)
    gates = top / top.sum(1, keepdims=True) if moe.norm_topk else top
    C, used, y, dropped = moe.capacity(T), np.zeros(X, int), np.zeros((T, D)), 0
    for j in range(k):  # all first choices claim their slots before any second choice
        for t in range(T):
            e = choice[t, j]
            if used[e] == C:
                dropped += 1
                continue
            used[e] += 1
            h = _silu(w["experts.w_gate"][e] @ xt[t]) * (w["experts.w_up"][e] @ xt[t])
            y[t] += gates[t, j] * (w["experts.w_down"][e] @ h)
    if moe.shared is not None:
        y += (_silu(xt @ w["shared.w_gate.weight"].T) * (xt @ w["shared.w_up.weight"].T)) @ w["shared.w_down.weight"].T
    routed = np.bincount(choice.reshape(-1), minlength=X) / (T * k)
    aux = X * np.sum(routed * scores.mean(0))
    return y.reshape(B, S, D), dropped, aux


def _moe(*overrides, seed=3):
    cfg = load_config(["model=moe-tiny", *overrides])
    model = GPT(cfg.model, seed=seed)
    return moe_layers(model)[0], model, cfg


def _x(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize(
    "overrides",
    [
        (),  # softmax, dropless
        ("model.moe_router=sigmoid", "model.moe_shared_experts=1"),  # DeepSeek-V3-style, a shared expert
        ("model.moe_capacity_factor=0.5",),  # capacity-bounded: pairs dropped
        ("model.moe_capacity_factor=1.0", "model.moe_top_k=1", "model.moe_router=sigmoid"),
        ("model.moe_norm_topk=false",),  # the gates as scored (Qwen3-MoE's default in transformers)
    ],
)
def test_moe_forward_equals_a_loop_over_tokens_and_experts(overrides):
    moe, _, _ = _moe(*overrides)
    # a large router scale spreads the scores, so that routing is decided and capacity binds
    moe.router.weight.set_data(Tensor(_x(moe.router.weight.shape, 7, 1.0)))
    x = _x((2, 16, 128))
    y = moe(Tensor(x)).asnumpy()
    want, dropped, _ = reference(moe, x)
    assert np.linalg.norm(y - want) <= 1e-5 * np.linalg.norm(want)
    assert float(moe.dropped.asnumpy()) == dropped
    if moe.capacity_factor is None:
        assert dropped == 0
    elif moe.capacity_factor < 1:
        assert dropped > 0  # a real drop was checked, not a vacuous one


def test_load_balance_gradient_is_the_weight_times_d_aux():
    """The router's gradient with the aux loss minus without it equals weight * d aux / d router (central finite
    differences of the NumPy aux in float64)."""
    moe, _, _ = _moe()
    moe.router.weight.set_data(Tensor(_x(moe.router.weight.shape, 7, 0.3)))
    x = _x((1, 16, 128))
    dy = Tensor(_x((1, 16, 128), 1))
    router = moe.router.weight

    def router_grad(scale):
        moe.aux_loss.scale = scale
        return ms.grad(lambda v: (moe(v) * dy).sum(), None, [router])(Tensor(x))[0].asnumpy().astype(np.float64)

    weight = 0.5
    got = (router_grad(weight) - router_grad(0.0)) / weight
    w0, eps = router.asnumpy().astype(np.float64), 1e-4
    fd = np.zeros_like(w0)
    for idx in np.ndindex(*w0.shape[:1], 8):  # every expert row, 8 input columns
        for sign in (1, -1):
            w = w0.copy()
            w[idx] += sign * eps
            router.set_data(Tensor(w.astype(np.float32)))
            fd[idx] += sign * reference(moe, x)[2] / (2 * eps)
    router.set_data(Tensor(w0.astype(np.float32)))
    cols = np.s_[:, :8]
    assert np.abs(fd[cols]).max() > 1e-3
    np.testing.assert_allclose(got[cols], fd[cols], rtol=2e-2, atol=2e-4)


def test_moe_counts_active_parameters():
    cfg = load_config(["model=moe-tiny"]).model
    model = GPT(cfg)
    X, F, D = cfg.n_experts, cfg.moe_ffn_hidden, cfg.d_model
    dense = GPT(load_config(["model=tiny"]).model)
    # 2 MoE blocks (the first stays dense): a dense MLP replaced by a router and X experts
    assert count_params(model) == count_params(dense) + 2 * (X * D + X * 3 * D * F - 3 * D * cfg.ffn_hidden)
    # FLOPs count the router and the k experts a token uses
    assert matmul_params(cfg) == matmul_params(load_config(["model=tiny"]).model) + 2 * (
        X * D + cfg.moe_top_k * 3 * D * F - 3 * D * cfg.ffn_hidden
    )


@pytest.mark.parametrize(
    "overrides, field, fix",
    [
        (["model=moe-tiny", "model.moe_top_k=5"], "model.moe_top_k", "between 1 and model.n_experts=4"),
        (["model=moe-tiny", "model.moe_router=relu"], "model.moe_router", "softmax or sigmoid"),
        (["model=moe-tiny", "model.moe_capacity_factor=0"], "model.moe_capacity_factor", "null for dropless"),
        (["model=moe-tiny", "model.moe_dense_layers=3"], "model.moe_dense_layers", "at least one MoE block"),
        (["model=moe-tiny", "parallel.tp=2", "model.moe_ffn_hidden=255"], "parallel.tp", "each expert's width"),
        (["model=moe-tiny", "parallel.dp_shard=2"], "parallel.ep", "parallel.dp_shard = 2"),
        (
            ["model=moe-tiny", "parallel.dp_shard=2", "parallel.ep=2", "model.n_experts=3", "model.moe_top_k=1"],
            "parallel.ep",
            "model.n_experts=3",
        ),
    ],
)
def test_moe_rules_name_the_field_and_the_fix(overrides, field, fix):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert info.value.field == field and fix in str(info.value)


@pytest.mark.parametrize("cp, tp", [(2, 1), (2, 2), (3, 2)])
def test_sequence_order_restores_positions_and_each_rank_takes_its_own(cp, tp):
    """What the MoE block's gathers do with a sequence split by context (and sequence) parallelism: the group-order
    concatenation of the ranks' parts, permuted by ``sequence_order``, is the sequence in order; ``_own`` of the
    permuted whole is each rank's part again."""
    from core.parallel import comm
    from core.parallel.context_parallel import chunk_positions
    from core.parallel.expert_parallel import sequence_order

    S = 4 * cp * tp
    parts = [
        chunk_positions(S, cp, c)[t * S // cp // tp : (t + 1) * S // cp // tp] for c in range(cp) for t in range(tp)
    ]
    order = sequence_order(S, cp)
    np.testing.assert_array_equal(np.concatenate(parts)[order], np.arange(S))
    for g, part in enumerate(parts):
        own = comm.own_part(comm.Group("sequence", tuple(range(cp * tp)), g), 1, order)
        np.testing.assert_array_equal(own.index.asnumpy(), part)  # in sequence order, index = position
