"""Visibility resolved inside SQLite (docs/design.md §3): `storage.search.visible` gives, for
every scope on any store, exactly what reading the scope's sessions into Python gave — the
same clean sessions, the same count of dirty ones, the same "anything dirty" and the same
rowid span of a small scope — and `search_scope` finds the same matches either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activememory.protocol.config import SINGLE_OWNER, PrivateScope
from activememory.protocol.session_key import parse_session_key
from activememory.storage.db import open_connection
from activememory.storage.search import (
    SPAN_MAX_SESSIONS,
    DbScope,
    Visible,
    scope_sql,
    visible,
)

KEYS = [
    "agent:main:main",
    *(f"agent:main:direct:p{i}" for i in range(4)),
    *(f"agent:main:explicit:x{i}" for i in range(3)),
    "agent:main:group:g0",
    "agent:main:channel:c0",
    "agent:ops:direct:p0",
    "legacy-1",
]
SCOPES: list[DbScope] = [
    "self",
    "tree",
    "all",
    SINGLE_OWNER,
    PrivateScope(peers=("p1", "p2"), owner=False),
    PrivateScope(peers=(), owner=True),
]

session = st.fixed_dictionaries(
    {
        "dirty": st.booleans(),
        "persistent": st.booleans(),
        "interactive": st.booleans(),
        "archived": st.booleans(),
        "sandboxed": st.booleans(),
        "spawned_by": st.none() | st.sampled_from(KEYS),
        "events": st.integers(0, 3),
    }
)
stores = st.lists(st.tuples(st.sampled_from(KEYS), session), max_size=12, unique_by=lambda s: s[0])


def _store(conn: apsw.Connection, sessions: list[tuple[str, dict[str, object]]]) -> None:
    with conn:
        conn.execute("DELETE FROM events")
        conn.execute("DELETE FROM sessions")
        for sid, (key, s) in enumerate(sessions, start=1):
            parsed = parse_session_key(key)
            conn.execute(
                "INSERT INTO sessions(id, key, agent, chat_type, conversation_id, persistent,"
                " interactive, archived, sandboxed, spawned_by, created_at, updated_at, dirty)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ?)",
                (
                    sid,
                    key,
                    parsed.agent,
                    parsed.chat_type,
                    parsed.conversation_id,
                    s["persistent"],
                    s["interactive"],
                    s["archived"],
                    s["sandboxed"],
                    s["spawned_by"],
                    s["dirty"],
                ),
            )
        # Events of all sessions interleaved, so spans overlap as in a real store.
        seq = dict.fromkeys(range(1, len(sessions) + 1), 0)
        for round_ in range(3):
            for sid, (_, s) in enumerate(sessions, start=1):
                if round_ < int(str(s["events"])):
                    seq[sid] += 1
                    conn.execute(
                        "INSERT INTO events(session_id, seq, depth, ts, kind, role, text)"
                        " VALUES (?, ?, ?, 0, 'message', 'user', 'hi')",
                        (sid, seq[sid], seq[sid]),
                    )


def _by_python(
    conn: apsw.Connection, scope: DbScope, caller: str, session_key: str | None
) -> tuple[set[int], int, bool, tuple[int, int] | None]:
    """What the search did before: the scope's rows read into Python, a span per session."""
    sql, params = scope_sql(scope, caller, session_key)
    rows = [(int(sid), int(dirty)) for sid, dirty in conn.execute(sql, params)]
    clean = [sid for sid, dirty in rows if not dirty]
    any_dirty = conn.execute("SELECT 1 FROM sessions WHERE dirty LIMIT 1").fetchone() is not None
    span = None
    if clean and len(clean) <= SPAN_MAX_SESSIONS:
        low = high = None
        for sid in clean:
            first, last = conn.execute(
                "SELECT (SELECT id FROM events WHERE session_id = ?1 ORDER BY seq LIMIT 1),"
                " (SELECT id FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1)",
                (sid,),
            ).fetchone() or (None, None)
            if first is None:
                continue
            low = first if low is None else min(low, first)
            high = last if high is None else max(high, last)
        span = (low or 0, high or 0)
    return set(clean), len(rows) - len(clean), any_dirty, span


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sessions=stores,
    scope=st.sampled_from(SCOPES),
    caller=st.sampled_from(KEYS),
    only=st.none() | st.sampled_from(KEYS),
)
def test_visible_equals_the_scope_read_into_python(
    tmp_path_factory: pytest.TempPathFactory,
    sessions: list[tuple[str, dict[str, object]]],
    scope: DbScope,
    caller: str,
    only: str | None,
) -> None:
    conn = open_connection(tmp_path_factory.mktemp("visible") / "agent.db", writer=True)
    try:
        _store(conn, sessions)
        got = visible(conn, *scope_sql(scope, caller, only))
        assert isinstance(got, Visible)
        clean, dirty, any_dirty, span = _by_python(conn, scope, caller, only)
        assert set(json.loads(got.clean_ids)) == clean
        assert (got.clean, got.dirty, got.any_dirty, got.span) == (
            len(clean),
            dirty,
            any_dirty,
            span,
        )
    finally:
        conn.close()


def test_a_large_scope_has_no_span(tmp_path: Path) -> None:
    """Past SPAN_MAX_SESSIONS clean sessions the search reads the whole table (no span)."""
    conn = open_connection(tmp_path / "agent.db", writer=True)
    try:
        many = [(f"agent:main:direct:n{i}", {**_PLAIN}) for i in range(SPAN_MAX_SESSIONS + 1)]
        _store(conn, many)
        got = visible(conn, *scope_sql(SINGLE_OWNER, "agent:main:main", None))
        assert (got.clean, got.dirty, got.span) == (SPAN_MAX_SESSIONS + 1, 0, None)
        assert len(json.loads(got.clean_ids)) == SPAN_MAX_SESSIONS + 1
    finally:
        conn.close()


_PLAIN: dict[str, object] = {
    "dirty": False,
    "persistent": True,
    "interactive": True,
    "archived": False,
    "sandboxed": False,
    "spawned_by": None,
    "events": 1,
}
