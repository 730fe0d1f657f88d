/* The maintenance loop's pacing of the table gauges: every 5 s while reading them is cheap,
 * and never more than a twentieth of the time when the backlog makes them expensive. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "relay/relay.h"

Test(gauge_pacing, cheap_readings_every_five_seconds)
{
	cr_assert_eq(maintenance_gauge_delay_ms(0), 5000);
	cr_assert_eq(maintenance_gauge_delay_ms(-1), 5000); /* a failed reading */
	cr_assert_eq(maintenance_gauge_delay_ms(-3), 5000); /* a clock step */
	cr_assert_eq(maintenance_gauge_delay_ms(12), 5000);
	cr_assert_eq(maintenance_gauge_delay_ms(250), 5000);
}

Test(gauge_pacing, expensive_readings_take_at_most_a_twentieth_of_the_time)
{
	for (int64_t took = 251; took < 15000; took += 97) {
		int64_t wait = maintenance_gauge_delay_ms(took);

		cr_assert_geq(wait, 20 * took, "a %lld ms reading followed after %lld ms",
		              (long long)took, (long long)wait);
		cr_assert_leq(wait, 20 * took + 1, "a %lld ms reading waits %lld ms",
		              (long long)took, (long long)wait);
	}
	cr_assert_eq(maintenance_gauge_delay_ms(600), 12000);
}

Test(gauge_pacing, figures_never_older_than_five_minutes)
{
	cr_assert_eq(maintenance_gauge_delay_ms(15000), 300000);
	cr_assert_eq(maintenance_gauge_delay_ms(60000), 300000);
	cr_assert_eq(maintenance_gauge_delay_ms(INT64_MAX), 300000);
}
