"""Command line of crashfs.

``python -m tests.crashfs mount BACKING MOUNTPOINT --state STATE --control SOCKET``
adopts BACKING as durable and serves it at MOUNTPOINT in the foreground until it is
unmounted (``fusermount3 -u MOUNTPOINT``) or gets SIGTERM/SIGINT/SIGHUP (libfuse then
unmounts, lazily when busy). SOCKET is a unix socket path, or ``@name`` for an
abstract one; it takes JSON lines (``{"cmd": "stats"}``, ``fail_fsync``,
``set_capacity``, ``clear_faults``, ``freeze``) and answers one JSON line each.

``python -m tests.crashfs materialize STATE BACKING`` replaces the contents of
BACKING with the durable image that ``freeze`` wrote to ``STATE/durable.json``: the
tree as a power loss at the freeze would have left it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.crashfs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    mount = sub.add_parser("mount", help="serve BACKING at MOUNTPOINT (foreground)")
    mount.add_argument("backing", type=Path)
    mount.add_argument("mountpoint", type=Path)
    mount.add_argument("--state", type=Path, required=True, help="snapshots and images")
    mount.add_argument("--control", required=True, help="unix socket path or @abstract")
    mount.add_argument("--debug", action="store_true", help="libfuse's request trace")
    mount.add_argument(
        "--watch-parent", action="store_true", help="unmount when the parent process ends"
    )
    mat = sub.add_parser("materialize", help="rebuild BACKING from STATE/durable.json")
    mat.add_argument("state", type=Path)
    mat.add_argument("backing", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s crashfs %(levelname)s %(message)s")
    logging.getLogger("mfusepy").setLevel(logging.WARNING)

    if args.command == "mount":
        from .fuse_fs import serve

        serve(
            args.backing.resolve(),
            args.mountpoint.resolve(),
            args.state.resolve(),
            args.control,
            debug=args.debug,
            watch_parent=args.watch_parent,
        )
        return 0

    from .model import DURABLE_IMAGE, DurableImage

    DurableImage.load(args.state / DURABLE_IMAGE).materialize(args.backing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
