"""The collective micro-benchmark behind ``cpu-local``'s link: all-reduces of a range of sizes between ranks of
this host, timed inside a compiled graph as a trial runs them, and the ring model's two numbers fitted to them.

    measure(n)          {bytes: seconds per all-reduce} on n ranks (``core.runtime.ranks``: scheduler + workers
                        as msrun starts them; each rank with a trial's settings, its share of the cores)
    ring_fit(times, n)  (latency per ring step, bandwidth): least squares of 2(n-1) alpha + 2(n-1)/n B / bw over the
                        sizes, each size weighted by its own time (small messages pin alpha, large ones bw)

On CPU every collective of the core is an all-reduce (``core.perf.device.composes_collectives``), so the
all-reduce is the one to time. Measured, not fitted to trials: fitted from whole dp_replicate=2 and tp=2 trials the
link absorbed everything else those trials did differently from the 1-process run (2.5 ms per ring step where this
measures ~0.2 ms), and moved with each trial's noise (benchmarks/RESULTS.md, "Step-time model").

``python -m core.perf.collectives <sizes...>`` is the worker each rank runs; rank 0 prints the timings as JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from core.config import load_config
from core.runtime.ranks import run_ranks

SIZES = tuple(4 << e for e in range(10, 24, 2))  # 4 KiB ... 16 MiB: a TP activation ... a layer's gradients
CHAIN = 4  # all-reduces per graph call, so that a call's launch is shared
REPEATS = 7
MARK = "ALL_REDUCE_SECONDS "


def measure(n: int, sizes: tuple[int, ...] = SIZES, timeout: float = 600, attempts: int = 2) -> dict[int, float]:
    """{bytes: median seconds of one all-reduce} over ``n`` ranks of this host.

    A rank killed by a signal is run again, all ranks, up to ``attempts`` times in all, saying so on stderr: once in
    some thousand runs a rank of MindSpore's CPU collectives dies of a fatal error that the next run does not
    repeat (CI, db37eb6; not reproduced in 11 runs after). A rank that exits with a code fails at once."""
    for attempt in range(1, attempts + 1):
        with tempfile.TemporaryDirectory() as tmp:
            ranks = run_ranks(n, "-m", "core.perf.collectives", *map(str, sizes), log_dir=Path(tmp), timeout=timeout)
        failed = [(rank, code, log) for rank, (code, log) in enumerate(ranks) if code != 0]
        if not failed:
            break
        rank, code, log = failed[0]
        what = f"collective micro-benchmark: rank {rank} of {n} exited {code}"
        if code > 0 or attempt == attempts:
            # the summary both before and after the log's tail, so that a caller cutting either end keeps it
            raise SystemExit(f"{what}:\n{log[-2000:]}\n{what}")
        print(f"{what} (signal {-code}), attempt {attempt} of {attempts}; running it again", file=sys.stderr)
    line = next(ln for ln in ranks[0][1].splitlines() if ln.startswith(MARK))
    return {int(k): v for k, v in json.loads(line[len(MARK) :]).items()}


def ring_fit(times: dict[int, float], n: int) -> tuple[float, float]:
    """(seconds per ring step, bytes/s per rank and direction) of the ring all-reduce that fits ``times`` best
    (``core.perf.links.all_reduce``'s formula), each row divided by its measured time."""
    rows = np.array([[2 * (n - 1), 2 * (n - 1) / n * b] for b in times]) / np.array(list(times.values()))[:, None]
    (latency, inverse_bandwidth), _ = nnls(rows, np.ones(len(times)))
    return latency, (1 / inverse_bandwidth if inverse_bandwidth > 0 else float("inf"))


def _worker(sizes: list[int]) -> None:
    """One rank: all-reduces of each size over all ranks, CHAIN to a compiled graph, REPEATS calls; rank 0 prints
    the median per all-reduce."""
    # function-level: MindSpore only in the ranks; the model (core.perf) must import without it
    import mindspore as ms

    from core.parallel.comm import all_reduce, init_distributed, new_group  # function-level: loads MindSpore
    from core.runtime.settings import configure  # function-level: loads MindSpore

    info = init_distributed()
    configure(load_config([]), info.world_size)  # a trial's threads and host queues, for this many ranks
    op = all_reduce(new_group(tuple(range(info.world_size)), info.rank, info.world_size))

    @ms.jit
    def chain(x):
        for _ in range(CHAIN):
            x = op(x) * 0.5  # stays finite, and each all-reduce waits for the one before
        return x

    seconds = {}
    for nbytes in sizes:
        x = ms.Tensor(np.ones(nbytes // 4, np.float32))
        chain(x).asnumpy()  # compiles
        runs = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            chain(x).asnumpy()
            runs.append(time.perf_counter() - start)
        seconds[nbytes] = statistics.median(runs) / CHAIN
    if info.rank == 0:
        print(MARK + json.dumps(seconds), flush=True)


if __name__ == "__main__":
    _worker([int(s) for s in sys.argv[1:]])
