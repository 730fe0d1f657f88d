/* `outbox-relay enqueue`: one message into the outbox from the command line, through the
 * producer library on a connection of its own (its own transaction: the message commits
 * alone). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/command.h"
#include "relay/relay.h"
#include "store/outbox.h"

#define MAX_BODY_FILE (64L * 1024 * 1024)

/* "k=v" into obj; returns -1 when there is no '='. */
static int add_pair(json_t *obj, const char *kv)
{
	const char *eq = strchr(kv, '=');
	char key[256];
	size_t klen;

	if (!eq || eq == kv)
		return -1;
	klen = (size_t)(eq - kv);
	if (klen >= sizeof(key))
		return -1;
	memcpy(key, kv, klen);
	key[klen] = '\0';
	return json_object_set_new(obj, key, json_string(eq + 1));
}

int command_enqueue(const struct config *cfg, int argc, char **argv)
{
	static const char *const known[] = {
		"--exchange", "--routing-key",  "--body",  "--body-file",
		"--header",   "--property",     "--delay", "--ordering-key",
		"--id",       "--content-type", NULL
	};
	struct outbox_message m;
	json_t *headers = json_object(), *props = json_object();
	char *headers_s = NULL, *props_s = NULL, *file_body = NULL;
	char idbuf[40], err[512];
	const char *body_file = NULL;
	PGconn *conn = NULL;
	int rc = 2, r;

	memset(&m, 0, sizeof(m));
	if (!headers || !props)
		goto out;
	if (command_unknown_args(argc, argv, known, "enqueue"))
		goto out;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strncmp(a, "--", 2) != 0)
			continue;
		if (!v) {
			fprintf(stderr, "outbox-relay: enqueue: %s needs a value\n", a);
			goto out;
		}
		i++;
		if (strcmp(a, "--exchange") == 0) {
			m.exchange = v;
		} else if (strcmp(a, "--routing-key") == 0) {
			m.routing_key = v;
		} else if (strcmp(a, "--body") == 0) {
			m.body = v;
			m.body_len = strlen(v);
		} else if (strcmp(a, "--body-file") == 0) {
			body_file = v;
		} else if (strcmp(a, "--header") == 0 || strcmp(a, "--property") == 0) {
			if (add_pair(a[2] == 'h' ? headers : props, v) < 0) {
				fprintf(stderr,
				        "outbox-relay: enqueue: %s wants key=value, got '%s'\n", a,
				        v);
				goto out;
			}
		} else if (strcmp(a, "--delay") == 0) {
			if (config_parse_duration(v, &m.delay_ms) < 0) {
				fprintf(stderr,
				        "outbox-relay: enqueue: --delay: not a duration: '%s' "
				        "(allowed: 500ms, 30s, 5m, 2h, 7d or seconds)\n",
				        v);
				goto out;
			}
		} else if (strcmp(a, "--ordering-key") == 0) {
			m.ordering_key = v;
		} else if (strcmp(a, "--id") == 0) {
			m.id = v;
		} else if (strcmp(a, "--content-type") == 0) {
			m.content_type = v;
		}
	}
	if (!m.exchange || !m.routing_key || (!m.body && !body_file)) {
		fputs("outbox-relay: enqueue needs --exchange, --routing-key and --body or "
		      "--body-file\n",
		      stderr);
		goto out;
	}
	if (body_file) {
		int read_err = 0;

		file_body = config_read_file(body_file, MAX_BODY_FILE, &m.body_len, &read_err);
		if (!file_body) {
			fprintf(stderr,
			        "outbox-relay: enqueue: could not read --body-file '%s': %s\n",
			        body_file, strerror(read_err));
			rc = 1;
			goto out;
		}
		m.body = file_body;
	}
	if (!m.id) {
		/* A random v4-style UUID: ids only need to be unique. */
		unsigned char rnd[16];
		FILE *ur = fopen("/dev/urandom", "rb");

		if (!ur || fread(rnd, 1, sizeof(rnd), ur) != sizeof(rnd)) {
			if (ur)
				fclose(ur);
			fputs("outbox-relay: enqueue: could not read /dev/urandom\n", stderr);
			rc = 1;
			goto out;
		}
		fclose(ur);
		rnd[6] = (unsigned char)((rnd[6] & 0x0f) | 0x40);
		rnd[8] = (unsigned char)((rnd[8] & 0x3f) | 0x80);
		snprintf(idbuf, sizeof(idbuf),
		         "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		         rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7], rnd[8],
		         rnd[9], rnd[10], rnd[11], rnd[12], rnd[13], rnd[14], rnd[15]);
		m.id = idbuf;
	}
	headers_s = json_dumps(headers, JSON_COMPACT);
	props_s = json_dumps(props, JSON_COMPACT);
	if (!headers_s || !props_s) {
		rc = 1;
		goto out;
	}
	m.headers_json = headers_s;
	m.properties_json = props_s;

	conn = PQconnectdb(cfg->database_url);
	if (PQstatus(conn) != CONNECTION_OK) {
		char *msg = PQerrorMessage(conn);
		size_t l = strlen(msg);

		while (l > 0 && msg[l - 1] == '\n')
			msg[--l] = '\0';
		fprintf(stderr, "outbox-relay: could not connect to the database: %s\n", msg);
		rc = 1;
		goto out;
	}
	r = outbox_add(conn, cfg->database_table, &m, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "outbox-relay: enqueue: %s\n", err);
		rc = r == OUTBOX_ERR_INVALID ? 2 : 1;
		goto out;
	}
	printf("%s %s\n", r == OUTBOX_DUPLICATE ? "exists" : "enqueued", m.id);
	rc = 0;
out:
	if (conn)
		PQfinish(conn);
	json_decref(headers);
	json_decref(props);
	free(headers_s);
	free(props_s);
	free(file_body);
	return rc;
}
