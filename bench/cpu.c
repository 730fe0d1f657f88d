/* CPU per message by party (cpu.h): utime + stime from /proc/<pid>/stat for the servers and
 * the relay, getrusage() for the benchmark itself, /proc/stat for the machine as a whole. */
#include "bench/cpu.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define CPU_MAX_PROCS 65536 /* entries read from /proc; a machine with more is not ours */
#define CPU_MAX_ROOTS 8     /* beam.smp processes of one node */

/* One process as /proc/<pid>/stat shows it, in clock ticks. */
struct cpu_proc {
	pid_t pid, ppid;
	unsigned long long own;    /* utime + stime: all its threads */
	unsigned long long reaped; /* cutime + cstime: the children it has waited for */
	bool beam;                 /* comm is beam.smp */
};

/* Fills p from /proc/<pid>/stat; -1 when the process is gone or the line is not understood.
 * The command name sits in parentheses and may itself hold spaces and parentheses, so the
 * fields are counted from the last ')'. */
static int read_proc(pid_t pid, struct cpu_proc *p)
{
	char path[64], line[1024], *rp, *f, *end;
	unsigned long long v[15];
	FILE *fp;
	size_t got;

	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	fp = fopen(path, "r");
	if (!fp)
		return -1;
	got = fread(line, 1, sizeof(line) - 1, fp);
	fclose(fp);
	line[got] = '\0';
	rp = strrchr(line, ')');
	f = strchr(line, '(');
	if (!rp || !f || rp < f)
		return -1;
	p->beam = (size_t)(rp - f - 1) == strlen("beam.smp") && strncmp(f + 1, "beam.smp", 8) == 0;
	f = rp + 2; /* field 3, the state */
	if (!*f)
		return -1;
	f++;
	/* Fields 4 (ppid) to 17 (cstime) are numbers. */
	for (int i = 0; i < 14; i++) {
		errno = 0;
		v[i] = strtoull(f, &end, 10);
		if (errno || end == f)
			return -1;
		f = end;
	}
	p->pid = pid;
	p->ppid = (pid_t)v[0];
	p->own = v[10] + v[11];
	p->reaped = v[12] + v[13];
	return 0;
}

/* Whether the command line of pid holds needle (its arguments joined by spaces). */
static bool cmdline_has(pid_t pid, const char *needle)
{
	char path[64], buf[8192];
	FILE *fp;
	size_t got;

	if (!needle || !needle[0])
		return false;
	snprintf(path, sizeof(path), "/proc/%ld/cmdline", (long)pid);
	fp = fopen(path, "r");
	if (!fp)
		return false;
	got = fread(buf, 1, sizeof(buf) - 1, fp);
	fclose(fp);
	for (size_t i = 0; i < got; i++)
		if (buf[i] == '\0')
			buf[i] = ' ';
	buf[got] = '\0';
	return strstr(buf, needle) != NULL;
}

/* The pid on the first line of path; 0 when there is none. */
static pid_t pid_file(const char *dir, const char *name)
{
	char path[4096], line[64], *end;
	long v;
	FILE *fp;

	if (!dir || !dir[0])
		return 0;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fp = fopen(path, "r");
	if (!fp)
		return 0;
	if (!fgets(line, sizeof(line), fp)) {
		fclose(fp);
		return 0;
	}
	fclose(fp);
	errno = 0;
	v = strtol(line, &end, 10);
	if (errno || end == line || v <= 0)
		return 0;
	return (pid_t)v;
}

/* Every process on the machine; *n of them in a new array (free()), NULL when /proc cannot be
 * read. */
static struct cpu_proc *read_all(size_t *n)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	struct cpu_proc *v = NULL;
	size_t cap = 0;

	*n = 0;
	if (!d)
		return NULL;
	while ((e = readdir(d)) != NULL && *n < CPU_MAX_PROCS) {
		char *end;
		long pid;

		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		errno = 0;
		pid = strtol(e->d_name, &end, 10);
		if (errno || *end || pid <= 0)
			continue;
		if (*n == cap) {
			size_t ncap = cap ? cap * 2 : 512;
			struct cpu_proc *nv = realloc(v, ncap * sizeof(*v));

			if (!nv)
				break;
			v = nv;
			cap = ncap;
		}
		if (read_proc((pid_t)pid, &v[*n]) == 0)
			(*n)++;
	}
	closedir(d);
	return v;
}

/* CPU seconds of roots (with what they reaped) and of their live children; -1 when no root
 * is alive. A child that exits between two samples moves from the second term into its
 * parent's reaped time, so nothing it used is lost. */
static double party_s(const struct cpu_proc *v, size_t n, const pid_t *roots, int n_roots)
{
	unsigned long long ticks = 0;
	bool found = false;

	for (size_t i = 0; i < n; i++) {
		bool root = false, child = false;

		for (int r = 0; r < n_roots; r++) {
			root = root || v[i].pid == roots[r];
			child = child || v[i].ppid == roots[r];
		}
		if (root || child)
			ticks += v[i].own + v[i].reaped;
		found = found || root;
	}
	return found ? (double)ticks / (double)sysconf(_SC_CLK_TCK) : -1;
}

double cpu_pids_s(const pid_t *pids, size_t n)
{
	unsigned long long ticks = 0;
	struct cpu_proc p;

	if (n == 0)
		return NAN;
	for (size_t i = 0; i < n; i++) {
		if (pids[i] <= 0 || read_proc(pids[i], &p) != 0)
			return NAN;
		ticks += p.own;
	}
	return (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

/* One "cpu..." line of /proc/stat (p just past its name): busy (all but idle and iowait), total
 * and steal jiffies. */
static bool stat_line(const char *p, unsigned long long *busy, unsigned long long *total,
                      unsigned long long *steal)
{
	unsigned long long f[8];

	/* user nice system idle iowait irq softirq steal; guest time is already in user. */
	for (int i = 0; i < 8; i++) {
		char *end;

		errno = 0;
		f[i] = strtoull(p, &end, 10);
		if (end == p || errno != 0)
			return false;
		p = end;
	}
	*total = 0;
	for (int i = 0; i < 8; i++)
		*total += f[i];
	*busy = *total - f[3] - f[4];
	*steal = f[7];
	return true;
}

static void machine(struct cpu_sample *s)
{
	char line[512];
	unsigned long long steal;
	FILE *fp = fopen("/proc/stat", "r");

	s->busy = s->total = s->steal = 0;
	s->n_each = 0;
	if (!fp)
		return;
	while (fgets(line, sizeof(line), fp) && strncmp(line, "cpu", 3) == 0) {
		int i = s->n_each;
		char *end;
		long cpu;

		if (line[3] == ' ') {
			if (!stat_line(line + 3, &s->busy, &s->total, &s->steal))
				s->busy = s->total = s->steal = 0;
			continue;
		}
		errno = 0;
		cpu = strtol(line + 3, &end, 10);
		if (end != line + 3 && errno == 0 && cpu == i && i < CPU_EACH_MAX &&
		    stat_line(end, &s->each_busy[i], &s->each_total[i], &steal))
			s->n_each++;
	}
	fclose(fp);
}

void cpu_sample(struct cpu_sample *s, pid_t relay)
{
	const char *mq_dir = getenv("RELAY_TEST_RABBITMQ_DIR");
	const char *mq_node = getenv("RELAY_TEST_RABBITMQ_NODE");
	pid_t pg = pid_file(getenv("RELAY_TEST_PG_DATA"), "postmaster.pid");
	pid_t mq[CPU_MAX_ROOTS];
	int n_mq = 0;
	struct rusage ru;
	size_t n;
	struct cpu_proc *v = read_all(&n);

	s->pg_s = s->mq_s = -1;
	s->relay_s = relay > 0 ? -1 : 0;
	mq[0] = pid_file(mq_dir, "pid");
	if (mq[0] > 0)
		n_mq = 1;
	for (size_t i = 0; v && i < n; i++) {
		if (v[i].beam && n_mq < CPU_MAX_ROOTS && v[i].pid != mq[0] &&
		    (cmdline_has(v[i].pid, mq_dir) || cmdline_has(v[i].pid, mq_node)))
			mq[n_mq++] = v[i].pid;
		if (relay > 0 && v[i].pid == relay)
			s->relay_s = (double)v[i].own / (double)sysconf(_SC_CLK_TCK);
	}
	if (v && pg > 0)
		s->pg_s = party_s(v, n, &pg, 1);
	if (v && n_mq > 0)
		s->mq_s = party_s(v, n, mq, n_mq);
	free(v);
	getrusage(RUSAGE_SELF, &ru);
	s->self_s = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	            (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
	machine(s);
}

static double per_msg_us(double a, double z, long n)
{
	return a < 0 || z < 0 || n <= 0 ? NAN : (z - a) * 1e6 / (double)n;
}

void cpu_cost(const struct cpu_sample *a, const struct cpu_sample *z, long n, struct cpu_cost *c)
{
	double parts[4], known_s = 0, tick = (double)sysconf(_SC_CLK_TCK);

	c->pg_us = per_msg_us(a->pg_s, z->pg_s, n);
	c->mq_us = per_msg_us(a->mq_s, z->mq_s, n);
	c->relay_us = per_msg_us(a->relay_s, z->relay_s, n);
	c->self_us = per_msg_us(a->self_s, z->self_s, n);
	parts[0] = c->pg_us;
	parts[1] = c->mq_us;
	parts[2] = c->relay_us;
	parts[3] = c->self_us;
	c->total_us = 0;
	for (int i = 0; i < 4; i++) {
		if (!isnan(parts[i])) {
			c->total_us += parts[i];
			known_s += parts[i] * (double)n / 1e6;
		}
	}
	c->busy_pct = c->other_pct = c->steal_pct = NAN;
	c->n_each = a->n_each == z->n_each ? z->n_each : 0;
	for (int i = 0; i < c->n_each; i++)
		c->each_pct[i] = z->each_total[i] > a->each_total[i]
		                         ? 100.0 * (double)(z->each_busy[i] - a->each_busy[i]) /
		                                   (double)(z->each_total[i] - a->each_total[i])
		                         : NAN;
	if (a->total > 0 && z->total > a->total) {
		double all_s = (double)(z->total - a->total) / tick;
		double busy_s = (double)(z->busy - a->busy) / tick;

		c->busy_pct = 100.0 * busy_s / all_s;
		c->steal_pct = 100.0 * (double)(z->steal - a->steal) / tick / all_s;
		/* Tick rounding in each process can make the parties add up to a little more than
		 * the machine saw. */
		c->other_pct = busy_s > known_s ? 100.0 * (busy_s - known_s) / all_s : 0;
	}
}

static void part(const char *name, double us, const char **sep)
{
	if (isnan(us))
		printf("%s%s ?", *sep, name);
	else
		printf("%s%s %.1f us", *sep, name, us);
	*sep = ", ";
}

void cpu_print_each(const struct cpu_cost *c)
{
	if (c->n_each < 2)
		return;
	for (int i = 0; i < c->n_each; i++)
		printf("%sCPU %d %.0f %%", i ? ", " : " (", i, c->each_pct[i]);
	printf(")");
}

void cpu_print(const char *what, const struct cpu_cost *c, bool with_db)
{
	const char *sep = "";

	printf("%s: cpu per message: ", what);
	if (with_db)
		part("postgres", c->pg_us, &sep);
	part("rabbitmq", c->mq_us, &sep);
	if (with_db)
		part("relay", c->relay_us, &sep);
	part("bench+consumer", c->self_us, &sep);
	printf(" (total %.1f us); ", c->total_us);
	if (isnan(c->busy_pct)) {
		printf("machine busy ?\n");
	} else {
		printf("machine busy %.0f %%", c->busy_pct);
		cpu_print_each(c);
		printf(", %.0f %% outside these processes (steal %.0f %%)\n", c->other_pct,
		       c->steal_pct);
	}
	if (c->other_pct > CPU_NOISY_PCT)
		printf("%s: noisy: %.0f %% of the machine went outside these processes, so this "
		       "stretch's figures are not comparable with another run's\n",
		       what, c->other_pct);
}
