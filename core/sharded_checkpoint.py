"""``python -m core.sharded_checkpoint consolidate SRC DST``: a sharded checkpoint as the single-file checkpoint of
the 1-process layout (``core.ckpt``)."""

import sys

from core.ckpt.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
