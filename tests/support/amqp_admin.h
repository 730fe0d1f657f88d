/* amqp_admin.h — a test's own rabbitmq-c connection to the test broker (RELAY_TEST_AMQP), for
 * what the relay never does: declaring queues with arguments, binding, deleting, reading a
 * queue with basic.get. Every failure fails the current criterion test. */
#ifndef OUTBOX_TESTS_AMQP_ADMIN_H
#define OUTBOX_TESTS_AMQP_ADMIN_H

#include <stdbool.h>

#include <amqp.h>

/* A connection with channel 1 open. Close it with amqp_admin_close(). */
amqp_connection_state_t amqp_admin_open(void);
void amqp_admin_close(amqp_connection_state_t c);

/* Fails the test unless the last RPC on c (what: its name, for the message) succeeded. */
void amqp_admin_check(amqp_connection_state_t c, const char *what);

/* Declares queue q (durable no, exclusive as asked: an exclusive queue goes with the
 * connection if the test fails) with args, and binds it to exchange with key. */
void amqp_admin_queue(amqp_connection_state_t c, const char *q, const char *exchange,
                      const char *key, bool exclusive, amqp_table_t args);

/* amqp_admin_queue() for a queue that holds max_length messages at most and then rejects
 * every publish routed to it (x-overflow reject-publish): the broker nacks each such publish.
 * With max_length 0 it rejects them all. */
void amqp_admin_full_queue(amqp_connection_state_t c, const char *q, const char *exchange,
                           const char *key, int max_length, bool exclusive);

#endif
