/* What store/source/source.c dispatches to: the calls of source.h, once per source, under the
 * source's own prefix (lease_, cursor_). Each source's struct begins with struct source, so a
 * struct source * is a pointer to its first member. Nothing outside store/source/ includes it. */
#ifndef OUTBOX_STORE_SOURCE_PRIVATE_H
#define OUTBOX_STORE_SOURCE_PRIVATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/source/source.h"

struct source {
	enum source_kind kind;
};

#define SOURCE_CALLS(p, T)                                                                   \
	T *p##_new(const struct source_options *opts);                                       \
	void p##_free(T *s);                                                                 \
	int p##_connect(T *s);                                                               \
	void p##_disconnect(T *s);                                                           \
	bool p##_connected(const T *s);                                                      \
	void p##_interrupt(T *s);                                                            \
	const char *p##_errmsg(const T *s);                                                  \
	enum source_step p##_step(const T *s);                                               \
	const char *p##_server(const T *s);                                                  \
	bool p##_wakeup_current(const T *s);                                                 \
	int p##_token_stem(const T *s, char *out, size_t cap);                               \
	int p##_next(T *s, const struct source_batch **out, int64_t *ask_at_ms);             \
	int p##_fd(const T *s);                                                              \
	int p##_input(T *s, bool *woken);                                                    \
	int p##_prefetch(T *s, const struct source_batch *b);                                \
	int p##_settle(T *s, const struct source_batch *b, const struct source_fate *fates); \
	int p##_pause(T *s);                                                                 \
	int p##_finish(T *s);                                                                \
	size_t p##_owed(const T *s);                                                         \
	int p##_backlog(T *s, struct store_status *st);                                      \
	int p##_purge(T *s, int64_t older_than_ms, int batch, const atomic_int *stop,        \
	              int64_t *n_removed);

struct lease;
struct cursor;
SOURCE_CALLS(lease, struct lease)
SOURCE_CALLS(cursor, struct cursor)

#endif
