"""``python -m autoresearch.agent --space parallel.yaml``: propose a trial, check it, run it, learn from how it
ended; repeat, then confirm the front-runners (``autoresearch.cli`` has the options and the flow).

    python -m autoresearch.agent --space parallel.yaml [--proposer auto|gp|claude|hybrid|tpe|random|grid]
                                 [--trials N] [--workers K] [--timeout SEC] [--max-cost USD]
                                 [--max-device-hours H] [--patience K] [--confirm K] [--repeats R]
                                 [--study NAME] [--storage URL]
"""

import sys

from autoresearch.cli import main

if __name__ == "__main__":
    sys.exit(main())
