"""The micro-benchmarks behind ``cpu-local``: each number of the profile measured on its own, in seconds, without a
training trial. They make the step-time model answer on a machine nobody has calibrated; the agent runs them itself
when a study needs the model (``autoresearch.search.prior``), and ``python -m core.perf calibrate`` fits on its
trials what they cannot see (``core.perf.calibrate``).

    cached()    this machine's numbers: from the cache, else measured (about half a minute on 2 vCPUs) and cached
    measure()   every number below, and what measuring cost in device-seconds

    launch_overhead_us          the GPT's forward and backward of one 8-token sequence on one thread, compiled
                                (``mindspore.jit``): almost no arithmetic, so its time is the host's kernel launches,
                                counted per block forward as the step-time model counts them (``core.perf.work``: a
                                block's backward launches twice its forward; the embedding and the final norm one
                                block more)
    pynative_overhead_us        the same in PyNative, less the compiled launches: Python's dispatch of each op
    host_cores                  how many ranks' host work this machine runs at full speed at once: the compiled
                                benchmark above alone, then one copy per core at once (copies x alone / side by
                                side). MindSpore runs threads of its own beside a rank's kernel thread: copies of a
                                plain NumPy loop ran at 1.7-2.0x on the 2-vCPU machine where trials side by side
                                ran at 1.26x (benchmarks/RESULTS.md, "On this machine"), so the ranks' own work
    memory_bandwidth_gbps       an element-wise add of 2^24 floats under MindSpore, the fastest of 20 rounds (two
                                arrays read, one written)
    intra_node_bandwidth_gbps,  the all-reduce micro-benchmark between two ranks (``core.perf.collectives``), one
    intra_node_latency_us       run, the ring model fitted to it, the bandwidth as a rank with a core of its own
                                reaches it
    matmul_efficiency           1.0 by definition: the peak is this machine's measured matmul rate (its reference
                                rate, ``core.runtime.reference_rate``), so a large matmul reaches it; what a trial
                                does beyond its matmuls (element-wise ops, its optimizer) is what runs fit

What a micro-benchmark cannot see, a trial shows: a peer that shares the cores arrives late at each collective (the
calibration's tp=2 trial measures several times the micro-benchmark's latency per ring step), and a step does more
per micro-batch than a bare forward and backward. A study refits those from its own runs (the step-time model's
factors, ``autoresearch.search.prior``); ``python -m core.perf calibrate`` fits them on its trials. MindSpore runs
only in the child processes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from core.perf import collectives
from core.perf.device import GBPS, MICRO_METHOD, US, micro_calibration, micro_path, store
from core.runtime.reference_rate import reference_flops_per_sec

MICRO_MODEL = "small"  # the dense Llama block the launch micro-benchmark times (configs/model/small.yaml)
MICRO_TOKENS = 8  # one sequence of this many tokens: launches, not arithmetic
ROUNDS = 10
LINK_RANKS = 2

_BANDWIDTH = """
import time, numpy as np, mindspore as ms
ms.set_device("CPU")
n = 1 << 24
x, y = ms.Tensor(np.ones(n, np.float32)), ms.Tensor(np.ones(n, np.float32))
best = float("inf")
for _ in range(20):
    t = time.perf_counter()
    z = x + y
    float(z[0].asnumpy())  # waits for the add
    best = min(best, time.perf_counter() - t)
print(3 * 4 * n / best / 1e9)
"""


def memory_bandwidth_gbps() -> float:
    """GB/s of an element-wise add under MindSpore, in a child process (``_BANDWIDTH``)."""
    done = subprocess.run([sys.executable, "-c", _BANDWIDTH], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def block_launches() -> dict[str, float]:
    """Host microseconds per block forward: compiled launches (``launch_overhead_us``) and PyNative's dispatch on
    top of them (``pynative_overhead_us``), from the GPT's forward and backward at ``MICRO_TOKENS`` tokens; and the
    compiled step's median seconds (``step``), for ``host_cores``."""
    out = _result(_worker("jit", "pynative"))
    units = 3 * (out["layers"] + 1)  # each block once forward, twice backward; embedding and final norm as one more
    launch = out["jit"] / units
    return {
        "launch_overhead_us": launch / US,
        "pynative_overhead_us": max(out["pynative"] / units - launch, 0.0) / US,
        "step": out["jit"],
    }


def host_cores(alone: float) -> float:
    """Copies of the compiled launch benchmark this machine runs at full speed at once: copies x ``alone`` (one
    copy's median seconds, ``block_launches``) / side by side, between 1 and the cores this process may use."""
    n = len(os.sched_getaffinity(0))
    if n < 2:
        return 1.0
    procs = [_worker("jit") for _ in range(n)]
    together = statistics.median(_result(p)["jit"] for p in procs)
    return min(max(n * alone / together, 1.0), float(n))


def link(cores: float) -> dict[str, float]:
    """The all-reduce micro-benchmark between ``LINK_RANKS`` ranks, one run: the ring's latency per step and its
    bandwidth as a rank with a core of its own reaches it (``core.perf.device`` shares it when ranks outnumber
    ``cores``)."""
    times = collectives.measure(LINK_RANKS)
    latency, bandwidth = collectives.ring_fit(times, LINK_RANKS)
    return {
        "intra_node_bandwidth_gbps": bandwidth * max(1.0, LINK_RANKS / cores) / GBPS,
        "intra_node_latency_us": latency / US,
    }


def measure() -> dict:
    """Every micro-benchmarked number of the profile (``numbers``) and what measuring cost: ``seconds`` of wall
    time and ``device_seconds``, each benchmark's seconds times the processes it ran (what a study's ledger counts)."""
    start, device = time.monotonic(), 0.0

    def timed(processes: int, fn, *args):
        nonlocal device
        began = time.monotonic()
        out = fn(*args)
        device += processes * (time.monotonic() - began)
        return out

    launches = timed(1, block_launches)
    cores = timed(len(os.sched_getaffinity(0)), host_cores, launches.pop("step"))
    numbers = {
        **launches,
        "host_cores": cores,
        "memory_bandwidth_gbps": timed(1, memory_bandwidth_gbps),
        **timed(LINK_RANKS, link, cores),
        "matmul_efficiency": 1.0,
    }
    return {"numbers": numbers, "seconds": time.monotonic() - start, "device_seconds": device}


def cached(force: bool = False) -> tuple[dict, bool]:
    """This machine's micro-benchmarks (``measure``'s entry): from the cache, else measured now and cached; and
    whether they were measured now. The reference rate (the peak they are relative to) is measured first when
    this machine has none."""
    entry = None if force else micro_calibration()
    if entry is not None:
        return entry, False
    reference_flops_per_sec("CPU")
    entry = {**measure(), "method": MICRO_METHOD, "date": time.strftime("%Y-%m-%d")}
    store(micro_path(), entry)
    return entry, True


def summary(entry: dict) -> str:
    """The measured numbers in one line, for the agent's notes."""
    n = entry["numbers"]
    return (
        f"launches {n['launch_overhead_us']:.0f} us per block (+{n['pynative_overhead_us']:.0f} in PyNative), "
        f"{n['host_cores']:.2f} host cores, memory {n['memory_bandwidth_gbps']:.1f} GB/s, link "
        f"{n['intra_node_bandwidth_gbps']:.2f} GB/s + {n['intra_node_latency_us']:.0f} us per step"
    )


def _worker(*modes: str) -> subprocess.Popen:
    """``_launches`` in a child (MindSpore compiles only source it can read from a file)."""
    return subprocess.Popen(
        [sys.executable, "-m", "core.perf.micro", *modes], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"launch micro-benchmark failed (exit {proc.returncode}): {err.strip()[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _launches(modes: list[str]) -> None:
    """The child of ``block_launches`` and ``host_cores``: prints {"layers": L, <mode>: seconds, ...}, the median
    seconds of the GPT's forward and backward of one ``MICRO_TOKENS``-token sequence, compiled (``jit``) and in
    PyNative (``pynative``), with a rank's share of the cores (``configure``: one thread each on this host)."""
    from core.runtime import native_env  # function-level: before MindSpore loads in this child, as a trial's does

    native_env.apply()
    # function-level: MindSpore only in the child; the model (core.perf) must import without it
    import mindspore as ms
    import numpy as np

    from core.config import load_config  # function-level: Hydra only in the child
    from core.model.gpt import GPT  # function-level: loads MindSpore
    from core.runtime.settings import configure  # function-level: loads MindSpore

    cfg = load_config([f"model={MICRO_MODEL}", f"training.seq_len={MICRO_TOKENS}", "training.global_batch_size=1"])
    configure(cfg, len(os.sched_getaffinity(0)))
    model = GPT(cfg.model)
    tokens = ms.Tensor(np.zeros((1, MICRO_TOKENS), np.int32))

    def loss(t):
        return model(t).sum()

    grad = ms.value_and_grad(loss, None, model.trainable_params())
    steps = {"jit": ms.jit(grad), "pynative": grad}
    out = {"layers": cfg.model.n_layers}
    for mode in modes:
        for _ in range(3):
            steps[mode](tokens)[0].asnumpy()  # compiles, warms
        runs = []
        for _ in range(ROUNDS):
            began = time.perf_counter()
            steps[mode](tokens)[0].asnumpy()
            runs.append(time.perf_counter() - began)
        out[mode] = statistics.median(runs)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    _launches(sys.argv[1:])
