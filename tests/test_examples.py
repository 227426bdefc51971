"""The examples run offline, each on its own host style (trio, asyncio, blocking)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("trio_bot.py", "(with memory: The user always books an aisle seat.)"),
        ("asyncio_bot.py", "(with memory: The user drinks oolong tea daily.)"),
        ("blocking_bot.py", "(with memory: The user's dog is called Pixel.)"),
    ],
)
def test_example_bot_recalls_offline(tmp_path: Path, script: str, expected: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout
    assert "🧩 Active Memory: status=ok" in done.stdout
