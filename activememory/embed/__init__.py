"""Embedders: texts to vectors for recall by meaning (docs/design.md §4.7).

`embedder_from_config` builds the embedder `agents.defaults.memorySearch` asks for, with its
fallback: the shipped offline model (`local`), an OpenAI-compatible server (`openai`,
`ollama`), or none (text search only).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from ..protocol.config import Config, EmbeddingProvider, MemorySearchDefaults, Provider
from ..protocol.embeddings import Embedder, EmbeddingDeadlineError
from ..protocol.errors import EmbeddingError
from .local import SHIPPED_MODEL, SHIPPED_MODELS, LocalEmbedder, shipped_embedder
from .openai import OpenAIEmbedder

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "SHIPPED_MODELS",
    "FallbackEmbedder",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "embedder_from_config",
    "shipped_embedder",
]

log = logging.getLogger("activememory.embed")

DEFAULT_BASE_URLS: Final[Mapping[str, str]] = {
    "openai": "https://api.openai.com/v1",
    "ollama": "http://127.0.0.1:11434/v1",  # Ollama's OpenAI-compatible endpoint
}
DEFAULT_MODELS: Final[Mapping[str, str]] = {
    "local": SHIPPED_MODEL,
    "openai": "text-embedding-3-small",
    "ollama": "nomic-embed-text",
}


def embedder_from_config(config: Config | MemorySearchDefaults) -> Embedder | None:
    """The embedder `agents.defaults.memorySearch` describes, or None for text search only.

    `provider` is built first; if it cannot be built (a missing model file, no API key for
    OpenAI) the `fallback` provider is, and if that cannot be built either (or is "none"),
    the answer is None. With both built, the answer is a `FallbackEmbedder` that moves to
    the fallback when the provider fails at run time. `model` applies to `provider` only;
    `local.modelPath` to whichever is `local`, `remote` to whichever is a server. With a
    whole `Config`, `models.providers.<openai|ollama>` give a missing base URL or API key.

    A pure function of the config: nothing loads or connects until the first `embed`, so
    the caller builds one per settings snapshot and keeps it.
    """
    if isinstance(config, Config):
        settings, providers = config.memory_search, config.providers
    else:
        settings, providers = config, {}
    if not settings.enabled:
        return None
    primary = _try_build(settings.provider, settings.model, settings, providers)
    fallback = None
    if settings.fallback != settings.provider:
        fallback = _try_build(settings.fallback, None, settings, providers)
    if primary is None or fallback is None:
        return primary or fallback
    return FallbackEmbedder(primary, fallback)


def _try_build(
    provider: EmbeddingProvider | None,
    model: str | None,
    settings: MemorySearchDefaults,
    providers: Mapping[str, Provider],
) -> Embedder | None:
    if provider is None or provider == "none":
        return None
    try:
        return _build(provider, model, settings, providers)
    except EmbeddingError as exc:
        log.warning("memorySearch: the %s embedder cannot be used: %s", provider, exc)
        return None


def _build(
    provider: EmbeddingProvider,
    model: str | None,
    settings: MemorySearchDefaults,
    providers: Mapping[str, Provider],
) -> Embedder:
    if provider == "local":
        if settings.local.model_path is not None:
            return LocalEmbedder.from_path(settings.local.model_path, model=model)
        return shipped_embedder(model or SHIPPED_MODEL)
    host = providers.get(provider)
    remote = settings.remote
    base_url = remote.base_url or (host.base_url if host else None) or DEFAULT_BASE_URLS[provider]
    api_key = remote.api_key or (host.api_key if host else None)
    if provider == "openai" and not api_key and base_url == DEFAULT_BASE_URLS["openai"]:
        raise EmbeddingError("OpenAI needs remote.apiKey (or models.providers.openai.apiKey)")
    return OpenAIEmbedder(
        provider=provider,
        base_url=base_url,
        model=model or DEFAULT_MODELS[provider],
        api_key=api_key,
        headers=remote.headers,
    )


class FallbackEmbedder:
    """An embedder with a stand-in: `primary` until it fails, then `fallback` for good.

    A failure of the primary (anything but a missed deadline, which says nothing about the
    embedder) is raised to that call, and from then on `name`, `dim` and `embed` are the
    fallback's: vectors of the two never mix, since their names differ. A caller that tags
    vectors with `name` reads it before `embed` and checks it again after.
    """

    def __init__(self, primary: Embedder, fallback: Embedder) -> None:
        self.primary = primary
        self.fallback = fallback
        self._active = primary

    @property
    def active(self) -> Embedder:
        """The embedder in use now."""
        return self._active

    @property
    def name(self) -> str:
        """The vector space of the embedder in use."""
        return self._active.name

    @property
    def dim(self) -> int:
        """Dimensions of the embedder in use."""
        return self._active.dim

    async def embed(
        self, texts: Sequence[str], *, deadline: float | None = None
    ) -> npt.NDArray[np.float32]:
        """The active embedder's vectors (see `Embedder.embed`).

        Raises EmbeddingError as the active embedder does; when the primary fails (not a
        missed deadline), the error says that the fallback takes over from the next call.

        Cancellation: as the active embedder's `embed`; a cancelled call never switches.
        """
        active = self._active
        try:
            return await active.embed(texts, deadline=deadline)
        except EmbeddingDeadlineError:
            raise
        except EmbeddingError as exc:
            if active is not self.primary:
                raise
            self._active = self.fallback
            log.warning("memorySearch: %s failed, %s takes over: %s", active.name, self.name, exc)
            raise EmbeddingError(f"{exc}; {self.fallback.name} takes over") from exc

    def __repr__(self) -> str:
        return f"FallbackEmbedder({self.primary!r}, {self.fallback!r}, active={self.name!r})"
