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
from core.training.balance import ExpertBalance  # noqa: E402
from core.training.ranks import Ranks  # noqa: E402


def _silu(x):
    return x / (1.0 + np.exp(-x))


def np_scores(moe, x: np.ndarray) -> np.ndarray:
    """(T, X) router scores of x (B, S, D) in float64."""
    logits = x.reshape(-1, x.shape[-1]).astype(np.float64) @ moe.router.weight.asnumpy().astype(np.float64).T
    if moe.sigmoid:
        return 1.0 / (1.0 + np.exp(-logits))
    scores = np.exp(logits - logits.max(1, keepdims=True))
    return scores / scores.sum(1, keepdims=True)


def np_choice(moe, scores: np.ndarray) -> np.ndarray:
    """(T, k) experts each token chooses: the k best biased scores, among its best groups' experts."""
    T, X = scores.shape
    biased = scores + (moe.score_bias.asnumpy().astype(np.float64) if moe.has_bias else 0.0)
    if moe.groups > 1:  # DeepSeek-V3: only the experts of each token's best groups (by their two best) compete
        G = moe.groups
        per_group = np.sort(biased.reshape(T, G, X // G), axis=-1)[:, :, -2:].sum(-1)  # (T, G)
        best = np.argsort(-per_group, axis=1, kind="stable")[:, : moe.topk_groups]
        allowed = np.zeros((T, G), bool)
        np.put_along_axis(allowed, best, True, 1)
        biased = np.where(np.repeat(allowed, X // G, axis=1), biased, -np.inf)
    return np.argsort(-biased, axis=1, kind="stable")[:, : moe.top_k]


def reference(moe, x: np.ndarray):
    """(y, dropped pairs, aux) of ``moe`` on x (B, S, D), token by token and expert by expert in float64."""
    w = {p.name.rsplit("mlp.", 1)[1]: p.asnumpy().astype(np.float64) for p in moe.trainable_params()}
    B, S, D = x.shape
    T, X, k = B * S, moe.n_experts, moe.top_k
    xt = x.reshape(T, D).astype(np.float64)
    scores = np_scores(moe, x)
    choice = np_choice(moe, scores)  # (T, k)
    top = np.take_along_axis(scores, choice, 1)  # the gates are the unbiased scores
    gates = (top / top.sum(1, keepdims=True) if moe.norm_topk else top) * moe.routed_scale
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
    if moe.aux_per_sequence:  # DeepSeek-V3's eqs. 17-20, sequence by sequence
        shares = scores / scores.sum(1, keepdims=True)
        aux = 0.0
        for b in range(B):
            rows = np.s_[b * S : (b + 1) * S]
            f = X / (k * S) * np.bincount(choice[rows].reshape(-1), minlength=X)
            aux += np.sum(f * shares[rows].mean(0)) / B
    else:
        routed = np.bincount(choice.reshape(-1), minlength=X) / (T * k)
        aux = X * np.sum(routed * scores.mean(0))
    return y.reshape(B, S, D), dropped, aux


DEEPSEEK = (
    "model.n_experts=8",
    "model.moe_router=sigmoid",
    "model.moe_score_bias=true",
    "model.moe_groups=4",
    "model.moe_topk_groups=2",
    "model.moe_routed_scale=2.5",
)


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
        # DeepSeek-V3's router: a choice bias, the best 2 of 4 groups of 2, scaled gates
        (*DEEPSEEK, "model.moe_shared_experts=1"),
        (*DEEPSEEK, "model.moe_norm_topk=false", "model.moe_capacity_factor=0.5"),
    ],
)
def test_moe_forward_equals_a_loop_over_tokens_and_experts(overrides):
    moe, _, _ = _moe(*overrides)
    if moe.has_bias:  # large enough to change which experts win
        moe.score_bias.set_data(Tensor(_x((moe.n_experts,), 5, 0.5)))
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


@pytest.mark.parametrize("overrides", [(), (*DEEPSEEK, "model.moe_aux_per_sequence=true")])
def test_load_balance_gradient_is_the_weight_times_d_aux(overrides):
    """The router's gradient with the aux loss minus without it equals weight * d aux / d router (central finite
    differences of the NumPy aux in float64): Switch's over the micro-batch, DeepSeek-V3's per sequence."""
    moe, _, _ = _moe(*overrides)
    moe.router.weight.set_data(Tensor(_x(moe.router.weight.shape, 7, 0.3)))
    x = _x((2, 16, 128))
    dy = Tensor(_x((2, 16, 128), 1))
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


def test_the_balance_update_moves_each_bias_toward_the_mean_load():
    """DeepSeek-V3's update: the loads counted over a step's micro-batches (NumPy's choices), then every bias up by
    the rate where its expert's load is under the block's mean, down where over; the counts start again."""
    moe, model, cfg = _moe(*DEEPSEEK, "model.moe_bias_update_rate=0.01")
    moe.router.weight.set_data(Tensor(_x(moe.router.weight.shape, 7, 1.0)))
    bias = _x((moe.n_experts,), 5, 0.05)
    moe.score_bias.set_data(Tensor(bias))
    loads = np.zeros(moe.n_experts)
    for seed in (0, 1):  # two micro-batches of one step
        x = _x((2, 16, 128), seed)
        moe(Tensor(x))
        loads += np.bincount(np_choice(moe, np_scores(moe, x)).reshape(-1), minlength=moe.n_experts)
    np.testing.assert_array_equal(moe.load.asnumpy(), loads)
    assert loads.min() < loads.mean() < loads.max()  # unbalanced: the update has work to do
    ExpertBalance(cfg, model, Ranks(1)).after_step()
    np.testing.assert_allclose(moe.score_bias.asnumpy(), bias + 0.01 * np.sign(loads.mean() - loads), atol=1e-7)
    assert not moe.load.asnumpy().any()


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
        (["model=moe-tiny", "parallel.tp=2", "parallel.etp=3"], "parallel.etp", "must divide parallel.tp = 2"),
        (["model=moe-tiny", "parallel.tp=2", "parallel.sp=true", "parallel.etp=1"], "parallel.etp", "ep > 1"),
        (  # ETP 1 takes each tp rank's own tokens: sequence parallelism
            ["model=moe-tiny", "parallel.tp=2", "parallel.etp=1", "parallel.dp_shard=2", "parallel.ep=2"],
            "parallel.etp",
            "parallel.sp=true",
        ),
        (  # the experts' ranks, etp apart, must tile the dp_shard x cp x tp block
            ["model=moe-tiny", "parallel.tp=2", "parallel.sp=true", "parallel.etp=1", "parallel.ep=4"],
            "parallel.ep",
            "must divide dp_shard * cp * tp = 2",
        ),
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


SP = ["parallel.dp_shard=2", "parallel.tp=2", "parallel.sp=true"]


@pytest.mark.parametrize(
    "layout, field, fix",
    [
        (["parallel.dp_shard=2"], "parallel.ep", "parallel.ep = parallel.dp_shard = 2"),  # experts FSDP-sharded
        ([*SP, "parallel.ep=4", "parallel.etp=1"], "parallel.ep", "parallel.ep = parallel.dp_shard = 2"),  # folded
        ([*SP, "parallel.ep=2", "parallel.etp=1"], "parallel.etp", "parallel.etp = parallel.tp = 2"),  # whole
    ],
)
def test_expert_layouts_the_core_does_not_train_are_estimated_not_run(layout, field, fix):
    """Valid (the estimates answer for them: Megatron's MoE parallel folding among them), refused by the trainer
    (``check_runnable``: exit 2 from core.train) naming the field and the value it trains."""
    from core.config.rules import check_runnable

    cfg = load_config(["model=moe-tiny", *layout])
    with pytest.raises(ConfigError) as info:
        check_runnable(cfg)
    assert info.value.field == field and fix in str(info.value) and "estimated" in str(info.value)
    check_runnable(load_config(["model=moe-tiny", "parallel.dp_shard=2", "parallel.ep=2", "parallel.tp=2"]))


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
