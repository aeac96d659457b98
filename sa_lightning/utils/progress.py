"""A line at least every 30 s while a long piece of work runs, so that a quiet command is never mistaken for a hung
one (``analyze``'s checks, which may draw for minutes between their own lines)."""
from __future__ import annotations

import threading
import time

#: seconds between two lines at most
EVERY = 30.0


class Heartbeat:
    """``with Heartbeat("analyze reach"):`` prints ``analyze reach: still at work, 30 s`` every ``every`` seconds
    while the block runs (a daemon thread; it stops with the block, and prints nothing for a block shorter than
    ``every``)."""

    def __init__(self, what: str, every: float | None = None):
        self.what, self.every = what, EVERY if every is None else every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _beat(self) -> None:
        start = time.monotonic()
        while not self._stop.wait(self.every):
            print(f"{self.what}: still at work, {time.monotonic() - start:.0f} s", flush=True)

    def __enter__(self) -> "Heartbeat":
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat: {self.what}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
