"""Which files a copied PostgreSQL install needs to keep working."""

from __future__ import annotations

from pathlib import Path

from tidemark.demo.postgres import _install_parts


def test_a_wheel_install_is_copied_with_its_vendored_libraries(tmp_path: Path) -> None:
    # given the wheel layout: <site>/pgserver/pginstall/bin and <site>/pgserver.libs
    bin_dir = tmp_path / "site" / "pgserver" / "pginstall" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "site" / "pgserver.libs").mkdir()
    base, parts = _install_parts(bin_dir)
    # then both are copied under one root, so $ORIGIN/../../../pgserver.libs still holds
    assert base == tmp_path / "site"
    assert [p.relative_to(base) for p in parts] == [
        Path("pgserver/pginstall"),
        Path("pgserver.libs"),
    ]


def test_a_system_install_is_copied_alone(tmp_path: Path) -> None:
    bin_dir = tmp_path / "usr" / "lib" / "postgresql" / "15" / "bin"
    bin_dir.mkdir(parents=True)
    base, parts = _install_parts(bin_dir)
    assert parts == [bin_dir.parent] and base == bin_dir.parent.parent
