/* `outbox-relay enqueue`: one message into the outbox from the command line, through the
 * producer library on a connection of its own (its own transaction: the message commits
 * alone). The library checks the message, trace context included; a message it refuses
 * exits 2 like any other usage error. */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/message_property.h"
#include "relay/command.h"
#include "relay/relay.h"
#include "store/liboutbox/outbox.h"

#define MAX_BODY_FILE (64L * 1024 * 1024)

/* What the command line asks for. Strings are borrowed from argv; headers and props are
 * owned (json_decref). */
struct enqueue_args {
	struct outbox_message m;
	const char *body_file;
	json_t *headers, *props;
};

/* "k=v" into obj; returns -1 when there is no '='. */
static int add_pair(json_t *obj, const char *kv, bool property)
{
	const char *eq = strchr(kv, '=');
	const struct message_property *p;
	char key[256], *end;
	size_t klen;
	long long n;

	if (!eq || eq == kv)
		return -1;
	klen = (size_t)(eq - kv);
	if (klen >= sizeof(key))
		return -1;
	memcpy(key, kv, klen);
	key[klen] = '\0';
	/* priority and delivery_mode are integers in the properties column: digits given for
	 * them go in as a number (anything else as a string, which outbox_add then refuses with
	 * the property's rule). */
	p = property ? message_property_find(key) : NULL;
	if (p &&
	    (p->kind == MESSAGE_PROPERTY_PRIORITY_0_9 ||
	     p->kind == MESSAGE_PROPERTY_DELIVERY_1_2) &&
	    eq[1] >= '0' && eq[1] <= '9') {
		errno = 0;
		n = strtoll(eq + 1, &end, 10);
		if (errno == 0 && *end == '\0')
			return json_object_set_new(obj, key, json_integer((json_int_t)n));
	}
	return json_object_set_new(obj, key, json_string(eq + 1));
}

/* Fills *a from argv. 0, or 2 (usage) with the reason on stderr. */
static int parse_args(int argc, char **argv, struct enqueue_args *a)
{
	static const char *const known[] = {
		"--exchange", "--routing-key",  "--body",        "--body-file",
		"--header",   "--property",     "--delay",       "--ordering-key",
		"--id",       "--content-type", "--traceparent", "--tracestate",
		NULL
	};
	struct outbox_message *m = &a->m;

	if (command_unknown_args(argc, argv, known, "enqueue"))
		return 2;
	for (int i = 0; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strncmp(o, "--", 2) != 0)
			continue;
		if (!v) {
			fprintf(stderr, "outbox-relay: enqueue: %s needs a value\n", o);
			return 2;
		}
		i++;
		if (strcmp(o, "--exchange") == 0) {
			m->exchange = v;
		} else if (strcmp(o, "--routing-key") == 0) {
			m->routing_key = v;
		} else if (strcmp(o, "--body") == 0) {
			m->body = v;
			m->body_len = strlen(v);
		} else if (strcmp(o, "--body-file") == 0) {
			a->body_file = v;
		} else if (strcmp(o, "--header") == 0 || strcmp(o, "--property") == 0) {
			if (add_pair(o[2] == 'h' ? a->headers : a->props, v, o[2] == 'p') < 0) {
				fprintf(stderr,
				        "outbox-relay: enqueue: %s wants key=value, got '%s'\n", o,
				        v);
				return 2;
			}
		} else if (strcmp(o, "--delay") == 0) {
			if (config_parse_duration(v, &m->delay_ms) < 0) {
				fprintf(stderr,
				        "outbox-relay: enqueue: --delay: not a duration: '%s' "
				        "(allowed: 500ms, 30s, 5m, 2h, 7d or seconds)\n",
				        v);
				return 2;
			}
		} else if (strcmp(o, "--ordering-key") == 0) {
			m->ordering_key = v;
		} else if (strcmp(o, "--id") == 0) {
			m->id = v;
		} else if (strcmp(o, "--content-type") == 0) {
			m->content_type = v;
		} else if (strcmp(o, "--traceparent") == 0) {
			m->traceparent = v;
		} else if (strcmp(o, "--tracestate") == 0) {
			m->tracestate = v;
		}
	}
	if (!m->exchange || !m->routing_key || (!m->body && !a->body_file)) {
		fputs("outbox-relay: enqueue needs --exchange, --routing-key and --body or "
		      "--body-file\n",
		      stderr);
		return 2;
	}
	return 0;
}

/* The body of --body-file into *file_body (new, caller frees) and a->m. 0, or 1 with the
 * reason on stderr. */
static int read_body(struct enqueue_args *a, char **file_body)
{
	int read_err = 0;

	if (!a->body_file)
		return 0;
	*file_body = config_read_file(a->body_file, MAX_BODY_FILE, &a->m.body_len, &read_err);
	if (!*file_body) {
		fprintf(stderr, "outbox-relay: enqueue: could not read --body-file '%s': %s\n",
		        a->body_file, strerror(read_err));
		return 1;
	}
	a->m.body = *file_body;
	return 0;
}

/* A random v4-style UUID into buf (at least 37 bytes): ids only need to be unique. 0, or 1
 * with the reason on stderr. */
static int make_id(char *buf, size_t len)
{
	unsigned char rnd[16];
	FILE *ur = fopen("/dev/urandom", "rb");

	if (!ur || fread(rnd, 1, sizeof(rnd), ur) != sizeof(rnd)) {
		if (ur)
			fclose(ur);
		fputs("outbox-relay: enqueue: could not read /dev/urandom\n", stderr);
		return 1;
	}
	fclose(ur);
	rnd[6] = (unsigned char)((rnd[6] & 0x0f) | 0x40);
	rnd[8] = (unsigned char)((rnd[8] & 0x3f) | 0x80);
	snprintf(buf, len, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
	         rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7], rnd[8], rnd[9],
	         rnd[10], rnd[11], rnd[12], rnd[13], rnd[14], rnd[15]);
	return 0;
}

/* Connects and runs outbox_add(): prints "enqueued ID" or "exists ID". Returns the exit
 * status: 0, 2 when the library refused the message, 1 for anything else. m is borrowed. */
static int add_message(const struct config *cfg, const struct outbox_message *m)
{
	PGconn *conn = PQconnectdb(cfg->database_url);
	char err[512];
	int r, rc;

	if (PQstatus(conn) != CONNECTION_OK) {
		char *msg = PQerrorMessage(conn);
		size_t l = strlen(msg);

		while (l > 0 && msg[l - 1] == '\n')
			msg[--l] = '\0';
		fprintf(stderr, "outbox-relay: could not connect to the database: %s\n", msg);
		rc = 1;
		goto out;
	}
	r = outbox_add(conn, cfg->database_table, m, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "outbox-relay: enqueue: %s\n", err);
		rc = r == OUTBOX_ERR_INVALID ? 2 : 1;
		goto out;
	}
	printf("%s %s\n", r == OUTBOX_DUPLICATE ? "exists" : "enqueued", m->id);
	rc = 0;
out:
	PQfinish(conn);
	return rc;
}

int command_enqueue(const struct config *cfg, int argc, char **argv)
{
	struct enqueue_args a;
	char *headers_s = NULL, *props_s = NULL, *file_body = NULL;
	char idbuf[40];
	int rc;

	memset(&a, 0, sizeof(a));
	a.headers = json_object();
	a.props = json_object();
	if (!a.headers || !a.props) {
		rc = 1;
		goto out;
	}
	if ((rc = parse_args(argc, argv, &a)) != 0 || (rc = read_body(&a, &file_body)) != 0)
		goto out;
	if (!a.m.id) {
		if ((rc = make_id(idbuf, sizeof(idbuf))) != 0)
			goto out;
		a.m.id = idbuf;
	}
	headers_s = json_dumps(a.headers, JSON_COMPACT);
	props_s = json_dumps(a.props, JSON_COMPACT);
	if (!headers_s || !props_s) {
		rc = 1;
		goto out;
	}
	a.m.headers_json = headers_s;
	a.m.properties_json = props_s;
	rc = add_message(cfg, &a.m);
out:
	json_decref(a.headers);
	json_decref(a.props);
	free(headers_s);
	free(props_s);
	free(file_body);
	return rc;
}
