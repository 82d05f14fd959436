"""How long sharded Muon's update graph (``core.optim.sharded_muon.ShardedNewtonSchulz``) takes to compile and to
run, in one process: the measurements behind its spelling (issue "Performance I", start-up).

    .venv/bin/python benchmarks/sharded_muon_compile.py [--tp 2] [--fsdp 2] [--rank 0] [--runs 30]

The graph of one rank of a tp x fsdp group over model=tiny's 21 hidden matrices, compiled with ``mindspore.jit``
after a small warm-up graph (the first compile of a process pays one-time costs). The group's all-gather and
reduce-scatter are stood in for by ops of the same shapes (tile, sum over ranks), so no cluster is needed and
the timings are the graph's own. Prints the first call (compile + run), the median of ``--runs`` later calls, and
a checksum of the outputs, which must not change with the spelling. Run it at two commits to compare them.
"""

from __future__ import annotations

import argparse
import time

from provenance import cpu_info, git_commit

# model=tiny's hidden matrices per block (wq, wk, wv, wo, w_gate, w_up, w_down) and their tensor-parallel split dim
BLOCK = [
    ((128, 128), 0),
    ((64, 128), 0),
    ((64, 128), 0),
    ((128, 128), 1),
    ((512, 128), 0),
    ((512, 128), 0),
    ((128, 512), 1),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--fsdp", type=int, default=2)
    ap.add_argument("--rank", type=int, default=0, help="the group index whose graph is compiled (owners differ)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()

    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops

    from core.optim import sharded_muon
    from core.parallel.placement import Placement

    n = args.tp * args.fsdp

    class Gather(nn.Cell):  # (L,) -> (n * L,), as the all-gather's output
        def construct(self, x):
            return ops.tile(x, (n,))

    class ScatterSum(nn.Cell):  # (n * L,) -> (L,): the sum over ranks the reduce-scatter keeps a share of
        def construct(self, x):
            return x.reshape(n, -1).sum(0)

    sharded_muon.comm.all_gather = lambda group, dim: Gather()
    sharded_muon.comm.reduce_scatter = lambda group, dim: ScatterSum()

    class Group:
        size, index = n, args.rank

    split = args.tp > 1
    places = [
        Placement(shape, dim if split else None, args.tp if split else 1, 0, args.fsdp, 0)
        for shape, dim in BLOCK * args.layers
    ]
    cell = sharded_muon.ShardedNewtonSchulz(places, Group, ns_steps=5)
    rng = np.random.default_rng(0)
    looks = ms.mutable(tuple(ms.Tensor(rng.standard_normal(p.stored_shape).astype(np.float32)) for p in places))

    class Graph(nn.Cell):
        def __init__(self):
            super().__init__()
            self.cell = cell

        @ms.jit
        def construct(self, xs):
            return self.cell(xs)

    class Warm(nn.Cell):
        @ms.jit
        def construct(self, x):
            return x * 2

    Warm()(ms.Tensor([1.0])).asnumpy()
    graph = Graph()
    t = time.perf_counter()
    out = graph(looks)
    checksum = float(sum(o.asnumpy().astype(np.float64).sum() for o in out))
    first = time.perf_counter() - t
    times = []
    for _ in range(args.runs):
        t = time.perf_counter()
        graph(looks)[0].asnumpy()
        times.append(time.perf_counter() - t)
    print(f"commit {git_commit()}; {cpu_info()}")
    print(
        f"tp={args.tp} fsdp={args.fsdp} rank={args.rank}, {len(places)} matrices: first call {first:.2f} s, "
        f"then median {1000 * float(np.median(times)):.1f} ms; checksum {checksum!r}"
    )


if __name__ == "__main__":
    main()
