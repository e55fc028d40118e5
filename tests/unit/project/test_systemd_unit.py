"""The systemd unit, its environment file and the settings file it names.

deploy/systemd/tidemark.service runs ``tidemark run`` with ``TIDEMARK_CONFIG`` naming
/etc/tidemark/tidemark.toml (example: deploy/tidemark.toml.example) and the source
password passed as a credential (``LoadCredential=``). The example settings are loaded
by tidemark's own loader, with the credential where systemd would put it; the
environment file must leave the shapes to the file (a reload reads only the file) and
hold no secret. ``systemd-analyze verify`` must accept the unit, and ``systemd-analyze
security --offline`` must rate it at most ``EXPOSURE_CEILING``, with each check it
still flags given a reason here. PID 1 is not systemd here: the checks are static, and
the unit has never run under a live systemd in these tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
from psycopg.conninfo import conninfo_to_dict
from tests.systemd_env import systemd_env_file
from tests.systemd_env import unit_entries as systemd_unit_entries

from tidemark.settings.config import Settings, is_loopback, load_settings
from tidemark.shapes.model import ShapeDefinition

REPO = Path(__file__).resolve().parents[3]
UNIT = REPO / "deploy" / "systemd" / "tidemark.service"
ENV_FILE = REPO / "deploy" / "systemd" / "tidemark.env.example"
TOML = REPO / "deploy" / "tidemark.toml.example"
# systemd's $CREDENTIALS_DIRECTORY (%d) for this unit; not expanded in the TOML
CREDENTIALS = PurePosixPath("/run/credentials") / UNIT.name

# `systemd-analyze security --offline=true` on the unit, systemd 252: 1.4 (3.3 before
# the system call filter, UMask=, ProtectProc=, PrivateMounts= and RemoveIPC=)
EXPOSURE_CEILING = 1.4
# what the security check still flags (json_field -> why the unit leaves it so)
LEFT_OPEN = {
    "SystemCallFilter_resources": "the JVM and Python's allocator set NUMA policies "
    "(set_mempolicy, mbind: @resources)",
    "RootDirectoryOrRootImage": "tidemark runs from the host's virtualenv and Java",
    "MemoryDenyWriteExecute": "the JVM compiles code at run time",
    "RestrictAddressFamilies_AF_NETLINK": "glibc's getaddrinfo asks netlink for addresses",
    "RestrictAddressFamilies_AF_UNIX": "sd_notify is a unix socket",
    "RestrictAddressFamilies_AF_INET_INET6": "Postgres, the API and Spark's driver",
    "ProcSubset": "the JVM reads /proc/meminfo, /proc/cpuinfo, /proc/stat, /proc/cgroups",
    "PrivateNetwork": "it connects to Postgres",
    "PrivateUsers": "the lake's files belong to the real tidemark user (shared for HA)",
    "DeviceAllow": "ProtectClock= itself allows reading the RTC",
    "IPAddressDeny": "where the source database is depends on the site",
}

analyze = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(analyze is None, reason="systemd-analyze is not installed")


# -- reading the files --------------------------------------------------------------------


def unit_entries() -> list[tuple[str, str, str]]:
    return systemd_unit_entries(UNIT)


def unit_values(key: str) -> list[str]:
    return [value for _, k, value in unit_entries() if k == key]


def unit_value(key: str) -> str:
    values = unit_values(key)
    assert values, f"the unit has no {key}="
    return values[-1]


def unit_environment() -> dict[str, str]:
    """Environment= of the unit (no quoting in it), then the environment file over it,
    as systemd applies them."""
    env = dict(item.split("=", 1) for v in unit_values("Environment") for item in v.split())
    return env | systemd_env_file(ENV_FILE.read_text())


def credentials() -> dict[str, str]:
    """LoadCredential= ID -> the host file systemd copies."""
    return dict(v.split(":", 1) for v in unit_values("LoadCredential"))


def commented_setting(key: str) -> str:
    """The value of a setting the unit suggests in a comment (``#MemoryMax=6G``)."""
    found = re.findall(rf"^#{key}=(\S+)$", UNIT.read_text(), re.MULTILINE)
    assert len(found) == 1, f"the unit suggests no {key}= (or more than one)"
    return found[0]


def size(text: str) -> int:
    """Bytes of a systemd (5G, 4500M) or JVM (2g) size."""
    parsed = re.fullmatch(r"(\d+)([KMGT]?)", text.upper())
    assert parsed is not None, f"{text!r} is not a size"
    number, unit = parsed.groups()
    return int(number) * 1024 ** "_KMGT".index(unit or "_")


class Host:
    """The unit's view of the settings: tidemark.toml.example installed as the file
    TIDEMARK_CONFIG names, the credentials systemd would copy, the unit's environment."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.secrets = {name: f"{name}-s3cret" for name in credentials()}
        folder = tmp_path / "credentials"
        folder.mkdir()
        for name, secret in self.secrets.items():
            (folder / name).write_text(secret + "\n")
        self.config = tmp_path / "tidemark.toml"
        self.config.write_text(TOML.read_text().replace(f"{CREDENTIALS}/", f"{folder}/"))
        for name in list(os.environ):
            if name.startswith("TIDEMARK_"):
                monkeypatch.delenv(name)
        env = unit_environment()
        assert env["TIDEMARK_CONFIG"] == "/etc/tidemark/tidemark.toml"
        for name, value in env.items():
            if name.startswith("TIDEMARK_") and name != "TIDEMARK_CONFIG":
                monkeypatch.setenv(name, value)
        monkeypatch.setenv("TIDEMARK_CONFIG", str(self.config))
        monkeypatch.chdir(tmp_path)

    def settings(self) -> Settings:
        return load_settings()  # as `tidemark run` does: $TIDEMARK_CONFIG


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Host:
    return Host(tmp_path, monkeypatch)


def run_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert analyze is not None
    return subprocess.run([analyze, *args], capture_output=True, text=True, timeout=60, check=False)


def checkable_unit(tmp_path: Path) -> Path:
    """A copy of the unit (same name) whose ExecStart program exists here: verify
    insists on it."""
    program = unit_value("ExecStart").split()[0]
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace(program, sys.executable))
    return copy


# -- the settings file --------------------------------------------------------------------


def test_the_unit_runs_tidemark_with_the_settings_file_it_ships(host: Host) -> None:
    # given the example installed where the unit's TIDEMARK_CONFIG points
    assert unit_environment()["TIDEMARK_CONFIG"] in TOML.read_text()  # its install line
    # when tidemark loads its settings, then the example is valid as shipped
    settings = host.settings()
    assert [s.name for s in settings.shapes] == ["orders_eu", "customers"]
    for shape in settings.shapes:
        ShapeDefinition(**shape.model_dump())
    assert is_loopback(settings.http.host)
    assert settings.log_format == "json"


def test_the_password_comes_from_the_credential_the_unit_loads(host: Host) -> None:
    # the file names the credential's path under systemd, not the password
    dsn_in_file = re.search(r'^dsn = "(.*)"$', TOML.read_text(), re.MULTILINE)
    assert dsn_in_file is not None
    assert "password" not in conninfo_to_dict(dsn_in_file.group(1))
    assert credentials() == {"source-password": "/etc/tidemark/source-password"}
    assert f'password_file = "{CREDENTIALS}/source-password"' in TOML.read_text()
    # when loaded, the DSN carries the password the credential holds
    settings = host.settings()
    assert conninfo_to_dict(settings.source.dsn)["password"] == host.secrets["source-password"]


def test_the_lake_and_the_shutdown_fit_the_units_sandbox(host: Host) -> None:
    settings = host.settings()
    writable = [Path(p) for p in unit_value("ReadWritePaths").split()]
    assert any(Path(settings.sink.root).is_relative_to(p) for p in writable)
    state = Path("/var/lib") / unit_value("StateDirectory")
    assert Path(settings.sink.root).is_relative_to(state)
    assert Path(unit_value("WorkingDirectory")) in writable
    assert int(unit_value("TimeoutStopSec")) > settings.shutdown_grace_s


def test_a_reload_can_change_the_shapes_because_the_environment_leaves_them_alone(
    host: Host,
) -> None:
    # given the service started with the unit's environment and the file
    before = host.settings()
    # when the file gains a shape and is read again (what SIGHUP does)
    with host.config.open("a") as file:
        file.write('\n[[shapes]]\nname = "orders_us"\ntable = "shop.orders"\n')
    after = host.settings()
    # then the new shape is there: no variable pins the shapes
    assert [s.name for s in after.shapes] == [*(s.name for s in before.shapes), "orders_us"]
    # variables are read only at start: the environment sets no setting but the file's name
    settings_in_env = [k for k in unit_environment() if k.startswith("TIDEMARK_")]
    assert settings_in_env == ["TIDEMARK_CONFIG"]


def test_no_secret_is_in_the_environment_or_the_settings_file() -> None:
    env = unit_environment()
    for name, value in env.items():
        assert not re.search(r"PASSWORD|TOKEN|SECRET|DSN", name), name
        assert not re.search(r"://[^/@\s]*:[^/@\s]*@", value), f"{name} holds a password"
        assert "password=" not in value.lower(), name
    text = ENV_FILE.read_text()
    assert not re.search(r"^\s*TIDEMARK_SHAPES\s*=", text, re.MULTILINE)
    assert not re.search(r"://[^/@\s]*:[^/@\s]*@", text)  # nor in a comment
    assert not re.search(r"^(admin_token|password) *=", TOML.read_text(), re.MULTILINE)


def test_the_suggested_memory_limits_hold_the_jvm_and_the_buffers(host: Host) -> None:
    settings = host.settings()
    heap = size(settings.spark.conf["spark.driver.memory"])
    buffers = settings.flush.memory_budget_bytes
    # the rule in the unit's comment: heap + ~1G for the JVM, buffers + ~0.5G for Python
    needed = heap + 2**30 + buffers + 2**29
    high, limit = size(commented_setting("MemoryHigh")), size(commented_setting("MemoryMax"))
    assert needed <= high < limit


# -- the unit -------------------------------------------------------------------------------


def test_the_unit_is_hardened_as_the_issue_asks() -> None:
    assert unit_value("UMask") == "0077"
    assert unit_value("ProtectProc") == "invisible"
    assert not unit_values("ProcSubset")  # see LEFT_OPEN
    assert unit_values("SystemCallFilter") == ["@system-service", "~@privileged"]
    assert unit_value("SystemCallErrorNumber") == "EPERM"  # fail a call, not the process
    assert unit_value("CapabilityBoundingSet") == ""
    assert unit_value("User") == "tidemark"


@needs_analyze
def test_the_numa_calls_the_filter_keeps_are_the_resources_group() -> None:
    # the unit's reason for not denying @resources
    listed = run_analyze("syscall-filter", "@resources").stdout.split()
    assert {"set_mempolicy", "mbind"} <= set(listed)


@needs_analyze
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    done = run_analyze("verify", str(checkable_unit(tmp_path)))
    # unknown keys and bad values are only warnings (exit 0): any output is a failure
    assert (done.returncode, done.stderr.strip(), done.stdout.strip()) == (0, "", "")


@needs_analyze
def test_the_security_exposure_stays_at_its_measured_level(tmp_path: Path) -> None:
    unit = str(checkable_unit(tmp_path))
    text = run_analyze("security", "--offline=true", "--no-pager", unit)
    assert text.returncode == 0, text.stderr
    level = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", text.stdout)
    assert level is not None, text.stdout
    print(f"systemd-analyze security --offline: exposure {level.group(1)}")
    assert float(level.group(1)) <= EXPOSURE_CEILING
    done = run_analyze("security", "--offline=true", "--json=short", "--no-pager", unit)
    checks = {c["json_field"]: c for c in json.loads(done.stdout)}
    for field in (
        "UMask",
        "ProtectProc",
        "SystemCallFilter_privileged",
        "SystemCallFilter_mount",
        "SystemCallFilter_module",
        "SystemCallFilter_debug",
        "SystemCallArchitectures",
        "NoNewPrivileges",
        "CapabilityBoundingSet_CAP_SYS_ADMIN",
        "UserOrDynamicUser",
    ):
        assert checks[field]["set"], f"{field}: {checks[field]['description']}"
    flagged = {f for f, c in checks.items() if not c["set"] and c["exposure"] is not None}
    assert flagged <= set(LEFT_OPEN), f"newly flagged: {flagged - set(LEFT_OPEN)}"
