#!/bin/sh
# The official image's start-up, reduced to what the compose files use: on the first start
# (an empty data directory) initdb with POSTGRES_USER as superuser and its password, create
# POSTGRES_DB, accept password logins from any host; then run the server as postgres.
set -eu

if [ "${1#-}" != "$1" ]; then
	set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
	exec "$@"
fi

if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA"
	chown postgres:postgres "$PGDATA"
	chmod 700 "$PGDATA"
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
	POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE")
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ -z "${POSTGRES_PASSWORD:-}" ]; then
		echo "error: database is uninitialized and superuser password is not specified" >&2
		echo "       set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE" >&2
		exit 1
	fi
	pwfile=$(mktemp)
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	initdb --username="$user" --pwfile="$pwfile" --auth-local=trust \
		--auth-host=scram-sha-256 -D "$PGDATA" >/dev/null
	rm -f "$pwfile"
	printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
	printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
	if [ "$db" != postgres ]; then
		pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
		psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -q \
			-c "CREATE DATABASE \"$db\""
		pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
	fi
	echo "PostgreSQL init process complete; ready for start up."
fi
exec "$@"
