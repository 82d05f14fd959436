"""GPT model against an independent NumPy float64 re-implementation: forward, gradients, init, names, counts."""

import math

import mindspore as ms
import numpy as np
import pytest

from core.config import ModelConfig
from core.model import GPT, count_params, flops_per_token

# Tiny, with grouped-query attention (2 query heads per KV head) and S < max_seq_len so the tables get sliced.
# init_std is large so that softmax, SiLU and RoPE are exercised well away from their linear regime.
B, S = 2, 8


def tiny_cfg(tie: bool, **kw) -> ModelConfig:
    base = dict(
        vocab_size=48,
        n_layers=2,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        ffn_hidden=40,
        max_seq_len=16,
        rope_theta=100.0,
        init_std=0.3,
        tie_embeddings=tie,
    )
    base.update(kw)
    return ModelConfig(**base)


def weights_of(model) -> dict:
    return {name: p.asnumpy().astype(np.float64) for name, p in model.parameters_and_names()}


def tokens_of(cfg, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (B, S)).astype(np.int32)


# ---------------------------------------------------------------------------------------------------------------
# NumPy float64 reference, written from the papers' definitions rather than from the MindSpore code's structure.


def np_rmsnorm(x, w, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


def np_rope(x, theta):
    """x (S, E): pair (x_j, x_{j+E/2}) as the complex number x_j + i x_{j+E/2}, times exp(i pos theta^(-2j/E))."""
    seq, e = x.shape
    angle = np.arange(seq)[:, None] * theta ** (-2.0 * np.arange(e // 2)[None, :] / e)
    z = (x[:, : e // 2] + 1j * x[:, e // 2 :]) * np.exp(1j * angle)
    return np.concatenate([z.real, z.imag], axis=-1)


def np_softmax_attend(q, k, v, scale, future):
    s = np.where(future, -np.inf, q @ k.T * scale)
    a = np.exp(s - s.max(-1, keepdims=True))
    return a / a.sum(-1, keepdims=True) @ v


def np_mla(W, p, cfg, h, future):
    """DeepSeek-V2's multi-head latent attention (its eqs. 9-19), head by head: q and kv from their latents, the
    rotary key part shared by the heads."""
    H, N, R, V, L = cfg.n_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if cfg.q_lora_rank:
        c_q = np_rmsnorm(h @ W[p + "attn.wq_a.weight"].T, W[p + "attn.q_a_norm.weight"], cfg.norm_eps)
        q = c_q @ W[p + "attn.wq_b.weight"].T
    else:
        q = h @ W[p + "attn.wq.weight"].T
    kv_a = h @ W[p + "attn.wkv_a.weight"].T
    kv = np_rmsnorm(kv_a[..., :L], W[p + "attn.kv_a_norm.weight"], cfg.norm_eps) @ W[p + "attn.wkv_b.weight"].T
    out = np.zeros(h.shape[:2] + (H * V,))
    for b in range(h.shape[0]):
        k_rope = np_rope(kv_a[b, :, L:], cfg.rope_theta)  # (S, R): every head's
        for j in range(H):
            qj, kvj = q[b, :, j * (N + R) : (j + 1) * (N + R)], kv[b, :, j * (N + V) : (j + 1) * (N + V)]
            qh = np.concatenate([qj[:, :N], np_rope(qj[:, N:], cfg.rope_theta)], -1)
            kh = np.concatenate([kvj[:, :N], k_rope], -1)
            out[b, :, j * V : (j + 1) * V] = np_softmax_attend(qh, kh, kvj[:, N:], (N + R) ** -0.5, future)
    return out @ W[p + "attn.wo.weight"].T


def np_hidden(W, cfg, tokens):
    E, H, K = cfg.head_size, cfg.n_heads, cfg.n_kv_heads
    x = W["embed.weight"][tokens]  # (B, S, D)
    seq = tokens.shape[1]
    future = np.triu(np.ones((seq, seq), bool), k=1)
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        h = np_rmsnorm(x, W[p + "attn_norm.weight"], cfg.norm_eps)
        if cfg.mla:
            x = x + np_mla(W, p, cfg, h, future)
            h = np_rmsnorm(x, W[p + "mlp_norm.weight"], cfg.norm_eps)
            g = h @ W[p + "mlp.w_gate.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * (h @ W[p + "mlp.w_up.weight"].T)) @ W[p + "mlp.w_down.weight"].T
            continue
        q, k, v = (h @ W[p + f"attn.{n}.weight"].T for n in ("wq", "wk", "wv"))
        out = np.zeros_like(q)
        for b in range(tokens.shape[0]):
            for hq in range(H):
                hk = hq // (H // K)  # the KV head this query head's group shares
                qh = np_rope(q[b, :, hq * E : (hq + 1) * E], cfg.rope_theta)
                kh = np_rope(k[b, :, hk * E : (hk + 1) * E], cfg.rope_theta)
                s = np.where(future, -np.inf, qh @ kh.T / math.sqrt(E))
                a = np.exp(s - s.max(-1, keepdims=True))
                a /= a.sum(-1, keepdims=True)
                out[b, :, hq * E : (hq + 1) * E] = a @ v[b, :, hk * E : (hk + 1) * E]
        x = x + out @ W[p + "attn.wo.weight"].T
        h = np_rmsnorm(x, W[p + "mlp_norm.weight"], cfg.norm_eps)
        g = h @ W[p + "mlp.w_gate.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ W[p + "mlp.w_up.weight"].T)) @ W[p + "mlp.w_down.weight"].T
    return np_rmsnorm(x, W["norm.weight"], cfg.norm_eps)


def np_logits(W, cfg, tokens):
    head = W["embed.weight"] if cfg.tie_embeddings else W["lm_head.weight"]
    return np_hidden(W, cfg, tokens) @ head.T


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


# ---------------------------------------------------------------------------------------------------------------


# MLA (DeepSeek-V2/V3): with q's latent, and without it; value heads narrower than q/k heads
MLA = dict(attention="mla", n_kv_heads=4, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)
VARIANTS = {"gqa": {}, "mla": MLA | {"q_lora_rank": 10}, "mla-direct-q": MLA}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("tie", [True, False])
def test_forward_matches_numpy_float64(tie, variant):
    cfg = tiny_cfg(tie, **VARIANTS[variant])
    model = GPT(cfg, seed=3)
    W, tok = weights_of(model), tokens_of(cfg)
    hidden = model(ms.Tensor(tok)).asnumpy()
    logits = model.logits(ms.Tensor(tok)).asnumpy()
    assert hidden.shape == (B, S, cfg.d_model) and logits.shape == (B, S, cfg.vocab_size)
    assert rel_err(hidden, np_hidden(W, cfg, tok)) < 2e-5
    assert rel_err(logits, np_logits(W, cfg, tok)) < 2e-5


def test_head_weight_is_embedding_when_tied_else_lm_head():
    tied, untied = GPT(tiny_cfg(True)), GPT(tiny_cfg(False))
    assert tied.head_weight() is tied.embed.weight
    assert untied.head_weight() is untied.lm_head.weight
    assert untied.head_weight().shape == (48, 32)


def test_causal():
    cfg = tiny_cfg(False)
    model = GPT(cfg, seed=1)
    tok = tokens_of(cfg)
    base = model.logits(ms.Tensor(tok)).asnumpy()
    for t in (0, 3, S - 1):
        changed = tok.copy()
        changed[:, t] = (changed[:, t] + 1) % cfg.vocab_size
        out = model.logits(ms.Tensor(changed)).asnumpy()
        np.testing.assert_array_equal(out[:, :t], base[:, :t])  # the past never sees the future
        assert np.abs(out[:, t:] - base[:, t:]).max() > 1e-3  # and the change does propagate forward


def loss_and_grad_fn(model, R):
    params = model.trainable_params()

    def loss_fn(tokens):
        return (model.logits(tokens) * R).sum()

    return ms.value_and_grad(loss_fn, None, params), [p.name for p in params]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("tie", [True, False])
def test_gradients_match_float64_finite_differences(tie, variant):
    """MindSpore fp32 gradients of sum(logits * R) against central differences of the float64 NumPy model."""
    cfg = tiny_cfg(tie, n_layers=1, **VARIANTS[variant])
    model = GPT(cfg, seed=5)
    W, tok = weights_of(model), tokens_of(cfg)
    R = np.random.default_rng(9).standard_normal((B, S, cfg.vocab_size))
    loss, grads = loss_and_grad_fn(model, ms.Tensor(R, ms.float32))[0](ms.Tensor(tok))
    assert abs(float(loss) - float((np_logits(W, cfg, tok) * R).sum())) < 1e-4 * np.abs(R).sum()

    rng, h = np.random.default_rng(0), 1e-6
    for (name, _), g in zip(model.parameters_and_names(), grads, strict=True):
        g = g.asnumpy().astype(np.float64)
        for _ in range(3):
            idx = tuple(int(rng.integers(n)) for n in g.shape)
            if name == "embed.weight":  # pick a row that is actually looked up, so the gather's grad is tested
                idx = (int(tok[0, 0]),) + idx[1:]
            Wp, Wm = dict(W), dict(W)
            Wp[name], Wm[name] = W[name].copy(), W[name].copy()
            Wp[name][idx] += h
            Wm[name][idx] -= h
            fd = ((np_logits(Wp, cfg, tok) * R).sum() - (np_logits(Wm, cfg, tok) * R).sum()) / (2 * h)
            # fp32 forward/backward: error relative to this parameter's gradient scale, not to the entry
            # (measured <= 7e-7; the finite difference itself is good to ~1e-8 in float64).
            assert abs(g[idx] - fd) <= 1e-5 * np.abs(g).max(), (name, idx, g[idx], fd)


@pytest.fixture(scope="module")
def jit_setup():
    cfg = tiny_cfg(False)
    R = ms.Tensor(np.random.default_rng(2).standard_normal((B, S, cfg.vocab_size)), ms.float32)
    return cfg, R, ms.Tensor(tokens_of(cfg))


def _run(cfg, R, tok, recompute: bool, jit: bool):
    model = GPT(cfg, seed=11)
    if recompute:
        for block in model.layers:
            block.recompute()
    fn, _ = loss_and_grad_fn(model, R)
    loss, grads = (ms.jit(fn) if jit else fn)(tok)
    return float(loss), [g.asnumpy() for g in grads], model.logits(tok).asnumpy()


def test_jit_matches_pynative_and_recompute_changes_nothing(jit_setup):
    cfg, R, tok = jit_setup
    ref_loss, ref_grads, ref_logits = _run(cfg, R, tok, recompute=False, jit=False)
    for recompute, jit in ((False, True), (True, False), (True, True)):
        loss, grads, logits = _run(cfg, R, tok, recompute, jit)
        assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss), (recompute, jit)
        np.testing.assert_array_equal(logits, ref_logits)
        for g, r in zip(grads, ref_grads, strict=True):
            assert rel_err(g, r) < 1e-5, (recompute, jit)


def test_recompute_reruns_block_forward_in_pynative(monkeypatch):
    """Not only equal results: with block.recompute() the backward really re-runs each block's forward."""
    from core.model import layers

    calls = []
    original = layers.MLP.construct
    monkeypatch.setattr(layers.MLP, "construct", lambda self, x: calls.append(1) or original(self, x))
    cfg = tiny_cfg(True)
    tok = ms.Tensor(tokens_of(cfg))
    counts = []
    for recompute in (False, True):
        model = GPT(cfg)
        if recompute:
            for block in model.layers:
                block.recompute()
        calls.clear()
        ms.value_and_grad(lambda t, model=model: model(t).sum(), None, model.trainable_params())(tok)
        counts.append(len(calls))
    assert counts == [cfg.n_layers, 2 * cfg.n_layers]


def test_init_statistics_and_seeding():
    cfg = ModelConfig(
        vocab_size=512,
        n_layers=4,
        d_model=128,
        n_heads=4,
        n_kv_heads=2,
        ffn_hidden=256,
        max_seq_len=16,
        init_std=0.02,
        tie_embeddings=False,
    )
    model = GPT(cfg, seed=0)
    resid = cfg.init_std / math.sqrt(2 * cfg.n_layers)
    for name, w in weights_of(model).items():
        if name.endswith("norm.weight"):
            np.testing.assert_array_equal(w, 1.0)
            continue
        want = resid if name.endswith(("attn.wo.weight", "mlp.w_down.weight")) else cfg.init_std
        # >= 8192 samples each: the std estimate's relative standard error is below 0.8%.
        assert abs(w.std() / want - 1) < 0.04, name
        assert abs(w.mean()) < 4 * want / math.sqrt(w.size), name

    same, other = weights_of(GPT(cfg, seed=0)), weights_of(GPT(cfg, seed=1))
    ref = weights_of(model)
    for name in ref:
        np.testing.assert_array_equal(same[name], ref[name])
        if not name.endswith("norm.weight"):
            assert not np.array_equal(other[name], ref[name]), name
    # Each layer is seeded by its name, so the weights two configs share agree whatever else is built.
    tied = weights_of(GPT(ModelConfig(**{**cfg.__dict__, "tie_embeddings": True}), seed=0))
    for name, w in tied.items():
        np.testing.assert_array_equal(w, ref[name])


def expected_names(n_layers: int, tie: bool) -> list:
    names = ["embed.weight"]
    for i in range(n_layers):
        p = f"layers.{i}."
        names += [p + "attn_norm.weight"] + [p + f"attn.{w}.weight" for w in ("wq", "wk", "wv", "wo")]
        names += [p + "mlp_norm.weight"] + [p + f"mlp.{w}.weight" for w in ("w_gate", "w_up", "w_down")]
    return names + ["norm.weight"] + ([] if tie else ["lm_head.weight"])


@pytest.mark.parametrize("tie", [True, False])
def test_parameter_names_and_counts(tie):
    cfg = tiny_cfg(tie, n_layers=3)
    model = GPT(cfg)
    want = expected_names(3, tie)
    assert [n for n, _ in model.parameters_and_names()] == want
    assert [p.name for p in model.trainable_params()] == want
    assert len(model.layers) == 3

    D, V, F, E = cfg.d_model, cfg.vocab_size, cfg.ffn_hidden, cfg.head_size
    per_layer = D * E * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 3 * D * F + 2 * D
    closed = V * D + cfg.n_layers * per_layer + D + (0 if tie else V * D)
    assert count_params(model) == sum(p.size for p in model.trainable_params()) == closed

    # PaLM convention: 6 x (params used in matmuls: block matrices + output head) + 12 L S D.
    matmul = count_params(model) - V * D * (0 if tie else 1) - (2 * cfg.n_layers + 1) * D
    assert flops_per_token(cfg, 128) == 6 * matmul + 12 * cfg.n_layers * 128 * D


@pytest.mark.parametrize("jit", [False, True])
def test_rmsnorm_backward_matches_float64_finite_differences(jit):
    """RMSNormOp's gradients (over 2-D rows) against central differences of a float64 NumPy RMSNorm, every entry."""
    from core.model.layers import RMSNormOp

    rng, eps, h = np.random.default_rng(3), 1e-5, 1e-6
    x, w, R = rng.standard_normal((2, 3, 5)), rng.standard_normal(5), rng.standard_normal((2, 3, 5))

    def f(x, w):  # float64 reference: sum(R * x / sqrt(mean(x^2) + eps) * w)
        return float((R * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w).sum())

    def central(a, fn):
        out = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            ap, am = a.copy(), a.copy()
            ap[i] += h
            am[i] -= h
            out[i] = (fn(ap) - fn(am)) / (2 * h)
        return out

    op, Rt = RMSNormOp(eps), ms.Tensor(R, ms.float32)

    def loss(x, w):
        return (op(x, w) * Rt).sum()

    grad = ms.grad(loss, grad_position=(0, 1))
    gx, gw = (ms.jit(grad) if jit else grad)(ms.Tensor(x, ms.float32), ms.Tensor(w, ms.float32))
    np.testing.assert_allclose(gx.asnumpy(), central(x, lambda a: f(a, w)), atol=2e-5)
    np.testing.assert_allclose(gw.asnumpy(), central(w, lambda a: f(x, a)), atol=2e-5)


def np_max_logit(W, cfg, tok) -> float:
    """The largest scaled q k^T of a 1-block model over heads and causal pairs, in float64."""
    E, H, K = cfg.head_size, cfg.n_heads, cfg.n_kv_heads
    h = np_rmsnorm(W["embed.weight"][tok], W["layers.0.attn_norm.weight"], cfg.norm_eps)
    q, k = (h @ W[f"layers.0.attn.{n}.weight"].T for n in ("wq", "wk"))
    allowed = ~np.triu(np.ones((tok.shape[1],) * 2, bool), k=1)
    best = -np.inf
    for b in range(tok.shape[0]):
        for j in range(H):
            qh = np_rope(q[b, :, j * E : (j + 1) * E], cfg.rope_theta)
            kh = np_rope(k[b, :, (j // (H // K)) * E : (j // (H // K) + 1) * E], cfg.rope_theta)
            best = max(best, float((qh @ kh.T / math.sqrt(E))[allowed].max()))
    return best


def test_the_tracked_attention_logit_is_the_largest_a_query_attends_to():
    """training.max_attention_logit's measure: the largest scaled q k^T over heads and causal pairs, kept as the
    maximum over calls (micro-batches) until read."""
    from core.model.layers import CausalAttention

    cfg = tiny_cfg(False, n_layers=1)
    model = GPT(cfg, seed=4)
    (core,) = [c for _, c in model.cells_and_names() if isinstance(c, CausalAttention)]
    core.track("layers.0")
    W, first, second = weights_of(model), tokens_of(cfg, 0), tokens_of(cfg, 1)
    model(ms.Tensor(first))
    assert float(core.max_logit.asnumpy()) == pytest.approx(np_max_logit(W, cfg, first), rel=1e-5)
    model(ms.Tensor(second))
    want = max(np_max_logit(W, cfg, first), np_max_logit(W, cfg, second))
    assert float(core.max_logit.asnumpy()) == pytest.approx(want, rel=1e-5)
