/* The broker handle (one RabbitMQ connection, rabbitmq-c 0.11): its life, accessors and error
 * text, and what every broker file shares: the shutdown deadline, progress, and dropping a
 * connection that is gone. */
#include "amqp/broker.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <amqp.h>

#include "amqp/broker_private.h"
#include "amqp/broker_testing.h"
#include "amqp/confirm_tracker.h"

#define POOL_PAGE (256 * 1024) /* bodies below this stay in recycled pages, no malloc */

void broker_set_err(struct broker *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b->errmsg, sizeof(b->errmsg), fmt, ap);
	va_end(ap);
}

static void close_pipe(struct broker *b)
{
	for (int i = 0; i < 2; i++) {
		if (b->intr_pipe[i] >= 0)
			close(b->intr_pipe[i]);
		b->intr_pipe[i] = -1;
	}
}

struct broker *broker_new(const struct broker_options *opts)
{
	struct broker *b = calloc(1, sizeof(*b));

	if (b == NULL)
		return NULL;
	b->opts = *opts;
	b->live_fd = -1;
	b->proven_body = PIPELINE_BODY_MAX;
	atomic_init(&b->interrupted, false);
	if (pipe2(b->intr_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
		free(b);
		return NULL;
	}
	if (pthread_mutex_init(&b->fd_lock, NULL) != 0) {
		close_pipe(b);
		free(b);
		return NULL;
	}
	init_amqp_pool(&b->pool, POOL_PAGE);
	confirm_tracker_init(&b->tracker);
	return b;
}

void broker_forget_exchanges(struct broker *b)
{
	for (size_t i = 0; i < b->nknown; i++)
		free(b->known[i]);
	b->nknown = 0;
}

void broker_free_nodes(struct broker *b)
{
	for (size_t i = 0; i < b->nnodes; i++)
		free(b->nodes[i].buf);
	free(b->nodes);
	b->nodes = NULL;
	b->nnodes = 0;
}

void broker_free(struct broker *b)
{
	if (b == NULL)
		return;
	broker_disconnect(b);
	broker_forget_exchanges(b);
	free(b->known);
	empty_amqp_pool(&b->pool);
	free(b->props);
	free(b->bodies);
	free(b->scratch);
	free(b->out);
	confirm_tracker_free(&b->tracker);
	broker_free_nodes(b);
	close_pipe(b);
	pthread_mutex_destroy(&b->fd_lock);
	free(b);
}

const char *broker_errmsg(const struct broker *b)
{
	return b->errmsg;
}

bool broker_connected(const struct broker *b)
{
	return b->connected;
}

bool broker_blocked(const struct broker *b)
{
	return b->connected && b->blocked;
}

int broker_fd(const struct broker *b)
{
	if (!b->connected || b->conn == NULL)
		return -1;
	return amqp_get_sockfd(b->conn);
}

const char *broker_node(const struct broker *b)
{
	return b->node_name;
}

void broker_test_skip_frame_check(struct broker *b, bool skip)
{
	b->skip_frame_check = skip;
}

int64_t broker_abort_at(const struct broker *b)
{
	return b->opts.abort_at_ms != NULL ? (int64_t)atomic_load(b->opts.abort_at_ms) : 0;
}

void broker_touch_progress(struct broker *b, int64_t now_ms)
{
	if (b->opts.progress_ms != NULL)
		atomic_store(b->opts.progress_ms, (long long)now_ms);
}

/* The connection is unusable: drop it without a polite close (the socket may be dead). The
 * socket leaves broker_interrupt()'s reach before it is closed, so that a descriptor number
 * reused by someone else is never shut down. */
int broker_lost(struct broker *b)
{
	if (b->conn != NULL) {
		if (b->connected && b->nnodes > 0)
			b->next_node = (b->cur_node + 1) % b->nnodes;
		pthread_mutex_lock(&b->fd_lock);
		b->live_fd = -1;
		pthread_mutex_unlock(&b->fd_lock);
		amqp_destroy_connection(b->conn);
		b->conn = NULL;
	}
	b->connected = false;
	b->out_len = 0; /* never written on another connection */
	b->blocked = false;
	b->check_open = false;
	b->return_pending = false;
	return BROKER_ERR_CONN;
}

int broker_interrupted_err(struct broker *b, const char *what)
{
	broker_set_err(b, "interrupted at the shutdown deadline while %s", what);
	(void)broker_lost(b);
	return BROKER_ERR_ABORTED;
}

/* A rabbitmq-c read or write failed: the connection is gone. */
int broker_io_failed(struct broker *b, const char *what, int status)
{
	if (atomic_load(&b->interrupted))
		return broker_interrupted_err(b, what);
	broker_set_err(b, "connection to broker lost while %s: %s", what,
	               amqp_error_string2(status));
	return broker_lost(b);
}
