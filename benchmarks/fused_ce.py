"""Peak memory and time of one forward+backward of the lm_head + cross-entropy, three ways (core/model/loss.py).

    .venv/bin/python benchmarks/fused_ce.py [--n 4096 --v 32768 --d 256 --repeats 3 --rounds 3 --modes jit,pynative]

All variants compute the same thing: loss = mean CE(hidden @ W^T, labels) and its gradients w.r.t. hidden (N, D)
and W (V, D), W playing the lm_head / tied embedding:
- naive:   logits = hidden @ W^T by ordinary ops, then naive_cross_entropy (log_softmax + gather, autodiff).
- chunked: logits = hidden @ W^T by ordinary ops, then cross_entropy (hand-written chunked backward).
- fused:   linear_cross_entropy(hidden, W, labels): the (N, V) logits never exist.

Each variant runs in its own fresh process. Peak memory is the kernel's figure, not an estimate: VmHWM from
/proc/self/status minus the VmRSS just before the measured steps, after clearing VmHWM (writing 5 to
/proc/self/clear_refs). MindSpore's CPU memory pool never hands memory back (RSS stays flat after `del` and
runtime.empty_cache) and reuses it, so a full-size warm-up step would hide the step's memory (the rise reads 0),
and even a one-chunk warm-up would hide the fused version's chunk buffers. So the warm-up runs one chunk of
tokens at V=64 (kernels, thread pools and oneDNN set up, every buffer tiny), the inputs are made resident, and
then the measured steps run. Under jit the first full-size step also compiles its graph, and what compilation
leaves resident (it grows with the number of chunks, the loop being unrolled) is part of the peak; the "graph"
column measures that share with a twin process running the same variant at the same N and chunk rows but V=64,
where the data is negligible. Time: median over rounds of the median of `repeats` steps after the first (the
first also pays page faults for the pool's new memory); rounds alternate the variants, because other jobs share
this machine's cores and their load drifts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import git_commit

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("naive", "chunked", "fused")
TWIN_V = 64


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    raise KeyError(key)


def worker(variant: str, mode: str, n: int, v: int, d: int, repeats: int, chunk_size: int | None) -> dict:
    sys.path.insert(0, str(ROOT))
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor
    from mindspore.common.api import _pynative_executor

    from core.model.loss import cross_entropy, linear_cross_entropy, naive_cross_entropy, rows_per_chunk

    matmul_nt = ms.ops.MatMul(transpose_b=True)

    def naive(h, w, y):
        return naive_cross_entropy(matmul_nt(h, w), y)

    def chunked(h, w, y):
        return cross_entropy(matmul_nt(h, w), y, chunk_size=chunk_size)

    def fused(h, w, y):
        return linear_cross_entropy(h, w, y, chunk_size=chunk_size)

    fn = {"naive": naive, "chunked": chunked, "fused": fused}[variant]
    step = ms.value_and_grad(fn, grad_position=(0, 1))
    if mode == "jit":
        step = ms.jit(step)

    def inputs(rows, vocab, seed):
        rng = np.random.default_rng(seed)
        # Logits of std ~1 (hidden ~ N(0, 1), W ~ N(0, 1/D)): a realistic, well-conditioned softmax.
        h = Tensor(rng.standard_normal((rows, d), dtype=np.float32))
        w = Tensor((rng.standard_normal((vocab, d), dtype=np.float32) / np.sqrt(d)).astype(np.float32))
        y = Tensor(rng.integers(0, vocab, rows).astype(np.int32))
        return h, w, y

    def run(h, w, y):
        loss, (gh, gw) = step(h, w, y)
        loss = float(loss.asnumpy())  # waits for the whole step
        _pynative_executor.sync()
        return loss, gh, gw

    # Warm-up on a problem too small to leave anything in the memory pool that the measured step could reuse.
    run(*inputs(rows_per_chunk(n, v, chunk_size), TWIN_V, 1))
    h, w, y = inputs(n, v, 0)
    float((h.sum() + w.sum()).asnumpy())  # inputs resident before baseline
    _pynative_executor.sync()

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_mib("VmRSS")
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        loss, gh, gw = run(h, w, y)
        times.append(time.perf_counter() - t0)
        del gh, gw
    peak = _status_mib("VmHWM") - base
    return {
        "variant": variant,
        "mode": mode,
        "peak_mib": peak,
        "time_s": statistics.median(times[1:]),
        "first_s": times[0],
        "loss": loss,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="tokens")
    ap.add_argument("--v", type=int, default=32768, help="vocabulary")
    ap.add_argument("--d", type=int, default=256, help="hidden size")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps after the first, per process")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per variant, alternating variants")
    ap.add_argument("--chunk-size", type=int, default=None, help="rows per chunk (default: core.model.loss)")
    ap.add_argument("--modes", default="jit,pynative")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        variant, mode = args.worker.split(":")
        print(json.dumps(worker(variant, mode, args.n, args.v, args.d, args.repeats, args.chunk_size)))
        sys.stdout.flush()
        os._exit(0)

    def run_worker(variant, mode, v, chunk):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            f"{variant}:{mode}",
            "--n",
            str(args.n),
            "--v",
            str(v),
            "--d",
            str(args.d),
            "--repeats",
            str(args.repeats),
            "--chunk-size",
            str(chunk),
        ]
        with tempfile.TemporaryDirectory() as cwd:  # MindSpore writes rank_0/ on failure
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if proc.returncode != 0 or not lines:
            print(f"{variant}/{mode} V={v} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
            return None
        return json.loads(lines[-1])

    sys.path.insert(0, str(ROOT))
    from core.model.loss import rows_per_chunk

    chunk = rows_per_chunk(args.n, args.v, args.chunk_size)
    modes, variants = args.modes.split(","), args.variants.split(",")
    results = {}  # (mode, variant) -> list of runs
    twins = {}
    for mode in modes:
        for variant in variants:
            twins[mode, variant] = run_worker(variant, mode, TWIN_V, chunk)
        for _ in range(args.rounds):
            for variant in variants:
                r = run_worker(variant, mode, args.v, chunk)
                if r:
                    results.setdefault((mode, variant), []).append(r)
                print(f"done {variant}/{mode}", file=sys.stderr)

    rows = []
    for (mode, variant), runs in results.items():
        twin = twins.get((mode, variant))
        rows.append(
            {
                "mode": mode,
                "variant": variant,
                "peak_mib": max(r["peak_mib"] for r in runs),
                "graph_mib": twin["peak_mib"] if twin else float("nan"),
                "time_s": statistics.median(r["time_s"] for r in runs),
                "times": [r["time_s"] for r in runs],
                "loss": runs[0]["loss"],
            }
        )

    print(
        f"\n### Fused cross-entropy: N={args.n} tokens, V={args.v}, D={args.d}, fp32, CPU "
        f"({os.cpu_count()} cores), forward+backward w.r.t. hidden and W\n"
    )
    print(
        f"date {datetime.date.today().isoformat()}, commit {git_commit()}, {chunk} rows per chunk, "
        f"time = median over {args.rounds} rounds of the median of {args.repeats} steps\n"
    )
    print(
        "| mode | variant | peak rise (MiB) | vs naive | of which graph (MiB) | time (s) | vs naive | "
        "time per round (s) | loss |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        ref = next((r for r in rows if r["mode"] == mode and r["variant"] == "naive"), None)
        for r in (r for r in rows if r["mode"] == mode):
            mem_ratio = f"{r['peak_mib'] / ref['peak_mib']:.3f}" if ref and ref["peak_mib"] > 0 else "-"
            time_ratio = f"{r['time_s'] / ref['time_s']:.2f}" if ref else "-"
            per_round = ", ".join(f"{t:.2f}" for t in r["times"])
            print(
                f"| {mode} | {r['variant']} | {r['peak_mib']:.0f} | {mem_ratio} | {r['graph_mib']:.0f} | "
                f"{r['time_s']:.3f} | {time_ratio} | {per_round} | {r['loss']:.6f} |"
            )


if __name__ == "__main__":
    main()
