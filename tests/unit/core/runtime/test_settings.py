"""core.runtime.settings and graphs: each rank's share of the cores, and the config's settings reaching MindSpore."""

import os
from unittest import mock

import pytest

from core.config import load_config
from core.runtime import graphs, settings


@pytest.mark.parametrize(
    "device, affinity, cpu_count, local_ranks, threads",
    [
        ("CPU", 2, 2, 1, None),  # one rank, all cores: MindSpore's own default stands
        ("CPU", 2, 2, 2, 1),  # two ranks share two cores
        ("CPU", 8, 8, 2, 4),
        ("CPU", 1, 2, 1, 1),  # pinned to one core (the agent's --workers, taskset): one thread
        ("CPU", 1, 2, 2, 1),  # never fewer than one
        ("Ascend", 1, 8, 2, None),  # kernels run on the device
    ],
)
def test_cpu_share(monkeypatch, device, affinity, cpu_count, local_ranks, threads):
    monkeypatch.setattr(settings.os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.setattr(settings.os, "cpu_count", lambda: cpu_count)
    assert settings._cpu_share(device, local_ranks) == threads


@pytest.fixture
def mindspore_calls(monkeypatch):
    """What configure asks of MindSpore, recorded instead of applied (each may be set once per process)."""
    calls = []
    ms = settings.ms
    monkeypatch.setattr(ms.device_context.cpu.op_tuning, "threads_num", lambda n: calls.append(("threads", n)))
    monkeypatch.setattr(ms.runtime, "dispatch_threads_num", lambda n: calls.append(("dispatch", n)))
    monkeypatch.setattr(ms, "set_context", lambda **kw: calls.append(("context", kw)))
    monkeypatch.setattr(ms, "jit", lambda fn, **kw: (fn, kw))
    with mock.patch.dict(os.environ):  # configure sets the host pipeline's variable; restored whole
        yield calls
    graphs.set_options()


def test_configure_applies_every_setting(mindspore_calls):
    cfg = load_config(
        [
            "execution.jit_level=O1",
            "execution.capture_mode=bytecode",
            "execution.kernel_threads=3",
            "execution.dispatch_threads=2",
            "execution.graph_kernel_fusion=true",
        ]
    )
    settings.configure(cfg, local_ranks=1)
    assert mindspore_calls == [("context", {"enable_graph_kernel": True}), ("threads", 3), ("dispatch", 2)]
    assert graphs.jit(len) == (len, {"jit_level": "O1", "capture_mode": "bytecode"})


def test_defaults_leave_mindspore_alone_on_one_rank(mindspore_calls, monkeypatch):
    monkeypatch.setattr(settings, "_cpu_share", lambda device, ranks: None)
    settings.configure(load_config([]), local_ranks=1)
    assert mindspore_calls == []
    assert graphs.jit(len) == (len, {"jit_level": "O0", "capture_mode": "ast"})


@pytest.mark.parametrize(
    "overrides, blocking",
    [
        ([], "1"),  # CPU: the host pipeline's waits would spin a core
        (["execution.host_pipeline=true"], "0"),
        (["device=Ascend"], "0"),  # an accelerator keeps MindSpore's default
        (["device=Ascend", "execution.host_pipeline=false"], "1"),
    ],
)
def test_host_pipeline_is_off_on_cpu_unless_asked_for(mindspore_calls, overrides, blocking):
    settings.configure(load_config(overrides), local_ranks=1)
    assert os.environ[settings.HOST_BLOCKING_ENV] == blocking


def test_compiled_if_jits_only_in_jit_mode(mindspore_calls):
    assert graphs.compiled_if(True)(len) == (len, {})  # mindspore.jit, with the options configure set (none)
    assert graphs.compiled_if(False)(len) is len  # PyNative: the function itself


def _scaled_sum(scale, x, w):
    return (x * w).sum() * scale


@pytest.mark.parametrize("compiled", [True, False], ids=["jit", "pynative"])
def test_each_and_pick_match_the_comprehensions_they_replace(compiled):
    """Map over tensors with per-element constants and a shared tensor, and selection by index: the same values
    as the plain Python they stand for, compiled and op by op."""
    import mindspore as ms
    import numpy as np

    rng = np.random.default_rng(0)
    xs = tuple(rng.standard_normal(shape).astype(np.float32) for shape in [(3, 4), (5,), (2, 2, 2)])
    weights, indices = (0.5, -2.0, 3.0), (2, 0)

    def graph(tensors, scale):
        return graphs.each(ms.ops.partial(_scaled_sum, scale), tensors, weights), graphs.pick(tensors, indices)

    fn = ms.jit(graph) if compiled else graph
    sums, picked = fn(ms.mutable(tuple(ms.Tensor(x) for x in xs)), ms.Tensor(1.5, ms.float32))
    want = [float((x.astype(np.float64) * w).sum() * 1.5) for x, w in zip(xs, weights, strict=True)]
    assert [float(s.asnumpy()) for s in sums] == pytest.approx(want, rel=1e-5)
    assert [p.asnumpy().tolist() for p in picked] == [xs[i].tolist() for i in indices]


def test_graphs_spelled_with_each_are_parsed_from_source_whatever_the_capture_mode(mindspore_calls):
    settings.configure(load_config(["execution.capture_mode=bytecode", "execution.jit_level=O1"]), local_ranks=1)
    assert graphs.jit(len) == (len, {"jit_level": "O1", "capture_mode": "bytecode"})
    assert graphs.jit(len, source=True) == (len, {"jit_level": "O1", "capture_mode": "ast"})
    assert graphs.compiled_if(True, source=True)(len) == (len, {"jit_level": "O1", "capture_mode": "ast"})
