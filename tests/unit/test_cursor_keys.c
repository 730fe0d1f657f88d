/* The key set the cursor source builds each batch with (store/source/cursor_keys.h): a key's
 * flags accumulate, a clear forgets every key at once, and many keys (colliding slots, a grown
 * table) are all found again. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "store/source/cursor_keys.h"

Test(cursor_keys, flags_accumulate_and_a_clear_forgets_them)
{
	struct cursor_keys k = { 0 };

	cr_assert_eq(cursor_keys_get(&k, "a"), 0, "an empty set knows no key");
	cr_assert_eq(cursor_keys_reserve(&k, 4), 0);
	cursor_keys_add(&k, "a", CURSOR_KEY_IN_BATCH);
	cr_assert_eq(cursor_keys_get(&k, "a"), CURSOR_KEY_IN_BATCH);
	cr_assert_eq(cursor_keys_get(&k, "b"), 0);
	cursor_keys_add(&k, "a", CURSOR_KEY_PASSED);
	cr_assert_eq(cursor_keys_get(&k, "a"), CURSOR_KEY_IN_BATCH | CURSOR_KEY_PASSED);
	cursor_keys_clear(&k);
	cr_assert_eq(cursor_keys_get(&k, "a"), 0, "a cleared set still knew a key");
	cursor_keys_add(&k, "b", CURSOR_KEY_PASSED);
	cr_assert_eq(cursor_keys_get(&k, "b"), CURSOR_KEY_PASSED);
	cursor_keys_free(&k);
}

Test(cursor_keys, thousands_of_keys_are_each_found_with_their_own_flags)
{
	enum { N = 5000 };
	static char names[N][16];
	struct cursor_keys k = { 0 };

	cr_assert_eq(cursor_keys_reserve(&k, 10), 0);
	cr_assert_eq(cursor_keys_reserve(&k, N), 0, "growing the set failed");
	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof(names[i]), "key-%d", i);
		cursor_keys_add(&k, names[i], i % 2 ? CURSOR_KEY_PASSED : CURSOR_KEY_IN_BATCH);
	}
	for (int i = 0; i < N; i++) {
		char probe[16]; /* another copy: keys are compared, not pointers */
		snprintf(probe, sizeof(probe), "key-%d", i);
		cr_assert_eq(cursor_keys_get(&k, probe),
		             i % 2 ? CURSOR_KEY_PASSED : CURSOR_KEY_IN_BATCH, "%s", probe);
	}
	cr_assert_eq(cursor_keys_get(&k, "key-5000"), 0);
	for (int round = 0; round < 3; round++) {
		cursor_keys_clear(&k);
		for (int i = 0; i < N; i++)
			cr_assert_eq(cursor_keys_get(&k, names[i]), 0);
	}
	cursor_keys_free(&k);
}
