"""``make bench``: every performance figure tidemark promises, measured in one run.

Usage: ``python -m bench [section ...] [--rows N]``. Sections run in the order
given (default: all). Figures that compare with ``pg_recvlogical`` measure it in
the same run, on the same WAL.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bench import FORMAT_ENV, sink_formats

SECTIONS = (
    "replication",
    "decode",
    "flush",
    "routing",
    "collector",
    "sink",
    "e2e",
    "e2e-small",
    "e2e-wide",
    "parquet",
    "metrics",
    "shapes",
    "commits",
    "object-store",
    "streamed",
    "backfill",
    "read",
    "cluster",
    "takeover",
)


def _compare_formats(
    section: str, runs: dict[str, list[dict[str, float]]], keys: list[str]
) -> None:
    """Iceberg's figures against Delta's of the same run (lower is better for each)."""
    if "delta" not in runs or "iceberg" not in runs:
        return
    print(f"-- {section}: iceberg / delta (target <= 1.25x) --")
    for delta, iceberg in zip(runs["delta"], runs["iceberg"], strict=True):
        label = f"{int(delta['shapes'])} shapes: " if "shapes" in delta else ""
        ratios = [f"{k} {iceberg[k] / delta[k]:.2f}x" for k in keys if delta.get(k)]
        print(f"   {label}{'  '.join(ratios)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("sections", nargs="*", metavar="section", help=", ".join(SECTIONS))
    parser.add_argument("--rows", type=int, default=1_000_000, help="inserts for stream benches")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from tidemark.observability import configure_logging

    # the services the sections run in this process log at their settings' level
    # (warning), as the CLI would configure it: not a line per Delta commit at 300/s
    # (TIDEMARK_BENCH_LOG=debug: the rounds' timings, ``round.*``, for a profile)
    configure_logging("console", os.environ.get("TIDEMARK_BENCH_LOG", "warning"))
    # `cluster` ends with the takeover figures; `takeover` alone runs just those
    sections = args.sections or [s for s in SECTIONS if s != "takeover"]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {SECTIONS}")
    started = time.perf_counter()
    status = 0
    for section in sections:
        print()
        if section == "replication":
            from bench import replication_bench

            replication_bench.main(args.rows)
        elif section == "decode":
            from bench import decode_bench

            decode_bench.main()
        elif section == "flush":
            from bench import flush_bench

            status |= flush_bench.main() or 0
        elif section == "routing":
            from bench import routing_bench

            routing_bench.main()
        elif section == "collector":
            from bench import collector_bench

            collector_bench.main()
        elif section == "sink":
            from bench import sink_bench

            sink_bench.main()
        elif section == "e2e":
            from bench import e2e_bench

            runs = {}
            for fmt in sink_formats():
                os.environ[FORMAT_ENV] = fmt
                runs[fmt] = e2e_bench.main(args.rows)
            _compare_formats(
                "e2e",
                {f: [r] for f, r in runs.items()},
                ["committed_s", "acked_s", "lag_p50_s", "lag_p99_s"],
            )
        elif section in ("e2e-small", "e2e-wide"):
            from bench import e2e_bench

            os.environ[FORMAT_ENV] = sink_formats()[0]
            if section == "e2e-small":
                e2e_bench.main(args.rows, "small")
            else:
                e2e_bench.main(args.rows // 10, "wide")
        elif section == "parquet":
            from bench import parquet_bench

            parquet_bench.main(args.rows)
        elif section == "metrics":
            from bench import metrics_bench

            metrics_bench.main()
        elif section == "shapes":
            from bench import shapes_bench

            per_format = {}
            for fmt in sink_formats():
                os.environ[FORMAT_ENV] = fmt
                per_format[fmt] = shapes_bench.main()
            _compare_formats("shapes", per_format, ["ready_s", "lag_p99_s", "drain_s"])
        elif section == "commits":
            from bench import commits_bench

            commits_bench.main()
        elif section == "object-store":
            from bench import object_store_bench

            object_store_bench.main()
        elif section == "streamed":
            from bench import streamed_bench

            streamed_bench.main()
        elif section == "backfill":
            from bench import backfill_bench

            backfill_bench.main(args.rows)
        elif section == "read":
            from bench import read_bench

            read_bench.main()
        elif section == "cluster":
            from bench import cluster_bench

            cluster_bench.main(args.rows)
        elif section == "takeover":
            from bench import takeover_bench

            takeover_bench.main()
    print(f"\nbench finished in {time.perf_counter() - started:.0f}s")
    return status


if __name__ == "__main__":
    sys.exit(main())
