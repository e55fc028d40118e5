#!/bin/sh
# Sample application traffic for `docker compose up`: calls shop.tick() (defined in
# deploy/postgres/init/20-shop.sql), one transaction per call, every TICK_INTERVAL_S
# seconds. TICKS > 0 stops after that many calls (the tests use it); 0 runs forever.
# Connection settings are libpq's: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE.
set -eu

interval="${TICK_INTERVAL_S:-0.5}"
ticks="${TICKS:-0}"
orders="${ORDERS_PER_TICK:-5}"
for value in "$ticks" "$orders"; do
    case "$value" in
        '' | *[!0-9]*)
            echo "workload: TICKS and ORDERS_PER_TICK must be whole numbers (got '$value')" >&2
            exit 2
            ;;
    esac
done

# The schema appears once the postgres image has run its init scripts; until then
# (and while the server restarts) keep trying instead of exiting.
until psql -X -q -v ON_ERROR_STOP=1 -c "select 'shop.tick'::regproc" >/dev/null 2>&1; do
    echo "workload: waiting for shop.tick() on ${PGHOST:-local}/${PGDATABASE:-}" >&2
    sleep 2
done
echo "workload: calling shop.tick($orders) every ${interval}s" >&2

done_ticks=0
while [ "$ticks" -eq 0 ] || [ "$done_ticks" -lt "$ticks" ]; do
    # a failed call (server restarting) is retried on the next tick, not fatal
    psql -X -q -v ON_ERROR_STOP=1 -c "call shop.tick($orders)" >/dev/null || sleep 2
    done_ticks=$((done_ticks + 1))
    sleep "$interval"
done
