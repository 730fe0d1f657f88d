/* A test's own connection to the test broker for declaring, binding and deleting. */
#include "tests/support/amqp_admin.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <amqp_tcp_socket.h>

#include "tests/support/harness.h"

void amqp_admin_check(amqp_connection_state_t c, const char *what)
{
	amqp_rpc_reply_t r = amqp_get_rpc_reply(c);

	cr_assert_eq(r.reply_type, AMQP_RESPONSE_NORMAL, "%s failed (reply type %d)", what,
	             (int)r.reply_type);
}

amqp_connection_state_t amqp_admin_open(void)
{
	char *url = strdup(harness_amqp_url());
	struct amqp_connection_info ci;
	amqp_connection_state_t c = amqp_new_connection();
	amqp_socket_t *s = amqp_tcp_socket_new(c);
	amqp_rpc_reply_t r;

	cr_assert_not_null(url);
	cr_assert_not_null(s);
	cr_assert_eq(amqp_parse_url(url, &ci), AMQP_STATUS_OK, "RELAY_TEST_AMQP does not parse");
	cr_assert_eq(amqp_socket_open(s, ci.host, ci.port), AMQP_STATUS_OK,
	             "RabbitMQ at RELAY_TEST_AMQP is unreachable");
	r = amqp_login(c, ci.vhost[0] ? ci.vhost : "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
	               ci.user, ci.password);
	cr_assert_eq(r.reply_type, AMQP_RESPONSE_NORMAL, "admin login failed");
	amqp_channel_open(c, 1);
	amqp_admin_check(c, "channel.open");
	free(url);
	return c;
}

void amqp_admin_close(amqp_connection_state_t c)
{
	(void)amqp_channel_close(c, 1, AMQP_REPLY_SUCCESS);
	(void)amqp_connection_close(c, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(c);
}

void amqp_admin_queue(amqp_connection_state_t c, const char *q, const char *exchange,
                      const char *key, bool exclusive, amqp_table_t args)
{
	amqp_queue_declare(c, 1, amqp_cstring_bytes(q), 0, 0, exclusive ? 1 : 0, 0, args);
	amqp_admin_check(c, "queue.declare");
	amqp_queue_bind(c, 1, amqp_cstring_bytes(q), amqp_cstring_bytes(exchange),
	                amqp_cstring_bytes(key), amqp_empty_table);
	amqp_admin_check(c, "queue.bind");
}

void amqp_admin_full_queue(amqp_connection_state_t c, const char *q, const char *exchange,
                           const char *key, int max_length, bool exclusive)
{
	amqp_table_entry_t e[2];
	amqp_table_t args = { 2, e };

	e[0].key = amqp_cstring_bytes("x-max-length");
	e[0].value.kind = AMQP_FIELD_KIND_I32;
	e[0].value.value.i32 = max_length;
	e[1].key = amqp_cstring_bytes("x-overflow");
	e[1].value.kind = AMQP_FIELD_KIND_UTF8;
	e[1].value.value.bytes = amqp_cstring_bytes("reject-publish");
	amqp_admin_queue(c, q, exchange, key, exclusive, args);
}
