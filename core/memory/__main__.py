"""``python -m core.memory [--json] [overrides]``: the memory estimate's per-rank breakdown of a config, without
running it (``core.memory.estimate``)."""

from __future__ import annotations

import argparse
import json
import sys

from core.config import ConfigError, load_config
from core.memory.breakdown import breakdown, format_breakdown


def main(argv: list[str] | None = None) -> int:
    """``python -m core.memory [--json] [overrides]``: the estimate's per-rank breakdown of a config, without
    running it. Exit 2 (with the field and the fix) for an invalid config, like ``core.train``."""
    parser = argparse.ArgumentParser(prog="python -m core.memory", description=main.__doc__)
    parser.add_argument("--json", action="store_true", help="print the breakdown as JSON (bytes)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m core.train")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.overrides)
    except ConfigError as exc:
        print(f"invalid config: {exc}", file=sys.stderr)
        return 2
    b = breakdown(cfg)
    print(json.dumps(b, indent=1) if args.json else format_breakdown(b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
