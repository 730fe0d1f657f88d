/* The calls of source.h, passed to the source the handle is (source_private.h). */
#include "store/source/source.h"
#include "store/source/source_private.h"
#include "store/source/source_testing.h"

#define LEASE(s)   ((struct lease *)(s))
#define CURSOR(s)  ((struct cursor *)(s))
#define CLEASE(s)  ((const struct lease *)(s))
#define CCURSOR(s) ((const struct cursor *)(s))

struct source *source_new(const struct source_options *opts)
{
	if (opts->kind == SOURCE_CURSOR)
		return (struct source *)cursor_new(opts);
	return (struct source *)lease_new(opts);
}

void source_free(struct source *s)
{
	if (!s)
		return;
	if (s->kind == SOURCE_CURSOR)
		cursor_free(CURSOR(s));
	else
		lease_free(LEASE(s));
}

int source_connect(struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_connect(CURSOR(s));
	return lease_connect(LEASE(s));
}

void source_disconnect(struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		cursor_disconnect(CURSOR(s));
	else
		lease_disconnect(LEASE(s));
}

bool source_connected(const struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_connected(CCURSOR(s));
	return lease_connected(CLEASE(s));
}

void source_interrupt(struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		cursor_interrupt(CURSOR(s));
	else
		lease_interrupt(LEASE(s));
}

const char *source_errmsg(const struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_errmsg(CCURSOR(s));
	return lease_errmsg(CLEASE(s));
}

enum source_step source_step(const struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_step(CCURSOR(s));
	return lease_step(CLEASE(s));
}

uint64_t source_test_lock_list_reads(const struct source *s)
{
	return s->kind == SOURCE_CURSOR ? cursor_lock_list_reads(CCURSOR(s)) : 0;
}

const char *source_server(const struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_server(CCURSOR(s));
	return lease_server(CLEASE(s));
}

bool source_wakeup_current(const struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_wakeup_current(CCURSOR(s));
	return lease_wakeup_current(CLEASE(s));
}

int source_token_stem(const struct source *s, char *out, size_t cap)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_token_stem(CCURSOR(s), out, cap);
	return lease_token_stem(CLEASE(s), out, cap);
}

int source_next(struct source *s, const struct source_batch **out, int64_t *ask_at_ms)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_next(CURSOR(s), out, ask_at_ms);
	return lease_next(LEASE(s), out, ask_at_ms);
}

int source_fd(const struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_fd(CCURSOR(s));
	return lease_fd(CLEASE(s));
}

int source_input(struct source *s, bool *woken)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_input(CURSOR(s), woken);
	return lease_input(LEASE(s), woken);
}

int source_prefetch(struct source *s, const struct source_batch *b)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_prefetch(CURSOR(s), b);
	return lease_prefetch(LEASE(s), b);
}

int source_settle(struct source *s, const struct source_batch *b, const struct source_fate *fates)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_settle(CURSOR(s), b, fates);
	return lease_settle(LEASE(s), b, fates);
}

int source_pause(struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_pause(CURSOR(s));
	return lease_pause(LEASE(s));
}

int source_finish(struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_finish(CURSOR(s));
	return lease_finish(LEASE(s));
}

size_t source_owed(const struct source *s)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_owed(CCURSOR(s));
	return lease_owed(CLEASE(s));
}

int source_backlog(struct source *s, struct store_status *st)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_backlog(CURSOR(s), st);
	return lease_backlog(LEASE(s), st);
}

int source_purge(struct source *s, int64_t older_than_ms, int batch, const atomic_int *stop,
                 int64_t *n_removed)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_purge(CURSOR(s), older_than_ms, batch, stop, n_removed);
	return lease_purge(LEASE(s), older_than_ms, batch, stop, n_removed);
}

int source_partitions_ahead(struct source *s, int *made)
{
	if (s->kind == SOURCE_CURSOR)
		return cursor_partitions_ahead(CURSOR(s), made);
	return lease_partitions_ahead(LEASE(s), made);
}

const char *source_step_text(enum source_step step)
{
	switch (step) {
	case SOURCE_STEP_CLAIMING:
		return "claiming rows";
	case SOURCE_STEP_MARKING:
		return "marking rows published";
	case SOURCE_STEP_MARKING_FAILED:
		return "marking rows failed";
	case SOURCE_STEP_RELEASING:
	case SOURCE_STEP_HANDING_BACK:
		return "releasing leases";
	case SOURCE_STEP_RENEWING:
		return "renewing leases";
	case SOURCE_STEP_REPAYING:
		return "marking rows confirmed while the database was away";
	case SOURCE_STEP_ARMING:
		return "arming the wake-up";
	case SOURCE_STEP_DISARMING:
		return "disarming the wake-up";
	case SOURCE_STEP_SETTLING_WATERMARK:
		return "settling the ordering watermark";
	case SOURCE_STEP_WAITING:
		return "waiting for notifications";
	case SOURCE_STEP_LEADING:
		return "taking the table's lead";
	case SOURCE_STEP_READING:
		return "reading rows above the position";
	case SOURCE_STEP_MOVING:
		return "moving the position";
	case SOURCE_STEP_DEFERRED:
		return "publishing rows the position passed";
	default:
		return "using the database";
	}
}
