"""The execution settings of search_spaces/compile.yaml (core.runtime.settings), each in a real trial: it runs with the
default's numerics, or it fails to compile and says so with exit 11."""

import math
import os

import pytest

from autoresearch.space import load_space
from core.config import scalar_text
from tests.integration.conftest import losses, run_trial

pytestmark = pytest.mark.slow
BASE = ("model=tiny", "trial.max_steps=2", "training.eval_batches=1")


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    run = run_trial(tmp_path_factory.mktemp("compile") / "default", *BASE)
    assert run.code == 0, run.output
    return run


# Every value compile.yaml can choose, in as few trials as keeps each failure attributable: the jit settings
# that are plain graph options together, graph-kernel fusion (a compiler of its own) alone, PyNative with the
# thread settings the jit row does not take.
SETTINGS = {
    "jit O1 bytecode threads": [
        "execution.jit_level=O1",
        "execution.capture_mode=bytecode",
        "execution.kernel_threads=2",
        "execution.dispatch_threads=1",
        "execution.host_pipeline=true",
    ],
    "graph-kernel fusion": ["execution.graph_kernel_fusion=true"],
    "pynative threads": ["training.mode=pynative", "execution.kernel_threads=1", "execution.dispatch_threads=2"],
    "MindSpore's optimizer kernels": ["execution.cpu_kernels=false"],  # the default runs core.runtime.kernels'
}


def test_the_rows_cover_every_value_of_the_compile_space():
    covered = {tuple(o.split("=", 1)) for row in SETTINGS.values() for o in row}
    defaults = {
        "training.mode": "jit",
        "execution.jit_level": "O0",
        "execution.capture_mode": "ast",
        "execution.graph_kernel_fusion": "false",
        "execution.kernel_threads": "null",
        "execution.dispatch_threads": "null",
        "execution.host_pipeline": "null",
        "execution.cpu_kernels": "null",
    }
    for name, param in load_space("compile").params.items():
        for value in map(scalar_text, param.values):
            assert (name, value) in covered or defaults[name] == value, (name, value)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_each_setting_runs_with_the_same_numerics_or_exits_11(tmp_path, default_run, name):
    run = run_trial(tmp_path / "t", *BASE, *SETTINGS[name], timeout=600)
    s = run.summary
    if run.code == 11:
        assert s["status"] == "compile_error" and s["reason"].startswith("compile/kernel selection failed"), s
        return
    assert run.code == 0, run.output
    ours, ref = losses(run), losses(default_run)
    assert ours.keys() == ref.keys()
    for step in ref:  # the same computation: float rounding apart (fused kernels have their own math)
        assert math.isclose(ours[step], ref[step], rel_tol=1e-5), (step, ours[step], ref[step])
    if name == "graph-kernel fusion":  # MindSpore's compile debris stays in the trial, not the user's cwd
        assert (run.dir / "akg_kernel_meta").is_dir()


def test_a_real_compile_failure_is_exit_11(tmp_path):
    """Graph-kernel fusion's kernel generator (AKG, a process of MindSpore's) cannot import a module it needs: the
    graph does not compile, and the trial ends with exit 11, a summary, and its first step never taken."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "decorator.py").write_text('raise ImportError("decorator withheld by the test")\n')
    env = {"PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")])}
    run = run_trial(tmp_path / "t", *BASE, "execution.graph_kernel_fusion=true", env=env, timeout=600)
    assert run.code == 11, run.output
    s = run.summary
    assert s["status"] == "compile_error" and s["steps"] == 0 and s["error"]["rank"] == 0, s
    assert "Response is empty" in s["reason"]  # MindSpore's words for it: no pattern, the compile call said so
