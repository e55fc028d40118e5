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
instance keeps state there. On an object store (``s3://``) a folder is every object
below its prefix, deleted in batches.

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

from tidemark.errors import TidemarkError
from tidemark.replication.catalog import check_name
from tidemark.replication.slot import CREATED_BY
from tidemark.state import objectstore
from tidemark.state.instance_state import ROOT_RECORDS
from tidemark.state.lease import APPLICATION_NAME
from tidemark.state.objectstore import Location, is_remote, join, listing

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
    # removed, in this order: files or folders (on an object store: every object below)
    paths: list[Location] = field(default_factory=list)
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

    given = settings.sink.root
    root: Location = given if is_remote(given) else Path(given)
    if not _present(root):
        return
    instance = settings.instance.name
    state = state_dir(root, instance)
    registry = ShapeRegistry.open(join(state, "shapes.json"))
    shapes = {s.name for s in registry.shapes()} | {s.name for s in settings.shapes}
    tables = root_format(
        root, settings.iceberg.catalog_uri or None, settings.iceberg.properties or None
    )
    for shape in sorted(shapes):
        changelog_dir, current_dir = tables.folders(root, shape)
        if tables.name == "iceberg":
            plan.catalog_tables += [
                t.name
                for t in (tables.changelog(root, shape), tables.current(root, shape))
                if t.exists()
            ]
        plan.paths += [p for p in (changelog_dir, current_dir) if _present(p)]
    rounds = join(root, "_rounds", settings.source.slot)
    if _present(rounds):
        plan.paths.append(rounds)
    others = [
        name
        for name, folder in instance_states(root).items()
        if name != instance and (name or _holds_state(folder))
    ]
    if instance:
        if _present(state):
            plan.paths.append(state)
    elif _present(state):
        # the unnamed instance's files; the root's records stay while others keep state
        keep = set(ROOT_RECORDS) if others else set()
        plan.paths += [join(state, name) for name in _children(state) if name not in keep]
    records = join(root, "_tidemark")
    if not others and _present(records) and records not in plan.paths:
        plan.paths.append(records)


def _present(location: Location) -> bool:
    """A file or folder there (on an object store: an object at or below it)."""
    if is_remote(location):
        return objectstore.exists(location) or bool(listing(location))
    return Path(location).exists()


def _children(folder: Location) -> list[str]:
    """The names directly in ``folder`` (on an object store: the first part of each key
    below it)."""
    if is_remote(folder):
        return sorted({item.name.split("/", 1)[0] for item in listing(folder)})
    return sorted(p.name for p in Path(folder).iterdir())


def _holds_state(folder: Location) -> bool:
    """The unnamed instance keeps state in ``folder`` (not only the root's records)."""
    if not _present(folder) or (not is_remote(folder) and not Path(folder).is_dir()):
        return False
    return any(n not in ROOT_RECORDS for n in _children(folder))


def _remove(location: Location) -> None:
    if is_remote(location):
        below = [join(location, item.name) for item in listing(location)]
        objectstore.delete([location, *below])
    elif Path(location).is_dir():
        shutil.rmtree(location)
    elif Path(location).exists():
        Path(location).unlink()


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
            _remove(path)
            done.append(f"removed {path}")
    return done
