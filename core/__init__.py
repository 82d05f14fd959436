"""The training core: a compact MindSpore trainer for GPT-style models in which every run is a bounded trial.

The packages, in import order (a package imports only those before it; tests/unit/test_architecture.py checks):

    config/      the schema of a trial, its rules, composing overrides, the generated ``--help``
    runtime/     how this process runs: MindSpore settings, graphs and their cache, cluster environment, kernels
    data/        token files, the embedded corpus, seeded batches (NumPy only)
    model/       the GPT, its MoE blocks and fused loss; unaware of parallelism
    parallel/    the mesh and each technique on it: TP+SP, CP, EP, FSDP/HSDP, PP, gradient sync
    optim/       AdamW, Muon, the learning-rate schedule
    memory/      the memory estimate, recompute, activation SWAP, the RSS probe
    perf/        the step-time model: a config's step on a cluster, predicted (no MindSpore)
    ckpt/        safetensors checkpoints, single-file and sharded, written atomically
    trial/       the trial contract: exit codes, the summary, the watchdog, the multi-rank supervisor
    training/    the model made parallel, the step, the loop of one rank

Entry points: ``train.py`` (``python -m core.train``, one trial), ``reference_rate.py`` (the machine's MFU
denominator) and ``sharded_checkpoint.py`` (consolidate a sharded checkpoint). docs/architecture.md has the map.
"""
