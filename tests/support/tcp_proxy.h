/* tcp_proxy.h — a TCP proxy on 127.0.0.1 between the relay and a server, for injecting
 * network faults: cut every connection at once, stall the byte stream while keeping the
 * sockets open (a silent peer, as after a network partition), or refuse new connections.
 * It runs on its own thread; the control calls are thread-safe and take effect before they
 * return. */
#ifndef OUTBOX_TESTS_TCP_PROXY_H
#define OUTBOX_TESTS_TCP_PROXY_H

#include <stdbool.h>
#include <stddef.h>

struct proxy;

/* Listens on an ephemeral 127.0.0.1 port and forwards to 127.0.0.1:target_port. Fails the
 * test when it cannot listen. Free with proxy_stop(). */
struct proxy *proxy_start(int target_port);
/* The same, listening on ipv4 ("127.0.0.2": any loopback address) at port (0 = ephemeral). */
struct proxy *proxy_start_at(const char *ipv4, int port, int target_port);
/* Closes every connection and the listener, joins the thread, frees p; accepts NULL. */
void proxy_stop(struct proxy *p);
/* The port clients connect to. */
int proxy_port(const struct proxy *p);

/* Closes every live connection (both sides) at once; new ones are accepted as usual. */
void proxy_drop_all(struct proxy *p);
/* on: stop moving bytes in both directions, keep the sockets open. off: resume. */
void proxy_stall(struct proxy *p, bool on);
/* on: bytes from clients stay in their sockets, not forwarded, while the target's still
 * reach the clients: the target hears nothing from them, and what it says (a close) is
 * heard. off: resume. */
void proxy_hold(struct proxy *p, bool on);
/* on: every new connection is closed right after accept. Live ones are left alone. */
void proxy_refuse(struct proxy *p, bool on);

size_t proxy_live(struct proxy *p);     /* connections open now */
size_t proxy_accepted(struct proxy *p); /* connections forwarded since the start */

#endif
