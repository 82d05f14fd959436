"""The optimizer the trainer drives: routes each parameter to AdamW or Muon and updates them all in one graph.

Why one compiled graph: in PyNative every op is a separate dispatch, and Muon's update is ~60 ops per matrix.
``mindspore.jit`` over the whole tuple of parameters, gradients and states traces them once; what changes every
step (lr and the folded bias corrections) enters as graph inputs, so it never recompiles. Under jit Muon's step ran
several times faster than in PyNative (benchmarks/RESULTS.md, "core/optim/optimizer.py"). Muon's cost is the
Newton–Schulz matmuls, independent of the batch size. ``jit=False`` keeps the PyNative path for debugging. Call
``step`` from Python, not inside another ``mindspore.jit`` function (it builds host scalars).

Sharded parameters (FSDP, TP): each rank updates its shards and their states. AdamW is element-wise and needs
nothing more; Muon needs whole matrices (``core.optim.sharded_muon``).

``step(grads, lr, scale)`` multiplies every gradient by ``scale`` (clipping and averaging: ``GradientSync``) as it
reads it, so that the scaled gradients are never written out. ``fused=True`` (on CPU, ``execution.cpu_kernels``)
updates all AdamW parameters with one kernel (``core.runtime.kernels.adamw``) instead of two per parameter. Which
rule and decay a parameter gets is decided from its full, 1-process shape (``placements``), never from the shape
of a flat shard.
"""

from __future__ import annotations

from collections.abc import Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from core.config import OptimConfig
from core.optim.adamw import adamw_update, decays, fold_bias_correction
from core.optim.muon import muon_apply, muon_lookahead, muon_update, rms_match_scale
from core.optim.param_rules import uses_muon
from core.optim.sharded_muon import ShardedNewtonSchulz
from core.runtime import kernels
from core.runtime.graphs import compiled_if, each, pick

STEP_KEY = "step"  # state_dict key of the number of updates taken so far (0-d int64 array)


class _UpdateCell(nn.Cell):
    """Holds the parameters and their optimizer states; ``construct`` applies one update to all of them.

    Everything that differs between parameters (which rule, decay or not, Muon's RMS scale) is a Python constant
    here, one ``rule`` per parameter, so that ``each`` specialises the update of each parameter at trace
    time into straight-line graph code. ``first``/``second``: each parameter's AdamW m and v, or its Muon momentum
    (twice; Muon reads only the first). ``sharded_ns``: Muon's Newton–Schulz over sharded matrices (all of them at
    once), or None. ``fused``: the AdamW parameters updated by one ``core.runtime.kernels.adamw`` call.
    """

    def __init__(
        self,
        params: list[Parameter],
        *,
        kinds: list[str],
        states: list[Parameter],
        slots: list[tuple[int, ...]],
        full_shapes: list[tuple[int, ...]],
        cfg: OptimConfig,
        sharded_ns: nn.Cell | None = None,
        fused: bool = False,
    ):
        super().__init__()
        self.params = ParameterTuple(params)
        self.first = ParameterTuple([states[s[0]] for s in slots])
        self.second = ParameterTuple([states[s[-1]] for s in slots])
        self.rules = tuple(
            (k, decays(s), rms_match_scale(s) if k == "muon" else 1.0) for s, k in zip(full_shapes, kinds, strict=True)
        )
        self.hyper = (cfg.beta1, cfg.beta2, cfg.momentum, cfg.ns_steps, cfg.weight_decay, sharded_ns is not None)
        self.muon = tuple(i for i, k in enumerate(kinds) if k == "muon")
        self.muon_params = ParameterTuple([params[i] for i in self.muon])
        self.muon_momenta = ParameterTuple([states[slots[i][0]] for i in self.muon])
        self.muon_rules = tuple(self.rules[i] for i in self.muon)
        self.sharded_ns = sharded_ns
        self.fused = fused and any(k == "adamw" for k in kinds)
        if self.fused:  # the AdamW parameters leave the per-parameter rules: kernels.adamw updates them all
            self.adam = tuple(i for i, k in enumerate(kinds) if k == "adamw")
            self.adam_params = ParameterTuple([params[i] for i in self.adam])
            self.adam_m = ParameterTuple([states[slots[i][0]] for i in self.adam])
            self.adam_v = ParameterTuple([states[slots[i][1]] for i in self.adam])
            self.adam_decays = Tensor(np.array([float(self.rules[i][1]) for i in self.adam], np.float32))
            self.betas = Tensor(np.array([cfg.beta1, cfg.beta2], np.float32))
            self.rules = tuple(("fused", *r[1:]) if r[0] == "adamw" else r for r in self.rules)

    def construct(self, grads, lr, adam_lr, adam_eps, adam_decay, scale):
        if self.sharded_ns is not None and self.muon:
            looks = each(ops.partial(_lookahead, self.hyper, scale), pick(grads, self.muon), self.muon_momenta)
            each(
                ops.partial(_apply_orthogonal, self.hyper, lr),
                self.muon_params,
                self.sharded_ns(looks),
                self.muon_rules,
            )
        each(
            ops.partial(_update, self.hyper, lr, adam_lr, adam_eps, adam_decay, scale),
            self.rules,
            self.params,
            grads,
            self.first,
            self.second,
        )
        if self.fused:  # its output returned, so that the graph keeps the kernel (its updates are side effects)
            return kernels.adamw(
                self.adam_params,
                pick(grads, self.adam),
                self.adam_m,
                self.adam_v,
                self.adam_decays,
                adam_lr,
                adam_eps,
                adam_decay,
                scale,
                self.betas,
            )
        return lr  # a compiled graph needs an output; the updates are side effects


def _update(hyper, lr, adam_lr, adam_eps, adam_decay, scale, rule, p, g, first, second):
    """One parameter's update in place (Muon's, unless its matrices are sharded: ``_apply_orthogonal``; none for
    the parameters of the fused AdamW kernel)."""
    beta1, beta2, momentum, ns_steps, muon_wd, sharded = hyper
    kind, decay, rms_scale = rule
    if kind == "muon":
        if not sharded:
            muon_update(p, g * scale, first, lr, momentum, muon_wd if decay else 0.0, rms_scale, ns_steps)
    elif kind == "adamw":
        adamw_update(p, g * scale, first, second, adam_lr, adam_eps, adam_decay if decay else None, beta1, beta2)
    return lr


def _lookahead(hyper, scale, g, momentum_buffer):
    return muon_lookahead(g * scale, momentum_buffer, hyper[2])


def _apply_orthogonal(hyper, lr, p, orth, rule):
    _, decay, scale = rule
    muon_apply(p, orth, lr, hyper[4] if decay else 0.0, scale)
    return lr


class Optimizer:
    """AdamW, or Muon for hidden matrices plus AdamW for the rest, over a fixed list of named parameters.

    ``route`` maps each parameter name to "adamw" or "muon". States are float32 and named
    ``adamw.m.<param>``, ``adamw.v.<param>``, ``muon.momentum.<param>``; ``state_dict()`` adds ``step``.
    """

    def __init__(
        self,
        named_params: Sequence[tuple[str, Parameter]],
        cfg: OptimConfig,
        *,
        jit: bool = True,
        placements: dict | None = None,
        group=None,
        fused: bool = False,
    ):
        """``placements``: name -> ``core.parallel.placement.Placement`` of sharded parameters (their full shapes
        decide the rule); ``group``: the ranks that hold one copy of the model, over which Muon gathers; ``fused``:
        AdamW by ``core.runtime.kernels.adamw`` (CPU only; float32 parameters)."""
        seen: set[int] = set()
        for name, p in named_params:
            if id(p) in seen:  # a tied weight listed twice would be updated twice per step
                raise ValueError(f"parameter {name!r} appears twice in named_params; list shared weights once")
            seen.add(id(p))
        self.cfg = cfg
        self.names = [name for name, _ in named_params]
        params = [p for _, p in named_params]
        full = [
            tuple(placements[name].full_shape) if placements and name in placements else tuple(p.shape)
            for name, p in named_params
        ]
        self.route = {
            name: ("muon" if cfg.name == "muon" and uses_muon(name, shape) else "adamw")
            for (name, _), shape in zip(named_params, full, strict=True)
        }
        kinds = [self.route[name] for name in self.names]
        sharded_ns = None
        if group is not None and group.size > 1 and "muon" in kinds:
            sharded_ns = ShardedNewtonSchulz(
                [placements[n] for n, k in zip(self.names, kinds, strict=True) if k == "muon"], group, cfg.ns_steps
            )

        self._state_names: list[str] = []
        states: list[Parameter] = []
        slots: list[tuple[int, ...]] = []
        for name, p, kind in zip(self.names, params, kinds, strict=True):
            labels = ("muon.momentum",) if kind == "muon" else ("adamw.m", "adamw.v")
            slots.append(tuple(range(len(states), len(states) + len(labels))))
            for label in labels:
                key = f"{label}.{name}"
                self._state_names.append(key)
                states.append(Parameter(Tensor(np.zeros(p.shape, np.float32)), name=key, requires_grad=False))
        self._states = states
        if fused and any(p.dtype != ms.float32 for p in params):
            raise ValueError("fused AdamW (core.runtime.kernels.adamw) updates float32 parameters only")
        self._cell = _UpdateCell(
            params,
            kinds=kinds,
            states=states,
            slots=slots,
            full_shapes=full,
            cfg=cfg,
            sharded_ns=sharded_ns,
            fused=fused,
        )
        self._update = compiled_if(jit, source=True)(self._cell)
        self.step_count = 0

    def step(self, grads: Sequence[Tensor], lr: float, scale: Tensor | float = 1.0) -> None:
        """Apply one update with learning rate ``lr`` to the gradients ``grads * scale`` (``scale``: a 0-d float32
        Tensor or a float, e.g. ``GradientSync``'s clipping factor); ``grads`` in the order of ``named_params``."""
        if len(grads) != len(self.names):
            raise ValueError(f"got {len(grads)} gradients for {len(self.names)} parameters")
        self.step_count += 1
        # Scalars computed on the host in float64, passed as float32 Tensors: graph inputs, so no recompiles.
        scalars = (lr, *fold_bias_correction(lr, self.step_count, self.cfg))
        scale = scale if isinstance(scale, Tensor) else Tensor(scale, ms.float32)
        # mutable: the gradients are variables of the graph. A plain tuple of Tensors is taken as constants, so
        # MindSpore warns (printing every gradient) and may recompile when their values change.
        self._update(ms.mutable(tuple(grads)), *(Tensor(x, ms.float32) for x in scalars), scale)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Flat copies of every state plus ``step``: ready for a safetensors file."""
        out = {key: state.asnumpy().copy() for key, state in zip(self._state_names, self._states, strict=True)}
        out[STEP_KEY] = np.array(self.step_count, dtype=np.int64)
        return out

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        """Restore exactly what ``state_dict`` saved; refuses missing, unexpected or mis-shaped entries."""
        expected = set(self._state_names) | {STEP_KEY}
        missing, unexpected = expected - set(d), set(d) - expected
        if missing or unexpected:
            raise KeyError(
                f"optimizer state mismatch: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
            )
        for key, state in zip(self._state_names, self._states, strict=True):
            arr = np.asarray(d[key])
            if tuple(arr.shape) != tuple(state.shape):
                raise ValueError(f"{key}: saved shape {arr.shape} != parameter shape {tuple(state.shape)}")
            # ops.assign copies into the Parameter's existing storage. set_data (and load_param_into_net, which
            # uses it) swaps the storage, and a graph compiled earlier keeps updating the old one: measured.
            ops.assign(state, Tensor(arr.astype(np.float32, copy=True)))
        self.step_count = int(np.asarray(d[STEP_KEY]))


def build_optimizer(
    named_params: Sequence[tuple[str, Parameter]],
    cfg: OptimConfig,
    *,
    jit: bool = True,
    placements: dict | None = None,
    group=None,
    fused: bool = False,
) -> Optimizer:
    """The optimizer ``cfg.name`` asks for over ``named_params`` (see ``Optimizer``)."""
    return Optimizer(named_params, cfg, jit=jit, placements=placements, group=group, fused=fused)


__all__ = ["Optimizer", "build_optimizer", "STEP_KEY"]
