"""A wall-clock limit on a block of code, shared by the fuzzer and the mutation harness: a wrong
pass (or a mutant) can make a loop endless, and a campaign must go on to the next case."""

from __future__ import annotations

import contextlib
import signal
import threading


class CaseTimeout(BaseException):
    """A case over its time limit. Not an Exception: fexplore's own ``except Exception`` (which
    turns torch.export's failures into ExportError) must not swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raises CaseTimeout in the block after ``seconds`` (main thread only: elsewhere, no limit)."""
    if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout(f"over {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
