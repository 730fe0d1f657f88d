# shellcheck shell=bash
# Helpers of tests/compose/run, sourced: a private Docker engine, the compose command, waiting
# on conditions and timing. Expects $work (the run's temporary directory) and $root.

DOCKER=docker
# The engine Debian 12 ships (20.10) and its client; a newer client found first in PATH would
# still work (it negotiates the API down), but the one from the same package is the sure one.
[ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker

say() {
	echo "compose-test: $*"
}

die() {
	echo "compose-test: FAILED: $*" >&2
	exit 1
}

now_ms() {
	date +%s%3N
}

# Seconds with one decimal between two now_ms readings.
secs() {
	awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1000 }'
}

# try_until TIMEOUT_S COMMAND...: runs COMMAND every half second until it succeeds (0) or
# TIMEOUT_S seconds have passed (1).
try_until() {
	local deadline=$(($(date +%s) + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$deadline" ] || return 1
		sleep 0.5
	done
}

# wait_until DESCRIPTION TIMEOUT_S COMMAND...: try_until, dying with DESCRIPTION on timeout.
wait_until() {
	local what=$1
	shift
	try_until "$@" || die "waited ${1}s for: $what"
}

# Starts dockerd with all of its state under $work: its own data root, exec root, pid file
# and socket, never the system's. No default bridge and no iptables rules or forwarding:
# the host's firewall and sysctls stay as they are, and the stack's networks reach nothing
# outside the machine. Image builds use --network host.
engine_start() {
	mkdir -p "$work/data" "$work/exec"
	dockerd --storage-driver=vfs --data-root "$work/data" --exec-root "$work/exec" \
		--pidfile "$work/dockerd.pid" -H "unix://$work/docker.sock" \
		--bridge=none --iptables=false --ip-forward=false --ip-masq=false \
		>"$work/dockerd.log" 2>&1 &
	engine_pid=$!
	export DOCKER_HOST=unix://$work/docker.sock
	wait_until "dockerd to answer on $DOCKER_HOST" 60 "$DOCKER" version
	say "engine: dockerd $("$DOCKER" version --format '{{.Server.Version}} (API {{.Server.APIVersion}})'), client $DOCKER $("$DOCKER" version --format '{{.Client.Version}}')"
}

# Stops dockerd (its containers with it), then removes its state. Safe to call twice.
engine_stop() {

	[ -n "${engine_pid:-}" ] || return 0
	if kill -0 "$engine_pid" 2>/dev/null; then
		kill "$engine_pid" 2>/dev/null || true
		for _ in $(seq 120); do
			kill -0 "$engine_pid" 2>/dev/null || break
			sleep 0.5
		done
		kill -0 "$engine_pid" 2>/dev/null && kill -9 "$engine_pid" 2>/dev/null
	fi
	wait "$engine_pid" 2>/dev/null || true
	engine_pid=
	# Anything the engine left mounted under its directories (network namespaces).
	awk -v w="$work" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r |
		while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

# The compose command: Compose v2 (`docker compose`) when the client has it, else
# docker-compose 1.29.
if "$DOCKER" compose version >/dev/null 2>&1; then
	compose_cmd=("$DOCKER" compose)
else
	compose_cmd=(docker-compose)
fi

# Health of a container: healthy, unhealthy, starting, or "none".
health_of() {
	"$DOCKER" inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$1"
}

is_healthy() {
	[ "$(health_of "$1")" = healthy ]
}

is_unhealthy() {
	[ "$(health_of "$1")" = unhealthy ]
}

# A container time (RFC 3339, nanoseconds) in milliseconds since the epoch.
container_time_ms() {
	date -d "$("$DOCKER" inspect -f "$2" "$1")" +%s%3N
}

image_mb() {
	"$DOCKER" image inspect -f '{{.Size}}' "$1" | awk '{ printf "%.1f", $1 / 1000000 }'
}
