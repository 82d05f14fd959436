"""The trial contract: how a trial can end (exit codes and statuses), how an exception is classified into one,
and the reasons a person can act on. A trial always exits with one of these codes and leaves a summary
(``core.trial.recorder``); the agent learns from both.

No MindSpore here: the agent reads these names.
"""

from __future__ import annotations

import re
from enum import IntEnum
from pathlib import Path

from core.config import ConfigError

SCHEMA = "mindspore-autoresearch/trial_summary/v1"


class Exit(IntEnum):
    OK = 0
    ERROR = 1
    INVALID = 2
    OOM = 10
    COMPILE_ERROR = 11
    NAN = 12
    TIMEOUT = 13

    @property
    def status(self) -> str:
        """The status the summary writes for this code: ok, error, invalid, oom, compile_error, nan, timeout."""
        return self.name.lower()


STATUS = {code: code.status for code in Exit}


def codes_text() -> str:
    """Every exit code with its status, for help texts: "0 ok, 1 error, 2 invalid, ..."."""
    return ", ".join(f"{int(code)} {code.status}" for code in Exit)


# When ranks disagree, a classified failure is the cause and the others' errors its consequence.
CLASSIFIED = (Exit.OOM, Exit.COMPILE_ERROR, Exit.NAN)


class TrialFailure(Exception):
    """A classified end of a trial, raised from the training loop."""

    code = Exit.ERROR

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class OutOfMemory(TrialFailure):
    code = Exit.OOM


class NonFinite(TrialFailure):
    code = Exit.NAN


class OutOfTime(TrialFailure):
    code = Exit.TIMEOUT


# Process start to the first finished step, in order: the process is up (a worker: spawned by the supervisor),
# MindSpore and the trainer imported, the cluster joined, model/optimizer/schedule built, the first step done
# (its graphs compiled and run once).
STARTUP_PHASES = ("launch", "imports", "cluster", "build", "first_step")


# MindSpore reports allocation failure in many words: its Ascend allocator ("Out of Memory", "Malloc ...
# failed") and, on a host under an address-space limit, "Allocate memory failed" or std::bad_alloc.
_OOM = re.compile(
    r"out of memory|malloc\b.*\bfail|allocate memory failed|bad_alloc|memory is not enough"
    r"|MemoryError",
    re.IGNORECASE,
)
# Graph compilation under mindspore.jit, or kernel selection (an op with no kernel for this device/dtype).
_COMPILE = re.compile(
    r"kernel \S+ (is )?unregistered|select kernel|unsupported data type|"
    r"failed to compile|compile graph|graph compil|Parse.*(graph|function)|"
    r"not supported in graph mode|analyze_fail\.ir|jit.*syntax",
    re.IGNORECASE,
)


def classify(exc: BaseException) -> tuple[Exit, str]:
    """Map an exception to an exit code and a one-line reason a person can act on."""
    if isinstance(exc, TrialFailure):
        return exc.code, exc.reason
    if isinstance(exc, ConfigError):
        return Exit.INVALID, str(exc)
    text = f"{type(exc).__name__}: {exc}"
    first = _first_line(text)
    if isinstance(exc, MemoryError) or _OOM.search(text):
        return Exit.OOM, f"out of memory: {first}"
    if _COMPILE.search(text) or _raised_while_compiling(exc):
        return Exit.COMPILE_ERROR, f"compile/kernel selection failed: {first}"
    return Exit.ERROR, first


def _raised_while_compiling(exc: BaseException) -> bool:
    """Whether ``exc`` came out of ``mindspore.jit``'s graph compilation (its executor's ``compile`` call), in
    whatever words: a fusion kernel its generator could not build said only "Response is empty"."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "compile" and Path(code.co_filename).parts[-3:] == ("mindspore", "graph", "api.py"):
            return True
        tb = tb.tb_next
    return False


def _first_line(text: str, limit: int = 300) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not set(line) <= set("-="):
            return line[:limit]
    return text[:limit]


def oom_reason(what: str, used_bytes: int, limit_bytes: int) -> str:
    """The reason of an out-of-memory end: what passed the budget, and what to change."""
    return (
        f"out of memory: {what} {used_bytes / 2**20:.0f} MiB passed memory.limit_gb={limit_bytes / 2**30:g}; "
        "lower training.micro_batch_size, enable memory.recompute or raise the limit"
    )
