"""Sub-agent transcripts (docs/design.md §4.11): one JSONL file per recall run.

Each run writes its prompt, tool calls, tool results, drafts and its end as JSON lines, as
they happen. By default the file lives in a private temporary folder and is deleted when
the run ends; with `persistTranscripts` it is kept at
`state_dir/agents/<agent>/sessions/<transcriptDir>/<run-id>.jsonl` (folders 0700, files
0600). A transcript that cannot be written never fails the recall: it stops writing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any

import msgspec

MAX_LINE_CHARS = 8000
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
    """The JSONL transcript of one run; `write` lines, then `finish` once."""

    def __init__(self, path: Path, *, keep: bool, started: float) -> None:
        self.path = path
        self.keep = keep
        self.started = started
        self.failed: str | None = None
        self._file: IO[bytes] | None = None
        try:
            if keep:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                os.chmod(path.parent, 0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            self._file = os.fdopen(fd, "wb")
        except OSError as exc:
            self.failed = f"cannot write the transcript ({exc.strerror})"

    def write(self, line: dict[str, Any], *, at: float) -> None:
        if self._file is None:
            return
        entry = {"at": round(at - self.started, 6), **line}
        data = _encode(entry)
        if len(data) > MAX_LINE_CHARS:
            data = _encode({"at": entry["at"], "type": line.get("type"), "truncated": True})
        try:
            self._file.write(data + b"\n")
        except OSError as exc:
            self.failed = f"cannot write the transcript ({exc.strerror})"
            self._close()

    def finish(self, end: object, *, at: float) -> None:
        """Write the run's end, close the file, delete it unless it is kept."""
        self.write({"type": "end", "report": msgspec.to_builtins(end)}, at=at)
        self._close()
        if not self.keep:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
