"""Connection strings, made safe to print.

A DSN may carry a password, as a URL (``postgresql://u:secret@h/db``) or as
``key=value`` pairs (``password=secret``). Nothing that reaches a log, an error
message or the HTTP API may contain it: ``redact_dsn`` replaces it with ``***``.
"""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]*)(?=@)", re.I)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|[^\s]*)", re.I)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<pw>[^&\s]*)", re.I)


def redact_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***``."""
    out = _URL_PASSWORD.sub(r"\g<head>***", dsn)
    out = _QUERY_PASSWORD.sub(r"\g<head>***", out)
    return _KV_PASSWORD.sub(r"\g<head>***", out)


def redact_text(text: str, dsn: str) -> str:
    """``text`` (e.g. a driver error) with ``dsn``'s password removed wherever it appears."""
    text = redact_dsn(text)
    for match in (
        *_URL_PASSWORD.finditer(dsn),
        *_KV_PASSWORD.finditer(dsn),
        *_QUERY_PASSWORD.finditer(dsn),
    ):
        secret = match.group("pw").strip("'")
        if secret and secret != "***":
            text = text.replace(secret, "***")
    return text
