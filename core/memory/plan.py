"""The recompute plan: which blocks of each pipeline stage re-run their forward in backward, and how. Decided
once from the config; ``core.training.parallelize`` applies it (and keeps it on the ``Parallelized`` bundle),
the step factory (``core.training.step``) and the memory estimate read it. No MindSpore here.

How each mode runs (``core.memory.recompute`` says why):

    selective   the norms, the SwiGLU product and attention's softmax re-run (bprop-Cells), jit and PyNative
    full        PyNative, or a pipeline's last stage: MindSpore's recompute of whole blocks;
                jit without a pipeline: the step runs as compiled segments (``core.memory.segmented``)

``selective_op`` (torchtitan's per-op policy) is counted by ``core.memory`` and ``core.perf`` and never run:
``core.config.rules.RUN_RULES`` keep it out of ``core.train``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.config import TrainConfig


@dataclass(frozen=True)
class RecomputePlan:
    modes: tuple[str, ...]  # per pipeline stage (one without a pipeline): none | selective | selective_op | full
    layers: tuple[int | None, ...]  # per stage: its first this many blocks (memory.recompute_layers_of); None: all
    segmented: bool  # full recompute runs as a SegmentedStep: under jit, without a pipeline

    def mode(self, stage: int = 0) -> str:
        return self.modes[stage]

    def blocks(self, n_blocks: int, stage: int = 0) -> range:
        """The blocks of stage ``stage`` (of ``n_blocks`` blocks) marked for recompute: its first ``layers`` (all
        if None). FSDP gathers plainly inside them (``core.parallel.fsdp``)."""
        k = self.layers[stage]
        return range(n_blocks if k is None else min(k, n_blocks))

    def marked(self, blocks: Sequence[int], stage: int = 0) -> Sequence[int]:
        """Of stage ``stage``'s blocks (in order), those marked for recompute (``blocks``)."""
        return blocks[: len(self.blocks(len(blocks), stage))]

    def recomputed(self, blocks: Sequence[int], stage: int = 0) -> Sequence[int]:
        """Of stage ``stage``'s blocks (in order), those its mode recomputes: the marked ones, none under ``none``."""
        return blocks[:0] if self.mode(stage) == "none" else self.marked(blocks, stage)

    def modes_used(self, chunks: dict[int, Sequence[int]]) -> set[str]:
        """The modes that recompute some block of ``chunks`` (stage -> its blocks, as a pipeline rank holds them)."""
        return {self.mode(s) for s, blocks in chunks.items() if self.recomputed(blocks, s)}

    def rerun(self, blocks: Sequence[int], stage: int = 0) -> Sequence[int]:
        """Of stage ``stage``'s blocks (in order), those whose forward runs again in backward under its mode: the
        marked ones, except that the segmented step never recomputes the last block (its segment holds the loss:
        ``core.memory.segmented``)."""
        marked = self.recomputed(blocks, stage)
        if self.mode(stage) == "full" and self.segmented and len(marked) == len(blocks):
            return marked[:-1]
        return marked

    @property
    def segmented_full(self) -> bool:
        """Whether the step runs as compiled segments (full recompute, jit, no pipeline)."""
        return self.segmented and self.modes == ("full",)


def recompute_plan(cfg: TrainConfig) -> RecomputePlan:
    """The plan of ``cfg``: ``memory.recompute`` (or ``recompute_stages``) over its ``recompute_layers`` (or
    ``recompute_stage_layers``)."""
    pipeline, stages = cfg.parallel.pp > 1, range(cfg.parallel.stages)
    return RecomputePlan(
        modes=tuple(cfg.memory.recompute_of(s) for s in stages),
        layers=tuple(cfg.memory.recompute_layers_of(s) for s in stages),
        segmented=cfg.training.mode == "jit" and not pipeline,
    )
