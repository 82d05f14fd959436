"""``python -m core.ckpt consolidate SRC DST`` (also ``python -m core.sharded_checkpoint``): write a sharded
checkpoint as the single-file checkpoint of the 1-process layout."""

from __future__ import annotations

import argparse
import sys

from core.ckpt.sharded import consolidate
from core.ckpt.store import save_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.sharded_checkpoint",
        description="Consolidate a sharded checkpoint into the 1-process layout.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("consolidate", help="SRC (a sharded step_XXXXXXXX directory) -> DST/step_XXXXXXXX")
    c.add_argument("src")
    c.add_argument("dst")
    args = parser.parse_args(argv)
    tensors, meta = consolidate(args.src)
    print(save_checkpoint(args.dst, int(meta["step"]), tensors, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
