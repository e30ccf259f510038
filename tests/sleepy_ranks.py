"""Ranks that report their process id and then wait, as a rank stuck in a collective would, until stopped."""

from __future__ import annotations

import os
import time

from headroom.agent.launch import (
    emit,  # the standard library only: these ranks start in milliseconds
)

if __name__ == "__main__":
    emit("pid", int(os.environ["RANK"]), {"pid": os.getpid()})
    time.sleep(300)
