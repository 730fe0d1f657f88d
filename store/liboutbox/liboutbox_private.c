/* The error text of liboutbox's calls (outbox.c, inbox.c): one line in the caller's errbuf. */
#include "store/liboutbox/liboutbox_private.h"

#include <stdarg.h>
#include <stdio.h>

void liboutbox_set_err(char *errbuf, size_t errlen, const char *msg, const char *detail)
{
	liboutbox_errorf(errbuf, errlen, "%s%s%s", msg, detail ? ": " : "", detail ? detail : "");
}

void liboutbox_errorf(char *errbuf, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!errbuf || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(errbuf, errlen, fmt, ap);
	va_end(ap);
}
