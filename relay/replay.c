/* `outbox-relay replay`: publishes again retained published rows that an operator selects, by
 * making them pending again (store/operator/replay.c) for the running relay to publish; prints what it
 * did (or, with --dry-run, what it would do) and logs one line per replay. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "relay/command.h"
#include "relay/log.h"
#include "relay/relay.h"
#include "store/store.h"
#include "store/operator/replay.h"

/* Above this many rows a replay must be confirmed with --yes. */
#define REPLAY_CONFIRM_ROWS 10000
/* Refused rows and missing ids listed before "and N more". */
#define REPLAY_LIST_MAX 20

#define REPLAY_USAGE                                                                         \
	"usage: outbox-relay replay [--since T] [--until T] [--by published|created]\n"      \
	"         [--exchange X] [--routing-key PATTERN] [--ordering-key K] [--id ID...]\n"  \
	"         [--dry-run] [--yes]\n"                                                     \
	"  T is a time (2024-05-01T12:00:00Z; without a zone, UTC) or a duration ago with\n" \
	"  its unit (30m, 2h, 7d); PATTERN: '*' matches any run of characters, '?' one,\n"   \
	"  the rest is literal.\n"

struct replay_args {
	const char *since, *until, *by, *exchange, *routing_key, *ordering_key;
	const char **ids; /* room for argc */
	size_t n_ids;
	bool dry_run, yes;
};

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Says what is wrong with the command line, then how it goes; returns 2 (usage). */
static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("outbox-relay: replay: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n" REPLAY_USAGE, stderr);
	return 2;
}

/* 0, or 2 (usage) with the reason on stderr. */
static int parse_args(int argc, char **argv, struct replay_args *a)
{
	for (int i = 0; i < argc; i++) {
		const char *opt = argv[i];
		const char **dst = NULL;

		if (strcmp(opt, "--dry-run") == 0) {
			a->dry_run = true;
			continue;
		}
		if (strcmp(opt, "--yes") == 0) {
			a->yes = true;
			continue;
		}
		if (strcmp(opt, "--id") == 0) {
			size_t before = a->n_ids;

			while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
				a->ids[a->n_ids++] = argv[++i];
			if (a->n_ids == before)
				return usage_error("--id needs at least one id");
			continue;
		}
		if (strcmp(opt, "--since") == 0)
			dst = &a->since;
		else if (strcmp(opt, "--until") == 0)
			dst = &a->until;
		else if (strcmp(opt, "--by") == 0)
			dst = &a->by;
		else if (strcmp(opt, "--exchange") == 0)
			dst = &a->exchange;
		else if (strcmp(opt, "--routing-key") == 0)
			dst = &a->routing_key;
		else if (strcmp(opt, "--ordering-key") == 0)
			dst = &a->ordering_key;
		else if (strncmp(opt, "--", 2) == 0)
			return usage_error("unknown option '%s'", opt);
		else
			return usage_error("unexpected '%s'", opt);
		if (i + 1 >= argc)
			return usage_error("%s needs a value", opt);
		if (*dst)
			return usage_error("%s given twice", opt);
		*dst = argv[++i];
	}
	if (a->by && strcmp(a->by, "published") != 0 && strcmp(a->by, "created") != 0)
		return usage_error("--by takes 'published' or 'created', not '%s'", a->by);
	if (a->by && !a->since && !a->until)
		return usage_error("--by says which time --since and --until apply to");
	if (!a->since && !a->until && !a->exchange && !a->routing_key && !a->ordering_key &&
	    a->n_ids == 0)
		return usage_error("say which rows: --since, --until, --exchange, --routing-key, "
		                   "--ordering-key or --id");
	return 0;
}

enum replay_time_kind replay_time_kind(const char *text, int64_t *ago_ms)
{
	const char *p = text;
	bool digit = false;

	/* Digits alone (a fraction included) would be read as seconds ago, and PostgreSQL reads
	 * some of them as a date: "20240501" meant 20,240,501 seconds (234 days) ago to us and
	 * 1 May 2024 to the one who typed it. Neither guess is safe for what gets published
	 * again. */
	for (; *p >= '0' && *p <= '9'; p++)
		digit = true;
	if (*p == '.')
		for (p++; *p >= '0' && *p <= '9'; p++)
			digit = true;
	if (digit && *p == '\0')
		return REPLAY_TIME_AMBIGUOUS;
	/* A duration has a unit and never a '-' or a ':', a time always has one of them: no text
	 * is both. */
	if (config_parse_duration(text, ago_ms) == 0)
		return REPLAY_TIME_AGO;
	return REPLAY_TIME_AT;
}

/* A time or a duration ago, resolved by the database (its clock, its time parser) into
 * out[cap]: 0, 2 (usage) or 1. */
static int resolve_time(struct store *s, const char *opt, const char *text, char *out, size_t cap)
{
	int64_t ago = 0;
	int rc;

	if (!text)
		return 0;
	switch (replay_time_kind(text, &ago)) {
	case REPLAY_TIME_AMBIGUOUS:
		fprintf(stderr,
		        "outbox-relay: replay: %s '%s': digits alone are ambiguous (seconds ago, "
		        "or a date?): give a duration with its unit (3600s, 30m, 2h, 7d) or a time "
		        "(2024-05-01, 2024-05-01T12:00:00Z)\n",
		        opt, text);
		return 2;
	case REPLAY_TIME_AGO:
		rc = store_replay_time(s, NULL, ago, out, cap);
		break;
	case REPLAY_TIME_AT:
	default:
		rc = store_replay_time(s, text, 0, out, cap);
		break;
	}
	if (rc == 1) {
		fprintf(stderr,
		        "outbox-relay: replay: %s '%s' is neither a time (2024-05-01T12:00:00Z) "
		        "nor a duration (30m, 2h, 7d): %s\n",
		        opt, text, store_errmsg(s));
		return 2;
	}
	if (rc < 0) {
		fprintf(stderr, "outbox-relay: replay: could not read %s: %s\n", opt,
		        store_errmsg(s));
		return 1;
	}
	return 0;
}

/* Counts calls and prints the first REPLAY_LIST_MAX lines to stderr. */
struct noted {
	const char *what; /* "id" or "row" */
	size_t n;
};

static int print_noted(const struct store_replay_row *r, void *arg)
{
	struct noted *nt = arg;

	if (nt->n++ < REPLAY_LIST_MAX)
		fprintf(stderr, "outbox-relay: replay: %s '%s': %s\n", nt->what, r->id ? r->id : "",
		        r->reason ? r->reason : "");
	return 0;
}

static void print_more(const struct noted *nt)
{
	if (nt->n > REPLAY_LIST_MAX)
		fprintf(stderr, "outbox-relay: replay: ... and %zu more\n",
		        nt->n - REPLAY_LIST_MAX);
}

static int print_row(const struct store_replay_row *r, void *arg)
{
	(void)arg;
	printf("%s\t%s\t%s\t%s\t%s\n", r->id ? r->id : "", r->exchange ? r->exchange : "",
	       r->routing_key ? r->routing_key : "", r->ordering_key ? r->ordering_key : "-",
	       r->published_at ? r->published_at : "");
	return 0;
}

static int print_skipped(const struct store_replay_row *r, void *arg)
{
	(void)arg;
	printf("key '%s': %" PRId64 " row%s not replayed: %s\n",
	       r->ordering_key ? r->ordering_key : "", r->rows, r->rows == 1 ? "" : "s",
	       r->reason ? r->reason : "");
	return 0;
}

/* The ids of the filter for the log line, joined by commas, cut at cap. */
static void join_ids(const struct replay_args *a, char *out, size_t cap)
{
	size_t len = 0;

	out[0] = '\0';
	for (size_t i = 0; i < a->n_ids && len + 1 < cap; i++) {
		int w = snprintf(out + len, cap - len, "%s%s", i ? "," : "", a->ids[i]);

		if (w < 0 || (size_t)w >= cap - len) {
			/* Cut: end with an ellipsis where it still fits. */
			if (cap > 4)
				snprintf(out + cap - 4, 4, "...");
			return;
		}
		len += (size_t)w;
	}
}

/* The replay's one log line: the filter, what was selected, replayed and left out. */
static void log_replay(const struct config *cfg, const struct replay_args *a, const char *since,
                       const char *until, const char *asked_at, int64_t selected,
                       const struct store_replay_progress *p, const char *error)
{
	char ids[256];

	join_ids(a, ids, sizeof(ids));
	log_event(error ? LOG_ERROR : LOG_INFO, "replay",
	          error ? "could not replay published rows" : "replayed published rows",
	          LOG_INT("rows", p->replayed), LOG_INT("selected", selected),
	          LOG_INT("skipped_keys", p->left_keys), LOG_INT("skipped_rows", p->left),
	          LOG_INT("gone", p->gone), LOG_STR("table", cfg->database_table),
	          LOG_OPT("since", since[0] ? since : NULL),
	          LOG_OPT("until", until[0] ? until : NULL),
	          LOG_OPT("by", since[0] || until[0] ? (a->by ? a->by : "published") : NULL),
	          LOG_OPT("exchange", a->exchange), LOG_OPT("routing_key", a->routing_key),
	          LOG_OPT("ordering_key", a->ordering_key), LOG_OPT("ids", ids[0] ? ids : NULL),
	          LOG_STR("replayed_at", asked_at), LOG_OPT("error", error));
}

/* Steps until every selected row is replayed, or relay.lease has passed: a key with a row in
 * flight waits, since its lease ends within that time anyway (the row is published, or
 * released, or its relay died and the lease runs out). */
static int run_steps(const struct config *cfg, struct store *s, const char *asked_at,
                     struct store_replay_progress *p)
{
	int64_t deadline = clock_mono_ms() + cfg->relay_lease_ms, pause = 100;

	for (;;) {
		int64_t left = deadline - clock_mono_ms();
		int rc = store_replay_step(s, asked_at, left > 0 ? left : 0, p);

		if (rc < 0)
			return rc;
		if (p->left == 0 && !p->conflict)
			return 0;
		left = deadline - clock_mono_ms();
		if (left <= 0)
			return 0;
		clock_sleep_us((pause < left ? pause : left) * 1000);
		if (pause < 1000)
			pause *= 2;
	}
}

/* --since and --until resolved by the database into since and until (cap bytes each, ""
 * when not given), refused when the window is empty: 0, 2 (usage) or 1. */
static int resolve_window(struct store *s, const struct replay_args *a, char *since, char *until,
                          size_t cap)
{
	int rc;

	if ((rc = resolve_time(s, "--since", a->since, since, cap)) != 0 ||
	    (rc = resolve_time(s, "--until", a->until, until, cap)) != 0)
		return rc;
	/* Both are UTC texts of one shape: they compare as strings. */
	if (since[0] && until[0] && strcmp(since, until) >= 0) {
		fprintf(stderr, "outbox-relay: replay: --since (%s) is not before --until (%s)\n",
		        since, until);
		return 2;
	}
	return 0;
}

/* The command line's filter as the store takes it; everything in f is borrowed from a and
 * the resolved texts. */
static void fill_filter(const struct replay_args *a, const char *since, const char *until,
                        const char *like, struct store_replay_filter *f)
{
	f->by_created = a->by && strcmp(a->by, "created") == 0;
	f->since = since[0] ? since : NULL;
	f->until = until[0] ? until : NULL;
	f->exchange = a->exchange;
	f->routing_key_like = a->routing_key ? like : NULL;
	f->ordering_key = a->ordering_key;
	f->ids = a->ids;
	f->n_ids = a->n_ids;
}

/* Selects the rows of filter f (the store keeps them for the next steps) into *selected,
 * listing the ids asked for that it does not hold: 0, or 1. */
static int select_rows(struct store *s, const struct store_replay_filter *f, int64_t *selected)
{
	struct noted missing = { "id", 0 };
	int64_t n = 0;

	if (store_replay_select(s, f, &n) < 0 ||
	    store_replay_missing_ids(s, f->ids, f->n_ids, print_noted, &missing) < 0) {
		fprintf(stderr, "outbox-relay: replay: could not select the rows: %s\n",
		        store_errmsg(s));
		return 1;
	}
	print_more(&missing);
	*selected = n;
	return 0;
}

/* Lists the selected rows that cannot carry the replay header, their count into *n_refused:
 * 0, or 1. */
static int count_refused(struct store *s, int64_t *n_refused)
{
	struct noted refused = { "row", 0 };
	int64_t n = 0;

	if (store_replay_refused(s, print_noted, &refused, &n) < 0) {
		fprintf(stderr, "outbox-relay: replay: could not check the rows: %s\n",
		        store_errmsg(s));
		return 1;
	}
	print_more(&refused);
	*n_refused = n;
	return 0;
}

/* --dry-run: lists the selected rows and says what a replay would do, changing nothing: 0,
 * or 1. */
static int print_dry_run(const struct config *cfg, struct store *s, int64_t selected,
                         int64_t n_refused)
{
	puts("id\texchange\trouting_key\tordering_key\tpublished_at");
	if (store_replay_list(s, print_row, NULL) < 0) {
		fprintf(stderr, "outbox-relay: replay: could not list the rows: %s\n",
		        store_errmsg(s));
		return 1;
	}
	printf("would replay %" PRId64 " row%s of table '%s' (dry run: nothing changed)\n",
	       selected, selected == 1 ? "" : "s", cfg->database_table);
	if (n_refused > 0)
		printf("%" PRId64 " of them cannot carry the replay header (see above): the "
		       "replay would be refused\n",
		       n_refused);
	if (selected > REPLAY_CONFIRM_ROWS)
		printf("over %d rows: the replay needs --yes\n", REPLAY_CONFIRM_ROWS);
	return 0;
}

/* Refuses a large replay without --yes, and one that the refused rows would make fail
 * half-way: 0 to go ahead, 2 (usage) or 1. */
static int check_go_ahead(const struct replay_args *a, int64_t selected, int64_t n_refused)
{
	if (selected > REPLAY_CONFIRM_ROWS && !a->yes) {
		fprintf(stderr,
		        "outbox-relay: replay: %" PRId64
		        " rows match; replaying more than %d needs "
		        "--yes (see them with --dry-run)\n",
		        selected, REPLAY_CONFIRM_ROWS);
		return 2;
	}
	if (n_refused > 0) {
		fprintf(stderr,
		        "outbox-relay: replay: refused: %" PRId64
		        " selected row%s cannot carry the "
		        "replay header; fix their headers or leave them out. Nothing was "
		        "replayed\n",
		        n_refused, n_refused == 1 ? "" : "s");
		return 1;
	}
	return 0;
}

/* Tells the operator what the replay did, and what to do about keys it left out. */
static void print_replayed(const struct config *cfg, struct store *s, const char *asked_at,
                           const struct store_replay_progress *p)
{
	printf("replayed %" PRId64 " row%s of table '%s'; the relay publishes them again with "
	       "header %s: %s\n",
	       p->replayed, p->replayed == 1 ? "" : "s", cfg->database_table, STORE_REPLAY_HEADER,
	       asked_at);
	if (p->gone > 0)
		printf("%" PRId64 " selected row%s no longer published when %s turn came (purged, "
		       "or replayed by another replay)\n",
		       p->gone, p->gone == 1 ? " was" : "s were", p->gone == 1 ? "its" : "their");
	if (p->left > 0) {
		if (store_replay_skipped(s, print_skipped, NULL) < 0)
			fprintf(stderr, "outbox-relay: replay: could not list the keys left: %s\n",
			        store_errmsg(s));
		printf("%" PRId64 " key%s not replayed within relay.lease; replay them again "
		       "later (e.g. --ordering-key K)\n",
		       p->left_keys, p->left_keys == 1 ? "" : "s");
	}
}

int command_replay(const struct config *cfg, int argc, char **argv)
{
	struct replay_args a = { 0 };
	struct store_replay_filter f = { 0 };
	struct store_replay_progress p = { 0 };
	struct store_options o;
	struct store *s = NULL;
	char since[64] = "", until[64] = "", asked_at[64] = "", like[1024];
	int64_t selected = 0, n_refused = 0;
	int rc;

	a.ids = calloc((size_t)argc + 1, sizeof(*a.ids));
	if (!a.ids) {
		fputs("outbox-relay: out of memory\n", stderr);
		return 1;
	}
	if ((rc = parse_args(argc, argv, &a)) != 0)
		goto out;
	if (a.routing_key && store_replay_like(a.routing_key, like, sizeof(like)) < 0) {
		rc = usage_error("--routing-key '%s' is too long", a.routing_key);
		goto out;
	}
	rc = 1;
	s = command_admin_open(cfg, &o);
	if (!s)
		goto out;
	if (store_replay_begin(s, asked_at, sizeof(asked_at)) < 0) {
		fprintf(stderr, "outbox-relay: replay: could not start: %s\n", store_errmsg(s));
		goto out;
	}
	if ((rc = resolve_window(s, &a, since, until, sizeof(since))) != 0)
		goto out;
	fill_filter(&a, since, until, like, &f);
	rc = 1;
	if (select_rows(s, &f, &selected) != 0)
		goto out;
	if (selected == 0) {
		printf("nothing to replay: no published row retained in table '%s' matches%s\n",
		       cfg->database_table,
		       cfg->relay_retention_ms == 0
		               ? " (relay.retention is 0: rows are deleted once published)"
		               : "");
		if (!a.dry_run)
			log_replay(cfg, &a, since, until, asked_at, 0, &p, NULL);
		rc = 0;
		goto out;
	}
	if (count_refused(s, &n_refused) != 0)
		goto out;
	if (a.dry_run) {
		rc = print_dry_run(cfg, s, selected, n_refused);
		goto out;
	}
	if ((rc = check_go_ahead(&a, selected, n_refused)) != 0)
		goto out;
	rc = 1;
	p.left = selected;
	if (run_steps(cfg, s, asked_at, &p) < 0) {
		fprintf(stderr,
		        "outbox-relay: replay: could not replay: %s (%" PRId64 " of %" PRId64
		        " rows were replayed before)\n",
		        store_errmsg(s), p.replayed, selected);
		log_replay(cfg, &a, since, until, asked_at, selected, &p, store_errmsg(s));
		goto out;
	}
	print_replayed(cfg, s, asked_at, &p);
	log_replay(cfg, &a, since, until, asked_at, selected, &p, NULL);
	rc = 0;
out:
	store_free(s);
	free(a.ids);
	return rc;
}
