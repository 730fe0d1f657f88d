/* The frame writer (amqp/frame_writer.c) puts on the wire exactly the bytes rabbitmq-c's own
 * amqp_basic_publish() does: the same message is published both ways on a socket pair and the
 * bytes compared, with a body split over several frames, an empty body, and properties the
 * encoders refuse (then nothing is buffered). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_tcp_socket.h>

#include "amqp/broker_private.h"

#define SMALL_FRAME_MAX 4096

static int sv[2] = { -1, -1 };
static struct broker b;

static void setup(void)
{
	static unsigned char hello[] = { 'A', 'M', 'Q', 'P', 0, 0, 9, 1 };
	amqp_socket_t *sock;
	amqp_frame_t f;

	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	cr_assert_eq(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0);
	memset(&b, 0, sizeof(b));
	b.conn = amqp_new_connection();
	cr_assert_not_null(b.conn);
	sock = amqp_tcp_socket_new(b.conn);
	cr_assert_not_null(sock);
	amqp_tcp_socket_set_sockfd(sock, sv[0]);
	/* A connection is tuned once it has read from its server: a protocol header here. */
	cr_assert_eq(amqp_handle_input(b.conn, (amqp_bytes_t){ sizeof(hello), hello }, &f),
	             (int)sizeof(hello));
	cr_assert_eq(amqp_tune_connection(b.conn, 0, SMALL_FRAME_MAX, 0), AMQP_STATUS_OK);
}

static void teardown(void)
{
	if (b.conn)
		amqp_destroy_connection(b.conn); /* closes sv[0] */
	free(b.out);
	if (sv[1] >= 0)
		close(sv[1]);
}

/* What rabbitmq-c wrote so far, into buf; its length. */
static size_t wire(unsigned char *buf, size_t cap)
{
	size_t got = 0;

	for (;;) {
		ssize_t r = read(sv[1], buf + got, cap - got);

		if (r > 0) {
			got += (size_t)r;
			cr_assert_lt(got, cap, "more bytes than the test expects");
			continue;
		}
		cr_assert(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "read: %s",
		          strerror(errno));
		return got;
	}
}

static void props_of(amqp_basic_properties_t *p, amqp_table_entry_t *h)
{
	memset(p, 0, sizeof(*p));
	p->_flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
	            AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_HEADERS_FLAG |
	            AMQP_BASIC_TIMESTAMP_FLAG;
	p->content_type = amqp_cstring_bytes("application/json");
	p->delivery_mode = 2;
	p->message_id = amqp_cstring_bytes("order-42");
	p->timestamp = 1765000000;
	h[0].key = amqp_cstring_bytes("tenant");
	h[0].value.kind = AMQP_FIELD_KIND_UTF8;
	h[0].value.value.bytes = amqp_cstring_bytes("acme");
	p->headers.num_entries = 1;
	p->headers.entries = h;
}

/* Publishes body both ways and asserts the same bytes. */
static void same_bytes(amqp_bytes_t body)
{
	static unsigned char expect[64 * 1024];
	amqp_table_entry_t h[1];
	amqp_basic_properties_t p;
	size_t n;

	props_of(&p, h);
	cr_assert_eq(amqp_basic_publish(b.conn, 1, amqp_cstring_bytes("orders"),
	                                amqp_cstring_bytes("order.created"), 1, 0, &p, body),
	             AMQP_STATUS_OK);
	n = wire(expect, sizeof(expect));
	cr_assert_gt(n, 0);
	cr_assert_eq(broker_out_append(&b, 1, amqp_cstring_bytes("orders"),
	                               amqp_cstring_bytes("order.created"), &p, body),
	             1);
	cr_assert_eq(b.out_len, n, "the writer buffered %zu bytes, rabbitmq-c wrote %zu", b.out_len,
	             n);
	cr_assert_eq(memcmp(b.out, expect, n), 0, "the bytes differ");
}

TestSuite(frame_writer, .init = setup, .fini = teardown);

Test(frame_writer, a_body_over_several_frames_is_written_as_rabbitmq_c_writes_it)
{
	static char body[3 * SMALL_FRAME_MAX + 17];

	for (size_t i = 0; i < sizeof(body); i++)
		body[i] = (char)('a' + i % 26);
	same_bytes((amqp_bytes_t){ sizeof(body), body });
}

Test(frame_writer, an_empty_body_has_no_body_frame)
{
	same_bytes(amqp_empty_bytes);
}

Test(frame_writer, two_messages_follow_each_other_in_the_buffer)
{
	amqp_table_entry_t h[1];
	amqp_basic_properties_t p;
	amqp_bytes_t body = amqp_cstring_bytes("{\"id\":1}");
	size_t one;

	props_of(&p, h);
	cr_assert_eq(broker_out_append(&b, 1, amqp_cstring_bytes("x"), amqp_cstring_bytes("k"), &p,
	                               body),
	             1);
	one = b.out_len;
	cr_assert_eq(broker_out_append(&b, 1, amqp_cstring_bytes("x"), amqp_cstring_bytes("k"), &p,
	                               body),
	             1);
	cr_assert_eq(b.out_len, 2 * one);
	cr_assert_eq(memcmp(b.out, b.out + one, one), 0);
	cr_assert_eq(b.out[one - 1], 0xCE, "a frame ends with frame-end");
}

Test(frame_writer, properties_the_encoders_refuse_leave_nothing_buffered)
{
	static char big[SMALL_FRAME_MAX];
	amqp_table_entry_t h[1];
	amqp_basic_properties_t p;
	amqp_bytes_t body = amqp_cstring_bytes("{}");

	props_of(&p, h);
	memset(big, 'v', sizeof(big) - 1);
	h[0].value.value.bytes = amqp_cstring_bytes(big); /* a header larger than a frame */
	cr_assert_eq(broker_out_append(&b, 1, amqp_cstring_bytes("x"), amqp_cstring_bytes("k"), &p,
	                               amqp_cstring_bytes("{}")),
	             0);
	cr_assert_eq(b.out_len, 0);
	/* rabbitmq-c refuses it too: the caller's fallback reports its error. */
	cr_assert_neq(amqp_basic_publish(b.conn, 1, amqp_cstring_bytes("x"),
	                                 amqp_cstring_bytes("k"), 1, 0, &p, body),
	              AMQP_STATUS_OK);
}

Test(frame_writer, properties_larger_than_the_first_room_still_go_in_one_frame)
{
	static char big[10000];
	static unsigned char expect[64 * 1024];
	amqp_table_entry_t h[1];
	amqp_basic_properties_t p;
	amqp_bytes_t body = amqp_cstring_bytes("{}");
	size_t n;

	cr_assert_eq(amqp_tune_connection(b.conn, 0, 131072, 0), AMQP_STATUS_OK);
	props_of(&p, h);
	memset(big, 'v', sizeof(big) - 1);
	h[0].value.value.bytes = amqp_cstring_bytes(big);
	cr_assert_eq(amqp_basic_publish(b.conn, 1, amqp_cstring_bytes("x"), amqp_cstring_bytes("k"),
	                                1, 0, &p, body),
	             AMQP_STATUS_OK);
	n = wire(expect, sizeof(expect));
	cr_assert_gt(n, sizeof(big));
	cr_assert_eq(broker_out_append(&b, 1, amqp_cstring_bytes("x"), amqp_cstring_bytes("k"), &p,
	                               body),
	             1);
	cr_assert_eq(b.out_len, n);
	cr_assert_eq(memcmp(b.out, expect, n), 0, "the bytes differ");
}
