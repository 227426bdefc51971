"""The reconciler's inbox (docs/design.md §1.2): pokes that say "there may be work"."""

from __future__ import annotations

from typing import Literal

import msgspec


class Poke(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="poke"):
    """Search / facade → reconciler: look for dirty sessions and rebuild them.

    `reason`: "search" when a search saw a dirty session, "dirty" when a write made one.
    """

    reason: Literal["search", "dirty"] = "search"
