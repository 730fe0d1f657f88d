# shellcheck shell=bash
# docker/compose.ha.yml brought up as its header says; the database and then the broker node
# the relay uses lost under the demo producer. Sourced by tests/compose/run; defines test_ha.

ha_project=outbox-relay-ha

dch() {
	(cd "$root" && "${compose_cmd[@]}" -p "$ha_project" -f docker/compose.ha.yml "$@")
}

psql_ha() {
	"$DOCKER" exec "$(svc_cid "$ha_project" postgres)" psql -U outbox -d app -AtXq -v ON_ERROR_STOP=1 -c "$1"
}

ha_received_ids() {
	"$DOCKER" logs "$(svc_cid "$ha_project" consumer)" 2>/dev/null | awk '$1 == "received" { print $2 }'
}

ha_consumer_has() { # reads every line: see consumer_has (demo.sh)
	ha_received_ids | ID=$1 awk '$0 == ENVIRON["ID"] { found = 1 } END { exit !found }'
}

ha_consumer_has_any() {
	[ -n "$(ha_received_ids)" ]
}

ha_all_published() {
	[ "$(psql_ha 'SELECT count(*) FROM outbox WHERE published_at IS NULL')" = 0 ]
}

ha_all_received() {
	psql_ha 'SELECT id FROM outbox' | sort >"$work/ha-db-ids"
	ha_received_ids | sort -u >"$work/ha-received-unique"
	[ -z "$(comm -23 "$work/ha-db-ids" "$work/ha-received-unique")" ]
}

# The broker node /readyz names (rabbitmq1..3).
ha_node() {
	curl -fsS "http://127.0.0.1:${RELAY_HTTP_PORT:-8787}/readyz" | sed -n 's/^broker \(rabbitmq[0-9]\):.*/\1/p'
}

ha_node_is_not() {
	local n
	n=$(ha_node)
	[ -n "$n" ] && [ "$n" != "$1" ]
}

# ha_probe NAME T0_MS: like probe in demo.sh, on this stack.
ha_probe() {
	local id=probe-$1
	wait_until "row $id committed" 180 psql_ha \
		"INSERT INTO outbox (id, exchange_name, routing_key, body) VALUES ('$id', 'amq.topic', 'demo.probe', '{}') ON CONFLICT (id) DO NOTHING"
	wait_until "row $id at the consumer" 180 ha_consumer_has "$id"
	secs "$2" "$(now_ms)"
}

test_ha() {
	local t0 t1 relay pg node r_pg r_node total unique lost extra dups left
	projects+=("-p $ha_project -f docker/compose.ha.yml")
	say "== docker/compose.ha.yml =="
	t0=$(now_ms)
	dch up -d >"$work/ha-up.log" 2>&1 || {
		cat "$work/ha-up.log" >&2
		die "compose.ha.yml: up -d"
	}
	relay=$(svc_cid "$ha_project" relay)
	wait_until "the HA relay healthy" 300 is_healthy "$relay"
	t1=$(now_ms)
	say "ha: stack up in $(secs "$t0" "$t1") s (three broker nodes, quorum queue demo-ha)"
	wait_until "the first message at the HA consumer" 120 ha_consumer_has_any

	# The database lost: its server SIGKILLed, as a crash (not `docker kill`, which the engine
	# counts as a manual stop); its restart policy brings it back on its volume.
	pg=$(svc_cid "$ha_project" postgres)
	t0=$(now_ms)
	kill -KILL "$("$DOCKER" inspect -f '{{.State.Pid}}' "$pg")"
	r_pg=$(ha_probe kill-postgres "$t0") || exit 1
	say "ha: PostgreSQL killed (SIGKILL, restarted by its policy): a new row through after $r_pg s"

	# The broker node the relay uses, stopped and left down.
	node=$(ha_node)
	[ -n "$node" ] || die "ha: /readyz names no broker node"
	t0=$(now_ms)
	dch stop "$node" >/dev/null 2>&1 || die "ha: stop $node"
	r_node=$(ha_probe "stop-$node" "$t0") || exit 1
	wait_until "the relay on another node than $node" 60 ha_node_is_not "$node"
	say "ha: broker node $node stopped: the relay moved to $(ha_node), a new row through after $r_node s"

	dch stop producer >/dev/null 2>&1
	wait_until "every outbox row published (HA)" 180 ha_all_published
	try_until 180 ha_all_received || true
	total=$(wc -l <"$work/ha-db-ids")
	ha_received_ids >"$work/ha-received"
	unique=$(wc -l <"$work/ha-received-unique")
	lost=$(comm -23 "$work/ha-db-ids" "$work/ha-received-unique" | wc -l)
	extra=$(comm -13 "$work/ha-db-ids" "$work/ha-received-unique" | wc -l)
	dups=$(($(wc -l <"$work/ha-received") - unique))
	say "ha messages: committed=$total received=$unique lost=$lost duplicates=$dups unknown=$extra (PostgreSQL killed, broker node $node stopped)"
	[ "$lost" -eq 0 ] && [ "$extra" -eq 0 ] || die "ha: messages lost or unknown"

	dch down -v >/dev/null 2>&1 || die "ha: down -v"
	left=$({
		"$DOCKER" ps -aq --filter "label=com.docker.compose.project=$ha_project"
		"$DOCKER" volume ls -q --filter "label=com.docker.compose.project=$ha_project"
		"$DOCKER" network ls -q --filter "label=com.docker.compose.project=$ha_project"
	} | wc -l)
	[ "$left" -eq 0 ] || die "ha: down -v left $left containers, volumes or networks"
	say "ha: down -v: no container, volume or network left"
}
