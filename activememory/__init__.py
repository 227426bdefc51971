"""activememory: an active memory for chat bots.

Before a bot replies, a bounded recall step searches what the bot knows about the user and
hands the reply model one short, grounded note, or nothing. See README.md and docs/design.md §9.
"""

import importlib as _importlib
from typing import TYPE_CHECKING

from .protocol.config import ActiveMemoryConfig as ActiveMemoryConfig
from .protocol.config import Config as Config
from .protocol.content import MAX_CONTENT_BYTES as MAX_CONTENT_BYTES
from .protocol.content import Block as Block
from .protocol.content import ImageBlock as ImageBlock
from .protocol.content import InputTextBlock as InputTextBlock
from .protocol.content import Message as Message
from .protocol.content import OutputTextBlock as OutputTextBlock
from .protocol.content import ReasoningBlock as ReasoningBlock
from .protocol.content import TextBlock as TextBlock
from .protocol.content import ThinkingBlock as ThinkingBlock
from .protocol.content import ToolResultBlock as ToolResultBlock
from .protocol.content import ToolUseBlock as ToolUseBlock
from .protocol.embeddings import Embedder as Embedder
from .protocol.errors import ActiveMemoryError as ActiveMemoryError
from .protocol.errors import EmbeddingError as EmbeddingError
from .protocol.errors import InvalidInputError as InvalidInputError
from .protocol.errors import MemoryClosedError as MemoryClosedError
from .protocol.errors import SessionNotFoundError as SessionNotFoundError
from .protocol.errors import StorageError as StorageError
from .protocol.recall import RecallCacheInfo as RecallCacheInfo
from .protocol.recall import RecallOutcome as RecallOutcome
from .protocol.recall import RecallPlan as RecallPlan
from .protocol.recall import RecallRequest as RecallRequest
from .protocol.recall import RecallTrace as RecallTrace
from .protocol.recall import Reply as Reply
from .protocol.recall import Sender as Sender
from .protocol.recall import SessionSwitches as SessionSwitches
from .protocol.recall import ToolResult as ToolResult
from .protocol.recall import Turn as Turn
from .protocol.record_results import RecordSearchResult as RecordSearchResult
from .protocol.records import NOT_SET as NOT_SET
from .protocol.records import MemorySearchConfig as MemorySearchConfig
from .protocol.records import PruningEvaluationMode as PruningEvaluationMode
from .protocol.records import PruningMemorySearchConfig as PruningMemorySearchConfig
from .protocol.records import RankingError as RankingError
from .protocol.records import Record as Record
from .protocol.records import RecordRelation as RecordRelation
from .protocol.records import RecordResultFormatConfig as RecordResultFormatConfig
from .protocol.records import RecordStatus as RecordStatus
from .protocol.records import RecordType as RecordType
from .protocol.records import SearchResultFormatConfig as SearchResultFormatConfig
from .protocol.records import TopKMemorySearchConfig as TopKMemorySearchConfig
from .protocol.search import SearchHit as SearchHit
from .protocol.search import SearchResult as SearchResult
from .protocol.session_key import SessionKey as SessionKey
from .protocol.session_key import parse_session_key as parse_session_key
from .protocol.transcript import Event as Event
from .protocol.transcript import ImportEntry as ImportEntry
from .protocol.transcript import IndexStats as IndexStats
from .protocol.transcript import SessionInfo as SessionInfo
from .protocol.userdata import AgentErasure as AgentErasure
from .protocol.userdata import ErasureSummary as ErasureSummary
from .protocol.userdata import RecordErasure as RecordErasure

# Name -> the module that defines it, imported on first use (PEP 562): these modules import
# the runtime (anyio, apsw, numpy, httpx, json5, the records stack), so `import activememory`
# costs the protocol types alone (docs/design.md §9). Type checkers read the block below;
# tests/test_exports.py holds the two lists equal.
_LAZY: dict[str, str] = {
    "sync": "sync",
    "ConfigError": "_config",
    "ConfigWarning": "_config",
    "load_config": "_config",
    "DoctorCheck": "_doctor",
    "DoctorReport": "_doctor",
    "IdentityExport": "_importers",
    "MigrationReport": "_migrate",
    "migrate": "_migrate",
    "Memory": "_memory",
    "Sessions": "_memory",
    "open_memory": "_memory",
    "LocalJudge": "_record_search",
    "OpenAIJudge": "_record_search",
    "Records": "_records",
    "ImportSummary": "_userdata",
    "BreakerInfo": "recall.breaker",
    "RecallModel": "recall.tools",
    "RecallTools": "recall.tools",
}

if TYPE_CHECKING:
    from . import sync as sync
    from ._config import ConfigError as ConfigError
    from ._config import ConfigWarning as ConfigWarning
    from ._config import load_config as load_config
    from ._doctor import DoctorCheck as DoctorCheck
    from ._doctor import DoctorReport as DoctorReport
    from ._importers import IdentityExport as IdentityExport
    from ._memory import Memory as Memory
    from ._memory import Sessions as Sessions
    from ._memory import open_memory as open_memory
    from ._migrate import MigrationReport as MigrationReport
    from ._migrate import migrate as migrate
    from ._record_search import LocalJudge as LocalJudge
    from ._record_search import OpenAIJudge as OpenAIJudge
    from ._records import Records as Records
    from ._userdata import ImportSummary as ImportSummary
    from .recall.breaker import BreakerInfo as BreakerInfo
    from .recall.tools import RecallModel as RecallModel
    from .recall.tools import RecallTools as RecallTools
else:

    def __getattr__(name: str) -> object:
        """Import a lazily exported name's module on first use, then keep the name here."""
        where = _LAZY.get(name)
        if where is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        module = _importlib.import_module(f".{where}", __name__)
        value = module if where == name else getattr(module, name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})


__all__ = [
    "MAX_CONTENT_BYTES",
    "NOT_SET",
    "ActiveMemoryConfig",
    "ActiveMemoryError",
    "AgentErasure",
    "Block",
    "BreakerInfo",
    "Config",
    "ConfigError",
    "ConfigWarning",
    "DoctorCheck",
    "DoctorReport",
    "Embedder",
    "EmbeddingError",
    "ErasureSummary",
    "Event",
    "IdentityExport",
    "ImageBlock",
    "ImportEntry",
    "ImportSummary",
    "IndexStats",
    "InputTextBlock",
    "InvalidInputError",
    "LocalJudge",
    "Memory",
    "MemoryClosedError",
    "MemorySearchConfig",
    "Message",
    "MigrationReport",
    "OpenAIJudge",
    "OutputTextBlock",
    "PruningEvaluationMode",
    "PruningMemorySearchConfig",
    "RankingError",
    "ReasoningBlock",
    "RecallCacheInfo",
    "RecallModel",
    "RecallOutcome",
    "RecallPlan",
    "RecallRequest",
    "RecallTools",
    "RecallTrace",
    "Record",
    "RecordErasure",
    "RecordRelation",
    "RecordResultFormatConfig",
    "RecordSearchResult",
    "RecordStatus",
    "RecordType",
    "Records",
    "Reply",
    "SearchHit",
    "SearchResult",
    "SearchResultFormatConfig",
    "Sender",
    "SessionInfo",
    "SessionKey",
    "SessionNotFoundError",
    "SessionSwitches",
    "Sessions",
    "StorageError",
    "TextBlock",
    "ThinkingBlock",
    "ToolResult",
    "ToolResultBlock",
    "ToolUseBlock",
    "TopKMemorySearchConfig",
    "Turn",
    "load_config",
    "migrate",
    "open_memory",
    "parse_session_key",
    "sync",
]

__version__ = "0.1.0"
