#!/usr/bin/env bash
# Starts (or stops) the servers of the high-availability tests on free loopback ports: a
# PostgreSQL primary with a synchronous standby, and a three-node RabbitMQ cluster. Start
# writes DIR/env (export lines) and the control commands in DIR/bin (tests/ha/ctl.sh).
# Usage: tests/ha/services.sh start DIR | stop DIR
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# port_busy, free_port, pg_bindir, rmq_bindir, show_log, now_ms, stop_epmd, die and usage: the
# same as for the single servers of the other suites.
services_name=ha/services.sh
# shellcheck source=tests/services.sh
. "$here/../services.sh"

[ $# -eq 2 ] || usage
cmd=$1
dir=$2

# ---- start ----

write_vars() {
	local pgbin rmqbin
	pgbin=$(pg_bindir)
	rmqbin=$(rmq_bindir)
	free_port
	pg1=$REPLY
	free_port
	pg2=$REPLY
	free_port
	amqp1=$REPLY
	free_port
	amqp2=$REPLY
	free_port
	amqp3=$REPLY
	free_port
	dist1=$REPLY
	free_port
	dist2=$REPLY
	free_port
	dist3=$REPLY
	# One epmd for the three nodes: a node finds another's distribution port by asking the
	# epmd of the other's host, at the port it uses itself, so nodes on one host share it.
	free_port
	epmd=$REPLY
	cat >"$dir/ha.vars" <<EOF
HA_PGBIN='$pgbin'
HA_RMQBIN='$rmqbin'
HA_PG_PORT1=$pg1
HA_PG_PORT2=$pg2
HA_AMQP_PORT1=$amqp1
HA_AMQP_PORT2=$amqp2
HA_AMQP_PORT3=$amqp3
HA_DIST_PORT1=$dist1
HA_DIST_PORT2=$dist2
HA_DIST_PORT3=$dist3
HA_EPMD_PORT=$epmd
HA_RMQ_NAME1='hatest1-$$@localhost'
HA_RMQ_NAME2='hatest2-$$@localhost'
HA_RMQ_NAME3='hatest3-$$@localhost'
EOF
}

write_env() {
	local b=$dir/bin u1 u2 u3
	u1="amqp://guest:guest@127.0.0.1:$amqp1"
	u2="amqp://guest:guest@127.0.0.1:$amqp2"
	u3="amqp://guest:guest@127.0.0.1:$amqp3"
	# RELAY_TEST_PG and RELAY_TEST_AMQP let tests/support/harness.h (and relays it starts)
	# work unchanged: the database through the failover-aware multi-host conninfo.
	cat >"$dir/env" <<EOF
export RELAY_TEST_DIR='$dir'
export RELAY_TEST_HA_DIR='$dir'
export RELAY_TEST_PG='host=127.0.0.1,127.0.0.1 port=$pg1,$pg2 user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=5'
export RELAY_TEST_HA_PG='host=127.0.0.1,127.0.0.1 port=$pg1,$pg2 user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=5'
export RELAY_TEST_HA_PG_URI='postgresql://postgres@127.0.0.1:$pg1,127.0.0.1:$pg2/postgres?target_session_attrs=read-write&connect_timeout=5'
export RELAY_TEST_HA_PG1='host=127.0.0.1 port=$pg1 user=postgres dbname=postgres connect_timeout=5'
export RELAY_TEST_HA_PG2='host=127.0.0.1 port=$pg2 user=postgres dbname=postgres connect_timeout=5'
export RELAY_TEST_HA_PG1_PORT=$pg1
export RELAY_TEST_HA_PG2_PORT=$pg2
export RELAY_TEST_HA_PG1_LOG='$dir/pg/node1/server.log'
export RELAY_TEST_HA_PG2_LOG='$dir/pg/node2/server.log'
export RELAY_TEST_HA_PG_PRIMARY='$b/ha-pg-primary'
export RELAY_TEST_HA_PG_KILL='$b/ha-pg-kill'
export RELAY_TEST_HA_PG_PROMOTE='$b/ha-pg-promote'
export RELAY_TEST_HA_PG_REJOIN='$b/ha-pg-rejoin'
export RELAY_TEST_HA_PG_SYNC='$b/ha-pg-sync'
export RELAY_TEST_AMQP='$u1'
export RELAY_TEST_HA_AMQP1='$u1'
export RELAY_TEST_HA_AMQP2='$u2'
export RELAY_TEST_HA_AMQP3='$u3'
export RELAY_TEST_HA_AMQP_ALL='$u1,$u2,$u3'
export RELAY_TEST_HA_AMQP1_PORT=$amqp1
export RELAY_TEST_HA_AMQP2_PORT=$amqp2
export RELAY_TEST_HA_AMQP3_PORT=$amqp3
export RELAY_TEST_HA_RABBITMQ_NODE1='hatest1-$$@localhost'
export RELAY_TEST_HA_RABBITMQ_NODE2='hatest2-$$@localhost'
export RELAY_TEST_HA_RABBITMQ_NODE3='hatest3-$$@localhost'
export RELAY_TEST_HA_RABBITMQ_START='$b/ha-rmq-start'
export RELAY_TEST_HA_RABBITMQ_STOP='$b/ha-rmq-stop'
export RELAY_TEST_HA_RABBITMQ_KILL='$b/ha-rmq-kill'
export RELAY_TEST_HA_RABBITMQ_STATUS='$b/ha-rmq-status'
export RELAY_TEST_HA_RABBITMQ_WAIT_CLUSTER='$b/ha-rmq-wait-cluster'
export RELAY_TEST_HA_RABBITMQ_CTL='$b/ha-rmq-ctl'
export RELAY_TEST_HA_RESTORE='$b/ha-restore'
export RELAY_TEST_HA_CTL='$b/ha-ctl'
EOF
}

install_ctl() {
	local c
	mkdir -p "$dir/bin"
	install -m 755 "$here/ctl.sh" "$dir/bin/ha-ctl"
	for c in pg-primary pg-kill pg-promote pg-rejoin pg-sync pg-start pg-stop pg-ctl pg-psql \
		rmq-start rmq-stop rmq-kill rmq-status rmq-wait-cluster rmq-ctl restore; do
		ln -sf ha-ctl "$dir/bin/ha-$c"
	done
}

# The primary comes from initdb; the standby is made by the same pg-rejoin that rebuilds a
# failed primary later, so the first standby and a rebuilt one are configured alike.
start_pg() {
	local pgdir=$dir/pg
	# shellcheck disable=SC1091
	. "$dir/ha.vars"
	mkdir -p "$pgdir/node1" "$pgdir/node2"
	# PostgreSQL refuses to run as root, so the clusters belong to the postgres user.
	chown postgres: "$pgdir" "$pgdir/node1" "$pgdir/node2"
	chmod 755 "$pgdir"
	touch "$pgdir/ctl.log" "$pgdir/basebackup.log"
	chown postgres: "$pgdir/ctl.log" "$pgdir/basebackup.log"
	if ! runuser -u postgres -- "$HA_PGBIN/initdb" -D "$pgdir/node1/data" -U postgres \
		--auth=trust -E UTF8 --locale=C.UTF-8 --no-sync >"$pgdir/initdb.log" 2>&1; then
		show_log "$pgdir/initdb.log"
		die "initdb failed"
	fi
	# Shared by both nodes (pg_basebackup copies this file); what differs per node is
	# appended by pg_node_conf in ctl.sh. fsync=off gives up safety against a power loss of
	# this machine only, which no test simulates: a killed server's writes are in the page
	# cache. synchronous_commit=on with a synchronous standby means a commit returns once
	# the standby has flushed its WAL (remote_flush). initdb's pg_hba.conf already trusts
	# replication connections from 127.0.0.1.
	cat >>"$pgdir/node1/data/postgresql.conf" <<EOF
max_connections = 200
fsync = off
synchronous_commit = on
wal_keep_size = '256MB'
log_line_prefix = '%m [%p] %q%a '
EOF
	cat >>"$pgdir/node1/data/postgresql.conf" <<EOF
# node 1 (written by tests/ha)
listen_addresses = '127.0.0.1'
port = $HA_PG_PORT1
unix_socket_directories = '$pgdir/node1'
cluster_name = 'node1'
EOF
	"$dir/bin/ha-pg-start" 1
	"$dir/bin/ha-pg-rejoin" 2
}

start_rmq() {
	local n d p2 p3 rc rdir=$dir/rmq
	# shellcheck disable=SC1091
	. "$dir/ha.vars"
	mkdir -p "$rdir/home"
	# One cookie for the three nodes and their CLI tools, in the HOME they all get
	# (RABBITMQ_ERLANG_COOKIE is deprecated for the CLI tools); Erlang refuses a cookie file
	# that others can read.
	head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$rdir/home/.erlang.cookie"
	[ -s "$rdir/home/.erlang.cookie" ] || die "could not make an Erlang cookie"
	chmod 400 "$rdir/home/.erlang.cookie"
	for n in 1 2 3; do
		d=$rdir/node$n
		mkdir -p "$d/mnesia" "$d/log"
		echo "[]." >"$d/enabled_plugins"
		# Nodes 2 and 3 name node 1 as their seed (classic_config): a blank node joins a
		# listed node that runs, so they join node 1 on their first boot, while node 1, with
		# no peer to look for, starts at once instead of retrying for five seconds. A node
		# that was a member rejoins by itself on a restart, whatever this says.
		{
			echo "loopback_users = none"
			echo "listeners.tcp.default = 127.0.0.1:$(eval echo "\$HA_AMQP_PORT$n")"
			if [ "$n" != 1 ]; then
				echo "cluster_formation.peer_discovery_backend = classic_config"
				echo "cluster_formation.classic_config.nodes.1 = $HA_RMQ_NAME1"
			fi
		} >"$d/rabbitmq.conf"
		# Everything the node and its CLI tools read comes from here, never from /etc; the
		# distribution port listens on loopback only, like everything else.
		cat >"$d/node.env" <<EOF
export HOME='$rdir/home'
export RABBITMQ_NODENAME='$(eval echo "\$HA_RMQ_NAME$n")'
export RABBITMQ_DIST_PORT=$(eval echo "\$HA_DIST_PORT$n")
export RABBITMQ_MNESIA_BASE='$d/mnesia'
export RABBITMQ_LOG_BASE='$d/log'
export RABBITMQ_ENABLED_PLUGINS_FILE='$d/enabled_plugins'
export RABBITMQ_CONFIG_FILE='$d/rabbitmq'
export RABBITMQ_ADVANCED_CONFIG_FILE='$d/advanced.config'
export RABBITMQ_CONF_ENV_FILE='$d/rabbitmq-env.conf'
export RABBITMQ_PID_FILE='$d/pid'
export ERL_EPMD_ADDRESS=127.0.0.1
export ERL_EPMD_PORT=$HA_EPMD_PORT
export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}'
EOF
	done
	"$dir/bin/ha-rmq-start" 1
	# Nodes 2 and 3 boot side by side: each spends seconds waiting on its own start-up.
	"$dir/bin/ha-rmq-start" 2 &
	p2=$!
	"$dir/bin/ha-rmq-start" 3 &
	p3=$!
	rc=0
	wait $p2 || rc=1
	wait $p3 || rc=1
	[ $rc -eq 0 ] || die "RabbitMQ nodes 2 and 3 did not both start"
	"$dir/bin/ha-rmq-wait-cluster" 1 2 3
}

# Runs "$@" and writes its elapsed time in ms to DIR/<$1>.ms when it succeeded.
timed() {
	local t0
	t0=$(now_ms)
	"$@"
	echo $(($(now_ms) - t0)) >"$dir/$1.ms"
}

do_start() {
	local pg_job rmq_job pg_rc=0 rmq_rc=0 t0
	[ "$(id -u)" -eq 0 ] || die "must run as root (PostgreSQL is run as the postgres user)"
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	# postgres must be able to reach its cluster directories through DIR and its parents.
	chmod 755 "$dir"
	# Written first, so that stop can clean up after a start that failed half way.
	write_vars
	write_env
	install_ctl
	t0=$(now_ms)
	# The pair and the cluster start side by side: the first RabbitMQ node's boot is mostly
	# waiting. Both are waited for, even when one fails, so that no start goes on behind a
	# stop that follows.
	(timed start_pg) &
	pg_job=$!
	(timed start_rmq) &
	rmq_job=$!
	wait "$pg_job" || pg_rc=$?
	wait "$rmq_job" || rmq_rc=$?
	[ "$pg_rc" -eq 0 ] || die "the PostgreSQL pair did not start"
	[ "$rmq_rc" -eq 0 ] || die "the RabbitMQ cluster did not start"
	echo "ha/services.sh: PostgreSQL primary 127.0.0.1:$pg1 + synchronous standby" \
		"127.0.0.1:$pg2 in $(cat "$dir/start_pg.ms") ms; RabbitMQ cluster on" \
		"127.0.0.1:$amqp1,$amqp2,$amqp3 in $(cat "$dir/start_rmq.ms") ms; both in" \
		"$(($(now_ms) - t0)) ms; env in $dir/env"
}

# ---- stop ----

# True when pid $1 is a server started from DIR: a postmaster or backend, or an Erlang VM,
# whose command line names DIR (its data or mnesia directory). Guards every kill below, so a
# recycled pid of another run or person is never touched.
is_ours() {
	local exe
	exe=$(readlink "/proc/$1/exe" 2>/dev/null || true)
	case ${exe##*/} in
	postgres | beam.smp) ;;
	*) return 1 ;;
	esac
	grep -qF -- "$dir/" <<<"$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null)"
}

# Servers of DIR still alive, whether or not a pid file names them (a start interrupted early).
leftover_pids() {
	local p
	for p in /proc/[0-9]*; do
		if is_ours "${p#/proc/}"; then
			echo "${p#/proc/}"
		fi
	done
}

do_stop() {
	local rc=0 n pid f pids shmid
	[ -d "$dir" ] || return 0
	dir=$(cd "$dir" && pwd)
	# Each step runs even when an earlier one failed: a half-started set must not leak. The
	# data is thrown away, so nothing needs an orderly shutdown.
	set +e
	for n in 1 2; do
		f=$dir/pg/node$n/data/postmaster.pid
		[ -f "$f" ] || continue
		pid=$(head -n 1 "$f" 2>/dev/null || true)
		if [ -n "$pid" ] && is_ours "$pid"; then
			"$dir/bin/ha-pg-ctl" "$n" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
			if is_ours "$pid"; then
				kill -KILL -- "-$pid" 2>/dev/null || true
			fi
		fi
		# A postmaster killed outright leaves its SysV segment behind (pg_ctl stop removes
		# the pid file, and with it this step).
		shmid=$(sed -n 7p "$f" 2>/dev/null | awk '{print $2}')
		[ -z "$shmid" ] || ipcrm -m "$shmid" 2>/dev/null
	done
	for n in 1 2 3; do
		f=$dir/rmq/node$n/pid
		[ -f "$f" ] || continue
		pid=$(cat "$f" 2>/dev/null || true)
		if [ -n "$pid" ] && is_ours "$pid"; then
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	if [ -f "$dir/ha.vars" ]; then
		# shellcheck disable=SC1091
	. "$dir/ha.vars"
		stop_epmd "$HA_EPMD_PORT"
	fi
	# A start interrupted before a pid file was written leaves processes no pid file names.
	pids=$(leftover_pids)
	if [ -n "$pids" ]; then
		# shellcheck disable=SC2086
		kill -KILL $pids 2>/dev/null || true
		sleep 0.5
	fi
	pids=$(leftover_pids)
	if [ -n "$pids" ]; then
		echo "ha/services.sh: processes still running: $pids" >&2
		rc=1
	fi
	rm -rf "$dir"
	return $rc
}

case $cmd in
start) do_start ;;
stop) do_stop ;;
*) usage ;;
esac
