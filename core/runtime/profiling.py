"""Where a step's time goes, from MindSpore's own profiler (``training.profile=true``).

The trainer profiles the steps after the first two (compilation would dominate them; the runtime's thread-count
search, docs/mindspore-cpu.md "Threads and speed", still slows the steps after them, so profile a run long enough
for its steady state) into ``<trial.dir>/profile/rank_<r>/``: MindSpore writes per-op timestamps and a
``trace_view.json`` for Perfetto there. From its per-op-type totals this module takes the time in collectives;
``comm_time_share`` is that over the profiled steps' wall time. A collective's time includes waiting for the
slowest peer, so the share is what communication costs this rank, load imbalance included.
"""

from __future__ import annotations

import csv
from pathlib import Path

# Op types of MindSpore's collectives (graph kernels and their host names).
COMM_OPS = (
    "AllReduce",
    "AllGather",
    "ReduceScatter",
    "Broadcast",
    "AlltoAll",
    "AllToAll",
    "Send",
    "Receive",
    "Recv",
    "HcomAllReduce",
    "HcomAllGather",
    "HcomReduceScatter",
    "HcomBroadcast",
)


class StepProfiler:
    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self._prof = None

    def start(self) -> None:
        # function-level: MindSpore only when a trial profiles (the agent reads op_type_ms without it)
        import mindspore as ms
        from mindspore.profiler import ProfilerActivity

        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._prof = ms.profiler.profile(
            activities=[ProfilerActivity.CPU], on_trace_ready=ms.profiler.tensorboard_trace_handler(str(self.out_dir))
        )
        self._prof.start()

    def stop(self) -> dict[str, float]:
        """Stop, let MindSpore write its analysis, and return milliseconds per op type."""
        if self._prof is None:
            return {}
        self._prof.stop()
        self._prof = None
        return op_type_ms(self.out_dir)


def op_type_ms(out_dir: Path) -> dict[str, float]:
    """{op type: total ms} from the newest ``cpu_op_type_info_*.csv`` under ``out_dir``."""
    files = sorted(Path(out_dir).rglob("cpu_op_type_info_*.csv"), key=lambda p: p.stat().st_mtime)
    if not files:
        return {}
    with open(files[-1]) as f:
        return {row["op_type"]: float(row["total_compute_time"]) for row in csv.DictReader(f)}


def comm_time_share(op_ms: dict[str, float], seconds: float) -> float | None:
    """Share of ``seconds`` of wall time spent in collectives, or None when nothing was profiled."""
    if not op_ms or seconds <= 0:
        return None
    return min(1.0, sum(ms for op, ms in op_ms.items() if op in COMM_OPS) / 1000.0 / seconds)
