#!/bin/sh
# The public postgres image's contract, in short: on an empty PGDATA, initdb with POSTGRES_USER as the
# superuser and POSTGRES_PASSWORD as its password (scram for every host), then create POSTGRES_DB.
set -eu
: "${POSTGRES_PASSWORD:?expected POSTGRES_PASSWORD, got none}"
user="${POSTGRES_USER:-postgres}" db="${POSTGRES_DB:-${POSTGRES_USER:-postgres}}"
mkdir -p "$PGDATA" /run/postgresql
chown postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    secret=$(mktemp) && printf '%s\n' "$POSTGRES_PASSWORD" > "$secret" && chown postgres "$secret"
    runuser -u postgres -- initdb -D "$PGDATA" -U "$user" --pwfile="$secret" --auth-local=trust \
        --auth-host=scram-sha-256 >/dev/null
    rm -f "$secret"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    runuser -u postgres -- pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [ "$db" != postgres ]; then
        runuser -u postgres -- psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -q -c "CREATE DATABASE \"$db\""
    fi
    runuser -u postgres -- pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
# setpriv execs the server as PID 1 (runuser would stay in between and keep the stop signal to itself).
if [ "$1" = postgres ]; then
    shift
    exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses="*" "$@"
fi
exec "$@"
