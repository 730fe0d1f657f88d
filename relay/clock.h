/* Monotonic and wall clocks in milliseconds/microseconds. */
#ifndef OUTBOX_RELAY_CLOCK_H
#define OUTBOX_RELAY_CLOCK_H

#include <stdint.h>
#include <time.h>

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

#endif
