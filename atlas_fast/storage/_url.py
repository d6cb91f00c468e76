"""Telling URLs from paths, and splitting a URL into what an engine needs."""

from __future__ import annotations

import os
import re
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

__all__ = ["is_url", "local_path", "ParsedURL", "parse_url", "join_url", "OBSTORE_SCHEMES"]

# Schemes the main engine (obstore) reads; any other scheme goes to fsspec when it knows it.
OBSTORE_SCHEMES = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "azure": "azure",
    "http": "http",
    "https": "http",
}

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


def is_url(path) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path. ``file://`` is a
    URL too: ``local_path`` turns it into the path it names."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def local_path(path):
    """The local path a ``file://`` URL names, or ``path`` itself when it is not a URL."""
    if isinstance(path, str) and path[:7].lower() == "file://":
        parts = urlsplit(path)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{path}: a file:// URL names a local path (file:///path)")
        return unquote(parts.path) or os.sep
    return path


class ParsedURL(NamedTuple):
    """``scheme://container/key``: ``container`` is the bucket (s3, gs, az) or ``host[:port]``
    (http), ``key`` the path under it, without leading or trailing slashes."""

    scheme: str
    container: str
    key: str

    @property
    def url(self) -> str:
        return join_url(f"{self.scheme}://{self.container}", self.key)


def parse_url(url: str) -> ParsedURL:
    """Split ``url``; ValueError naming it when it has no bucket or host."""
    match = _SCHEME.match(url)
    if match is None:
        raise ValueError(f"{url}: not a URL (expected scheme://bucket/path)")
    scheme = match.group(1).lower()
    rest = url[match.end() :]
    container, _, key = rest.partition("/")
    if not container:
        raise ValueError(f"{url}: no bucket or host after {scheme}://")
    return ParsedURL(scheme, container, key.strip("/"))


def join_url(base: str, *names: str) -> str:
    """``base`` and ``names`` joined with single slashes."""
    out = base.rstrip("/")
    for name in names:
        name = name.strip("/")
        if name:
            out = f"{out}/{name}"
    return out
