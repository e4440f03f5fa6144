#!/bin/sh
# Entrypoint of fkmat's locally built Postgres test image. It mimics the parts of
# the official postgres image that fkmat's tests and quick start use:
# POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, POSTGRES_HOST_AUTH_METHOD,
# PGDATA, server arguments passed through ("-c wal_level=logical"), and the
# *.sql files of /docker-entrypoint-initdb.d run once, at the first start, on
# a server that listens on its socket only (so a TCP health check passes
# only once they are loaded).
set -eu
PGBIN=/usr/lib/postgresql/15/bin
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
export PGDATA

if [ "${1#-}" != "$1" ] || [ $# -eq 0 ]; then
	set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
	exec "$@"
fi
shift

runas() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
		echo "error: set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)" >&2
		exit 1
	fi
	pwfile=$(mktemp)
	printf '%s\n' "${POSTGRES_PASSWORD:-unused}" >"$pwfile"
	chown postgres "$pwfile"
	runas "$PGBIN/initdb" --username="$POSTGRES_USER" --pwfile="$pwfile" \
		--encoding=UTF8 --locale=C.UTF-8 --auth-local=trust \
		--auth-host="$POSTGRES_HOST_AUTH_METHOD" -D "$PGDATA" >/dev/null
	rm -f "$pwfile"
	{
		echo "host all all all $POSTGRES_HOST_AUTH_METHOD"
		echo "host replication all all $POSTGRES_HOST_AUTH_METHOD"
	} >>"$PGDATA/pg_hba.conf"
	echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
	if [ "$POSTGRES_DB" != postgres ]; then
		echo "CREATE DATABASE \"$POSTGRES_DB\";" |
			runas "$PGBIN/postgres" --single -D "$PGDATA" -j postgres >/dev/null
	fi
	if ls /docker-entrypoint-initdb.d/*.sql >/dev/null 2>&1; then
		runas "$PGBIN/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=" -w start >/dev/null
		for f in /docker-entrypoint-initdb.d/*.sql; do
			echo "fkmat test image: running $f"
			runas "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -f "$f"
		done
		runas "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
	fi
	echo "fkmat test image: database initialised"
fi

exec setpriv --reuid=postgres --regid=postgres --init-groups "$PGBIN/postgres" -D "$PGDATA" "$@"
