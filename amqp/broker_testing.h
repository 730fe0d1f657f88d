/* Test seams of the broker (amqp/broker.c, amqp/publish.c): switches that let a test reach a
 * failure path the normal checks make unreachable. Never used by the relay. */
#ifndef OUTBOX_AMQP_BROKER_TESTING_H
#define OUTBOX_AMQP_BROKER_TESTING_H

#include <stdbool.h>

#include "amqp/broker.h"

/* skip: broker_publish() no longer compares each row's content header with the frame size,
 * so that rabbitmq-c itself fails the publish ("table too large for buffer") and the
 * handling of a library failure caused by one row can be tested. */
void broker_test_skip_frame_check(struct broker *b, bool skip);

#endif
