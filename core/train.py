"""``python -m core.train [overrides]``: one bounded trial.

    python -m core.train model=tiny trial.max_steps=20
    python -m core.train model=small optim=muon parallel.dp_replicate=2 trial.dir=trials/manual/dp2
    python -m core.train --help                     # every key, its type, default and meaning; the exit codes

Validates the config (exit 2 before any work), becomes the supervisor when the world size is above 1
(``core.trial.supervisor``), or trains on this rank: the loop in ``core.training.trainer``. Whatever happens, the
trial directory gets ``trial_summary.json`` and the process exits with the code of ``core.trial.contract``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from core.config import ConfigError, TrainConfig, from_dict, load_config, override_value, to_dict
from core.config.docs import usage
from core.config.overrides import NULLS
from core.config.rules import check_runnable
from core.memory.probe import apply_device_memory_limit
from core.runtime import native_env
from core.runtime.cache_dirs import compile_cache_root
from core.runtime.cluster import CONFIG_ENV, START_ENV, is_worker_process, nodes, rank_from_env
from core.runtime.compile_cache import CompileCache, graph_key
from core.trial.contract import Exit, classify, codes_text
from core.trial.recorder import TrialRecorder, write_invalid_summary
from core.trial.supervisor import SUPERVISOR_ENV, supervise
from core.trial.watchdog import Watchdog

log = logging.getLogger("core.train")
PROCESS_START = time.time()  # this process is up (its interpreter started just before)


def _trial_dir(overrides: list[str]) -> tuple[Path, list[str]]:
    """trial.dir from the overrides, or a new trials/manual/<timestamp> added to them (workers must share it)."""
    value = override_value(overrides, "trial.dir")
    if value is not None and value not in NULLS:
        return Path(value), overrides
    path = Path("trials") / "manual" / time.strftime("%Y%m%d-%H%M%S")
    return path, [*overrides, f"trial.dir={path}"]


def _setup_logging(trial_dir: Path, to_file: bool) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout)]
    if to_file:
        trial_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(trial_dir / "train.log"))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", handlers=handlers, force=True
    )


def _work_in(trial_dir: Path, cfg: TrainConfig) -> TrainConfig:
    """Run from the trial's directory: MindSpore writes what it compiles and why a compile failed
    (``rank_<r>/om/analyze_fail.ir``, graph-kernel fusion's ``akg_kernel_meta/`` and ``kernel_build_tmp.key``) into
    the working directory, and each trial keeps its own. Paths given relative to where the user started keep
    their meaning."""
    here = Path.cwd()

    def absolute(path: str | None) -> str | None:
        return path if path in (None, "auto") or Path(path).is_absolute() else str(here / path)

    data = replace(cfg.data, train_path=absolute(cfg.data.train_path), val_path=absolute(cfg.data.val_path))
    checkpoint = replace(cfg.checkpoint, resume=absolute(cfg.checkpoint.resume))
    execution = replace(cfg.execution, compile_cache_dir=absolute(cfg.execution.compile_cache_dir))
    trial_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(trial_dir)
    return replace(cfg, data=data, checkpoint=checkpoint, execution=execution)


def _compile_cache(cfg: TrainConfig, rank: int, trial_dir: Path) -> CompileCache | None:
    """This rank's compile cache, opened; None when ``execution.compile_cache`` is off, graph-kernel fusion is on
    (its generated kernels live outside the cached graphs) or the cache is unusable."""
    e = cfg.execution
    if not e.compile_cache or e.graph_kernel_fusion:
        return None
    root = Path(e.compile_cache_dir) if e.compile_cache_dir else compile_cache_root()
    graphs = CompileCache(root, graph_key(cfg), rank=rank, work_dir=trial_dir / "compile_cache")
    return graphs if graphs.open() else None


def run_rank(cfg: TrainConfig, *, overrides: list[str], trial_dir: Path, started: float) -> int:
    """Train on this rank and leave its summary; returns the exit code."""
    rank, world = rank_from_env()
    trial_dir = trial_dir.resolve()
    rec = TrialRecorder(
        trial_dir=trial_dir, config=to_dict(cfg), overrides=overrides, started=started, rank=rank, world_size=world
    )
    cfg = _work_in(trial_dir, cfg)
    limit = None
    if cfg.memory.limit_gb is not None and not apply_device_memory_limit(cfg.memory.limit_gb, cfg.device):
        limit = int(cfg.memory.limit_gb * 2**30)
    wall = cfg.trial.max_wall_time_sec
    deadline = None if wall is None else started + wall + cfg.trial.grace_sec
    supervisor = int(os.environ.get(SUPERVISOR_ENV) or 0) or None
    watchdog = Watchdog(
        lambda code, reason: rec.finish(code, reason),
        limit_bytes=limit,
        hard_deadline=deadline,
        supervisor_pid=supervisor,
    )
    watchdog.start()
    exc: BaseException | None = None
    rec.mark("launch", at=PROCESS_START)
    graphs = _compile_cache(cfg, rank, trial_dir)
    rec.compile_cache = None if graphs is None else ("loaded" if graphs.loaded else "compiled")
    try:
        # function-level: MindSpore is a rank's import, never the supervisor's
        from core.training.trainer import Trainer

        rec.mark("imports")
        code, reason = Trainer(cfg, rec, limit_bytes=limit).run()
    except BaseException as e:  # noqa: BLE001 — every end of a trial is classified and summarised
        exc = e
        code, reason = classify(e)
        log.error("trial failed (%s): %s", code.name, reason)
    watchdog.stop()
    if graphs is not None:
        graphs.close(ok=code == Exit.OK, compile_failed=code == Exit.COMPILE_ERROR)
    rec.finish(code, reason, exc)
    return int(code)


def main(argv: list[str] | None = None) -> int:
    native_env.apply()  # before anything imports MindSpore (its libraries read these as they load; none is above)
    overrides = list(sys.argv[1:] if argv is None else argv)
    if overrides and overrides[0] in ("-h", "--help"):
        try:
            print(usage(overrides[1:], exit_codes=codes_text()))
        except ConfigError as e:
            print(f"invalid config: {e}", file=sys.stderr)
            return int(Exit.INVALID)
        return 0
    # Workers measure the wall budget from the supervisor's start, so the budget covers cluster start-up too.
    started = float(os.environ.get(START_ENV) or PROCESS_START)
    trial_dir, overrides = _trial_dir(overrides)
    worker = is_worker_process()
    handed = os.environ.get(CONFIG_ENV) if worker else None  # the supervisor's config, validated already
    try:
        cfg = from_dict(json.loads(handed)) if handed else load_config(overrides)
        check_runnable(cfg, nodes=nodes()[1])
    except ConfigError as e:
        write_invalid_summary(trial_dir, overrides, f"invalid config: {e}", e.field)
        print(f"invalid config: {e}", file=sys.stderr)
        return int(Exit.INVALID)

    _setup_logging(trial_dir, to_file=not worker)  # a worker's stdout is already its logs/rank_<r>.log
    if not worker:
        from omegaconf import OmegaConf  # function-level: the supervisor's or single process's; workers never load it

        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    if cfg.parallel.world_size > 1 and not worker:
        log.info("supervisor: starting %d ranks, logs in %s/logs", cfg.parallel.world_size, trial_dir)
        code = supervise(cfg, overrides=overrides, trial_dir=trial_dir, started=started)
        log.info("trial ended: exit %d, summary %s", code, trial_dir / "trial_summary.json")
        return code
    return run_rank(cfg, overrides=overrides, trial_dir=trial_dir, started=started)


if __name__ == "__main__":
    exit_code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: after a failure inside MindSpore, sys.exit was seen to abort (134) in its atexit teardown.
    os._exit(exit_code)
