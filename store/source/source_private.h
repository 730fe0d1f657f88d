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

struct lease;
struct cursor;

/* lease_source.c, lease_idle.c */
struct lease *lease_new(const struct source_options *opts);
void lease_free(struct lease *s);
int lease_connect(struct lease *s);
void lease_disconnect(struct lease *s);
bool lease_connected(const struct lease *s);
void lease_interrupt(struct lease *s);
const char *lease_errmsg(const struct lease *s);
enum source_step lease_step(const struct lease *s);
const char *lease_server(const struct lease *s);
bool lease_wakeup_current(const struct lease *s);
int lease_token_stem(const struct lease *s, char *out, size_t cap);
int lease_next(struct lease *s, const struct source_batch **out, int64_t *ask_at_ms);
int lease_fd(const struct lease *s);
int lease_input(struct lease *s, bool *woken);
int lease_prefetch(struct lease *s, const struct source_batch *b);
int lease_settle(struct lease *s, const struct source_batch *b, const struct source_fate *fates);
int lease_pause(struct lease *s);
int lease_finish(struct lease *s);
size_t lease_owed(const struct lease *s);
int lease_backlog(struct lease *s, struct store_status *st);
int lease_partitions_ahead(struct lease *s, int *made);
int lease_purge(struct lease *s, int64_t older_than_ms, int batch, const atomic_int *stop,
                int64_t *n_removed);

/* cursor_source.c, cursor_settle.c */
struct cursor *cursor_new(const struct source_options *opts);
void cursor_free(struct cursor *s);
int cursor_connect(struct cursor *s);
void cursor_disconnect(struct cursor *s);
bool cursor_connected(const struct cursor *s);
void cursor_interrupt(struct cursor *s);
const char *cursor_errmsg(const struct cursor *s);
enum source_step cursor_step(const struct cursor *s);
const char *cursor_server(const struct cursor *s);
bool cursor_wakeup_current(const struct cursor *s);
int cursor_token_stem(const struct cursor *s, char *out, size_t cap);
int cursor_next(struct cursor *s, const struct source_batch **out, int64_t *ask_at_ms);
uint64_t cursor_lock_list_reads(const struct cursor *s);
int cursor_fd(const struct cursor *s);
int cursor_input(struct cursor *s, bool *woken);
int cursor_prefetch(struct cursor *s, const struct source_batch *b);
int cursor_settle(struct cursor *s, const struct source_batch *b, const struct source_fate *fates);
int cursor_pause(struct cursor *s);
int cursor_finish(struct cursor *s);
size_t cursor_owed(const struct cursor *s);
int cursor_backlog(struct cursor *s, struct store_status *st);
int cursor_partitions_ahead(struct cursor *s, int *made);
int cursor_purge(struct cursor *s, int64_t older_than_ms, int batch, const atomic_int *stop,
                 int64_t *n_removed);

#endif
