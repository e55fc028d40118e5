#!/bin/sh
# Entrypoint of the local postgres stand-in (postgres.Containerfile): on an empty data
# folder, initdb (UTF8: the minimal base has no locale, and initdb would pick SQL_ASCII),
# password auth over TCP, the init scripts on a socket-only server; then the server.
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" > "$pwfile"
    initdb --encoding=UTF8 --locale=C.UTF-8 --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
        --auth-host=scram-sha-256 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    printf 'host all all all scram-sha-256\nhost replication all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    # first start: unix socket only, so TCP (the health check) answers once this is done
    shift
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' $*" start
    if [ "$POSTGRES_DB" != postgres ]; then
        psql -X -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -c "create database \"$POSTGRES_DB\""
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sql) echo "postgres-entrypoint: running $f"; psql -X -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -f "$f" ;;
            *.sh) echo "postgres-entrypoint: running $f"; . "$f" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop
    set -- postgres "$@"
fi
exec "$@"
