/* Monotonic and wall clocks in milliseconds and microseconds: the one place every layer reads
 * time from, so that deadlines computed in one module compare with those of another. */
#ifndef OUTBOX_BASE_CLOCK_H
#define OUTBOX_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC: for deadlines and durations (never jumps with the wall clock). */
static inline int64_t clock_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t clock_mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Sleeps us microseconds (nothing when us <= 0). A signal may end it early: callers loop on
 * their own deadlines. */
static inline void clock_sleep_us(int64_t us)
{
	struct timespec ts;

	if (us <= 0)
		return;
	ts.tv_sec = (time_t)(us / 1000000);
	ts.tv_nsec = (long)(us % 1000000) * 1000;
	nanosleep(&ts, NULL);
}

/* CLOCK_REALTIME: only for what is shown to people (timestamps, "refreshed at"). */
static inline int64_t clock_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
