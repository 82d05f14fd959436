"""Training on one rank: the model made parallel, the step, the loop. MindSpore throughout; the supervisor and the
agent never import this package.

    parallelize.py   parallelize(model, dims, cfg): the model becomes this rank's part of the mesh, with its recompute
    step.py          the step: micro-batches -> loss and gradients (accumulated, pipelined, or segment by segment)
    trainer.py       Trainer(cfg): the loop with its budgets, NaN checks, validation and checkpoints
    stats.py         what a trial measures about its steps beyond loss and time
    ranks.py         what every rank must agree on, reduced on the host
    balance.py       DeepSeek-V3's bias-based expert balancing, applied after each step
"""
