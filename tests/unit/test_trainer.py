"""The trainer's CPU core split: each rank gets its share of the cores this process may use."""

import pytest

from core import trainer


@pytest.mark.parametrize("device, affinity, cpu_count, local_ranks, threads", [
    ("CPU", 2, 2, 1, None),      # one rank, all cores: MindSpore's own default stands
    ("CPU", 2, 2, 2, 1),         # two ranks share two cores
    ("CPU", 8, 8, 2, 4),
    ("CPU", 1, 2, 1, 1),         # pinned to one core (the agent's --workers, taskset): one thread
    ("CPU", 1, 2, 2, 1),         # never fewer than one
    ("Ascend", 1, 8, 2, None),   # kernels run on the device
])
def test_share_cpu_cores(monkeypatch, device, affinity, cpu_count, local_ranks, threads):
    calls = []
    monkeypatch.setattr(trainer.os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.setattr(trainer.os, "cpu_count", lambda: cpu_count)
    monkeypatch.setattr(trainer.ms.device_context.cpu.op_tuning, "threads_num", calls.append)
    trainer._share_cpu_cores(device, local_ranks)
    assert calls == ([] if threads is None else [threads])
