"""The wheel: built from the tracked files with no build warning, holding every sub-package
and the sample data, and no top-level `actors`/`protocol`/`storage`/`simulations`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from activememory.embed import SHIPPED_MODELS

ROOT = Path(__file__).resolve().parent.parent


def _tracked_copy(dest: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src, out = ROOT / name.decode(), dest / name.decode()
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            out.symlink_to(src.readlink())
        elif src.is_file():
            shutil.copy2(src, out)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout")
    tmp = tmp_path_factory.mktemp("wheel")
    src = _tracked_copy(tmp / "src")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = (tmp / "dist").glob("activememory-*.whl")
    return path, built.stdout + built.stderr


def test_the_wheel_builds_without_warnings(wheel: tuple[Path, str]) -> None:
    _, log = wheel
    warnings = [line for line in log.splitlines() if "Warning" in line or "!!" in line]
    assert warnings == []


def test_the_wheel_holds_every_package_and_the_sample_data(wheel: tuple[Path, str]) -> None:
    path, _ = wheel
    names = set(zipfile.ZipFile(path).namelist())
    for module in (
        "activememory/__init__.py",
        "activememory/py.typed",
        "activememory/data/sample-alice.jsonl",
        "activememory/data/sample-team.jsonl",
        "activememory/actors/indexer.py",
        "activememory/protocol/config.py",
        "activememory/storage/db.py",
        "activememory/simulations/timeouts.py",
        "activememory/simulations/bench/data/paraphrase.json",
        "activememory/embed/local.py",
        "activememory/embed/openai.py",
    ):
        assert module in names
    tops = {name.split("/")[0] for name in names}
    assert {"actors", "protocol", "storage", "simulations"}.isdisjoint(tops)


@pytest.mark.parametrize("model", list(SHIPPED_MODELS))
def test_the_wheel_ships_the_embedding_models(wheel: tuple[Path, str], model: str) -> None:
    path, _ = wheel
    folder = f"activememory/embed/models/{model}/"
    files = {*SHIPPED_MODELS[model].sha256, "tokenizer.json", "LICENSE", "NOTICE"}
    with zipfile.ZipFile(path) as zf:
        for name in sorted(files):
            shipped = zf.read(folder + name)
            assert shipped == (ROOT / folder / name).read_bytes(), name
        assert not any(n.startswith("tools/") for n in zf.namelist())


def test_the_license_file_is_the_declared_license() -> None:
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert declared == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
    assert (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").startswith("# Changelog\n")
