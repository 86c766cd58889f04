"""Loading a model (cross-encoder or bi-encoder): a local path, the local hub cache, or the hub when it is reachable."""

from __future__ import annotations

from typing import Any


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """One quick connect to the model hub, so an offline worker fails in seconds, not minutes of retries."""
    import os
    import socket
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def refuse_missing_directory(name_or_path: str) -> None:
    """A model named by a path that is no directory fails here, at once: a hub id never starts
    with ``/`` or ``.``, and importing sentence-transformers to find this out costs seconds."""
    import os

    if name_or_path.startswith(("/", "./", "../")) and not os.path.isdir(name_or_path):
        raise OSError(
            f"model {name_or_path!r} is no directory; set the member's MODEL (RERANKQ_RERANKER_MODEL, or "
            "RERANKQ_RERANKER_<n>_MODEL for member n) to a model's directory or a hub id"
        )


def _load(cls: Any, name_or_path: str, *, device: str) -> Any:
    """``cls`` (a sentence-transformers model class) by local path, from the local hub cache, or from the hub."""
    import os

    if os.path.isdir(name_or_path):
        return cls(name_or_path, device=device)
    try:
        return cls(name_or_path, device=device, local_files_only=True)
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not hub_reachable():
        raise OSError(
            f"model {name_or_path!r} is not a local directory, not in the local cache, and the hub is "
            "unreachable; set RERANKQ_RERANKER_MODEL to a local path"
        )
    return cls(name_or_path, device=device)


def load_cross_encoder(name_or_path: str, *, device: str) -> Any:
    """Load a CrossEncoder by local path, from the local hub cache, or from the hub."""
    refuse_missing_directory(name_or_path)
    from sentence_transformers import CrossEncoder

    return _load(CrossEncoder, name_or_path, device=device)


def load_sentence_transformer(name_or_path: str, *, device: str) -> Any:
    """Load a SentenceTransformer (a bi-encoder) the same way."""
    refuse_missing_directory(name_or_path)
    from sentence_transformers import SentenceTransformer

    return _load(SentenceTransformer, name_or_path, device=device)
