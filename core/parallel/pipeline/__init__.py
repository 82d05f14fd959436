"""Pipeline parallelism: schedules as per-rank action lists (pure Python, checked by a simulator), the model cut
into stages, and the step that runs a schedule over this rank's stages.

    schedules.py   GPipe, 1F1B, interleaved 1F1B as action lists; simulate() checks and times them (no MindSpore)
    stages.py      Stage (a GPT-shaped range of blocks), split_stages, StageFns (a stage's compiled functions)
    runtime.py     PipelineStep: this rank's actions over its stages, with send/recv between ranks
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "runtime": ["PipelineStep"],
        "schedules": [
            "SCHEDULES",
            "Action",
            "ScheduleError",
            "Timing",
            "build",
            "compute_order",
            "simulate",
            "stage_layers",
        ],
        "stages": ["Stage", "StageFns", "accumulate", "split_stages"],
    },
)
