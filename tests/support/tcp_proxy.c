/* Fault-injecting TCP proxy for the tests: one poll() loop on its own thread forwards bytes
 * between accepted clients and the target, and obeys drop/stall/refuse commands that the
 * test thread posts through a self-pipe. */
#include "tests/support/tcp_proxy.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROXY_MAX_PAIRS 256
#define PROXY_BUF       65536

struct pair {
	int fd[2];              /* 0 = client side, 1 = target side */
	char buf[2][PROXY_BUF]; /* buf[d] holds bytes read from fd[d], to be written to fd[!d] */
	size_t len[2], off[2];
};

struct proxy {
	int listen_fd;
	int port, target_port;
	int wake[2];
	pthread_t thread;
	struct pair *pairs[PROXY_MAX_PAIRS];
	size_t n_pairs;

	pthread_mutex_t mu; /* guards the fields below */
	pthread_cond_t cv;
	bool stall, hold, refuse, quit; /* hold: client bytes are not forwarded */
	unsigned drop_req;              /* drop requests posted */
	unsigned seq_req;               /* commands posted */
	unsigned seq_done;              /* commands applied by the loop */
	size_t live, accepted;
};

static void set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl >= 0)
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void close_pair(struct proxy *p, size_t i)
{
	close(p->pairs[i]->fd[0]);
	close(p->pairs[i]->fd[1]);
	free(p->pairs[i]);
	p->pairs[i] = p->pairs[--p->n_pairs];
}

static void close_all(struct proxy *p)
{
	while (p->n_pairs > 0)
		close_pair(p, p->n_pairs - 1);
}

static int connect_target(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;

	if (fd < 0)
		return -1;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	/* Blocking connect: loopback answers at once, and a refused target simply means the
	 * client is closed, which is what it would see without the proxy. */
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	set_nonblock(fd);
	return fd;
}

static void do_accept(struct proxy *p, bool refuse)
{
	int fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	int one = 1, tfd;
	struct pair *pr;

	if (fd < 0)
		return;
	if (refuse || p->n_pairs >= PROXY_MAX_PAIRS) {
		close(fd);
		return;
	}
	tfd = connect_target(p->target_port);
	if (tfd < 0) {
		close(fd);
		return;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	pr = calloc(1, sizeof(*pr));
	if (pr == NULL) {
		close(fd);
		close(tfd);
		return;
	}
	pr->fd[0] = fd;
	pr->fd[1] = tfd;
	p->pairs[p->n_pairs++] = pr;
	pthread_mutex_lock(&p->mu);
	p->accepted++;
	pthread_mutex_unlock(&p->mu);
}

/* Moves bytes for one pair after poll (held: none from the client); returns false when the
 * pair must be closed. */
static bool pump(struct pair *pr, const struct pollfd *pf, bool hold)
{
	for (int d = hold ? 1 : 0; d < 2; d++) {
		int src = pr->fd[d], dst = pr->fd[!d];

		if ((pf[d].revents & POLLIN) && pr->len[d] == 0) {
			ssize_t n = recv(src, pr->buf[d], PROXY_BUF, 0);

			if (n == 0)
				return false;
			if (n < 0 && errno != EAGAIN && errno != EINTR)
				return false;
			if (n > 0) {
				pr->len[d] = (size_t)n;
				pr->off[d] = 0;
			}
		}
		if (pr->len[d] > 0) {
			ssize_t n = send(dst, pr->buf[d] + pr->off[d], pr->len[d], MSG_NOSIGNAL);

			if (n < 0 && errno != EAGAIN && errno != EINTR)
				return false;
			if (n > 0) {
				pr->off[d] += (size_t)n;
				pr->len[d] -= (size_t)n;
			}
		}
	}
	/* A hang-up or error with nothing left to read means the peer is gone. */
	for (int d = 0; d < 2; d++) {
		if ((pf[d].revents & (POLLERR | POLLNVAL)) ||
		    ((pf[d].revents & POLLHUP) && !(pf[d].revents & POLLIN)))
			return false;
	}
	return true;
}

static void *proxy_main(void *arg)
{
	struct proxy *p = arg;
	struct pollfd pfd[2 + 2 * PROXY_MAX_PAIRS];
	unsigned drops_applied = 0;

	for (;;) {
		bool stall, hold, refuse;
		unsigned drops, seq;
		size_t n = 0;

		pthread_mutex_lock(&p->mu);
		if (p->quit) {
			pthread_mutex_unlock(&p->mu);
			break;
		}
		stall = p->stall;
		hold = p->hold;
		refuse = p->refuse;
		drops = p->drop_req;
		seq = p->seq_req;
		pthread_mutex_unlock(&p->mu);

		if (drops != drops_applied) {
			close_all(p);
			drops_applied = drops;
		}
		pthread_mutex_lock(&p->mu);
		p->live = p->n_pairs;
		p->seq_done = seq;
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);

		pfd[n++] = (struct pollfd){ .fd = p->wake[0], .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = p->listen_fd, .events = POLLIN };
		for (size_t i = 0; i < p->n_pairs; i++) {
			struct pair *pr = p->pairs[i];

			for (int d = 0; d < 2; d++) {
				short ev = 0;

				/* Stalled: no events requested, so no bytes move, but a peer that
				 * hangs up still shows as POLLHUP/POLLERR. Held: the same for the
				 * client's bytes only (read from fd[0], written to fd[1]). */
				if (!stall) {
					if (pr->len[d] == 0 && !(hold && d == 0))
						ev |= POLLIN;
					if (pr->len[!d] > 0 && !(hold && d == 1))
						ev |= POLLOUT;
				}
				pfd[n++] = (struct pollfd){ .fd = pr->fd[d], .events = ev };
			}
		}
		if (poll(pfd, n, 1000) < 0 && errno != EINTR)
			break;
		if (pfd[0].revents & POLLIN) {
			char drain[64];

			while (read(p->wake[0], drain, sizeof(drain)) > 0)
				;
			continue; /* re-read the commands before touching any socket */
		}
		/* Walk backwards: close_pair() moves the last pair into the freed slot. */
		for (size_t i = p->n_pairs; i-- > 0;) {
			if (stall) {
				const struct pollfd *pf = &pfd[2 + 2 * i];

				if ((pf[0].revents | pf[1].revents) &
				    (POLLHUP | POLLERR | POLLNVAL))
					close_pair(p, i);
				continue;
			}
			if (!pump(p->pairs[i], &pfd[2 + 2 * i], hold))
				close_pair(p, i);
		}
		if (pfd[1].revents & POLLIN)
			do_accept(p, refuse);
		pthread_mutex_lock(&p->mu);
		p->live = p->n_pairs;
		pthread_mutex_unlock(&p->mu);
	}
	close_all(p);
	return NULL;
}

/* Posts a command and waits until the loop has applied it. */
static void post(struct proxy *p)
{
	unsigned want;
	char b = 1;

	pthread_mutex_lock(&p->mu);
	want = ++p->seq_req;
	pthread_mutex_unlock(&p->mu);
	if (write(p->wake[1], &b, 1) < 0 && errno != EAGAIN)
		cr_assert_fail("proxy wake-up failed: %s", strerror(errno));
	pthread_mutex_lock(&p->mu);
	while ((int)(p->seq_done - want) < 0)
		pthread_cond_wait(&p->cv, &p->mu);
	pthread_mutex_unlock(&p->mu);
}

struct proxy *proxy_start(int target_port)
{
	return proxy_start_at("127.0.0.1", 0, target_port);
}

struct proxy *proxy_start_at(const char *ipv4, int port, int target_port)
{
	struct proxy *p = calloc(1, sizeof(*p));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	socklen_t alen = sizeof(a);
	int one = 1;

	cr_assert_not_null(p);
	p->target_port = target_port;
	p->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(p->listen_fd >= 0, "socket: %s", strerror(errno));
	setsockopt(p->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	cr_assert_eq(inet_pton(AF_INET, ipv4, &a.sin_addr), 1, "not an IPv4 address: %s", ipv4);
	cr_assert(bind(p->listen_fd, (struct sockaddr *)&a, sizeof(a)) == 0, "bind %s:%d: %s", ipv4,
	          port, strerror(errno));
	cr_assert(listen(p->listen_fd, 64) == 0, "listen: %s", strerror(errno));
	cr_assert(getsockname(p->listen_fd, (struct sockaddr *)&a, &alen) == 0);
	p->port = ntohs(a.sin_port);
	set_nonblock(p->listen_fd);
	cr_assert(pipe2(p->wake, O_CLOEXEC | O_NONBLOCK) == 0, "pipe: %s", strerror(errno));
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	cr_assert_eq(pthread_create(&p->thread, NULL, proxy_main, p), 0);
	return p;
}

void proxy_stop(struct proxy *p)
{
	char b = 1;

	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	p->quit = true;
	pthread_mutex_unlock(&p->mu);
	if (write(p->wake[1], &b, 1) < 0) {
		/* The pipe is full, so a wake-up is already pending. */
	}
	pthread_join(p->thread, NULL);
	close(p->listen_fd);
	close(p->wake[0]);
	close(p->wake[1]);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p);
}

int proxy_port(const struct proxy *p)
{
	return p->port;
}

void proxy_drop_all(struct proxy *p)
{
	pthread_mutex_lock(&p->mu);
	p->drop_req++;
	pthread_mutex_unlock(&p->mu);
	post(p);
}

void proxy_stall(struct proxy *p, bool on)
{
	pthread_mutex_lock(&p->mu);
	p->stall = on;
	pthread_mutex_unlock(&p->mu);
	post(p);
}

void proxy_hold(struct proxy *p, bool on)
{
	pthread_mutex_lock(&p->mu);
	p->hold = on;
	pthread_mutex_unlock(&p->mu);
	post(p);
}

void proxy_refuse(struct proxy *p, bool on)
{
	pthread_mutex_lock(&p->mu);
	p->refuse = on;
	pthread_mutex_unlock(&p->mu);
	post(p);
}

size_t proxy_live(struct proxy *p)
{
	size_t n;

	pthread_mutex_lock(&p->mu);
	n = p->live;
	pthread_mutex_unlock(&p->mu);
	return n;
}

size_t proxy_accepted(struct proxy *p)
{
	size_t n;

	pthread_mutex_lock(&p->mu);
	n = p->accepted;
	pthread_mutex_unlock(&p->mu);
	return n;
}
