/* An example consumer for the demo: declares a queue, binds it to an exchange with a routing
 * pattern, and prints each message (id, routing key, body) as it arrives, acknowledging it
 * after printing. Delivery is at-least-once, so it also says when a message_id repeats.
 * usage: outbox-demo-consumer AMQP_URL QUEUE EXCHANGE BINDING_KEY [SECONDS] */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SEEN_MAX 4096

static char *seen[SEEN_MAX];
static size_t n_seen;

/* A tiny in-memory dedupe window; real consumers keep it in their database, next to the work
 * the message causes, so that both commit together. */
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

static int rpc_ok(amqp_connection_state_t c, const char *what)
{
	amqp_rpc_reply_t r = amqp_get_rpc_reply(c);

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 1;
	fprintf(stderr, "consumer: could not %s (reply type %d)\n", what, (int)r.reply_type);
	return 0;
}

int main(int argc, char **argv)
{
	struct amqp_connection_info ci;
	amqp_connection_state_t c = NULL;
	amqp_socket_t *sock;
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
	amqp_basic_consume(c, 1, amqp_cstring_bytes(argv[2]), amqp_empty_bytes, 0, 0, 0,
	                   amqp_empty_table);
	if (!rpc_ok(c, "consume"))
		goto out;
	printf("consumer: waiting on queue '%s' (bound to '%s' with '%s')\n", argv[2], argv[3],
	       argv[4]);
	fflush(stdout);

	until = seconds ? time(NULL) + seconds : 0;
	for (;;) {
		amqp_envelope_t env;
		struct timeval tv = { 1, 0 };
		amqp_rpc_reply_t r;
		char id[128] = "";

		if (until && time(NULL) >= until)
			break;
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
		}
		printf("%s message_id=%s routing_key=%.*s body=%.*s\n",
		       seen_before(id) ? "duplicate" : "received", id, (int)env.routing_key.len,
		       (const char *)env.routing_key.bytes, (int)env.message.body.len,
		       (const char *)env.message.body.bytes);
		fflush(stdout);
		amqp_basic_ack(c, 1, env.delivery_tag, 0);
		amqp_destroy_envelope(&env);
	}
	rc = 0;
out:
	if (c) {
		amqp_connection_close(c, AMQP_REPLY_SUCCESS);
		amqp_destroy_connection(c);
	}
	for (size_t i = 0; i < n_seen; i++)
		free(seen[i]);
	free(url);
	return rc;
}
