"""Redis URLs as they may be shown to a person: with the password masked."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["redacted_url"]


def redacted_url(url: str | None) -> str:
    """Return ``url`` with any password replaced by ``***`` (``""`` for ``None``).

    ``redis://user:pw@host:6379/0`` → ``redis://user:***@host:6379/0``; a ``password=``
    query parameter is masked the same way. A string that is not a URL is returned
    unchanged but for such a query parameter. Safe for logs, errors and replies.
    """
    if not url:
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    masked = url
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"***@{host}"
        masked = masked.replace(parts.netloc, netloc, 1)
    if parts.query:
        query = "&".join(
            "password=***" if pair.lower().startswith("password=") else pair
            for pair in parts.query.split("&")
        )
        masked = masked.replace(parts.query, query, 1)
    return masked
