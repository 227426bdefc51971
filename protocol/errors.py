"""The exceptions every layer raises; the public ones are re-exported by `activememory`."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from .indexer import Rejected
    from .records import RecordRejected


class ActiveMemoryError(Exception):
    """Base class of every error activememory raises on purpose."""


class InvalidInputError(ActiveMemoryError, ValueError):
    """Bad input from the caller. The message names the field and what is allowed.

    Nothing was written when this is raised.
    """


class SessionNotFoundError(ActiveMemoryError, LookupError):
    """The session key names no stored session."""


class StorageError(ActiveMemoryError):
    """The state directory or a database could not be used (disk full, read-only, busy...).

    The failed command left the database as it was before the command.
    """


class MemoryClosedError(ActiveMemoryError):
    """The memory was closed (or its writer stopped) before the command was applied.

    The command was not written.
    """


def raise_rejected(
    ack: Rejected | RecordRejected, not_found: type[ActiveMemoryError] = InvalidInputError
) -> NoReturn:
    """Raise what a writer's rejection means to the caller; `not_found` is the error of a
    missing target (`SessionNotFoundError` for a session, a bad id for a record)."""
    match ack.reason:
        case "not_found":
            raise not_found(ack.message)
        case "invalid":
            raise InvalidInputError(ack.message)
        case "closed":
            raise MemoryClosedError(ack.message)
        case "storage":
            raise StorageError(ack.message)


class EmbeddingError(ActiveMemoryError):
    """An embedder could not turn texts into vectors (a model that cannot load, a failing or
    late embeddings server, vectors of the wrong size). Search falls back to text alone."""
