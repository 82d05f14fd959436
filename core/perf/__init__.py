"""The step-time model: what one optimizer step of a config costs on a cluster, predicted from the model's shapes,
the layout and the devices' profile, beside the memory model (``core.memory``). No MindSpore anywhere here (the micro-benchmark's ranks import it, in their own processes): the
agent ranks whole search spaces with it, and ``python -m core.perf`` answers for a 1,024-device config in well
under a second.

    device.py    a cluster profile as rates: matmul FLOP/s by shape, memory bytes/s, links per tier
    links.py     which tier a process group crosses, and the alpha-beta cost of each collective
    work.py      one micro-batch through one block on one rank: matmuls, memory-bound work, exposed collectives
    step.py      estimate_step(cfg): stages timed, the pipeline schedule simulated, data parallelism, optimizer;
                 fits_device(cfg): the memory model's peak against the device's memory, untimed;
                 planned_config(overrides): a config on its cluster's device
    least_recompute.py the fewest blocks each pipeline stage recomputes for every rank to fit its device
    micro.py     cpu-local's micro-benchmarks (under a minute, no trial): what a study needs to plan, cached
    fit.py       the profile's numbers fitted to measured steps: the calibration's trials, a study's runs
    calibrate.py ``python -m core.perf calibrate``: cpu-local fitted on this machine's trials and cached
    collectives.py the all-reduce micro-benchmark the calibration measures cpu-local's link with, and its ring fit
"""

from core.perf.step import StepEstimate, check_devices, estimate_step, fits_device, planned_config

__all__ = ["StepEstimate", "check_devices", "estimate_step", "fits_device", "planned_config"]
