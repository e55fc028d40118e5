"""Settings: ``tidemark.toml`` and ``TIDEMARK_*`` environment variables.

Environment variables override the file; nested keys use ``__``
(``TIDEMARK_SOURCE__DSN``, ``TIDEMARK_FLUSH__MAX_AGE_S``, ``TIDEMARK_HTTP__PORT``).
The file is ``./tidemark.toml`` unless ``TIDEMARK_CONFIG`` or ``--config`` names
another. Shapes declared here are reconciled with the shape registry at start-up;
shapes added at runtime (API/CLI) live in the registry only.

Every section refuses keys it does not know (with the nearest valid key suggested),
and so does the environment (``TIDEMARK_SORCE__DSN`` is an error, not a no-op): a
typo never leaves a setting silently at its default. A file that is not UTF-8 TOML,
an environment variable that is not valid JSON where JSON is expected, and any
invalid value raise ``ConfigError`` saying what was wrong, where (file or variable)
and what to do.

The HTTP API's mutations are guarded by ``[http] admin_token`` (or a file holding it,
``admin_token_file``). Listening beyond loopback without one is refused unless
``[http] allow_unauthenticated = true`` says so explicitly.

``explain()`` renders the effective settings with the password redacted, for
``tidemark config check``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings.exceptions import SettingsError

from tidemark.conninfo import redact_dsn, redact_text
from tidemark.errors import ConfigError
from tidemark.replication.catalog import check_name
from tidemark.settings.problems import check_environment, explain_json_error, explain_validation


class _Section(BaseModel):
    """A settings section: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


def read_secret_file(key: str, name: str) -> str:
    """A secret kept in a file (``*_file`` settings): its text, stripped; ValueError
    (reported as a settings error) when it cannot be read or is empty."""
    path = Path(name)
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"cannot read {key} {path}: {exc}; point it at a readable text file holding the secret"
        ) from None
    if not secret:
        raise ValueError(f"{key} {path} is empty: write the secret into it")
    return secret


class SourceSettings(_Section):
    dsn: str = Field(
        default="", description="libpq connection string or URL of the source database"
    )
    dsn_file: str = Field(default="", description="file holding the DSN (used when dsn is empty)")
    password_file: str = Field(
        default="",
        description="file holding the source role's password, kept out of the DSN "
        "(e.g. a systemd credential); it replaces a password the DSN names",
    )
    slot: str = "tidemark"
    publication: str = "tidemark"
    create_slot: bool = True
    failover_slot: bool = Field(
        default=False,
        description="PG 17+: create the slot as a failover slot (synchronised to standbys)",
    )
    create_publication: bool = True
    publish_all_tables: bool = Field(
        default=False,
        description="create the publication FOR ALL TABLES (superuser) instead of the shape tables",
    )
    reconnect_max_s: float = 30.0
    stream_large_transactions: bool = Field(
        default=True,
        description=(
            "ask Postgres to stream transactions larger than logical_decoding_work_mem "
            "while they run (pgoutput streaming 'on') instead of spilling them to disk on "
            "the server and sending them whole at commit"
        ),
    )
    on_stream_gap: Literal["fail", "resync"] = Field(
        default="fail",
        description=(
            "what to do when the stream the shapes follow was broken while tidemark was "
            "away (slot dropped or recreated, advanced by someone else, another source): "
            "fail (stop and say so) or resync (rebuild every shape from a snapshot)"
        ),
    )

    @field_validator("dsn")
    @classmethod
    def _parsable_dsn(cls, value: str) -> str:
        if value:
            check_dsn(value)
        return value

    @model_validator(mode="after")
    def _secrets_from_files(self) -> SourceSettings:
        """The DSN from ``dsn_file`` and the password from ``password_file``, read when
        the settings are loaded: at start and on each reload (SIGHUP)."""
        if not self.dsn and self.dsn_file:
            dsn = read_secret_file("dsn_file", self.dsn_file)
            check_dsn(dsn)
            self.dsn = dsn
        if self.password_file:
            from psycopg.conninfo import make_conninfo

            password = read_secret_file("password_file", self.password_file)
            self.dsn = make_conninfo(self.dsn, password=password)
        return self

    @field_validator("slot", "publication")
    @classmethod
    def _safe_name(cls, value: str, info: Any) -> str:
        try:
            return check_name(info.field_name, value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


def check_dsn(dsn: str) -> None:
    """ValueError (password redacted) unless libpq can parse ``dsn``."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ValueError(
            f"{redact_text(str(exc).strip(), dsn)}: give a URL "
            "(postgresql://user:password@host:5432/dbname) or key=value pairs "
            "(host=... dbname=...)"
        ) from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"port {port!r} is not a TCP port number")


_SPARK_MASTER = re.compile(
    r"local(\[(\d+|\*)(,\d+)?\])?|(spark|k8s|mesos)://\S+|yarn|local-cluster\[\d+,\d+,\d+\]"
)


class SinkSettings(_Section):
    root: str = Field(default="./tidemark-data", description="folder or URI of the tables")
    format: Literal["delta", "iceberg"] = Field(
        default="delta",
        description="the table format of every shape's tables: delta or iceberg (an "
        "[iceberg] section says where its catalog is); a sink root keeps the format it "
        "was started with",
    )
    sync: bool = Field(
        default=True,
        description="sync every file, log entry and folder a commit depends on before it "
        "is acknowledged (false: acknowledged once in the page cache; a power loss can "
        "then lose acknowledged transactions for good: throwaway use only)",
    )
    sync_method: Literal["files", "filesystem"] = Field(
        default="files",
        description="how a sync step is made: files (fdatasync/fsync of each file and "
        "folder, in parallel) or filesystem (one syncfs(2) of the sink root's filesystem, "
        "which also flushes whatever else was written to it; on ext4, xfs, btrfs and "
        "f2fs only, files elsewhere: FUSE and network filesystems are not told of syncfs)",
    )
    maintenance_every_s: float = Field(
        default=3600.0, gt=0, description="compaction and vacuum of each table, this often"
    )
    vacuum_retention_hours: int = Field(default=24, ge=1)
    changelog_retention_hours: float | None = Field(
        default=None,
        ge=0,
        description="drop changelog rows older than this once the current-state table "
        "holds them folded (default: keep everything)",
    )


class S3Settings(_Section):
    """The object store of an ``s3://bucket/prefix`` sink root (``tidemark.state.objectstore``):
    AWS S3 or a store that speaks its API, and honours conditional writes."""

    endpoint: str = Field(
        default="",
        description="the store's URL (empty: AWS S3 of the region); e.g. "
        "http://127.0.0.1:9000 for a store on this host",
    )
    region: str = Field(default="us-east-1", description="the bucket's region")
    path_style: bool = Field(
        default=False,
        description="address buckets as <endpoint>/<bucket> (most S3-compatible stores) "
        "instead of <bucket>.<endpoint> (AWS)",
    )
    access_key_id: str = Field(
        default="",
        description="the key id (empty: the AWS chain: AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, a credentials file and profile, an instance role)",
    )
    secret_access_key: SecretStr = Field(
        default=SecretStr(""), description="its secret (prefer secret_access_key_file)"
    )
    secret_access_key_file: str = Field(
        default="", description="a file holding the secret access key"
    )
    profile: str = Field(default="", description="the profile of the AWS credentials file to use")
    attempts: int = Field(
        default=5,
        ge=1,
        le=20,
        description="tries of one request (backoff with jitter between them) before the "
        "work it belongs to fails and is retried as a whole",
    )
    connect_timeout_s: float = Field(default=5.0, gt=0)
    read_timeout_s: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _secret_from_file(self) -> S3Settings:
        if not self.secret_access_key.get_secret_value() and self.secret_access_key_file:
            self.secret_access_key = SecretStr(
                read_secret_file("secret_access_key_file", self.secret_access_key_file)
            )
        if self.secret_access_key.get_secret_value() and not self.access_key_id:
            raise ValueError("a secret access key without access_key_id: give both")
        if self.access_key_id and not self.secret_access_key.get_secret_value():
            raise ValueError(
                "access_key_id without its secret: give secret_access_key_file (or "
                "secret_access_key)"
            )
        return self


class IcebergSettings(_Section):
    """The Iceberg catalog of ``[sink] format = "iceberg"`` (``tidemark.sink.iceberg``)."""

    catalog_uri: str = Field(
        default="",
        description="the catalog: empty for a SQLite file under the sink root "
        "(_tidemark/iceberg.db, nothing to run), postgresql://user:pass@host/db (a "
        "PostgreSQL database; tidemark creates its two tables), sqlite:///path, or "
        "http(s)://host/... (an Iceberg REST catalog); required with an s3:// root",
    )
    namespace: str = Field(
        default="tidemark",
        description="where the changelog tables are (<namespace>.<shape>); the current-state "
        "tables are in <namespace>_current",
    )
    format_version: Literal[2] = Field(
        default=2,
        description="the Iceberg table format version of new tables (2: pyiceberg 0.12, "
        "which tidemark commits with, writes no other)",
    )
    max_snapshots: int = Field(
        default=100,
        ge=2,
        description="snapshots each table keeps: time travel reaches this many commits "
        "back; a commit past it expires the oldest (each commit rewrites the table's "
        "metadata with every snapshot in it: ~0.2 ms more per snapshot kept)",
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="more catalog properties, passed to pyiceberg (e.g. a REST catalog's "
        "credential or token)",
    )

    @field_validator("namespace")
    @classmethod
    def _plain_namespace(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", value):
            raise ValueError(
                f"{value!r} is not a namespace tidemark can use: 1-63 letters, digits and "
                "underscores, not starting with a digit"
            )
        return value


class CurrentSettings(_Section):
    """The current-state table of each shape (``<root>/current/<shape>``)."""

    enabled: bool = True
    refresh_s: float = Field(
        default=30.0, gt=0, description="fold new changelog rows into it at least this often"
    )
    refresh_rows: int = Field(
        default=200_000, gt=0, description="or as soon as this many rows wait to be folded"
    )
    buckets: int = Field(
        default=16, ge=1, le=4096, description="files per table (by a hash of the key)"
    )
    small_table_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=0,
        description="a table (with the rows waiting) at most this big is one file, "
        "refreshed together with other such shapes in one Spark job (0: never)",
    )
    fold_on_stop: bool = Field(
        default=True,
        description="a clean stop folds the rows not yet folded, so a plain reader of "
        "the current table gets the state as of the shape's last commit",
    )


class SparkSettings(_Section):
    """Where the writers' Spark runs: a ``master`` (tidemark is the driver: local mode
    or a cluster) or a Spark Connect ``remote`` (tidemark is a client, no JVM here)."""

    master: str = Field(
        default="local[2]",
        description="local[N] or spark://host:7077 (an empty value means local[2])",
    )
    remote: str = Field(
        default="", description="sc://host:15002: a Spark Connect server instead of a master"
    )
    app_name: str = "tidemark"
    conf: dict[str, str] = Field(default_factory=dict)
    warm_up: bool = Field(
        default=True,
        description="in local mode, run the flush write path on made-up rows in a scratch "
        "folder when the JVM is fresh (a few seconds of background Spark work at start), "
        "so a restarted service meets its backlog with compiled code",
    )

    @field_validator("master")
    @classmethod
    def _known_master(cls, value: str) -> str:
        value = value.strip()
        if value and not value.startswith("sc://") and not _SPARK_MASTER.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a Spark master URL: use local[2] (local mode, 2 threads), "
                "local[*], spark://host:7077 (a standalone cluster), yarn or k8s://..."
            )
        return value

    @field_validator("remote")
    @classmethod
    def _connect_url(cls, value: str) -> str:
        value = value.strip()
        if value and (urlsplit(value).scheme != "sc" or not urlsplit(value).hostname):
            raise ValueError(
                f"{value!r} is not a Spark Connect URL: write sc://host:port "
                "(the Connect server's spark.connect.grpc.binding.port, 15002 by default)"
            )
        return value

    @model_validator(mode="after")
    def _master_or_remote(self) -> SparkSettings:
        if self.master.startswith("sc://"):
            raise ValueError(
                f"master {self.master!r} is a Spark Connect URL: set [spark] remote to it "
                "(TIDEMARK_SPARK__REMOTE) and leave master unset"
            )
        if self.remote and self.master and "master" in self.model_fields_set:
            raise ValueError(
                f"both master ({self.master!r}) and remote ({self.remote!r}) are set: tidemark "
                "either drives Spark itself (master) or is a Spark Connect client (remote); "
                "keep one of them"
            )
        if not self.master:
            self.master = "local[2]"
        return self


class FlushSettings(_Section):
    max_rows: int = Field(default=200_000, gt=0)
    max_bytes: int = Field(default=128 * 1024 * 1024, gt=0)
    max_age_s: float = Field(default=1.0, gt=0)
    # the flush age follows recent flush jobs' duration between min_age_s and max_age_s
    # (writers/cadence.py); min_age_s >= max_age_s: fixed at max_age_s
    min_age_s: float = Field(default=0.25, gt=0)
    concurrency: int = Field(default=4, ge=1, le=8)
    memory_budget_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    stage_bytes: int = Field(default=256 * 1024 * 1024, gt=0)

    @model_validator(mode="after")
    def _budget_holds_a_staged_part(self) -> FlushSettings:
        if self.memory_budget_bytes < self.stage_bytes:
            raise ValueError(
                f"memory_budget_bytes ({self.memory_budget_bytes}) is below stage_bytes "
                f"({self.stage_bytes}): one open transaction may buffer up to stage_bytes "
                "before it is staged, so the stream would wait on a budget it cannot fit. "
                "Raise memory_budget_bytes or lower stage_bytes"
            )
        return self


class HttpSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    admin_token: SecretStr = Field(
        default=SecretStr(""), description="bearer token for mutations; empty: none"
    )
    admin_token_file: str = Field(
        default="", description="file holding the admin token (used when admin_token is empty)"
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="serve mutations without a token on a non-loopback address, on purpose",
    )

    @model_validator(mode="after")
    def _token_from_file(self) -> HttpSettings:
        if self.admin_token.get_secret_value() or not self.admin_token_file:
            return self
        self.admin_token = SecretStr(read_secret_file("admin_token_file", self.admin_token_file))
        return self

    @model_validator(mode="after")
    def _no_open_mutations_by_accident(self) -> HttpSettings:
        if (
            self.admin_token.get_secret_value()
            or self.allow_unauthenticated
            or is_loopback(self.host)
        ):
            return self
        raise ValueError(
            f"host = {self.host!r} accepts connections from other machines, but no admin "
            f"token is set, so anyone who reaches port {self.port} could add, remove and "
            "resync shapes. Set [http] admin_token (TIDEMARK_HTTP__ADMIN_TOKEN) or "
            'admin_token_file, or listen on loopback only (host = "127.0.0.1"); to serve '
            "without a token on purpose, set [http] allow_unauthenticated = true "
            "(TIDEMARK_HTTP__ALLOW_UNAUTHENTICATED=true)"
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (a name other than localhost may
    resolve to anything, so it does not count)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class InstanceSettings(_Section):
    name: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9_-]{0,63}$",
        description="several instances on one sink root: each its own name and shapes",
    )


class LeaseSettings(_Section):
    enabled: bool = Field(
        default=True,
        description="one instance per slot streams; others with the same config stand by",
    )
    retry_s: float = Field(default=1.0, gt=0, description="how often a standby tries the lease")
    check_s: float = Field(default=1.0, gt=0, description="how often the leader checks it")
    deadline_s: float = Field(
        default=5.0,
        gt=0,
        le=10.0,
        description=(
            "a leader that cannot confirm its lease for this long stops writing until it"
            " does (below the ~11 s after which the server ends a vanished holder's session)"
        ),
    )


class MonitorSettings(_Section):
    period_s: float = Field(default=5.0, gt=0)
    stall_grace_s: float = Field(default=300.0, gt=0)


class MetricsSettings(_Section):
    per_shape: bool = Field(
        default=True,
        description="export the per-shape series (12 a shape); false: the totals only",
    )


class ShapeSettings(_Section):
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
    iceberg: IcebergSettings = Field(default_factory=IcebergSettings)
    s3: S3Settings = Field(default_factory=S3Settings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    flush: FlushSettings = Field(default_factory=FlushSettings)
    current: CurrentSettings = Field(default_factory=CurrentSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    monitor: MonitorSettings = Field(default_factory=MonitorSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    instance: InstanceSettings = Field(default_factory=InstanceSettings)
    shutdown_grace_s: float = Field(default=30.0, gt=0)
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    shapes: list[ShapeSettings] = Field(default_factory=list)

    @model_validator(mode="after")
    def _object_store_root(self) -> Settings:
        """An ``s3://`` root: a bucket name, and Iceberg's tables with a catalog of their
        own."""
        root = self.sink.root
        scheme = root.partition("://")[0].lower() if "://" in root else ""
        if scheme and scheme != "s3":
            raise ValueError(
                f"[sink] root = {root!r}: tidemark writes to a local folder or to "
                "s3://bucket/prefix (S3 and S3-compatible stores: GCS and R2 through their "
                "S3 API, with [s3] endpoint)"
            )
        if not scheme:
            return self
        bucket = root[len("s3://") :].split("/", 1)[0]
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
            raise ValueError(
                f"[sink] root = {root!r}: {bucket!r} is not a bucket name (3-63 lower-case "
                "letters, digits, dots and hyphens); write s3://bucket/prefix"
            )
        if self.sink.format == "iceberg" and not self.iceberg.catalog_uri:
            raise ValueError(
                f'[sink] root = {root!r} with format = "iceberg": the default catalog is a '
                "SQLite file under the root, which an object store cannot hold: set [iceberg] "
                "catalog_uri to a catalog every instance reaches (postgresql://user@host/db, "
                "or an Iceberg REST catalog's http(s):// URL)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = config_path()
        if path is not None:
            sources.append(_TomlFile(settings_cls, toml_file=path))
        return tuple(sources)


def config_path() -> Path | None:
    """The settings file that is read: ``$TIDEMARK_CONFIG`` or ./tidemark.toml, if it
    exists (``load_settings(path)`` sets the variable while it loads)."""
    path = Path(os.environ.get("TIDEMARK_CONFIG", "tidemark.toml"))
    if path.exists() and not path.is_file():
        raise ConfigError(
            f"cannot read config file {path}: it is a folder, not a file; give the path of "
            "a tidemark.toml with --config or TIDEMARK_CONFIG"
        )
    return path if path.exists() else None


def read_toml(path: Path) -> dict[str, Any]:
    """The file's TOML, or ConfigError saying why it cannot be read."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {path}: {exc.strerror or exc}; give the path of a "
            "tidemark.toml with --config or TIDEMARK_CONFIG"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not a UTF-8 text file (byte 0x{raw[exc.start]:02x} at "
            f"offset {exc.start}): settings are TOML text; is --config or TIDEMARK_CONFIG "
            "pointing at the right file?"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not valid TOML: {exc}. The format is in the docs "
            "(docs/reference/configuration.md); a section header is [name], a value is key = value"
        ) from None


class _TomlFile(TomlConfigSettingsSource):
    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return read_toml(Path(file_path))


def load_settings(
    path: str | None = None, *, require_dsn: bool = True, **overrides: Any
) -> Settings:
    """Settings from the file (``path``, ``$TIDEMARK_CONFIG`` or ./tidemark.toml) and env.

    ``require_dsn=False`` serves commands that talk to a running service or read the
    lake, which need no source database. Raises ConfigError (see the module docstring).
    """
    previous = os.environ.get("TIDEMARK_CONFIG")
    if path is not None:
        if not Path(path).exists():
            raise ConfigError(f"config file {path} does not exist")
        os.environ["TIDEMARK_CONFIG"] = path
    try:
        check_environment(Settings, os.environ)
        file = config_path()
        try:
            settings = Settings(**overrides)
        except ValidationError as exc:
            raise ConfigError(explain_validation(Settings, exc, file, os.environ)) from None
        except SettingsError as exc:
            raise ConfigError(explain_json_error(exc, os.environ)) from None
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


SECRET_WORDS = ("password", "secret", "token", "credential")


def explain(
    settings: Settings, path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """The effective settings as TOML a file could hold (``tomllib`` reads it back),
    each value with where it came from: the file, the environment (naming the
    variable), or the default. Secrets are redacted: passwords in the DSN and the
    catalog URI, the admin token, and ``[iceberg] properties`` or ``[spark] conf``
    entries whose key names a password, secret, token or credential.

    ``path``: the settings file that was read (default: ``config_path()``);
    ``environ``: the environment it was read with (default: ``os.environ``)."""
    path = Path(path) if path is not None else config_path()
    file_data: Mapping[str, Any] = read_toml(path) if path is not None else {}
    file_name = str(path) if path is not None else ""
    env = {k.upper(): v for k, v in (os.environ if environ is None else environ).items()}
    data = settings.model_dump()
    data["source"]["dsn"] = redact_dsn(settings.source.dsn)
    data["iceberg"]["catalog_uri"] = redact_dsn(settings.iceberg.catalog_uri)
    data["http"]["admin_token"] = "***" if settings.http.admin_token.get_secret_value() else ""
    for section, key in (("iceberg", "properties"), ("spark", "conf")):
        data[section][key] = {
            k: "***" if any(w in k.lower() for w in SECRET_WORDS) else v
            for k, v in data[section][key].items()
        }

    def origin(section: str | None, key: str) -> str:
        name = f"TIDEMARK_{section}__{key}" if section else f"TIDEMARK_{key}"
        if name.upper() in env:
            return f"environment: {name.upper()}"
        if section and f"TIDEMARK_{section}".upper() in env:
            return f"environment: TIDEMARK_{section.upper()}"
        held = file_data.get(section, {}) if section else file_data
        if isinstance(held, Mapping) and key in held:
            return f"file: {file_name or 'the settings file'}"
        return "default"

    where = file_name or "no settings file"
    out = [f"# tidemark's effective settings ({where}); secrets as ***", ""]
    shapes = data.pop("shapes")
    sections = {k: v for k, v in data.items() if isinstance(v, dict)}
    for key, value in data.items():
        if key not in sections:
            out.append(_toml_line(key, value, origin(None, key)))
    for section, values in sections.items():
        out += ["", f"[{section}]"]
        out += [_toml_line(k, v, origin(section, k)) for k, v in values.items()]
    shapes_from = origin(None, "shapes")
    for shape in shapes:
        out += ["", f"[[shapes]]  # {shapes_from}"]
        out += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in shape.items() if v is not None]
    return "\n".join(out) + "\n"


def _toml_line(key: str, value: Any, origin: str) -> str:
    if value is None:
        return f"# {_toml_key(key)} is not set  # {origin}"
    return f"{_toml_key(key)} = {_toml_value(value)}  # {origin}"


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's string escapes are TOML's
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    return json.dumps(str(value))
