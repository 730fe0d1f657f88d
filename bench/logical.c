/* A logical replication client (logical.h): START_REPLICATION on a pgoutput slot over libpq's
 * COPY BOTH, the protocol's XLogData and keepalive messages, pgoutput's begin, relation, insert
 * and commit messages (protocol version 1, values as text), standby status updates. */
#include "bench/logical.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <libpq-fe.h>

#include "bench/bench.h"

/* Microseconds from the Unix epoch to PostgreSQL's (2000-01-01), for the status update's
 * clock. */
#define PG_EPOCH_US 946684800000000LL

struct logical_stream {
	PGconn *conn;
	char *msg;           /* the CopyData message being read (PQfreemem()), or NULL */
	size_t len, at;      /* its length and how far it has been read */
	uint64_t received;   /* the WAL end the server last reported: for the status update */
	uint64_t acked;      /* the last position acknowledged */
	uint64_t commit_end; /* the end of the last commit read */
};

static void set_err(char *err, size_t errlen, const char *what, const char *detail)
{
	if (errlen > 0)
		snprintf(err, errlen, "%s%s", what, detail);
}

static uint64_t get_u64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

static uint32_t get_u32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_u64(unsigned char *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--) {
		p[i] = (unsigned char)(v & 0xff);
		v >>= 8;
	}
}

static void free_msg(struct logical_stream *s)
{
	if (s->msg)
		PQfreemem(s->msg);
	s->msg = NULL;
	s->len = s->at = 0;
}

struct logical_stream *logical_start(const char *conninfo, const char *slot, const char *pub,
                                     char *err, size_t errlen)
{
	struct logical_stream *s = calloc(1, sizeof(*s));
	size_t len = strlen(conninfo) + 96;
	char *ci = malloc(len), sql[512];
	PGresult *r;

	if (!s || !ci) {
		set_err(err, errlen, "out of memory", "");
		goto fail;
	}
	snprintf(ci, len, "%s replication=database application_name=outbox_bench_sources",
	         conninfo);
	s->conn = PQconnectdb(ci);
	if (PQstatus(s->conn) != CONNECTION_OK) {
		set_err(err, errlen,
		        "could not open a replication connection: ", PQerrorMessage(s->conn));
		goto fail;
	}
	/* 0/0: from the slot's confirmed position. The names are the benchmark's own. */
	snprintf(sql, sizeof(sql),
	         "START_REPLICATION SLOT %s LOGICAL 0/0 (proto_version '1', "
	         "publication_names '%s')",
	         slot, pub);
	r = PQexec(s->conn, sql);
	if (PQresultStatus(r) != PGRES_COPY_BOTH) {
		set_err(err, errlen, "START_REPLICATION: ", PQerrorMessage(s->conn));
		PQclear(r);
		goto fail;
	}
	PQclear(r);
	free(ci);
	return s;
fail:
	free(ci);
	logical_stop(s);
	return NULL;
}

pid_t logical_backend(const struct logical_stream *s)
{
	return (pid_t)PQbackendPID(s->conn);
}

uint64_t logical_commit_end(const struct logical_stream *s)
{
	return s->commit_end;
}

int logical_ack(struct logical_stream *s, uint64_t lsn, char *err, size_t errlen)
{
	unsigned char m[34];
	struct timespec ts;
	int64_t now_us;

	clock_gettime(CLOCK_REALTIME, &ts);
	now_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 - PG_EPOCH_US;
	/* 'r': written, flushed and applied up to lsn; the clock; no reply wanted. */
	m[0] = 'r';
	put_u64(m + 1, lsn);
	put_u64(m + 9, lsn);
	put_u64(m + 17, lsn);
	put_u64(m + 25, (uint64_t)now_us);
	m[33] = 0;
	if (PQputCopyData(s->conn, (const char *)m, (int)sizeof(m)) != 1 || PQflush(s->conn) != 0) {
		set_err(err, errlen, "could not send a status update: ", PQerrorMessage(s->conn));
		return -1;
	}
	s->acked = lsn;
	return 0;
}

/* The next CopyData message into s->msg: 1, 0 when none came within timeout_ms, -1 on error. */
static int next_msg(struct logical_stream *s, int timeout_ms, char *err, size_t errlen)
{
	int64_t deadline = bench_mono_us() + (int64_t)timeout_ms * 1000;

	free_msg(s);
	for (;;) {
		char *buf = NULL;
		int n = PQgetCopyData(s->conn, &buf, 1);
		struct pollfd pf = { PQsocket(s->conn), POLLIN, 0 };
		int64_t left;

		if (n > 0) {
			s->msg = buf;
			s->len = (size_t)n;
			return 1;
		}
		if (n == -1) {
			set_err(err, errlen, "the server ended the stream", "");
			return -1;
		}
		if (n < -1) {
			set_err(err, errlen,
			        "could not read the stream: ", PQerrorMessage(s->conn));
			return -1;
		}
		left = (deadline - bench_mono_us()) / 1000;
		if (left <= 0 || bench_interrupted())
			return 0;
		if (poll(&pf, 1, (int)left) < 0 && errno != EINTR) {
			set_err(err, errlen, "poll: ", strerror(errno));
			return -1;
		}
		if (PQconsumeInput(s->conn) != 1) {
			set_err(err, errlen,
			        "could not read the stream: ", PQerrorMessage(s->conn));
			return -1;
		}
	}
}

/* Reads an insert's tuple (p .. end: Int16 columns, then per column 'n', 'u' or 't' with an
 * Int32 length and the text) into row; -1 when it is cut short. */
static int read_tuple(const unsigned char *p, const unsigned char *end, struct logical_row *row)
{
	int ncols;

	row->seq = -1;
	row->body_len = 0;
	if (end - p < 2)
		return -1;
	ncols = p[0] << 8 | p[1];
	p += 2;
	for (int i = 0; i < ncols; i++) {
		uint32_t len;

		if (p >= end)
			return -1;
		if (*p == 'n' || *p == 'u') {
			p++;
			continue;
		}
		if (*p != 't' || end - p < 5)
			return -1;
		len = get_u32(p + 1);
		p += 5;
		if ((size_t)(end - p) < len)
			return -1;
		if (i == 0 && len > 0 && len < 21) {
			char num[24], *e;
			long long v;

			memcpy(num, p, len);
			num[len] = '\0';
			errno = 0;
			v = strtoll(num, &e, 10);
			if (!errno && !*e)
				row->seq = v;
		} else if (i == 4) {
			row->body_len = len;
		}
		p += len;
	}
	return 0;
}

int logical_next(struct logical_stream *s, int timeout_ms, struct logical_row *row, char *err,
                 size_t errlen)
{
	int64_t deadline = bench_mono_us() + (int64_t)timeout_ms * 1000;

	for (;;) {
		const unsigned char *m, *end;
		int64_t left_ms = (deadline - bench_mono_us()) / 1000;
		int rc = next_msg(s, left_ms > 0 ? (int)left_ms : 0, err, errlen);

		if (rc <= 0)
			return rc;
		m = (const unsigned char *)s->msg;
		end = m + s->len;
		if (m[0] == 'k') {
			/* Keepalive: walEnd, sendTime, replyRequested. */
			if (s->len < 18) {
				set_err(err, errlen, "a keepalive cut short", "");
				return -1;
			}
			s->received = get_u64(m + 1);
			if (m[17] && logical_ack(s, s->acked, err, errlen) != 0)
				return -1;
			continue;
		}
		if (m[0] != 'w' || s->len < 26) {
			set_err(err, errlen, "a message not understood", "");
			return -1;
		}
		/* XLogData: dataStart, walEnd, sendTime, then one pgoutput message. */
		s->received = get_u64(m + 9);
		m += 25;
		switch (m[0]) {
		case 'I':
			/* relation OID, 'N', the new tuple */
			if (end - m < 6 || m[5] != 'N' || read_tuple(m + 6, end, row) != 0) {
				set_err(err, errlen, "an insert message not understood", "");
				return -1;
			}
			return 1;
		case 'C':
			/* flags, the commit's LSN, the end of the transaction, its time */
			if (end - m < 26) {
				set_err(err, errlen, "a commit message cut short", "");
				return -1;
			}
			s->commit_end = get_u64(m + 10);
			break;
		default:
			/* Begin, relation, type, origin: nothing the prototype needs. */
			break;
		}
	}
}

void logical_stop(struct logical_stream *s)
{
	if (!s)
		return;
	free_msg(s);
	if (s->conn && PQstatus(s->conn) == CONNECTION_OK) {
		/* Nothing to do if it fails: closing the connection ends the walsender anyway. */
		if (PQputCopyEnd(s->conn, NULL) == 1)
			(void)PQflush(s->conn);
	}
	PQfinish(s->conn);
	free(s);
}
