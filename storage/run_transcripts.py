"""Sub-agent transcripts (docs/design.md §4.11): one JSONL file per recall run.

Each run writes its prompt, tool calls, tool results, drafts and its end as JSON lines, as
they happen. With `persistTranscripts` the file is kept at
`state_dir/agents/<agent>/sessions/<transcriptDir>/<run-id>.jsonl` (folders 0700, files
0600). By default the transcript is temporary: nothing reads it, and it would be deleted
when the run ends, so it is written lazily — its lines stay in memory (`MAX_TEMP_LINES`)
and reach a file in a private temporary folder only if something asks for one
(`SubAgentTranscript.spill`); at the end the lines are dropped and that file deleted. No
file system call is left on the recall path by default (docs/design.md §4.11). A
transcript that cannot be written never fails the recall: it stops writing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import msgspec

MAX_LINE_CHARS = 8000
MAX_TEMP_LINES = 1000
"""Lines a temporary transcript keeps in memory; later ones are dropped (a runaway run)."""
_encode = msgspec.json.Encoder().encode


class TranscriptPlace:
    """Where the transcripts of one `open_memory()` go: a private temp folder, or kept."""

    def __init__(self, state_dir: Path, *, keep: bool = True) -> None:
        self.state_dir = state_dir
        # False for a read-only memory (docs/design.md §1.6): nothing is kept in the store,
        # whatever `persistTranscripts` says.
        self.keep = keep
        self._temp: Path | None = None

    def temp_dir(self) -> Path:
        if self._temp is None:
            self._temp = Path(tempfile.mkdtemp(prefix="activememory-runs-"))  # 0700
        return self._temp

    def kept_path(self, agent: str, transcript_dir: str, run_id: str) -> Path | None:
        """The persisted file's path, or None if `transcript_dir` would leave the folder."""
        sessions = (self.state_dir / "agents" / agent / "sessions").resolve()
        target = (sessions / transcript_dir).resolve()
        if not target.is_relative_to(sessions) or target == sessions:
            return None  # a symlink or a crafted name pointing outside: never write there
        return target / f"{run_id}.jsonl"

    def close(self) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None


class SubAgentTranscript:
    """The JSONL transcript of one run; `write` lines, then `finish` once.

    `path` None: a temporary transcript, kept in memory (`lines`) until `spill` writes it
    to a file in `spill_dir`; kept (`keep`) transcripts are written as they happen.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        keep: bool,
        started: float,
        spill_dir: Callable[[], Path] | None = None,
    ) -> None:
        self.path = path
        self.keep = keep
        self.started = started
        self.failed: str | None = None
        self._file: IO[bytes] | None = None
        self._lines: list[bytes] | None = None
        self._spill_dir = spill_dir
        self._done = False
        # A caller that wants the lines back (`mem.trace_recall`): each one, decoded again.
        self.tap: list[dict[str, Any]] | None = None
        if path is None:
            self._lines = []
            return
        self._open(path)

    def _open(self, path: Path) -> None:
        try:
            if self.keep:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                os.chmod(path.parent, 0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            self._file = os.fdopen(fd, "wb")
        except OSError as exc:
            self.failed = f"cannot write the transcript ({exc.strerror})"

    @property
    def lines(self) -> list[bytes]:
        """The JSON lines written so far, while the transcript is in memory (else [])."""
        return list(self._lines or [])

    def spill(self, name: str) -> Path | None:
        """Write a temporary transcript to `spill_dir()/name` and keep writing there (for
        whoever wants to read it as a file); its path, or None if it cannot be written or
        has ended. A kept transcript is a file already: its path."""
        if self._lines is None or self._done:
            return self.path if not self._done else None
        if self._spill_dir is None:
            return None
        path = self._spill_dir() / name
        self.path = path
        lines, self._lines = self._lines, None
        self._open(path)
        for data in lines:
            self._put(data)
        return path if self._file is not None else None

    def write(self, line: dict[str, Any], *, at: float) -> None:
        if self._done:
            return
        entry = {"at": round(at - self.started, 6), **line}
        data = _encode(entry)
        if len(data) > MAX_LINE_CHARS:
            data = _encode({"at": entry["at"], "type": line.get("type"), "truncated": True})
        if self.tap is not None and len(self.tap) < MAX_TEMP_LINES:
            self.tap.append(msgspec.json.decode(data))
        if self._file is None and self._lines is None:
            return
        if self._lines is not None:
            if len(self._lines) < MAX_TEMP_LINES:
                self._lines.append(data)
            return
        self._put(data)

    def _put(self, data: bytes) -> None:
        if self._file is None:
            return
        try:
            self._file.write(data + b"\n")
            self._file.flush()  # readable as it happens: a spilled file is there to be read
        except OSError as exc:
            self.failed = f"cannot write the transcript ({exc.strerror})"
            self._close()

    def finish(self, end: object, *, at: float) -> None:
        """Write the run's end, close the file, delete it unless it is kept."""
        self.write({"type": "end", "report": msgspec.to_builtins(end)}, at=at)
        self._done = True
        self._lines = None
        self._close()
        if not self.keep and self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
