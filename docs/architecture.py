"""Draw docs/architecture.svg: the actors, their inboxes and what they own.

Run `python docs/architecture.py` after changing the wiring in `actors/supervisor.py`;
`tests/test_architecture.py` fails when the picture is stale or misses an actor module.
Plain SVG from a table of boxes and arrows, so it needs nothing beyond the standard library.
"""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).with_name("architecture.svg")

# name: (x, y, width, height, title, subtitle, kind)
BOXES: dict[str, tuple[int, int, int, int, str, str, str]] = {
    "host": (20, 150, 150, 60, "bot (host)", "trio or asyncio", "outside"),
    "memory": (230, 130, 190, 100, "Memory", "sessions, records, recall", "face"),
    "composer": (230, 20, 190, 60, "composer", "mem.reply, caller's task", "actor"),
    "coordinator": (230, 290, 190, 60, "recall coordinator", "activememory/recall/", "face"),
    "reconciler": (520, 40, 180, 60, "reconciler (per agent)", "actors/reconciler.py", "actor"),
    "indexer": (520, 140, 180, 60, "indexer (per agent)", "actors/indexer.py", "actor"),
    "embedder": (520, 240, 180, 60, "embedder actor", "actors/embedder.py", "actor"),
    "records": (520, 340, 180, 60, "records keeper", "actors/records.py", "actor"),
    "recall_pool": (520, 440, 180, 60, "recall pool", "actors/recall_pool.py", "actor"),
    "memory_db": (790, 140, 170, 60, "agents/<a>/memory.db", "transcripts, FTS, vectors", "store"),
    "embedding": (790, 240, 170, 60, "embedding model", "Embedder: texts to vectors", "outside"),
    "records_db": (790, 340, 170, 60, "records.db", "scoped records", "store"),
    "model": (790, 440, 170, 60, "recall model", "local or OpenAI-compatible", "outside"),
    "operator": (20, 300, 150, 60, "operator's CLI", "another process", "outside"),
    "control": (20, 420, 150, 60, "control actor", "actors/control.py", "actor"),
    "watcher": (230, 420, 190, 60, "notes watcher (per agent)", "actors/notes_watcher.py", "actor"),
}
# (from, to, label, dashed): solid arrows are bounded inboxes of tagged Structs.
ARROWS: list[tuple[str, str, str, bool]] = [
    ("host", "memory", "calls", True),
    ("memory", "composer", "reply", True),
    ("memory", "coordinator", "recall", True),
    ("memory", "indexer", "IndexerCommand", False),
    ("memory", "reconciler", "Poke", False),
    ("reconciler", "indexer", "ReindexChunk", False),
    ("memory", "embedder", "EmbedPoke (acks)", False),
    ("embedder", "indexer", "StoreVectors", False),
    ("embedder", "embedding", "embed", True),
    ("memory", "records", "RecordCommand", False),
    ("coordinator", "recall_pool", "RunRecall", False),
    ("recall_pool", "coordinator", "RunReport (1 slot)", False),
    ("indexer", "memory_db", "one writer", True),
    ("records", "records_db", "one writer", True),
    ("recall_pool", "model", "runs, tools", True),
    ("operator", "control", "spool files", True),
    ("control", "memory", "erase_identity", True),
    ("watcher", "indexer", "SyncNotes", False),
]
SUPERVISED = ("indexer", "reconciler", "embedder", "records", "recall_pool")
FILL = {"outside": "#f3f3f3", "face": "#e6f0fa", "actor": "#fdf3dc", "store": "#e8f5e9"}


def _edge(a: str, b: str) -> tuple[float, float, float, float]:
    ax, ay, aw, ah = BOXES[a][:4]
    bx, by, bw, bh = BOXES[b][:4]
    acx, acy, bcx, bcy = ax + aw / 2, ay + ah / 2, bx + bw / 2, by + bh / 2
    if bx >= ax + aw:  # b to the right
        return ax + aw, acy, bx, bcy
    if bx + bw <= ax:  # b to the left
        return ax, acy, bx + bw, bcy
    if by >= ay + ah:  # b below
        return acx, ay + ah, bcx, by
    return acx, ay, bcx, by + bh


def render() -> str:
    out = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="980" height="530" '
        'font-family="sans-serif" font-size="12">',
        '<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="8" refY="4" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#333"/></marker></defs>',
        '<rect x="0" y="0" width="980" height="530" fill="white"/>',
        '<rect x="505" y="15" width="210" height="500" rx="8" fill="none" stroke="#999" '
        'stroke-dasharray="6 4"/>',
        '<text x="610" y="528" text-anchor="middle" fill="#666">supervisor task group '
        "(actors/supervisor.py)</text>",
    ]
    for x, y, w, h, title, sub, kind in BOXES.values():
        out.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{FILL[kind]}" '
            'stroke="#555"/>'
        )
        out.append(
            f'<text x="{x + w / 2}" y="{y + h / 2 - 4}" text-anchor="middle" '
            f'font-weight="bold">{escape(title)}</text>'
        )
        out.append(
            f'<text x="{x + w / 2}" y="{y + h / 2 + 13}" text-anchor="middle" '
            f'fill="#444">{escape(sub)}</text>'
        )
    for a, b, label, dashed in ARROWS:
        x1, y1, x2, y2 = _edge(a, b)
        below = 0
        if (b, a) in {(f, t) for f, t, _, _ in ARROWS}:  # a pair of opposite arrows: apart
            shift = 8 if a < b else -8
            x1, x2 = x1 + shift, x2 + shift
            y1, y2 = y1 + shift, y2 + shift
            below = 18 if shift > 0 else 0
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        out.append(
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#333"{dash} '
            'marker-end="url(#arrow)"/>'
        )
        out.append(
            f'<text x="{(x1 + x2) / 2}" y="{(y1 + y2) / 2 - 5 + below}" text-anchor="middle" '
            'fill="#1a4d8f" stroke="white" stroke-width="3" paint-order="stroke">'
            f"{escape(label)}</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
