#!/bin/sh
# Entrypoint of the tidemark image: `tidemark <arguments>`, `tidemark run` without any.
#
# Settings come from TIDEMARK_* environment variables (a tidemark.toml only if
# TIDEMARK_CONFIG names one). Before `run`, a local sink root must be writable: a
# volume owned by another user otherwise fails deep inside Spark, so say it here (and
# leave the reason in TIDEMARK_EXIT_REASON_FILE for the health check, as tidemark does).
#
# The image listens on all interfaces, where tidemark refuses to serve mutations
# without an admin token. Without TIDEMARK_HTTP__ADMIN_TOKEN, a random token is
# generated once into TIDEMARK_HTTP__ADMIN_TOKEN_FILE (mode 0600), which tidemark and
# the CLI (`docker compose exec tidemark tidemark shapes ...`) read.
# exec: tidemark becomes the process that gets SIGTERM, and stops cleanly on it.
set -eu

token_file="${TIDEMARK_HTTP__ADMIN_TOKEN_FILE:-}"
if [ -z "${TIDEMARK_HTTP__ADMIN_TOKEN:-}" ] && [ -n "$token_file" ] && ! [ -s "$token_file" ]; then
    if ! (umask 077 && od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$token_file") 2>/dev/null; then
        echo "tidemark-entrypoint: cannot write the admin token file $token_file: set" \
            "TIDEMARK_HTTP__ADMIN_TOKEN, or TIDEMARK_HTTP__ADMIN_TOKEN_FILE to a writable path" >&2
        exit 1
    fi
    echo "tidemark-entrypoint: no TIDEMARK_HTTP__ADMIN_TOKEN given: generated an admin token" \
        "into $token_file (read it with: docker compose exec tidemark cat $token_file)" >&2
fi

if [ "$#" -eq 0 ]; then
    set -- run
fi

if [ "$1" = run ]; then
    root="${TIDEMARK_SINK__ROOT:-./tidemark-data}"
    case "$root" in
        *://*) ;;  # an object store: nothing to check locally
        *)
            if ! mkdir -p "$root" 2>/dev/null || ! [ -w "$root" ]; then
                reason="the sink root $root is not writable by uid $(id -u): mount a volume there that this user owns, or set TIDEMARK_SINK__ROOT"
                echo "tidemark-entrypoint: $reason" >&2
                # for the health check, as tidemark itself leaves its reasons
                if [ -n "${TIDEMARK_EXIT_REASON_FILE:-}" ]; then
                    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $reason" > "$TIDEMARK_EXIT_REASON_FILE" 2>/dev/null || true
                fi
                exit 1
            fi
            ;;
    esac
fi

exec tidemark "$@"
