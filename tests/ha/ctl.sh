#!/usr/bin/env bash
# Controls the servers tests/ha/services.sh started: a PostgreSQL primary with a synchronous
# standby and a three-node RabbitMQ cluster. services.sh copies this file to DIR/bin/ha-ctl and
# links every command name to it, so `DIR/bin/ha-pg-kill` is `ha-ctl pg-kill`.
# Usage: ha-ctl COMMAND [ARGS]   (COMMAND as listed in usage() below)
set -euo pipefail

usage() {
	cat >&2 <<'EOF'
usage: ha-ctl COMMAND [ARGS]
  pg-primary           print the number (1 or 2) of the node that accepts writes
  pg-kill [N]          SIGKILL node N's postmaster and every backend (default: the primary)
  pg-promote [N]       promote standby N (default: the one running), wait until it writes
  pg-rejoin [N]        rebuild node N (default: the one down) as a synchronous standby
  pg-sync on|off       synchronous replication on the primary to its standby, or none
  pg-start N | pg-stop N | pg-ctl N ARGS... | pg-psql N SQL
  rmq-start N          start RabbitMQ node N (1-3), wait until booted (a member rejoins)
  rmq-stop N           rabbitmqctl shutdown: the node closes its connections and exits
  rmq-kill N           SIGKILL node N's Erlang VM: its sockets simply drop
  rmq-status           cluster_status as seen from the first running node
  rmq-wait-cluster N.. wait until the nodes given (default: all three) run in the cluster
  rmq-ctl N ARGS...    rabbitmqctl for node N
  restore              start what is down: every RabbitMQ node, a PostgreSQL primary and
                       its synchronous standby
EOF
	exit 2
}

die() {
	echo "ha-ctl: $*" >&2
	exit 1
}

# Commands reach this file through links named ha-<command>, or as ha-ctl <command>.
self=$(readlink -f "$0")
bindir=$(dirname "$self")
dir=$(dirname "$bindir")
# shellcheck disable=SC1091
. "$dir/ha.vars"

cmd=$(basename "$0")
cmd=${cmd#ha-}
if [ "$cmd" = ctl ]; then
	[ $# -ge 1 ] || usage
	cmd=$1
	shift
fi

# True while process $1 runs; a zombie does not count (see group_alive).
alive() {
	local st
	st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
	case $st in Z*) return 1 ;; esac
}

now_ms() {
	date +%s%3N
}

show_log() {
	local f
	for f in "$@"; do
		[ -f "$f" ] || continue
		echo "---- last lines of $f ----" >&2
		tail -n 40 "$f" >&2
	done
}

# Runs "$@" until it succeeds or $1 seconds passed; quiet, the caller reports the failure.
retry() {
	local secs=$1 deadline
	shift
	deadline=$(($(date +%s) + secs))
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$deadline" ] || return 1
		sleep 0.2
	done
}

# ---- PostgreSQL ----

check_pg_node() {
	case ${1:-} in
	1 | 2) ;;
	*) die "PostgreSQL node must be 1 or 2, not '${1:-}'" ;;
	esac
}

other_node() {
	echo $((3 - $1))
}

pg_port() {
	eval echo "\$HA_PG_PORT$1"
}

pg_conninfo() {
	echo "host=127.0.0.1 port=$(pg_port "$1") user=postgres dbname=postgres connect_timeout=3"
}

pg_log() {
	echo "$dir/pg/node$1/server.log"
}

pg_data() {
	echo "$dir/pg/node$1/data"
}

pg_ctl() {
	local n=$1
	shift
	# -l keeps the server off the caller's stdout, which would otherwise hold a test's pipe
	# open for the postmaster's whole life.
	runuser -u postgres -- "$HA_PGBIN/pg_ctl" -D "$(pg_data "$n")" -l "$(pg_log "$n")" "$@"
}

# One statement on node N through TCP, unaligned output; fails when the node does not answer.
pg_psql() {
	"$HA_PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$(pg_conninfo "$1")" -c "$2"
}

# The postmaster's pid while it runs, else nothing.
pg_pid() {
	local f pid
	f=$(pg_data "$1")/postmaster.pid
	[ -f "$f" ] || return 0
	pid=$(head -n 1 "$f" 2>/dev/null || true)
	if [ -n "$pid" ] && alive "$pid"; then
		echo "$pid"
	fi
}

pg_is_primary() {
	[ "$(pg_psql "$1" 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ]
}

pg_is_standby() {
	[ "$(pg_psql "$1" 'SELECT pg_is_in_recovery()' 2>/dev/null)" = t ]
}

# Prints the numbers of the nodes that answer as primaries (normally one, none mid-failover).
pg_primaries() {
	local n
	for n in 1 2; do
		if pg_is_primary "$n"; then
			echo "$n"
		fi
	done
}

cmd_pg_primary() {
	local p
	p=$(pg_primaries)
	case $p in
	1 | 2) echo "$p" ;;
	"") die "no PostgreSQL node accepts writes" ;;
	*) die "both PostgreSQL nodes accept writes (split brain)" ;;
	esac
}

# A commit on the node: assigning a transaction id makes the commit write WAL, so with
# synchronous replication on it waits for the standby. Bounded, so a hang is an error.
pg_writes() {
	timeout 10 "$HA_PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$(pg_conninfo "$1")" \
		-c 'SELECT txid_current()' >/dev/null 2>&1
}

# The SysV segment a postmaster keeps as its interlock outlives a SIGKILL; removed once no
# process is attached, so killed nodes leave nothing behind. Argument: the pid file's copy.
pg_remove_shm() {
	local f=$1 shmid
	[ -f "$f" ] || return 0
	shmid=$(sed -n 7p "$f" | awk '{print $2}')
	[ -n "$shmid" ] || return 0
	ipcrm -m "$shmid" 2>/dev/null || true
}

# True while a process of group $1 lives; zombies do not count, since the orphans of a killed
# postmaster are reaped by whatever init the machine has, in its own time.
group_alive() {
	ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

# After a kill, the postmaster's lock files name a pid that may still exist as a zombie until
# init reaps it, and a new postmaster would take that for a live one and refuse to start. Only
# for a node whose postmaster is known dead; its SysV segment goes with them.
pg_clear_stale() {
	local n=$1 f
	[ -z "$(pg_pid "$n")" ] || return 0
	f=$(pg_data "$n")/postmaster.pid
	pg_remove_shm "$f"
	rm -f "$f" "$dir/pg/node$n/.s.PGSQL.$(pg_port "$n").lock" "$dir/pg/node$n/.s.PGSQL.$(pg_port "$n")"
}

cmd_pg_kill() {
	local n=${1:-} pid deadline
	if [ -z "$n" ]; then
		n=$(cmd_pg_primary)
	fi
	check_pg_node "$n"
	pid=$(pg_pid "$n")
	[ -n "$pid" ] || die "PostgreSQL node $n is not running"
	# pg_ctl starts the postmaster in a session of its own, so its process group is exactly
	# the postmaster and its children: every backend and the walsender die at the same
	# instant, as on a crashed machine (whose kernel would not close the sockets, though).
	kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid"
	deadline=$(($(date +%s) + 30))
	while group_alive "$pid"; do
		[ "$(date +%s)" -lt "$deadline" ] || die "node $n's processes survived SIGKILL"
		sleep 0.05
	done
	pg_clear_stale "$n"
	echo "killed PostgreSQL node $n (postmaster $pid and its process group)"
}

# synchronous_standby_names on node N; ALTER SYSTEM works on a standby as well, so a standby
# can be prepared before its promotion.
pg_set_sync() {
	local n=$1 names=$2
	pg_psql "$n" "ALTER SYSTEM SET synchronous_standby_names = '$names'" >/dev/null
	pg_psql "$n" 'SELECT pg_reload_conf()' >/dev/null
	retry 10 pg_sync_is "$n" "$names" ||
		die "node $n did not take synchronous_standby_names = '$names'"
}

pg_sync_is() {
	[ "$(pg_psql "$1" 'SHOW synchronous_standby_names')" = "$2" ]
}

cmd_pg_promote() {
	local n=${1:-} t0
	if [ -z "$n" ]; then
		for n in 1 2 none; do
			[ "$n" = none ] && die "no running standby to promote"
			pg_is_standby "$n" && break
		done
	fi
	check_pg_node "$n"
	pg_is_standby "$n" || die "PostgreSQL node $n is not a running standby"
	t0=$(now_ms)
	# Alone after the failover: a synchronous standby name would make every commit wait for
	# a standby that does not exist (see services.sh on why tests want writes to go on).
	pg_set_sync "$n" ''
	if ! pg_ctl "$n" promote -w -t 60 >>"$dir/pg/ctl.log" 2>&1; then
		show_log "$dir/pg/ctl.log" "$(pg_log "$n")"
		die "pg_ctl promote of node $n failed"
	fi
	if ! retry 60 pg_writes "$n"; then
		show_log "$(pg_log "$n")"
		die "node $n does not accept writes after its promotion"
	fi
	echo "promoted PostgreSQL node $n in $(($(now_ms) - t0)) ms"
}

# Appends what differs between the nodes to node N's configuration: the rest is copied from
# the primary by pg_basebackup, and later lines win.
pg_node_conf() {
	local n=$1
	cat >>"$(pg_data "$n")/postgresql.conf" <<EOF
# node $n (written by tests/ha)
listen_addresses = '127.0.0.1'
port = $(pg_port "$n")
unix_socket_directories = '$dir/pg/node$n'
cluster_name = 'node$n'
EOF
}

cmd_pg_start() {
	local n=$1
	check_pg_node "$n"
	pg_clear_stale "$n"
	if ! pg_ctl "$n" -w -t 60 start >>"$dir/pg/ctl.log" 2>&1; then
		show_log "$dir/pg/ctl.log" "$(pg_log "$n")"
		die "PostgreSQL node $n did not start"
	fi
}

cmd_pg_stop() {
	local n=$1
	check_pg_node "$n"
	pg_ctl "$n" -m fast -w -t 60 stop >>"$dir/pg/ctl.log" 2>&1 || die "PostgreSQL node $n did not stop"
}

# The primary's view of standby N: "state sync_state", empty while it is not connected.
pg_repl_state() {
	pg_psql "$1" "SELECT state || ' ' || sync_state FROM pg_stat_replication WHERE application_name = 'node$2'" 2>/dev/null || true
}

# True when the primary $1 sees standby $2 in a state matching the glob $3 ("streaming *").
pg_repl_is() {
	# shellcheck disable=SC2053
	[[ $(pg_repl_state "$1" "$2") == $3 ]]
}

# A fresh copy of the primary rather than pg_rewind: a test database is small enough to copy
# in about a second, and a copy works whatever the old primary wrote after the standby's last
# flush, needs neither wal_log_hints nor a clean shutdown, and cannot meet a timeline that
# pg_rewind does not handle.
cmd_pg_rejoin() {
	local n=${1:-} p t0 data
	p=$(cmd_pg_primary)
	if [ -z "$n" ]; then
		n=$(other_node "$p")
	fi
	check_pg_node "$n"
	[ "$n" != "$p" ] || die "node $n is the primary; it cannot become a standby"
	t0=$(now_ms)
	if [ -n "$(pg_pid "$n")" ]; then
		pg_ctl "$n" -m immediate -w -t 60 stop >>"$dir/pg/ctl.log" 2>&1 || die "could not stop node $n"
	fi
	data=$(pg_data "$n")
	pg_clear_stale "$n"
	rm -rf "$data"
	# application_name names the standby in the primary's synchronous_standby_names.
	if ! runuser -u postgres -- "$HA_PGBIN/pg_basebackup" -D "$data" -R -X stream -c fast \
		-d "host=127.0.0.1 port=$(pg_port "$p") user=postgres application_name=node$n" \
		>>"$dir/pg/basebackup.log" 2>&1; then
		show_log "$dir/pg/basebackup.log"
		die "pg_basebackup of node $n from node $p failed"
	fi
	pg_node_conf "$n"
	cmd_pg_start "$n"
	if ! retry 60 pg_repl_is "$p" "$n" "streaming *"; then
		show_log "$(pg_log "$n")" "$(pg_log "$p")"
		die "node $n does not stream from node $p"
	fi
	pg_set_sync "$p" "node$n"
	retry 30 pg_repl_is "$p" "$n" "streaming sync" ||
		die "node $n streams but is not the synchronous standby"
	echo "node $n is the synchronous standby of node $p after $(($(now_ms) - t0)) ms"
}

cmd_pg_sync() {
	local p
	p=$(cmd_pg_primary)
	case ${1:-} in
	on) pg_set_sync "$p" "node$(other_node "$p")" ;;
	off) pg_set_sync "$p" '' ;;
	*) usage ;;
	esac
}

# ---- RabbitMQ ----

check_rmq_node() {
	case ${1:-} in
	1 | 2 | 3) ;;
	*) die "RabbitMQ node must be 1, 2 or 3, not '${1:-}'" ;;
	esac
}

rmq_name() {
	eval echo "\$HA_RMQ_NAME$1"
}

rmq_dir() {
	echo "$dir/rmq/node$1"
}

rmq_ctl() {
	local n=$1
	shift
	(
		# shellcheck disable=SC1091
		. "$(rmq_dir "$n")/node.env"
		exec "$HA_RMQBIN/rabbitmqctl" -n "$(rmq_name "$n")" "$@"
	)
}

# The Erlang VM's pid while it runs, else nothing.
rmq_pid() {
	local f pid
	f=$(rmq_dir "$1")/pid
	[ -f "$f" ] || return 0
	pid=$(cat "$f" 2>/dev/null || true)
	if [ -n "$pid" ] && alive "$pid"; then
		echo "$pid"
	fi
}

rmq_show_logs() {
	local d
	d=$(rmq_dir "$1")
	show_log "$d/server.out" "$d/ctl.log" "$d/log/$(rmq_name "$1").log"
}

cmd_rmq_start() {
	local n=$1 d t0
	check_rmq_node "$n"
	d=$(rmq_dir "$n")
	[ -z "$(rmq_pid "$n")" ] || die "RabbitMQ node $n is already running"
	t0=$(now_ms)
	# The node runs detached from the caller (own session, no inherited pipes); a stopped
	# node leaves its pid file behind, which `wait` would take for the new one.
	rm -f "$d/pid"
	(
		# shellcheck disable=SC1091
		. "$d/node.env"
		setsid "$HA_RMQBIN/rabbitmq-server" >>"$d/server.out" 2>&1 </dev/null &
	)
	# A node that was in the cluster syncs its metadata from the running members first.
	if ! rmq_ctl "$n" wait --timeout 180 "$d/pid" >>"$d/ctl.log" 2>&1 ||
		! rmq_ctl "$n" await_startup --timeout 180 >>"$d/ctl.log" 2>&1; then
		rmq_show_logs "$n"
		die "RabbitMQ node $n did not start"
	fi
	echo "started RabbitMQ node $n in $(($(now_ms) - t0)) ms"
}

cmd_rmq_stop() {
	local n=$1 t0
	check_rmq_node "$n"
	[ -n "$(rmq_pid "$n")" ] || die "RabbitMQ node $n is not running"
	t0=$(now_ms)
	# shutdown returns once the node's OS process has exited.
	if ! rmq_ctl "$n" shutdown --timeout 120 >>"$(rmq_dir "$n")/ctl.log" 2>&1; then
		rmq_show_logs "$n"
		die "RabbitMQ node $n did not shut down"
	fi
	echo "stopped RabbitMQ node $n in $(($(now_ms) - t0)) ms"
}

cmd_rmq_kill() {
	local n=$1 pid deadline
	check_rmq_node "$n"
	pid=$(rmq_pid "$n")
	[ -n "$pid" ] || die "RabbitMQ node $n is not running"
	kill -KILL "$pid"
	deadline=$(($(date +%s) + 30))
	while alive "$pid"; do
		[ "$(date +%s)" -lt "$deadline" ] || die "RabbitMQ node $n survived SIGKILL"
		sleep 0.05
	done
	echo "killed RabbitMQ node $n (pid $pid)"
}

first_running_rmq() {
	local n
	for n in 1 2 3; do
		if [ -n "$(rmq_pid "$n")" ]; then
			echo "$n"
			return 0
		fi
	done
	return 1
}

cmd_rmq_status() {
	local n
	n=$(first_running_rmq) || die "no RabbitMQ node is running"
	rmq_ctl "$n" cluster_status
}

# True when node $1 lists every node in ${@:2} among its running cluster members.
rmq_sees_running() {
	local n=$1 out m
	shift
	out=$(rmq_ctl "$n" eval 'rabbit_nodes:all_running().' 2>/dev/null) || return 1
	for m in "$@"; do
		case $out in *"'$(rmq_name "$m")'"*) ;; *) return 1 ;; esac
	done
}

cmd_rmq_wait_cluster() {
	local nodes=("$@") n
	[ ${#nodes[@]} -gt 0 ] || nodes=(1 2 3)
	for n in "${nodes[@]}"; do
		check_rmq_node "$n"
	done
	if ! retry 120 rmq_sees_running "${nodes[0]}" "${nodes[@]}"; then
		rmq_ctl "${nodes[0]}" cluster_status >&2 || true
		die "RabbitMQ nodes ${nodes[*]} are not all running in one cluster"
	fi
}

# ---- both ----

# Brings everything back after a test, whatever it left behind: stopped RabbitMQ nodes are
# started, a missing PostgreSQL primary is promoted (or, with both nodes down, node 1 is
# restarted) and a missing or broken standby is rebuilt, with synchronous replication on.
cmd_restore() {
	local n p s
	for n in 1 2 3; do
		if [ -z "$(rmq_pid "$n")" ]; then
			cmd_rmq_start "$n"
		fi
	done
	cmd_rmq_wait_cluster 1 2 3
	p=$(pg_primaries)
	case $p in
	1 | 2) ;;
	"")
		for n in 1 2 none; do
			[ "$n" = none ] && break
			pg_is_standby "$n" && break
		done
		if [ "$n" = none ]; then
			n=1
			[ -n "$(pg_pid 1)" ] || cmd_pg_start 1
		fi
		if pg_is_standby "$n"; then
			cmd_pg_promote "$n"
		fi
		p=$n
		;;
	*) die "both PostgreSQL nodes accept writes (split brain); not restoring" ;;
	esac
	s=$(other_node "$p")
	if ! pg_is_standby "$s" || ! pg_repl_is "$p" "$s" "streaming sync"; then
		cmd_pg_rejoin "$s"
	fi
}

case $cmd in
restore) cmd_restore ;;
pg-primary) cmd_pg_primary ;;
pg-kill) cmd_pg_kill "$@" ;;
pg-promote) cmd_pg_promote "$@" ;;
pg-rejoin) cmd_pg_rejoin "$@" ;;
pg-sync) cmd_pg_sync "$@" ;;
pg-start) cmd_pg_start "${1:-}" ;;
pg-stop) cmd_pg_stop "${1:-}" ;;
pg-ctl)
	check_pg_node "${1:-}"
	pg_ctl "$@"
	;;
pg-psql)
	check_pg_node "${1:-}"
	[ $# -eq 2 ] || usage
	pg_psql "$1" "$2"
	;;
rmq-start) cmd_rmq_start "${1:-}" ;;
rmq-stop) cmd_rmq_stop "${1:-}" ;;
rmq-kill) cmd_rmq_kill "${1:-}" ;;
rmq-status) cmd_rmq_status ;;
rmq-wait-cluster) cmd_rmq_wait_cluster "$@" ;;
rmq-ctl)
	check_rmq_node "${1:-}"
	rmq_ctl "$@"
	;;
*) usage ;;
esac
