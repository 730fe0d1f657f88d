/* logical.h — a logical replication client for the sources prototype (bench/sources.c): the
 * streaming protocol on a replication connection, pgoutput's inserts read row by row, the
 * flush position acknowledged when the caller says. What a relay reading the outbox by logical
 * decoding would do, with no broker behind it. Single-threaded. */
#ifndef OUTBOX_BENCH_LOGICAL_H
#define OUTBOX_BENCH_LOGICAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct logical_stream;

/* One row of an insert the slot streamed. */
struct logical_row {
	int64_t seq;     /* the first column; -1 when it is not an integer */
	size_t body_len; /* bytes of the fifth column (body) as text; 0 when NULL */
};

/* Opens a replication connection (conninfo plus replication=database) and starts streaming
 * the logical slot `slot` (made with the pgoutput plugin) for publication `pub`, from where
 * the slot was last confirmed. A new stream (logical_stop() it), or NULL with the server's
 * message in err. */
struct logical_stream *logical_start(const char *conninfo, const char *slot, const char *pub,
                                     char *err, size_t errlen) __attribute__((warn_unused_result));

/* The walsender serving the stream: the backend that decodes. */
pid_t logical_backend(const struct logical_stream *s);

/* The next inserted row into *row: 1, or 0 when none came within timeout_ms (0: only what
 * has already arrived), or -1 with why in err (the connection failed, the server ended the
 * stream, a message not understood). Begin, relation and commit messages are consumed on the
 * way; a keepalive that asks for an answer gets one at once. */
int logical_next(struct logical_stream *s, int timeout_ms, struct logical_row *row, char *err,
                 size_t errlen) __attribute__((warn_unused_result));

/* The end of the last commit whose rows logical_next() has all handed out: what may be
 * acknowledged as flushed. 0 before the first commit. */
uint64_t logical_commit_end(const struct logical_stream *s);

/* Tells the server that everything up to lsn is flushed (a standby status update), so the
 * slot may give up the WAL before it. 0, or -1 with why in err. */
int logical_ack(struct logical_stream *s, uint64_t lsn, char *err, size_t errlen)
        __attribute__((warn_unused_result));

/* Ends the stream and closes the connection; accepts NULL. */
void logical_stop(struct logical_stream *s);

#endif
