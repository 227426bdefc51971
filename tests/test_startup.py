"""Start-up (docs/design.md §7, §9): `import activememory` and `activememory --help` load none
of the runtime, `activememory simulate` keeps its stores off the disk and leaves no thread
behind, and `bench startup` reports what it promises. Semantics, never timings.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import activememory.simulations.timeouts as timeouts
from activememory._cli import main
from activememory.simulations.bench.startup import NOT_FOR_HELP, NOT_FOR_IMPORT, unwanted

TIMEOUT_S = 120


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (printed on stderr, since
    `--help` writes on stdout)."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)), file=sys.stderr)"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stderr.splitlines()[-1]))


def test_unwanted_names_a_module_or_the_package_it_is_in() -> None:
    loaded = {"trio._core", "numpyish", "activememory.storage", "activememory.storage.db"}
    names = ("trio", "numpy", "activememory.storage", "httpx")
    assert unwanted(loaded, names) == ["trio", "activememory.storage"]


def test_import_loads_the_protocol_types_alone() -> None:
    loaded = loaded_after("import activememory")
    assert unwanted(loaded, NOT_FOR_IMPORT) == []
    assert "activememory.protocol.content" in loaded  # the types are there, eagerly


def test_the_store_api_loads_no_http_client_and_no_encoder() -> None:
    """httpx comes with the first OpenAI-compatible client, onnxruntime and tokenizers with
    the first local embedding: a bot on local models never loads httpx."""
    loaded = loaded_after("import activememory as am\nam.open_memory, am.Records, am.sync")
    assert unwanted(loaded, ("httpx", "onnxruntime", "tokenizers")) == []


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_load_no_runtime(flag: str) -> None:
    code = (
        "from activememory._cli import main\n"
        "try:\n"
        f"    main([{flag!r}])\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0\n"
    )
    assert unwanted(loaded_after(code), NOT_FOR_HELP) == []


def test_a_command_loads_the_runtime_it_runs_with(tmp_path: Path) -> None:
    """The lazy imports are only deferred: a command that opens the store gets all of it."""
    sample = Path(timeouts.__file__).parents[1] / "data" / "sample-alice.jsonl"
    argv = ["import", str(sample), "--state-dir", str(tmp_path / "state"), "--no-rebuild"]
    loaded = loaded_after(f"from activememory._cli import main\nassert main({argv!r}) == 0")
    assert {"trio", "activememory._memory", "activememory.actors.supervisor"} <= loaded


def test_simulation_stores_go_to_the_ram_folder_and_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ram = tmp_path / "ram"
    ram.mkdir()
    monkeypatch.setattr(timeouts, "RAM_FOLDERS", (tmp_path / "absent", ram))
    assert timeouts.scratch_root() == str(ram)
    used: list[Path] = []
    real = timeouts.tempfile.TemporaryDirectory

    def recording(**kwargs: str) -> timeouts.tempfile.TemporaryDirectory[str]:
        made = real(**kwargs)
        used.append(Path(made.name))
        return made

    monkeypatch.setattr(timeouts.tempfile, "TemporaryDirectory", recording)
    (scenario,) = [s for s in timeouts.scenarios() if s.name == "raise"]
    assert timeouts.run_scenario(scenario).problems == []
    assert [p.parent for p in used] == [ram]
    assert list(ram.iterdir()) == []  # removed after the scenario


def test_without_a_ram_folder_the_default_temp_folder_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timeouts, "RAM_FOLDERS", (tmp_path / "absent",))
    assert timeouts.scratch_root() is None


def blocked_in_an_event(thread: threading.Thread) -> bool:
    """Whether `thread` waits in `threading.Event.wait` (the adversary's gate); trio's idle
    cache workers wait on a lock instead."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "wait" and isinstance(
            frame.f_locals.get("self"), threading.Event
        ):
            return True
        frame = frame.f_back
    return False


def test_a_thread_blocked_in_an_event_is_seen() -> None:
    gate = threading.Event()
    stuck = threading.Thread(target=gate.wait, daemon=True)
    stuck.start()
    try:
        for _ in range(1000):  # until it is inside wait()
            if blocked_in_an_event(stuck):
                break
            threading.Event().wait(0.001)
        assert blocked_in_an_event(stuck)
    finally:
        gate.set()
        stuck.join(TIMEOUT_S)
    assert not blocked_in_an_event(stuck)


def test_simulate_leaves_no_thread_blocked_behind() -> None:
    """The thread-blocking adversary's worker is released before its memory closes: what
    stays is trio's idle thread cache (daemons), nothing a process exit would wait for."""
    before = set(threading.enumerate())
    (scenario,) = [s for s in timeouts.scenarios() if s.name == "block a thread"]
    assert timeouts.run_scenario(scenario).problems == []
    left = [t for t in threading.enumerate() if t not in before]
    assert [t for t in left if not t.daemon] == []
    assert [t for t in left if blocked_in_an_event(t)] == []


def test_the_startup_benchmark_reports_its_structure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "startup", "--repeat", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["repeat"] == 1
    assert report["floor_import_msgspec_ms"] > 0 and report["floor_python_ms"] > 0
    now = report["current"]
    assert now["import_ms"] > 0 and now["help_ms"] > 0 and now["version_ms"] > 0
    assert now["import_loads"] == [] and now["help_loads"] == []
    assert {"wall_s", "cpu_s", "ratio"} <= set(now["simulate"])
    assert set(report["verdicts"]) >= {
        "import_vs_msgspec",
        "import_loads_no_runtime",
        "help_loads_no_runtime",
        "simulate_wall_vs_cpu",
    }
    assert report["verdicts"]["import_loads_no_runtime"]
    assert report["verdicts"]["help_loads_no_runtime"]


def test_against_must_be_a_checkout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "startup", "--against", str(tmp_path)])
    assert done.value.code == 2
    assert f"--against: {str(tmp_path)!r} holds no activememory/__init__.py" in (
        capsys.readouterr().err
    )
