"""``python -m core.reference_rate [--device CPU] [--force]``: measure this machine's reference matmul rate, MFU's
fixed denominator (``core.runtime.reference_rate``)."""

import sys

from core.runtime.reference_rate import main

if __name__ == "__main__":
    sys.exit(main())
