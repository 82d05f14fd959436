"""The core against PyTorch on the same CPU, side by side in one run (issue "Performance I", item 1).

    .venv/bin/python benchmarks/peer_torch.py [steps] [--models small medium] [--steps 20] [--rounds 3]
                                              [--batch B] [--seq S] [--no-compile]
    .venv/bin/python benchmarks/peer_torch.py matmul [--sizes 1024 2048] [--rounds 3]

Needs the optional extra ``pip install -e '.[bench]'`` (PyTorch; neither the core nor its tests use it).

``steps``: per model, rows alternate within each round, medians over rounds: the real ``core.train`` CLI (jit,
its summary's ``step_time_ms_median``; with its defaults, and with the fastest compile.yaml config on model=small,
``CORE_ROWS``), the same model in PyTorch eager and under ``torch.compile`` (forward and
loss; backward through AOTAutograd). Same architecture (parameter count asserted equal to the core's), batches
(the core's corpus, windows, global batch and seq_len; one micro-batch), AdamW hyperparameters and lr schedule,
grad-norm clipping, and threads (the cores of the core's one rank); each side a fresh process taking the median
step after the first, as the core's summary does. PyTorch uses its natural kernels (SDPA, RMSNorm, cross_entropy,
fused AdamW) where the core spells ops out: how far is the core from what a PyTorch user gets? Headline: the
step-time ratio core / PyTorch eager. Run it on an otherwise idle machine: with another job on one of 2 cores,
PyTorch's OpenMP threads wait on each other (a tiny eager step took 26 ms, then 768 ms beside the test suite).

``matmul``: fp32 n x n matmul GFLOP/s of MindSpore, PyTorch and NumPy, each in its own process, and NumPy again
with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset when set (this machine's image pins older OpenBLAS kernels).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

from layouts import run, run_rounds
from provenance import cpu_info, git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PEERS = ("eager", "compile")
# The core's rows: its defaults, the same with MindSpore's own optimizer kernels instead of core.runtime.kernels' fused ones
# (the default before them), and the fastest search_spaces/compile.yaml config on model=small (RESULTS.md,
# "Compile settings"): MindSpore's O1 graph optimisations with graph-kernel fusion. (The host-queue row of earlier
# runs is in RESULTS.md: `execution.host_pipeline=true` was 2-3x slower on every model.)
CORE_ROWS = {
    "core": [],
    "core, MindSpore's optimizer kernels": ["execution.cpu_kernels=false"],
    "core O1+fusion": ["execution.jit_level=O1", "execution.graph_kernel_fusion=true"],
}
_FAILED: dict = {}  # peer rows that failed once (torch.compile here, say): not run again in later rounds


def require_torch():
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("PyTorch is not installed; it is an optional extra: pip install -e '.[bench]'")
    import torch

    return torch


# ---- the PyTorch peer: its own process, `peer_torch.py _torch peer=eager|compile|eager-bf16 params=N <overrides>` ----
def torch_trial(argv: list[str]) -> None:
    """One PyTorch trial from the core's own overrides; writes a trial_summary.json as the core's CLI does."""
    torch = require_torch()
    import torch.nn.functional as F
    from torch_gpt import GPT

    from core.config import load_config
    from core.data import TokenDataset, default_corpus

    opts = dict(a.split("=", 1) for a in argv if a.split("=", 1)[0] in ("peer", "params"))
    cfg = load_config([a for a in argv if a.split("=", 1)[0] not in opts])
    t, o, out = cfg.training, cfg.optim, Path(cfg.trial.dir)
    from core.optim.lr_schedule import lr_at  # no MindSpore: this process follows the core's warmup and decay

    assert cfg.grad_accum_steps == 1, "the peer runs one micro-batch per step"
    torch.manual_seed(cfg.seed)
    # The core's single rank runs its kernels on every core this process may use (core.runtime.settings._cpu_share)
    torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())

    model = GPT(cfg.model)
    params = list(model.parameters())  # a tied embedding once
    n_params = sum(p.numel() for p in params)
    assert n_params == int(opts["params"]), f"PyTorch model: {n_params} parameters, the core's {opts['params']}"
    groups = [
        {"params": [p for p in params if p.ndim >= 2]},  # core.optim.adamw.decays: matrices decay,
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]  # vectors do not
    optimizer = torch.optim.AdamW(
        groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay, fused=True
    )

    bf16 = opts["peer"].endswith("-bf16")  # autocast: bf16 matmuls (oneDNN), norms/softmax/loss in fp32

    def loss_fn(inputs, targets):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(inputs)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    if opts["peer"] == "compile":
        loss_fn = torch.compile(loss_fn, dynamic=False)
    data = TokenDataset(cfg.data.train_path or default_corpus()[0], dtype=cfg.data.token_dtype)
    losses, times, status, reason = [], [], "ok", ""
    try:
        for step in range(cfg.trial.max_steps):
            t0 = time.perf_counter()  # from the batch to the updated weights, as core.training.trainer times a step
            rows = torch.from_numpy(data.batch(step, t.global_batch_size, t.seq_len, cfg.seed).astype("int64"))
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(rows[:, :-1], rows[:, 1:])
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, o.grad_clip)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, o, cfg.trial.max_steps)
            optimizer.step()
            losses.append(loss.item())
            norm.item()  # the core reads loss and norm back every step (its NaN check)
            times.append(time.perf_counter() - t0)
    except Exception as exc:  # torch.compile fails at its first call: the row says why
        status, reason = "failed", f"{type(exc).__name__}: {(str(exc).strip() or '?').splitlines()[0][:300]}"
    median = statistics.median(times[1:] or times) if times else float("nan")  # core.trial: step 1 compiles
    out.mkdir(parents=True, exist_ok=True)
    (out / "trial_summary.json").write_text(
        json.dumps(
            {
                "status": status,
                "reason": reason,
                "step_times_ms": [round(x * 1000, 1) for x in times],
                "losses": losses,
                "torch": f"{torch.__version__}, {torch.get_num_threads()} threads, "
                f"{torch.backends.cpu.get_cpu_capability()}",
                "metrics": {
                    "step_time_ms_median": median * 1000,
                    "tokens_per_sec": t.global_batch_size * t.seq_len / median,
                    "first_loss": losses[0] if losses else None,
                    "final_loss": losses[-1] if losses else None,
                },
            }
        )
    )


def run_row(overrides: list[str], out: Path) -> dict:
    """A core row through its CLI (layouts.run), a peer row through `_torch`; a peer that failed is reported
    failed in every round, with its reason, without running again."""
    if not overrides[0].startswith("peer="):
        return run(overrides, out)
    key, summary = tuple(overrides), out / "trial_summary.json"
    if key in _FAILED:
        return _FAILED[key]
    p = subprocess.run(
        [sys.executable, __file__, "_torch", *overrides, f"trial.dir={out}"], cwd=ROOT, capture_output=True, text=True
    )
    s = (
        json.loads(summary.read_text())
        if summary.is_file()
        else {  # died before writing it (an assert, a crash)
            "status": "failed",
            "reason": (p.stderr.strip() or "?").splitlines()[-1],
            "metrics": {"step_time_ms_median": float("nan")},
        }
    )
    if s["status"] != "ok":
        _FAILED[key] = s
    return s


def main_steps(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["small", "medium"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, help="global batch (default: the core's training.global_batch_size)")
    ap.add_argument("--seq", type=int, help="tokens per sequence (default: the core's training.seq_len)")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    args = ap.parse_args(argv)
    require_torch()
    from core.config import load_config
    from core.model import GPT, count_params  # MindSpore in this waiting process only, for the count

    base = [f"trial.max_steps={args.steps}", "training.eval_batches=1"]
    if args.batch:
        base.append(f"training.global_batch_size={args.batch}")
    if args.seq:
        base.append(f"training.seq_len={args.seq}")
    t = load_config(base).training
    peers = PEERS[:1] if args.no_compile else PEERS
    rows = {}
    for model in args.models:
        n = count_params(GPT(load_config([f"model={model}"]).model))
        rows.update({f"{model} {row}": [f"model={model}", *base, *extra] for row, extra in CORE_ROWS.items()})
        rows.update({f"{model} {peer}": [f"peer={peer}", f"params={n}", f"model={model}", *base] for peer in peers})
    with tempfile.TemporaryDirectory() as tmp:
        results = run_rounds(rows, args.rounds, Path(tmp), runner=run_row)
    torch_info = next((s["torch"] for runs in results.values() for s in runs if "torch" in s), "?")
    print(
        f"\n### PyTorch peer — {time.strftime('%Y-%m-%d %H:%M %Z')}, commit {git_commit()}, {cpu_info()}; "
        f"PyTorch {torch_info}; {args.rounds} alternating rounds of {args.steps} steps, AdamW + clipping, "
        f"global batch {t.global_batch_size} x {t.seq_len}, 1 rank\n"
    )
    print("| model | row | step (ms) | per round (ms) | core / row | tokens/s | loss first → last (round 1) |")
    print("|---|---|---:|---|---:|---:|---|")
    ratios = {}
    for model in args.models:
        med = {}
        for row in (*CORE_ROWS, *peers):
            runs = results[f"{model} {row}"]
            if runs[0]["status"] != "ok":
                print(f"| {model} | {row} | failed: {runs[0]['reason'].replace('|', '/')} | | | | |")
                continue
            m = [s["metrics"] for s in runs]
            med[row] = statistics.median(x["step_time_ms_median"] for x in m)
            per_round = " / ".join(f"{x['step_time_ms_median']:.0f}" for x in m)
            print(
                f"| {model} | {row} | {med[row]:.0f} | {per_round} | {med['core'] / med[row]:.2f}x | "
                f"{statistics.median(x['tokens_per_sec'] for x in m):.0f} | "
                f"{m[0]['first_loss']:.3f} → {m[0]['final_loss']:.3f} |"
            )
        if "eager" in med:
            ratios[model] = " / ".join(f"{med[r] / med['eager']:.2f}x" for r in CORE_ROWS if r in med)
    print(
        f"\nStep-time ratio core / PyTorch eager, 1 rank ({' / '.join(CORE_ROWS)}): "
        + (", ".join(f"`model={m}` **{r}**" for m, r in ratios.items()) or "no eager row finished")
    )


# ---- fp32 matmul rates ---------------------------------------------------------------------------------------
def matmul_worker(argv: list[str]) -> None:
    """`_matmul LIB N...`: prints {"info": library, "rates": {n: GFLOP/s}} as JSON."""
    import numpy as np

    lib, sizes = argv[0], [int(n) for n in argv[1:]]
    if lib.startswith("mindspore"):  # mindspore: as a trial runs it; mindspore-queues: host queues on
        import mindspore as ms

        from core.runtime.settings import set_host_pipeline

        set_host_pipeline("CPU", True if lib == "mindspore-queues" else None)
        info, wrap, mm = f"MindSpore {ms.__version__}", ms.Tensor, lambda a: (a @ a).asnumpy()  # asnumpy waits
    elif lib == "torch":
        torch = require_torch()
        info = (
            f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}"
        )
        wrap, mm = torch.from_numpy, lambda a: a @ a
    else:
        info, wrap, mm = f"NumPy {np.__version__}, OpenBLAS core {openblas_core()}", np.asarray, lambda a: a @ a
    rates = {}
    for n in sizes:
        a = wrap(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
        timeit.repeat(lambda a=a: mm(a), number=1, repeat=25)  # oneDNN tunes over a kernel's first ~25 runs
        rates[n] = 2 * n**3 / statistics.median(timeit.repeat(lambda a=a: mm(a), number=1, repeat=10)) / 1e9
    print(json.dumps({"info": info, "rates": rates}))


def openblas_core() -> str:
    """The kernel set NumPy's bundled OpenBLAS runs (OPENBLAS_CORETYPE may pin an older one than the CPU has)."""
    import ctypes

    import numpy as np

    for lib in map(ctypes.CDLL, map(str, (Path(np.__file__).parents[1] / "numpy.libs").glob("libopenblas*.so*"))):
        for fn in (getattr(lib, name, None) for name in ("openblas_get_corename64_", "openblas_get_corename")):
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return "unknown"


def main_matmul(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description="fp32 matmul GFLOP/s of MindSpore, PyTorch and NumPy")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    require_torch()
    pinned = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    rows = [
        ("mindspore", "", os.environ),
        ("mindspore-queues", "host queues on", os.environ),
        ("torch", "", os.environ),  # (library, environment note, environment)
        ("numpy", " ".join(f"{k}={v}" for k, v in pinned.items()), os.environ),
    ]
    if pinned:  # both unset together, for this one process only (tests and CI keep them)
        unpinned = {k: v for k, v in os.environ.items() if k not in pinned}
        rows.append(("numpy", f"{' and '.join(pinned)} unset", unpinned))
    results: dict = {}
    for _ in range(args.rounds):  # alternating, each a fresh process
        for i, (lib, note, env) in enumerate(rows):
            p = subprocess.run(
                [sys.executable, __file__, "_matmul", lib, *map(str, args.sizes)],
                env=env,
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            if p.returncode:
                raise SystemExit(f"{lib} {note}: matmul run failed:\n{p.stderr[-3000:]}")
            results.setdefault(i, []).append(json.loads(p.stdout.strip().splitlines()[-1]))
    print(
        f"\n### fp32 matmul — {time.strftime('%Y-%m-%d %H:%M %Z')}, commit {git_commit()}, {cpu_info()}; "
        f"median of 10 runs after 25 warm-up runs, median over {args.rounds} alternating processes\n"
    )
    print("| library | " + " | ".join(f"{n}² GFLOP/s" for n in args.sizes) + " |")
    print("|---|" + "---:|" * len(args.sizes))
    for i, runs in results.items():
        rates = " | ".join(f"{statistics.median(r['rates'][str(n)] for r in runs):.0f}" for n in args.sizes)
        print(f"| {runs[0]['info']}{f' ({rows[i][1]})' if rows[i][1] else ''} | {rates} |")


COMMANDS = {"steps": main_steps, "matmul": main_matmul, "_torch": torch_trial, "_matmul": matmul_worker}

if __name__ == "__main__":
    named = sys.argv[1:2] and sys.argv[1] in COMMANDS  # no command: steps
    COMMANDS[sys.argv[1] if named else "steps"](sys.argv[2:] if named else sys.argv[1:])
