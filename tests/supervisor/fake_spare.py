"""TEST-ONLY stand-in for `python -m training.worker --standby`: a spare that never says
anything (stuck before its first message, as in a GPU driver call). Ignores its arguments."""

from __future__ import annotations

import time

if __name__ == "__main__":
    time.sleep(600)  # the test kills it long before
