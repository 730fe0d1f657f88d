/* Linked into every test executable of a ThreadSanitizer build, nowhere else. Criterion's
 * runner (boxfort) puts its shared arena at a random address in [0x200000000000,
 * 0x600000000000) that it must find unmapped, trying a few times; ThreadSanitizer reserves
 * nearly all of that range, so the runner gives up at start ("Could not initialize inheritable
 * arena", Snaipe/Criterion#274). Its only source of randomness is rand_r(), which the
 * executable interposes here to name addresses in the part of the range ThreadSanitizer leaves
 * to position-independent executables (0x550000000000-0x568000000000), 16 MiB apart. */
#include <stdlib.h>

int rand_r(unsigned int *seed)
{
	/* (0x560000000000 - 0x200000000000) >> 24: boxfort multiplies by 16 MiB and adds the
	 * range's start. */
	return (int)(0x360000u + ((*seed)++ & 0xffu));
}
