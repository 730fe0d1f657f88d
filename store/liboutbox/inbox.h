/* inbox.h — the consumer library: deduplicate deliveries by message_id with an idempotency
 * table held under leases (claim -> work -> confirm). Like outbox.h it runs statements on the
 * caller's connection and never begins, commits, rolls back, opens or closes one, so the
 * confirmation commits exactly when the caller's own work does. Installed as <outbox/inbox.h>
 * with liboutbox (libpq only), next to the producer's <outbox/outbox.h>.
 *
 * The usual loop, all on one connection and in one transaction:
 *
 *     BEGIN
 *     inbox_claim()   INBOX_CLAIMED -> do the work on the same connection
 *                     INBOX_DONE    -> ROLLBACK, ack the delivery (a duplicate)
 *                     INBOX_BUSY    -> ROLLBACK, requeue the delivery a little later
 *     inbox_confirm() INBOX_OK      -> COMMIT, then ack the delivery
 *                     INBOX_LOST    -> ROLLBACK (the work too), requeue the delivery
 *
 * A consumer that cannot keep its work in one transaction (a call to another service) commits
 * the claim on its own, works, then confirms in a second transaction: the lease then keeps
 * other consumers away while it works, and confirm's INBOX_LOST says that the lease ran out
 * and someone else took the message over. Run inbox_purge() now and then, off the hot path.
 *
 * Isolation: READ COMMITTED (PostgreSQL's default) is what these statements are written for.
 * Under REPEATABLE READ or SERIALIZABLE a race with another consumer fails with a
 * serialization error (INBOX_ERR_QUERY) instead; roll back and retry then. */
#ifndef OUTBOX_INBOX_H
#define OUTBOX_INBOX_H

#include <stddef.h>
#include <stdint.h>
#include <libpq-fe.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The same two macros in outbox.h: each public header stands alone.
 * OUTBOX_API marks what liboutbox.so exports (it is built with hidden visibility, so the
 * helpers it carries stay its own). OUTBOX_MUST_CHECK: a result that must not be ignored
 * (written first in a declaration, where both C and C++ take it). */
#ifndef OUTBOX_API
#if defined(__GNUC__) || defined(__clang__)
#define OUTBOX_API __attribute__((visibility("default")))
#else
#define OUTBOX_API
#endif
#endif
#ifndef OUTBOX_MUST_CHECK
#if defined(__cplusplus) && __cplusplus >= 201703L
#define OUTBOX_MUST_CHECK [[nodiscard]]
#elif defined(__GNUC__) || defined(__clang__)
#define OUTBOX_MUST_CHECK __attribute__((warn_unused_result))
#else
#define OUTBOX_MUST_CHECK
#endif
#endif

enum inbox_result {
	INBOX_CLAIMED = 0, /* inbox_claim: the message is yours; do the work, then confirm */
	INBOX_OK = 0,      /* inbox_confirm, inbox_forget, inbox_migrate: done */
	INBOX_DONE = 1,    /* inbox_claim: already confirmed; skip the work, ack the delivery */
	INBOX_BUSY = 2,    /* inbox_claim: another consumer holds a live lease; try again later
	                      (requeue the delivery after a pause) */
	INBOX_LOST = 3,    /* inbox_confirm, inbox_forget: there is no unconfirmed claim of yours
	                      on this message (the lease ran out and another consumer claimed it,
	                      it was forgotten or purged, or never claimed); nothing changed */
	INBOX_ERR_INVALID = -1, /* an argument is malformed, or the connection's client_encoding
	                           is neither UTF8 nor SQL_ASCII (see errbuf); nothing was sent,
	                           the caller's transaction is untouched */
	INBOX_ERR_QUERY = -2,   /* the statement failed (see errbuf); the caller's transaction is
	                           then aborted, as any failed statement aborts it */
	INBOX_ERR_NOMEM = -3,   /* out of memory (inbox_migrate) */
};

/* Arguments shared by the functions below. conn is borrowed, its transaction state is left
 * to the caller. table: NULL = "inbox", else a plain or schema-qualified identifier
 * ("inbox", "app.inbox"; ASCII letters, digits and '_', each part at most 63 bytes), the
 * only thing put into SQL text; everything else is sent as a parameter. message_id: 1 to 64
 * characters of UTF-8 (the outbox's id column, so every message the relay publishes fits).
 * consumer: 1 to 255 characters of UTF-8 naming one claimer (host:pid, plus a thread number
 * when several threads claim), never shared by two processes or threads that may claim at
 * the same time, since a consumer's claim counts as its own everywhere. On any error one line
 * naming what was wrong is written to errbuf (if errlen > 0). The functions keep no state:
 * several threads may call them at once, each on its own connection. */

/* The DDL for table (NULL = "inbox"), idempotent (CREATE ... IF NOT EXISTS): the table and
 * the two partial indexes the purge walks. Ownership: returns a new string (caller frees);
 * NULL when out of memory or when table is not a valid identifier, or its base name is
 * longer than 51 bytes (derived index names must fit in 63). */
OUTBOX_MUST_CHECK OUTBOX_API char *inbox_schema_sql(const char *table);

/* Applies inbox_schema_sql(table) on conn, serialised against other consumers migrating at
 * the same moment by a transaction-level advisory lock. Outside a transaction block it is one
 * implicit transaction of its own; inside the caller's it becomes part of it. Returns
 * INBOX_OK or INBOX_ERR_*. */
OUTBOX_MUST_CHECK OUTBOX_API int inbox_migrate(PGconn *conn, const char *table, char *errbuf,
                                               size_t errlen);

/* Claims message_id for consumer for lease_ms (1 ms .. 7 days) in one statement: a new
 * message is inserted; an unconfirmed one is taken over when its lease is over, has no
 * holder, or is already this consumer's (the lease is then renewed: it ends lease_ms from
 * now). Returns
 *   INBOX_CLAIMED  yours until the lease ends or your transaction rolls back;
 *   INBOX_DONE     confirmed already (by anyone): do not do the work again;
 *   INBOX_BUSY     another consumer holds a live lease;
 *   INBOX_ERR_*.
 * Two consumers claiming one message at once never both get INBOX_CLAIMED: the second
 * waits for the first one's transaction to end when that transaction has the row locked,
 * then sees its outcome. After INBOX_DONE or INBOX_BUSY end the transaction soon, since a
 * claim that lost such a race keeps the row locked until then. Leases are measured on the
 * server's clock at the time of the statement (clock_timestamp()), not at the start of the
 * caller's transaction. */
OUTBOX_MUST_CHECK OUTBOX_API int inbox_claim(PGconn *conn, const char *table,
                                             const char *message_id, const char *consumer,
                                             int64_t lease_ms, char *errbuf, size_t errlen);

/* Marks message_id confirmed if consumer holds its claim (after the lease has run out too,
 * as long as nobody claimed it meanwhile); confirming again what this consumer confirmed is
 * INBOX_OK. Returns INBOX_OK, INBOX_LOST (another consumer's claim now, or no row: roll your
 * work back and requeue the delivery) or INBOX_ERR_*. Run it in the transaction that does
 * the work, so that both commit or neither does. */
OUTBOX_MUST_CHECK OUTBOX_API int inbox_confirm(PGconn *conn, const char *table,
                                               const char *message_id, const char *consumer,
                                               char *errbuf, size_t errlen);

/* Releases consumer's own unconfirmed claim on message_id (deletes the row), so that
 * another consumer may claim the message at once, e.g. after the work failed in a way that
 * a retry elsewhere may fix. Never touches another consumer's claim or a confirmed row.
 * Returns INBOX_OK, INBOX_LOST (nothing of yours to release) or INBOX_ERR_*. */
OUTBOX_MUST_CHECK OUTBOX_API int inbox_forget(PGconn *conn, const char *table,
                                              const char *message_id, const char *consumer,
                                              char *errbuf, size_t errlen);

/* Deletes at most limit (1 .. 10000) rows in one statement: confirmed rows whose
 * confirmation is older than retention_ms (0 .. 3650 days), oldest first, then unconfirmed
 * rows whose lease ended more than retention_ms ago (a consumer that died and never saw its
 * message again). Rows other transactions have locked are skipped, never waited for. A
 * message whose row is gone is new again if it is ever delivered again, so retention must
 * outlast the longest redelivery you expect.
 * Returns the number of rows deleted (>= 0), or INBOX_ERR_*. Call it in a loop of short
 * transactions (autocommit is fine) until it returns less than limit. */
OUTBOX_MUST_CHECK OUTBOX_API int64_t inbox_purge(PGconn *conn, const char *table,
                                                 int64_t retention_ms, int limit, char *errbuf,
                                                 size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
