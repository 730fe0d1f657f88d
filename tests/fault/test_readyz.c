/* /readyz follows the broker connection while /healthz follows only the relay loop: with the
 * RabbitMQ application stopped the relay is alive but not ready, and ready again once the
 * broker is back. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"
#include "tests/support/http_probe.h"

#define EXIT_TIMEOUT_MS  30000
#define STATE_TIMEOUT_MS 120000

static bool broker_stopped;

/* Whatever happened in the test, the next fault test finds the broker running. */
static void restore_broker(void)
{
	if (broker_stopped)
		(void)harness_shell("%s start_app", harness_require_env("RELAY_TEST_RABBITMQCTL"));
	broker_stopped = false;
}

struct probe_want {
	const char *listen;
	int status;
};

static bool readyz_is(void *arg)
{
	const struct probe_want *w = arg;
	struct probe_reply r = probe_get(w->listen, "/readyz");
	bool ok = r.status == w->status;

	free(r.body);
	return ok;
}

static void expect_status(const char *listen, const char *path, int want, const char *when)
{
	struct probe_reply r = probe_get(listen, path);

	cr_assert_eq(r.status, want, "%s %s: %d (%s)", when, path, r.status, r.body);
	free(r.body);
}

static void wait_readyz(struct harness_relay *relay, const char *listen, int want, const char *when)
{
	struct probe_want w = { listen, want };

	if (!harness_wait_until(readyz_is, &w, STATE_TIMEOUT_MS)) {
		harness_relay_dump_log(relay);
		cr_assert_fail("%s: /readyz never answered %d", when, want);
	}
}

Test(fault, readyz_follows_the_broker, .timeout = 600, .fini = restore_broker)
{
	char listen[64], e_listen[96];
	struct harness_relay *relay;
	struct probe_reply r;
	struct fixture fx;
	int st;

	/* No consumer: nothing is published, and the broker is stopped under it. */
	fixture_setup(&fx, "fault_readyz", &(struct fixture_options){ .no_consumer = true });
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", probe_free_port());
	snprintf(e_listen, sizeof(e_listen), "OUTBOX_HTTP_LISTEN=%s", listen);
	/* A short heartbeat makes an idle relay notice the lost connection soon. */
	relay = fixture_relay_start(
	        &fx, (const char *const[]){ e_listen, "OUTBOX_AMQP_HEARTBEAT=2s",
	                                    "OUTBOX_RELAY_POLL_INTERVAL=200ms", NULL });

	wait_readyz(relay, listen, 200, "at start");
	r = probe_get(listen, "/readyz");
	cr_assert_eq(strncmp(r.body, "ready\n", 6), 0, "got: %s", r.body);
	cr_assert_not_null(strstr(r.body, "\nbroker 127.0.0.1:"), "names the broker node: %s",
	                   r.body);
	free(r.body);
	expect_status(listen, "/healthz", 200, "at start");

	broker_stopped = true;
	harness_broker_stop_app();
	wait_readyz(relay, listen, 503, "broker stopped");
	r = probe_get(listen, "/readyz");
	cr_assert_eq(r.status, 503, "broker stopped: /readyz %d (%s)", r.status, r.body);
	cr_assert_not_null(strstr(r.body, "broker"), "the body names the broker: %s", r.body);
	cr_assert_null(strstr(r.body, "database"), "the database is still there: %s", r.body);
	free(r.body);
	/* The loop keeps ticking while it waits to reconnect: alive, just not ready. */
	for (int i = 0; i < 5; i++) {
		expect_status(listen, "/healthz", 200, "broker stopped");
		harness_sleep_ms(1000);
	}
	expect_status(listen, "/readyz", 503, "broker still stopped");
	cr_assert(harness_relay_log_count(relay, "to=broker") >= 1,
	          "the relay did not log the lost broker");

	harness_broker_start_app();
	broker_stopped = false;
	wait_readyz(relay, listen, 200, "broker started again");
	expect_status(listen, "/healthz", 200, "broker started again");

	st = harness_relay_stop(relay, SIGTERM, EXIT_TIMEOUT_MS);
	if (st != 0)
		harness_relay_dump_log(relay);
	cr_assert_eq(st, 0, "relay exited with %d", st);
	fixture_teardown(&fx);
}
