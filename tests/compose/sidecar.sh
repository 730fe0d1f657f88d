# shellcheck shell=bash
# docker/compose.sidecar.yml added to an application's stack (tests/compose/app), as its
# header tells a user to. Sourced by tests/compose/run; defines test_sidecar.

dcs() {
	(cd "$root" && "${compose_cmd[@]}" -f tests/compose/app/compose.yml \
		-f docker/compose.sidecar.yml "$@")
}

psql_shop() {
	"$DOCKER" exec "$(svc_cid app postgres)" psql -U shop -d shop -AtXq -v ON_ERROR_STOP=1 -c "$1"
}

app_done() {
	[ "$("$DOCKER" inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$(svc_cid app app)")" = "exited 0" ]
}

shop_all_published() {
	[ "$(psql_shop 'SELECT count(*) FROM outbox WHERE published_at IS NULL')" = 0 ]
}

orders_queued() {
	local n
	n=$("$DOCKER" exec "$(svc_cid app rabbitmq)" rabbitmqctl -q list_queues name messages |
		awk '$1 == "orders" { print $2 }')
	[ "${n:-0}" -ge "$1" ]
}

test_sidecar() {
	local t0 t1 relay total committed unique lost dups
	projects+=("-f tests/compose/app/compose.yml -f docker/compose.sidecar.yml")
	say "== docker/compose.sidecar.yml added to an application stack =="
	t0=$(now_ms)
	dcs up -d >"$work/sidecar-up.log" 2>&1 || {
		cat "$work/sidecar-up.log" >&2
		die "sidecar: up -d"
	}
	relay=$(svc_cid app outbox-relay)
	wait_until "the sidecar relay healthy" 240 is_healthy "$relay"
	t1=$(now_ms)
	say "sidecar: stack up in $(secs "$t0" "$t1") s, outbox-migrate exited $("$DOCKER" inspect -f '{{.State.ExitCode}}' "$(svc_cid app outbox-migrate)")"
	wait_until "the application's 200 transactions" 300 app_done
	wait_until "every outbox row of the application published" 180 shop_all_published
	committed=$(psql_shop "SELECT count(*) FROM orders o JOIN outbox x ON x.id = 'order-' || o.id")
	total=$(psql_shop 'SELECT count(*) FROM outbox')
	wait_until "$total messages in the queue orders" 120 orders_queued "$total"
	# Every message in the queue, taken off it, by message id (inside the broker's container,
	# which has rabbitmqadmin and python3).
	"$DOCKER" exec "$(svc_cid app rabbitmq)" sh -c '
		pass=$(sed -n "s/^default_pass = //p" /etc/rabbitmq/conf.d/20-shop-user.conf)
		rabbitmqadmin -u shop -p "$pass" -f raw_json get queue=orders ackmode=ack_requeue_false count=100000 |
			python3 -c "import json, sys
for m in json.load(sys.stdin):
    print(m[\"properties\"].get(\"message_id\", \"-\"))"' >"$work/sidecar-received"
	psql_shop 'SELECT id FROM outbox' | sort >"$work/sidecar-db-ids"
	sort -u "$work/sidecar-received" >"$work/sidecar-received-unique"
	unique=$(wc -l <"$work/sidecar-received-unique")
	lost=$(comm -23 "$work/sidecar-db-ids" "$work/sidecar-received-unique" | wc -l)
	dups=$(($(wc -l <"$work/sidecar-received") - unique))
	say "sidecar messages: orders with their outbox row=$committed outbox rows=$total received=$unique lost=$lost duplicates=$dups"
	[ "$committed" -eq 200 ] && [ "$total" -eq 200 ] && [ "$lost" -eq 0 ] ||
		die "sidecar: rows lost or missing"
	t0=$(now_ms)
	dcs stop outbox-relay >/dev/null 2>&1 || die "sidecar: stop outbox-relay"
	[ "$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$relay")" = 0 ] || die "sidecar: the relay did not exit 0"
	say "sidecar: stop outbox-relay exit 0 after $(secs "$t0" "$(now_ms)") s"
	dcs down -v >/dev/null 2>&1 || die "sidecar: down -v"
	[ -z "$("$DOCKER" ps -aq --filter label=com.docker.compose.project=app)" ] ||
		die "sidecar: down -v left containers"
}
