"""The embedder actor's inbox (docs/design.md §1.2): pokes that say "vectors may be missing"."""

from __future__ import annotations

from typing import Literal

import msgspec


class EmbedPoke(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="embed_poke"):
    """Supervisor → embedder actor: look for rows lacking a vector and embed them.

    `reason`: "start" when the agent database opens, "write" after an acknowledged write
    that may have added indexed rows (append, import, reindex, note sync).
    """

    reason: Literal["start", "write"] = "write"
