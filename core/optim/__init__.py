"""Optimizers (AdamW, Muon), learning-rate schedules and gradient clipping for the training core.

The trainer uses exactly:
    opt = build_optimizer(model_named_params, cfg.optim)   # [(name, Parameter)], OptimConfig
    grads, norm = clip_grad_norm(grads, cfg.optim.grad_clip)
    opt.step(grads, lr_at(step, cfg.optim, total_steps))
    opt.state_dict() / opt.load_state_dict(d)              # flat {name: np.ndarray} for safetensors
"""

from core.optim.adamw import adamw_update, decays, fold_bias_correction
from core.optim.clip import clip_grad_norm, clip_grad_norm_jit, global_grad_norm
from core.optim.muon import ADAMW_NAME_PATTERNS, NS_COEFFS, newton_schulz, rms_match_scale, uses_muon
from core.optim.optimizer import STEP_KEY, Optimizer, build_optimizer
from core.optim.schedule import lr_at

__all__ = [
    "ADAMW_NAME_PATTERNS", "NS_COEFFS", "STEP_KEY", "Optimizer", "adamw_update", "build_optimizer", "clip_grad_norm",
    "clip_grad_norm_jit", "decays", "fold_bias_correction", "global_grad_norm", "lr_at", "newton_schulz",
    "rms_match_scale", "uses_muon",
]
