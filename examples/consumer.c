/* An example consumer for the demo: declares a queue, binds it to an exchange with a routing
 * pattern, and prints each message (id, routing key, body) as it arrives, acknowledging it
 * after printing. Delivery is at-least-once, so it also says when a message_id repeats.
 * usage: outbox-demo-consumer AMQP_URL QUEUE EXCHANGE BINDING_KEY [SECONDS]
 *
 * Without INBOX_DATABASE_URL it remembers the ids it saw in memory (up to 4096, lost on
 * exit). With INBOX_DATABASE_URL set (a libpq conninfo or URI) it deduplicates in PostgreSQL
 * with <outbox/inbox.h>, as a real consumer would: it creates the inbox table if it is missing
 * (INBOX_TABLE, default "inbox"), and for each delivery, in one transaction, claims the
 * message_id, does the work (here: prints; a real consumer writes its own rows on the same
 * connection), confirms, commits, and only then acks. A message already confirmed is acked
 * and printed as a duplicate; one that another consumer holds is rejected back to the queue
 * (basic.reject, requeue) after a short pause; a database error does the same. Every minute
 * it purges rows past a 7-day retention, a bounded slice at a time.
 *
 * It is written to be copied: it includes nothing of this tree but the installed
 * <outbox/inbox.h> and uses rabbitmq-c and libpq directly. The tests and the benchmark share
 * their own consumer (bench/drive/consumer.c), which records every delivery for assertions;
 * folding the two together would tie the example to that code. */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <libpq-fe.h>

#include <outbox/inbox.h>

#define SEEN_MAX 4096
#define PREFETCH 100 /* unacked deliveries the broker sends ahead */

#define INBOX_LEASE_MS     30000                    /* longer than the work takes */
#define INBOX_RETENTION_MS (7LL * 24 * 3600 * 1000) /* longer than any redelivery */
#define INBOX_PURGE_EVERY  60                       /* seconds */
#define INBOX_PURGE_SLICE  1000                     /* rows per purge statement */
#define INBOX_PURGE_SLICES 10                       /* statements per purge round */

static const struct timespec requeue_wait = { 1, 0 }; /* before handing a message back */

static char *seen[SEEN_MAX];
static size_t n_seen;

/* A tiny in-memory dedupe window, used without INBOX_DATABASE_URL; real consumers keep it in
 * their database, next to the work the message causes, so that both commit together. */
static int seen_before(const char *id)
{
	for (size_t i = 0; i < n_seen; i++)
		if (strcmp(seen[i], id) == 0)
			return 1;
	if (n_seen < SEEN_MAX) {
		char *copy = strdup(id);

		if (copy)
			seen[n_seen++] = copy;
	}
	return 0;
}

/* The database mode's state: one connection, used only by the consume loop. */
struct inbox_db {
	PGconn *conn;
	const char *table;  /* NULL = "inbox" */
	char consumer[160]; /* host:pid, unique while this process runs */
	time_t next_purge;  /* monotonic seconds */
};

enum verdict {
	VERDICT_ACK,     /* done (now or before): the broker may forget the delivery */
	VERDICT_REQUEUE, /* not done: hand it back so that it comes again */
};

static time_t mono_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec;
}

static int rpc_ok(amqp_connection_state_t c, const char *what)
{
	amqp_rpc_reply_t r = amqp_get_rpc_reply(c);

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 1;
	fprintf(stderr, "consumer: could not %s (reply type %d)\n", what, (int)r.reply_type);
	return 0;
}

static void print_message(const char *what, const char *id, const amqp_envelope_t *env)
{
	printf("%s message_id=%s routing_key=%.*s body=%.*s\n", what, id, (int)env->routing_key.len,
	       (const char *)env->routing_key.bytes, (int)env->message.body.len,
	       (const char *)env->message.body.bytes);
	fflush(stdout);
}

/* Runs a statement without parameters; 0 when it did what it says. COMMIT of a transaction
 * that failed answers "ROLLBACK", which is a failure here. */
static int db_run(struct inbox_db *db, const char *sql)
{
	PGresult *res = PQexec(db->conn, sql);
	int ok = PQresultStatus(res) == PGRES_COMMAND_OK &&
	         (strcmp(sql, "COMMIT") != 0 || strcmp(PQcmdStatus(res), "COMMIT") == 0);

	if (!ok) {
		const char *msg = res ? PQresultErrorMessage(res) : PQerrorMessage(db->conn);

		fprintf(stderr, "consumer: database: %s failed: %s", sql,
		        msg && msg[0] ? msg : "the transaction was rolled back\n");
	}
	PQclear(res);
	return ok ? 0 : -1;
}

/* Opens the connection and creates the inbox table if missing; 0 or -1 (message printed). */
static int db_open(struct inbox_db *db, const char *conninfo)
{
	char host[100] = "", err[256];

	db->table = getenv("INBOX_TABLE");
	if (db->table && !db->table[0])
		db->table = NULL;
	if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
		snprintf(host, sizeof(host), "%s", "consumer");
	snprintf(db->consumer, sizeof(db->consumer), "%s:%ld", host, (long)getpid());
	db->conn = PQconnectdb(conninfo);
	if (PQstatus(db->conn) != CONNECTION_OK) {
		fprintf(stderr, "consumer: could not connect to the inbox database: %s",
		        PQerrorMessage(db->conn));
		return -1;
	}
	/* CREATE ... IF NOT EXISTS reports an existing table as a notice: not news here. */
	if (db_run(db, "SET client_min_messages = warning") != 0)
		return -1;
	if (inbox_migrate(db->conn, db->table, err, sizeof(err)) != INBOX_OK) {
		fprintf(stderr, "consumer: %s\n", err);
		return -1;
	}
	db->next_purge = mono_seconds() + INBOX_PURGE_EVERY;
	return 0;
}

/* After an error: a broken connection is reopened before the next message (libpq blocks for
 * the attempt; if the server is still away the next message fails the same way). */
static void db_recover(struct inbox_db *db)
{
	if (PQstatus(db->conn) == CONNECTION_BAD) {
		PQreset(db->conn);
		if (PQstatus(db->conn) == CONNECTION_OK)
			(void)db_run(db, "SET client_min_messages = warning");
	}
}

/* claim -> work -> confirm -> commit for one delivery; the caller acks or requeues after. */
static enum verdict db_handle(struct inbox_db *db, const char *id, const amqp_envelope_t *env)
{
	char err[256] = "";
	int rc;

	if (PQstatus(db->conn) == CONNECTION_BAD)
		db_recover(db);
	if (db_run(db, "BEGIN") != 0)
		goto requeue;
	rc = inbox_claim(db->conn, db->table, id, db->consumer, INBOX_LEASE_MS, err, sizeof(err));
	switch (rc) {
	case INBOX_CLAIMED:
		break;
	case INBOX_DONE:
		(void)db_run(db, "ROLLBACK");
		print_message("duplicate", id, env);
		return VERDICT_ACK;
	case INBOX_BUSY:
		(void)db_run(db, "ROLLBACK");
		printf("busy message_id=%s (another consumer holds it), requeued\n", id);
		fflush(stdout);
		goto requeue_quiet;
	case INBOX_ERR_INVALID:
		/* Not an id this inbox can hold (longer than 64 characters, not UTF-8): it cannot
		 * be deduplicated, so it is handled like a message without one. */
		(void)db_run(db, "ROLLBACK");
		print_message("received (not deduplicated)", id, env);
		return VERDICT_ACK;
	default:
		fprintf(stderr, "consumer: %s\n", err);
		(void)db_run(db, "ROLLBACK");
		goto requeue;
	}

	/* The work. Printing is outside the transaction, so a failed commit below prints it
	 * again when the message comes back; work done with SQL on db->conn would not. */
	print_message("received", id, env);

	rc = inbox_confirm(db->conn, db->table, id, db->consumer, err, sizeof(err));
	if (rc == INBOX_LOST) {
		(void)db_run(db, "ROLLBACK");
		printf("lost message_id=%s (its lease ran out and another consumer took it), "
		       "requeued\n",
		       id);
		fflush(stdout);
		goto requeue_quiet;
	}
	if (rc != INBOX_OK) {
		fprintf(stderr, "consumer: %s\n", err);
		(void)db_run(db, "ROLLBACK");
		goto requeue;
	}
	if (db_run(db, "COMMIT") != 0)
		goto requeue;
	return VERDICT_ACK;

requeue:
	db_recover(db);
	printf("failed message_id=%s (database error), requeued\n", id);
	fflush(stdout);
requeue_quiet:
	/* Pause before handing it back: whoever holds it, or the database, needs a moment, and
	 * the broker would otherwise redeliver it to us at once. */
	nanosleep(&requeue_wait, NULL);
	return VERDICT_REQUEUE;
}

/* Off the hot path, between deliveries: a bounded number of bounded slices, each its own
 * autocommit statement, so no slice holds many row locks for long. */
static void db_maybe_purge(struct inbox_db *db)
{
	char err[256];
	int64_t n = 0, total = 0;

	if (mono_seconds() < db->next_purge)
		return;
	db->next_purge = mono_seconds() + INBOX_PURGE_EVERY;
	if (PQstatus(db->conn) != CONNECTION_OK)
		return;
	for (int i = 0; i < INBOX_PURGE_SLICES; i++) {
		n = inbox_purge(db->conn, db->table, INBOX_RETENTION_MS, INBOX_PURGE_SLICE, err,
		                sizeof(err));
		if (n < 0) {
			fprintf(stderr, "consumer: %s\n", err);
			break;
		}
		total += n;
		if (n < INBOX_PURGE_SLICE)
			break;
	}
	if (total > 0) {
		printf("purged %lld inbox rows past retention\n", (long long)total);
		fflush(stdout);
	}
}

int main(int argc, char **argv)
{
	struct amqp_connection_info ci;
	amqp_connection_state_t c = NULL;
	amqp_socket_t *sock;
	struct inbox_db db = { 0 };
	const char *db_url = getenv("INBOX_DATABASE_URL");
	char *url = NULL;
	long seconds = 0;
	time_t until;
	int rc = 1;

	if (argc < 5) {
		fputs("usage: outbox-demo-consumer AMQP_URL QUEUE EXCHANGE BINDING_KEY [SECONDS]\n",
		      stderr);
		return 2;
	}
	if (argc > 5) {
		char *end;

		errno = 0;
		seconds = strtol(argv[5], &end, 10);
		if (errno || *end || seconds < 0) {
			fprintf(stderr, "consumer: SECONDS must be a whole number, got '%s'\n",
			        argv[5]);
			return 2;
		}
	}
	if (db_url && db_url[0] && db_open(&db, db_url) != 0)
		goto out;
	url = strdup(argv[1]);
	if (!url || amqp_parse_url(url, &ci) != AMQP_STATUS_OK) {
		fprintf(stderr, "consumer: not an AMQP URL: '%s'\n", argv[1]);
		goto out;
	}
	if (!ci.vhost || !ci.vhost[0])
		ci.vhost = "/";
	c = amqp_new_connection();
	sock = amqp_tcp_socket_new(c);
	if (!sock || amqp_socket_open(sock, ci.host, ci.port) != AMQP_STATUS_OK) {
		fprintf(stderr, "consumer: could not connect to %s:%d\n", ci.host, ci.port);
		goto out;
	}
	if (amqp_login(c, ci.vhost, 0, 131072, 30, AMQP_SASL_METHOD_PLAIN, ci.user, ci.password)
	            .reply_type != AMQP_RESPONSE_NORMAL) {
		fputs("consumer: login refused\n", stderr);
		goto out;
	}
	amqp_channel_open(c, 1);
	if (!rpc_ok(c, "open a channel"))
		goto out;
	amqp_queue_declare(c, 1, amqp_cstring_bytes(argv[2]), 0, 1, 0, 0, amqp_empty_table);
	if (!rpc_ok(c, "declare the queue"))
		goto out;
	if (argv[3][0]) {
		amqp_queue_bind(c, 1, amqp_cstring_bytes(argv[2]), amqp_cstring_bytes(argv[3]),
		                amqp_cstring_bytes(argv[4]), amqp_empty_table);
		if (!rpc_ok(c, "bind the queue"))
			goto out;
	}
	/* A bounded prefetch: while one message waits (a pause before a requeue, a slow
	 * database), the broker keeps the rest for other consumers of the queue. */
	amqp_basic_qos(c, 1, 0, PREFETCH, 0);
	if (!rpc_ok(c, "set the prefetch"))
		goto out;
	amqp_basic_consume(c, 1, amqp_cstring_bytes(argv[2]), amqp_empty_bytes, 0, 0, 0,
	                   amqp_empty_table);
	if (!rpc_ok(c, "consume"))
		goto out;
	printf("consumer: waiting on queue '%s' (bound to '%s' with '%s')%s\n", argv[2], argv[3],
	       argv[4], db.conn ? ", deduplicating in the database" : "");
	fflush(stdout);

	until = seconds ? time(NULL) + seconds : 0;
	for (;;) {
		amqp_envelope_t env;
		struct timeval tv = { 1, 0 };
		amqp_rpc_reply_t r;
		char id[256] = ""; /* an AMQP short string is at most 255 bytes */
		int has_id = 0;

		if (until && time(NULL) >= until)
			break;
		if (db.conn)
			db_maybe_purge(&db);
		amqp_maybe_release_buffers(c);
		r = amqp_consume_message(c, &env, &tv, 0);
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
		    r.library_error == AMQP_STATUS_TIMEOUT)
			continue;
		if (r.reply_type != AMQP_RESPONSE_NORMAL) {
			fputs("consumer: connection lost\n", stderr);
			goto out;
		}
		if (env.message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
			amqp_bytes_t m = env.message.properties.message_id;

			snprintf(id, sizeof(id), "%.*s", (int)m.len, (const char *)m.bytes);
			/* An id with a NUL byte inside would be cut short and could match another. */
			has_id = m.len > 0 && strlen(id) == m.len;
		}
		if (!db.conn) {
			print_message(seen_before(id) ? "duplicate" : "received", id, &env);
			amqp_basic_ack(c, 1, env.delivery_tag, 0);
		} else if (!has_id) {
			print_message("received (not deduplicated)", id, &env);
			amqp_basic_ack(c, 1, env.delivery_tag, 0);
		} else if (db_handle(&db, id, &env) == VERDICT_ACK) {
			amqp_basic_ack(c, 1, env.delivery_tag, 0);
		} else {
			amqp_basic_reject(c, 1, env.delivery_tag, 1);
		}
		amqp_destroy_envelope(&env);
	}
	rc = 0;
out:
	if (c) {
		amqp_connection_close(c, AMQP_REPLY_SUCCESS);
		amqp_destroy_connection(c);
	}
	PQfinish(db.conn);
	for (size_t i = 0; i < n_seen; i++)
		free(seen[i]);
	free(url);
	return rc;
}
