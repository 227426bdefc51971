"""The flattened append path (`Sessions.append` awaits the store and its ack directly,
docs/design.md §1.2) answers as the general `_submit` path does: the committed event, the
same error for each rejection, `MemoryClosedError` once closed, and the embedder poke."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import activememory as am
from activememory._memory import _refused
from activememory.protocol.indexer import Rejected

from fake_embedder import FakeEmbedder

pytestmark = [pytest.mark.anyio, pytest.mark.full_matrix]  # about executors and loops

ALICE = "agent:main:direct:alice"


@pytest.mark.parametrize(
    ("reason", "error"),
    [
        ("not_found", am.SessionNotFoundError),
        ("invalid", am.InvalidInputError),
        ("closed", am.MemoryClosedError),
        ("storage", am.StorageError),
    ],
)
def test_each_rejection_raises_its_error(reason: str, error: type[Exception]) -> None:
    with pytest.raises(error, match="^why$"):
        _refused(Rejected(reason=reason, message="why"))  # type: ignore[arg-type]


async def test_append_returns_the_committed_event(mem: am.Memory) -> None:
    first = await mem.sessions.append(ALICE, am.Message(role="user", content="bees on the roof"))
    second = await mem.sessions.append(ALICE, {"role": "assistant", "content": "honey then"})
    assert await mem.sessions.history(ALICE) == [first, second]
    found = await mem.sessions.search("bees", caller=ALICE)
    assert found.results[0].message_id == first.id  # the next holds it as context


async def test_append_after_close_is_refused(tmp_path: Path) -> None:
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(tmp_path / "state", config=config) as mem:
        await mem.sessions.append(ALICE, am.Message(role="user", content="hi"))
    with pytest.raises(am.MemoryClosedError):
        await mem.sessions.append(ALICE, am.Message(role="user", content="again"))


async def test_an_append_pokes_the_embedder(tmp_path: Path) -> None:
    """With an embedder, the appended message gets its vector (the poke after the ack)."""
    embedder = FakeEmbedder()
    async with am.open_memory(tmp_path / "state", embedder=embedder) as mem:
        await mem.sessions.append(ALICE, am.Message(role="user", content="bees on the roof"))
        with anyio.fail_after(10):
            assert await mem.sessions.vectors_ready()
        (stats,) = await mem.sessions.stats(check_integrity=False)
        assert stats.vectors_pending == 0
        assert embedder.texts == ["bees on the roof"]
