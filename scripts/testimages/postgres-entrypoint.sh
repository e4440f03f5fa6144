#!/bin/sh
# Entrypoint of fkmat's locally built Postgres test image. It mimics the parts of
# the official postgres image that fkmat's tests use: POSTGRES_USER,
# POSTGRES_PASSWORD, POSTGRES_DB, POSTGRES_HOST_AUTH_METHOD, PGDATA, and server
# arguments passed through ("-c wal_level=logical").
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
	echo "fkmat test image: database initialised"
fi

exec setpriv --reuid=postgres --regid=postgres --init-groups "$PGBIN/postgres" -D "$PGDATA" "$@"
