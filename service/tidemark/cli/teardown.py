"""``tidemark teardown``: what a deployment leaves on the source, and with ``--purge``
under the sink root, removed.

On the source: the replication slot (a slot nobody reads keeps WAL until
``max_slot_wal_keep_size`` invalidates it, or forever), and the publication when
tidemark created it. tidemark marks a publication it creates with a comment
(``CREATED_BY``, ``replication.slot.ensure_publication``); one without the mark was
made by someone else and stays, with the statement to drop it named.

Under the sink root (``purge``): this instance's shape tables (changelog and current;
for Iceberg also their catalog entries), its state folder, its flush rounds' staging
folder; the root's own records (format, default Iceberg catalog) go only when no other
instance keeps state there.

Refused while a tidemark instance of this slot runs: the slot in use, or a session of
the leader lease (a leader, or a standby waiting to lead: it would create the slot
again). The plan is made first and shown, then carried out.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from tidemark.errors import ConfigError, TidemarkError
from tidemark.replication.catalog import check_name
from tidemark.replication.slot import CREATED_BY
from tidemark.state.lease import APPLICATION_NAME
from tidemark.state.objectstore import is_remote

if TYPE_CHECKING:
    from tidemark.settings.config import Settings


class TeardownRefused(TidemarkError):
    """A running instance, or nothing to act on that is tidemark's."""


@dataclass
class Plan:
    slot: str
    slot_exists: bool
    publication: str
    publication_exists: bool
    publication_ours: bool
    purge: bool
    paths: list[Path] = field(default_factory=list)  # removed, in this order
    catalog_tables: list[str] = field(default_factory=list)  # Iceberg identifiers

    def describe(self) -> list[str]:
        """What will be done, a line each, and what will be left."""
        out = []
        if self.slot_exists:
            out.append(f"drop the replication slot {self.slot}")
        else:
            out.append(f"(no replication slot {self.slot} on the source)")
        if self.publication_exists and self.publication_ours:
            out.append(f"drop the publication {self.publication} (tidemark created it)")
        elif self.publication_exists:
            out.append(
                f"keep the publication {self.publication}: tidemark did not create it (drop "
                f"it yourself if nothing else uses it: DROP PUBLICATION {self.publication};)"
            )
        if self.purge:
            out += [f"drop the catalog table {t}" for t in self.catalog_tables]
            out += [f"remove {p}" for p in self.paths]
            if not self.paths and not self.catalog_tables:
                out.append("(nothing of this instance under the sink root)")
        return out


async def running(conn: psycopg.AsyncConnection[tuple[object, ...]], slot: str) -> list[str]:
    """Why a tidemark instance of ``slot`` may run now (empty: none seen)."""
    reasons = []
    row = await (
        await conn.execute(
            "select active_pid from pg_replication_slots where slot_name = %s and active",
            (slot,),
        )
    ).fetchone()
    if row is not None:
        reasons.append(f"the slot {slot} is in use (walsender pid {row[0]})")
    rows = await (
        await conn.execute(
            "select pid, host(client_addr) from pg_stat_activity"
            " where application_name = %s and datname = current_database()"
            " and pid <> pg_backend_pid()",
            (APPLICATION_NAME,),
        )
    ).fetchall()
    for pid, host in rows:
        where = f" from {host}" if host else ""
        reasons.append(f"a tidemark instance holds or waits for the lease (pid {pid}{where})")
    return reasons


async def make_plan(settings: Settings, purge: bool) -> Plan:
    src = settings.source
    check_name("slot", src.slot)
    check_name("publication", src.publication)
    async with await psycopg.AsyncConnection.connect(src.dsn, autocommit=True) as conn:
        reasons = await running(conn, src.slot)
        if reasons:
            raise TeardownRefused(
                "tidemark still runs against this slot: "
                + "; ".join(reasons)
                + ". Stop every instance (systemctl stop tidemark, docker compose stop) first"
            )
        slot = await (
            await conn.execute(
                "select 1 from pg_replication_slots where slot_name = %s", (src.slot,)
            )
        ).fetchone()
        pub = await (
            await conn.execute(
                "select obj_description(oid, 'pg_publication') from pg_publication"
                " where pubname = %s",
                (src.publication,),
            )
        ).fetchone()
    plan = Plan(
        slot=src.slot,
        slot_exists=slot is not None,
        publication=src.publication,
        publication_exists=pub is not None,
        publication_ours=pub is not None and pub[0] == CREATED_BY,
        purge=purge,
    )
    if purge:
        _plan_purge(settings, plan)
    return plan


def _plan_purge(settings: Settings, plan: Plan) -> None:
    from tidemark.shapes.registry import ShapeRegistry
    from tidemark.sink.root import root_format
    from tidemark.state.instance_state import instance_states, state_dir

    if is_remote(settings.sink.root):
        raise ConfigError(
            f"teardown --purge of the object-store root {settings.sink.root} is not "
            "supported yet: remove its objects with your store's tools (e.g. aws s3 rm "
            "--recursive), after the slot and publication are dropped"
        )
    root = Path(settings.sink.root)
    if not root.exists():
        return
    instance = settings.instance.name
    state = Path(state_dir(root, instance))
    registry = ShapeRegistry.open(state / "shapes.json")
    shapes = {s.name for s in registry.shapes()} | {s.name for s in settings.shapes}
    tables = root_format(root, settings.iceberg.catalog_uri or None)
    for shape in sorted(shapes):
        changelog_dir, current_dir = tables.folders(root, shape)
        if tables.name == "iceberg":
            plan.catalog_tables += [
                t.name
                for t in (tables.changelog(root, shape), tables.current(root, shape))
                if t.exists()
            ]
        plan.paths += [Path(p) for p in (changelog_dir, current_dir) if Path(p).exists()]
    rounds = root / "_rounds" / settings.source.slot
    if rounds.exists():
        plan.paths.append(rounds)
    others = [
        name
        for name, folder in instance_states(root).items()
        if name != instance and (name or _holds_state(Path(folder)))
    ]
    if instance:
        if state.exists():
            plan.paths.append(state)
    elif state.exists():
        # the unnamed instance's files; the root's records stay while others keep state
        keep = {"instances", "format.json", "iceberg.db"} if others else set()
        plan.paths += sorted(p for p in state.iterdir() if p.name not in keep)
    if not others:
        plan.paths += [p for p in (root / "_tidemark",) if p.exists() and p not in plan.paths]


def _holds_state(folder: Path) -> bool:
    """The unnamed instance keeps state in ``folder`` (not only the root's records)."""
    if not folder.is_dir():
        return False
    return any(p.name not in ("instances", "format.json", "iceberg.db") for p in folder.iterdir())


async def carry_out(settings: Settings, plan: Plan) -> list[str]:
    """Do what ``plan`` says; what was done, a line each."""
    done = []
    async with await psycopg.AsyncConnection.connect(settings.source.dsn, autocommit=True) as conn:
        if plan.slot_exists:
            await conn.execute("select pg_drop_replication_slot(%s)", (plan.slot,))
            done.append(f"dropped the replication slot {plan.slot}")
        if plan.publication_exists and plan.publication_ours:
            await conn.execute(
                sql.SQL("drop publication if exists {}").format(sql.Identifier(plan.publication))
            )
            done.append(f"dropped the publication {plan.publication}")
    if plan.purge:
        if plan.catalog_tables:
            from tidemark.sink.iceberg.catalog import open_catalog

            catalog = open_catalog(settings.sink.root, settings.iceberg)
            for name in plan.catalog_tables:
                catalog.drop_table(name)
                done.append(f"dropped the catalog table {name}")
        for path in plan.paths:
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
            done.append(f"removed {path}")
    return done
