"""The deploy files agree with each other and with the service.

docker-compose.yml, deploy/Dockerfile with its entrypoint and health check, the systemd
unit and its environment file, Prometheus's configuration and alert rules, Grafana's
provisioning and dashboard are parsed and checked against the CLI's parser, the
settings model and the metrics registry. No Docker engine, Postgres or Spark is needed;
the shell scripts run with a stand-in ``tidemark``. ``promtool check rules`` runs when it
is installed (else the structural checks alone); ``systemd-analyze`` and the unit's
settings file: tests/unit/project/test_systemd_unit.py. tests/integration/test_deploy.py runs the
same environment for real.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from fnmatch import fnmatch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from tests.systemd_env import systemd_env_file
from tests.systemd_env import unit_entries as systemd_unit_entries

from tidemark import cli, exit_reason
from tidemark.errors import ConfigError
from tidemark.observability import Metrics
from tidemark.settings.config import Settings, load_settings
from tidemark.shapes.model import ShapeDefinition
from tidemark.spark import JARS_ENV

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
PROMQL_BUILTINS = {"up"}  # series Prometheus makes itself, not tidemark's


# -- reading the files -------------------------------------------------------------------

_VARIABLE = re.compile(r"\$(?:(\$)|\{(\w+)(?:(:?-)([^}]*))?\}|(\w+))")


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable substitution (``${X}``, ``${X:-d}``, ``${X-d}``, ``$$``)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name, operator, default = m.group(2) or m.group(5), m.group(3), m.group(4)
        current = env.get(name)
        if (operator == ":-" and not current) or (operator == "-" and current is None):
            return default
        return current or ""

    return _VARIABLE.sub(substitute, value)


def compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return interpolate(raw, env or {})


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source (a volume name or a ./path), read-only flag dropped."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        out[target] = source
    return out


def settings_key_exists(key: str) -> bool:
    """Whether ``TIDEMARK_A__B`` names a field of ``Settings`` (tidemark refuses unknown
    keys itself; this says which key is wrong without starting it)."""
    model: type[BaseModel] = Settings
    parts = key.removeprefix("TIDEMARK_").lower().split("__")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            continue
        return i == len(parts) - 1
    return True


def settings_from(env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch, cwd: Path) -> Settings:
    """``env`` loaded the way ``tidemark run`` loads it. An admin token file named in it
    is moved under ``cwd`` and made by the image's entrypoint, as in the container."""
    env = dict(env)
    if env.get("TIDEMARK_HTTP__ADMIN_TOKEN_FILE"):
        env["TIDEMARK_HTTP__ADMIN_TOKEN_FILE"] = str(cwd / "admin-token")
        made = run_entrypoint(cwd, "config", "check", **env)
        assert made.returncode == 0, made.stderr
    for key in list(os.environ):
        if key.startswith("TIDEMARK_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(cwd)  # no stray ./tidemark.toml
    return load_settings()


def metric_references(text: str) -> set[str]:
    return set(re.findall(r"\btidemark_[a-z0-9_]+\b", text))


def exported_names(metrics: Metrics) -> set[str]:
    """Sample names the registry can expose (counters as _total, histograms as parts)."""
    names: set[str] = set()
    for family in metrics.registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + part for part in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def balanced(expr: str) -> bool:
    closing = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    quote = None
    for ch in expr:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in closing and (not stack or stack.pop() != closing[ch]):
            return False
    return not stack and quote is None


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and ARG defaults applied."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    args: dict[str, str] = {}
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        rest = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest.strip())
        if instruction == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name] = default
        out.append((instruction, rest))
    return out


def instruction(name: str) -> list[str]:
    return [rest for instr, rest in dockerfile() if instr == name]


def unit_entries() -> list[tuple[str, str, str]]:
    return systemd_unit_entries(DEPLOY / "systemd" / "tidemark.service")


def unit_value(key: str) -> str:
    values = [v for _, k, v in unit_entries() if k == key]
    assert values, f"the unit has no {key}="
    return values[-1]


def init_sql() -> str:
    return "\n".join(p.read_text() for p in sorted((DEPLOY / "postgres" / "init").glob("*.sql")))


# -- docker-compose.yml -----------------------------------------------------------------------

STACK = {"postgres", "workload", "tidemark", "postgres-exporter", "prometheus"}
SPARK_PROFILE = {"spark-master", "spark-worker", "spark-connect"}


def test_compose_declares_the_stack_and_a_spark_profile() -> None:
    services = compose()["services"]
    assert set(services) == STACK | SPARK_PROFILE | {"tidemark-standby", "grafana"}
    for name in SPARK_PROFILE:
        assert services[name]["profiles"] == ["spark"]
    # no image for it where the compose tests run (tests/compose): a profile of its own
    assert services["grafana"]["profiles"] == ["grafana"]
    for name in STACK:
        assert "profiles" not in services[name], f"{name} must start with a plain `up`"


def test_the_ha_profile_runs_a_standby_with_the_leaders_configuration() -> None:
    services = compose()["services"]
    leader, standby = services["tidemark"], services["tidemark-standby"]
    assert standby["profiles"] == ["ha"] and standby["image"] == leader["image"]
    assert standby["volumes"] == leader["volumes"]  # one sink
    different = {"TIDEMARK_SPARK__CONF"}  # its own driver host for executors
    same = set(leader["environment"]) - different
    assert {k: standby["environment"][k] for k in same} == {
        k: leader["environment"][k] for k in same
    }
    assert "tidemark-standby" in standby["environment"]["TIDEMARK_SPARK__CONF"]
    assert standby["ports"] != leader["ports"]


def test_every_service_has_a_healthcheck_or_says_why_not() -> None:
    for name, service in compose()["services"].items():
        check = service.get("healthcheck")
        if check is None:
            reason = service.get("x-healthcheck-reason", "")
            assert len(reason) > 20, f"{name}: no healthcheck and no x-healthcheck-reason"
        else:
            assert check["test"][0] in ("CMD", "CMD-SHELL") and len(check["test"]) > 1, name


def test_every_image_is_pinned_to_a_version() -> None:
    for name, service in compose()["services"].items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert re.match(r"v?\d+\.\d+", tag), f"{name}: {image} is not pinned to a version"


def venv_pyspark() -> PurePosixPath:
    """pyspark's folder in the image's virtualenv, from the Dockerfile's Python."""
    (base,) = {b.split()[0] for b in instruction("FROM") if ":" in b}
    version = re.match(r"python:(\d+\.\d+)", base)
    assert version is not None, base
    assert any("python -m venv /opt/tidemark" in run for run in instruction("RUN"))
    return PurePosixPath(f"/opt/tidemark/lib/python{version.group(1)}/site-packages/pyspark")


def test_the_spark_profile_runs_pysparks_spark_from_tidemarks_image() -> None:
    import pyspark

    from tidemark.demo.spark import ConnectServer

    services = compose()["services"]
    tidemark = services["tidemark"]
    home = venv_pyspark()
    launched = {}
    for name in SPARK_PROFILE:
        service = services[name]
        # the same image: the cluster runs exactly tidemark's Spark and Python
        assert (service["image"], service["build"]) == (tidemark["image"], tidemark["build"])
        program, main, *_ = service["entrypoint"]
        assert PurePosixPath(program).parent == home / "bin", name
        assert (Path(pyspark.__file__).parent / "bin" / PurePosixPath(program).name).exists()
        assert environment(service)["SPARK_HOME"] == str(home)
        launched[name] = main if main != "--class" else service["entrypoint"][2]
    # the classes tidemark.demo.spark starts for the tests
    assert launched == {
        "spark-master": "org.apache.spark.deploy.master.Master",
        "spark-worker": "org.apache.spark.deploy.worker.Worker",
        "spark-connect": ConnectServer.CLASS,
    }
    # Python workers, wherever they run, are tidemark's interpreter
    python = environment(tidemark)["PYSPARK_PYTHON"]
    assert python == "/opt/tidemark/bin/python"
    for name in ("spark-worker", "spark-connect"):
        assert environment(services[name])["PYSPARK_PYTHON"] == python


def test_the_image_carries_the_spark_connect_client() -> None:
    # [spark] remote needs the `connect` extra: its dependencies in the image's first
    # layer (read from pyproject.toml), then the package itself with it
    runs = instruction("RUN")
    assert any('p["optional-dependencies"]["connect"]' in run for run in runs)
    assert any("install --no-cache-dir --no-deps '.[connect]'" in run for run in runs)


def test_volumes_are_declared_used_and_bind_mounts_exist() -> None:
    spec = compose()
    declared = set(spec["volumes"])
    used = set()
    for name, service in spec["services"].items():
        for target, source in mounts(service).items():
            assert target.startswith("/"), (name, target)
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name} mounts {source}, which is missing"
            else:
                assert source in declared, f"{name} uses volume {source}, not declared"
                used.add(source)
    assert used == declared


def test_postgres_is_set_up_for_logical_replication() -> None:
    postgres = compose()["services"]["postgres"]
    command = postgres["command"]
    settings = dict(c.split("=", 1) for c in command if "=" in c)
    assert settings["wal_level"] == "logical"
    assert int(settings["max_replication_slots"]) >= 1
    assert int(settings["max_wal_senders"]) >= 2
    assert "pg_isready" in postgres["healthcheck"]["test"]
    assert mounts(postgres)["/var/lib/postgresql/data"] == "pgdata"
    assert mounts(postgres)["/docker-entrypoint-initdb.d"] == "./deploy/postgres/init"


def test_tidemark_environment_is_valid_settings_for_the_container(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = compose()
    tidemark = spec["services"]["tidemark"]
    env = environment(tidemark)
    unknown = [k for k in env if k.startswith("TIDEMARK_") and not settings_key_exists(k)]
    assert not unknown, f"not settings of tidemark: {unknown}"
    assert set(env) - {k for k in env if k.startswith("TIDEMARK_")} == {"PYSPARK_PYTHON"}
    # when the container's environment is loaded the way `tidemark run` loads it
    settings = settings_from(env, monkeypatch, tmp_path)
    # then the sink is the named volume, the API listens where it is published and probed
    assert mounts(tidemark)[settings.sink.root] == "sink"
    assert settings.http.host == "0.0.0.0"
    assert f"127.0.0.1:{settings.http.port}:{settings.http.port}" in tidemark["ports"]
    assert tidemark["healthcheck"]["test"] == ["CMD", "tidemark-healthcheck"]
    assert (settings.spark.master, settings.spark.remote) == ("local[2]", "")
    # and the shutdown grace fits in the time compose gives before SIGKILL
    assert float(tidemark["stop_grace_period"].rstrip("s")) > settings.shutdown_grace_s + 5
    assert tidemark["init"] is True


def test_the_compose_api_is_never_open_without_a_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # given `docker compose up` with no TIDEMARK_ADMIN_TOKEN: the container makes one
    env = environment(compose()["services"]["tidemark"])
    assert env["TIDEMARK_HTTP__ADMIN_TOKEN"] == ""
    generated = settings_from(env, monkeypatch, tmp_path)
    assert generated.http.host == "0.0.0.0" and not generated.http.allow_unauthenticated
    assert re.fullmatch(r"[0-9a-f]{32}", generated.http.admin_token.get_secret_value())
    # with TIDEMARK_ADMIN_TOKEN set, that one is used
    chosen = environment(compose({"TIDEMARK_ADMIN_TOKEN": "chosen-token"})["services"]["tidemark"])
    (tmp_path / "chosen").mkdir()
    chosen_settings = settings_from(chosen, monkeypatch, tmp_path / "chosen")
    assert chosen_settings.http.admin_token.get_secret_value() == "chosen-token"
    # and without either, tidemark refuses to listen on 0.0.0.0 at all
    bare = {k: v for k, v in env.items() if k != "TIDEMARK_HTTP__ADMIN_TOKEN_FILE"}
    with pytest.raises(ConfigError, match="allow_unauthenticated"):
        settings_from(bare, monkeypatch, tmp_path)


def test_the_image_makes_its_token_where_its_user_may_write() -> None:
    env = dict(re.findall(r"\b(TIDEMARK_\w+)=(\S+)", " ".join(instruction("ENV"))))
    token_file = PurePosixPath(env["TIDEMARK_HTTP__ADMIN_TOKEN_FILE"])
    user = instruction("USER")[-1]
    home = re.search(rf"--home-dir (\S+) .* {user}\b", " ".join(instruction("RUN")))
    assert home is not None and token_file.parent == PurePosixPath(home.group(1))
    assert env["TIDEMARK_HTTP__HOST"] == "0.0.0.0"
    compose_env = environment(compose()["services"]["tidemark"])
    assert compose_env["TIDEMARK_HTTP__ADMIN_TOKEN_FILE"] == str(token_file)


def test_tidemark_connects_to_the_compose_postgres_as_the_role_init_creates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # given the variables a user might set, so defaults cannot hide a mismatch
    spec = compose({"TIDEMARK_DB_USER": "lake", "TIDEMARK_DB_PASSWORD": "s3cret"})
    postgres = environment(spec["services"]["postgres"])
    settings = settings_from(environment(spec["services"]["tidemark"]), monkeypatch, tmp_path)
    dsn = urlsplit(settings.source.dsn)
    assert (dsn.hostname, dsn.port) == ("postgres", 5432)
    assert dsn.path == "/" + postgres["POSTGRES_DB"]
    assert (dsn.username, dsn.password) == ("lake", "s3cret")
    assert (postgres["TIDEMARK_DB_USER"], postgres["TIDEMARK_DB_PASSWORD"]) == ("lake", "s3cret")
    assert "\\getenv tidemark_user TIDEMARK_DB_USER" in init_sql()


def test_declared_shapes_are_valid_and_on_tables_the_init_sql_publishes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = settings_from(environment(compose()["services"]["tidemark"]), monkeypatch, tmp_path)
    assert settings.shapes, "the compose stack should show data flowing into shapes"
    sql = init_sql()
    tables = set(re.findall(r"create table (\w+\.\w+)", sql))
    published = re.search(
        rf"create publication {settings.source.publication} for table ([^;]+);", sql
    )
    assert published is not None
    published_tables = {t.strip() for t in published.group(1).split(",")}
    # tidemark's role does not own the tables, so it must not try to create the publication
    assert settings.source.create_publication is False
    for shape in settings.shapes:
        definition = ShapeDefinition(**shape.model_dump())
        assert definition.table in tables & published_tables, definition.table


def test_the_built_image_is_tagged_with_the_package_version() -> None:
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    tidemark = compose()["services"]["tidemark"]
    assert tidemark["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
    assert tidemark["image"] == f"tidemark:{version}"


def test_the_container_runs_tidemark_run() -> None:
    # the image's entrypoint passes its arguments to `tidemark`; compose adds none
    assert json.loads(instruction("ENTRYPOINT")[0]) == ["tidemark-entrypoint"]
    command = json.loads(instruction("CMD")[0])
    assert "command" not in compose()["services"]["tidemark"]
    args = cli.parser().parse_args(command)
    assert args.func is cli.cmd_run


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def confs(command: list[str]) -> dict[str, str]:
    pairs = [command[i + 1] for i, arg in enumerate(command) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_the_spark_profile_is_reachable_from_tidemark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # given the master URL the README tells to set with the profile
    spec = compose({"TIDEMARK_SPARK_MASTER": "spark://spark-master:7077"})
    services = spec["services"]
    settings = settings_from(environment(services["tidemark"]), monkeypatch, tmp_path)
    assert settings.spark.remote == ""
    master = urlsplit(settings.spark.master)
    # then it names the master service on the port it listens on
    command = services[master.hostname]["entrypoint"]
    assert option(command, "--host") == master.hostname
    assert option(command, "--port") == str(master.port)
    worker = services["spark-worker"]["entrypoint"]
    assert settings.spark.master in worker
    assert option(worker, "--host") == "spark-worker"
    # executors reach the driver by service name and write the sink at the same path
    assert settings.spark.conf["spark.driver.host"] == "tidemark"
    assert mounts(services["spark-worker"])[settings.sink.root] == "sink"
    # and an executor of tidemark's fits the worker beside the Connect server's
    connect = confs(services["spark-connect"]["entrypoint"])
    executor = int(settings.spark.conf["spark.executor.memory"].rstrip("m"))
    assert executor + int(connect["spark.executor.memory"].rstrip("m")) <= 1024 * int(
        option(worker, "--memory").rstrip("g")
    )
    assert int(connect["spark.cores.max"]) < int(option(worker, "--cores"))


def test_the_spark_profiles_connect_server_is_reachable_from_tidemark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # given the Connect URL the README tells to set with the profile
    spec = compose({"TIDEMARK_SPARK_REMOTE": "sc://spark-connect:15002"})
    services = spec["services"]
    settings = settings_from(environment(services["tidemark"]), monkeypatch, tmp_path)
    remote = urlsplit(settings.spark.remote)
    # then it names the Connect server on the port it listens on
    server = services[remote.hostname]
    command = server["entrypoint"]
    assert confs(command)["spark.connect.grpc.binding.port"] == str(remote.port)
    # whose application runs on the profile's cluster, its executors reaching it by name
    master = urlsplit(option(command, "--master"))
    assert option(services[master.hostname]["entrypoint"], "--port") == str(master.port)
    assert confs(command)["spark.driver.host"] == remote.hostname
    # and which sees the sink at tidemark's path (its driver lists the files it reads)
    assert mounts(server)[settings.sink.root] == "sink"


def test_the_profile_refuses_a_master_and_a_remote_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = compose(
        {
            "TIDEMARK_SPARK_MASTER": "spark://spark-master:7077",
            "TIDEMARK_SPARK_REMOTE": "sc://spark-connect:15002",
        }
    )
    with pytest.raises(ConfigError, match="keep one of them"):
        settings_from(environment(spec["services"]["tidemark"]), monkeypatch, tmp_path)


def test_the_workload_calls_the_procedure_the_init_sql_defines() -> None:
    services = compose()["services"]
    workload = services["workload"]
    env = environment(workload)
    postgres = environment(services["postgres"])
    assert (env["PGHOST"], env["PGDATABASE"]) == ("postgres", postgres["POSTGRES_DB"])
    assert (env["PGUSER"], env["PGPASSWORD"]) == (
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
    )
    script = workload["entrypoint"][-1]
    assert mounts(workload)[str(PurePosixPath(script).parent)] == "./deploy/workload"
    assert "call shop.tick(" in (DEPLOY / "workload" / PurePosixPath(script).name).read_text()
    assert "create procedure shop.tick(" in init_sql()


# -- the image ----------------------------------------------------------------------------------


def test_dockerfile_builds_a_slim_python_with_java_17_as_a_non_root_user() -> None:
    bases = instruction("FROM")
    assert bases and all(re.match(r"python:3\.11-slim-bookworm\b", b) for b in bases)
    # the base can be swapped (the compose tests build on a local Debian with Python 3.11)
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in (DEPLOY / "Dockerfile").read_text()
    assert any("openjdk-17-jre-headless" in run for run in instruction("RUN"))
    user = instruction("USER")[-1]
    assert user not in ("root", "0")
    assert any("--uid 185 " in run and f" {user}" in run for run in instruction("RUN"))
    assert instruction("EXPOSE") == ["8765"]
    assert instruction("HEALTHCHECK")[0].endswith('CMD ["tidemark-healthcheck"]')
    env = " ".join(instruction("ENV"))
    for key in re.findall(r"\b(TIDEMARK_\w+)=", env):
        # a setting, or a variable the CLI reads (the exit reason file, the jar folder)
        assert settings_key_exists(key) or key in (exit_reason.ENV, JARS_ENV), key


def dockerignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    lines = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in lines if p.strip() and not p.startswith("#")]
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").rstrip("/").replace("**/", "")
        if any(fnmatch(c, body) or fnmatch(PurePosixPath(c).name, body) for c in candidates):
            excluded = not negate
    return excluded


def test_the_build_context_holds_what_the_dockerfile_copies_and_little_else() -> None:
    for copy in instruction("COPY"):
        if "--from=" in copy:
            continue
        for source in [a for a in copy.split() if not a.startswith("--")][:-1]:
            assert (REPO / source).exists(), source
            assert not dockerignored(source.rstrip("/") + "/x" if source.endswith("/") else source)
    assert dockerignored(".venv/bin/python")
    assert dockerignored("service/tidemark/__pycache__/app.cpython-311.pyc")


def run_entrypoint(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The entrypoint with a stand-in `tidemark` that prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "tidemark"
    fake.write_text('#!/bin/sh\necho "tidemark $*"\n')
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    return subprocess.run(
        ["sh", str(DEPLOY / "entrypoint.sh"), *args],
        env={**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_entrypoint_runs_tidemark_run_by_default_and_passes_other_commands(
    tmp_path: Path,
) -> None:
    sink = str(tmp_path / "data")
    default = run_entrypoint(tmp_path, TIDEMARK_SINK__ROOT=sink)
    assert (default.returncode, default.stdout) == (0, "tidemark run\n")
    assert Path(sink).is_dir()  # created, so Spark need not
    other = run_entrypoint(tmp_path, "config", "check", TIDEMARK_SINK__ROOT="/dev/null/x")
    assert (other.returncode, other.stdout) == (0, "tidemark config check\n")


def test_entrypoint_generates_an_admin_token_once_when_none_is_given(tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    sink = str(tmp_path / "data")
    first = run_entrypoint(
        tmp_path, TIDEMARK_SINK__ROOT=sink, TIDEMARK_HTTP__ADMIN_TOKEN_FILE=str(token_file)
    )
    assert (first.returncode, first.stdout) == (0, "tidemark run\n")
    token = token_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{32}", token)
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert f"generated an admin token into {token_file}" in first.stderr
    # a restart keeps it; a token given explicitly makes none
    again = run_entrypoint(
        tmp_path, TIDEMARK_SINK__ROOT=sink, TIDEMARK_HTTP__ADMIN_TOKEN_FILE=str(token_file)
    )
    assert again.returncode == 0 and token_file.read_text() == token and again.stderr == ""
    other = tmp_path / "other-token"
    given = run_entrypoint(
        tmp_path,
        TIDEMARK_SINK__ROOT=sink,
        TIDEMARK_HTTP__ADMIN_TOKEN="mine",
        TIDEMARK_HTTP__ADMIN_TOKEN_FILE=str(other),
    )
    assert given.returncode == 0 and not other.exists()
    unwritable = run_entrypoint(
        tmp_path, TIDEMARK_SINK__ROOT=sink, TIDEMARK_HTTP__ADMIN_TOKEN_FILE="/dev/null/token"
    )
    assert unwritable.returncode == 1 and unwritable.stdout == ""
    assert "cannot write the admin token file /dev/null/token" in unwritable.stderr


def test_entrypoint_refuses_to_run_with_a_sink_it_cannot_write(tmp_path: Path) -> None:
    result = run_entrypoint(tmp_path, "run", TIDEMARK_SINK__ROOT="/dev/null/lake")
    assert result.returncode == 1
    assert result.stdout == ""  # tidemark was not started
    assert "/dev/null/lake is not writable" in result.stderr


def test_shell_scripts_parse() -> None:
    for script in (DEPLOY / "entrypoint.sh", DEPLOY / "workload" / "workload.sh"):
        assert os.access(script, os.X_OK), f"{script} is not executable"
        subprocess.run(["sh", "-n", str(script)], check=True, timeout=10)


class _Service(BaseHTTPRequestHandler):
    """/healthz and /readyz as tidemark answers them."""

    ready = True
    role = "leader"

    def do_GET(self) -> None:
        if self.path == "/healthz":
            status, body = 200, {"status": "ok", "phase": "streaming", "role": self.role}
        elif self.path == "/readyz":
            reasons = [] if self.ready else ["shape 'orders_eu' failed: boom"]
            if self.role == "standby":
                reasons = ["standby: another instance holds the leader lease"]
            ready = self.ready and self.role == "leader"
            status, body = (200 if ready else 503), {"ready": ready, "reasons": reasons}
        else:
            status, body = 404, {}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def service_server() -> Iterator[tuple[ThreadingHTTPServer, type[_Service]]]:
    handler = type("Handler", (_Service,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, handler
    server.shutdown()
    server.server_close()


def healthcheck(port: int, reason_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIDEMARK_HTTP__HOST": "0.0.0.0", "TIDEMARK_HTTP__PORT": str(port)}
    env.pop("TIDEMARK_EXIT_REASON_FILE", None)
    if reason_file is not None:
        env["TIDEMARK_EXIT_REASON_FILE"] = str(reason_file)
    return subprocess.run(
        [sys.executable, str(DEPLOY / "healthcheck.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_healthcheck_is_liveness_and_says_what_readiness_says(
    service_server: tuple[ThreadingHTTPServer, type[_Service]],
) -> None:
    server, handler = service_server
    port = server.server_address[1]
    ready = healthcheck(port)
    assert ready.returncode == 0 and "ready" in ready.stdout
    # a failed shape: not ready, but alive: the container must not be replaced for it
    handler.ready = False
    failed = healthcheck(port)
    assert failed.returncode == 0 and "not ready" in failed.stdout and "boom" in failed.stdout
    handler.role = "standby"  # waiting for the leader lease: alive, not ready
    standby = healthcheck(port)
    assert standby.returncode == 0 and "standby" in standby.stdout


def test_healthcheck_says_why_tidemark_stopped(
    service_server: tuple[ThreadingHTTPServer, type[_Service]], tmp_path: Path
) -> None:
    server, _ = service_server
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    gone = healthcheck(port, tmp_path / "exit-reason")
    assert gone.returncode == 1 and "does not answer" in gone.stdout
    (tmp_path / "exit-reason").write_text(
        "2026-11-27T09:00:00Z cannot log in to the source: password authentication failed\n"
    )
    stopped = healthcheck(port, tmp_path / "exit-reason")
    assert stopped.returncode == 1
    assert "stopped with: 2026-11-27T09:00:00Z cannot log in" in stopped.stdout


def _base_url() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("healthcheck", DEPLOY / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.base_url


@given(
    host=st.one_of(
        st.sampled_from(["", "0.0.0.0", "::", "127.0.0.1", "::1", "10.1.2.3", "tidemark"])
    ),
    port=st.integers(min_value=1, max_value=65535),
)
def test_healthcheck_asks_the_address_the_service_listens_on(host: str, port: int) -> None:
    url = urlsplit(_base_url()({"TIDEMARK_HTTP__HOST": host, "TIDEMARK_HTTP__PORT": str(port)}))
    assert url.port == port
    assert url.hostname == ("127.0.0.1" if host in ("", "0.0.0.0", "::") else host)


# -- Prometheus ----------------------------------------------------------------------------------


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "grafana" / "tidemark.json").read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def test_prometheus_scrapes_tidemark_and_loads_the_mounted_rules(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    services = compose()["services"]
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    prometheus = mounts(services["prometheus"])
    assert prometheus["/etc/prometheus/prometheus.yml"] == "./deploy/prometheus/prometheus.yml"
    for rule_file in config["rule_files"]:
        assert prometheus[rule_file] == "./deploy/prometheus/alerts.yml"
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "tidemark")
    settings = settings_from(environment(services["tidemark"]), monkeypatch, tmp_path)
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"tidemark:{settings.http.port}"]
    # the alerts select tidemark's series by this job name
    assert any('job="tidemark"' in rule["expr"] for rule in alert_rules())


def test_postgres_exporter_reports_the_slot_with_the_mounted_queries() -> None:
    services = compose()["services"]
    exporter = services["postgres-exporter"]
    queries_file = "./deploy/prometheus/postgres-exporter-queries.yml"
    (path,) = [k for k, v in mounts(exporter).items() if v == queries_file]
    assert f"--extend.query-path={path}" in exporter["command"]
    queries = yaml.safe_load((REPO / queries_file).read_text())
    columns = {c for m in queries["pg_slot"]["metrics"] for c in m}
    assert {"slot_name", "lag_bytes", "retained_bytes", "active"} <= columns
    # it logs in as the role the init SQL creates (pg_monitor), on the shop database
    tidemark_dsn = urlsplit(environment(services["tidemark"])["TIDEMARK_SOURCE__DSN"])
    dsn = urlsplit(environment(exporter)["DATA_SOURCE_NAME"])
    assert (dsn.username, dsn.password, dsn.hostname, dsn.path) == (
        tidemark_dsn.username,
        tidemark_dsn.password,
        tidemark_dsn.hostname,
        tidemark_dsn.path,
    )
    # Prometheus scrapes it, and the source-side slot alert selects tidemark's slot
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "postgres")
    assert job["static_configs"][0]["targets"] == ["postgres-exporter:9187"]
    slot = environment(services["tidemark"])["TIDEMARK_SOURCE__SLOT"]
    assert any(f'pg_slot_lag_bytes{{slot_name="{slot}"}}' in r["expr"] for r in alert_rules())


def test_alert_rules_are_well_formed() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert balanced(rule["expr"]), rule["alert"]
        for text in rule["annotations"].values():  # Go templates: {{ ... }} pairs
            assert text.count("{{") == text.count("}}"), rule["alert"]


def test_alerts_cover_lag_wal_stalls_violations_downtime_and_reconnects() -> None:
    by_metric = {m: r["alert"] for r in alert_rules() for m in metric_references(r["expr"])}
    for metric in (
        "tidemark_replication_lag_bytes",
        "tidemark_slot_retained_wal_bytes",
        "tidemark_slot_safe_wal_size_bytes",
        "tidemark_shape_stalled",
        "tidemark_invariant_violations_total",
        "tidemark_reconnects_total",
    ):
        assert metric in by_metric, f"no alert on {metric}"
    assert any(r["expr"].startswith('up{job="tidemark"} == 0') for r in alert_rules())


def test_every_metric_in_the_alerts_and_the_dashboard_is_exported() -> None:
    referenced = set()
    for text in [r["expr"] for r in alert_rules()] + dashboard_exprs():
        referenced |= metric_references(text)
    assert referenced - exported_names(Metrics()) == set()
    assert len(referenced) > 20  # the extraction found the expressions' metrics


# -- Grafana ---------------------------------------------------------------------------------------


def test_grafana_provisions_the_prometheus_and_the_dashboard_compose_mounts() -> None:
    services = compose()["services"]
    grafana = mounts(services["grafana"])
    provisioning = DEPLOY / "grafana" / "provisioning"
    assert grafana["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = sources["datasources"]
    url = urlsplit(source["url"])
    assert url.hostname in services and url.port == 9090
    providers = yaml.safe_load((provisioning / "dashboards" / "tidemark.yml").read_text())
    folder = providers["providers"][0]["options"]["path"]
    assert grafana[f"{folder}/tidemark.json"] == "./deploy/grafana/tidemark.json"
    # panels use the dashboard's data source variable (so the JSON imports into any
    # Grafana), whose default is the provisioned Prometheus
    variable, *others = dashboard()["templating"]["list"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    assert [v["name"] for v in others] == ["instance", "shape", "slot"]
    assert variable["current"]["value"] == source["uid"]
    for panel in dashboard()["panels"]:
        for item in [panel, *panel.get("targets", [])]:
            if "datasource" in item:
                assert item["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_dashboard_panels_are_well_formed_and_do_not_overlap() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        x0, y0 = g["x"], g["y"]
        assert x0 >= 0 and x0 + g["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(x0, x0 + g["w"]) for y in range(y0, y0 + g["h"])}
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        targets = panel["targets"]
        assert targets and len({t["refId"] for t in targets}) == len(targets), panel["title"]
        assert all(balanced(t["expr"]) for t in targets), panel["title"]


def test_dashboard_shows_ack_lag_throughput_frontiers_wal_commits_and_reconnects() -> None:
    exprs = "\n".join(dashboard_exprs())
    for needle in (
        "tidemark_ack_lag_seconds_bucket",
        "sum by (shape) (rate(tidemark_changes_total",
        "tidemark_shape_lag_seconds",
        "tidemark_slot_retained_wal_bytes",
        "tidemark_commit_duration_seconds_bucket",
        "tidemark_reconnects_total",
    ):
        assert needle in exprs, needle


# -- systemd ---------------------------------------------------------------------------------------


def env_example() -> dict[str, str]:
    return systemd_env_file((DEPLOY / "systemd" / "tidemark.env.example").read_text())


def test_unit_is_a_hardened_notify_service_with_a_watchdog() -> None:
    assert unit_value("Type") == "notify"
    assert int(unit_value("WatchdogSec")) >= 10
    assert unit_value("Restart") == "on-failure"
    assert unit_value("EnvironmentFile") == "/etc/tidemark/tidemark.env"
    assert unit_value("NoNewPrivileges") == "yes"
    assert unit_value("ProtectSystem") == "strict"
    assert unit_value("PrivateTmp") == "yes"
    assert unit_value("KillMode") == "mixed"  # the Spark JVM must outlive the final flush
    # reload is SIGHUP to tidemark itself (it reads its config file again)
    assert unit_value("ExecReload") == "/bin/kill -HUP $MAINPID"
    executable, *args = unit_value("ExecStart").split()
    assert executable.endswith("/tidemark")
    assert cli.parser().parse_args(args).func is cli.cmd_run


def test_env_example_sets_only_settings_tidemark_knows() -> None:
    # the settings file, its credential, systemd-analyze: tests/unit/project/test_systemd_unit.py
    env = env_example()
    unknown = [k for k in env if k != "TIDEMARK_CONFIG" and not settings_key_exists(k)]
    assert not unknown, f"not settings of tidemark: {unknown}"
