/* Waits in the broker module end when told: a confirm wait or a login on a stalled connection
 * (TCP proxy) at the shutdown deadline once the wake descriptor is readable, a publish blocked
 * in a write by broker_interrupt() from another thread; progress_ms keeps moving while a long
 * wait is under way. Bounds are generous and only stop a hang: each is far below the timeout
 * the wait would otherwise run into. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "amqp/broker.h"
#include "base/clock.h"
#include "tests/support/fixture.h"
#include "tests/support/tcp_proxy.h"

/* Far longer than any bound below: a wait that is not cut short runs into the test's bound. */
#define LONG_TIMEOUT_MS 120000
#define PROMPTLY_MS     20000

struct waits {
	struct proxy *proxy;
	char url[512];
	int wake[2];
	atomic_llong abort_at;
	atomic_llong progress;
	struct broker_options opts;
	struct broker *b;
};

static struct waits w;

static void setup(void)
{
	memset(&w, 0, sizeof(w));
	w.wake[0] = w.wake[1] = -1;
	w.proxy = proxy_start(harness_amqp_port());
	fixture_amqp_node_url(w.url, sizeof(w.url), proxy_port(w.proxy), NULL);
	cr_assert_eq(pipe(w.wake), 0);
	atomic_store(&w.abort_at, 0);
	atomic_store(&w.progress, 0);
	/* No heartbeats: nothing but our calls may end a wait. */
	w.opts = fixture_broker_options(w.url, LONG_TIMEOUT_MS, "outbox-relay waits test");
	w.opts.abort_at_ms = &w.abort_at;
	w.opts.wake_fd = w.wake[0];
	w.opts.progress_ms = &w.progress;
	w.b = fixture_broker_new(&w.opts);
}

static void teardown(void)
{
	broker_free(w.b);
	proxy_stop(w.proxy);
	for (int i = 0; i < 2; i++) {
		if (w.wake[i] >= 0)
			close(w.wake[i]);
	}
}

TestSuite(broker_waits, .init = setup, .fini = teardown, .timeout = 180);

static struct outbox_row msg(const char *id, const char *body, size_t len)
{
	struct outbox_row m = {
		.id = id,
		.exchange = "", /* the default exchange: nothing to check before publishing */
		.routing_key = "broker-waits-nowhere",
		.body = body,
		.body_len = len,
		.body_encoding = "utf-8",
		.content_type = "application/octet-stream",
		.headers = "{}",
		.properties = "{}",
		.created_at_s = 1700000000,
	};
	return m;
}

/* What a stopping process does: the deadline first, then the wake descriptor. */
struct stopper {
	int64_t delay_ms;
	int64_t deadline_in_ms;
	pthread_t thread;
};

static void *stop_later(void *arg)
{
	struct stopper *s = arg;
	ssize_t n;

	harness_sleep_ms(s->delay_ms);
	atomic_store(&w.abort_at, clock_mono_ms() + s->deadline_in_ms);
	n = write(w.wake[1], "x", 1);
	(void)n;
	return NULL;
}

Test(broker_waits, confirm_wait_ends_at_the_shutdown_deadline)
{
	struct outbox_row m[3] = { msg("w-1", "a", 1), msg("w-2", "b", 1), msg("w-3", "c", 1) };
	struct broker_result res[3];
	struct stopper s = { .delay_ms = 300, .deadline_in_ms = 0 };
	int64_t t0;
	int rc;

	cr_assert_eq(broker_connect(w.b), BROKER_OK, "connect: %s", broker_errmsg(w.b));
	proxy_stall(w.proxy, true);
	cr_assert_eq(broker_publish(w.b, m, 3, res), BROKER_OK, "publish: %s", broker_errmsg(w.b));
	cr_assert_eq(pthread_create(&s.thread, NULL, stop_later, &s), 0);
	t0 = clock_mono_ms();
	rc = broker_confirm(w.b, m, 3, res);
	pthread_join(s.thread, NULL);
	cr_assert_eq(rc, BROKER_ERR_ABORTED, "got %d: %s", rc, broker_errmsg(w.b));
	cr_assert_lt(clock_mono_ms() - t0, PROMPTLY_MS, "the wait outlived the deadline");
	cr_assert_str_eq(broker_errmsg(w.b),
	                 "stopped waiting at the shutdown deadline: 3 messages without a confirm");
	for (size_t i = 0; i < 3; i++)
		cr_assert_eq(res[i].outcome, BROKER_PENDING);
	cr_assert_not(broker_connected(w.b));
}

/* A deadline set during the wait a little ahead: the wait goes on until then, and no
 * longer. */
Test(broker_waits, a_later_deadline_is_kept)
{
	struct outbox_row m[1] = { msg("w-later", "a", 1) };
	struct broker_result res[1];
	struct stopper s = { .delay_ms = 200, .deadline_in_ms = 1500 };
	int64_t t0;
	int rc;

	cr_assert_eq(broker_connect(w.b), BROKER_OK, "connect: %s", broker_errmsg(w.b));
	proxy_stall(w.proxy, true);
	cr_assert_eq(broker_publish(w.b, m, 1, res), BROKER_OK, "publish: %s", broker_errmsg(w.b));
	cr_assert_eq(pthread_create(&s.thread, NULL, stop_later, &s), 0);
	t0 = clock_mono_ms();
	rc = broker_confirm(w.b, m, 1, res);
	pthread_join(s.thread, NULL);
	cr_assert_eq(rc, BROKER_ERR_ABORTED, "got %d: %s", rc, broker_errmsg(w.b));
	cr_assert_geq(clock_mono_ms() - t0, 1500, "ended before the deadline");
	cr_assert_lt(clock_mono_ms() - t0, PROMPTLY_MS);
	cr_assert_str_eq(broker_errmsg(w.b),
	                 "stopped waiting at the shutdown deadline: 1 message without a confirm");
}

/* The proxy accepts but forwards nothing: connect succeeds, the login waits for the broker's
 * connection.start. */
Test(broker_waits, login_ends_at_the_shutdown_deadline)
{
	struct stopper s = { .delay_ms = 300, .deadline_in_ms = 0 };
	int64_t t0;
	int rc;

	proxy_stall(w.proxy, true);
	cr_assert_eq(pthread_create(&s.thread, NULL, stop_later, &s), 0);
	t0 = clock_mono_ms();
	rc = broker_connect(w.b);
	pthread_join(s.thread, NULL);
	cr_assert_eq(rc, BROKER_ERR_ABORTED, "got %d: %s", rc, broker_errmsg(w.b));
	cr_assert_lt(clock_mono_ms() - t0, 5000, "the login outlived the deadline");
	cr_assert(strstr(broker_errmsg(w.b), "stopped waiting at the shutdown deadline: logging in "
	                                     "to 127.0.0.1:") != NULL,
	          "%s", broker_errmsg(w.b));
}

/* A publisher thread writing far more than the socket buffers hold into a stalled proxy. */
struct publisher {
	struct outbox_row *m;
	struct broker_result *res;
	size_t n;
	atomic_int done;
	int rc;
	pthread_t thread;
};

static void *publish_all(void *arg)
{
	struct publisher *p = arg;

	p->rc = broker_publish(w.b, p->m, p->n, p->res);
	atomic_store(&p->done, 1);
	return NULL;
}

static bool publisher_done(void *arg)
{
	return atomic_load(&((struct publisher *)arg)->done) != 0;
}

Test(broker_waits, interrupt_ends_a_blocked_write)
{
	enum { N = 400, BODY = 100 * 1000 }; /* 40 MB: several times what the buffers take */
	static struct outbox_row m[N];
	static struct broker_result res[N];
	static char ids[N][16];
	char *body = malloc(BODY);
	struct publisher p = { .m = m, .res = res, .n = N };
	struct outbox_row one[1] = { msg("w-after", "a", 1) };
	struct broker_result one_res[1];

	cr_assert_not_null(body);
	memset(body, 'b', BODY);
	for (size_t i = 0; i < N; i++) {
		snprintf(ids[i], sizeof(ids[i]), "w-big-%zu", i);
		m[i] = msg(ids[i], body, BODY);
	}
	atomic_store(&p.done, 0);
	cr_assert_eq(broker_connect(w.b), BROKER_OK, "connect: %s", broker_errmsg(w.b));
	proxy_stall(w.proxy, true);
	cr_assert_eq(pthread_create(&p.thread, NULL, publish_all, &p), 0);
	/* Long enough for the buffers to fill; a publish that returned by now was not blocked. */
	harness_sleep_ms(2000);
	cr_assert_not(publisher_done(&p), "the publish did not block (rc %d: %s)", p.rc,
	              broker_errmsg(w.b));
	broker_interrupt(w.b);
	harness_wait_until(publisher_done, &p, PROMPTLY_MS);
	cr_assert(publisher_done(&p), "broker_interrupt() did not end the blocked write");
	pthread_join(p.thread, NULL);
	cr_assert_eq(p.rc, BROKER_ERR_ABORTED, "got %d: %s", p.rc, broker_errmsg(w.b));
	cr_assert_str_eq(broker_errmsg(w.b),
	                 "interrupted at the shutdown deadline while publishing");
	cr_assert_not(broker_connected(w.b));

	/* The next connect works normally. */
	proxy_stall(w.proxy, false);
	cr_assert_eq(broker_connect(w.b), BROKER_OK, "reconnect: %s", broker_errmsg(w.b));
	cr_assert_eq(broker_publish(w.b, one, 1, one_res), BROKER_OK, "publish: %s",
	             broker_errmsg(w.b));
	cr_assert_eq(broker_confirm(w.b, one, 1, one_res), BROKER_OK, "confirm: %s",
	             broker_errmsg(w.b));
	cr_assert_eq(one_res[0].outcome, BROKER_RETURNED, "the default exchange has no such queue");
	free(body);
}

/* An interrupt while the owner is between calls: the next call fails, the one after that
 * (a reconnect) works. */
Test(broker_waits, interrupt_between_calls)
{
	cr_assert_eq(broker_connect(w.b), BROKER_OK, "connect: %s", broker_errmsg(w.b));
	broker_interrupt(w.b);
	cr_assert_lt(broker_service(w.b), 0);
	cr_assert_not(broker_connected(w.b));
	cr_assert_eq(broker_connect(w.b), BROKER_OK, "reconnect: %s", broker_errmsg(w.b));
	cr_assert_eq(broker_service(w.b), BROKER_OK, "service: %s", broker_errmsg(w.b));
}

/* Samples progress_ms while the owner waits. */
struct sampler {
	atomic_int stop;
	long long seen[64];
	size_t nseen;
	pthread_t thread;
};

static void *sample(void *arg)
{
	struct sampler *s = arg;

	while (!atomic_load(&s->stop)) {
		long long v = atomic_load(&w.progress);

		if (s->nseen < 64 && (s->nseen == 0 || s->seen[s->nseen - 1] != v))
			s->seen[s->nseen++] = v;
		harness_sleep_ms(50);
	}
	return NULL;
}

Test(broker_waits, progress_moves_during_a_long_wait)
{
	struct outbox_row m[1] = { msg("w-progress", "a", 1) };
	struct broker_result res[1];
	struct sampler s;
	int64_t t0;
	int rc;

	memset(&s, 0, sizeof(s));
	w.opts.confirm_timeout_ms = 4000;
	broker_free(w.b);
	w.b = fixture_broker_new(&w.opts);
	cr_assert_eq(broker_connect(w.b), BROKER_OK, "connect: %s", broker_errmsg(w.b));
	proxy_stall(w.proxy, true);
	cr_assert_eq(broker_publish(w.b, m, 1, res), BROKER_OK, "publish: %s", broker_errmsg(w.b));
	atomic_store(&s.stop, 0);
	cr_assert_eq(pthread_create(&s.thread, NULL, sample, &s), 0);
	t0 = clock_mono_ms();
	rc = broker_confirm(w.b, m, 1, res);
	atomic_store(&s.stop, 1);
	pthread_join(s.thread, NULL);
	cr_assert_eq(rc, BROKER_ERR_TIMEOUT, "got %d: %s", rc, broker_errmsg(w.b));
	/* stored at least once a second through a 4 s wait, the last time near its end */
	cr_assert_geq(s.nseen, 4, "progress_ms took only %zu values", s.nseen);
	cr_assert_geq(atomic_load(&w.progress), t0 + 3000, "progress_ms stopped during the wait");
}
