"""Optimizers (AdamW, Muon) and the learning-rate schedule. The trainer uses exactly:

    opt = build_optimizer(named_params, cfg.optim, placements=..., group=..., fused=...)  # [(name, Parameter)]
    opt.step(grads, lr_at(step, cfg.optim, total_steps), scale)   # scale: GradientSync's clip and average factor
    opt.state_dict() / opt.load_state_dict(d)                      # flat {name: np.ndarray} for safetensors

    optimizer.py      Optimizer: routes each parameter to AdamW or Muon and updates all of them in one graph
    adamw.py          the AdamW update and its folded bias corrections
    muon.py           Newton-Schulz orthogonalisation and the Muon update
    sharded_muon.py   Muon over FSDP/TP shards: each matrix gathered whole on one owner rank
    param_rules.py    which rule each parameter takes, by name and full shape (no MindSpore)
    lr_schedule.py    lr_at(step): warm-up, then cosine, linear, WSD or constant (no MindSpore)

Names are imported on first use (``lazy_loader``): the memory estimate reads ``param_rules`` without MindSpore.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "adamw": ["adamw_update", "decays", "fold_bias_correction"],
        "lr_schedule": ["lr_at"],
        "muon": ["NS_COEFFS", "newton_schulz", "rms_match_scale"],
        "optimizer": ["STEP_KEY", "Optimizer", "build_optimizer"],
        "param_rules": ["ADAMW_NAME_PATTERNS", "uses_muon"],
    },
)
