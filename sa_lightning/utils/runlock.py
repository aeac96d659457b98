"""One process at a time per run folder: a second ``fit`` into a folder that another process is training in
(the same ``--ckpt_path last`` resumed twice, a job started twice) is refused in one sentence, before it
writes anything. The lock is ``flock`` on ``<folder>/.fit.lock``: the system drops it when its process
ends, however it ends (``kill -9`` included), so a stale lock never blocks a later run."""
from __future__ import annotations

import os
import time
from pathlib import Path

LOCK_NAME = ".fit.lock"
#: locks this process holds, by path: a fit that ended in an exception (no teardown) leaves its lock here, and a
#: later fit of this same process in that folder (a study's next cell, a test) takes it over
_HELD: dict[Path, "RunLock"] = {}


class RunLock:
    """``name``: the lock file (``.fit.lock`` for a fit's folder; the runner's output folders have their own);
    ``what``: what the refusal calls the folder's run."""

    def __init__(self, folder: str | os.PathLike, name: str = LOCK_NAME, what: str | None = None,
                 shared: bool = False):
        self.path = Path(folder) / name
        self.what = what
        #: held beside other shared holders (a sweep array's tasks, each writing its own cells), never beside an
        #: exclusive one (a whole run of the folder)
        self.shared = shared
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        key = self.path.resolve()
        if key in _HELD:
            _HELD.pop(key).release()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            if self.what is not None:
                raise ValueError(f"{self.path.parent} is in use by {holder} (another {self.what} writing there): two "
                                 f"runs in one folder would replace each other's files; wait for it to end, or pass "
                                 "another --out.") from None
            raise ValueError(f"{self.path.parent} is in use by {holder}: two runs in one folder would overwrite "
                             "each other's checkpoints and logs; wait for it to end, or pass another "
                             "--trainer.default_root_dir.") from None
        if not self.shared:  # shared holders leave the file as it is (several hold it at once)
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
        self._fd = fd
        _HELD[key] = self

    def __enter__(self) -> "RunLock":
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
            if _HELD.get(self.path.resolve()) is self:
                del _HELD[self.path.resolve()]
