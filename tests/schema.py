"""The trial_summary.json schema of DESIGN §3.4, as a test helper."""

from core.trial.contract import STARTUP_PHASES

NUMBER = (int, float)
TOP = {
    "schema": str,
    "status": str,
    "exit_code": int,
    "reason": str,
    "error": (dict, type(None)),
    "steps": int,
    "max_steps": (int, type(None)),
    "tokens": int,
    "wall_time_sec": NUMBER,
    "startup_sec": (*NUMBER, type(None)),
    "startup_phases_sec": (dict, type(None)),
    "metrics": dict,
    "layout": dict,
    "config": dict,
    "overrides": list,
    "seed": (int, type(None)),
    "versions": dict,
    "started_at": str,
    "ended_at": str,
}
METRICS = (
    "tokens_per_sec",
    "step_time_ms_median",
    "mfu",
    "first_loss",
    "final_loss",
    "min_loss",
    "val_loss",
    "grad_norm_last",
    "peak_memory_bytes",
    "peak_memory_bytes_per_rank",
    "estimated_memory_bytes",
)
LAYOUT = ("world_size", "dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")
CODES = {"ok": 0, "error": 1, "invalid": 2, "oom": 10, "compile_error": 11, "nan": 12, "timeout": 13}


def assert_summary_schema(s: dict) -> None:
    for key, types in TOP.items():
        assert key in s, f"summary lacks {key}"
        assert isinstance(s[key], types), f"{key}: {type(s[key]).__name__}"
    assert CODES[s["status"]] == s["exit_code"]
    for key in METRICS:
        assert key in s["metrics"], f"metrics lack {key}"
        value = s["metrics"][key]
        assert value is None or isinstance(value, (*NUMBER, list)), key
    for key in LAYOUT:
        assert isinstance(s["layout"][key], int), key
    assert set(s["versions"]) >= {"mindspore", "python", "project"}
    phases = s["startup_phases_sec"] or {}
    assert list(phases) == [p for p in STARTUP_PHASES if p in phases], phases  # in order, known names
    assert all(isinstance(v, NUMBER) and v >= 0 for v in phases.values()), phases
    if s["status"] != "ok":
        assert s["error"] is not None and {"type", "message", "rank"} <= set(s["error"])
