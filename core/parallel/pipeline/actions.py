"""One step of a pipeline schedule's per-rank list (``schedules.py`` builds and checks the lists, ``mpipe.py``
transforms them, ``runtime.py`` runs them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    """``op`` is F or B (compute), or send_F / recv_F (an activation) or send_B / recv_B (its gradient);
    ``stage`` is the virtual stage the computation belongs to (for a send: the stage that receives it). mpipe adds
    P and R (computations of stage 0's preprocess block), send_P / recv_P (a micro-batch preprocessed, to stage
    0) and send_W / recv_W (the preprocess weights, ``mb`` -1, ``stage`` the receiving rank)."""

    op: str
    mb: int
    stage: int
    peer: int = -1  # the other rank of a send or receive

    def __repr__(self) -> str:
        return f"{self.op}{self.mb}@{self.stage}" + (
            f"->{self.peer}" if self.op.startswith("send") else f"<-{self.peer}" if self.op.startswith("recv") else ""
        )
