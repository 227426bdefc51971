"""The inspector page (docs/design.md §12.3) end to end: a real hypercorn server on loopback
over a real memory, driven by Debian's Chromium through Playwright (no browser download),
and plain HTTP requests for escaping and errors."""

from __future__ import annotations

import base64
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import trio

import activememory as am

pytest.importorskip("starlette")
pytest.importorskip("hypercorn")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ALICE = "agent:main:direct:alice"
ALICE_OTHER = "agent:main:dm:alice"  # alice's other chat: what recall reads
BOB = "agent:main:direct:bob"
SCRIPT = "<script>alert('stored')</script> I drink oolong tea every morning."
TOOL_INPUT = "<img src=x onerror=alert('block')>"


class Grounded:
    """A recall model that looks the tea up, then answers from what it found."""

    async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
        await tools.call("memory_search", {"query": "oolong tea"})
        return "The user drinks oolong tea every morning."


@dataclass
class Served:
    url: str  # the inspector's root, ending in /ui
    other: str  # the same routes mounted under a deeper prefix
    records: dict[str, str]


def _serve(state: Path, ready: list[Any], stop: list[Any]) -> None:
    """The server thread: open the memory, seed it, serve until told to stop (`stop` gets
    the loop's token and the function that stops it)."""
    from hypercorn.config import Config
    from hypercorn.trio import serve
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from activememory.service.inspector import routes

    config = {
        "agents": {"defaults": {"memorySearch": {"provider": "none"}}},
        "plugins": {"entries": {"active-memory": {"config": {"model": "test/model"}}}},
    }

    async def main() -> None:
        stopping = trio.Event()
        async with am.open_memory(state, config=config, models={"test/model": Grounded()}) as mem:
            await mem.sessions.append(ALICE_OTHER, am.Message(role="user", content=SCRIPT))
            await mem.sessions.append(ALICE, am.Message(role="user", content="hello there"))
            blocks = [
                {"type": "text", "text": "looking it up"},
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": TOOL_INPUT}},
            ]
            await mem.sessions.append(ALICE, am.Message(role="assistant", content=blocks))
            await mem.sessions.append(BOB, am.Message(role="user", content="green tea for me"))
            aisle = await mem.records.add("prefers aisle seats", user_id="alice")
            trip = await mem.records.add("flies to Lisbon in May", user_id="alice")
            note = await mem.records.add("<b>bold</b> packing list", user_id="alice")
            await mem.records.link(aisle, trip, relation="about")
            await mem.records.link(note, trip, relation="part_of")
            ui = routes(mem)
            app = Starlette(routes=[Mount("/ui", routes=ui), Mount("/deep/inspect", routes=ui)])
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            hc = Config()
            hc.bind = [f"fd://{sock.fileno()}"]
            hc.accesslog = None
            port = sock.getsockname()[1]
            records = {"aisle": aisle, "trip": trip, "note": note}
            ready.append(
                Served(
                    f"http://127.0.0.1:{port}/ui", f"http://127.0.0.1:{port}/deep/inspect", records
                )
            )

            stop.append((trio.lowlevel.current_trio_token(), stopping.set))
            await serve(app, hc, shutdown_trigger=stopping.wait)  # type: ignore[arg-type]
            sock.close()

    try:
        trio.run(main)
    except BaseException as exc:  # the test thread must hear of it, not wait forever
        ready.append(exc)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    ready: list[Any] = []
    stop: list[Any] = []
    thread = threading.Thread(
        target=_serve, args=(tmp_path_factory.mktemp("inspector") / "state", ready, stop)
    )
    thread.start()
    try:
        for _ in range(400):
            if ready:
                break
            thread.join(0.05)
        assert ready and isinstance(ready[0], Served), ready
        server = ready[0]
        for _ in range(100):  # the socket listens already; wait for hypercorn to answer
            try:
                httpx.get(server.url + "/", timeout=2)
                break
            except httpx.TransportError:
                thread.join(0.05)
        yield server
    finally:
        if stop:
            token, stopping = stop[0]
            trio.from_thread.run_sync(stopping, trio_token=token)
        thread.join(15)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing: CI installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.dialogs = dialogs
    try:
        yield page
    finally:
        context.close()
    assert dialogs == []  # no stored script ever ran


_COUNT_COLOURS = """async (b64) => {
  const img = new Image();
  img.src = "data:image/png;base64," + b64;
  await img.decode();
  const canvas = document.createElement("canvas");
  canvas.width = img.width;
  canvas.height = img.height;
  const ctx = canvas.getContext("2d");
  ctx.drawImage(img, 0, 0);
  const px = ctx.getImageData(0, 0, img.width, img.height).data;
  const seen = new Set();
  for (let i = 0; i < px.length; i += 4) seen.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
  return seen.size;
}"""


def colours(browser_page: Any, png: bytes) -> int:
    """How many distinct colours the PNG holds, decoded by the browser on a blank page of
    its own (a Python decoder takes seconds per full-page screenshot)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    blank = browser_page.context.new_page()
    try:
        return int(blank.evaluate(_COUNT_COLOURS, base64.b64encode(png).decode()))
    finally:
        blank.close()


def shot(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    data = path.read_bytes()
    assert len(data) > 1000, name
    assert colours(page, data) > 2, f"{name}: a blank page"


# -- the browser ----------------------------------------------------------------------------


def test_every_view_loads_in_chromium(served: Served, page: Any, tmp_path: Path) -> None:
    views = {
        "overview": ("/", "Agents"),
        "sessions": ("/sessions", ALICE_OTHER),
        "session": (f"/sessions/{quote(ALICE_OTHER)}", "Active branch"),
        "state": ("/state", "Recall cache"),
        "records": ("/records?q=aisle&hops=2", "prefers aisle seats"),
        "search": ("/search", "Search"),
        "recall": ("/recall", "Run recall"),
    }
    for name, (path, expect) in views.items():
        response = page.goto(served.url + path)
        assert response.status == 200, name
        assert expect in page.inner_text("main"), name
        shot(page, tmp_path, name)
    # The stored script is on the session page as text, and did not run (no dialog).
    page.goto(served.url + f"/sessions/{quote(ALICE_OTHER)}")
    assert "<script>alert('stored')</script>" in page.inner_text("main")
    # Navigation by the header links stays under the mount point.
    page.goto(served.url + "/")
    page.click("header >> text=Records")
    assert page.url == served.url + "/records"


def test_search_as_two_callers_in_chromium(served: Served, page: Any, tmp_path: Path) -> None:
    page.goto(served.url + "/search")
    page.fill("input[name=q]", "oolong")
    page.fill("input[name=caller]", "agent:main:dm:alice")
    page.click("button[type=submit]")
    main = page.inner_text("main")
    assert "sees: 1 hits" in main and "oolong tea every morning" in main
    assert "may not see: 0" in main
    shot(page, tmp_path, "search-owner")

    page.fill("input[name=caller]", BOB)
    page.click("button[type=submit]")
    main = page.inner_text("main")
    assert "sees: 0 hits" in main
    assert "may not see: 1" in main
    hidden = page.inner_text("table >> nth=-1")
    assert ALICE_OTHER in hidden and "visibility is 'tree'" in hidden
    shot(page, tmp_path, "search-other")


def test_recall_runner_in_chromium(served: Served, page: Any, tmp_path: Path) -> None:
    page.goto(served.url + "/recall")
    page.fill("input[name=session_key]", ALICE)
    page.fill("input[name=message]", "what tea do I drink in the morning?")
    page.click("button[type=submit]")
    main = page.inner_text("main")
    assert "Outcome" in main and "status\tok" in main.replace(" \t", "\t")
    assert "The user drinks oolong tea every morning." in main  # the hidden block
    assert "Sub-agent transcript (recall-" in main
    for kind in ("prompt", "tool_call", "tool_result", "end"):
        assert f"\t{kind}\t" in main, kind
    assert "Evidence: 1 tool results" in main
    assert "<script>alert('stored')</script>" in main  # the evidence, as text
    shot(page, tmp_path, "recall")


def test_record_graph_in_chromium(served: Served, page: Any, tmp_path: Path) -> None:
    page.goto(served.url + "/records?q=aisle&hops=2")
    page.click(f"h3 >> text={served.records['aisle']}")
    assert page.url.endswith(f"/records/{served.records['aisle']}")
    graph = page.locator("svg")
    assert graph.count() == 1
    assert graph.locator("rect").count() == 3  # aisle -about-> trip <-part_of- note
    labels = graph.text_content()
    assert "about" in labels and "part_of" in labels and "<b>bold</b> packing list" in labels
    shot(page, tmp_path, "record-graph")
    graph.locator("a", has_text="flies to Lisbon").click()  # a node opens its record
    assert page.url.endswith(f"/records/{served.records['trip']}")


# -- plain HTTP: escaping and errors --------------------------------------------------------


def test_stored_markup_is_escaped_everywhere(served: Served) -> None:
    pages = [
        f"/sessions/{quote(ALICE_OTHER)}",
        f"/search?q=oolong&caller={quote(ALICE_OTHER)}",
        f"/records/{served.records['trip']}",
        "/records?q=packing",
    ]
    for path in pages:
        response = httpx.get(served.url + path)
        assert response.status_code == 200, path
        assert "<script>" not in response.text and "<b>bold" not in response.text, path
        assert "script-src" not in response.headers["content-security-policy"]
        assert "default-src 'none'" in response.headers["content-security-policy"]
    session = httpx.get(served.url + pages[0]).text
    assert "&lt;script&gt;alert(&#x27;stored&#x27;)&lt;/script&gt;" in session
    blocks = httpx.get(served.url + f"/sessions/{quote(ALICE)}").text
    assert "looking it up" in blocks and "[ToolUseBlock]" in blocks
    assert "&lt;img src=x onerror=alert(&#x27;block&#x27;)&gt;" in blocks and "<img" not in blocks


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/search?q=tea&caller=agent:", "caller: 'agent:' has no agent id"),
        ("/search?q=tea", "caller: required"),
        (f"/search?q=tea&caller={BOB}&mode=fuzzy", "mode:"),
        (f"/search?q=tea&caller={BOB}&limit=99", "limit: '99' is not an integer from 1 to 25"),
        ("/records?q=aisle&hops=x", "hops: 'x' is not an integer from 0 to 5"),
        ("/sessions/agent:Bad:direct:x", "session_key:"),
    ],
)
def test_bad_input_is_a_400_page_naming_the_field(served: Served, path: str, field: str) -> None:
    response = httpx.get(served.url + path)
    assert response.status_code == 400
    assert field in response.text.replace("&#x27;", "'")
    assert "Traceback" not in response.text


def test_a_bad_recall_form_is_a_400_and_runs_nothing(served: Served) -> None:
    before = httpx.get(served.url + "/state").text.count("<td>closed")
    response = httpx.post(served.url + "/recall", data={"session_key": ALICE, "message": " "})
    assert response.status_code == 400 and "message: required" in response.text
    response = httpx.post(served.url + "/recall", data={"session_key": "", "message": "tea?"})
    assert response.status_code == 400 and "session_key" in response.text
    assert httpx.get(served.url + "/state").text.count("<td>closed") == before


def test_missing_things_are_404_pages(served: Served) -> None:
    assert httpx.get(served.url + "/sessions/agent:main:direct:nobody").status_code == 404
    response = httpx.get(served.url + "/records/" + "0" * 32)
    assert response.status_code == 404 and "no record" in response.text


def test_links_follow_the_mount_point(served: Served) -> None:
    for root, prefix in ((served.url, "/ui"), (served.other, "/deep/inspect")):
        text = httpx.get(root + "/sessions").text
        assert f'href="{prefix}/sessions/{ALICE_OTHER}"' in text
        assert f'href="{prefix}/records"' in text
        assert 'href="/sessions' not in text
