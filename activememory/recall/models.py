"""Which recall model answers (docs/design.md §4.6), and the models built for it.

The chain `config.model` → the session's model → the agent's primary model →
`config.modelFallback` picks a model reference; `RecallModels` turns a reference into a
`RecallModel`: a host model by name, the embedded `local/extractive`, or an
OpenAI-compatible provider model, built once per provider settings and closed on exit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..protocol.config import Config
from ..protocol.session_key import SessionKey
from .local_model import LocalExtractiveModel
from .openai_model import model_from_config
from .tools import RecallModel

LOCAL_MODEL = "local/extractive"


def agent_primary_model(configured: str | None) -> str:
    """An agent's primary model: the configured one, else the embedded `LOCAL_MODEL`."""
    if configured is not None and configured.strip():
        return configured.strip()
    return LOCAL_MODEL


def resolve_recall_model(
    *,
    config_model: str | None,
    session_model: str | None,
    agent_model: str | None,
    fallback: str | None,
    is_available: Callable[[str], bool],
) -> str | None:
    """The recall model: the first of `config.model` → the session's model → the agent's
    primary model → `config.modelFallback` that is set and `is_available`.

    Blank strings count as unset. None when nothing resolves: recall is skipped for the turn.
    `fallback` is only the last link of this chain, never a failover when a model errors.
    """
    for candidate in (config_model, session_model, agent_model, fallback):
        if candidate is None:
            continue
        model = candidate.strip()
        if model and is_available(model):
            return model
    return None


class RecallModels:
    """The host's models by reference, the local model, and the provider models built so far."""

    def __init__(self, host: Mapping[str, Any]) -> None:
        self._host = host
        self._local = LocalExtractiveModel()
        self._provider_models: dict[tuple[str, str | None, str | None], RecallModel] = {}

    def resolve(self, config: Config, key: SessionKey, session_model: str | None) -> str | None:
        """The model chain of docs/design.md §4.6 for this conversation's agent."""
        agent = key.agent or key.store_agent
        return resolve_recall_model(
            config_model=config.active_memory.model,
            session_model=session_model,
            agent_model=agent_primary_model(config.agent_model(agent)),
            fallback=config.active_memory.model_fallback,
            is_available=lambda ref: self._available(config, ref),
        )

    def _available(self, config: Config, ref: str) -> bool:
        if ref == LOCAL_MODEL or ref in self._host:
            return True
        provider, _, model = ref.partition("/")
        settings = config.providers.get(provider)
        if settings is None or not settings.serves_recall:
            return False
        return not settings.models or any(m.id == model for m in settings.models)

    def build(self, config: Config, ref: str) -> RecallModel | None:
        """The model `ref` names, or None if it cannot be built."""
        if ref in self._host:
            return self._host[ref]  # type: ignore[no-any-return]
        if ref == LOCAL_MODEL:
            return self._local
        provider_name, _, _ = ref.partition("/")
        provider = config.providers.get(provider_name)
        if provider is None or not provider.serves_recall:
            return None
        cache_key = (ref, provider.base_url, provider.api_key)
        model = self._provider_models.get(cache_key)
        if model is None:
            model = self._provider_models[cache_key] = model_from_config(ref, provider)
        return model

    async def aclose(self) -> None:
        """Close the provider models built so far (their HTTP connections)."""
        models, self._provider_models = list(self._provider_models.values()), {}
        for model in models:
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()
