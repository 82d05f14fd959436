"""How this process runs: MindSpore's settings, compiled graphs and their cache, the environment a rank starts
with, the project's cache directories, the machine's reference rate, the fused CPU kernels, the profiler.

    native_env.py      variables MindSpore's native libraries read as they load (before ``import mindspore``)
    cluster.py         this process's place in a multi-rank trial, from its environment (no MindSpore)
    ranks.py           run_ranks: a script on N ranks of a cluster on this host, as msrun starts them
    settings.py        configure(cfg): threads, fusion, host queues, fused kernels, jit options
    graphs.py          jit / compiled_if / each / pick: every graph a trial compiles goes through here
    compile_cache.py   graphs saved by a finished trial, loaded by the next with the same code and graph config
    kernels/           the fused CPU kernels (clipping norm, AdamW) as MindSpore custom ops
    reference_rate.py  MFU's fixed denominator: the machine's best fp32 matmul rate, measured once
    profiling.py       the share of a step spent in collectives, from MindSpore's profiler
    cache_dirs.py      where the project keeps what it computes once (corpus, reference rate, graphs)
    files.py           write_atomic: files that appear whole or not at all

Names are imported on first use (``lazy_loader``): ``import core.runtime.native_env`` must not load MindSpore,
which reads that module's variables as it loads.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "cache_dirs": ["cache_root", "compile_cache_root"],
        "cluster": ["CONFIG_ENV", "START_ENV", "is_worker_process", "node_ranks", "rank_from_env"],
        "compile_cache": ["CompileCache", "graph_key"],
        "files": ["atomic_path", "write_atomic"],
        "graphs": ["compiled_if", "each", "jit", "pick"],
        "ranks": ["run_ranks"],
        "reference_rate": ["reference_flops_per_sec"],
        "settings": ["HOST_BLOCKING_ENV", "configure", "cpu_kernels", "set_host_pipeline"],
    },
)
