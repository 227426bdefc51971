"""The examples run offline, each on its own host style (trio, asyncio, blocking); the
example config loads; the README's python snippets run as written."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import activememory as am

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


README = EXAMPLES.parent / "README.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def readme_snippets() -> list[str]:
    return PYTHON_BLOCK.findall(README.read_text(encoding="utf-8"))


def test_the_example_config_loads_with_its_comments() -> None:
    text = (EXAMPLES / "config.json5").read_text(encoding="utf-8")
    assert "//" in text  # the comments are the point of the file
    config = am.load_config(EXAMPLES / "config.json5", env={})
    assert config.warnings == ()
    assert config.identity_of(am.parse_session_key("agent:main:direct:telegram:123")) == "alice"


def test_readme_python_snippets_run_as_written(tmp_path: Path) -> None:
    # In order, in one fresh folder, as a reader would paste them: the tour stores what the
    # later snippets search, recall and inspect. Offline: no network is configured.
    snippets = readme_snippets()
    assert len(snippets) >= 5
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLES / "config.json5", tmp_path / "examples" / "config.json5")
    outputs = []
    for number, code in enumerate(snippets, 1):
        script = tmp_path / f"snippet_{number}.py"
        script.write_text(code, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"README snippet {number}:\n{code}\n{done.stderr}"
        outputs.append(done.stdout)
    tour, search, bot = outputs[:3]
    assert "I like aisle seats" in tour
    assert search.splitlines()[-1].startswith("I like aisle seats ")  # found by meaning
    assert search.splitlines()[-1].endswith(" None")  # not a fallback to words alone
    assert "status=ok" in bot and "aisle" in bot  # recalled from alice's other chat
