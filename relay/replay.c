/* `outbox-relay replay`: publishes retained published rows again (placeholder while it is
 * written). */
#include <stdio.h>

#include "relay/relay.h"

int command_replay(const struct config *cfg, int argc, char **argv)
{
	(void)cfg;
	(void)argc;
	(void)argv;
	fputs("outbox-relay: replay: not available yet\n", stderr);
	return 1;
}
