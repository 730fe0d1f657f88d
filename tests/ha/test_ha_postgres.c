/* The relay through a PostgreSQL failover: producers keep committing keyed and unkeyed rows
 * (about 200 commits/s, retrying what failed) through the multi-host read-write URI while the
 * primary is SIGKILLed and its synchronous standby promoted; later the old primary comes back
 * as the new one's standby. The relay, given the same URI, must deliver every row a producer
 * saw committed, each key's rows in commit order, never exit, never write to the standby, and
 * resume within a bound. Prints `ha postgres failover:` and `ha postgres rejoin:` lines. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench/drive/consumer.h"
#include "tests/support/fault.h"
#include "tests/support/fixture.h"
#include "tests/support/ha.h"
#include "tests/support/harness.h"

/* Two unkeyed and two keyed producers, one commit each per PAUSE_MS: about 200 commits/s on
 * an idle machine. */
#define PRODUCERS_PER_KIND 2
#define PAUSE_MS           20
/* Keyed rows spread over 32 ordering keys, about three a second per key. */
#define KEYS 32
/* A failover manager notices a dead primary before it promotes; two seconds here. */
#define KILL_TO_PROMOTE_MS 2000
#define LOAD_MS            5000
/* The bound on recovery: from the kill to the first delivery of a row committed after the
 * promotion. The promotion comes KILL_TO_PROMOTE_MS after the kill and takes under a second;
 * the relay retries its connection with a backoff capped at 15 s; its first claim afterwards
 * finds the new rows at once. 15 s + the promotion + slack for a loaded machine. */
#define RECOVERY_BOUND_MS 30000
/* Relay settings: a lease well above the confirm timeout, short enough that rows leased on the
 * old primary (the lease itself replicated) come back soon after the failover. */
#define RELAY_LEASE   "OUTBOX_RELAY_LEASE=10s"
#define RELAY_CONFIRM "OUTBOX_AMQP_CONFIRM_TIMEOUT=5s"

static const char lost_db[] = "msg=\"lost connection, will reconnect\" to=database";
static const char back_db[] = "msg=\"reconnected\" to=database";
/* A statement that failed on a live connection: what a write refused by a standby would be,
 * had the relay not reconnected to the primary. */
static const char stmt_failed[] = "msg=\"database statement failed, will retry\"";

static struct ha_producer *start_producers(const struct fixture *f, const char *prefix, int keys)
{
	struct ha_producer_options o = {
		.conninfo = harness_require_env("RELAY_TEST_HA_PG_URI"),
		.table = f->table,
		.exchange = f->exchange,
		.routing_key = keys ? "ha.keyed" : "ha.unkeyed",
		.prefix = prefix,
		.threads = PRODUCERS_PER_KIND,
		.keys = keys,
		.pause_ms = PAUSE_MS,
	};

	return ha_producer_start(&o);
}

/* Connections whose application_name starts with "outbox-relay" on node (the relay names its
 * worker and maintenance connections so). */
static int64_t relay_sessions(int node)
{
	PGconn *c = ha_pg_connect_node(node);
	int64_t n = harness_pg_int(c, "SELECT count(*) FROM pg_stat_activity"
	                              " WHERE application_name LIKE 'outbox-relay%%'");

	PQfinish(c);
	return n;
}

static long file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

/* Lines of path from byte offset on that contain needle. */
static int log_lines_since(const char *path, long offset, const char *needle)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	int n = 0;

	if (f == NULL)
		return 0;
	if (fseek(f, offset, SEEK_SET) == 0) {
		while (fgets(line, sizeof(line), f) != NULL)
			n += strstr(line, needle) != NULL;
	}
	fclose(f);
	return n;
}

static const char *node_log(int node)
{
	char name[32];

	snprintf(name, sizeof(name), "RELAY_TEST_HA_PG%d_LOG", node);
	return harness_require_env(name);
}

Test(ha_postgres, failover_and_rejoin, .init = ha_restore, .timeout = 600)
{
	struct fixture f;
	struct ha_producer *ps[2];
	struct harness_relay *r, *r2;
	char db_env[1024], db_env2[1024];
	const char *env[4];
	const char *env2[4];
	int old, primary;
	int64_t t_kill, t_promote0, t_promoted, first_fresh, recovery, t_rejoin0, rejoin_ms;
	int64_t on_primary, on_standby, pause, last_before;
	size_t committed, lost, keyed, received, dups, retries;
	long standby_log_at;

	fixture_setup(&f, "ha_pg", NULL);
	snprintf(db_env, sizeof(db_env), "OUTBOX_DATABASE_URL=%s",
	         harness_require_env("RELAY_TEST_HA_PG_URI"));
	env[0] = db_env;
	env[1] = RELAY_LEASE;
	env[2] = RELAY_CONFIRM;
	env[3] = NULL;
	r = fixture_relay_start(&f, env);
	cr_assert(harness_relay_wait_log(r, "msg=\"connected\" to=database", 60000),
	          "the relay did not connect to the database");

	ps[0] = start_producers(&f, "u", 0);
	ps[1] = start_producers(&f, "k", KEYS);
	harness_sleep_ms(LOAD_MS);
	fixture_expect_unique(&f, f.cons, 200, HA_TIMEOUT_MS);

	/* The failover: SIGKILL, a pause, the standby promoted. */
	old = ha_pg_primary();
	cr_assert(relay_sessions(old) > 0, "the relay has no session on the primary");
	t_kill = harness_now_ms();
	ha_pg_kill(old);
	harness_sleep_ms(KILL_TO_PROMOTE_MS);
	t_promote0 = harness_now_ms();
	primary = ha_pg_promote();
	t_promoted = harness_now_ms();
	cr_assert_neq(primary, old);
	PQfinish(f.pg);
	f.pg = ha_pg_connect_retry(30000);
	cr_assert_not_null(f.pg, "no connection to the new primary");

	/* Recovery: the first row committed after the promotion reaches the consumer. */
	HARNESS_WAIT(ha_first_fresh_delivery(f.cons, ps, 2, t_promoted) >= 0, HA_TIMEOUT_MS);
	first_fresh = ha_first_fresh_delivery(f.cons, ps, 2, t_promoted);
	if (first_fresh < 0)
		fixture_dump_logs(&f);
	cr_assert_geq(first_fresh, 0, "no row committed after the promotion was delivered");
	recovery = first_fresh - t_kill;
	pause = ha_longest_pause(f.cons, t_kill, first_fresh, NULL);
	cr_assert(fixture_logged(&f, lost_db), "the relay did not log the lost database");
	cr_assert(fixture_logged(&f, back_db), "the relay did not log its reconnection");
	harness_sleep_ms(LOAD_MS);

	/* The old primary comes back as the new one's synchronous standby while everything
	 * runs; no relay session may land there. */
	standby_log_at = file_size(node_log(old));
	t_rejoin0 = harness_now_ms();
	ha_pg_rejoin(old);
	rejoin_ms = harness_now_ms() - t_rejoin0;
	harness_sleep_ms(LOAD_MS);
	/* A second relay whose URL names the standby first and leaves target_session_attrs to
	 * the relay's default (read-write). */
	snprintf(db_env2, sizeof(db_env2),
	         "OUTBOX_DATABASE_URL=postgresql://postgres@127.0.0.1:%d,127.0.0.1:%d/"
	         "postgres?connect_timeout=5",
	         ha_pg_node_port(old), ha_pg_node_port(primary));
	env2[0] = db_env2;
	env2[1] = RELAY_LEASE;
	env2[2] = RELAY_CONFIRM;
	env2[3] = NULL;
	r2 = fixture_relay_start(&f, env2);
	cr_assert(harness_relay_wait_log(r2, "msg=\"connected\" to=database", 60000),
	          "the second relay did not connect to the database");
	harness_sleep_ms(2000);
	on_primary = relay_sessions(primary);
	on_standby = relay_sessions(old);

	committed = ha_producer_stop(ps[0]) + ha_producer_stop(ps[1]);
	retries = ha_producer_retries(ps[0]) + ha_producer_retries(ps[1]);
	lost = ha_wait_delivered(f.cons, ps, 2, HA_TIMEOUT_MS, "ha postgres failover");
	if (lost != 0)
		fixture_dump_logs(&f);
	fault_expect_settled(&f, 10, HA_TIMEOUT_MS);
	harness_sleep_ms(1000);
	received = consumer_received(f.cons);
	dups = consumer_duplicates(f.cons);
	keyed = ha_check_key_order(f.pg, f.table, f.cons, "ha postgres failover");
	last_before = ha_last_arrival(f.cons, ps, 2, t_kill);

	/* recovery_ms: kill to the first delivery of a row committed after the promotion;
	 * pause_ms: the longest pause in deliveries meanwhile; last_old_row_ms: kill to the
	 * arrival of the last row committed before it, 0 when all had arrived before it (rows
	 * the relay had claimed on the old primary and not yet published wait for their lease
	 * to end if the lease reached the standby). */
	fprintf(stderr,
	        "ha postgres failover: recovery_ms=%lld committed=%zu delivered=%zu lost=%zu "
	        "duplicates=%zu keyed=%zu pause_ms=%lld kill_to_promote_ms=%lld promote_ms=%lld "
	        "last_old_row_ms=%lld producer_retries=%zu\n",
	        (long long)recovery, committed, consumer_unique(f.cons), lost, dups, keyed,
	        (long long)pause, (long long)(t_promote0 - t_kill),
	        (long long)(t_promoted - t_promote0),
	        (long long)(last_before > t_kill ? last_before - t_kill : 0), retries);
	fprintf(stderr,
	        "ha postgres rejoin: rejoin_ms=%lld relay_sessions_primary=%lld "
	        "relay_sessions_standby=%lld statement_failures=%d standby_read_only_errors=%d\n",
	        (long long)rejoin_ms, (long long)on_primary, (long long)on_standby,
	        fixture_log_count(&f, stmt_failed),
	        log_lines_since(node_log(old), standby_log_at, "read-only transaction"));

	cr_assert_eq(lost, 0, "%zu rows committed and never delivered", lost);
	cr_assert_geq(received, committed);
	cr_assert_leq(recovery, RECOVERY_BOUND_MS,
	              "recovery took %lld ms (bound %d ms): kill to the first delivery of a row "
	              "committed after the promotion",
	              (long long)recovery, RECOVERY_BOUND_MS);
	cr_assert_eq(harness_pg_int(f.pg, "SELECT count(*) FROM %s WHERE attempts > 0", f.table), 0,
	             "a failover must not charge attempts");
	cr_assert_eq(on_standby, 0, "%lld relay sessions on the standby", (long long)on_standby);
	cr_assert_geq(on_primary, 2, "the relays' sessions are not on the new primary (%lld)",
	              (long long)on_primary);
	cr_assert_eq(fixture_log_count(&f, stmt_failed), 0,
	             "a relay statement failed on a live connection (a write the server refused?)");
	cr_assert_eq(log_lines_since(node_log(old), standby_log_at, "read-only transaction"), 0,
	             "something tried to write on the standby");
	cr_assert_not(r->exited, "the relay exited");
	cr_assert_eq(harness_relay_wait(r, 0), -1, "the relay exited");
	cr_assert_eq(harness_relay_wait(r2, 0), -1, "the second relay exited");

	ha_producer_free(ps[0]);
	ha_producer_free(ps[1]);
	fixture_teardown(&f);
}
