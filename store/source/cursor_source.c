/* The cursor source: not built yet. */
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <stdlib.h>

#include "store/source/source_private.h"

struct cursor {
	struct source base;
};

struct cursor *cursor_new(const struct source_options *opts)
{
	(void)opts;
	return NULL;
}

void cursor_free(struct cursor *s)
{
}

int cursor_connect(struct cursor *s)
{
	return STORE_ERR_FATAL;
}

void cursor_disconnect(struct cursor *s)
{
}

bool cursor_connected(const struct cursor *s)
{
	return false;
}

void cursor_interrupt(struct cursor *s)
{
}

const char *cursor_errmsg(const struct cursor *s)
{
	return "";
}

enum source_step cursor_step(const struct cursor *s)
{
	return SOURCE_STEP_NONE;
}

const char *cursor_server(const struct cursor *s)
{
	return "";
}

bool cursor_wakeup_current(const struct cursor *s)
{
	return false;
}

int cursor_token_stem(const struct cursor *s, char *out, size_t cap)
{
	return STORE_ERR_FATAL;
}

int cursor_next(struct cursor *s, const struct source_batch **out, int64_t *ask_at_ms)
{
	return STORE_ERR_FATAL;
}

int cursor_fd(const struct cursor *s)
{
	return STORE_ERR_FATAL;
}

int cursor_input(struct cursor *s, bool *woken)
{
	return STORE_ERR_FATAL;
}

int cursor_prefetch(struct cursor *s, const struct source_batch *b)
{
	return STORE_ERR_FATAL;
}

int cursor_settle(struct cursor *s, const struct source_batch *b, const struct source_fate *fates)
{
	return STORE_ERR_FATAL;
}

int cursor_pause(struct cursor *s)
{
	return STORE_ERR_FATAL;
}

int cursor_finish(struct cursor *s)
{
	return STORE_ERR_FATAL;
}

size_t cursor_owed(const struct cursor *s)
{
	return 0;
}

int cursor_backlog(struct cursor *s, struct store_status *st)
{
	return STORE_ERR_FATAL;
}

int cursor_purge(struct cursor *s, int64_t older_than_ms, int batch, const atomic_int *stop,
                 int64_t *n_removed)
{
	return STORE_ERR_FATAL;
}
