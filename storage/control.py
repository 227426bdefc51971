"""The control spool of a state directory (docs/design.md §1.7): how another process asks
the running bot to do a write through its own writers.

    state_dir/control/            0700: only the state directory's user may ask
        serve.lock                flock'ed by the one process that serves requests
        requests/<id>.json        a request (written as .<id>.tmp, then renamed)
        results/<id>.json         its result (the same way)

A request is taken by whoever unlinks it first: the serving bot (then it answers) or the
asker withdrawing it after a timeout (then nothing was done). Plain files only: a copy of
the state directory (`cp -r`, `shutil.copytree`) copies them as it copies the databases.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import uuid
from pathlib import Path

from ..protocol.errors import StorageError

CONTROL_DIR = "control"


class Spool:
    """The control folder of `state_dir`; each method is a few small system calls."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / CONTROL_DIR
        self.requests = self.root / "requests"
        self.results = self.root / "results"
        self._lock_fd: int | None = None

    # -- the serving side (the bot) --------------------------------------------------------

    def serve(self) -> bool:
        """Create the folders (0700) and take `serve.lock`; False when another process
        serves this state directory already (it answers; this one stays quiet), or the
        folder cannot be made (a state directory we cannot write: the first write says
        so, as before; an operator's erase then finds nobody serving)."""
        try:
            for folder in (self.root, self.requests, self.results):
                folder.mkdir(mode=0o700, exist_ok=True)
            os.chmod(self.root, 0o700)  # the umask may have widened it
            fd = os.open(self.root / "serve.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def close(self) -> None:
        """Stop serving: release `serve.lock`."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def pending(self) -> list[str]:
        """Ids of the waiting requests, oldest first (none when the folder cannot be read:
        the bot goes on, and the asker's timeout says nobody answered)."""
        found = []
        try:
            with os.scandir(self.requests) as entries:
                for e in entries:
                    if e.name.endswith(".json") and not e.name.startswith("."):
                        with contextlib.suppress(FileNotFoundError):  # withdrawn meanwhile
                            found.append((e.stat().st_mtime_ns, e.name[: -len(".json")]))
        except OSError:
            return []
        return [name for _, name in sorted(found)]

    def take(self, request_id: str) -> bytes | None:
        """Read and remove request `request_id`; None if it is gone (withdrawn) or is not
        a regular file of this user (nobody else may ask)."""
        path = self.requests / f"{request_id}.json"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink()  # a symlink or something unreadable: never served
            return None
        try:
            st = os.fstat(fd)
            data = os.read(fd, MAX_REQUEST_BYTES + 1) if _ours(st) else None
        finally:
            os.close(fd)
        try:
            path.unlink()
        except OSError:
            return None  # the asker withdrew it first (or it cannot be removed: not served)
        return data

    def answer(self, request_id: str, data: bytes) -> None:
        """Write the result of `request_id` (atomically)."""
        _write_atomically(self.results, request_id, data)

    # -- the asking side (the CLI) ---------------------------------------------------------

    def served(self) -> bool:
        """Whether a process serves this state directory now (it holds `serve.lock`)."""
        try:
            fd = os.open(self.root / "serve.lock", os.O_RDWR)
        except OSError:
            return False  # never served here
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # also drops the probe's lock
        return False

    def ask(self, data: bytes) -> str:
        """Queue a request; its id."""
        request_id = uuid.uuid4().hex
        _write_atomically(self.requests, request_id, data)
        return request_id

    def withdraw(self, request_id: str) -> bool:
        """Remove a request not taken yet; False when the server has taken it."""
        try:
            (self.requests / f"{request_id}.json").unlink()
        except FileNotFoundError:
            return False
        return True

    def result(self, request_id: str) -> bytes | None:
        """The result of `request_id` once written (then removed), else None."""
        path = self.results / f"{request_id}.json"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        path.unlink()
        return data


MAX_REQUEST_BYTES = 64 * 1024  # a request names an identity: anything bigger is refused


def _ours(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def _write_atomically(folder: Path, name: str, data: bytes) -> None:
    tmp = folder / f".{name}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.rename(tmp, folder / f"{name}.json")
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StorageError(f"cannot write {str(folder)!r} ({exc.strerror})") from None
