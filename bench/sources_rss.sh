#!/usr/bin/env bash
# Memory of idle named sources: the resident set of an idle `outbox-relay run` with 1, 4 and 8
# named sources (relay.workers = 1 each, every table empty), and what each added source costs.
# Issue 38's target is at most 2 MB per idle source. Measure a Release build: ASan's shadow
# memory and quarantine would swamp the figure.
# Usage: bench/sources_rss.sh BIN [COUNTS...]   (COUNTS default: 1 4 8)
# With RELAY_TEST_PG and RELAY_TEST_AMQP set (tests/services.sh's env file) it uses those
# servers (and leaves its tables rss_s1..rss_sN there); otherwise it starts throwaway ones with
# tests/services.sh and stops them on exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: bench/sources_rss.sh BIN [COUNTS...]" >&2; exit 2; }
bin=$(realpath "$1")
shift
if [ $# -gt 0 ]; then counts=("$@"); else counts=(1 4 8); fi
svcdir=
relay_pid=

cleanup() {
	if [ -n "$relay_pid" ] && kill -0 "$relay_pid" 2>/dev/null; then
		kill -TERM "$relay_pid" 2>/dev/null || true
		wait "$relay_pid" 2>/dev/null || true
	fi
	if [ -n "$svcdir" ]; then
		"$root/tests/services.sh" stop "$svcdir" >/dev/null 2>&1 || true
		rm -rf "$svcdir"
	fi
}
trap cleanup EXIT

if [ -z "${RELAY_TEST_PG:-}" ] || [ -z "${RELAY_TEST_AMQP:-}" ]; then
	svcdir=$(mktemp -d /tmp/outbox-rss.XXXXXX)
	"$root/tests/services.sh" start "$svcdir" >/dev/null
	# shellcheck disable=SC1091
	. "$svcdir/env"
fi

port=$((20000 + RANDOM % 10000))
# The environment of a relay with n sources s1..sn on tables rss_s1..rss_sn.
sources_env() {
	local n=$1 names="" i
	for i in $(seq 1 "$n"); do
		names="$names${names:+,}s$i"
		echo "OUTBOX_SOURCES_S${i}_DATABASE_TABLE=rss_s$i"
		echo "OUTBOX_SOURCES_S${i}_DATABASE_CHANNEL=rss_s$i"
	done
	echo "OUTBOX_SOURCES=$names"
	echo "OUTBOX_DATABASE_URL=$RELAY_TEST_PG"
	echo "OUTBOX_AMQP_URL=$RELAY_TEST_AMQP"
	echo "OUTBOX_RELAY_WORKERS=1"
	echo "OUTBOX_HTTP_LISTEN=127.0.0.1:$port"
	echo "OUTBOX_LOG_LEVEL=warn"
}

# Resident set of pid in kB.
rss_kb() {
	awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"
}

declare -A rss
for n in "${counts[@]}"; do
	mapfile -t env < <(sources_env "$n")
	env -i PATH="$PATH" "${env[@]}" "$bin" migrate >/dev/null
	env -i PATH="$PATH" "${env[@]}" "$bin" run 2>/tmp/outbox-rss-relay.log &
	relay_pid=$!
	ready=0
	for _ in $(seq 1 300); do
		if env -i PATH="$PATH" "${env[@]}" "$bin" healthcheck >/dev/null 2>&1; then
			ready=1
			break
		fi
		sleep 0.2
	done
	[ $ready -eq 1 ] || { echo "relay with $n sources never became ready" >&2; cat /tmp/outbox-rss-relay.log >&2; exit 1; }
	# Idle for a while: the maintenance loops' first readings and the loops' first waits are
	# behind it, and what a source keeps is what stays.
	sleep 10
	rss[$n]=$(rss_kb "$relay_pid")
	kill -TERM "$relay_pid"
	wait "$relay_pid" || true
	relay_pid=
	awk -v n="$n" -v kb="${rss[$n]}" 'BEGIN { printf "sources %2d: RSS %6.1f MB\n", n, kb / 1024 }'
done

first=${counts[0]}
last=${counts[${#counts[@]} - 1]}
if [ "$last" -gt "$first" ]; then
	awk -v a="${rss[$first]}" -v b="${rss[$last]}" -v f="$first" -v l="$last" 'BEGIN {
		printf "per added idle source: %.2f MB (from %d to %d sources)\n", (b - a) / 1024 / (l - f), f, l
	}'
fi
