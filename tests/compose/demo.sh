# shellcheck shell=bash
# docker/compose.yml, brought up and checked as the README tells a user to. Sourced by
# tests/compose/run (uses its helpers and variables); defines test_demo.

# Compose on the demo file, from the repository root, as the README runs it. The project is
# named after the file's directory: docker.
dc() {
	(cd "$root" && "${compose_cmd[@]}" -f docker/compose.yml "$@")
}

# The container of a service of a project (docker ps, so that Compose v1 and v2 agree).
svc_cid() { # PROJECT SERVICE
	"$DOCKER" ps -aq --filter "label=com.docker.compose.project=$1" \
		--filter "label=com.docker.compose.service=$2" | awk 'NR == 1'
}

# SQL on the demo's database, as the image's superuser over the local socket.
psql_app() {
	"$DOCKER" exec "$(svc_cid docker postgres)" psql -U outbox -d app -AtXq -v ON_ERROR_STOP=1 -c "$1"
}

# The message ids the demo consumer printed, one a line, in arrival order.
received_ids() {
	"$DOCKER" logs "$(svc_cid docker consumer)" 2>/dev/null | awk '$1 == "received" { print $2 }'
}

# Reads every line before it answers (no grep -q or -m in a pipe: under pipefail, a writer cut
# off by a reader that stopped early fails the pipe, and set -e ends the test without a word).
consumer_has() {
	received_ids | ID=$1 awk '$0 == ENVIRON["ID"] { found = 1 } END { exit !found }'
}

consumer_has_any() {
	[ -n "$(received_ids)" ]
}

relay_log_has() {
	"$DOCKER" logs "$(svc_cid docker relay)" 2>&1 | S=$1 awk 'index($0, ENVIRON["S"]) { found = 1 } END { exit !found }'
}

all_published() {
	[ "$(psql_app 'SELECT count(*) FROM outbox WHERE published_at IS NULL')" = 0 ]
}

# Every id of the outbox is among the consumer's.
all_received() {
	psql_app 'SELECT id FROM outbox' | sort >"$work/db-ids"
	received_ids | sort -u >"$work/received-unique"
	[ -z "$(comm -23 "$work/db-ids" "$work/received-unique")" ]
}

# probe NAME T0_MS: commits the row probe-NAME (again until it is in: the database may be
# restarting; ON CONFLICT makes a retry harmless), waits for it at the consumer, and prints
# the seconds from T0_MS: the time until a new row goes through again.
probe() {
	local id=probe-$1
	wait_until "row $id committed" 180 psql_app \
		"INSERT INTO outbox (id, exchange_name, routing_key, body) VALUES ('$id', 'amq.topic', 'demo.probe', '{}') ON CONFLICT (id) DO NOTHING"
	wait_until "row $id at the consumer" 180 consumer_has "$id"
	secs "$2" "$(now_ms)"
}

restart_count() {
	"$DOCKER" inspect -f '{{.RestartCount}}' "$1"
}

test_demo() {
	local t0 t1 relay migrate mig_end relay_start pgpw amqppw log r_pg r_rmq r_kill r_kill_healthy
	local restarts total unique lost extra dups line status check rc stop_s left
	projects+=("-f docker/compose.yml")
	say "== docker/compose.yml (${compose_cmd[*]}) =="

	t0=$(now_ms)
	dc up -d >"$work/demo-up.log" 2>&1 || {
		cat "$work/demo-up.log" >&2
		die "docker/compose.yml: up -d"
	}
	relay=$(svc_cid docker relay)
	wait_until "the relay's HEALTHCHECK to say healthy" 240 is_healthy "$relay"
	t1=$(now_ms)
	say "stack up: $(secs "$t0" "$t1") s from up -d until the relay's HEALTHCHECK said healthy"

	migrate=$(svc_cid docker migrate)
	[ "$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$migrate")" = 0 ] || die "migrate did not exit 0"
	mig_end=$(container_time_ms "$migrate" '{{.State.FinishedAt}}')
	relay_start=$(container_time_ms "$relay" '{{.State.StartedAt}}')
	[ "$mig_end" -le "$relay_start" ] || die "the relay started before migrate ended"
	say "migrate exited 0, $(secs "$mig_end" "$relay_start") s before the relay started"
	[ "$("$DOCKER" inspect -f '{{.HostConfig.ReadonlyRootfs}} {{.Config.User}}' "$relay")" = "true 10001:10001" ] ||
		die "the relay's root filesystem is not read-only or it does not run as 10001"
	curl -fsS "http://127.0.0.1:${RELAY_HTTP_PORT:-8787}/readyz" >/dev/null ||
		die "the relay's published /readyz does not answer 200"

	wait_until "the first message at the consumer" 120 consumer_has_any
	wait_until "a summary line in the relay's log" 120 relay_log_has 'msg="summary"'
	log=$(dc logs --no-color relay)
	grep -qF 'msg="starting outbox-relay"' <<<"$log" || die "logs relay: no start line"
	grep -qF 'msg="summary" published=' <<<"$log" || die "logs relay: no summary line"
	pgpw=$(cat "$root/docker/secrets/postgres_password.txt")
	amqppw=$(sed 's|^amqp://[^:]*:\([^@]*\)@.*|\1|' "$root/docker/secrets/amqp_url.txt")
	if grep -qF -e "$pgpw" -e "$amqppw" <<<"$log"; then
		die "logs relay shows a password"
	fi
	say "logs relay: start line, summary line, no password"

	# Each event under the producer; the time is until a row committed after it arrives.
	t0=$(now_ms)
	dc restart postgres >/dev/null 2>&1 || die "restart postgres"
	r_pg=$(probe restart-postgres "$t0") || exit 1
	say "restart postgres: a new row through after $r_pg s"
	t0=$(now_ms)
	dc restart rabbitmq >/dev/null 2>&1 || die "restart rabbitmq"
	r_rmq=$(probe restart-rabbitmq "$t0") || exit 1
	say "restart rabbitmq: a new row through after $r_rmq s"
	# A crash: SIGKILL to the relay's process from outside. `docker kill` would not do: the
	# engine counts it as a manual stop, after which no restart policy restarts a container.
	restarts=$(restart_count "$relay")
	t0=$(now_ms)
	kill -KILL "$("$DOCKER" inspect -f '{{.State.Pid}}' "$relay")"
	r_kill=$(probe kill-relay "$t0") || exit 1
	[ "$(restart_count "$relay")" -gt "$restarts" ] || die "the relay was not restarted by its policy"
	wait_until "the relay healthy again after SIGKILL" 180 is_healthy "$relay"
	r_kill_healthy=$(secs "$t0" "$(now_ms)")
	say "relay's process SIGKILLed: restarted by its policy, a new row through after $r_kill s, healthy after $r_kill_healthy s"

	# The count: every row the producer and the probes committed, against what the consumer
	# printed.
	dc stop producer >/dev/null 2>&1
	wait_until "every outbox row published" 180 all_published
	try_until 180 all_received || true
	total=$(wc -l <"$work/db-ids")
	received_ids >"$work/received"
	unique=$(wc -l <"$work/received-unique")
	lost=$(comm -23 "$work/db-ids" "$work/received-unique" | wc -l)
	extra=$(comm -13 "$work/db-ids" "$work/received-unique" | wc -l)
	dups=$(($(wc -l <"$work/received") - unique))
	say "demo messages: committed=$total received=$unique lost=$lost duplicates=$dups unknown=$extra (restart postgres, restart rabbitmq, SIGKILL relay)"
	[ "$lost" -eq 0 ] && [ "$extra" -eq 0 ] || die "messages lost or unknown"

	# Bad input 1: OUTBOX_DATABASE_URL_FILE names a file that is not there.
	(cd "$root" && "${compose_cmd[@]}" -f docker/compose.yml -f tests/compose/bad-database-url-file.yml \
		up -d --no-deps relay) >/dev/null 2>&1 || die "up with a wrong OUTBOX_DATABASE_URL_FILE"
	relay=$(svc_cid docker relay)
	wait_until "the relay's log to name the missing file" 60 relay_log_has 'could not read OUTBOX_DATABASE_URL_FILE'
	wait_until "the relay's health to say unhealthy" 120 is_unhealthy "$relay"
	line=$(dc logs --no-color relay | awk 'index($0, "OUTBOX_DATABASE_URL_FILE") && !n++' | sed 's/^[^|]*| //')
	status=$("$DOCKER" inspect -f '{{.State.Status}} exit={{.State.ExitCode}} health={{.State.Health.Status}}' "$relay")
	say "bad input, wrong OUTBOX_DATABASE_URL_FILE: $status; logs relay: $line"

	# Bad input 2: the broker cannot be reached (stopped: its name resolves to nothing).
	dc stop rabbitmq >/dev/null 2>&1
	dc up -d --no-deps --force-recreate relay >/dev/null 2>&1 || die "up relay without its broker"
	relay=$(svc_cid docker relay)
	wait_until "the relay's log to say it cannot reach the broker" 60 relay_log_has 'msg="could not connect, will retry" to=broker'
	wait_until "the relay's health to say unhealthy" 150 is_unhealthy "$relay"
	line=$(dc logs --no-color relay | grep -F 'could not connect' | sed 's/^[^|]*| //')
	[ "$(grep -c . <<<"$line")" -eq 1 ] || die "more than one line for the unreachable broker: $line"
	status=$("$DOCKER" inspect -f '{{.State.Status}} health={{.State.Health.Status}}' "$relay")
	check=$("$DOCKER" inspect -f '{{range .State.Health.Log}}{{.Output}}{{end}}' "$relay" | grep -v '^$' | tail -n 1)
	say "bad input, unreachable broker: $status, last check: $check"
	say "bad input, unreachable broker: logs relay: $line"
	t0=$(now_ms)
	dc start rabbitmq >/dev/null 2>&1 || die "start rabbitmq"
	wait_until "the relay healthy once the broker is back" 240 is_healthy "$relay"
	say "broker back: the relay healthy again after $(secs "$t0" "$(now_ms)") s"

	# docker compose stop relay: SIGTERM, an orderly stop, exit 0 inside stop_grace_period.
	t0=$(now_ms)
	dc stop relay >/dev/null 2>&1 || die "stop relay"
	stop_s=$(secs "$t0" "$(now_ms)")
	rc=$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$relay")
	[ "$rc" = 0 ] || die "stop relay: exit code $rc (stop_grace_period 20s)"
	relay_log_has 'msg="stopped"' || die "stop relay: no 'stopped' line"
	say "stop relay: exit 0 after $stop_s s (grace period 20 s)"

	dc down -v >/dev/null 2>&1 || die "down -v"
	left=$({
		"$DOCKER" ps -aq --filter label=com.docker.compose.project=docker
		"$DOCKER" volume ls -q --filter label=com.docker.compose.project=docker
		"$DOCKER" network ls -q --filter label=com.docker.compose.project=docker
		"$DOCKER" volume ls -q --filter dangling=true
	} | wc -l)
	[ "$left" -eq 0 ] || die "down -v left $left containers, volumes or networks"
	say "down -v: no container, volume or network left"
}
