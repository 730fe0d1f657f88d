#!/usr/bin/env bash
# Starts (or stops) one throwaway PostgreSQL and one RabbitMQ for the integration and fault
# tests, on free loopback ports, so they can run beside any other server on the machine.
# Usage: tests/services.sh start DIR | stop DIR   (start writes DIR/env with export lines)
# Sourced (as tests/ha/services.sh does), it only defines its functions: port_busy, free_port,
# pg_bindir, rmq_bindir, show_log, now_ms, stop_epmd, die and usage.
set -euo pipefail

# True when something accepts connections on 127.0.0.1:$1. ss sees listeners of every user;
# the /dev/tcp probe is the fallback on systems without iproute2.
port_busy() {
	local p=$1
	if command -v ss >/dev/null 2>&1; then
		[ -n "$(ss -Htan "sport = :$p" 2>/dev/null)" ] && return 0
	fi
	(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && return 0
	return 1
}

# A random free port into $REPLY (a variable, not output: a command substitution would run in
# a subshell and forget which ports were already handed out), below the kernel's ephemeral
# range: a port in that range can be taken as the local end of any outgoing connection (a CLI
# tool's, a test's) between being picked and being bound. Also p + 10000 stays below it and
# free, because rabbitmqctl takes its own distribution port at RABBITMQ_DIST_PORT + 10000 and
# upwards. With the usual 32768 that is 12767..22767.
taken_ports=""
ephemeral_low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true)
port_hi=$((${ephemeral_low:-32768} - 10001))
port_lo=$((port_hi - 10000))
free_port() {
	local p _
	[ "$port_lo" -ge 1024 ] || die "the ephemeral port range starts too low to pick ports below it"
	for _ in $(seq 1 200); do
		p=$((port_lo + (RANDOM * 32768 + RANDOM) % (port_hi - port_lo + 1)))
		case " $taken_ports " in *" $p "*) continue ;; esac
		if ! port_busy "$p" && ! port_busy $((p + 10000)); then
			taken_ports="$taken_ports $p"
			REPLY=$p
			return 0
		fi
	done
	die "could not find a free loopback port"
}

now_ms() {
	date +%s%3N
}

pg_bindir() {
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
	[ -n "$d" ] && [ -x "$d/pg_ctl" ] || die "PostgreSQL server binaries not found under /usr/lib/postgresql"
	echo "$d"
}

rmq_bindir() {
	[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || die "rabbitmq-server not found in /usr/lib/rabbitmq/bin"
	echo /usr/lib/rabbitmq/bin
}

show_log() {
	local f
	for f in "$@"; do
		[ -f "$f" ] || continue
		echo "---- last lines of $f ----" >&2
		tail -n 40 "$f" >&2
	done
}

# Test PKI under DIR/tls: a CA, a server certificate for localhost and 127.0.0.1, a client
# certificate from the same CA, and a second, unrelated CA that must never verify the server.
# P-256 keys keep generation fast; 30 days is longer than any test run.
make_tls() {
	local t=$dir/tls
	mkdir -p "$t"
	chmod 755 "$t"
	# errexit does not hold inside a subshell that is the left side of ||, so the last command
	# checks the result: both leaf certificates must verify against the test CA.
	(
		cd "$t" || exit 1
		umask 077
		for ca in ca wrong-ca; do
			openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
				-nodes -keyout "$ca.key" -out "$ca.pem" -days 30 \
				-subj "/CN=outbox-relay test $ca" \
				-addext "basicConstraints=critical,CA:TRUE" \
				-addext "keyUsage=critical,keyCertSign,cRLSign"
		done
		{
			echo 'basicConstraints=CA:FALSE'
			echo 'keyUsage=critical,digitalSignature,keyEncipherment'
			echo 'extendedKeyUsage=serverAuth'
			echo 'subjectAltName=DNS:localhost,IP:127.0.0.1'
		} >server.ext
		printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n' >client.ext
		printf 'extendedKeyUsage=clientAuth\n' >>client.ext
		for leaf in server client; do
			openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
				-keyout "$leaf.key" -out "$leaf.csr" -subj "/CN=localhost"
			openssl x509 -req -in "$leaf.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
				-days 30 -extfile "$leaf.ext" -out "$leaf.pem"
		done
		rm -f ./*.csr ./*.ext ca.srl
		# Certificates are public; the private keys stay readable by root only.
		chmod 644 ./*.pem
		[ -s wrong-ca.pem ] && openssl verify -CAfile ca.pem server.pem client.pem
	) >"$dir/tls.log" 2>&1 || {
		show_log "$dir/tls.log"
		die "could not create the test certificates"
	}
}

# start_pg BINDIR PORT [NAME]: a cluster under DIR/NAME (pg by default) with its control
# wrapper DIR/bin/NAME_ctl. The second one (pg2) is for the tests that need a database on
# another server (tests/fault/test_sources.c).
start_pg() {
	local bindir=$1 port=$2 name=${3:-pg}
	local pgdir=$dir/$name ctl=$dir/bin/${3:-pg}_ctl
	mkdir -p "$pgdir"
	# PostgreSQL refuses to run as root, so the cluster belongs to the postgres user.
	chown postgres: "$pgdir"
	chmod 700 "$pgdir"
	if ! runuser -u postgres -- "$bindir/initdb" -D "$pgdir/data" -U postgres --auth=trust \
		-E UTF8 --locale=C.UTF-8 --no-sync >"$pgdir/initdb.log" 2>&1; then
		show_log "$pgdir/initdb.log"
		die "initdb failed"
	fi
	# Settings go into the cluster's own file so that a restart by the fault tests keeps them.
	# fsync=off only gives up crash safety against a power loss of this machine, which no test
	# simulates; it makes the suite several times faster on slow disks.
	cat >>"$pgdir/data/postgresql.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$pgdir'
max_connections = 300
fsync = off
synchronous_commit = on
full_page_writes = off
log_min_messages = warning
ssl = on
ssl_cert_file = '$dir/tls/server.pem'
ssl_key_file = '$pgdir/server.key'
ssl_ca_file = '$dir/tls/ca.pem'
EOF
	# PostgreSQL refuses a key that others can read; its own copy belongs to postgres, 0600.
	install -o postgres -g postgres -m 600 "$dir/tls/server.key" "$pgdir/server.key"
	# Wrapper used by restart tests; -l keeps the server off the caller's stdout, which
	# would otherwise keep a test's pipe open for the postmaster's whole life.
	cat >"$ctl" <<EOF
#!/bin/sh
exec runuser -u postgres -- "$bindir/pg_ctl" -D "$pgdir/data" -l "$pgdir/server.log" "\$@"
EOF
	chmod 755 "$ctl"
	if ! "$ctl" -w -t 60 start >"$pgdir/pg_ctl.log" 2>&1; then
		show_log "$pgdir/pg_ctl.log" "$pgdir/server.log"
		die "PostgreSQL did not start on port $port"
	fi
}

start_rmq() {
	local bindir=$1 amqp_port=$2 dist_port=$3 epmd_port=$4 amqps_port=$5 rdir=$dir/rmq
	local node="relaytest-$$@localhost"
	mkdir -p "$rdir/mnesia" "$rdir/log"
	echo "[]." >"$rdir/enabled_plugins"
	# The TLS listener asks for a client certificate and checks any it gets against the test
	# CA, but also lets clients in without one.
	cat >"$rdir/rabbitmq.conf" <<EOF
loopback_users = none
listeners.ssl.default = 127.0.0.1:$amqps_port
ssl_options.cacertfile = $dir/tls/ca.pem
ssl_options.certfile = $dir/tls/server.pem
ssl_options.keyfile = $dir/tls/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
# Small enough that a test can exceed it with a 5 MiB body (RabbitMQ's default is 128 MiB).
max_message_size = 4194304
EOF
	# Everything the node and its CLI tools read comes from this file, so the start, stop and
	# ctl wrappers all talk to this node and its own epmd, never to another one.
	cat >"$rdir/node.env" <<EOF
export HOME='$rdir'
export RABBITMQ_NODENAME='$node'
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT=$amqp_port
export RABBITMQ_DIST_PORT=$dist_port
export RABBITMQ_MNESIA_BASE='$rdir/mnesia'
export RABBITMQ_LOG_BASE='$rdir/log'
export RABBITMQ_ENABLED_PLUGINS_FILE='$rdir/enabled_plugins'
export RABBITMQ_CONFIG_FILE='$rdir/rabbitmq'
export RABBITMQ_PID_FILE='$rdir/pid'
export ERL_EPMD_ADDRESS=127.0.0.1
export ERL_EPMD_PORT=$epmd_port
EOF
	cat >"$dir/bin/rabbitmqctl" <<EOF
#!/bin/sh
. '$rdir/node.env'
exec "$bindir/rabbitmqctl" -n '$node' "\$@"
EOF
	# Starts the node detached from the caller (own session, no inherited pipes) and waits
	# until it accepts work; a stop leaves the pid file behind, so it is removed first.
	cat >"$dir/bin/rabbitmq-start" <<EOF
#!/bin/sh
. '$rdir/node.env'
rm -f '$rdir/pid'
setsid "$bindir/rabbitmq-server" >>'$rdir/server.out' 2>&1 </dev/null &
exec "$bindir/rabbitmqctl" -n '$node' wait --timeout 90 '$rdir/pid' >>'$rdir/wait.log' 2>&1
EOF
	# Stops the whole node (not only the app) and waits until the process is gone.
	cat >"$dir/bin/rabbitmq-stop" <<EOF
#!/bin/sh
. '$rdir/node.env'
exec "$bindir/rabbitmqctl" -n '$node' shutdown >>'$rdir/wait.log' 2>&1
EOF
	chmod 755 "$dir/bin/rabbitmqctl" "$dir/bin/rabbitmq-start" "$dir/bin/rabbitmq-stop"
	if ! "$dir/bin/rabbitmq-start"; then
		show_log "$rdir/server.out" "$rdir/wait.log" "$rdir/log/$node.log"
		die "RabbitMQ did not start on port $amqp_port"
	fi
}

do_start() {
	local pgbin rbin pg_port amqp_port dist_port epmd_port amqps_port pg2_port
	pgbin=$(pg_bindir)
	rbin=$(rmq_bindir)
	[ "$(id -u)" -eq 0 ] || die "must run as root (PostgreSQL is run as the postgres user)"
	mkdir -p "$dir/bin"
	dir=$(cd "$dir" && pwd)
	# postgres must be able to reach its cluster directory through DIR and its parents.
	chmod 755 "$dir"
	free_port
	pg_port=$REPLY
	free_port
	amqp_port=$REPLY
	free_port
	dist_port=$REPLY
	free_port
	epmd_port=$REPLY
	free_port
	amqps_port=$REPLY
	free_port
	pg2_port=$REPLY
	# Written first, so that stop can clean up after a start that failed half way.
	write_env "$pg_port" "$amqp_port" "$dist_port" "$epmd_port" "$amqps_port" "$pg2_port"
	make_tls
	start_pg "$pgbin" "$pg_port"
	start_pg "$pgbin" "$pg2_port" pg2
	start_rmq "$rbin" "$amqp_port" "$dist_port" "$epmd_port" "$amqps_port"
	echo "services.sh: PostgreSQL on 127.0.0.1:$pg_port (TLS on) and a second on $pg2_port, RabbitMQ on" \
		"127.0.0.1:$amqp_port (TLS on $amqps_port); env in $dir/env"
}

write_env() {
	cat >"$dir/env" <<EOF
export RELAY_TEST_DIR='$dir'
export RELAY_TEST_PG='host=127.0.0.1 port=$1 user=postgres dbname=postgres'
export RELAY_TEST_PG_PORT=$1
export RELAY_TEST_PG_DATA='$dir/pg/data'
export RELAY_TEST_PG_LOG='$dir/pg/server.log'
export RELAY_TEST_PG_CTL='$dir/bin/pg_ctl'
export RELAY_TEST_AMQP='amqp://guest:guest@127.0.0.1:$2'
export RELAY_TEST_AMQP_PORT=$2
export RELAY_TEST_RABBITMQ_DIST_PORT=$3
export RELAY_TEST_RABBITMQ_EPMD_PORT=$4
export RELAY_TEST_RABBITMQ_NODE='relaytest-$$@localhost'
export RELAY_TEST_RABBITMQ_DIR='$dir/rmq'
export RELAY_TEST_RABBITMQCTL='$dir/bin/rabbitmqctl'
export RELAY_TEST_RABBITMQ_START='$dir/bin/rabbitmq-start'
export RELAY_TEST_RABBITMQ_STOP='$dir/bin/rabbitmq-stop'
export RELAY_TEST_AMQPS='amqps://guest:guest@localhost:$5'
export RELAY_TEST_AMQPS_PORT=$5
export RELAY_TEST_TLS_DIR='$dir/tls'
export RELAY_TEST_PG2='host=127.0.0.1 port=$6 user=postgres dbname=postgres'
export RELAY_TEST_PG2_PORT=$6
export RELAY_TEST_PG2_CTL='$dir/bin/pg2_ctl'
EOF
}

# Stops the epmd listening on port $1. epmd -kill refuses while a node is still registered;
# then the process listening on that port (and only that one) is signalled directly.
stop_epmd() {
	local port=$1 pids
	ERL_EPMD_PORT=$port epmd -port "$port" -kill >/dev/null 2>&1 || true
	sleep 0.2
	if command -v ss >/dev/null 2>&1; then
		pids=$(ss -Htlnp "sport = :$port" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u || true)
		if [ -n "$pids" ]; then
			# shellcheck disable=SC2086
			kill $pids 2>/dev/null || true
		fi
	fi
}

do_stop() {
	local rc=0 pid
	[ -d "$dir" ] || return 0
	dir=$(cd "$dir" && pwd)
	# Each step runs even when an earlier one failed: a half-started set must not leak servers.
	if [ -f "$dir/pg/data/postmaster.pid" ]; then
		"$dir/bin/pg_ctl" -m immediate -w -t 30 stop >/dev/null 2>&1 || rc=1
	fi
	if [ -f "$dir/pg2/data/postmaster.pid" ]; then
		"$dir/bin/pg2_ctl" -m immediate -w -t 30 stop >/dev/null 2>&1 || rc=1
	fi
	if [ -f "$dir/rmq/node.env" ]; then
		if [ -f "$dir/rmq/pid" ]; then
			pid=$(cat "$dir/rmq/pid" 2>/dev/null || true)
			"$dir/bin/rabbitmq-stop" >/dev/null 2>&1 || true
			if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
				kill -9 "$pid" 2>/dev/null || true
			fi
		fi
		# The node's own epmd outlives the node; stop only the one on this node's port.
		stop_epmd "$(. "$dir/rmq/node.env" && echo "$ERL_EPMD_PORT")"
	fi
	rm -rf "$dir"
	return $rc
}

# Messages carry the name of the script that runs (a caller that sources this file sets
# services_name first).
die() {
	echo "${services_name:-services.sh}: $*" >&2
	exit 1
}

usage() {
	echo "usage: $0 start|stop DIR" >&2
	exit 2
}

# Sourced: the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

[ $# -eq 2 ] || usage
cmd=$1
dir=$2
case $cmd in
start) do_start ;;
stop) do_stop ;;
*) usage ;;
esac
