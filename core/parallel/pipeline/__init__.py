"""Pipeline parallelism: schedules as per-rank action lists (pure Python, checked by a simulator), the model cut
into stages, and the step that runs a schedule over this rank's stages.

    actions.py     Action: one step of a rank's list (a computation, or a message sent or received)
    schedules.py   GPipe, 1F1B, interleaved 1F1B as action lists; simulate() checks and times them (no MindSpore)
    mpipe.py       MPipe Transpose: 1F1B's lists with stage 0's preprocess run by the other ranks in their warm-up
    stages.py      Stage (a GPT-shaped range of blocks), split_stages, StageFns (a stage's compiled functions)
    runtime.py     PipelineStep: this rank's actions over its stages, with send/recv between ranks
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "actions": ["Action"],
        "mpipe": ["OVERFLOWS", "STEPS", "owner", "transpose"],
        "runtime": ["PipelineStep"],
        "schedules": [
            "SCHEDULES",
            "ScheduleError",
            "Timing",
            "build",
            "compute_order",
            "simulate",
            "stage_layers",
        ],
        "stages": ["Stage", "StageFns", "accumulate", "preprocess", "split_stages"],
    },
)
