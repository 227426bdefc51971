"""`doctor` says how to clear each warning it prints, and running that command clears it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from activememory._cli import main


@pytest.mark.filterwarnings("ignore::activememory.ConfigWarning")  # the deprecated key, on purpose
def test_every_warning_comes_with_the_command_that_fixes_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(
        '{"type": "session", "key": "agent:main:direct:z"}\n'
        '{"type": "message", "id": "1", "timestamp": 5, "message": {"role": "user", "content": "tea"}}\n'
    )
    state = tmp_path / "state dir"  # a space: the suggested command quotes it
    assert main(["import", str(transcript), "--state-dir", str(state), "--no-rebuild"]) == 0
    config = tmp_path / "am.json5"
    config.write_text(
        '{plugins: {entries: {"active-memory": {config: {enabled: false, toolsAllow: ["memory_get"],'
        ' modelFallbackPolicy: "x"}}}}}'
    )
    capsys.readouterr()
    doctor = ["doctor", "--state-dir", str(state), "--config", str(config)]
    assert main([*doctor, "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    warned = [c for c in checks if c["level"] != "ok"]
    assert all(c.get("fix") for c in warned) and all(
        "fix" not in c for c in checks if c not in warned
    )
    fixes = {c["name"]: c["fix"] for c in warned}
    reindex = f"activememory reindex --state-dir {shlex.quote(str(state))} --agent main"
    assert fixes == {
        "plugin": f"set plugins.entries.active-memory.config.enabled to true in {config}",
        "config": (
            f"remove plugins.entries.active-memory.config.modelFallbackPolicy from {config}"
        ),
        "tools:main": f'add "memory_search" to plugins.entries.active-memory.config.toolsAllow in {config}',
        "index:main": reindex,
    }

    assert main(doctor) == 0
    assert f"       fix: {reindex}" in capsys.readouterr().out.splitlines()
    # Running the suggested command clears the index warning.
    assert main(shlex.split(reindex)[1:]) == 0
    capsys.readouterr()
    assert main([*doctor, "--json"]) == 0
    index = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}["index:main"]
    assert index["level"] == "ok" and "fix" not in index
