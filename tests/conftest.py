"""Shared fixtures: every async test runs on trio and asyncio; storage tests on both executors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import activememory as am


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
