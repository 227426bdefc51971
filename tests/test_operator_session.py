"""The README's operator session is `examples/operator_session.sh`, and it runs: a bot in
one process, the CLI in others inspecting, exporting and erasing dana's data beside it,
then proving she is gone while the bot chats on (docs/design.md §1.7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "operator_session.sh"


def test_the_readme_shows_the_script_as_it_is() -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"```sh\n{SCRIPT.read_text()}```\n" in readme


def test_the_operator_session_runs(tmp_path: Path) -> None:
    # `python3` and `activememory` of this environment come first on PATH.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["sh", str(SCRIPT), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out, err = done.stdout, done.stderr
    # Before: dana's chat and record are found; her export has them.
    assert out.count("My locker code is zebra-4471") == 2  # her message and the reply
    assert "dana's locker code: zebra-4471" in out
    assert "exported 1 sessions (2 events), 1 records and 0 relations of dana" in err
    assert "zebra-4471" in (tmp_path / "dana.jsonl").read_text()
    assert "agent main: would erase 1 sessions" in out
    # The erase ran in the bot, beside which everything else read.
    bot_pid = "erased by the running bot (pid "
    assert bot_pid in err
    assert "agent main: erased 1 sessions, 2 events" in out
    assert "records: erased 1 records and 0 relations" in out
    # After: nothing of dana is found, exported or left in any file.
    assert out.count("no matches\n") == 2
    assert "exported 0 sessions (0 events), 0 records and 0 relations of dana" in err
    assert "no file of the state directory holds 'zebra'" in out
    # The bot chatted on after the erase.
    assert "Noted: the hive swarmed today" in out
    assert "already open for writing" not in err
