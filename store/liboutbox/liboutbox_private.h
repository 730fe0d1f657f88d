/* liboutbox_private.h — what liboutbox's own files (outbox.c, inbox.c) share: writing the one
 * line of error text their callers get in errbuf. Not installed. */
#ifndef OUTBOX_STORE_LIBOUTBOX_PRIVATE_H
#define OUTBOX_STORE_LIBOUTBOX_PRIVATE_H

#include <stddef.h>

/* Writes "msg" or "msg: detail" (detail may be NULL) into errbuf (errlen bytes, the caller's;
 * nothing when errbuf is NULL or errlen is 0), cut short when it does not fit. */
void liboutbox_set_err(char *errbuf, size_t errlen, const char *msg, const char *detail);

/* The same with a printf format. */
void liboutbox_errorf(char *errbuf, size_t errlen, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

#endif
