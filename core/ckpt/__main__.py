"""``python -m core.ckpt consolidate SRC DST`` (also ``python -m core.sharded_checkpoint``): write a sharded
checkpoint as the single-file checkpoint of the 1-process layout.

``python -m core.ckpt export-hf SRC DST [--dtype bfloat16]``: write the model of a checkpoint (any layout) as a
Hugging Face model directory that ``transformers`` loads (``core.ckpt.hf``)."""

from __future__ import annotations

import argparse
import sys

from core.ckpt import hf
from core.ckpt.reader import load
from core.ckpt.sharded import consolidate
from core.ckpt.store import save_checkpoint
from core.config import ConfigError, from_dict

PREFIX = "model."  # the checkpoint's model tensors (core.ckpt.manager); the rest is optimizer state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.ckpt",
        description="Consolidate a sharded checkpoint into the 1-process layout, or export one to Hugging Face.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("consolidate", help="SRC (a sharded step_XXXXXXXX directory) -> DST/step_XXXXXXXX")
    c.add_argument("src")
    c.add_argument("dst")
    e = sub.add_parser("export-hf", help="SRC (a step_XXXXXXXX directory of any layout) -> DST, a Hugging Face model")
    e.add_argument("src")
    e.add_argument("dst")
    e.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the weights' storage type")
    e.add_argument("--max-shard-gb", type=float, default=5.0, help="largest weights file; more become shards")
    args = parser.parse_args(argv)
    if args.cmd == "consolidate":
        tensors, meta = consolidate(args.src)
        print(save_checkpoint(args.dst, int(meta["step"]), tensors, meta))
        return 0
    tensors, meta = load(args.src)
    model = {k[len(PREFIX) :]: v for k, v in tensors.items() if k.startswith(PREFIX)}
    try:
        cfg = from_dict(meta["config"]).model
        out = hf.save(args.dst, model, cfg, dtype=args.dtype, max_shard_bytes=int(args.max_shard_gb * 2**30))
    except ConfigError as err:
        print(f"cannot export {args.src}: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
