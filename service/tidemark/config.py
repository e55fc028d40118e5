"""Settings: ``tidemark.toml`` and ``TIDEMARK_*`` environment variables.

Environment variables override the file; nested keys use ``__``
(``TIDEMARK_SOURCE__DSN``, ``TIDEMARK_FLUSH__MAX_AGE_S``, ``TIDEMARK_HTTP__PORT``).
The file is ``./tidemark.toml`` unless ``TIDEMARK_CONFIG`` or ``--config`` names
another. Shapes declared here are reconciled with the shape registry at start-up;
shapes added at runtime (API/CLI) live in the registry only.

``explain()`` renders the effective settings with the password redacted, for
``tidemark config check``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tidemark.conninfo import redact_dsn
from tidemark.errors import ConfigError
from tidemark.replication.slot import check_name


class SourceSettings(BaseModel):
    dsn: str = Field(
        default="", description="libpq connection string or URL of the source database"
    )
    slot: str = "tidemark"
    publication: str = "tidemark"
    create_slot: bool = True
    create_publication: bool = True
    publish_all_tables: bool = Field(
        default=False,
        description="create the publication FOR ALL TABLES (superuser) instead of the shape tables",
    )
    reconnect_max_s: float = 30.0

    @field_validator("slot", "publication")
    @classmethod
    def _safe_name(cls, value: str, info: Any) -> str:
        try:
            return check_name(info.field_name, value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


class SinkSettings(BaseModel):
    root: str = Field(default="./tidemark-data", description="folder or URI of the tables")
    maintenance_every_s: float = Field(
        default=3600.0, gt=0, description="compaction and vacuum of each table, this often"
    )
    vacuum_retention_hours: int = Field(default=24, ge=1)


class SparkSettings(BaseModel):
    master: str = "local[2]"
    app_name: str = "tidemark"
    conf: dict[str, str] = Field(default_factory=dict)


class FlushSettings(BaseModel):
    max_rows: int = Field(default=200_000, gt=0)
    max_bytes: int = Field(default=128 * 1024 * 1024, gt=0)
    max_age_s: float = Field(default=1.0, gt=0)
    concurrency: int = Field(default=4, ge=1, le=8)
    memory_budget_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    stage_bytes: int = Field(default=256 * 1024 * 1024, gt=0)


class HttpSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    admin_token: str = Field(default="", description="bearer token for mutations; empty: none")


class MonitorSettings(BaseModel):
    period_s: float = Field(default=5.0, gt=0)
    stall_grace_s: float = Field(default=300.0, gt=0)


class ShapeSettings(BaseModel):
    name: str
    table: str
    where: str | None = None
    columns: list[str] | None = None
    replica: Literal["default", "full"] = "default"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIDEMARK_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    source: SourceSettings = Field(default_factory=SourceSettings)
    sink: SinkSettings = Field(default_factory=SinkSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    flush: FlushSettings = Field(default_factory=FlushSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    monitor: MonitorSettings = Field(default_factory=MonitorSettings)
    shutdown_grace_s: float = Field(default=30.0, gt=0)
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    shapes: list[ShapeSettings] = Field(default_factory=list)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = os.environ.get("TIDEMARK_CONFIG", "tidemark.toml")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if Path(path).exists():
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def load_settings(
    path: str | None = None, *, require_dsn: bool = True, **overrides: Any
) -> Settings:
    """Settings from the file (``path``, ``$TIDEMARK_CONFIG`` or ./tidemark.toml) and env.

    ``require_dsn=False`` serves commands that talk to a running service or read the
    lake, which need no source database.
    """
    previous = os.environ.get("TIDEMARK_CONFIG")
    if path is not None:
        if not Path(path).exists():
            raise ConfigError(f"config file {path} does not exist")
        os.environ["TIDEMARK_CONFIG"] = path
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_explain_errors(exc)) from None
    finally:
        if path is not None:
            if previous is None:
                os.environ.pop("TIDEMARK_CONFIG", None)
            else:
                os.environ["TIDEMARK_CONFIG"] = previous
    if require_dsn and not settings.source.dsn:
        raise ConfigError(
            'source.dsn is not set: put it in tidemark.toml ([source] dsn = "postgresql://'
            'user:password@host/db") or set TIDEMARK_SOURCE__DSN'
        )
    return settings


def _explain_errors(exc: ValidationError) -> str:
    lines = ["invalid configuration:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        env = "TIDEMARK_" + "__".join(str(p).upper() for p in err["loc"] if not isinstance(p, int))
        lines.append(f"  {where}: {err['msg']} (in tidemark.toml, or {env})")
    return "\n".join(lines)


def explain(settings: Settings) -> str:
    """The effective settings, password redacted, as TOML-ish text."""
    data = settings.model_dump()
    data["source"]["dsn"] = redact_dsn(settings.source.dsn)
    if settings.http.admin_token:
        data["http"]["admin_token"] = "***"
    out: list[str] = []
    shapes = data.pop("shapes")
    for key, value in data.items():
        if isinstance(value, dict):
            out.append(f"[{key}]")
            out += [f"{k} = {v!r}" for k, v in value.items()]
            out.append("")
        else:
            out.insert(0, f"{key} = {value!r}")
    for shape in shapes:
        out.append("[[shapes]]")
        out += [f"{k} = {v!r}" for k, v in shape.items() if v is not None]
        out.append("")
    return "\n".join(out)
