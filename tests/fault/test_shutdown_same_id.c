/* Two relays given the same relay.id by mistake (64 bytes: longer than the part of it a claim's
 * token keeps), each with rows in flight (its broker connection stalled by a proxy, so it waits
 * for confirms). SIGTERM to one must release only the rows that process claimed: the other's
 * rows stay leased to it, no third relay publishes them while it still does, and every row
 * reaches a real consumer exactly once.
 *
 * With the cursor source one of the two leads and the other waits: the same relay.id must not
 * make the standby publish beside the leader (the lead is the leader's session's, not its
 * id's). The leader's SIGTERM hands the lead over, and every row still arrives exactly once. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fault.h"
#include "tests/support/tcp_proxy.h"

#define ROWS 5

/* 64 bytes, the longest relay.id allowed. */
#define SAME_ID "relay-given-twice-by-mistake-0123456789abcdefghijklmnopqrstuvwxy"

/* The stem of locked_by ("<id>#<nonce>."): what every claim of one relay process shares. */
#define STEM   "regexp_replace(locked_by, '[^.]*$', '')"
#define LEASED "locked_by IS NOT NULL AND locked_until > now()"

static int64_t count(struct fixture *f, const char *cond)
{
	return harness_pg_int(f->pg, "SELECT count(*) FROM %s WHERE %s", f->table, cond);
}

/* Rows leased (a lease not yet run out) by claims of the relay process with this stem. */
static int64_t held(struct fixture *f, const char *stem)
{
	return harness_pg_int(
	        f->pg, "SELECT count(*) FROM %s WHERE locked_until > now() AND " STEM " = '%s'",
	        f->table, stem);
}

/* Starts a relay with SAME_ID whose broker connection goes through a new proxy (*p). */
static struct harness_relay *start_proxied(struct fixture *f, struct proxy **p, char *env_buf,
                                           size_t len)
{
	struct harness_relay *r;
	const char *env[8] = {
		"OUTBOX_RELAY_ID=" SAME_ID,
		"OUTBOX_AMQP_CONFIRM_TIMEOUT=90s",
		"OUTBOX_RELAY_LEASE=180s",
		"OUTBOX_RELAY_SHUTDOWN_TIMEOUT=2s",
		"OUTBOX_RELAY_BATCH_SIZE="
		"5",
		env_buf,
		NULL,
	};

	*p = proxy_start(harness_amqp_port());
	fault_amqp_env(env_buf, len, proxy_port(*p));
	r = fault_relay_start(f, env);
	cr_assert(harness_relay_wait_log(r, "msg=\"connected\" to=broker", FAULT_LOG_TIMEOUT_MS));
	cr_assert(harness_relay_wait_log(r, "msg=\"connected\" to=database", FAULT_LOG_TIMEOUT_MS));
	return r;
}

/* The cursor: A leads, its batch stuck in a stalled broker connection; B, same relay.id and a
 * broker connection that works, publishes nothing while A lives; after A's SIGTERM, B
 * publishes every row, once. */
static void cursor_same_id(struct fixture *f)
{
	struct proxy *pa, *pb;
	char env_a[256], env_b[256];
	struct harness_relay *a;
	size_t lost, dups;
	int st;

	a = start_proxied(f, &pa, env_a, sizeof(env_a));
	HARNESS_WAIT(harness_cursor_position(f->pg, f->table) >= 0, FAULT_LOG_TIMEOUT_MS);
	cr_assert_geq(harness_cursor_position(f->pg, f->table), 0, "relay A never took the lead");
	proxy_stall(pa, true);
	harness_insert_rows(f->pg, f->table, 2 * ROWS, f->exchange, "same.id", "sdsame", NULL,
	                    NULL);
	(void)start_proxied(f, &pb, env_b, sizeof(env_b));
	/* A bounded look for something that must not happen: B tries for the lead every
	 * ~200 ms, so it has had many chances within this time. */
	harness_sleep_ms(3000);
	cr_assert_eq(consumer_unique(f->cons), 0,
	             "a relay published while the other one (same relay.id) led");

	st = harness_relay_stop(a, SIGTERM, 60000);
	if (st != 0)
		harness_relay_dump_log(a);
	cr_assert_eq(st, 0, "relay A exited %d", st);
	fixture_expect_unique(f, f->cons, 2 * ROWS, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(f, 10, FAULT_DELIVERY_TIMEOUT_MS);
	harness_sleep_ms(500);
	dups = fault_count(f, "shutdown_same_id", "sdsame", 2 * ROWS, &lost);
	cr_assert_eq(lost, 0);
	cr_assert_eq(dups, 0, "%zu rows published twice", dups);
	fixture_teardown(f);
	proxy_stop(pa);
	proxy_stop(pb);
}

Test(shutdown_same_id, sigterm_releases_only_this_process_claims, .timeout = 600)
{
	struct fixture f;
	struct proxy *pa, *pb;
	char env_a[256], env_b[256], *stem_a, *stem_b;
	struct harness_relay *a, *b;
	size_t lost = 0, dups;
	int64_t b_kept, released;
	int st;

	fixture_setup(&f, "sdsame", NULL);
	cr_assert_eq(strlen(SAME_ID), 64);
	if (harness_source_is_cursor()) {
		cursor_same_id(&f);
		return;
	}

	/* Relay A takes the first rows and is left waiting for their confirms. */
	a = start_proxied(&f, &pa, env_a, sizeof(env_a));
	proxy_stall(pa, true);
	harness_insert_rows(f.pg, f.table, ROWS, f.exchange, "same.id", "sdsame", NULL, NULL);
	HARNESS_WAIT(count(&f, LEASED) == ROWS, FAULT_LOG_TIMEOUT_MS);
	cr_assert_eq(count(&f, LEASED), ROWS, "relay A did not claim its rows");
	stem_a = harness_pg_string(f.pg, "SELECT min(" STEM ") FROM %s", f.table);
	cr_assert_not_null(stem_a);

	/* Relay B, same relay.id, takes the next rows and waits likewise. */
	b = start_proxied(&f, &pb, env_b, sizeof(env_b));
	proxy_stall(pb, true);
	harness_pg_exec(f.pg,
	                "INSERT INTO %s (id, exchange_name, routing_key, body)"
	                " SELECT 'sdsame-' || lpad(i::text, 7, '0'), '%s', 'same.id', '{}'"
	                " FROM generate_series(%d, %d) i",
	                f.table, f.exchange, ROWS, 2 * ROWS - 1);
	HARNESS_WAIT(count(&f, LEASED) == 2 * ROWS, FAULT_LOG_TIMEOUT_MS);
	cr_assert_eq(count(&f, LEASED), 2 * ROWS, "relay B did not claim its rows");
	stem_b = harness_pg_string(
	        f.pg, "SELECT min(" STEM ") FROM %s WHERE " STEM " IS DISTINCT FROM '%s'", f.table,
	        stem_a);
	cr_assert_not_null(stem_b, "every row is under relay A's claims");
	cr_assert_eq(held(&f, stem_a), ROWS);
	cr_assert_eq(held(&f, stem_b), ROWS);
	fprintf(stderr, "shutdown_same_id: A holds %d rows as '%s', B holds %d as '%s'\n", ROWS,
	        stem_a, ROWS, stem_b);

	/* SIGTERM to A: its confirms never come, it releases what it claimed and exits 0. */
	st = harness_relay_stop(a, SIGTERM, 60000);
	if (st != 0)
		harness_relay_dump_log(a);
	cr_assert_eq(st, 0, "relay A exited %d", st);
	fprintf(stderr,
	        "shutdown_same_id: after A's SIGTERM: B's rows still leased to B: %lld of %d;"
	        " A's rows released: %lld of %d\n",
	        (long long)held(&f, stem_b), ROWS,
	        (long long)count(&f, "id < 'sdsame-0000005' AND locked_by IS NULL"), ROWS);
	/* Asserted at the end, once the duplicates it causes have been counted. */
	b_kept = held(&f, stem_b);
	released = count(&f, "locked_by IS NULL AND published_at IS NULL");

	/* A third relay publishes A's rows; B's go out once its broker connection moves again. */
	fault_relay_start(&f, (const char *const[]){ "OUTBOX_RELAY_ID=" SAME_ID,
	                                             "OUTBOX_RELAY_LEASE=180s", NULL });
	HARNESS_WAIT(consumer_unique(f.cons) >= ROWS, FAULT_DELIVERY_TIMEOUT_MS);
	proxy_stall(pb, false);
	fixture_expect_unique(&f, f.cons, 2 * ROWS, FAULT_DELIVERY_TIMEOUT_MS);
	fault_expect_settled(&f, 10, FAULT_DELIVERY_TIMEOUT_MS);
	dups = fault_count(&f, "shutdown_same_id", "sdsame", 2 * ROWS, &lost);
	cr_assert_eq(lost, 0);
	cr_assert_eq(b_kept, ROWS, "A's shutdown released %lld rows relay B still publishes",
	             (long long)(ROWS - b_kept));
	cr_assert_eq(released, ROWS, "A released %lld rows, it had claimed %d", (long long)released,
	             ROWS);
	cr_assert_eq(dups, 0, "%zu rows published twice", dups);
	free(stem_a);
	free(stem_b);
	(void)b;
	fixture_teardown(&f);
	proxy_stop(pa);
	proxy_stop(pb);
}
