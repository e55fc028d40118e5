"""systemd's unit file and EnvironmentFile= syntax, for the tests of deploy/systemd."""

from __future__ import annotations

import re
from pathlib import Path


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


def unit_entries(unit: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of every setting of a unit file, comments skipped, in order."""
    section, out = "", []
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out
