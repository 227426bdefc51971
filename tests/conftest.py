"""Shared fixtures: every async test runs on trio and asyncio; storage tests on both executors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import activememory as am

# A test that takes both a loop and an executor runs on two of the four pairs, which still
# run each loop and each executor: asyncio with threads (an asyncio bot) and trio inline (a
# virtual-time simulation). A test about the pairing itself is marked `full_matrix`.
PAIRS = {("asyncio", "thread"), ("trio", "inline")}


def _runs(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    loop, executor = params.get("anyio_backend"), params.get("executor")
    if params.get("storage") == "postgresql":
        return (
            (loop or "trio") == "trio"
            and (executor or "thread") == "thread"
            and item.get_closest_marker("sqlite_only") is None
        )
    if loop is None or executor is None or item.get_closest_marker("full_matrix"):
        return True
    return (loop, executor) in PAIRS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """PostgreSQL runs each public-API test once (on trio, thread executor: the store is the
    same under either loop and executor) and never a `sqlite_only` one; SQLite runs a test
    taking a loop and an executor on `PAIRS` unless it is marked `full_matrix`. The other
    combinations are deselected, not collected and skipped by the hundred."""
    keep = [item for item in items if _runs(item)]
    dropped = [item for item in items if not _runs(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["thread", "inline"])
def executor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def storage() -> str | None:
    """Where a test's memory keeps its transcripts: `open_memory(storage=...)`. SQLite
    (None) here; a module that imports `storage` from tests/pg_server.py runs on both stores."""
    return None


@pytest.fixture
async def mem(tmp_path: Path, executor: str, storage: str | None) -> AsyncIterator[am.Memory]:
    # Text only: the storage tests count batches and bytes, which the embedder's background
    # writes would change under them; vectors have their own tests (test_vectors.py,
    # test_recall_by_meaning.py), and every other test opens the default (with vectors).
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(
        tmp_path / "state",
        executor=executor,  # type: ignore[arg-type]
        config=config,
        storage=storage,
    ) as memory:
        yield memory
