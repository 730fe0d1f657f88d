/* cpu.h — where the CPU of a stretch of work went: PostgreSQL (every process of the server),
 * RabbitMQ (the node), the relay and the benchmark itself, from /proc, per message. */
#ifndef OUTBOX_BENCH_CPU_H
#define OUTBOX_BENCH_CPU_H

#include <stdbool.h>
#include <sys/types.h>

/* CPU seconds used so far by each party, and the machine's /proc/stat counters. A party whose
 * processes could not be found is negative. Taken by cpu_sample(); compared by cpu_cost(). */
/* The CPUs whose own busy share is printed (the first ones; a 2-core machine has two). */
#define CPU_EACH_MAX 8

struct cpu_sample {
	double pg_s;    /* postmaster (with the children it reaped) + its live children */
	double mq_s;    /* the node's beam.smp (with what it reaped) + its live children */
	double relay_s; /* the relay process (every thread); 0 when none ran yet */
	double self_s;  /* this process: the measuring consumer and every other thread */
	unsigned long long busy, total; /* /proc/stat jiffies, all CPUs; total 0 = unknown */
	unsigned long long steal;       /* of busy: time the hypervisor gave to other guests */
	/* The same, CPU by CPU (cpuN lines of /proc/stat); n_each 0 = unknown. */
	unsigned long long each_busy[CPU_EACH_MAX], each_total[CPU_EACH_MAX];
	int n_each;
};

/* CPU per message over an interval, in microseconds (NAN when unknown), and how busy the
 * machine was: busy_pct of all its CPUs, other_pct of them used outside the four parties (a
 * neighbour's load, the kernel's network work, or steal_pct: time the hypervisor gave to
 * other guests), which makes the figures noisy. */
struct cpu_cost {
	double pg_us, mq_us, relay_us, self_us, total_us;
	double busy_pct, other_pct, steal_pct;
	/* Each CPU's busy share: with the servers pinned (bench/run --broker-core), the core the
	 * database and the producers share can be saturated while the machine is not. */
	double each_pct[CPU_EACH_MAX];
	int n_each;
};

/* Above this share of the machine outside the four parties, cpu_print() says that the
 * stretch's figures are not comparable with another run's (a calm machine shows 0-3 %). */
#define CPU_NOISY_PCT 10.0

/* Reads the counters now. relay is the relay's pid, 0 when it is not running (its share is 0
 * then: a relay started later used nothing before it started). Finds PostgreSQL by the first
 * line of $RELAY_TEST_PG_DATA/postmaster.pid and RabbitMQ by $RELAY_TEST_RABBITMQ_DIR/pid or
 * the beam.smp whose command line names that directory or $RELAY_TEST_RABBITMQ_NODE (the
 * environment tests/services.sh writes); a party not found is left negative, never a
 * failure. */
void cpu_sample(struct cpu_sample *s, pid_t relay);

/* CPU seconds used so far by the processes pids together (utime + stime, every thread); NAN
 * when there are none or one cannot be read (gone, or pid 0). For PostgreSQL's backends one
 * by one: which sessions spent what. */
double cpu_pids_s(const pid_t *pids, size_t n);

/* The CPU between a and z per message (n messages) into c. */
void cpu_cost(const struct cpu_sample *a, const struct cpu_sample *z, long n, struct cpu_cost *c);

/* Prints "<what>: cpu per message: postgres 54.1 us, rabbitmq 74.9 us, relay 12.0 us,
 * bench+consumer 8.2 us (total 149.2 us); machine busy 91 % (CPU 0 96 %, CPU 1 86 %), 3 %
 * outside these processes (steal 0 %)"; the postgres and relay parts only when with_db (the limit run has neither);
 * past CPU_NOISY_PCT outside, a second line says the stretch's figures are noisy. */
void cpu_print(const char *what, const struct cpu_cost *c, bool with_db);
/* Prints " (CPU 0 96 %, CPU 1 86 %)": each CPU's busy share, on a machine with more than one
 * (nothing otherwise). */
void cpu_print_each(const struct cpu_cost *c);

#endif
