"""Fused CPU kernels (``cpu_kernels.cc``) as MindSpore custom ops, for the part of a step that is many passes over
every parameter: the clipping norm and the AdamW update.

On CPU, MindSpore 2.10 runs each element-wise step as a kernel of its own, per parameter: the global norm was a
Square and two ReduceSums per gradient, clipping a Mul, the update a decay kernel and ApplyAdam; 190 kernels on
model=small's 39 parameters, each a full pass over memory with its own launch and a runtime cost of its own
(benchmarks/RESULTS.md, "core/runtime/kernels/__init__.py"). Here the norm is one kernel over all gradients and the
update one kernel over all parameters, which also applies the clipping coefficient as it reads each gradient
(benchmarks/RESULTS.md, "Fused optimizer kernels and warm starts").

    use_cpu_kernels(device, setting)   whether this process runs them (``execution.cpu_kernels``)
    set_threads(n)                     threads each kernel may use (``core.runtime.settings.configure``)
    sum_of_squares(tensors, weights)   -> (1,) float32: sum_i weights[i] * sum(tensors[i] ** 2)
    adamw(...)                         AdamW over many parameters at once, in place

They are MindSpore ``ops.Custom`` ops of type "aot": the C++ file is built at install time into the extension
module ``core.runtime.kernels._cpu_kernels`` (pyproject.toml), which MindSpore loads by path. ``adamw`` writes its
parameters and states in place through the data pointers it is given, which MindSpore does not know of: it is
correct because nothing else in the update graph reads them after it, and the graph returns its output so that it
is never pruned (tests/unit/test_kernels.py checks both modes against NumPy).
"""

from __future__ import annotations

import functools
import importlib.util
import logging

import mindspore as ms
from mindspore import ops

MODULE = "core.runtime.kernels._cpu_kernels"
log = logging.getLogger("core.runtime.kernels")


def use_cpu_kernels(device: str, setting: bool | None) -> bool:
    """CPU workaround: MindSpore's CPU backend runs the optimizer's element-wise steps as one kernel per parameter
    and step (module docstring); on an accelerator its fused kernels are the right ones and these cannot run (they
    read host memory). ``setting``: ``execution.cpu_kernels`` (None: on for CPU when the extension was built; the
    install builds it where a C++ compiler is found and goes on without it, as MindSpore's kernels compute the same
    update)."""
    if device != "CPU" or setting is False:
        return False
    if library_path() is not None:
        return True
    why = (
        f"the extension {MODULE} is not built (pip builds it when a C++ compiler is on the PATH: reinstall "
        "with one, pip install -e .)"
    )
    if setting:
        raise RuntimeError(f"execution.cpu_kernels=true, but {why}; or set execution.cpu_kernels=null or false")
    log.warning("execution.cpu_kernels: %s; the optimizer runs MindSpore's own kernels", why)
    return False


@functools.cache
def library_path() -> str | None:
    """The built extension's file (what MindSpore's AOT loader opens), or None when it was not built."""
    spec = importlib.util.find_spec(MODULE)
    return None if spec is None else spec.origin


def set_threads(n: int) -> None:
    """Let each kernel use ``n`` threads, the calling one included (the rank's share of the cores)."""
    import core.runtime.kernels._cpu_kernels as lib  # function-level: optional, absent where nothing built it

    lib.set_threads(int(n))


@functools.cache
def _op(symbol: str) -> ops.Custom:
    # One (1,) float32 output whatever the inputs: the norm's sum, or the update's token.
    return ops.Custom(f"{library_path()}:{symbol}", out_shape=_one, out_dtype=_float32, func_type="aot")


def _one(*shapes):
    return (1,)


def _float32(*dtypes):
    return ms.float32


def sum_of_squares(tensors: tuple, weights):
    """(1,) float32: sum_i weights[i] * sum(tensors[i] ** 2) in one pass, accumulated in float64. ``weights``: an
    (n,) float32 Tensor (a constant of the graph). Not differentiable (no bprop): for gradients' norms."""
    return _op("msar_sum_squares")(weights, *tensors)


def adamw(params: tuple, grads: tuple, m: tuple, v: tuple, decays, lr, eps, decay, scale, betas):
    """AdamW on every parameter at once, in place: with g = scale * grad,

        m <- beta1 m + (1 - beta1) g,   v <- beta2 v + (1 - beta2) g^2,
        p <- p (1 - decay * decays_i) - lr m / (sqrt(v) + eps)

    ``lr`` and ``eps`` are Adam's with the bias corrections folded in (``core.optim.adamw.fold_bias_correction``),
    ``decay`` = lr * weight_decay, ``scale`` the clipping and averaging factor (0-d float32 Tensors); ``decays``
    (n,) and ``betas`` (2,) float32 Tensors. Returns a (1,) token that the calling graph must return or depend on."""
    return _op("msar_adamw")(lr, eps, decay, scale, betas, decays, *params, *grads, *m, *v)
