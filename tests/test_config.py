"""Config loading (docs/design.md §4.1): the seed's examples load, bad values get exact, named errors."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

# Private modules until `activememory/__init__.py` re-exports these names.
from activememory._config import ConfigError, ConfigWarning, load_config
from activememory.protocol.config import Binding, Config, ProviderModel
from activememory.protocol.errors import InvalidInputError
from activememory.protocol.session_key import parse_session_key

AM = "plugins.entries.active-memory"
CFG = f"{AM}.config"

# --- The `{ ... }` examples of the seed, copied unmodified -----------------------------------

REMEMBER_ACROSS_CONVERSATIONS = """\
{
  agents: {
    entries: {
      personal: {
        memory: {
          search: {
            rememberAcrossConversations: true,
          },
        },
      },
    },
  },
}
"""

QUICK_START = """\
{
  plugins: {
    entries: {
      "active-memory": {
        enabled: true,
        config: {
          enabled: true,
          agents: ["main"],
          allowedChatTypes: ["direct"],
          modelFallback: "google/gemini-3-flash",
          queryMode: "recent",
          promptStyle: "balanced",
          timeoutMs: 15000,
          maxSummaryChars: 220,
          persistTranscripts: false,
          logging: true,
        },
      },
    },
  },
}
"""

CEREBRAS = """\
{
  models: {
    providers: {
      cerebras: {
        baseUrl: "https://api.cerebras.ai/v1",
        apiKey: "${CEREBRAS_API_KEY}",
        api: "openai-completions",
        models: [{ id: "gpt-oss-120b", name: "GPT OSS 120B (Cerebras)" }],
      },
    },
  },
  plugins: {
    entries: {
      "active-memory": {
        enabled: true,
        config: { model: "cerebras/gpt-oss-120b" },
      },
    },
  },
}
"""

BUILT_IN_MEMORY = """\
{
  plugins: {
    entries: {
      "active-memory": {
        enabled: true,
        config: {
          agents: ["main"],
          // Varsayılan: ["memory_search", "memory_get"]
        },
      },
    },
  },
}
"""

LANCEDB_MEMORY = """\
{
  plugins: {
    entries: {
      "active-memory": {
        enabled: true,
        config: {
          agents: ["main"],
          promptAppend: "Uzun vadeli kullanıcı tercihleri, geçmiş kararlar ve daha önce konuşulan konular için memory_recall kullanın. Hatırlama yararlı bir şey bulamazsa NONE döndürün.",
        },
      },
    },
  },
}
"""

LOSSLESS_CLAW = """\
{
  plugins: {
    slots: {
      contextEngine: "lossless-claw",
    },
    entries: {
      "lossless-claw": {
        enabled: true,
      },
      "active-memory": {
        enabled: true,
        config: {
          agents: ["main"],
          toolsAllow: ["memory_search", "lcm_grep", "lcm_describe", "lcm_expand_query"],
          promptAppend: "Sıkıştırılmış konuşmayı hatırlamak için önce lcm_grep kullanın. Belirli bir özeti incelemek için lcm_describe kullanın. lcm_expand_query aracını yalnızca en son kullanıcı mesajı sıkıştırılarak kaybolmuş olabilecek kesin ayrıntıları gerektiriyorsa kullanın. Alınan bağlam açıkça yararlı değilse NONE döndürün.",
        },
      },
    },
  },
}
"""

TRANSCRIPT_PERSISTENCE = """\
{
  plugins: {
    entries: {
      "active-memory": {
        enabled: true,
        config: {
          agents: ["main"],
          persistTranscripts: true,
          transcriptDir: "active-memory",
        },
      },
    },
  },
}
"""

RECOMMENDED = """\
{
  plugins: {
    entries: {
      "active-memory": {
        enabled: true,
        config: {
          agents: ["main"],
          queryMode: "recent",
          promptStyle: "balanced",
          timeoutMs: 15000,
          maxSummaryChars: 220,
          logging: true,
        },
      },
    },
  },
}
"""

COLD_START_GRACE = """\
{
  plugins: {
    entries: {
      "active-memory": {
        config: {
          timeoutMs: 15000,
          setupGraceTimeoutMs: 30000,
        },
      },
    },
  },
}
"""

# --- Helpers ---------------------------------------------------------------------------------


def with_config(**keys: Any) -> dict[str, Any]:
    """A config mapping whose Active Memory `config` section holds `keys` (camelCase)."""
    return {"plugins": {"entries": {"active-memory": {"config": keys}}}}


def errors_of(source: Any, **kwargs: Any) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        load_config(source, **kwargs)
    return info.value.errors


def write(tmp_path: Path, text: str, name: str = "activememory.json5") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- The seed's examples ---------------------------------------------------------------------


def test_remember_across_conversations_example(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, REMEMBER_ACROSS_CONVERSATIONS))
    assert cfg.agents["personal"].remember_across_conversations is True
    assert cfg.remember_across_conversations("personal")
    assert cfg.recall_agents() == ("personal",)
    assert cfg.enabled


def test_quick_start_example(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, QUICK_START))
    am = cfg.active_memory
    assert cfg.plugin_enabled and am.enabled
    assert am.agents == ("main",)
    assert am.allowed_chat_types == ("direct",)
    assert am.model is None  # inherited from the session
    assert am.model_fallback == "google/gemini-3-flash"
    assert am.query_mode == "recent"
    assert am.prompt_style == "balanced" == am.effective_prompt_style
    assert am.timeout_ms == 15000
    assert am.max_summary_chars == 220
    assert am.persist_transcripts is False
    assert am.logging is True
    assert cfg.warnings == ()


def test_cerebras_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CEREBRAS_API_KEY", "csk-test-123")
    path = write(tmp_path, CEREBRAS)
    cfg = load_config(path)
    provider = cfg.providers["cerebras"]
    assert provider.base_url == "https://api.cerebras.ai/v1"
    assert provider.api_key == "csk-test-123"
    assert provider.api == "openai-completions"
    assert provider.models == (ProviderModel(id="gpt-oss-120b", name="GPT OSS 120B (Cerebras)"),)
    assert cfg.active_memory.model == "cerebras/gpt-oss-120b"
    assert cfg.plugin_enabled
    # `raw` is the file as written: the secret stays a reference.
    assert cfg.raw["models"]["providers"]["cerebras"]["apiKey"] == "${CEREBRAS_API_KEY}"
    assert cfg.source == str(path)


def test_built_in_memory_example(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BUILT_IN_MEMORY))
    assert cfg.active_memory.tools_allow is None
    assert cfg.memory_slot == "memory-core"
    assert cfg.default_tools() == ("memory_search", "memory_get")


def test_lancedb_memory_example(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, LANCEDB_MEMORY))
    assert cfg.active_memory.agents == ("main",)
    assert cfg.active_memory.prompt_append is not None
    assert cfg.active_memory.prompt_append.startswith("Uzun vadeli kullanıcı tercihleri")
    assert cfg.active_memory.prompt_append.endswith("NONE döndürün.")
    assert cfg.active_memory.tools_allow is None


def test_lossless_claw_example(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, LOSSLESS_CLAW))
    assert cfg.active_memory.tools_allow == (
        "memory_search",
        "lcm_grep",
        "lcm_describe",
        "lcm_expand_query",
    )
    assert cfg.active_memory.prompt_append is not None
    assert cfg.active_memory.prompt_append.startswith("Sıkıştırılmış konuşmayı")
    # The host's keys pass through untouched and stay in `raw`.
    assert cfg.memory_slot == "memory-core"
    assert cfg.raw["plugins"]["slots"] == {"contextEngine": "lossless-claw"}
    assert cfg.raw["plugins"]["entries"]["lossless-claw"] == {"enabled": True}


def test_transcript_persistence_example(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, TRANSCRIPT_PERSISTENCE))
    assert cfg.active_memory.persist_transcripts is True
    assert cfg.active_memory.transcript_dir == "active-memory"
    assert cfg.active_memory.agents == ("main",)


def test_recommended_example(tmp_path: Path) -> None:
    am = load_config(write(tmp_path, RECOMMENDED)).active_memory
    assert (am.agents, am.query_mode, am.prompt_style) == (("main",), "recent", "balanced")
    assert (am.timeout_ms, am.max_summary_chars, am.logging) == (15000, 220, True)


def test_cold_start_grace_example(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, COLD_START_GRACE))
    assert cfg.active_memory.timeout_ms == 15000
    assert cfg.active_memory.setup_grace_timeout_ms == 30000
    assert cfg.plugin_enabled  # the entry's `enabled` defaults to on


@pytest.mark.parametrize(
    ("fragment", "expected"),
    [
        ('allowedChatTypes: ["direct"]', {"allowed_chat_types": ("direct",)}),
        ('allowedChatTypes: ["direct", "group"]', {"allowed_chat_types": ("direct", "group")}),
        (
            'allowedChatTypes: ["direct", "group", "channel"]',
            {"allowed_chat_types": ("direct", "group", "channel")},
        ),
        (
            'allowedChatTypes: ["direct", "group"],\n'
            'allowedChatIds: ["ou_operator_open_id", "oc_small_ops_group"],\n'
            'deniedChatIds: ["oc_large_public_group"]',
            {
                "allowed_chat_types": ("direct", "group"),
                "allowed_chat_ids": ("ou_operator_open_id", "oc_small_ops_group"),
                "denied_chat_ids": ("oc_large_public_group",),
            },
        ),
        ('modelFallback: "google/gemini-3-flash"', {"model_fallback": "google/gemini-3-flash"}),
        ('thinking: "medium" // varsayılan: "off"', {"thinking": "medium"}),
        ("fastMode: true", {"fast_mode": True}),
        (
            'promptAppend: "Tek seferlik olaylar yerine kararlı uzun vadeli tercihleri yeğleyin."',
            {
                "prompt_append": "Tek seferlik olaylar yerine kararlı uzun vadeli tercihleri yeğleyin."
            },
        ),
        (
            'promptOverride: "Bir bellek arama ajanısınız. NONE veya tek bir kısa kullanıcı olgusu '
            'döndürün."',
            {
                "prompt_override": "Bir bellek arama ajanısınız. NONE veya tek bir kısa "
                "kullanıcı olgusu döndürün."
            },
        ),
    ],
)
def test_inline_fragments_of_the_seed(
    tmp_path: Path, fragment: str, expected: dict[str, object]
) -> None:
    text = '{ plugins: { entries: { "active-memory": { config: {\n' + fragment + "\n} } } } }"
    cfg = load_config(write(tmp_path, text))
    for name, value in expected.items():
        assert getattr(cfg.active_memory, name) == value


# --- Defaults --------------------------------------------------------------------------------

# docs/design.md §4.1, written out by hand: a wrong default in the Struct fails here.
DOCUMENTED_DEFAULTS: dict[str, object] = {
    "enabled": True,
    "agents": None,
    "model": None,
    "model_fallback": None,
    "model_fallback_policy": None,
    "allowed_chat_types": ("direct",),
    "allowed_chat_ids": (),
    "denied_chat_ids": (),
    "query_mode": "recent",
    "prompt_style": None,
    "tools_allow": None,
    "thinking": "off",
    "fast_mode": None,
    "prompt_append": None,
    "prompt_override": None,
    "timeout_ms": 15000,
    "setup_grace_timeout_ms": 0,
    "max_summary_chars": 220,
    "recent_user_turns": 2,
    "recent_assistant_turns": 1,
    "recent_user_chars": 220,
    "recent_assistant_chars": 180,
    "cache_ttl_ms": 15000,
    "circuit_breaker_max_timeouts": 3,
    "circuit_breaker_cooldown_ms": 60000,
    "logging": False,
    "persist_transcripts": False,
    "transcript_dir": "active-memory",
    "single_owner": False,
    "owner_identity": None,
}


def test_an_empty_config_has_the_spec_defaults() -> None:
    cfg = load_config({})
    am = cfg.active_memory
    for name, value in DOCUMENTED_DEFAULTS.items():
        assert getattr(am, name) == value, name
    assert am.qmd.search_mode == "search"
    assert am.effective_prompt_style == "balanced"
    assert cfg.plugin_enabled is True
    assert cfg.enabled is True
    assert cfg.memory_slot == "memory-core"
    assert cfg.agents == {}
    assert cfg.dm_scope is None
    assert cfg.bindings == ()
    assert cfg.providers == {}
    assert cfg.source is None
    assert cfg.raw == {}
    assert cfg.warnings == ()
    assert cfg.recall_agents() == ("main",)
    assert cfg.default_tools() == ("memory_search", "memory_get")
    assert cfg.remember_across_conversations("main") is True
    assert cfg.search.visibility == "tree"
    # Every key of the table is covered (and nothing else), so a new field needs a default here.
    assert set(DOCUMENTED_DEFAULTS) | {"qmd"} == set(am.__struct_fields__)


def test_empty_sections_and_null_optionals_mean_defaults() -> None:
    cfg = load_config(
        {"plugins": {"entries": {"active-memory": {}}}, "agents": {}, "session": {}, "models": {}}
    )
    assert cfg.active_memory == load_config({}).active_memory
    am = load_config(with_config(model=None, promptStyle=None, fastMode=None)).active_memory
    assert (am.model, am.prompt_style, am.fast_mode) == (None, None, None)


@pytest.mark.parametrize(
    ("query_mode", "style"), [("message", "strict"), ("recent", "balanced"), ("full", "contextual")]
)
def test_prompt_style_follows_query_mode_unless_set(query_mode: str, style: str) -> None:
    assert load_config(with_config(queryMode=query_mode)).active_memory.effective_prompt_style == (
        style
    )
    explicit = load_config(with_config(queryMode=query_mode, promptStyle="preference-only"))
    assert explicit.active_memory.effective_prompt_style == "preference-only"


def test_a_config_passes_through() -> None:
    cfg = load_config(with_config(timeoutMs=5000))
    assert load_config(cfg) is cfg


# --- Numeric ranges --------------------------------------------------------------------------

# (key, attribute, minimum, maximum), from the docs/design.md §4.1 table.
NUMERIC = [
    ("timeoutMs", "timeout_ms", 250, 120000),
    ("setupGraceTimeoutMs", "setup_grace_timeout_ms", 0, 30000),
    ("maxSummaryChars", "max_summary_chars", 40, 1000),
    ("recentUserTurns", "recent_user_turns", 0, 4),
    ("recentAssistantTurns", "recent_assistant_turns", 0, 3),
    ("recentUserChars", "recent_user_chars", 40, 1000),
    ("recentAssistantChars", "recent_assistant_chars", 40, 1000),
    ("cacheTtlMs", "cache_ttl_ms", 1000, 120000),
    ("circuitBreakerMaxTimeouts", "circuit_breaker_max_timeouts", 1, 20),
    ("circuitBreakerCooldownMs", "circuit_breaker_cooldown_ms", 5000, 600000),
]


@pytest.mark.parametrize(("key", "attr", "low", "high"), NUMERIC)
def test_numeric_keys_accept_their_bounds(key: str, attr: str, low: int, high: int) -> None:
    assert getattr(load_config(with_config(**{key: low})).active_memory, attr) == low
    assert getattr(load_config(with_config(**{key: high})).active_memory, attr) == high


@pytest.mark.parametrize(("key", "attr", "low", "high"), NUMERIC)
def test_numeric_keys_reject_values_out_of_range(key: str, attr: str, low: int, high: int) -> None:
    assert errors_of(with_config(**{key: low - 1})) == (
        f"{CFG}.{key}: {low - 1} is below the minimum {low}",
    )
    assert errors_of(with_config(**{key: high + 1})) == (
        f"{CFG}.{key}: {high + 1} is above the maximum {high}",
    )


@pytest.mark.parametrize(("key", "attr", "low", "high"), NUMERIC)
@pytest.mark.parametrize(
    ("make", "shown"),
    [
        (lambda n: str(n), lambda n: f'"{n}"'),
        (lambda n: True, lambda n: "true"),
        (lambda n: float(n), lambda n: f"{n}.0"),
        (lambda n: n + 0.5, lambda n: f"{n}.5"),
        (lambda n: None, lambda n: "null"),
    ],
    ids=["string", "bool", "whole-float", "float", "null"],
)
def test_numeric_keys_reject_other_types(
    key: str, attr: str, low: int, high: int, make: Any, shown: Any
) -> None:
    assert errors_of(with_config(**{key: make(low)})) == (
        f"{CFG}.{key}: expected an integer, got {shown(low)}",
    )


def test_the_spec_example_error_text() -> None:
    assert errors_of(with_config(timeoutMs=50)) == (
        f"{CFG}.timeoutMs: 50 is below the minimum 250",
    )
    assert errors_of(with_config(timeoutMs=249)) == (
        "plugins.entries.active-memory.config.timeoutMs: 249 is below the minimum 250",
    )
    assert errors_of(with_config(timeoutMs=120001)) == (
        "plugins.entries.active-memory.config.timeoutMs: 120001 is above the maximum 120000",
    )
    assert errors_of(with_config(timeoutMs="15000")) == (
        'plugins.entries.active-memory.config.timeoutMs: expected an integer, got "15000"',
    )


# --- Choices ---------------------------------------------------------------------------------

# (path under the config section, allowed values in documented order)
CHOICES = [
    ("queryMode", ["message", "recent", "full"]),
    (
        "promptStyle",
        [
            "balanced",
            "strict",
            "contextual",
            "recall-heavy",
            "precision-heavy",
            "preference-only",
        ],
    ),
    ("thinking", ["off", "minimal", "low", "medium", "high", "xhigh", "adaptive", "max"]),
]


def listed(values: list[str]) -> str:
    return ", ".join(f'"{v}"' for v in values)


@pytest.mark.parametrize(("key", "values"), CHOICES)
def test_choice_keys_accept_every_value(key: str, values: list[str]) -> None:
    for value in values:
        cfg = load_config(with_config(**{key: value}))
        assert value in repr(cfg.active_memory)


@pytest.mark.parametrize(("key", "values"), CHOICES)
@pytest.mark.parametrize("bad", ["fast", "", "Recent", 3, True])
def test_choice_keys_reject_other_values(key: str, values: list[str], bad: object) -> None:
    assert errors_of(with_config(**{key: bad})) == (
        f"{CFG}.{key}: {json.dumps(bad)} is not one of {listed(values)}",
    )


def test_query_mode_error_text() -> None:
    assert errors_of(with_config(queryMode="fast")) == (
        f'{CFG}.queryMode: "fast" is not one of "message", "recent", "full"',
    )


@pytest.mark.parametrize("mode", ["inherit", "search", "vsearch", "query"])
def test_qmd_search_mode_values(mode: str) -> None:
    assert load_config(with_config(qmd={"searchMode": mode})).active_memory.qmd.search_mode == mode


def test_qmd_search_mode_rejects_other_values() -> None:
    assert errors_of(with_config(qmd={"searchMode": "fuzzy"})) == (
        f'{CFG}.qmd.searchMode: "fuzzy" is not one of "inherit", "search", "vsearch", "query"',
    )


@pytest.mark.parametrize("kinds", [[], ["direct", "group", "channel", "explicit"], ["explicit"]])
def test_allowed_chat_types_accept_the_four_types(kinds: list[str]) -> None:
    assert load_config(with_config(allowedChatTypes=kinds)).active_memory.allowed_chat_types == (
        tuple(kinds)
    )


def test_allowed_chat_types_reject_other_types_by_position() -> None:
    assert errors_of(with_config(allowedChatTypes=["direct", "dm", "group", 5])) == (
        f'{CFG}.allowedChatTypes[1]: "dm" is not one of "direct", "group", "channel", "explicit"',
        f'{CFG}.allowedChatTypes[3]: 5 is not one of "direct", "group", "channel", "explicit"',
    )


@pytest.mark.parametrize("value", [True, False, "auto", None])
def test_fast_mode_values(value: object) -> None:
    assert load_config(with_config(fastMode=value)).active_memory.fast_mode == value


@pytest.mark.parametrize("bad", ["on", 1, "true"])
def test_fast_mode_rejects_other_values(bad: object) -> None:
    assert errors_of(with_config(fastMode=bad)) == (
        f'{CFG}.fastMode: {json.dumps(bad)} is not one of true, false, "auto"',
    )


@pytest.mark.parametrize(
    "scope", ["main", "per-peer", "per-channel-peer", "per-account-channel-peer"]
)
def test_dm_scope_values(scope: str) -> None:
    assert load_config({"session": {"dmScope": scope}}).dm_scope == scope


@pytest.mark.parametrize("bad", ["per-user", 3])
def test_dm_scope_rejects_other_values(bad: object) -> None:
    assert errors_of({"session": {"dmScope": bad}}) == (
        f"session.dmScope: {json.dumps(bad)} is not one of "
        '"main", "per-peer", "per-channel-peer", "per-account-channel-peer"',
    )


def test_a_provider_of_another_api_loads_but_cannot_serve_recall() -> None:
    # The file is shared with the host: its other providers must not break loading.
    source = {"models": {"providers": {"x": {"api": "anthropic-messages"}}}}
    provider = load_config(source).providers["x"]
    assert provider.api == "anthropic-messages" and not provider.serves_recall
    ok = {"models": {"providers": {"y": {"baseUrl": "http://h/v1"}}}}
    assert load_config(ok).providers["y"].serves_recall


# --- Other types -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "error"),
    [
        (
            {"plugins": {"entries": {"active-memory": {"enabled": 1}}}},
            f"{AM}.enabled: expected true or false, got 1",
        ),
        (with_config(enabled="yes"), f'{CFG}.enabled: expected true or false, got "yes"'),
        (with_config(logging=0), f"{CFG}.logging: expected true or false, got 0"),
        (
            with_config(persistTranscripts=None),
            f"{CFG}.persistTranscripts: expected true or false, got null",
        ),
        (with_config(model=3), f"{CFG}.model: expected a string, got 3"),
        (with_config(promptAppend=["x"]), f'{CFG}.promptAppend: expected a string, got ["x"]'),
        (with_config(promptOverride=3), f"{CFG}.promptOverride: expected a string, got 3"),
        (with_config(transcriptDir=3), f"{CFG}.transcriptDir: expected a string, got 3"),
        (with_config(agents="main"), f'{CFG}.agents: expected a list of strings, got "main"'),
        (
            with_config(allowedChatTypes="direct"),
            f'{CFG}.allowedChatTypes: expected a list of strings, got "direct"',
        ),
        (
            with_config(allowedChatIds={"a": 1}),
            f'{CFG}.allowedChatIds: expected a list of strings, got {{"a": 1}}',
        ),
        (
            with_config(deniedChatIds=[""]),
            f'{CFG}.deniedChatIds[0]: expected a non-empty string, got ""',
        ),
        (with_config(toolsAllow=[1]), f"{CFG}.toolsAllow[0]: expected a non-empty string, got 1"),
        (with_config(qmd=[1]), f"{CFG}.qmd: expected an object, got [1]"),
        (with_config(singleOwner="yes"), f'{CFG}.singleOwner: expected true or false, got "yes"'),
        (with_config(ownerIdentity=3), f"{CFG}.ownerIdentity: expected a non-empty string, got 3"),
        (
            with_config(ownerIdentity=""),
            f'{CFG}.ownerIdentity: expected a non-empty string, got ""',
        ),
        ({"session": {"identityLinks": [1]}}, "session.identityLinks: expected an object, got [1]"),
        (
            {"session": {"identityLinks": {"dana": "telegram:123"}}},
            'session.identityLinks.dana: expected a list of strings, got "telegram:123"',
        ),
        (
            {"session": {"identityLinks": {"dana": [""]}}},
            'session.identityLinks.dana[0]: expected a non-empty string, got ""',
        ),
        (
            {"plugins": {"entries": {"active-memory": {"config": [1]}}}},
            f"{CFG}: expected an object, got [1]",
        ),
        ({"plugins": {"entries": {"active-memory": True}}}, f"{AM}: expected an object, got true"),
        ({"plugins": []}, "plugins: expected an object, got []"),
        ({"plugins": {"slots": {"memory": 1}}}, "plugins.slots.memory: expected a string, got 1"),
        (
            {
                "agents": {
                    "entries": {"x": {"memory": {"search": {"rememberAcrossConversations": "yes"}}}}
                }
            },
            'agents.entries.x.memory.search.rememberAcrossConversations: expected true or false, got "yes"',
        ),
        (
            {"agents": {"entries": {"x": {"model": 3}}}},
            "agents.entries.x.model: expected a string or an object, got 3",
        ),
        (
            {"agents": {"entries": {"x": {"workspace": ""}}}},
            'agents.entries.x.workspace: expected a non-empty string, got ""',
        ),
        ({"bindings": {}}, "bindings: expected a list of objects, got {}"),
        (
            {"bindings": [{"agentId": 3}]},
            "bindings[0].agentId: expected a string, got 3",
        ),
        (
            {"bindings": [{"session": {"dmScope": 3}}]},
            "bindings[0].session.dmScope: expected a string, got 3",
        ),
        ({"models": {"providers": []}}, "models.providers: expected an object, got []"),
        (
            {"models": {"providers": {"x": {"baseUrl": 1}}}},
            "models.providers.x.baseUrl: expected a string, got 1",
        ),
        (
            {"models": {"providers": {"x": {"baseUrl": "http://h", "models": [{"name": "n"}]}}}},
            'models.providers.x.models[0]: missing required key "id"',
        ),
    ],
)
def test_wrong_types_name_the_key_and_the_value(source: dict[str, Any], error: str) -> None:
    assert errors_of(source) == (error,)


def test_shown_values_are_cut_to_60_characters() -> None:
    (error,) = errors_of(with_config(timeoutMs="x" * 100))
    shown = error.split(", got ", 1)[1]
    assert shown == '"' + "x" * 58 + "…"
    assert len(shown) == 60


def test_non_ascii_values_are_shown_as_written() -> None:
    assert errors_of(with_config(queryMode="yakın")) == (
        f'{CFG}.queryMode: "yakın" is not one of "message", "recent", "full"',
    )


# --- Model references, agent ids, transcript folder ------------------------------------------


@pytest.mark.parametrize("ref", ["google/gemini-3-flash", "cerebras/gpt-oss-120b", "a/b/c"])
def test_model_references(ref: str) -> None:
    am = load_config(with_config(model=ref, modelFallback=ref)).active_memory
    assert am.model == am.model_fallback == ref


@pytest.mark.parametrize("key", ["model", "modelFallback"])
@pytest.mark.parametrize("bad", ["gpt4", "/gpt4", "google/", "", "google/gemini 3", "a b/c"])
def test_model_references_need_provider_and_model(key: str, bad: str) -> None:
    assert errors_of(with_config(**{key: bad})) == (
        f"{CFG}.{key}: {json.dumps(bad)} is not a model reference of the form provider/model",
    )


def test_agent_model_references_are_checked_too() -> None:
    assert errors_of({"agents": {"entries": {"x": {"model": "gpt4"}}}}) == (
        'agents.entries.x.model: "gpt4" is not a model reference of the form provider/model',
    )


AGENT_ID_RULE = (
    "is not an agent id (lowercase letters, digits, _ and -, starting with a letter or digit, "
    "at most 64 characters)"
)


@pytest.mark.parametrize("bad", ["Main", "-x", "", "a b", "main\n", "ü"])
def test_agent_ids_are_checked(bad: str) -> None:
    assert errors_of(with_config(agents=["main", bad])) == (
        f"{CFG}.agents[1]: {json.dumps(bad, ensure_ascii=False)} {AGENT_ID_RULE}",
    )


def test_agent_ids_have_at_most_64_characters() -> None:
    assert load_config(with_config(agents=["a" * 64])).active_memory.agents == ("a" * 64,)
    (error,) = errors_of(with_config(agents=["a" * 65]))
    assert error == f'{CFG}.agents[0]: "{"a" * 58}… {AGENT_ID_RULE}'


def test_agent_entry_ids_are_checked() -> None:
    (error,) = errors_of({"agents": {"entries": {"Personal": {}}}})
    assert error.startswith('agents.entries.Personal: "Personal" is not an agent id')


@pytest.mark.parametrize("folder", ["active-memory", "debug/recall", "./am", "...", "a.b/c..d"])
def test_transcript_dir_accepts_relative_folders(folder: str) -> None:
    assert load_config(with_config(transcriptDir=folder)).active_memory.transcript_dir == folder


@pytest.mark.parametrize(
    "bad", ["../x", "..", "a/../b", "a/..", "/abs", "", ".", "./", "a\\b", "C:/x", "a\x00b"]
)
def test_transcript_dir_must_stay_inside_the_sessions_folder(bad: str) -> None:
    assert errors_of(with_config(transcriptDir=bad)) == (
        f"{CFG}.transcriptDir: {json.dumps(bad, ensure_ascii=False)} must be a relative path "
        'inside the sessions folder (no "..", not absolute)',
    )


# --- Unknown keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "error"),
    [
        (with_config(timeout=3), f'{CFG}.timeout: unknown key; did you mean "timeoutMs"?'),
        (with_config(TIMEOUTMS=3), f'{CFG}.TIMEOUTMS: unknown key; did you mean "timeoutMs"?'),
        (
            with_config(allowedChatType=["direct"]),
            f'{CFG}.allowedChatType: unknown key; did you mean "allowedChatTypes"?',
        ),
        (
            with_config(qmd={"searchmode": "query"}),
            f'{CFG}.qmd.searchmode: unknown key; did you mean "searchMode"?',
        ),
        (
            with_config(qmd={"zzz": 1}),
            f"{CFG}.qmd.zzz: unknown key; expected one of searchMode",
        ),
        (
            {"plugins": {"entries": {"active-memory": {"enable": True}}}},
            f'{AM}.enable: unknown key; did you mean "enabled"?',
        ),
        (
            {"plugins": {"entries": {"active-memory": {"settings": {}}}}},
            f"{AM}.settings: unknown key; expected one of enabled, config",
        ),
        (
            with_config(zzzz=1),
            f"{CFG}.zzzz: unknown key; expected one of enabled, agents, model, modelFallback, "
            "modelFallbackPolicy, allowedChatTypes, allowedChatIds, deniedChatIds, queryMode, "
            "promptStyle, toolsAllow, thinking, fastMode, promptAppend, promptOverride, timeoutMs, "
            "setupGraceTimeoutMs, maxSummaryChars, recentUserTurns, recentAssistantTurns, "
            "recentUserChars, recentAssistantChars, cacheTtlMs, circuitBreakerMaxTimeouts, "
            "circuitBreakerCooldownMs, logging, persistTranscripts, transcriptDir, qmd, "
            "singleOwner, ownerIdentity",
        ),
        (
            with_config(singleowner=True),
            f'{CFG}.singleowner: unknown key; did you mean "singleOwner"?',
        ),
        (
            with_config(ownerId="dana"),
            f'{CFG}.ownerId: unknown key; did you mean "ownerIdentity"?',
        ),
    ],
)
def test_unknown_keys_in_our_sections_are_reported(source: dict[str, Any], error: str) -> None:
    assert errors_of(source) == (error,)


def test_the_hosts_keys_pass_through() -> None:
    source = {
        "gateway": {"port": 18789},
        "channels": {"telegram": {"enabled": True}},
        "plugins": {
            "allow": ["active-memory"],
            "slots": {"contextEngine": "lossless-claw", "memory": "memory-core"},
            "entries": {"lossless-claw": {"enabled": True, "config": {"anything": [1, 2]}}},
        },
        "agents": {
            "defaults": {"model": {"primary": "x/y"}},
            "entries": {
                "main": {
                    "model": {"primary": "openai/gpt-5", "fallbacks": ["google/gemini-3-flash"]},
                    "identity": {"name": "Molty"},
                    "memory": {
                        "search": {"provider": "ollama", "rememberAcrossConversations": False}
                    },
                }
            },
        },
        "session": {"dmScope": "main", "reset": {"mode": "daily"}},
        "bindings": [{"agentId": "main", "match": {"channel": "telegram"}, "session": {}}],
        "models": {
            "mode": "merge",
            "providers": {
                "local": {
                    "baseUrl": "http://127.0.0.1:8000/v1",
                    "models": [{"id": "m", "contextWindow": 8192}],
                    "headers": {"X": "y"},
                }
            },
        },
    }
    cfg = load_config(source)
    assert cfg.agent_model("main") == "openai/gpt-5"
    assert cfg.agents["main"].remember_across_conversations is False
    assert cfg.bindings == (Binding(agent_id="main", dm_scope=None),)
    assert cfg.providers["local"].models == (ProviderModel(id="m", name=None),)
    assert cfg.raw == source


# --- ${ENV} expansion ------------------------------------------------------------------------


def test_env_references_are_expanded_at_load_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AM_MODEL", "cerebras/gpt-oss-120b")
    monkeypatch.setenv("AM_HOST", "api.example.com")
    source = {
        "models": {"providers": {"x": {"baseUrl": "https://${AM_HOST}/v1"}}},
        **with_config(model="${AM_MODEL}", promptAppend="at ${AM_HOST}, ${AM_HOST}!"),
    }
    cfg = load_config(source)
    assert cfg.active_memory.model == "cerebras/gpt-oss-120b"
    assert cfg.active_memory.prompt_append == "at api.example.com, api.example.com!"
    assert cfg.providers["x"].base_url == "https://api.example.com/v1"
    assert cfg.raw == source  # as written
    monkeypatch.setenv("AM_MODEL", "google/gemini-3-flash")  # read at load time, not later
    assert cfg.active_memory.model == "cerebras/gpt-oss-120b"
    assert load_config(source).active_memory.model == "google/gemini-3-flash"


def test_expanded_values_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AM_MODE", "fast")
    assert errors_of(with_config(queryMode="${AM_MODE}")) == (
        f'{CFG}.queryMode: "fast" is not one of "message", "recent", "full"',
    )


def test_double_dollar_is_a_literal_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AM_X", "expanded")
    cfg = load_config(with_config(promptAppend="$${AM_X} and ${AM_X} and $${UNSET_X}"))
    assert cfg.active_memory.prompt_append == "${AM_X} and expanded and ${UNSET_X}"
    with pytest.warns(ConfigWarning):  # also under a free-form key
        cfg = load_config(with_config(modelFallbackPolicy="$${AM_X}"))
    assert cfg.active_memory.model_fallback_policy == "${AM_X}"


def test_a_missing_variable_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CEREBRAS_API_KEY", raising=False)
    assert errors_of(json_source(CEREBRAS)) == (
        "models.providers.cerebras.apiKey: environment variable CEREBRAS_API_KEY is not set",
    )


def test_a_missing_variable_in_the_hosts_sections_is_an_error_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AM_TG_TOKEN", raising=False)
    assert errors_of({"channels": {"telegram": {"tokens": ["${AM_TG_TOKEN}"]}}}) == (
        "channels.telegram.tokens[0]: environment variable AM_TG_TOKEN is not set",
    )


def test_env_can_be_given_explicitly() -> None:
    cfg = load_config(with_config(model="${M}"), env={"M": "p/m"})
    assert cfg.active_memory.model == "p/m"


def test_only_well_formed_references_are_expanded() -> None:
    text = "${} ${1X} ${a b} $X {X}"
    assert load_config(with_config(promptAppend=text), env={}).active_memory.prompt_append == text


def json_source(text: str) -> dict[str, Any]:
    import json5

    value = json5.loads(text)
    assert isinstance(value, dict)
    return value


# --- Files -----------------------------------------------------------------------------------


def test_a_json5_syntax_error_names_the_line_and_column(tmp_path: Path) -> None:
    # A missing comma after line 3: json5 stops at the first character it cannot take.
    path = write(
        tmp_path,
        '{\n  plugins: {\n    slots: { memory: "memory-core" }\n    entries: {},\n  },\n}\n',
    )
    assert errors_of(path) == (f'{path}: invalid JSON5 at line 4, column 5: unexpected "e"',)
    path = write(tmp_path, '{ a: "x\n" }', "newline.json5")
    assert errors_of(path) == (f'{path}: invalid JSON5 at line 1, column 8: unexpected "\\n"',)
    # A character json5 reads, then refuses by its Unicode class, is the place (not the next).
    path = write(tmp_path, "{\n  plugins: {},\n  agents}\n", "colon.json5")
    assert errors_of(path) == (f'{path}: invalid JSON5 at line 3, column 9: unexpected "}}"',)
    path = write(tmp_path, "{a: 1,, b: 2}", "commas.json5")
    assert errors_of(path) == (f'{path}: invalid JSON5 at line 1, column 7: unexpected ","',)
    # A misspelt keyword: json5 stops where it stops matching; the error shows the word.
    path = write(tmp_path, "{\n  a: [1, tru],\n}\n", "word.json5")
    assert errors_of(path) == (f'{path}: invalid JSON5 at line 2, column 10: unexpected "tru"',)
    path = write(tmp_path, '{a: "x", b: -Infinty}', "infinity.json5")
    assert errors_of(path) == (f'{path}: invalid JSON5 at line 1, column 14: unexpected "Infinty"',)
    path = write(tmp_path, '{a: "tr\n"}', "string.json5")  # in a string: the newline
    assert errors_of(path) == (f'{path}: invalid JSON5 at line 1, column 8: unexpected "\\n"',)
    path = write(tmp_path, "{\n  a: 1,\n", "short.json5")
    assert errors_of(path) == (
        f"{path}: invalid JSON5 at line 3, column 1: unexpected end of input",
    )


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nope.json5"
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert info.value.errors == (
        f"{path}: cannot read the config file (No such file or directory)",
    )
    assert info.value.source == str(path)


def test_a_folder_is_not_a_config_file(tmp_path: Path) -> None:
    (error,) = errors_of(tmp_path)
    assert error.startswith(f"{tmp_path}: cannot read the config file (")


def test_an_empty_file_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "  \n")
    assert errors_of(path) == (f"{path}: invalid JSON5 at line 1, column 1: the file is empty",)


def test_the_top_level_must_be_an_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "[1, 2]", "list.json5")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config("list.json5")
    # The message names the file as the caller did; `source` is absolute.
    assert info.value.errors == ("list.json5: expected an object at the top level, got [1, 2]",)
    assert info.value.source == str(tmp_path / "list.json5")


def test_non_utf8_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json5"
    path.write_bytes(b'{ a: "\xff" }')
    assert errors_of(path) == (f"{path}: not UTF-8 text (byte 6 cannot be decoded)",)


def test_file_errors_name_the_key_path(tmp_path: Path) -> None:
    path = write(
        tmp_path, '{ plugins: { entries: { "active-memory": { config: { timeoutMs: 1 } } } } }'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == (f"{CFG}.timeoutMs: 1 is below the minimum 250",)
    assert info.value.source == str(path)


def test_a_relative_path_is_remembered_absolutely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "{}")
    monkeypatch.chdir(tmp_path)
    assert load_config("activememory.json5").source == str(tmp_path / "activememory.json5")


def test_other_sources_are_rejected() -> None:
    assert errors_of(42) == ("config: expected a file path, a mapping or an am.Config, got int",)


# --- Deprecated keys -------------------------------------------------------------------------

DEPRECATION = (
    f"{CFG}.modelFallbackPolicy is deprecated and ignored: modelFallback is only the last "
    "link of the model chain, never a failover when a model errors"
)


def test_model_fallback_policy_warns_exactly_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(with_config(modelFallbackPolicy={"mode": "any"}, model="a/b"))
    assert [(w.category, str(w.message)) for w in caught] == [(ConfigWarning, DEPRECATION)]
    assert caught[0].filename == __file__  # points at the caller
    assert cfg.warnings == (DEPRECATION,)
    assert cfg.active_memory.model == "a/b"


def test_no_warning_without_deprecated_keys() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config(with_config(modelFallback="a/b")).warnings == ()


def test_a_bad_config_with_a_deprecated_key_raises_without_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        errors_of(with_config(modelFallbackPolicy="x", timeoutMs=0))


# --- Errors ----------------------------------------------------------------------------------


def test_every_problem_is_reported_in_document_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AM_UNSET", raising=False)
    source = {
        "plugins": {
            "slots": {"memory": 1},
            "entries": {
                "active-memory": {
                    "enabled": "yes",
                    "config": {
                        "timeoutMs": 0,
                        "queryMode": "fast",
                        "tiemoutMs": 3,
                        "promptAppend": "${AM_UNSET}",
                        "allowedChatTypes": ["direct", "dm"],
                    },
                }
            },
        },
        "session": {"dmScope": 3},
        "tools": {"sessions": {"visibility": "everyone"}},
    }
    with pytest.raises(ConfigError) as info:
        load_config(source)
    expected = (
        "plugins.slots.memory: expected a string, got 1",
        f'{AM}.enabled: expected true or false, got "yes"',
        f"{CFG}.timeoutMs: 0 is below the minimum 250",
        f'{CFG}.queryMode: "fast" is not one of "message", "recent", "full"',
        f'{CFG}.tiemoutMs: unknown key; did you mean "timeoutMs"?',
        f"{CFG}.promptAppend: environment variable AM_UNSET is not set",
        f'{CFG}.allowedChatTypes[1]: "dm" is not one of "direct", "group", "channel", "explicit"',
        'session.dmScope: 3 is not one of "main", "per-peer", "per-channel-peer", '
        '"per-account-channel-peer"',
        'tools.sessions.visibility: "everyone" is not one of "self", "tree", "agent", "all"',
    )
    assert info.value.errors == expected
    assert str(info.value) == "\n".join(expected)


def test_every_search_setting_problem_is_reported_with_the_rest() -> None:
    # The sessions_search keys are walked like every other key: no problem hides another.
    source = {
        "tools": {"agentToAgent": {"enabled": "yes"}, "sessions": {"visibility": "everyone"}},
        "agents": {"defaults": {"sandbox": {"sessionToolsVisibility": "some"}}},
        "logging": {"redactPatterns": ["ok", 3]},
        "plugins": {"entries": {"active-memory": {"enabled": "no"}}},
    }
    with pytest.raises(ConfigError) as info:
        load_config(source)
    assert info.value.errors == (
        'tools.agentToAgent.enabled: expected true or false, got "yes"',
        'tools.sessions.visibility: "everyone" is not one of "self", "tree", "agent", "all"',
        'agents.defaults.sandbox.sessionToolsVisibility: "some" is not one of "spawned", "all"',
        "logging.redactPatterns[1]: expected a string, got 3",
        f'{AM}.enabled: expected true or false, got "no"',
    )


def test_an_unset_variable_is_the_only_problem_of_its_key() -> None:
    source = with_config(model="${AM_UNSET_MODEL}", timeoutMs="${AM_UNSET_MS}")
    with pytest.raises(ConfigError) as info:
        load_config(source, env={})
    assert info.value.errors == (
        f"{CFG}.model: environment variable AM_UNSET_MODEL is not set",
        f"{CFG}.timeoutMs: environment variable AM_UNSET_MS is not set",
    )


def test_config_error_is_an_invalid_input_error_and_pickles() -> None:
    with pytest.raises(InvalidInputError) as info:
        load_config(with_config(timeoutMs=1, thinking="lots"))
    error = info.value
    assert isinstance(error, ConfigError) and isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert copy.errors == error.errors and str(copy) == str(error)


def test_search_settings_come_from_the_same_file() -> None:
    cfg = load_config(
        {"tools": {"sessions": {"visibility": "agent"}, "agentToAgent": {"enabled": True}}}
    )
    assert (cfg.search.visibility, cfg.search.agent_to_agent) == ("agent", True)


def test_the_callers_mapping_is_copied() -> None:
    source = with_config(timeoutMs=5000)
    cfg = load_config(source)
    source["plugins"]["entries"]["active-memory"]["config"]["timeoutMs"] = 1
    assert cfg.raw == with_config(timeoutMs=5000)
    assert cfg.active_memory.timeout_ms == 5000


# --- rememberAcrossConversations -------------------------------------------------------------


def remember(explicit: bool | None, dm_scope: str | None, bindings: list[dict[str, Any]]) -> bool:
    source: dict[str, Any] = {"bindings": bindings}
    if explicit is not None:
        source["agents"] = {
            "entries": {"main": {"memory": {"search": {"rememberAcrossConversations": explicit}}}}
        }
    if dm_scope is not None:
        source["session"] = {"dmScope": dm_scope}
    return load_config(source).remember_across_conversations("main")


PER_PEER = {"session": {"dmScope": "per-peer"}}


@pytest.mark.parametrize(
    ("explicit", "dm_scope", "bindings", "expected"),
    [
        (True, "per-peer", [{"agentId": "main", **PER_PEER}], True),
        (False, None, [], False),
        (False, "main", [], False),
        (None, None, [], True),
        (None, "main", [], True),
        (None, "per-peer", [], False),
        (None, "per-channel-peer", [], False),
        (None, None, [{"agentId": "main", **PER_PEER}], False),
        (None, None, [{"agentId": "work", **PER_PEER}], True),
        (None, None, [{**PER_PEER}], False),
        (None, None, [{"agentId": "main", "session": {"dmScope": "main"}}], True),
        (None, "main", [{"agentId": "main", "match": {"channel": "telegram"}}], True),
    ],
    ids=[
        "explicit-true-wins",
        "explicit-false",
        "explicit-false-with-main-scope",
        "dm-scope-unset",
        "dm-scope-main",
        "dm-scope-per-peer",
        "dm-scope-per-channel-peer",
        "binding-for-this-agent",
        "binding-for-another-agent",
        "binding-without-agent-id",
        "binding-keeps-main",
        "binding-without-session",
    ],
)
def test_remember_across_conversations(
    explicit: bool | None, dm_scope: str | None, bindings: list[dict[str, Any]], expected: bool
) -> None:
    assert remember(explicit, dm_scope, bindings) is expected


def test_an_unknown_agent_follows_the_dm_scope() -> None:
    cfg = load_config({"session": {"dmScope": "per-peer"}})
    assert cfg.remember_across_conversations("nobody") is False
    assert load_config({}).remember_across_conversations("nobody") is True


# --- Agents, tools, workspace ----------------------------------------------------------------


def test_recall_agents_come_from_config_agents_first() -> None:
    source = {"agents": {"entries": {"a": {}, "b": {}}}, **with_config(agents=["c"])}
    assert load_config(source).recall_agents() == ("c",)


def test_recall_agents_are_the_configured_agents_otherwise() -> None:
    assert load_config({"agents": {"entries": {"a": {}, "b": {}}}}).recall_agents() == ("a", "b")


def test_recall_agents_default_to_main() -> None:
    assert load_config({}).recall_agents() == ("main",)
    assert load_config(with_config(agents=[])).recall_agents() == ()


@pytest.mark.parametrize(
    ("slot", "tools"),
    [
        ("memory-core", ("memory_search", "memory_get")),
        ("memory-records", ("memory_recall",)),
        ("memory-lancedb", ("memory_recall",)),
        ("some-other-memory", ()),
    ],
)
def test_default_tools_follow_the_memory_slot(slot: str, tools: tuple[str, ...]) -> None:
    assert load_config({"plugins": {"slots": {"memory": slot}}}).default_tools() == tools


def test_agent_model_in_both_forms() -> None:
    cfg = load_config(
        {
            "agents": {
                "entries": {
                    "a": {"model": "openai/gpt-5"},
                    "b": {"model": {"primary": "google/gemini-3-flash"}},
                    "c": {"model": {"fallbacks": []}},
                    "d": {},
                }
            }
        }
    )
    assert [cfg.agent_model(a) for a in "abcde"] == [
        "openai/gpt-5",
        "google/gemini-3-flash",
        None,
        None,
        None,
    ]


def test_workspace_defaults_and_overrides(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg = load_config(
        {
            "agents": {
                "entries": {
                    "rel": {"workspace": "ws/rel"},
                    "abs": {"workspace": str(tmp_path / "elsewhere")},
                }
            }
        }
    )
    assert cfg.workspace("main", state) == state / "agents" / "main" / "workspace"
    assert cfg.workspace("rel", state) == state / "ws" / "rel"
    assert cfg.workspace("abs", state) == tmp_path / "elsewhere"


def test_workspace_expands_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config({"agents": {"entries": {"main": {"workspace": "~/ws"}}}})
    assert cfg.workspace("main", tmp_path / "state") == tmp_path / "home" / "ws"


# --- with_enabled ----------------------------------------------------------------------------


def test_with_enabled_round_trips_through_raw(tmp_path: Path) -> None:
    source = {
        "plugins": {
            "entries": {"active-memory": {"enabled": False, "config": {"timeoutMs": 5000}}}
        },
        "gateway": {"port": 1},
    }
    cfg = load_config(source)
    assert not cfg.enabled
    off = cfg.with_enabled(False)
    assert off.plugin_enabled is True and off.active_memory.enabled is False
    assert off.raw["plugins"]["entries"]["active-memory"] == {
        "enabled": True,
        "config": {"timeoutMs": 5000, "enabled": False},
    }
    assert off.raw["gateway"] == {"port": 1}
    assert load_config(off.raw) == off
    on = off.with_enabled(True)
    assert on.enabled and on.active_memory.timeout_ms == 5000
    assert load_config(on.raw) == on
    # The original is untouched.
    assert cfg.raw == source and cfg.plugin_enabled is False


def test_with_enabled_keeps_the_source_and_secrets_unexpanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CEREBRAS_API_KEY", "csk-secret")
    path = write(tmp_path, CEREBRAS)
    cfg = load_config(path).with_enabled(False)
    assert cfg.source == str(path)
    assert cfg.providers["cerebras"].api_key == "csk-secret"
    assert cfg.raw["models"]["providers"]["cerebras"]["apiKey"] == "${CEREBRAS_API_KEY}"
    write(tmp_path, json.dumps(cfg.raw), "written.json5")
    reloaded = load_config(tmp_path / "written.json5")
    assert reloaded.active_memory == cfg.active_memory
    assert reloaded.providers == cfg.providers


def test_with_enabled_creates_the_entry_when_the_config_had_none() -> None:
    cfg = load_config({}).with_enabled(False)
    assert cfg.raw == {
        "plugins": {"entries": {"active-memory": {"enabled": True, "config": {"enabled": False}}}}
    }
    assert isinstance(cfg, Config) and not cfg.enabled


# --- Identities (docs/design.md §4.2) -----------------------------------------------------

IDENTITIES = {
    "session": {"identityLinks": {"dana": ["telegram:123", "discord:dana#1"], "erin": ["e"]}},
    "plugins": {"entries": {"active-memory": {"config": {"ownerIdentity": "telegram:123"}}}},
}


def test_identity_links_and_the_owner_load() -> None:
    cfg = load_config(IDENTITIES)
    assert cfg.identity_links == {"dana": ("telegram:123", "discord:dana#1"), "erin": ("e",)}
    assert (cfg.active_memory.owner_identity, cfg.active_memory.single_owner) == (
        "telegram:123",
        False,
    )
    assert load_config(with_config(singleOwner=True)).active_memory.single_owner is True


@pytest.mark.parametrize(
    ("key", "linked", "unlinked"),
    [
        ("agent:main:direct:telegram:123", "dana", "telegram:123"),
        ("agent:main:dm:discord:dana#1", "dana", "discord:dana#1"),
        ("agent:main:direct:dana", "dana", "dana"),
        ("agent:main:direct:zed", "zed", "zed"),
        ("agent:main:main", "dana", "main"),  # the owner, named by one of its peers
        ("agent:main:explicit:ui-1", "dana", "main"),
        ("agent:main:group:team", None, None),
        ("agent:main:channel:news", None, None),
        ("legacy-key", None, None),
    ],
)
def test_identity_of_a_session_key(key: str, linked: str | None, unlinked: str | None) -> None:
    parsed = parse_session_key(key)
    assert load_config(IDENTITIES).identity_of(parsed) == linked
    assert load_config({}).identity_of(parsed) == unlinked


# --- agents.defaults.memorySearch: embeddings and hybrid search (docs/design.md §4.7) --------

MS = "agents.defaults.memorySearch"


def with_memory_search(**keys: Any) -> dict[str, Any]:
    """A config mapping whose `agents.defaults.memorySearch` holds `keys` (camelCase)."""
    return {"agents": {"defaults": {"memorySearch": keys}}}


def hybrid(**keys: Any) -> dict[str, Any]:
    return with_memory_search(query={"hybrid": keys})


def test_memory_search_defaults() -> None:
    ms = load_config({}).memory_search
    assert (ms.enabled, ms.provider, ms.model, ms.fallback) == (True, "local", None, "none")
    assert (ms.local.model_path, ms.remote.base_url, ms.remote.api_key) == (None, None, None)
    assert ms.remote.headers == {}
    h = ms.query.hybrid
    assert (h.enabled, h.vector_weight, h.text_weight, h.candidate_multiplier) == (
        True,
        0.7,
        0.3,
        4,
    )
    assert (h.mmr.enabled, h.mmr.lambda_) == (False, 0.7)
    assert (h.temporal_decay.enabled, h.temporal_decay.half_life_days) == (False, 30.0)


def test_memory_search_in_openclaws_shape_loads() -> None:
    source = with_memory_search(
        enabled=True,
        provider="openai",
        model="text-embedding-3-small",
        fallback="local",
        local={"modelPath": "~/models/e5.onnx"},
        remote={"baseUrl": "https://e.example/v1", "apiKey": "${EMB_KEY}", "headers": {"X": "1"}},
        query={
            "maxResults": 8,
            "hybrid": {
                "enabled": True,
                "vectorWeight": 0.6,
                "textWeight": 0.4,
                "candidateMultiplier": 5,
                "mmr": {"enabled": True, "lambda": 0.5},
                "temporalDecay": {"enabled": True, "halfLifeDays": 14},
            },
        },
        sync={"watch": True},
        cache={"enabled": True, "maxEntries": 50000},
    )
    cfg = load_config(source, env={"EMB_KEY": "sk-9"})
    ms = cfg.memory_search
    assert (ms.provider, ms.model, ms.fallback) == ("openai", "text-embedding-3-small", "local")
    assert ms.local.model_path == "~/models/e5.onnx"
    assert (ms.remote.base_url, ms.remote.api_key) == ("https://e.example/v1", "sk-9")
    assert ms.remote.headers == {"X": "1"}
    h = ms.query.hybrid
    assert (h.vector_weight, h.text_weight, h.candidate_multiplier) == (0.6, 0.4, 5)
    assert (h.mmr.enabled, h.mmr.lambda_) == (True, 0.5)
    assert (h.temporal_decay.enabled, h.temporal_decay.half_life_days) == (True, 14.0)
    assert cfg.raw == source  # the secret stays a reference in what is written back


@pytest.mark.parametrize("provider", ["local", "openai", "ollama", "none", None])
def test_memory_search_providers(provider: str | None) -> None:
    ms = load_config(with_memory_search(provider=provider, fallback=provider)).memory_search
    assert (ms.provider, ms.fallback) == (provider, provider)


@pytest.mark.parametrize("key", ["provider", "fallback"])
def test_memory_search_provider_rejects_other_values(key: str) -> None:
    assert errors_of(with_memory_search(**{key: "gemini"})) == (
        f'{MS}.{key}: "gemini" is not one of "local", "openai", "ollama", "none"',
    )


# (path under query.hybrid, attribute getter, minimum, maximum)
HYBRID_NUMBERS = [
    (("vectorWeight",), lambda h: h.vector_weight, 0.0, 1.0),
    (("textWeight",), lambda h: h.text_weight, 0.0, 1.0),
    (("mmr", "lambda"), lambda h: h.mmr.lambda_, 0.0, 1.0),
]


def nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for key in reversed(path):
        value = {key: value}
    return hybrid(**value)


@pytest.mark.parametrize(("path", "get", "low", "high"), HYBRID_NUMBERS)
def test_hybrid_weights_accept_their_bounds(
    path: tuple[str, ...], get: Any, low: float, high: float
) -> None:
    for value in (low, high, 0.25, 1):
        assert get(load_config(nested(path, value)).memory_search.query.hybrid) == value


@pytest.mark.parametrize(("path", "get", "low", "high"), HYBRID_NUMBERS)
def test_hybrid_weights_reject_values_out_of_range(
    path: tuple[str, ...], get: Any, low: float, high: float
) -> None:
    key = f"{MS}.query.hybrid." + ".".join(path)
    assert errors_of(nested(path, -0.1)) == (f"{key}: -0.1 is below the minimum 0.0",)
    assert errors_of(nested(path, 1.5)) == (f"{key}: 1.5 is above the maximum 1.0",)
    assert errors_of(nested(path, "0.5")) == (f'{key}: expected a number, got "0.5"',)
    assert errors_of(nested(path, True)) == (f"{key}: expected a number, got true",)


def test_candidate_multiplier_bounds_and_type() -> None:
    key = f"{MS}.query.hybrid.candidateMultiplier"
    assert (
        load_config(hybrid(candidateMultiplier=1)).memory_search.query.hybrid.candidate_multiplier
        == 1
    )
    assert (
        load_config(hybrid(candidateMultiplier=20)).memory_search.query.hybrid.candidate_multiplier
        == 20
    )
    assert errors_of(hybrid(candidateMultiplier=0)) == (f"{key}: 0 is below the minimum 1",)
    assert errors_of(hybrid(candidateMultiplier=21)) == (f"{key}: 21 is above the maximum 20",)
    assert errors_of(hybrid(candidateMultiplier=2.5)) == (f"{key}: expected an integer, got 2.5",)


def test_notes_sync_keys_defaults_bounds_and_types() -> None:
    def sync(**keys: object) -> dict[str, object]:
        return {"agents": {"defaults": {"memorySearch": {"sync": keys}}}}

    default = load_config({}).memory_search.sync
    assert (default.watch, default.watch_debounce_ms) == (True, 1500)
    # The host's other sync keys pass through.
    chosen = load_config(sync(watch=False, watchDebounceMs=0, onSearch=True)).memory_search.sync
    assert (chosen.watch, chosen.watch_debounce_ms) == (False, 0)
    key = f"{MS}.sync"
    assert errors_of(sync(watch="yes")) == (f'{key}.watch: expected true or false, got "yes"',)
    assert errors_of(sync(watchDebounceMs=-1)) == (
        f"{key}.watchDebounceMs: -1 is below the minimum 0",
    )
    assert errors_of(sync(watchDebounceMs=600_001)) == (
        f"{key}.watchDebounceMs: 600001 is above the maximum 600000",
    )
    assert errors_of(sync(watchDebounceMs=1.5)) == (
        f"{key}.watchDebounceMs: expected an integer, got 1.5",
    )


def test_half_life_bounds_and_type() -> None:
    key = f"{MS}.query.hybrid.temporalDecay.halfLifeDays"
    decay = load_config(hybrid(temporalDecay={"halfLifeDays": 0.5})).memory_search
    assert decay.query.hybrid.temporal_decay.half_life_days == 0.5
    assert errors_of(hybrid(temporalDecay={"halfLifeDays": 0})) == (f"{key}: 0 must be above 0.0",)
    assert errors_of(hybrid(temporalDecay={"halfLifeDays": 36501})) == (
        f"{key}: 36501 is above the maximum 36500.0",
    )
    assert errors_of(hybrid(temporalDecay={"halfLifeDays": None})) == (
        f"{key}: expected a number, got null",
    )


@pytest.mark.parametrize(
    ("source", "error"),
    [
        (with_memory_search(enabled="yes"), f'{MS}.enabled: expected true or false, got "yes"'),
        (with_memory_search(model=""), f'{MS}.model: expected a non-empty string, got ""'),
        (
            with_memory_search(local={"modelPath": 3}),
            f"{MS}.local.modelPath: expected a non-empty string, got 3",
        ),
        (
            with_memory_search(remote={"headers": {"X": 1}}),
            f"{MS}.remote.headers.X: expected a string, got 1",
        ),
        (with_memory_search(remote="http://x"), f'{MS}.remote: expected an object, got "http://x"'),
        (
            hybrid(mmr={"enabled": 1}),
            f"{MS}.query.hybrid.mmr.enabled: expected true or false, got 1",
        ),
    ],
)
def test_memory_search_wrong_types_name_the_key(source: dict[str, Any], error: str) -> None:
    assert errors_of(source) == (error,)


def test_memory_search_unknown_keys_are_the_hosts_and_pass_through() -> None:
    source = with_memory_search(
        sources=["memory", "sessions"],
        store={"vector": {"enabled": True}},
        remote={"batch": {"enabled": False}},
        query={"minScore": 0.3, "hybrid": {"mmr": {"other": 1}}},
    )
    cfg = load_config(source)
    assert cfg.memory_search.provider == "local"
    assert cfg.raw == source
