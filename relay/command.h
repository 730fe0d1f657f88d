/* What the one-shot commands (relay/commands.c, relay/enqueue.c) share: an admin connection
 * and the little argument parsing they do. Errors go to stderr as one line each. */
#ifndef OUTBOX_RELAY_COMMAND_H
#define OUTBOX_RELAY_COMMAND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "store/store.h"

/* Opens an admin connection with o (filled here, borrowed by the store: keep it alive), or
 * says why not on stderr and returns NULL. */
struct store *command_admin_open(const struct config *cfg, struct store_options *o);
/* Says on stderr what could not be done and why, frees s, returns 1 (the exit status). */
int command_store_failed(struct store *s, const char *doing);
/* Whether argv holds flag. */
bool command_has_flag(int argc, char **argv, const char *flag);
/* The words after each --id (until the next --flag) into ids (room for argc); the count. */
size_t command_collect_ids(int argc, char **argv, const char **ids);
/* 2 (usage) with a line on stderr when argv holds an option that is not in known (NULL-
 * terminated), else 0. */
int command_unknown_args(int argc, char **argv, const char *const *known, const char *cmd);

/* What a replay's --since/--until value is (relay/replay.c): a duration ago (*ago_ms set: a
 * number with its unit, 30m, 2h, 7d), a time for PostgreSQL to read (anything else; it says
 * whether it is one), or digits alone (an optional fraction), refused as ambiguous: seconds
 * ago, or a date written without separators. */
enum replay_time_kind {
	REPLAY_TIME_AGO,
	REPLAY_TIME_AT,
	REPLAY_TIME_AMBIGUOUS,
};
enum replay_time_kind replay_time_kind(const char *text, int64_t *ago_ms);

#endif
