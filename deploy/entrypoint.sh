#!/bin/sh
# Entrypoint of the tidemark image: `tidemark <arguments>`, `tidemark run` without any.
#
# Settings come from TIDEMARK_* environment variables (a tidemark.toml only if
# TIDEMARK_CONFIG names one). Before `run`, a local sink root must be writable: a
# volume owned by another user otherwise fails deep inside Spark, so say it here.
# exec: tidemark becomes the process that gets SIGTERM, and stops cleanly on it.
set -eu

if [ "$#" -eq 0 ]; then
    set -- run
fi

if [ "$1" = run ]; then
    root="${TIDEMARK_SINK__ROOT:-./tidemark-data}"
    case "$root" in
        *://*) ;;  # an object store: nothing to check locally
        *)
            if ! mkdir -p "$root" 2>/dev/null || ! [ -w "$root" ]; then
                echo "tidemark-entrypoint: the sink root $root is not writable by uid $(id -u):" \
                    "mount a volume there that this user owns, or set TIDEMARK_SINK__ROOT" >&2
                exit 1
            fi
            ;;
    esac
fi

exec tidemark "$@"
