"""Rendering of records search results (docs/design.md §5.6): XML safety, the show_* flags, and the
invalid-branch rule."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import activememory as am
from activememory.protocol.record_results import RecordSearchResult, json_text, xml_safe
from activememory.protocol.records import (
    Record,
    RecordRelation,
    RecordResultFormatConfig,
    RecordStatus,
    RecordType,
    SearchResultFormatConfig,
)

from pg_server import pg_memory_dsn, storage

pytestmark = pytest.mark.anyio
__all__ = ["pg_memory_dsn", "storage"]
TS = 1_714_555_800.0  # 2024-05-01T09:30:00Z

nasty = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("<>&\"'=:/ \t\r\n\x00\x01\x0b\x1f\x7f\ufffe\uffff\ud800\udfff]]>-")),
        st.characters(),
    ),
    max_size=20,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | nasty,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(nasty, inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


def parse(text: str) -> ET.Element:
    return ET.fromstring(f"<root>{text}</root>")


def record(**changes: Any) -> Record:
    fields: dict[str, Any] = {"id": "r1", "content": "likes tea", "timestamp": TS}
    return Record(**(fields | changes))


@settings(max_examples=200, deadline=None)
@given(
    content=nasty,
    rid=nasty,
    metadata=st.dictionaries(nasty, json_values, max_size=6),
    reason=st.none() | nasty,
    relation=nasty,
    role=st.none() | nasty,
)
def test_any_text_renders_as_well_formed_xml(
    content: str,
    rid: str,
    metadata: dict[str, Any],
    reason: str | None,
    relation: str,
    role: str | None,
) -> None:
    child = RecordSearchResult(
        record=record(
            id=rid + "c", content=content, status=RecordStatus.INVALID, invalid_reason=reason
        )
    )
    result = RecordSearchResult(
        record=record(id=rid, content=content, metadata=metadata, role=role, user_id=rid),
        distance=0.5,
        linked_results=[
            (RecordRelation(relation=relation, source_id=rid, target_id=rid + "c"), child)
        ],
    )
    everything = RecordResultFormatConfig(
        show_metadata=True, show_user_id=True, show_distance=True, show_thread_id=True
    )
    root = parse(result.format_content(everything))
    [element] = root
    assert element.get("id") == xml_safe(rid)
    assert element.get("user_id") == xml_safe(rid)
    assert element.findtext("content") == xml_safe(content)
    if role is not None:
        assert element.get("role") == xml_safe(role)
    meta = element.find("metadata")
    if metadata:
        assert meta is not None
        shown = list(meta)
        assert len(shown) == len(metadata)
        for (key, value), item in zip(metadata.items(), shown, strict=True):
            if item.tag == "meta":
                assert item.get("key") == xml_safe(key)
            else:
                assert item.tag == key
            text = value if isinstance(value, str) else json_text(value)
            assert (item.text or "") == xml_safe(text)
    else:
        assert meta is None
    [link] = element.findall("linked")
    assert link.get("relation") == xml_safe(relation)
    [inner] = link
    assert inner.get("status") == "invalid" and inner.findtext("content") == xml_safe(content)
    if reason is not None:
        assert inner.findtext("invalidation_reason") == xml_safe(reason)


def test_keys_that_are_not_xml_names_become_meta_elements() -> None:
    metadata = {"ok_key": 1, "1st": "a", "has space": "b", "xmlns": "c", "a:b": "d", "é": "e"}
    text = RecordSearchResult(record=record(metadata=metadata)).format_content(
        RecordResultFormatConfig(show_metadata=True)
    )
    meta = parse(text).find("record/metadata")
    assert meta is not None
    assert [(m.tag, m.get("key"), m.text) for m in meta] == [
        ("ok_key", None, "1"),
        ("meta", "1st", "a"),
        ("meta", "has space", "b"),
        ("meta", "xmlns", "c"),
        ("meta", "a:b", "d"),
        ("meta", "é", "e"),
    ]


def test_values_the_store_would_refuse_still_render_safely() -> None:
    built = RecordSearchResult(record=record(content="a\ud800b", metadata={"k": ["\udfff", 1]}))
    element = parse(built.format_content(RecordResultFormatConfig(show_metadata=True)))[0]
    assert element.findtext("content") == "a\ufffdb"
    assert element.findtext("metadata/k") == '["\ufffd",1]'


def test_default_rendering() -> None:
    result = RecordSearchResult(
        record=record(user_id="u1", agent_id="a1", thread_id="t1", metadata={"k": "v"}),
        distance=0.25,
    )
    assert result.formatted_content == (
        '<record id="r1" type="memory" status="valid" timestamp="2024-05-01T09:30:00Z">\n'
        "<content>likes tea</content>\n"
        "</record>"
    )


FLAG_CASES = [
    ("show_thread_id", False, lambda e: e.get("thread_id") == "t1"),
    ("show_distance", False, lambda e: e.get("distance") == "0.2500"),
    ("show_timestamp", True, lambda e: e.get("timestamp") == "2024-05-01T09:30:00Z"),
    ("show_role", True, lambda e: e.get("role") == "user"),
    ("show_user_id", False, lambda e: e.get("user_id") == "u1"),
    ("show_agent_id", False, lambda e: e.get("agent_id") == "a1"),
    ("show_status", True, lambda e: e.get("status") == "invalid"),
    (
        "show_metadata",
        False,
        lambda e: e.findtext("metadata/k") == "v" and e.findtext("invalidation_reason") == "old",
    ),
]


@pytest.mark.parametrize(("flag", "default", "shown"), FLAG_CASES)
def test_each_show_flag(flag: str, default: bool, shown: Any) -> None:
    result = RecordSearchResult(
        record=record(
            record_type=RecordType.MESSAGE,
            role="user",
            user_id="u1",
            agent_id="a1",
            thread_id="t1",
            metadata={"k": "v"},
            status=RecordStatus.INVALID,
            invalid_reason="old",
        ),
        distance=0.25,
    )
    assert getattr(RecordResultFormatConfig(), flag) is default
    on = parse(result.format_content(RecordResultFormatConfig(**{flag: True})))[0]
    off = parse(result.format_content(RecordResultFormatConfig(**{flag: False})))[0]
    assert shown(on) and not shown(off)
    assert on.get("type") == "message" and on.findtext("content") == "likes tea"


def test_unknown_values_leave_their_attribute_out() -> None:
    everything = RecordResultFormatConfig(
        show_user_id=True, show_agent_id=True, show_thread_id=True, show_distance=True
    )
    linked = RecordSearchResult(record=record(id="r2"))  # unscoped, no role, no distance
    result = RecordSearchResult(
        record=record(),
        linked_results=[(RecordRelation(relation="r", source_id="r1", target_id="r2"), linked)],
    )
    element = parse(result.format_content(everything))[0].find("linked/record")
    assert element is not None
    assert set(element.attrib) == {"id", "type", "status", "timestamp"}


def branch(rid: str, status: RecordStatus, *children: RecordSearchResult) -> RecordSearchResult:
    return RecordSearchResult(
        record=record(id=rid, content=f"content of {rid}", status=status),
        linked_results=[
            (RecordRelation(relation="r", source_id=rid, target_id=c.id), c) for c in children
        ],
    )


V, X = RecordStatus.VALID, RecordStatus.INVALID


def test_invalid_branches_are_omitted_but_paths_to_valid_records_stay() -> None:
    #   root ─ a(invalid) ─ b(valid)        a is a path: status and links, no content
    #        ─ c(invalid) ─ d(invalid)      an invalid branch: omitted whole
    #        ─ e(valid)   ─ f(invalid)      f is a leaf branch: omitted, e stays
    tree = branch(
        "root",
        V,
        branch("a", X, branch("b", V)),
        branch("c", X, branch("d", X)),
        branch("e", V, branch("f", X)),
    )
    pruned = parse(tree.format_content(SearchResultFormatConfig(include_invalid_results=False)))
    root = pruned[0]
    kids = [link[0] for link in root.findall("linked")]
    assert [k.get("id") for k in kids] == ["a", "e"]
    a, e = kids
    assert a.get("status") == "invalid" and a.find("content") is None
    assert [r.get("id") for r in a.iter("record")] == ["a", "b"]
    assert a.findtext("linked/record/content") == "content of b"
    assert e.findtext("content") == "content of e" and e.find("linked") is None
    # A path record keeps its status even when statuses are not shown.
    quiet = RecordResultFormatConfig(include_invalid_results=False, show_status=False)
    root = parse(tree.format_content(quiet))[0]
    assert root.get("status") is None
    assert root.find("linked/record").get("status") == "invalid"  # type: ignore[union-attr]
    # Included (the default): every record with its content.
    full = parse(tree.formatted_content)[0]
    assert [r.get("id") for r in full.iter("record")] == ["root", "a", "b", "c", "d", "e", "f"]
    assert all(r.find("content") is not None for r in full.iter("record"))


def test_the_result_itself_is_always_rendered() -> None:
    lone = branch("x", X)
    element = parse(lone.format_content(SearchResultFormatConfig(include_invalid_results=False)))[0]
    assert element.findtext("content") == "content of x"


def test_a_plain_format_config_keeps_the_result_show_flags() -> None:
    result = RecordSearchResult(
        record=record(user_id="u1"),
        format_config=RecordResultFormatConfig(show_user_id=True),
    )
    assert 'user_id="u1"' in result.formatted_content
    assert 'user_id="u1"' in result.format_content(SearchResultFormatConfig())
    assert 'user_id="u1"' not in result.format_content(RecordResultFormatConfig())
    with pytest.raises(am.InvalidInputError, match=r"^config: expected a SearchResultFormatConfig"):
        result.format_content({"show_user_id": True})  # type: ignore[arg-type]


@pytest.fixture
async def mem(tmp_path: Path, executor: str, storage: str | None) -> AsyncIterator[am.Memory]:
    async with am.open_memory(tmp_path / "state", executor=executor, storage=storage) as memory:  # type: ignore[arg-type]
        yield memory


async def test_stored_metadata_renders_through_a_search(mem: am.Memory) -> None:
    metadata = {"<tag>": "a & b", 'quote"key': "'x'", "ok": ["<", ">"]}
    rid = await mem.records.add("tea <script>", user_id="u1", metadata=metadata)
    config = RecordResultFormatConfig(show_metadata=True)
    [hit] = await mem.records.search("tea", user_id="u1", format_config=config)
    element = parse(hit.formatted_content)[0]
    assert element.get("id") == rid and element.findtext("content") == "tea <script>"
    meta = element.find("metadata")
    assert meta is not None
    assert [(m.tag, m.get("key"), m.text) for m in meta] == [
        ("meta", "<tag>", "a & b"),
        ("meta", 'quote"key', "'x'"),
        ("ok", None, '["<",">"]'),
    ]


async def test_lone_surrogates_are_refused_on_the_way_in(mem: am.Memory) -> None:
    with pytest.raises(
        am.InvalidInputError, match=r"^content: lone surrogate '\\ud800' at index 1 \("
    ):
        await mem.records.add("a\ud800", user_id="u1")
    with pytest.raises(
        am.InvalidInputError, match=r"^metadata\['k'\]: lone surrogate '\\udfff' at index 0"
    ):
        await mem.records.add("a", user_id="u1", metadata={"k": "\udfff"})
