"""Row-level security on the PostgreSQL store (docs/design.md §11 "Row-level security").

Two real login roles, each bound to its own agents by the owner's `grant_agent`: through
`PgTranscriptWriter`/`PgTranscriptReader` and by hand-written SQL, each reads and writes its
agents' rows only; every table with an `agent` column is covered, also one added later.
The roles are cluster-wide: made with random names and dropped at the end, after the
database (which holds their privileges) is dropped.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg.errors
import pytest

import activememory as am
from activememory.protocol.indexer import Appended, AppendMessage, Rejected, SetSwitches
from activememory.protocol.recall import SessionSwitches
from activememory.storage.fts_query import plan_match
from activememory.storage.pg.db import SCHEMA, PgSettings, connect
from activememory.storage.pg.search import search_scope
from activememory.storage.pg.transcripts import PgTranscriptReader, PgTranscriptWriter

from pg_server import ADMIN_DSN, scratch_database

KEY = am.parse_session_key("agent:main:direct:alice")


@dataclass(frozen=True)
class Store:
    dsn: str  # the owner's (the schema's creator: row security does not bind it)
    roles: tuple[str, str]
    agents: dict[str, list[str]]  # role -> the agents it is bound to

    def as_role(self, role: str) -> psycopg.Connection[Any]:
        return connect(PgSettings(dsn=psycopg.conninfo.make_conninfo(self.dsn, user=role)))


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    tag = secrets.token_hex(4)
    roles = (f"am_rls_{tag}_a", f"am_rls_{tag}_b")
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        for role in roles:
            admin.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            with scratch_database() as dsn:
                yield _populated(dsn, roles)
        finally:  # the database went first, and with it every privilege of the roles
            for role in roles:
                admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def _populated(dsn: str, roles: tuple[str, str]) -> Store:
    agents = {roles[0]: ["rls_a1", "rls_a2"], roles[1]: ["rls_b"]}
    owner = _autocommit(connect(PgSettings(dsn=dsn)))
    for role, names in agents.items():
        for agent in names:
            owner.execute(f"SELECT {SCHEMA}.grant_agent(%s, %s)", (role, agent))
            writer = PgTranscriptWriter(owner, agent)
            acks = writer.apply(
                [
                    _append(f"{agent} owner wrote this"),
                    SetSwitches(key=KEY, verbose=True),
                ]
            )
            assert all(not isinstance(ack, Rejected) for ack in acks), acks
    owner.close()
    return Store(dsn=dsn, roles=roles, agents=agents)


def _found(reader: PgTranscriptReader, query: str) -> bool:
    plan = plan_match(query)
    assert plan is not None
    page = search_scope(
        reader.connection(),
        reader.agent,
        plan,
        scope="all",
        caller=KEY.raw,
        session_key=None,
        keep=5,
    )
    return bool(page.candidates)


def _autocommit(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.autocommit = True
    return conn


def _append(text: str) -> AppendMessage:
    return AppendMessage(key=KEY, message=am.Message(role="user", content=text), at=1.0)


def _agent_tables(conn: psycopg.Connection[Any]) -> list[str]:
    return [
        str(t)
        for (t,) in conn.execute(f"SELECT {SCHEMA}.agent_tables()::text ORDER BY 1").fetchall()
    ]


def _counts(conn: psycopg.Connection[Any], agent: str) -> dict[str, object]:
    return {
        table: conn.execute(f"SELECT count(*) FROM {table} WHERE agent = %s", (agent,)).fetchone()
        for table in _agent_tables(conn)
    }


def test_every_table_with_an_agent_column_has_the_policy(store: Store) -> None:
    owner = _autocommit(connect(PgSettings(dsn=store.dsn)))
    tables = _agent_tables(owner)
    assert {f"{SCHEMA}.{t}" for t in ("sessions", "events", "message_index")} <= set(tables)
    rows = owner.execute(
        "SELECT c.oid::regclass::text, c.relrowsecurity,"
        " (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid)"
        " FROM pg_class c WHERE c.oid::regclass::text = ANY(%s) ORDER BY 1",
        (tables,),
    ).fetchall()
    assert rows == [(t, True, 1) for t in tables]
    owner.close()


def test_each_role_reads_and_writes_its_agents_through_the_store(store: Store) -> None:
    for role in store.roles:
        for agent in store.agents[role]:
            writer = PgTranscriptWriter(store.as_role(role), agent)
            (ack,) = writer.apply([_append(f"{agent} {role} wrote this")])
            assert isinstance(ack, Appended) and ack.indexed
            reader = PgTranscriptReader(store.as_role(role), agent)
            history = reader.history(KEY.raw)
            assert history is not None and len(history) >= 2
            assert reader.switches(KEY.raw).verbose
            stats = reader.stats()
            assert stats.sessions == 1 and stats.events >= 2 and stats.fts_integrity_ok
            assert _found(reader, "owner wrote")
            writer.conn.close()
            reader.conn.close()


def test_another_agents_rows_are_invisible_and_unwritable_through_the_store(
    store: Store,
) -> None:
    for role, other in zip(store.roles, reversed(store.roles), strict=True):
        for agent in store.agents[other]:
            reader = PgTranscriptReader(store.as_role(role), agent)
            assert reader.sessions() == []
            assert reader.history(KEY.raw) is None
            assert reader.switches(KEY.raw) == SessionSwitches()  # theirs has verbose on
            stats = reader.stats()
            assert (stats.sessions, stats.events, stats.indexed_messages) == (0, 0, 0)
            assert not _found(reader, "owner wrote")
            writer = PgTranscriptWriter(store.as_role(role), agent)
            (ack,) = writer.apply([_append("not mine")])
            assert isinstance(ack, Rejected) and ack.reason == "storage"
            assert "row-level security" in ack.message
            writer.conn.close()
            reader.conn.close()


def test_hand_written_sql_cannot_reach_another_agents_rows(store: Store) -> None:
    owner = _autocommit(connect(PgSettings(dsn=store.dsn)))
    before = {agent: _counts(owner, agent) for names in store.agents.values() for agent in names}
    for role, other in zip(store.roles, reversed(store.roles), strict=True):
        conn = store.as_role(role)
        conn.autocommit = True
        theirs = store.agents[other][0]
        for table in _agent_tables(conn):
            seen = {a for (a,) in conn.execute(f"SELECT DISTINCT agent FROM {table}").fetchall()}
            assert seen <= set(store.agents[role]), (role, table, seen)
            assert conn.execute(
                f"SELECT count(*) FROM {table} WHERE agent = %s", (theirs,)
            ).fetchone() == (0,)
            assert (
                conn.execute(
                    f"UPDATE {table} SET agent = agent WHERE agent = %s", (theirs,)
                ).rowcount
                == 0
            )
            assert conn.execute(f"DELETE FROM {table} WHERE agent = %s", (theirs,)).rowcount == 0
        # Inserting a row of another agent, or moving one's own row to it, is refused.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute(
                f"INSERT INTO {SCHEMA}.session_switches(agent, key) VALUES (%s, 'k')", (theirs,)
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute(
                f"UPDATE {SCHEMA}.session_switches SET agent = %s WHERE agent = %s",
                (theirs, store.agents[role][0]),
            )
        # Its bindings are its own: it sees them only, and cannot add one.
        bound = conn.execute(f"SELECT role, agent FROM {SCHEMA}.agent_roles ORDER BY 2").fetchall()
        assert bound == [(role, agent) for agent in sorted(store.agents[role])]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"INSERT INTO {SCHEMA}.agent_roles VALUES (%s, %s)", (role, theirs))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"SELECT {SCHEMA}.grant_agent(%s, %s)", (role, theirs))
        conn.close()
    after = {agent: _counts(owner, agent) for agent in before}
    assert after == before
    owner.close()


def test_a_table_added_later_is_covered_by_the_same_step(store: Store) -> None:
    owner = _autocommit(connect(PgSettings(dsn=store.dsn)))
    a, b = store.roles
    with owner.transaction():
        owner.execute(f"CREATE TABLE {SCHEMA}.later_rows(agent text NOT NULL, note text)")
        owner.execute(f"SELECT {SCHEMA}.secure_agent_tables()")
        for agent in (*store.agents[a], *store.agents[b]):
            owner.execute(f"INSERT INTO {SCHEMA}.later_rows VALUES (%s, 'x')", (agent,))
    conn = store.as_role(a)
    seen = conn.execute(f"SELECT agent FROM {SCHEMA}.later_rows ORDER BY 1").fetchall()
    assert seen == [(agent,) for agent in sorted(store.agents[a])]
    conn.close()
    with owner.transaction():
        owner.execute(f"DROP TABLE {SCHEMA}.later_rows")
    owner.close()


@pytest.mark.parametrize(
    ("role", "agent", "error"),
    [
        ("am_no_such_role", "x", "grant_agent: role: no role am_no_such_role"),
        (
            "postgres",
            "x",
            "grant_agent: role: postgres bypasses row-level security (a superuser, BYPASSRLS"
            " or the schema's owner): it would see every agent",
        ),
        ("ROLE_A", "", "grant_agent: agent: expected an agent id, got ''"),
        ("ROLE_A", None, "grant_agent: agent: expected an agent id, got NULL"),
    ],
)
def test_bad_grants_are_refused_naming_the_argument(
    store: Store, role: str, agent: str | None, error: str
) -> None:
    role = store.roles[0] if role == "ROLE_A" else role
    owner = _autocommit(connect(PgSettings(dsn=store.dsn)))
    with pytest.raises(psycopg.errors.RaiseException) as caught:
        owner.execute(f"SELECT {SCHEMA}.grant_agent(%s, %s)", (role, agent))
    assert caught.value.diag.message_primary == error
    owner.close()


def test_revoking_takes_the_agent_away_then_every_privilege(store: Store) -> None:
    owner = _autocommit(connect(PgSettings(dsn=store.dsn)))
    a = store.roles[0]
    kept, dropped = store.agents[a]
    owner.execute(f"SELECT {SCHEMA}.revoke_agent(%s, %s)", (a, dropped))
    conn = store.as_role(a)
    assert PgTranscriptReader(conn, dropped).sessions() == []
    assert len(PgTranscriptReader(conn, kept).sessions()) == 1
    conn.close()
    owner.execute(f"SELECT {SCHEMA}.revoke_agent(%s)", (a,))
    conn = psycopg.connect(psycopg.conninfo.make_conninfo(store.dsn, user=a), autocommit=True)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(f"SELECT count(*) FROM {SCHEMA}.sessions")
    conn.close()
    for agent in (kept, dropped):  # bound again for any test after this one
        owner.execute(f"SELECT {SCHEMA}.grant_agent(%s, %s)", (a, agent))
    owner.close()


def test_a_worker_reaches_the_records_only_once_bound_to_their_tenant(
    store: Store, tmp_path: Any
) -> None:
    # The records of `open_memory` are the tenant ':records' (storage/pg/store.py): a
    # worker bound to agents alone can neither write nor read them, until the owner binds
    # it to that tenant as to an agent.
    role = store.roles[1]
    dsn = psycopg.conninfo.make_conninfo(store.dsn, user=role)
    with (
        am.sync.open_memory(tmp_path / "a", storage=dsn) as mem,
        pytest.raises(am.StorageError, match="row-level security"),
    ):
        mem.records.add("likes aisle seats", user_id="u1")
    with am.sync.open_memory(tmp_path / "owner", storage=store.dsn) as mem:
        rid = mem.records.add("likes window seats", user_id="u1")
    with am.sync.open_memory(tmp_path / "b", storage=dsn) as mem:
        assert mem.records.get(rid) is None  # not bound: the row is not there for it
    with psycopg.connect(store.dsn, autocommit=True) as owner:
        owner.execute(f"SELECT {SCHEMA}.grant_agent(%s, ':records')", (role,))
    try:
        with am.sync.open_memory(tmp_path / "c", storage=dsn) as mem:
            assert [h.id for h in mem.records.search("seat", user_id="u1")] == [rid]
            mem.records.add("likes aisle seats", user_id="u1")
            assert len(mem.records.search("seat", user_id="u1")) == 2
    finally:
        with psycopg.connect(store.dsn, autocommit=True) as owner:
            owner.execute(f"SELECT {SCHEMA}.revoke_agent(%s, ':records')", (role,))
