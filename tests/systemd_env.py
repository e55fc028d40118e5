"""systemd's EnvironmentFile= syntax, for the tests of deploy/systemd."""

from __future__ import annotations

import re


def systemd_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines: '...' taken as is, "..." with \\ escapes; # and ; comments."""
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, _, value = line.partition("=")
        if value[:1] == "'" and value.endswith("'"):
            value = value[1:-1]
        elif value[:1] == '"' and value.endswith('"'):
            value = re.sub(r'\\([\\"$`])', r"\1", value[1:-1])
        out[key.strip()] = value
    return out
