/* The ordering watermark (store/source/watermark.h) alone: samples in, settled seq out. Every case is
 * a sequence of (W, lock holders) samples as the claim reads them. */
#include <criterion/criterion.h>

#include "store/source/watermark.h"

static watermark_vxid vx(const char *text)
{
	watermark_vxid v = 0;

	cr_assert_eq(watermark_parse_vxid(text, &v), 0, "parse %s", text);
	return v;
}

static struct watermark wm;

static void init(void)
{
	watermark_reset(&wm);
}

TestSuite(watermark, .init = init);

Test(watermark, parses_virtual_transaction_ids)
{
	watermark_vxid a, b;

	cr_assert_eq(watermark_parse_vxid("3/1234", &a), 0);
	cr_assert_eq(watermark_parse_vxid("3/1235", &b), 0);
	cr_assert_neq(a, b);
	cr_assert_eq(watermark_parse_vxid("-1/99", &a), 0, "a prepared transaction");
	cr_assert_eq(watermark_parse_vxid("4294967295/1", &a), -1, "backend out of range");
	cr_assert_eq(watermark_parse_vxid("3/", &a), -1);
	cr_assert_eq(watermark_parse_vxid("/3", &a), -1);
	cr_assert_eq(watermark_parse_vxid("3/12x", &a), -1);
	cr_assert_eq(watermark_parse_vxid("3/-1", &a), -1);
	cr_assert_eq(watermark_parse_vxid("", &a), -1);
	cr_assert_eq(watermark_parse_vxid(NULL, &a), -1);
	cr_assert_eq(watermark_parse_vxid("3/99999999999", &a), -1, "local id out of range");
}

Test(watermark, nobody_holding_the_lock_settles_at_once)
{
	cr_assert_eq(watermark_safe(&wm), 0, "nothing is settled before a sample");
	watermark_sample(&wm, 100, NULL, 0, true);
	cr_assert_eq(watermark_safe(&wm), 100);
	cr_assert_not(watermark_settling(&wm));
}

Test(watermark, settles_once_every_holder_has_ended)
{
	watermark_vxid first[] = { vx("3/10"), vx("4/20") };
	watermark_vxid one_left[] = { vx("4/20"), vx("5/30") };
	watermark_vxid others[] = { vx("5/30"), vx("6/40") };
	watermark_vxid later[] = { vx("6/40"), vx("7/50") };

	watermark_sample(&wm, 100, first, 2, true);
	cr_assert_eq(watermark_safe(&wm), 0, "3/10 and 4/20 may still commit a seq <= 100");
	wm.waiting = true;
	cr_assert(watermark_settling(&wm), "a fresh candidate may settle at the next sample");

	watermark_sample(&wm, 120, one_left, 2, true);
	cr_assert_eq(watermark_safe(&wm), 0, "4/20 still holds the lock");
	cr_assert(wm.stuck);
	cr_assert_not(watermark_settling(&wm), "a transaction from before still runs");

	/* 4/20 ended: 100 settles. 5/30, which took the lock after 100 was read, holds back
	 * only 120 (it is on 120's list). */
	watermark_sample(&wm, 130, others, 2, true);
	cr_assert_eq(watermark_safe(&wm), 100);

	watermark_sample(&wm, 140, later, 2, true);
	cr_assert_eq(watermark_safe(&wm), 120, "5/30 ended; 130 waits for 6/40");

	watermark_sample(&wm, 150, NULL, 0, true);
	cr_assert_eq(watermark_safe(&wm), 150, "an empty lock list settles everything read so far");
	cr_assert_eq(wm.ncand, 0);
}

/* The defect the lock list fixes: a transaction that has drawn a seq but has no transaction
 * id yet holds the lock, so a W above its seq never settles while it runs, however many
 * samples (and whatever snapshot xmin) come. */
Test(watermark, a_holder_without_xid_holds_back_every_later_w)
{
	watermark_vxid drawing[] = { vx("9/1") };

	for (int i = 0; i < 50; i++)
		watermark_sample(&wm, 10 + i, drawing, 1, true);
	cr_assert_eq(watermark_safe(&wm), 0);
	watermark_sample(&wm, 70, NULL, 0, true);
	cr_assert_eq(watermark_safe(&wm), 70);
}

/* A later W whose holders have all ended is settled whatever an older candidate still waits
 * for: every transaction with a seq below it either ended before its list was read or is on
 * that list. */
Test(watermark, a_later_candidate_settles_even_if_an_older_one_waits)
{
	watermark_vxid a[] = { vx("1/1"), vx("2/2") };
	watermark_vxid b[] = { vx("2/2"), vx("3/3") };
	watermark_vxid c[] = { vx("1/1") };

	watermark_sample(&wm, 100, a, 2, true);
	watermark_sample(&wm, 200, b, 2, true);
	cr_assert_eq(watermark_safe(&wm), 0, "2/2 of 100's list still holds the lock");
	watermark_sample(&wm, 210, c, 1, true);
	cr_assert_eq(watermark_safe(&wm), 200, "200's holders 2/2 and 3/3 have ended");
}

Test(watermark, cut_short_lists_settle_nothing)
{
	watermark_vxid a[] = { vx("1/1") };

	watermark_sample(&wm, 100, a, 1, true);
	watermark_sample(&wm, 200, NULL, 0, false);
	cr_assert_eq(watermark_safe(&wm), 0, "a list we could not read whole proves nothing");
	cr_assert_eq(wm.ncand, 1);
	watermark_sample(&wm, 210, NULL, 0, true);
	cr_assert_eq(watermark_safe(&wm), 210);
}

Test(watermark, duplicates_and_order_of_holders_do_not_matter)
{
	watermark_vxid a[] = { vx("5/5"), vx("1/1"), vx("5/5"), vx("3/3") };
	watermark_vxid still[] = { vx("3/3") };
	watermark_vxid other[] = { vx("1/1") };

	watermark_sample(&wm, 100, a, 4, true);
	watermark_sample(&wm, 110, still, 1, true);
	cr_assert_eq(watermark_safe(&wm), 0, "3/3 of 100's list still holds the lock");
	watermark_sample(&wm, 120, other, 1, true);
	cr_assert_eq(watermark_safe(&wm), 110, "110 waited only for 3/3");
}

Test(watermark, never_moves_back_and_reset_forgets)
{
	watermark_sample(&wm, 100, NULL, 0, true);
	watermark_sample(&wm, 50, NULL, 0, true);
	cr_assert_eq(watermark_safe(&wm), 100, "a lower W never lowers the watermark");
	watermark_reset(&wm);
	cr_assert_eq(watermark_safe(&wm), 0, "a new connection starts unsettled");
}

Test(watermark, at_most_a_bounded_number_of_candidates)
{
	watermark_vxid h[] = { vx("1/1") };

	for (int i = 0; i < 3 * WATERMARK_CANDIDATES; i++)
		watermark_sample(&wm, 100 + i, h, 1, true);
	cr_assert_leq(wm.ncand, WATERMARK_CANDIDATES);
	watermark_sample(&wm, 1000, NULL, 0, true);
	cr_assert_eq(watermark_safe(&wm), 1000);
}
