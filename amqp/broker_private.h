/* Internals shared by the broker's .c files (not installed, not for other modules): the
 * handle and its constants, and the helpers that cross files: error text, dropping the
 * connection, waiting on the socket, reading frames, RPCs and opening the channels. */
#ifndef OUTBOX_AMQP_BROKER_PRIVATE_H
#define OUTBOX_AMQP_BROKER_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <amqp.h>

#include "amqp/broker.h"
#include "amqp/confirm_tracker.h"

#define PUBLISH_CHANNEL 1
#define CHECK_CHANNEL   2 /* passive declares: a 404 there must not close the publish channel */
#define NODE_NAME_MAX   300
#define NODES_MAX       32 /* URLs in amqp.url */
#define CLOSE_TEXT_MAX  256
/* Bodies up to this size are published in the pipeline at once. A larger body, until one at
 * least as large has been answered on this connection, is published alone after the rest of
 * the batch is answered: if it exceeds the broker's max_message_size, the channel close that
 * follows can only be its own, and no good row in flight is published twice. */
#define PIPELINE_BODY_MAX (128 * 1024)

/* Outcomes of broker_wait_method() besides errors (< 0). */
enum { W_DEADLINE = 0, W_GOT = 1, W_CHANNEL_CLOSED = 2, W_CONNECTION_CLOSED = 3 };

struct node {
	char *buf; /* amqp_parse_url() points into it */
	struct amqp_connection_info ci;
	char name[NODE_NAME_MAX]; /* "host:port" */
};

struct broker {
	struct broker_options opts; /* strings borrowed */
	char errmsg[512];

	/* The nodes of amqp.url, parsed by the first broker_connect(). */
	struct node *nodes;
	size_t nnodes;
	bool parsed;
	char parse_err[256]; /* set when the URL list is invalid */
	bool started;        /* the first round's random start was drawn */
	size_t next_node;    /* where the next broker_connect() starts */
	size_t cur_node;     /* in use while connected */
	char node_name[NODE_NAME_MAX];

	amqp_connection_state_t conn;
	bool connected;
	bool blocked;
	int64_t blocked_since_ms;
	bool check_open;   /* CHECK_CHANNEL is open */
	uint64_t max_body; /* max_message_size learnt from a 406 on this connection; 0 = unknown */
	int64_t batch_deadline_ms; /* broker_set_batch_deadline(); 0 = none */
	bool connecting;           /* inside broker_connect(): a stop ends its waits at once */
	size_t proven_body;     /* bodies up to this size go in the pipeline (PIPELINE_BODY_MAX) */
	bool skip_frame_check;  /* broker_test_skip_frame_check() */
	unsigned char *scratch; /* re-encodes the properties of a row whose publish failed */
	size_t scratch_len;
	/* Frames encoded by frame_writer.c, not yet written (whole messages only). */
	unsigned char *out;
	size_t out_len, out_cap;
	bool out_batch; /* inside a batch's writing: the buffer is written when full or done */

	/* broker_interrupt(): the socket it may shut down, and a pipe that wakes our polls. */
	pthread_mutex_t fd_lock;
	int live_fd; /* under fd_lock; -1 when no connection holds a socket */
	atomic_bool interrupted;
	int intr_pipe[2];

	/* The last connection.close or channel.close answering one of our requests. */
	int rpc_close_code;
	char rpc_close_text[CLOSE_TEXT_MAX];

	/* The batch in flight: set by broker_publish(), answered by broker_confirm(). */
	const struct outbox_row *msgs;
	struct broker_result *res;
	size_t n;
	bool active;
	bool channel_closed; /* channel.close on the publish channel, answered */
	int close_code;
	char close_text[CLOSE_TEXT_MAX];
	bool return_pending; /* basic.return read, its content header not yet */
	char ret_exchange[256], ret_rkey[256];

	amqp_pool_t pool; /* per-batch tables and decoded bodies, recycled */
	amqp_basic_properties_t *props;
	amqp_bytes_t *bodies;
	size_t map_cap;
	struct confirm_tracker tracker;

	char **known; /* exchanges seen to exist on this connection */
	size_t nknown;
};

/* ---- broker.c: the handle and what every file shares ---- */
/* Formats the handle's error text (broker_errmsg()). */
void broker_set_err(struct broker *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Frees the exchanges seen to exist on this connection (publish.c checks the others). */
void broker_forget_exchanges(struct broker *b);
/* Frees the parsed nodes of amqp.url. */
void broker_free_nodes(struct broker *b);

/* ---- url.c: reading amqp.url ---- */
/* Splits url (may be NULL) at commas and parses each URL into *out, a new array of *nout nodes
 * (free with broker_url_nodes_free). BROKER_OK; BROKER_ERR_CONFIG with one line in err that
 * names the URL by position and says what is wrong, never quoting it; BROKER_ERR_NOMEM. Nothing
 * is written to *out or *nout on failure. */
int broker_url_parse(const char *url, struct node **out, size_t *nout, char *err, size_t n)
        __attribute__((warn_unused_result));
void broker_url_nodes_free(struct node *nodes, size_t nnodes); /* accepts NULL */
/* The shutdown deadline (CLOCK_MONOTONIC ms) as it stands now; 0 = none. */
int64_t broker_abort_at(const struct broker *b);
/* Stores now_ms in opts.progress_ms when it is set: the wait is still working. */
void broker_touch_progress(struct broker *b, int64_t now_ms);
/* Drops the connection without a polite close (the socket may be dead) and returns
 * BROKER_ERR_CONN; the error text is the caller's. */
int broker_lost(struct broker *b);
/* Sets "interrupted at the shutdown deadline while <what>", drops the connection and returns
 * BROKER_ERR_ABORTED. */
int broker_interrupted_err(struct broker *b, const char *what);
/* A rabbitmq-c read or write failed with status: drops the connection and returns
 * BROKER_ERR_CONN, or BROKER_ERR_ABORTED after broker_interrupt(). */
int broker_io_failed(struct broker *b, const char *what, int status);

/* ---- frame_writer.c: a batch's publishes written 64 kB at a time ---- */
/* The connection is plain TCP: publishes may be encoded here and written by us. */
bool broker_out_direct(const struct broker *b);
/* Appends a basic.publish (mandatory) of body with props on channel ch, its method, content
 * header and body frames, to the buffer, and writes the buffer once it holds 64 kB. 1 when
 * appended; 0 when rabbitmq-c's encoders refused it (nothing appended: publish it through
 * rabbitmq-c, which says why); BROKER_ERR_NOMEM (nothing appended, the connection kept); or
 * another error (the connection dropped on a failed write). */
int broker_out_append(struct broker *b, amqp_channel_t ch, amqp_bytes_t exchange,
                      amqp_bytes_t routing_key, const amqp_basic_properties_t *props,
                      amqp_bytes_t body) __attribute__((warn_unused_result));
/* Writes what is buffered, waiting on a full socket as rabbitmq-c does (only a stop or
 * broker_interrupt() ends that wait). BROKER_OK, or an error (connection dropped). */
int broker_out_flush(struct broker *b) __attribute__((warn_unused_result));

/* ---- frames.c: reading and answering frames ---- */
/* Lets rabbitmq-c recycle channel ch's buffers: anything decoded there must be copied first. */
void broker_release_channel(struct broker *b, amqp_channel_t ch);
/* Waits until fd is ready for events: 1, 0 when deadline_ms passed, or BROKER_ERR_ABORTED
 * (the shutdown deadline or broker_interrupt(); connection dropped) or another error. */
int broker_wait_fd(struct broker *b, int fd, short events, int64_t deadline_ms, const char *what);
/* Reads and handles one frame by deadline_ms: 1 when one was handled, 0 at the deadline, or
 * an error. */
int broker_read_frame(struct broker *b, int64_t deadline_ms, const char *what);
/* Handles every frame already received without waiting for more. */
int broker_drain(struct broker *b);
/* Waits for method reply_id on channel ch, handling every other frame on the way: W_GOT with
 * *out (in the channel's buffers: copy, then broker_release_channel()), W_DEADLINE,
 * W_CHANNEL_CLOSED or W_CONNECTION_CLOSED (reply in rpc_close_*), or an error. */
int broker_wait_method(struct broker *b, amqp_channel_t ch, amqp_method_number_t reply_id,
                       int64_t deadline_ms, const char *what, amqp_method_t *out);
/* Sends method id (req) on ch and waits for reply_id, as broker_wait_method(). */
int broker_rpc(struct broker *b, amqp_channel_t ch, amqp_method_number_t id, void *req,
               amqp_method_number_t reply_id, int64_t deadline_ms, const char *what,
               amqp_method_t *out);
/* Turns a broker_rpc() outcome other than W_GOT into an error with "doing: why". */
int broker_rpc_failed(struct broker *b, int rc, const char *doing);
/* Opens PUBLISH_CHANNEL and selects confirm mode (delivery tags start again). */
int broker_open_publish_channel(struct broker *b, int64_t deadline_ms);
/* Opens CHECK_CHANNEL, where the passive exchange declares go. */
int broker_open_check_channel(struct broker *b, int64_t deadline_ms);

#endif
