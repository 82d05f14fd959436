"""Pipeline schedules as per-rank lists of actions, and a simulator that checks and times them.

A model of ``n_layers`` blocks is cut into ``pp * virtual`` stages; stage ``s`` runs on rank ``s % pp`` as its
chunk ``s // pp`` (Megatron's interleaving; with ``virtual == 1`` rank r holds stage r). Every micro-batch passes
forward through the stages in order and backward in reverse. A schedule says, for each rank, in which order
its forwards (F) and backwards (B) run; the sends and receives between stages follow from that order:

    gpipe        all forwards, then all backwards (Huang et al. 2019): m micro-batches' activations in flight
    1f1b         pp - r - 1 warm-up forwards, then one forward / one backward (PipeDream-Flush, Narayanan et al.
                 2021): at most pp - r micro-batches in flight on rank r, the same bubble as GPipe
    interleaved  1F1B over ``virtual`` chunks per rank (Narayanan et al. 2021, section 2.2): the bubble divided by
                 ``virtual``, for ``virtual`` times the point-to-point traffic; needs m to be a multiple of pp
    mpipe        (interleaved) 1F1B with stage 0's preprocess block run by the idle ranks in their warm-up
                 (MindSpore hyper-parallel's MPipe Transpose; ``mpipe.py`` says how): adds the preprocess forward
                 P, its recompute-and-backward R on rank 0, and two messages, the preprocess weights (W, rank 0
                 to a rank that runs P) and a preprocessed micro-batch (P, its owner to rank 0)

Pure Python, no MindSpore: ``simulate`` runs the lists with sends that never block (MindSpore's CPU send is
buffered: benchmarks/RESULTS.md, "core/parallel/comm/p2p.py") and receives that wait for the next message from
their peer, which must be the one they expect (messages between two ranks arrive in the order they were sent,
and every activation has the same shape, so a mismatch would be silent); it raises on a deadlock, a message
received out of order, a missing or repeated action, or a dependency run out of order, and returns each rank's
busy time and the makespan, from which the bubble follows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from core.parallel.pipeline.actions import Action
from core.parallel.pipeline.mpipe import transpose

SCHEDULES = ("gpipe", "1f1b", "interleaved", "mpipe")
OPS = "FBPR"  # forward, backward, preprocess forward, preprocess recompute-and-backward (mpipe)


def stage_layers(n_layers: int, stages: int, split: list[int] | None = None) -> list[range]:
    """The blocks of each stage: ``split`` (layers per stage, summing to n_layers; the first and last stages may
    hold none, the embedding or the head alone) or an even split."""
    if split is None:
        if n_layers % stages:
            raise ValueError(f"{n_layers} layers do not split evenly into {stages} stages")
        split = [n_layers // stages] * stages
    if len(split) != stages or sum(split) != n_layers or min(split) < 0 or min(split[1:-1], default=1) < 1:
        raise ValueError(
            f"split {split} must give each of {stages} stages >= 1 layer (the first and last >= 0), {n_layers} in all"
        )
    starts = [sum(split[:i]) for i in range(stages)]
    return [range(a, a + n) for a, n in zip(starts, split, strict=True)]


def body_of(schedule: str, virtual: int) -> str:
    """mpipe's body, what is left when its preprocess steps are taken out: (interleaved) 1F1B."""
    if schedule != "mpipe":
        return schedule
    return "interleaved" if virtual > 1 else "1f1b"


def compute_order(schedule: str, pp: int, micro_batches: int, virtual: int, rank: int) -> list[tuple[str, int, int]]:
    """(op, micro-batch, stage) of rank ``rank``'s forwards and backwards, in the order it runs them."""
    m, p, v = micro_batches, pp, virtual
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; one of {SCHEDULES}")
    schedule = body_of(schedule, v)
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"{schedule} runs one stage per rank; virtual stages need the interleaved schedule")
    if schedule == "gpipe":
        return [("F", i, rank) for i in range(m)] + [("B", i, rank) for i in range(m)]
    if schedule == "interleaved" and m % p:
        raise ValueError(f"the interleaved schedule needs the micro-batches ({m}) to be a multiple of pp ({p})")

    def forward(k):  # the k-th forward of this rank: groups of pp micro-batches, chunk by chunk
        return ("F", (k // (p * v)) * p + k % p, ((k // p) % v) * p + rank)

    def backward(k):  # the same micro-batch order, chunks in reverse
        return ("B", (k // (p * v)) * p + k % p, (v - 1 - (k // p) % v) * p + rank)

    total = m * v
    warmup = min(p - rank - 1 + (0 if v == 1 else (p - rank - 1) + (v - 1) * p), total)
    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    return order + [backward(k) for k in range(total - warmup, total)]


def schedule_of(cfg) -> dict:
    """The keyword arguments of ``build`` and ``compile_schedule`` for the pipeline a ``TrainConfig`` runs: one
    reading for the runtime, the step-time and memory estimates and the benchmarks."""
    p = cfg.parallel
    return dict(
        schedule=p.pp_schedule,
        pp=p.pp,
        micro_batches=cfg.grad_accum_steps,
        virtual=p.pp_virtual,
        overflow=p.pp_transpose_overflow,
        trained=cfg.preprocess_trains,
    )


def build(
    schedule: str, pp: int, micro_batches: int, virtual: int = 1, *, overflow: str = "full", trained: bool = True
) -> list[list[Action]]:
    """Every rank's actions: its compute order with each activation received before its forward and sent after
    it, each gradient received before its backward and sent after it. ``overflow`` and ``trained`` shape mpipe's
    transposed steps (``mpipe.transpose``)."""
    if schedule == "mpipe":
        return transpose(build(body_of(schedule, virtual), pp, micro_batches, virtual), overflow, trained)
    if pp < 2:
        raise ValueError("a pipeline needs pp >= 2 stages")
    last = pp * virtual - 1
    out = []
    for rank in range(pp):
        actions = []
        for op, mb, s in compute_order(schedule, pp, micro_batches, virtual, rank):
            if op == "F":
                if s > 0:
                    actions.append(Action("recv_F", mb, s, (s - 1) % pp))
                actions.append(Action("F", mb, s))
                if s < last:
                    actions.append(Action("send_F", mb, s + 1, (s + 1) % pp))
            else:
                if s < last:
                    actions.append(Action("recv_B", mb, s, (s + 1) % pp))
                actions.append(Action("B", mb, s))
                if s > 0:
                    actions.append(Action("send_B", mb, s - 1, (s - 1) % pp))
        out.append(actions)
    return out


class ScheduleError(RuntimeError):
    pass


@dataclass
class Timing:
    makespan: float
    busy: list[float]  # per rank
    in_flight: list[int]  # per rank: the most micro-batch stages forwarded and not yet backwarded (stashed inputs)

    @property
    def bubble(self) -> float:
        """The idle share of the ranks' time: 1 - busy / (ranks * makespan)."""
        return 1.0 - sum(self.busy) / (len(self.busy) * self.makespan)


def simulate(
    actions: list[list[Action]],
    micro_batches: int,
    virtual: int = 1,
    t_forward: float = 1.0,
    t_backward: float = 1.0,
    *,
    durations: Callable[[str, int], float] | None = None,
    transfer: float | dict[str, float] = 0.0,
    trace: list | None = None,
) -> Timing:
    """Run the ranks' lists and check them; see the module docstring. A forward of one stage takes ``t_forward /
    virtual``, a backward ``t_backward / virtual``, or ``durations(op, stage)`` when given (``core.perf``: uneven
    stages, the first's embedding, the last's head; P and R take 0 without it); a message arrives ``transfer``
    after it is sent (or ``transfer[kind]``). ``trace``, when given, receives (rank, action) in the order they ran
    (``compile_schedule``)."""
    pp = len(actions)
    stages = pp * virtual
    sent: dict[tuple[str, int, int], float] = {}  # (kind, mb, stage) -> time its message left
    done: dict[tuple[str, int, int], float] = {}  # (op, mb, stage) -> time it finished
    clock, pos = [0.0] * pp, [0] * pp
    received: list[set] = [set() for _ in range(pp)]  # messages received (and preprocessed micro-batches made here)
    queues: dict[tuple[int, int], list] = {}  # (src, dst) -> keys sent, not yet received, in order
    busy = [0.0] * pp
    live, in_flight = [0] * pp, [0] * pp
    present = {a.op for acts in actions for a in acts}
    weighted = {r for r, acts in enumerate(actions) if any(a.op == "recv_W" for a in acts)}
    while any(pos[r] < len(actions[r]) for r in range(pp)):
        progressed = False
        for r in range(pp):
            while pos[r] < len(actions[r]):
                a = actions[r][pos[r]]
                if a.op.startswith("recv"):
                    key, channel = (a.op[-1], a.mb, a.stage), queues.setdefault((a.peer, r), [])
                    if not channel:
                        break  # blocks until the peer sends something
                    if channel[0] != key:
                        raise ScheduleError(f"rank {r}: {a} would receive {channel[0]} (messages arrive in order)")
                    channel.pop(0)
                    clock[r] = max(clock[r], sent[key] + _transfer(transfer, key[0]))
                    received[r].add(key)
                elif a.op.startswith("send"):
                    key = (a.op[-1], a.mb, a.stage)
                    if key in sent:
                        raise ScheduleError(f"rank {r}: {a} sent twice")
                    source = _source(a)
                    if (source is not None and source not in done) or a.peer != a.stage % pp:
                        raise ScheduleError(f"rank {r}: {a} before its computation, or to the wrong rank")
                    sent[key] = clock[r]
                    queues.setdefault((r, a.peer), []).append(key)
                else:
                    _check_ready(a, r, pp, stages, done, received[r], weighted, transposed="P" in present)
                    if durations is not None:
                        cost = durations(a.op, a.stage)
                    else:
                        cost = {"F": t_forward, "B": t_backward}.get(a.op, 0.0) / virtual
                    clock[r] += cost
                    busy[r] += cost
                    done[(a.op, a.mb, a.stage)] = clock[r]
                    if a.op == "P":
                        received[r].add(("P", a.mb, 0))  # here now, as if received
                    live[r] += {"F": 1, "B": -1}.get(a.op, 0)
                    in_flight[r] = max(in_flight[r], live[r])
                if trace is not None:
                    trace.append((r, a))
                pos[r] += 1
                progressed = True
        if not progressed:
            stuck = {r: actions[r][pos[r]] for r in range(pp) if pos[r] < len(actions[r])}
            raise ScheduleError(f"deadlock: every unfinished rank waits on a receive: {stuck}")
    want = {(op, mb, s) for op in "FB" for mb in range(micro_batches) for s in range(stages)}
    want |= {(op, mb, 0) for op in "PR" if op in present for mb in range(micro_batches)}
    if set(done) != want:
        raise ScheduleError(f"missing {sorted(want - set(done))[:4]}, unexpected {sorted(set(done) - want)[:4]}")
    if sum(len(a) for a in actions) != len(done) + 2 * len(sent):
        raise ScheduleError("an action ran twice or a message was never received")
    return Timing(max(clock), busy, in_flight)


class Compiled:
    """A schedule checked once and reduced to the order its actions ran in: its timing for any durations is
    then one pass over that order (a send never blocks and a receive waits for one known message, so which
    action can run next never depends on how long the others take; only the clocks do)."""

    def __init__(self, trace: list[tuple[int, Action]], *, pp: int, stages: int, in_flight: list[int]):
        messages: dict[tuple[str, int, int], int] = {}
        computations: dict[tuple[str, int], int] = {}
        self.events: list[tuple[int, int, int]] = []  # (0 receive | 1 send | 2 compute, rank, message or op-stage)
        for rank, a in trace:
            if a.op in OPS:
                self.events.append((2, rank, computations.setdefault((a.op, a.stage), len(computations))))
            else:
                message = messages.setdefault((a.op[-1], a.mb, a.stage), len(messages))
                self.events.append((int(a.op.startswith("send")), rank, message))
        self.pp, self.stages, self.in_flight = pp, stages, in_flight
        self.computations, self.kinds = list(computations), [kind for kind, _, _ in messages]

    def time(self, durations: Callable[[str, int], float], transfer: float | dict[str, float] = 0.0) -> Timing:
        """What ``simulate`` returns for the same ``durations`` and ``transfer``, without checking again."""
        cost = [durations(op, s) for op, s in self.computations]
        arrive = [_transfer(transfer, kind) for kind in self.kinds]
        clock, busy, sent = [0.0] * self.pp, [0.0] * self.pp, [0.0] * len(self.kinds)
        for kind, rank, x in self.events:
            if kind == 2:
                clock[rank] += cost[x]
                busy[rank] += cost[x]
            elif kind == 1:
                sent[x] = clock[rank]
            elif sent[x] + arrive[x] > clock[rank]:
                clock[rank] = sent[x] + arrive[x]
        return Timing(max(clock), busy, list(self.in_flight))


@functools.lru_cache(maxsize=256)
def compile_schedule(
    schedule: str, pp: int, micro_batches: int, virtual: int = 1, *, overflow: str = "full", trained: bool = True
) -> Compiled:
    """``build`` checked by ``simulate`` once per shape, for timing many durations (``core.perf``, the plan)."""
    trace: list = []
    actions = build(schedule, pp, micro_batches, virtual, overflow=overflow, trained=trained)
    timing = simulate(actions, micro_batches, virtual, trace=trace)
    return Compiled(trace, pp=pp, stages=pp * virtual, in_flight=timing.in_flight)


def _source(a: Action) -> tuple[str, int, int] | None:
    """The computation whose result a send carries (the weights: none, they are there from the start)."""
    if a.op == "send_F":
        return ("F", a.mb, a.stage - 1)
    if a.op == "send_B":
        return ("B", a.mb, a.stage + 1)
    return ("P", a.mb, 0) if a.op == "send_P" else None


def _transfer(transfer: float | dict[str, float], kind: str) -> float:
    """A message's transfer time: one for every kind, or by kind (F, B, P, W)."""
    return transfer.get(kind, 0.0) if isinstance(transfer, dict) else transfer


def _check_ready(
    a: Action, rank: int, pp: int, stages: int, done: dict, received: set, weighted: set, *, transposed: bool
) -> None:
    if (a.op, a.mb, a.stage) in done:
        raise ScheduleError(f"rank {rank}: {a} runs twice")
    if a.op == "P":  # any rank preprocesses, with the weights rank 0 sent it
        if rank in weighted and ("W", -1, rank) not in received:
            raise ScheduleError(f"rank {rank}: {a} before the preprocess weights arrived")
        return
    if a.stage % pp != rank:
        raise ScheduleError(f"rank {rank} runs {a} of a stage it does not hold")
    if transposed and a.op in "FR" and a.stage == 0 and ("P", a.mb, 0) not in received:
        raise ScheduleError(f"rank {rank}: {a} before its micro-batch was preprocessed")
    if a.op == "R" and ("B", a.mb, 0) not in done:
        raise ScheduleError(f"rank {rank}: {a} before the backward that gives its gradient")
    if a.op == "F" and a.stage > 0 and ("F", a.mb, a.stage) not in received:
        raise ScheduleError(f"rank {rank}: {a} before its input arrived")
    if a.op == "B":
        if ("F", a.mb, a.stage) not in done:
            raise ScheduleError(f"rank {rank}: {a} before its forward")
        if a.stage < stages - 1 and ("B", a.mb, a.stage) not in received:
            raise ScheduleError(f"rank {rank}: {a} before its output gradient arrived")
