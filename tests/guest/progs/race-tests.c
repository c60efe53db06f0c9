// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel guest race tests: garbage arguments and races thrown at the
 * driver, then checks that the device and the kernel are still healthy.
 * Tests on the harness of cxla_harness.h, each in its own child process,
 * one line each:
 *
 *   RESULT <prefix><name> PASS|FAIL|SKIP <detail>
 *
 * Usage: race-tests [-d /dev/cxl-accelN] [-P /dev/cxl-accelM] [-p prefix]
 *                   [-t name]... [-l]
 *   -P names a second device: DMA-BUF imports go there (peer-to-peer);
 *   without it the device imports its own exports.
 *
 * After every test the fixture's teardown checks that it left nothing behind:
 * device memory free, driver buffers, quarantined commands, protocol
 * errors, DMA-BUF exports/attachments/mappings/pins/imports and the
 * migration pool of both devices are back where they were before it (each
 * test closes what it opened), and that the kernel logged no warning or
 * error meanwhile. The last test, "health", checks that the device still
 * answers correctly and that nothing at all is left. Every test is bounded
 * to a few seconds of loops; an alarm catches hangs. One program at a time:
 * another one on the same devices would disturb the exact counters.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <linux/dma-buf.h>
#include <linux/dma-heap.h>
#include <linux/io_uring.h>
#include <linux/udmabuf.h>
#include <linux/userfaultfd.h>

#include "cxla_harness.h"

#ifndef MADV_COLD
#define MADV_COLD		20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT		21
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ	22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE	23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE		25
#endif

#define KiB		1024ULL
#define MiB		(1024 * KiB)
#define PG		4096UL
#define TEST_TIMEOUT_S	60
#define SETTLE_S	20	/* quarantined commands and deferred frees */

/* DMA-BUF counters of sysfs dmabuf/ that must go back to 0 */
static const char * const db_live[] = {
	"exports", "attachments", "p2p_attachments", "mappings", "pins",
	"imports", "imports_mapped",
};
#define NDB	ARRAY_SIZE(db_live)

/* What must be back after a test */
struct devstate {
	long long free;		/* IDENTIFY devmem_free */
	long buffers;		/* driver's live buffers (sysfs) */
	long quarantined;
	long protocol;
	long db[NDB];
	long long chunks;	/* migration pool */
	long long pages_used;
};

/* every test: the device (-d) and the peer (-P) if any, their state before it */
FIXTURE(dev) {
	CXLA_DEVS;
	char name[32];		/* sysfs name of the device */
	char peer_name[32];
	struct devstate base, pbase;
	uint64_t seed;
};

/* /dev/kmsg, at the end of the log when the program started */
static int kmsg_fd = -1;
static long protocol_at_start = -1;

/* ------------------------------------------------------------ helpers */

static int signal_dev(int fd, uint64_t value)
{
	struct cxl_accel_signal s = { .value = value };

	return cxla_ioctl(fd, CXL_ACCEL_IOC_SIGNAL, &s);
}

/* the importing device of the DMA-BUF tests: the peer, else this one */
static const char *imp_path(const FIXTURE_DATA(dev) *c)
{
	return c->peer_path ? c->peer_path : c->path;
}

static uint32_t rnd32(uint64_t *s)
{
	return (uint32_t)(rnd64(s) >> 32);
}

static void msleep_(unsigned int ms)
{
	usleep(ms * 1000);
}

/* wait until *flag is set (by a worker about to enter a call), at most ms */
static bool wait_flag(int *flag, unsigned int ms)
{
	unsigned int i;

	for (i = 0; i < ms * 2 && !__atomic_load_n(flag, __ATOMIC_SEQ_CST); i++)
		usleep(500);
	return __atomic_load_n(flag, __ATOMIC_SEQ_CST);
}

/* wait (up to 3 s) until thread tid sleeps in system call nr */
static bool in_syscall(pid_t tid, long nr)
{
	char p[64], buf[80];
	int fd, i, n;

	snprintf(p, sizeof(p), "/proc/self/task/%d/syscall", tid);
	for (i = 0; i < 600; i++) {
		fd = open(p, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return false;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (n > 0) {
			buf[n] = 0;
			if (buf[0] >= '0' && buf[0] <= '9' && strtol(buf, NULL, 10) == nr)
				return true;
		}
		usleep(5000);
	}
	return false;
}

static int open_fds(void)
{
	struct dirent *de;
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n - 1;	/* the directory itself */
}

/*
 * Outcomes of calls that may fail: a histogram of errnos and the first
 * outcome that is not in the allowed set.
 */
#define NERR	134

struct tally {
	long n[NERR + 1];	/* [0]: successes, [e]: failed with errno e */
	int bad;		/* errno of the first unexpected failure */
	char what[80];		/* and what it was */
};

static const int E_GARBAGE[] = {
	EINVAL, EFAULT, ENOENT, ENOSPC, E2BIG, EOPNOTSUPP, EBADF, EINTR,
	ETIMEDOUT, EAGAIN, EPERM, EBUSY, ENOMEM, EMFILE, 0
};

static const char *ename(int e)
{
	const char *s = e > 0 ? strerrorname_np(e) : NULL;

	return s ? s : "E?";
}

/* count r (0 or -errno); allowed: 0-terminated errnos besides success */
static void note(struct tally *t, int r, const int *allowed, const char *fmt, ...)
{
	int e = r < 0 ? -r : 0, i;
	va_list ap;

	t->n[e > NERR ? NERR : e]++;
	if (!e)
		return;
	for (i = 0; allowed && allowed[i]; i++)
		if (allowed[i] == e)
			return;
	if (t->bad)
		return;
	t->bad = e;
	va_start(ap, fmt);
	vsnprintf(t->what, sizeof(t->what), fmt, ap);
	va_end(ap);
}

static void tally_add(struct tally *to, const struct tally *from)
{
	int e;

	for (e = 0; e <= NERR; e++)
		to->n[e] += from->n[e];
	if (!to->bad && from->bad) {
		to->bad = from->bad;
		memcpy(to->what, from->what, sizeof(to->what));
	}
}

static const char *tally_str(const struct tally *t, char *buf, size_t len)
{
	size_t o = 0;
	int e;

	buf[0] = 0;
	for (e = 0; e <= NERR && o < len; e++)
		if (t->n[e])
			o += snprintf(buf + o, len - o, "%s%s %ld", o ? " " : "",
				      e ? ename(e) : "ok", t->n[e]);
	return buf;
}

#define TALLY_OK(t) do {						\
	char __b[200];							\
	CHECK(!(t)->bad, "%s: unexpected %s (%s)", (t)->what,		\
	      ename((t)->bad), tally_str(t, __b, sizeof(__b)));		\
} while (0)

/* ----------------------------------------------- leak and state checks */

static int get_state(const char *name, int fd, struct devstate *s)
{
	struct cxl_accel_identify id;
	struct cxl_accel_hmm_info h;
	char attr[64];
	unsigned int k;

	if (cxla_identify(fd, &id) || cxla_hmm_info(fd, &h))
		return -1;
	s->free = id.devmem_free;
	s->buffers = cxla_sysfs_long(name, "buffers");
	s->quarantined = cxla_sysfs_long(name, "quarantined");
	s->protocol = cxla_sysfs_long(name, "protocol_errors");
	for (k = 0; k < NDB; k++) {
		snprintf(attr, sizeof(attr), "dmabuf/%s", db_live[k]);
		s->db[k] = cxla_sysfs_long(name, attr);
	}
	s->chunks = h.pool_chunks;
	s->pages_used = h.pool_pages_used;
	return 0;
}

/* NULL if s is back at b, else what differs (in out) */
static const char *state_diff(const struct devstate *b,
			      const struct devstate *s, char *out, size_t len)
{
	unsigned int k;

	if (s->free != b->free)
		snprintf(out, len, "devmem_free %lld, was %lld", s->free, b->free);
	else if (s->buffers != b->buffers)
		snprintf(out, len, "buffers %ld, was %ld", s->buffers, b->buffers);
	else if (s->quarantined > b->quarantined)
		snprintf(out, len, "quarantined %ld, was %ld", s->quarantined,
			 b->quarantined);
	else if (s->protocol != b->protocol)
		snprintf(out, len, "protocol_errors %ld, was %ld", s->protocol,
			 b->protocol);
	else if (s->chunks || s->pages_used)
		snprintf(out, len, "migration pool: %lld chunks, %lld pages used",
			 s->chunks, s->pages_used);
	else {
		for (k = 0; k < NDB; k++) {
			if (s->db[k] != b->db[k]) {
				snprintf(out, len, "dmabuf/%s %ld, was %ld",
					 db_live[k], s->db[k], b->db[k]);
				return out;
			}
		}
		return NULL;
	}
	return out;
}

/*
 * Wait (bounded) until both devices are back to their state before the
 * test: quarantined commands finish and deferred frees run asynchronously.
 */
static int wait_for_base_state(FIXTURE_DATA(dev) *c)
{
	double t0 = now_sec();
	struct devstate s;
	char why[160], what[140];
	const char *d;

	for (;;) {
		snprintf(why, sizeof(why), "%s: state unreadable", c->name);
		d = why;
		if (!get_state(c->name, c->fd, &s)) {
			d = state_diff(&c->base, &s, what, sizeof(what));
			if (d)
				snprintf(why, sizeof(why), "%s: %s", c->name, what);
		}
		if (!d && c->pfd >= 0) {
			snprintf(why, sizeof(why), "%s: state unreadable", c->peer_name);
			d = why;
			if (!get_state(c->peer_name, c->pfd, &s)) {
				d = state_diff(&c->pbase, &s, what, sizeof(what));
				if (d)
					snprintf(why, sizeof(why), "%s: %s",
						 c->peer_name, what);
			}
		}
		if (!d)
			return 0;
		if (now_sec() - t0 > SETTLE_S)
			break;
		usleep(50000);
	}
	DETAIL("leak after the test (%d s later): %s", SETTLE_S, why);
	return -1;
}

static int kmsg_problems(char *first, size_t len);

/* ------------------------------------------------------ garbage ioctls */

struct known {
	unsigned long cmd;
	const char *name;
};

#define K(x) { CXL_ACCEL_IOC_##x, #x }
static const struct known known[] = {
	K(IDENTIFY), K(ALLOC), K(FREE), K(COPY), K(FILL), K(CHECKSUM),
	K(ATOMIC), K(SIGNAL), K(WAIT_EVENT), K(STATS), K(EXPORT_DMABUF),
	K(IMPORT_DMABUF), K(MIGRATE_TO_DEV), K(MIGRATE_TO_RAM), K(EVICT),
	K(HMM_INFO), K(SVM), K(SNAPSHOT), K(PIN_CHECKSUM), K(NOP),
};

static bool is_known(unsigned long cmd)
{
	unsigned int k;

	for (k = 0; k < ARRAY_SIZE(known); k++)
		if (known[k].cmd == cmd)
			return true;
	return false;
}

/* every unknown ioctl number: -ENOTTY, argument untouched */
CXLA_TEST_F(dev, garbage_ioctl_numbers)
{
	static const unsigned int magics[] = { CXL_ACCEL_IOC_MAGIC, 0xCB, 'x' };
	static const unsigned int sizes[] = {
		0, 1, 8, 24, 40, 64, 96, 168, 4096, 16383,
	};
	const size_t len = 4 * PG;
	uint8_t *buf = map_anon(len), *copy = malloc(len);
	unsigned int m, nr, dir, s;
	long n = 0;
	int r;

	CHECK(buf && copy, "mmap");
	fill_random(buf, len, c->seed);
	memcpy(copy, buf, len);
	for (m = 0; m < ARRAY_SIZE(magics); m++) {
		for (nr = 0; nr < 256; nr++) {
			for (dir = 0; dir < 4; dir++) {
				for (s = 0; s < ARRAY_SIZE(sizes); s++) {
					unsigned long cmd = _IOC(dir, magics[m], nr,
								 sizes[s]);

					if (is_known(cmd))
						continue;
					r = cxla_ioctl(c->fd, cmd, buf);
					n++;
					CHECK(r == -ENOTTY,
					      "ioctl %#lx (magic %#x nr %#x dir %u size %u): %d (%s)",
					      cmd, magics[m], nr, dir, sizes[s], r,
					      r ? ename(-r) : "ok");
				}
			}
			/* and with a NULL argument */
			r = cxla_ioctl(c->fd, _IO(magics[m], nr), NULL);
			n++;
			CHECK(r == -ENOTTY || is_known(_IO(magics[m], nr)),
			      "ioctl _IO(%#x, %#x): %d", magics[m], nr, r);
		}
	}
	CHECK(!memcmp(buf, copy, len), "an unknown ioctl wrote into its argument");
	munmap(buf, len);
	free(copy);
	DETAIL("%ld unknown ioctl numbers (magics 0xca 0xcb 'x', every number, direction and 10 sizes, the driver's numbers with wrong sizes): all ENOTTY, argument untouched",
	       n);
	return PASS;
}

struct gctx {
	int fd;
	uint32_t h;		/* 64 KiB device buffer */
	uint8_t *ram;		/* 64 KiB private anonymous memory */
	uint8_t *snap;		/* SNAPSHOT output */
	int dmabuf;		/* DMA-BUF of h */
	uint32_t spare;		/* handle for FREE */
};

#define GLEN	(64 * KiB)

/* a valid argument for cmd */
static void g_template(struct gctx *g, unsigned long cmd, void *s)
{
	struct cxl_accel_alloc a;

	memset(s, 0, _IOC_SIZE(cmd));
	switch (cmd) {
	case CXL_ACCEL_IOC_ALLOC:
		((struct cxl_accel_alloc *)s)->size = 4096;
		break;
	case CXL_ACCEL_IOC_FREE:
		if (!g->spare && !cxla_alloc(g->fd, 4096, 0, &a))
			g->spare = a.handle;
		((struct cxl_accel_free *)s)->handle = g->spare;
		break;
	case CXL_ACCEL_IOC_COPY: {
		struct cxl_accel_copy *x = s;

		x->src = cxla_user(g->ram);
		x->dst = cxla_dev(g->h, 4096);
		x->len = 4096;
		break;
	}
	case CXL_ACCEL_IOC_FILL: {
		struct cxl_accel_fill *x = s;

		x->dst = cxla_dev(g->h, 8);
		x->len = 100;
		x->pattern = 0x1122334455667788ULL;
		break;
	}
	case CXL_ACCEL_IOC_CHECKSUM: {
		struct cxl_accel_checksum *x = s;

		x->src = cxla_user(g->ram + 3);
		x->len = 4096;
		break;
	}
	case CXL_ACCEL_IOC_ATOMIC: {
		struct cxl_accel_atomic *x = s;

		x->target = cxla_dev(g->h, 64);
		x->op = CXL_ACCEL_ATOMIC_FETCH_ADD;
		x->width = 8;
		x->operand = 1;
		x->repeat = 1;
		break;
	}
	case CXL_ACCEL_IOC_SIGNAL:
		((struct cxl_accel_signal *)s)->value = 7;
		break;
	case CXL_ACCEL_IOC_WAIT_EVENT:
		((struct cxl_accel_wait_event *)s)->timeout_ms = 1;
		break;
	case CXL_ACCEL_IOC_EXPORT_DMABUF: {
		struct cxl_accel_dmabuf_export *x = s;

		x->handle = g->h;
		x->flags = CXL_ACCEL_DMABUF_CLOEXEC;
		break;
	}
	case CXL_ACCEL_IOC_IMPORT_DMABUF:
		((struct cxl_accel_dmabuf_import *)s)->fd = g->dmabuf;
		break;
	case CXL_ACCEL_IOC_MIGRATE_TO_DEV:
	case CXL_ACCEL_IOC_MIGRATE_TO_RAM: {
		struct cxl_accel_migrate *x = s;

		x->addr = (uintptr_t)g->ram;
		x->len = GLEN;
		break;
	}
	case CXL_ACCEL_IOC_SVM: {
		struct cxl_accel_svm *x = s;

		x->addr = (uintptr_t)g->ram + 5;
		x->len = 5000;
		x->op = CXL_ACCEL_SVM_CHECKSUM;
		break;
	}
	case CXL_ACCEL_IOC_SNAPSHOT: {
		struct cxl_accel_snapshot *x = s;

		x->addr = (uintptr_t)g->ram;
		x->len = GLEN;
		x->flags_ptr = (uintptr_t)g->snap;
		break;
	}
	case CXL_ACCEL_IOC_PIN_CHECKSUM: {
		struct cxl_accel_pin_checksum *x = s;

		x->addr = (uintptr_t)g->ram + 1;
		x->len = 8000;
		break;
	}
	}
}

/* undo what a successful call created */
static void g_after(struct gctx *g, unsigned long cmd, const void *s, int r)
{
	if (r)
		return;
	switch (cmd) {
	case CXL_ACCEL_IOC_ALLOC:
		cxla_free(g->fd, ((const struct cxl_accel_alloc *)s)->handle);
		break;
	case CXL_ACCEL_IOC_FREE:
		if (((const struct cxl_accel_free *)s)->handle == g->spare)
			g->spare = 0;
		break;
	case CXL_ACCEL_IOC_EXPORT_DMABUF:
		close(((const struct cxl_accel_dmabuf_export *)s)->fd);
		break;
	case CXL_ACCEL_IOC_IMPORT_DMABUF:
		cxla_free(g->fd, ((const struct cxl_accel_dmabuf_import *)s)->handle);
		break;
	}
}

static int g_call(struct gctx *g, unsigned long cmd, void *arg)
{
	int r = cxla_ioctl(g->fd, cmd, arg);

	g_after(g, cmd, arg, r);
	return r;
}

static void on_tick(int sig)
{
}

/* SIGUSR1 every ms milliseconds: blocking calls get interrupted */
static int ticker(timer_t *t, long ms)
{
	struct sigaction sa = { .sa_handler = on_tick };	/* no SA_RESTART */
	struct sigevent sev = {
		.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGUSR1,
	};
	struct itimerspec its = {
		.it_interval = { 0, ms * 1000000 }, .it_value = { 0, ms * 1000000 },
	};

	if (sigaction(SIGUSR1, &sa, NULL) ||
	    timer_create(CLOCK_MONOTONIC, &sev, t))
		return -1;
	return timer_settime(*t, 0, &its, NULL);
}

/*
 * Every ioctl of the driver with bad argument pointers (NULL, kernel,
 * unmapped, straddling a hole, read-only), valid arguments at an odd
 * address, then every 32- and 64-bit field of a valid argument set to edge
 * values, then random arguments, with SIGUSR1 every 20 ms interrupting
 * whatever blocks.
 */
CXLA_TEST_F(dev, garbage_ioctl_args)
{
	static const uint32_t e32[] = {
		0, 1, 3, 4095, 4096, 0x7fffffff, 0x80000000, 0xffffffff,
	};
	uint64_t e64[] = {
		0, 1, 4095, 4097, 0xffffffffULL, 1ULL << 40, 0x7ffffffff000ULL,
		0xffff888000000000ULL, 1ULL << 63, ~0ULL, 0, 0,
	};
	const uintptr_t bad_ptrs[] = {
		0, 1, 0xffff888000000000ULL, ~0UL - 7, 0x7ffffffff000UL,
	};
	struct gctx g = { 0 };
	struct tally t = { 0 };
	uint8_t *area, *ro, *arg, *odd;
	struct cxl_accel_alloc a;
	unsigned int k, i, v;
	int nfd0, r, decoy;
	uint64_t seed = c->seed;
	long nimp0, calls = 0;
	char tb[300];
	timer_t tick;
	size_t sz;

	nfd0 = open_fds();
	g.fd = cxla_open_dev(c->path);
	CHECK(g.fd >= 0, "open");
	/* handles 1-4 are decoys that mutated FREEs may eat */
	for (decoy = 0; decoy < 4; decoy++)
		OK(cxla_alloc(g.fd, 4096, 0, &a));
	OK(cxla_alloc(g.fd, GLEN, 0, &a));
	g.h = a.handle;
	g.ram = map_anon(GLEN);
	g.snap = malloc(GLEN / PG);
	CHECK(g.ram && g.snap, "mmap");
	memset(g.ram, 0x5a, GLEN);
	g.dmabuf = cxla_export_dmabuf_fd(g.fd, g.h);
	CHECK(g.dmabuf >= 0, "export: %s", ename(-g.dmabuf));
	e64[10] = (uintptr_t)g.ram + 1;
	e64[11] = (uintptr_t)g.ram + GLEN - 8;
	/* page 0: arguments, page 1: PROT_NONE, page 2: read-only */
	area = mmap(NULL, 3 * PG, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(area != MAP_FAILED, "mmap");
	CHECK(!mprotect(area + PG, PG, PROT_NONE), "mprotect");
	ro = area + 2 * PG;
	nimp0 = cxla_sysfs_long(c->name, "dmabuf/imports");

	/* 1. bad pointers: EFAULT, whatever the number */
	for (k = 0; k < ARRAY_SIZE(known); k++) {
		for (i = 0; i < ARRAY_SIZE(bad_ptrs); i++) {
			r = cxla_ioctl(g.fd, known[k].cmd, (void *)bad_ptrs[i]);
			calls++;
			CHECK(r == -EFAULT, "%s with argument %#lx: %d (%s)",
			      known[k].name, (unsigned long)bad_ptrs[i], r,
			      r ? ename(-r) : "ok");
		}
		/* a valid argument whose end runs into an unmapped page */
		sz = _IOC_SIZE(known[k].cmd);
		arg = area + PG - sz / 2;
		g_template(&g, known[k].cmd, area);
		memmove(arg, area, sz / 2);
		r = g_call(&g, known[k].cmd, arg);
		calls++;
		CHECK(r == -EFAULT, "%s straddling a hole: %d (%s)", known[k].name,
		      r, r ? ename(-r) : "ok");
	}

	/* 2. valid arguments at an odd address work like aligned ones */
	for (k = 0; k < ARRAY_SIZE(known); k++) {
		odd = area + 1;
		g_template(&g, known[k].cmd, area + 512);
		memmove(odd, area + 512, _IOC_SIZE(known[k].cmd));
		r = g_call(&g, known[k].cmd, odd);
		calls++;
		if (known[k].cmd == CXL_ACCEL_IOC_WAIT_EVENT)
			CHECK(!r || r == -ETIMEDOUT, "WAIT_EVENT at an odd address: %d", r);
		else
			CHECK(!r, "%s with a valid argument at an odd address: %d (%s)",
			      known[k].name, r, ename(-r));
	}

	/* 3. a read-only argument: commands that only read it work, results cannot be written */
	for (k = 0; k < ARRAY_SIZE(known); k++) {
		unsigned long cmd = known[k].cmd;
		uint64_t free0 = cxla_devmem_free(g.fd);

		CHECK(!mprotect(ro, PG, PROT_READ | PROT_WRITE), "mprotect");
		g_template(&g, cmd, ro);
		CHECK(!mprotect(ro, PG, PROT_READ), "mprotect");
		r = cxla_ioctl(g.fd, cmd, ro);
		calls++;
		if (_IOC_DIR(cmd) == _IOC_WRITE) {
			CHECK(!r, "%s with a read-only argument: %d (%s)", known[k].name,
			      r, ename(-r));
			if (cmd == CXL_ACCEL_IOC_FREE)
				g.spare = 0;
		} else if (cmd == CXL_ACCEL_IOC_WAIT_EVENT) {
			CHECK(r == -EFAULT || r == -ETIMEDOUT,
			      "WAIT_EVENT with a read-only argument: %d", r);
		} else {
			CHECK(r == -EFAULT, "%s with a read-only argument: %d (%s)",
			      known[k].name, r, r ? ename(-r) : "ok");
		}
		/* what could not be reported must have been undone */
		CHECK(cmd != CXL_ACCEL_IOC_ALLOC || cxla_devmem_free(g.fd) == free0,
		      "ALLOC into a read-only argument leaked %lld bytes",
		      (long long)(free0 - cxla_devmem_free(g.fd)));
		CHECK(open_fds() == nfd0 + 2, "%s into a read-only argument left %d fds",
		      known[k].name, open_fds() - nfd0);
		CHECK(cxla_sysfs_long(c->name, "dmabuf/imports") == nimp0,
		      "%s into a read-only argument: %ld imports, was %ld", known[k].name,
		      cxla_sysfs_long(c->name, "dmabuf/imports"), nimp0);
	}

	/* 4. edge values in every field, 5. random arguments; interrupted */
	CHECK(!ticker(&tick, 20), "timer: %s", strerror(errno));
	arg = area + 8;
	for (k = 0; k < ARRAY_SIZE(known); k++) {
		unsigned long cmd = known[k].cmd;

		sz = _IOC_SIZE(cmd);
		for (i = 0; i + 4 <= sz; i += 4) {
			for (v = 0; v < ARRAY_SIZE(e32); v++) {
				g_template(&g, cmd, arg);
				memcpy(arg + i, &e32[v], 4);
				note(&t, g_call(&g, cmd, arg), E_GARBAGE,
				     "%s, u32 at %u = %#x", known[k].name, i, e32[v]);
				calls++;
			}
		}
		for (i = 0; i + 8 <= sz; i += 8) {
			for (v = 0; v < ARRAY_SIZE(e64); v++) {
				g_template(&g, cmd, arg);
				memcpy(arg + i, &e64[v], 8);
				note(&t, g_call(&g, cmd, arg), E_GARBAGE,
				     "%s, u64 at %u = %#llx", known[k].name, i,
				     (unsigned long long)e64[v]);
				calls++;
			}
		}
		for (i = 0; i < 100; i++) {
			uint64_t s0 = seed;

			fill_random(arg, sz, rnd64(&seed));
			note(&t, g_call(&g, cmd, arg), E_GARBAGE,
			     "%s, random argument (seed %#llx)", known[k].name,
			     (unsigned long long)s0);
			calls++;
		}
		memset(arg, 0, sz);
		note(&t, g_call(&g, cmd, arg), E_GARBAGE, "%s, zero argument",
		     known[k].name);
		calls++;
	}
	timer_delete(tick);
	signal(SIGUSR1, SIG_IGN);
	TALLY_OK(&t);
	/* whatever was migrated goes back; the file goes */
	cxla_migrate(g.fd, g.ram, GLEN, false, NULL);
	close(g.dmabuf);
	munmap(g.ram, GLEN);
	munmap(area, 3 * PG);
	free(g.snap);
	close(g.fd);
	CHECK(open_fds() == nfd0, "%d fds left open", open_fds() - nfd0);
	DETAIL("%ld calls of the %zu ioctls: bad pointers and holes EFAULT, odd addresses work, read-only arguments rolled back; edge values and random arguments: %s",
	       calls, ARRAY_SIZE(known), tally_str(&t, tb, sizeof(tb)));
	return PASS;
}

/* IMPORT_DMABUF of everything that is not a DMA-BUF, and of many that are */
CXLA_TEST_F(dev, garbage_import)
{
	struct cxl_accel_dmabuf_import im;
	struct cxl_accel_dmabuf_export e;
	struct cxl_accel_alloc a;
	struct cxl_accel_free f;
	int fd = cxla_open_dev(c->path), ifd = cxla_open_dev(imp_path(c));
	int p[2], sp[2], efd, mfd, ep, nul, dir, closed, hfd, dmabuf, r, i;
	struct dma_heap_allocation_data hd = { .len = 1 * MiB,
					       .fd_flags = O_RDWR | O_CLOEXEC };
	uint32_t handles[64];
	long n = 0, imp0;

	CHECK(fd >= 0 && ifd >= 0, "open");
	CHECK(!pipe2(p, O_CLOEXEC) && !socketpair(AF_UNIX, SOCK_STREAM, 0, sp),
	      "pipe");
	efd = eventfd(0, EFD_CLOEXEC);
	mfd = memfd_create("race", MFD_CLOEXEC);
	ep = epoll_create1(EPOLL_CLOEXEC);
	nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	dir = open("/sys", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	closed = open("/dev/null", O_RDONLY);
	close(closed);
	CHECK(efd >= 0 && mfd >= 0 && ep >= 0 && nul >= 0 && dir >= 0, "fds");
	CHECK(!ftruncate(mfd, 1 * MiB), "ftruncate");

	{
		const struct { const char *what; int fd; int err; } bad[] = {
			{ "-1", -1, EBADF }, { "-1000", -1000, EBADF },
			{ "INT_MAX", 0x7fffffff, EBADF }, { "closed fd", closed, EBADF },
			{ "fd 1000", 1000, EBADF }, { "stdin", 0, 0 },
			{ "stdout", 1, 0 }, { "pipe", p[0], EINVAL },
			{ "pipe write end", p[1], EINVAL }, { "socket", sp[0], EINVAL },
			{ "eventfd", efd, EINVAL }, { "memfd", mfd, EINVAL },
			{ "epoll", ep, EINVAL }, { "/dev/null", nul, EINVAL },
			{ "directory", dir, EINVAL }, { "the device itself", fd, EINVAL },
			{ "the importer itself", ifd, EINVAL },
		};

		for (i = 0; i < (int)ARRAY_SIZE(bad); i++, n++) {
			/* err 0: whatever the console is, not a DMA-BUF */
			r = cxla_import_dmabuf(ifd, bad[i].fd, &im);
			CHECK(bad[i].err ? r == -bad[i].err : r == -EBADF || r == -EINVAL,
			      "import of %s: %d (%s), expected %s", bad[i].what, r,
			      r ? ename(-r) : "ok", bad[i].err ? ename(bad[i].err) : "EBADF/EINVAL");
		}
	}
	/* reserved fields, flags */
	OK(cxla_alloc(fd, 1 * MiB, 0, &a));
	dmabuf = cxla_export_dmabuf_fd(fd, a.handle);
	CHECK(dmabuf >= 0, "export: %d", dmabuf);
	for (i = 0; i < 3; i++, n++) {
		memset(&im, 0, sizeof(im));
		im.fd = dmabuf;
		if (i == 0)
			im.flags = 1;
		else
			im.reserved[i - 1] = 1;
		EXPECT_ERR(cxla_ioctl(ifd, CXL_ACCEL_IOC_IMPORT_DMABUF, &im), EINVAL);
	}
	/* an import is not exportable, unknown imported handles are unknown */
	OK(cxla_import_dmabuf(ifd, dmabuf, &im));
	memset(&e, 0, sizeof(e));
	e.handle = im.handle;
	EXPECT_ERR(cxla_ioctl(ifd, CXL_ACCEL_IOC_EXPORT_DMABUF, &e), EINVAL);
	EXPECT_ERR(cxla_free(ifd, CXL_ACCEL_HANDLE_IMPORTED), ENOENT);
	EXPECT_ERR(cxla_free(ifd, im.handle + 1), ENOENT);
	EXPECT_ERR(cxla_free(ifd, ~0u), ENOENT);
	EXPECT_ERR(cxla_fill(ifd, cxla_dev(im.handle, 1 * MiB), 1, 0, 0), EINVAL);
	EXPECT_ERR(cxla_fill(ifd, cxla_dev(im.handle, ~0ULL), 2, 0, 0), EINVAL);
	EXPECT_ERR(cxla_fill(ifd, cxla_dev(im.handle + 1, 0), 1, 0, 0), ENOENT);
	OK(cxla_free(ifd, im.handle));
	EXPECT_ERR(cxla_free(ifd, im.handle), ENOENT);
	f.handle = im.handle;
	f.flags = 2;
	EXPECT_ERR(cxla_ioctl(ifd, CXL_ACCEL_IOC_FREE, &f), EINVAL);
	n += 11;

	/* the same DMA-BUF 64 times, and other exporters' */
	imp0 = cxla_sysfs_long(c->peer_path ? c->peer_name : c->name, "dmabuf/imports");
	for (i = 0; i < 64; i++, n++) {
		OK(cxla_import_dmabuf(ifd, dmabuf, &im));
		handles[i] = im.handle;
	}
	CHECK(cxla_sysfs_long(c->peer_path ? c->peer_name : c->name, "dmabuf/imports") ==
	      imp0 + 64, "imports %ld, expected %ld",
	      cxla_sysfs_long(c->peer_path ? c->peer_name : c->name, "dmabuf/imports"),
	      imp0 + 64);
	for (i = 0; i < 64; i += 2)
		OK(cxla_free(ifd, handles[i]));
	hfd = open("/dev/dma_heap/system", O_RDWR | O_CLOEXEC);
	if (hfd >= 0 && !ioctl(hfd, DMA_HEAP_IOCTL_ALLOC, &hd)) {
		OK(cxla_import_dmabuf(ifd, hd.fd, &im));
		CHECK(im.kind == CXL_ACCEL_IMPORT_OTHER, "heap import kind %u", im.kind);
		close(hd.fd);
		n++;
	}
	if (hfd >= 0)
		close(hfd);
	/* the rest go with the file */
	close(ifd);
	close(dmabuf);
	OK(cxla_free(fd, a.handle));
	close(fd);
	close(p[0]);
	close(p[1]);
	close(sp[0]);
	close(sp[1]);
	close(efd);
	close(mfd);
	close(ep);
	close(nul);
	close(dir);
	DETAIL("%ld imports and frees: invalid fds EBADF, non-DMA-BUF files (pipe, socket, eventfd, memfd, epoll, /dev/null, directory, the device) EINVAL, flags and reserved EINVAL, 64 imports of one DMA-BUF released with the file",
	       n);
	return PASS;
}

/* mmap with bad offsets and lengths; mremap, mprotect, madvise, fork on a mapping */
CXLA_TEST_F(dev, garbage_mmap)
{
	const size_t len = 16 * PG;
	int fd = cxla_open_dev(c->path), dmabuf, r, status, mem, i;
	struct cxl_accel_alloc a;
	uint8_t *p, *q, *m, *moved, buf[PG], byte;
	int pin_result;
	off_t off;
	long n = 0;
	pid_t pid;

	CHECK(fd >= 0, "open");
	OK(cxla_alloc(fd, len, 0, &a));
	off = a.mmap_offset;
	{
		const struct { const char *what; size_t len; off_t off; int flags; } bad[] = {
			{ "offset + 1", PG, off + 1, MAP_SHARED },
			{ "offset + 2048", PG, off + 2048, MAP_SHARED },
			{ "length 0", 0, off, MAP_SHARED },
			{ "one page too long", len + PG, off, MAP_SHARED },
			{ "past the end", PG, off + len, MAP_SHARED },
			{ "2^46 bytes", 1ULL << 46, off, MAP_SHARED },
			{ "~0 bytes", ~(size_t)0 - PG, off, MAP_SHARED },
			{ "handle above the maximum", PG, (off_t)(1ULL << 23) << 40, MAP_SHARED },
			{ "negative offset", PG, -(off_t)PG, MAP_SHARED },
			{ "handle 0", PG, 0, MAP_SHARED },
			{ "unknown handle", PG, off + (5LL << 40), MAP_SHARED },
			{ "page offset beyond any buffer", PG, off | (1LL << 38), MAP_SHARED },
			/* bit 39 is CXL_ACCEL_MMAP_REGION: bounds first */
			{ "region, past the end", PG,
			  (off + len) | CXL_ACCEL_MMAP_REGION, MAP_SHARED },
			{ "private", PG, off, MAP_PRIVATE },
			{ "hugetlb", PG, off, MAP_SHARED | MAP_HUGETLB },
		};

		for (i = 0; i < (int)ARRAY_SIZE(bad); i++, n++) {
			p = mmap(NULL, bad[i].len, PROT_READ | PROT_WRITE, bad[i].flags,
				 fd, bad[i].off);
			CHECK(p == MAP_FAILED, "mmap %s succeeded", bad[i].what);
			CHECK(errno == EINVAL || errno == ENOENT || errno == ENOMEM ||
			      errno == EOVERFLOW,
			      "mmap %s: %s", bad[i].what, ename(errno));
		}
	}
	/* harmless flags work */
	p = mmap(NULL, len, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_SHARED | MAP_POPULATE,
		 fd, off);
	CHECK(p != MAP_FAILED, "mmap exec/populate: %s", ename(errno));
	for (i = 0; i < 16; i++)
		memset(p + i * PG, i + 1, PG);
	q = mmap(NULL, PG, PROT_NONE, MAP_SHARED, fd, off + 3 * PG);
	CHECK(q != MAP_FAILED, "mmap PROT_NONE: %s", ename(errno));
	CHECK(cxla_probe_read(q, &byte, NULL) == SIGSEGV, "PROT_NONE mapping readable");
	CHECK(!mprotect(q, PG, PROT_READ), "mprotect up");
	CHECK(!cxla_probe_read(q, &byte, NULL) && byte == 4, "window reads %d, expected 4", byte);
	munmap(q, PG);
	/* mremap: cannot grow, can move */
	q = mremap(p, len, 2 * len, MREMAP_MAYMOVE);
	CHECK(q == MAP_FAILED, "mremap grew a device mapping");
	q = mremap(p + 4 * PG, 4 * PG, 4 * PG, MREMAP_MAYMOVE | MREMAP_FIXED,
		   map_anon(4 * PG));
	CHECK(q != MAP_FAILED, "mremap move: %s", ename(errno));
	moved = q;
	CHECK(cxla_all_bytes(q, PG, 5) && cxla_all_bytes(q + 3 * PG, PG, 8), "data moved wrong");
	CHECK(cxla_probe_read(p + 4 * PG, &byte, NULL) == SIGSEGV,
	      "old place of a moved piece readable");
	/* madvise: whatever is accepted, the data stays */
	{
		static const int advs[] = {
			MADV_DONTNEED, MADV_FREE, MADV_REMOVE, MADV_PAGEOUT, MADV_COLD,
			MADV_WILLNEED, MADV_SEQUENTIAL, MADV_DONTFORK, MADV_DOFORK,
			MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_MERGEABLE, MADV_DONTDUMP,
			MADV_POPULATE_READ, MADV_POPULATE_WRITE, MADV_COLLAPSE,
			MADV_WIPEONFORK, MADV_KEEPONFORK,
		};

		for (i = 0; i < (int)ARRAY_SIZE(advs); i++, n++) {
			/* MADV_REMOVE: ENODEV, as on any character device */
			r = madvise(p, 4 * PG, advs[i]) ? errno : 0;
			CHECK(!r || r == EINVAL || r == EPERM || r == EAGAIN ||
			      r == ENOMEM || r == EFAULT || r == EBUSY ||
			      (r == ENODEV && advs[i] == MADV_REMOVE),
			      "madvise %d: %s", advs[i], ename(r));
			CHECK(cxla_all_bytes(p, PG, 1) && cxla_all_bytes(p + 3 * PG, PG, 4),
			      "data changed by madvise %d", advs[i]);
		}
		r = mlock(p, 4 * PG);
		munlock(p, 4 * PG);
		CHECK(cxla_all_bytes(p + PG, PG, 2), "data changed by mlock");
	}
	/* the mapping as the operand of the migration and SVM ioctls */
	{
		struct cxl_accel_pin_checksum pc = {
			.addr = (uintptr_t)p + 10, .len = 3 * PG,
		};
		struct cxl_accel_migrate mg;
		uint8_t fl[4];
		struct cxl_accel_snapshot sn = {
			.addr = (uintptr_t)p, .len = 4 * PG, .flags_ptr = (uintptr_t)fl,
		};
		uint64_t v = 0;

		OK(cxla_migrate(fd, p, 4 * PG, true, &mg));
		CHECK(mg.refused == 4 && !mg.migrated, "MIGRATE_TO_DEV of a device mapping: %llu refused, %llu migrated",
		      (unsigned long long)mg.refused, (unsigned long long)mg.migrated);
		OK(cxla_migrate(fd, p, 4 * PG, false, &mg));
		CHECK(!mg.migrated, "MIGRATE_TO_RAM moved %llu pages of a device buffer",
		      (unsigned long long)mg.migrated);
		OK(cxla_ioctl(fd, CXL_ACCEL_IOC_SNAPSHOT, &sn));
		for (i = 0; i < 4; i++)
			CHECK((fl[i] & (CXL_ACCEL_SNAP_PRESENT | CXL_ACCEL_SNAP_LOCAL)) ==
			      (CXL_ACCEL_SNAP_PRESENT | CXL_ACCEL_SNAP_LOCAL),
			      "SNAPSHOT of a device mapping, page %d: %#x", i, fl[i]);
		OK(cxla_svm(fd, CXL_ACCEL_SVM_CHECKSUM, p + 5, 3 * PG, 0, 0, &v, NULL));
		CHECK((uint32_t)v == crc32c(0, p + 5, 3 * PG), "SVM CHECKSUM of a device mapping");
		/* a long-term pin cannot move buffer pages out: refused or right */
		r = cxla_ioctl(fd, CXL_ACCEL_IOC_PIN_CHECKSUM, &pc);
		CHECK(r == -EBUSY || r == -EFAULT || r == -ENOMEM || r == -EINVAL ||
		      (!r && pc.crc == crc32c(0, p + 10, 3 * PG) && !pc.on_device),
		      "PIN_CHECKSUM of a device mapping: %d (%s), on device %llu",
		      r, r ? ename(-r) : "ok", (unsigned long long)pc.on_device);
		CHECK(cxla_all_bytes(p, PG, 1) && cxla_all_bytes(p + 3 * PG, PG, 4),
		      "data changed by the HMM ioctls");
		n += 6;
		pin_result = r;
	}
	/* mprotect: read-only is read-only for the device too */
	CHECK(!mprotect(p, 4 * PG, PROT_READ), "mprotect");
	EXPECT_ERR(cxla_fill(fd, cxla_user(p), 100, 0, 0), EFAULT);
	OK(cxla_copy(fd, cxla_user(p), cxla_user(buf), PG, 0));
	CHECK(cxla_all_bytes(buf, PG, 1), "copy from a read-only device mapping");
	CHECK(!mprotect(p, 4 * PG, PROT_READ | PROT_WRITE), "mprotect back");
	/* split by a hole */
	CHECK(!munmap(p + 9 * PG, PG), "munmap a page");
	CHECK(cxla_all_bytes(p + 8 * PG, PG, 9) && cxla_all_bytes(p + 10 * PG, PG, 11),
	      "data around the hole");
	EXPECT_ERR(cxla_fill(fd, cxla_user(p + 8 * PG), 3 * PG, 0, 0), EFAULT);
	/* other ways to read a mapping: /proc/self/mem, process_vm_readv */
	mem = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
	CHECK(mem >= 0, "/proc/self/mem");
	r = pread(mem, buf, PG, (off_t)(uintptr_t)(p + 2 * PG));
	CHECK(r == (int)PG && cxla_all_bytes(buf, PG, 3), "/proc/self/mem read: %d", r);
	close(mem);
	{
		struct iovec l = { buf, PG }, rv = { p + 10 * PG, PG };

		r = process_vm_readv(getpid(), &l, 1, &rv, 1, 0);
		CHECK(r == (int)PG && cxla_all_bytes(buf, PG, 11), "process_vm_readv: %d", r);
	}
	/* fork shares the mapping */
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (!pid) {
		if (!cxla_all_bytes(p + 10 * PG, PG, 11))
			_exit(1);
		p[10 * PG] = 0x77;
		_exit(0);
	}
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "child: %#x", status);
	CHECK(p[10 * PG] == 0x77, "the child's write is not shared");
	/* file operations the device has none of */
	CHECK(read(fd, buf, 16) < 0 && errno == EINVAL, "read: %s", ename(errno));
	CHECK(write(fd, buf, 16) < 0 && errno == EINVAL, "write: %s", ename(errno));
	CHECK(ftruncate(fd, 0) < 0, "ftruncate worked");
	/* FREE while mapped, then the DMA-BUF fd's own mmap */
	dmabuf = cxla_export_dmabuf_fd(fd, a.handle);
	CHECK(dmabuf >= 0, "export");
	OK(cxla_free(fd, a.handle));
	CHECK(p[0] == 1, "mapping after FREE");
	{
		const struct { const char *what; size_t len; off_t off; int flags; } bad[] = {
			{ "offset + 1", PG, 1, MAP_SHARED },
			{ "past the end", PG, len, MAP_SHARED },
			{ "too long", len + PG, 0, MAP_SHARED },
			{ "private", PG, 0, MAP_PRIVATE },
			{ "negative", PG, -(off_t)PG, MAP_SHARED },
		};

		for (i = 0; i < (int)ARRAY_SIZE(bad); i++, n++) {
			q = mmap(NULL, bad[i].len, PROT_READ, bad[i].flags, dmabuf,
				 bad[i].off);
			CHECK(q == MAP_FAILED && (errno == EINVAL || errno == EOVERFLOW),
			      "DMA-BUF mmap %s: %s", bad[i].what,
			      q == MAP_FAILED ? ename(errno) : "mapped");
		}
	}
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, dmabuf, 0);
	CHECK(m != MAP_FAILED, "DMA-BUF mmap: %s", ename(errno));
	CHECK(cxla_all_bytes(m + 8 * PG, PG, 9), "DMA-BUF mapping sees other data");
	{
		struct dma_buf_sync s = { .flags = 0x1234 };

		CHECK(ioctl(dmabuf, DMA_BUF_IOCTL_SYNC, &s) < 0 && errno == EINVAL,
		      "SYNC with bad flags");
		CHECK(ioctl(dmabuf, _IOWR('b', 0x7f, int), &s) < 0, "unknown DMA-BUF ioctl");
		CHECK(lseek(dmabuf, 0, SEEK_END) == (off_t)len, "DMA-BUF size");
	}
	close(dmabuf);
	CHECK(m[PG] == 2, "DMA-BUF mapping after close of the fd");
	munmap(m, len);
	munmap(p, len);
	munmap(moved, 4 * PG);
	close(fd);
	DETAIL("%ld bad mmaps/madvises of the device and a DMA-BUF refused or harmless; migration refused, SNAPSHOT/SVM right, PIN_CHECKSUM %s on a device mapping; mremap move, PROT_NONE, read-only (device FILL EFAULT), holes, /proc/self/mem, process_vm_readv, fork, FREE while mapped: data right",
	       n, pin_result ? ename(-pin_result) : "ok");
	return PASS;
}

/* ---------------------------------------------- handles freed while made */

struct hrace {
	int fd;
	unsigned long cmd;
	void *arg;		/* read-only: the result cannot be written back */
	uint32_t victim;	/* the handle the new object gets */
	volatile int stop;
	long tries, stolen;
	struct tally t;
};

static void *hrace_maker(void *arg)
{
	static const int allowed[] = { EFAULT, 0 };
	struct hrace *h = arg;

	while (!h->stop) {
		note(&h->t, cxla_ioctl(h->fd, h->cmd, h->arg), allowed,
		     "%s into a read-only argument",
		     h->cmd == CXL_ACCEL_IOC_ALLOC ? "ALLOC" : "IMPORT");
		h->tries++;
	}
	return NULL;
}

static void *hrace_stealer(void *arg)
{
	static const int allowed[] = { ENOENT, 0 };
	struct hrace *h = arg;
	int r;

	while (!h->stop) {
		r = cxla_free(h->fd, h->victim);
		note(&h->t, r, allowed, "FREE of the handle being made");
		h->stolen += !r;
	}
	return NULL;
}

struct uffd_call {
	int fd;
	unsigned long cmd;
	void *arg;
	int ret;
};

static void *uffd_caller(void *arg)
{
	struct uffd_call *x = arg;

	x->ret = cxla_ioctl(x->fd, x->cmd, x->arg);
	return NULL;
}

/*
 * The call (ALLOC or IMPORT_DMABUF into a fresh file: its object gets
 * handle victim) stops where it writes its result back, on a page that a
 * userfaultfd write-protects; meanwhile the handle is FREEd, the page made
 * read-only and the call let go: the write-back fails, the call undoes
 * what it made, after someone else already released it. 0 or -1 (detail).
 */
static int freed_while_reporting(FIXTURE_DATA(dev) *c, int fd, unsigned long cmd,
				 const void *arg, size_t len, uint32_t victim)
{
	struct uffdio_api api = {
		.api = UFFD_API, .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP,
	};
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_WP };
	struct uffdio_writeprotect wp = { .mode = UFFDIO_WRITEPROTECT_MODE_WP };
	struct uffd_call x = { .fd = fd, .cmd = cmd };
	struct uffd_msg msg;
	struct pollfd pfd;
	uint8_t *page;
	pthread_t th;
	int uffd, r;

	page = map_anon(PG);
	if (!page)
		return DETAIL("mmap"), -1;
	memcpy(page, arg, len);
	x.arg = page;
	reg.range.start = wp.range.start = (uintptr_t)page;
	reg.range.len = wp.range.len = PG;
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) ||
	    ioctl(uffd, UFFDIO_REGISTER, &reg) ||
	    ioctl(uffd, UFFDIO_WRITEPROTECT, &wp))
		return DETAIL("userfaultfd write-protect: %s", strerror(errno)), -1;
	if (pthread_create(&th, NULL, uffd_caller, &x))
		return DETAIL("thread"), -1;
	pfd = (struct pollfd){ .fd = uffd, .events = POLLIN };
	r = poll(&pfd, 1, 5000) == 1 && read(uffd, &msg, sizeof(msg)) == sizeof(msg);
	if (r && (msg.event != UFFD_EVENT_PAGEFAULT ||
		  !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)))
		r = 0;
	/* the call is stopped in its write-back: its handle goes */
	if (r)
		r = cxla_free(fd, victim) ? -2 : 1;
	mprotect(page, PG, PROT_READ);
	close(uffd);			/* lets the write fault fail */
	pthread_join(th, NULL);
	munmap(page, PG);
	if (r == 0)
		return DETAIL("%#lx never wrote its result back (%d)", cmd, x.ret), -1;
	if (r == -2)
		return DETAIL("%#lx: FREE of handle %#x while it was reported failed",
			      cmd, victim), -1;
	if (x.ret != -EFAULT)
		return DETAIL("%#lx whose result could not be written: %d", cmd, x.ret), -1;
	return 0;
}

/*
 * ALLOC and IMPORT_DMABUF whose result cannot be written back undo what
 * they made, and the handle they made may have been FREEd by another thread
 * in between (the lowest free handle, easy to guess): each object must be
 * released once, nothing else. First deterministically (userfaultfd), then
 * as a plain race of two threads for a second.
 */
CXLA_TEST_F(dev, handle_free_race)
{
	struct cxl_accel_dmabuf_import im = { 0 };
	struct cxl_accel_alloc a = { .size = 4096 };
	struct hrace h[2];
	pthread_t tm, ts;
	uint8_t *ro;
	uint32_t xh;
	int fd = cxla_open_dev(c->path), ifd, dmabuf, k;
	char tb[200], tb2[200];

	CHECK(fd >= 0, "open");
	OK(cxla_alloc(fd, 1 * MiB, 0, &a));
	xh = a.handle;
	dmabuf = cxla_export_dmabuf_fd(fd, xh);
	CHECK(dmabuf >= 0, "export");
	im.fd = dmabuf;
	a = (struct cxl_accel_alloc){ .size = 4096 };
	for (k = 0; k < 10; k++) {
		ifd = cxla_open_dev(imp_path(c));	/* no handles: the next one is 1 */
		CHECK(ifd >= 0, "open");
		if (k % 2 ? freed_while_reporting(c, ifd, CXL_ACCEL_IOC_IMPORT_DMABUF,
						  &im, sizeof(im),
						  1 | CXL_ACCEL_HANDLE_IMPORTED) :
			    freed_while_reporting(c, ifd, CXL_ACCEL_IOC_ALLOC, &a,
						  sizeof(a), 1))
			return FAIL;
		close(ifd);
	}

	ifd = cxla_open_dev(imp_path(c));
	CHECK(ifd >= 0, "open");
	ro = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(ro != MAP_FAILED, "mmap");
	memcpy(ro, &a, sizeof(a));
	memcpy(ro + 512, &im, sizeof(im));
	CHECK(!mprotect(ro, PG, PROT_READ), "mprotect");
	memset(h, 0, sizeof(h));
	h[0].fd = ifd;		/* no buffer there: new ones get handle 1 */
	h[0].cmd = CXL_ACCEL_IOC_ALLOC;
	h[0].arg = ro;
	h[0].victim = 1;
	h[1].fd = ifd;
	h[1].cmd = CXL_ACCEL_IOC_IMPORT_DMABUF;
	h[1].arg = ro + 512;
	h[1].victim = 1 | CXL_ACCEL_HANDLE_IMPORTED;
	for (k = 0; k < 2; k++) {
		double until = now_sec() + 0.5;

		CHECK(!pthread_create(&tm, NULL, hrace_maker, &h[k]) &&
		      !pthread_create(&ts, NULL, hrace_stealer, &h[k]), "threads");
		while (now_sec() < until)
			msleep_(50);
		h[k].stop = 1;
		pthread_join(tm, NULL);
		pthread_join(ts, NULL);
		TALLY_OK(&h[k].t);
	}
	munmap(ro, PG);
	close(dmabuf);
	OK(cxla_free(fd, xh));
	close(ifd);
	close(fd);
	DETAIL("5 ALLOCs and 5 IMPORTs stopped in their write-back (userfaultfd) while their handle was freed, then failing it: EFAULT, released once; racing threads, 0.5 s each: %ld ALLOCs, %ld handles freed before undone (%s); %ld IMPORTs, %ld freed (%s)",
	       h[0].tries, h[0].stolen, tally_str(&h[0].t, tb, sizeof(tb)),
	       h[1].tries, h[1].stolen, tally_str(&h[1].t, tb2, sizeof(tb2)));
	return PASS;
}

/* -------------------------------------------------- free while DMA runs */

enum { FD_FREE, FD_CLOSE, FD_MUNMAP_DEV, FD_MUNMAP_RAM, FD_MODES };
static const char * const fd_mode_name[] = { "FREE", "close", "munmap device", "munmap RAM" };

struct dma_worker {
	int fd;
	uint32_t h;
	uint8_t *ram, *ram2, *map;
	size_t len;
	int mode;
	volatile int stop;
	volatile int acted;
	int in_call;
	long calls, after;	/* after: calls begun after the action */
	struct tally t;
};

static int dma_call(struct dma_worker *w, int i)
{
	int r;

	__atomic_store_n(&w->in_call, 1, __ATOMIC_SEQ_CST);
	switch (w->mode) {
	case FD_MUNMAP_DEV:
		r = i % 2 ? cxla_copy(w->fd, cxla_user(w->ram), cxla_user(w->map), w->len, 0) :
			    cxla_copy(w->fd, cxla_user(w->map), cxla_user(w->ram2), w->len, 0);
		break;
	case FD_MUNMAP_RAM:
		r = i % 2 ? cxla_copy(w->fd, cxla_dev(w->h, 0), cxla_user(w->ram), w->len, 0) :
			    cxla_fill(w->fd, cxla_user(w->ram), w->len, i, 0);
		break;
	default:
		r = i % 3 == 0 ? cxla_copy(w->fd, cxla_user(w->ram), cxla_dev(w->h, 0), w->len, 0) :
		    i % 3 == 1 ? cxla_copy(w->fd, cxla_dev(w->h, 0), cxla_user(w->ram2), w->len, 0) :
				 cxla_fill(w->fd, cxla_dev(w->h, 0), w->len, i, 0);
		break;
	}
	__atomic_store_n(&w->in_call, 0, __ATOMIC_SEQ_CST);
	return r;
}

static void *dma_thread(void *arg)
{
	static const int allowed[] = { ENOENT, EBADF, EFAULT, 0 };
	struct dma_worker *w = arg;
	int i = 0;

	while (!w->stop) {
		int acted = w->acted;

		note(&w->t, dma_call(w, i), allowed, "%s mode, call %d",
		     fd_mode_name[w->mode], i);
		w->calls++;
		w->after += acted;
		i++;
	}
	return NULL;
}

/*
 * Large COPY/FILL on a buffer while another thread FREEs it, closes the
 * file, munmaps the device mapping used as user memory, or munmaps the
 * system RAM the device writes into.
 */
CXLA_TEST_F(dev, free_during_dma)
{
	const size_t len = 8 * MiB;
	uint8_t *ram = malloc(len), *ram2 = malloc(len);
	struct tally t = { 0 };
	int hits[FD_MODES] = { 0 }, round, mode;
	uint64_t seed = c->seed;
	char tb[200];
	long calls = 0;

	CHECK(ram && ram2, "malloc");
	fill_random(ram, len, seed);
	for (round = 0; round < 5 * FD_MODES; round++) {
		struct dma_worker w = { .len = len, .mode = round % FD_MODES };
		struct cxl_accel_alloc a;
		pthread_t th;
		int in, k;

		mode = w.mode;
		w.fd = cxla_open_dev(c->path);
		CHECK(w.fd >= 0, "open");
		OK(cxla_alloc(w.fd, len, 0, &a));
		w.h = a.handle;
		w.ram = ram;
		w.ram2 = ram2;
		if (mode == FD_MUNMAP_DEV) {
			w.map = cxla_map(w.fd, &a);
			CHECK(w.map, "mmap");
		}
		if (mode == FD_MUNMAP_RAM) {
			w.ram = map_anon(len);
			CHECK(w.ram, "mmap");
		}
		/* first a checked round trip */
		OK(cxla_copy(w.fd, cxla_user(ram), cxla_dev(w.h, 0), len, 0));
		memset(ram2, 0, len);
		OK(cxla_copy(w.fd, cxla_dev(w.h, 0), cxla_user(ram2), len, 0));
		CHECK(!memcmp(ram, ram2, len), "round %d: round trip differs", round);

		CHECK(!pthread_create(&th, NULL, dma_thread, &w), "thread");
		msleep_(1 + rnd32(&seed) % 10);
		wait_flag(&w.in_call, 500);	/* strike while a command runs */
		in = __atomic_load_n(&w.in_call, __ATOMIC_SEQ_CST);
		switch (mode) {
		case FD_FREE:
			OK(cxla_free(w.fd, w.h));
			break;
		case FD_CLOSE:
			CHECK(!close(w.fd), "close");
			break;
		case FD_MUNMAP_DEV:
			CHECK(!munmap(w.map, len), "munmap");
			break;
		case FD_MUNMAP_RAM:
			CHECK(!munmap(w.ram, len), "munmap");
			break;
		}
		hits[mode] += in;
		w.acted = 1;
		for (k = 0; k < 2000 && w.after < 3; k++)
			usleep(1000);
		w.stop = 1;
		pthread_join(th, NULL);
		tally_add(&t, &w.t);
		calls += w.calls;
		/* after the action, the calls that need what went fail */
		if (mode == FD_FREE)
			EXPECT_ERR(cxla_fill(w.fd, cxla_dev(w.h, 0), 8, 0, 0), ENOENT);
		if (mode == FD_MUNMAP_DEV || mode == FD_MUNMAP_RAM)
			EXPECT_ERR(cxla_fill(w.fd, cxla_user(mode == FD_MUNMAP_DEV ?
							   w.map : w.ram), 8, 0, 0),
				   EFAULT);
		if (mode != FD_CLOSE) {
			if (mode != FD_FREE)
				OK(cxla_free(w.fd, w.h));
			close(w.fd);
		}
	}
	TALLY_OK(&t);
	for (mode = 0; mode < FD_MODES; mode++)
		CHECK(hits[mode], "%s never happened while a command was in flight (%s)",
		      fd_mode_name[mode], tally_str(&t, tb, sizeof(tb)));
	free(ram);
	free(ram2);
	DETAIL("20 rounds of 8 MiB COPY/FILL loops; %d FREEs, %d closes, %d device munmaps, %d RAM munmaps with a command in flight; %ld calls: %s",
	       hits[FD_FREE], hits[FD_CLOSE], hits[FD_MUNMAP_DEV], hits[FD_MUNMAP_RAM],
	       calls, tally_str(&t, tb, sizeof(tb)));
	return PASS;
}

/* ----------------------------------------------- close while waiting */

enum { W_EVENT, W_POLL, W_EPOLL };

struct waiter {
	pid_t tid;
	int kind;
	int fd;			/* device file, or epoll */
	int ret;
	short revents;
	struct cxl_accel_wait_event w;
	double secs;
};

static void *wait_thread(void *arg)
{
	struct waiter *x = arg;
	double t0 = now_sec();

	__atomic_store_n(&x->tid, gettid(), __ATOMIC_SEQ_CST);
	switch (x->kind) {
	case W_EVENT:
		/* the next SIGNAL event of the file, whichever */
		memset(&x->w, 0, sizeof(x->w));
		x->w.type = CXL_ACCEL_EVENT_SIGNAL;
		x->w.timeout_ms = 5000;
		x->ret = cxla_ioctl(x->fd, CXL_ACCEL_IOC_WAIT_EVENT, &x->w);
		break;
	case W_POLL: {
		struct pollfd p = { .fd = x->fd, .events = POLLIN };

		x->ret = poll(&p, 1, 5000);
		x->revents = p.revents;
		break;
	}
	default: {
		struct epoll_event ev;

		x->ret = epoll_wait(x->fd, &ev, 1, 1000);
		break;
	}
	}
	x->secs = now_sec() - t0;
	return NULL;
}

/* a file with a buffer, to see when it is released */
static int open_with_buffer(FIXTURE_DATA(dev) *c, uint64_t *free_before)
{
	struct cxl_accel_alloc a;
	int fd;

	*free_before = cxla_devmem_free(c->fd);
	fd = cxla_open_dev(c->path);
	if (fd >= 0 && cxla_alloc(fd, 1 * MiB, 0, &a)) {
		close(fd);
		return -1;
	}
	return fd;
}

static bool released(FIXTURE_DATA(dev) *c, uint64_t free_before)
{
	int i;

	for (i = 0; i < 100; i++) {
		if (cxla_devmem_free(c->fd) == free_before)
			return true;
		usleep(20000);
	}
	return false;
}

/*
 * A thread blocked in WAIT_EVENT, poll or epoll_wait on a file that another
 * thread closes; then a process exits with a thread blocked in WAIT_EVENT.
 */
CXLA_TEST_F(dev, close_while_waiting)
{
	struct waiter x[4];
	pthread_t th[4];
	uint64_t free0;
	int fd, ep, i, status;
	struct epoll_event ev = { .events = EPOLLIN };
	double t0;
	pid_t pid;

	/*
	 * WAIT_EVENT: the waiting call keeps the file; it still gets the
	 * event. (Waiters of one file share its events: each takes one.)
	 */
	fd = open_with_buffer(c, &free0);
	CHECK(fd >= 0, "open");
	for (i = 0; i < 3; i++) {
		x[i] = (struct waiter){ .kind = W_EVENT, .fd = fd };
		CHECK(!pthread_create(&th[i], NULL, wait_thread, &x[i]), "thread");
	}
	x[3] = (struct waiter){ .kind = W_POLL, .fd = fd };
	CHECK(!pthread_create(&th[3], NULL, wait_thread, &x[3]), "thread");
	for (i = 0; i < 4; i++) {
		while (!__atomic_load_n(&x[i].tid, __ATOMIC_SEQ_CST))
			usleep(1000);
		CHECK(in_syscall(x[i].tid, i < 3 ? SYS_ioctl : SYS_poll),
		      "waiter %d never blocked", i);
	}
	CHECK(!close(fd), "close");
	msleep_(20);
	for (i = 0; i < 3; i++)
		OK(signal_dev(c->fd, 0xc105e + i));
	for (i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	for (i = 0; i < 3; i++) {
		uint64_t v = x[i].w.event.value0;

		CHECK(!x[i].ret && v >= 0xc105e && v < 0xc105e + 3 &&
		      (i == 0 || v != x[0].w.event.value0) &&
		      (i < 2 || v != x[1].w.event.value0),
		      "WAIT_EVENT %d on a closed file: %d (%s), value %#llx, after %.2f s",
		      i, x[i].ret, x[i].ret ? ename(-x[i].ret) : "ok",
		      (unsigned long long)v, x[i].secs);
		CHECK(x[i].secs < 4, "WAIT_EVENT returned after %.2f s", x[i].secs);
	}
	CHECK(x[3].ret == 1 && (x[3].revents & (POLLNVAL | POLLIN)) && x[3].secs < 4,
	      "poll on a closed file: %d revents %#x after %.2f s", x[3].ret,
	      x[3].revents, x[3].secs);
	CHECK(released(c, free0), "file not released after its waiters returned");

	/* epoll: closing the file removes it, nothing reported, nothing leaked */
	fd = open_with_buffer(c, &free0);
	ep = epoll_create1(EPOLL_CLOEXEC);
	CHECK(fd >= 0 && ep >= 0, "open");
	CHECK(!epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev), "epoll_ctl");
	x[0] = (struct waiter){ .kind = W_EPOLL, .fd = ep };
	CHECK(!pthread_create(&th[0], NULL, wait_thread, &x[0]), "thread");
	while (!__atomic_load_n(&x[0].tid, __ATOMIC_SEQ_CST))
		usleep(1000);
	CHECK(in_syscall(x[0].tid, SYS_epoll_wait), "epoll waiter never blocked");
	CHECK(!close(fd), "close");
	CHECK(released(c, free0), "file not released while an epoll waits on it");
	OK(signal_dev(c->fd, 1));
	pthread_join(th[0], NULL);
	CHECK(x[0].ret == 0, "epoll_wait reported %d events of a closed file", x[0].ret);
	close(ep);

	/* exit while a thread is blocked in WAIT_EVENT (5 s) */
	t0 = now_sec();
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (!pid) {
		struct waiter y = { .kind = W_EVENT };
		pthread_t t;

		y.fd = cxla_open_dev(c->path);
		if (y.fd < 0 || pthread_create(&t, NULL, wait_thread, &y))
			_exit(2);
		msleep_(50);
		_exit(0);
	}
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "child %#x", status);
	CHECK(now_sec() - t0 < 3, "exit with a waiting thread took %.2f s", now_sec() - t0);
	DETAIL("3 WAIT_EVENTs and a poll on a file closed under them got their events (then the file went), epoll on a closed file silent, exit with a thread in WAIT_EVENT took %.2f s",
	       now_sec() - t0);
	return PASS;
}

struct storm_poster {
	int fd;
	int n;
	struct tally t;
};

static void *event_poster(void *arg)
{
	struct storm_poster *x = arg;
	int i;

	for (i = 0; i < x->n; i++)
		note(&x->t, signal_dev(x->fd, i), NULL, "SIGNAL %d", i);
	return NULL;
}

struct storm_taker {
	int fd;
	volatile int stop;
	long got, lost;
	struct tally t;
};

static void *event_taker(void *arg)
{
	static const int allowed[] = { ETIMEDOUT, EAGAIN, 0 };
	struct storm_taker *x = arg;
	struct cxl_accel_wait_event w;
	int r;

	for (;;) {
		memset(&w, 0, sizeof(w));
		w.type = CXL_ACCEL_EVENT_SIGNAL;
		w.timeout_ms = x->stop ? 0 : 200;	/* at the end: drain */
		r = cxla_ioctl(x->fd, CXL_ACCEL_IOC_WAIT_EVENT, &w);
		note(&x->t, r, allowed, "WAIT_EVENT");
		if (!r) {
			x->got++;
			x->lost += w.lost;
		} else if (x->stop && r == -EAGAIN) {
			break;
		}
	}
	return NULL;
}

#define EVENT_RING	256	/* events the driver remembers per device */

/*
 * Four threads post 150 SIGNALs each while two threads take the events of
 * one file; every event is received once, or reported lost (the takers
 * fell more than the ring behind), or counted as dropped by the device.
 * Another file is read only afterwards: it has exactly the last ring full,
 * the rest reported lost, and poll says so.
 */
CXLA_TEST_F(dev, event_storm)
{
	struct storm_poster p[4];
	struct storm_taker t[2];
	struct cxl_accel_stats s0, s1;
	struct tally all = { 0 };
	pthread_t tp[4], tt[2];
	int fd = cxla_open_dev(c->path), pfd = cxla_open_dev(c->path), k;
	long got = 0, lost = 0, dropped, posted = 0, late_got = 0, late_lost = 0;
	struct pollfd pl = { .fd = pfd, .events = POLLIN };
	char tb[200];

	CHECK(fd >= 0 && pfd >= 0, "open");
	OK(cxla_stats(c->fd, &s0));
	for (k = 0; k < 2; k++) {
		t[k] = (struct storm_taker){ .fd = fd };
		CHECK(!pthread_create(&tt[k], NULL, event_taker, &t[k]), "thread");
	}
	for (k = 0; k < 4; k++) {
		p[k] = (struct storm_poster){ .fd = cxla_open_dev(c->path), .n = 150 };
		CHECK(p[k].fd >= 0, "open");
		CHECK(!pthread_create(&tp[k], NULL, event_poster, &p[k]), "thread");
	}
	for (k = 0; k < 4; k++) {
		pthread_join(tp[k], NULL);
		tally_add(&all, &p[k].t);
		posted += p[k].t.n[0];
		close(p[k].fd);
	}
	msleep_(300);		/* the last events arrive */
	for (k = 0; k < 2; k++) {
		t[k].stop = 1;
		pthread_join(tt[k], NULL);
		tally_add(&all, &t[k].t);
		got += t[k].got;
		lost += t[k].lost;
	}
	TALLY_OK(&all);
	OK(cxla_stats(c->fd, &s1));
	dropped = s1.device[CXL_ACCEL_STAT_EVENTS_DROPPED] -
		  s0.device[CXL_ACCEL_STAT_EVENTS_DROPPED];
	CHECK(posted == 600, "%ld SIGNALs worked", posted);
	CHECK(got + lost + dropped == posted,
	      "%ld events received + %ld lost + %ld dropped by the device != %ld posted",
	      got, lost, dropped, posted);
	CHECK(got > 0, "no event received");

	/* the file read late */
	CHECK(poll(&pl, 1, 0) == 1 && (pl.revents & POLLIN), "poll: no event pending");
	for (;;) {
		struct cxl_accel_wait_event w = { .timeout_ms = 0 };
		int r = cxla_ioctl(pfd, CXL_ACCEL_IOC_WAIT_EVENT, &w);

		if (r == -EAGAIN)
			break;
		OK(r);
		late_got++;
		late_lost += w.lost;
	}
	CHECK(poll(&pl, 1, 0) == 0, "poll: events pending after all were taken");
	CHECK(late_got == (posted - dropped < EVENT_RING ? posted - dropped : EVENT_RING) &&
	      late_got + late_lost + dropped == posted,
	      "file read late: %ld events, %ld lost, %ld dropped by the device, %ld posted",
	      late_got, late_lost, dropped, posted);
	close(fd);
	close(pfd);
	DETAIL("600 SIGNALs from 4 threads: %ld received by 2 waiters of one file, %ld reported lost, %ld dropped by the device; a file read afterwards: the last %ld, %ld reported lost (%s)",
	       got, lost, dropped, late_got, late_lost, tally_str(&all, tb, sizeof(tb)));
	return PASS;
}

/* an io_uring with a registered buffer, closed: leaves task work behind */
static int uring_churn(void *buf, size_t len, bool unregister)
{
	struct io_uring_params prm = { 0 };
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	int ring = syscall(__NR_io_uring_setup, 4, &prm);

	if (ring < 0)
		return -errno;
	if (syscall(__NR_io_uring_register, ring, IORING_REGISTER_BUFFERS, &iov, 1)) {
		close(ring);
		return -errno;
	}
	if (unregister)
		syscall(__NR_io_uring_register, ring, IORING_UNREGISTER_BUFFERS, NULL, 0);
	return close(ring) ? -errno : 0;
}

/*
 * One IORING_OP_TIMEOUT in flight: when it fires, its completion is task
 * work queued to this thread with TWA_SIGNAL (TIF_NOTIFY_SIGNAL, no signal).
 * The ring's fd (the process's exit closes it), or -errno.
 */
static int uring_timeout(struct __kernel_timespec *ts)
{
	struct io_uring_params prm = { 0 };
	struct io_uring_sqe *sqe;
	uint32_t *tail, *mask, *array;
	void *sq, *sqes;
	int ring = syscall(__NR_io_uring_setup, 1, &prm), r;

	if (ring < 0)
		return -errno;
	sq = mmap(NULL, prm.sq_off.array + prm.sq_entries * sizeof(uint32_t),
		  PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring,
		  IORING_OFF_SQ_RING);
	sqes = mmap(NULL, prm.sq_entries * sizeof(*sqe), PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQES);
	if (sq == MAP_FAILED || sqes == MAP_FAILED) {
		close(ring);
		return -ENOMEM;
	}
	sqe = sqes;
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = IORING_OP_TIMEOUT;
	sqe->addr = (uintptr_t)ts;
	sqe->len = 1;
	tail = (uint32_t *)((char *)sq + prm.sq_off.tail);
	mask = (uint32_t *)((char *)sq + prm.sq_off.ring_mask);
	array = (uint32_t *)((char *)sq + prm.sq_off.array);
	array[*tail & *mask] = 0;
	__atomic_store_n(tail, *tail + 1, __ATOMIC_RELEASE);
	if (syscall(__NR_io_uring_enter, ring, 1, 0, 0, NULL, 0) != 1) {
		r = errno ? -errno : -EIO;
		close(ring);
		return r;
	}
	return ring;
}

#define FIRST_USE_VMAS	8192	/* what a process's first mmu notifier locks */
#define FIRST_USE_LEN	(64 * KiB)

struct first_use {
	int r;		/* the call's result */
	double s;	/* how long it took */
	int moved;	/* EVICT: pages back in RAM with their data */
};

/*
 * In a new process (a new mm, no mmu notifier yet) with FIRST_USE_VMAS
 * mappings: the first SVM, or an EVICT of pages it migrated, while an
 * io_uring timer set to fire timer_s after the call began is in flight.
 */
static struct first_use first_use_run(const char *path, bool evict,
				      double timer_s)
{
	struct first_use res = { .r = -ECHILD };
	int pfd[2], status;
	pid_t pid;

	if (pipe(pfd))
		return res;
	pid = fork();
	if (!pid) {
		struct __kernel_timespec ts = {
			.tv_sec = (long long)timer_s,
			.tv_nsec = (long long)((timer_s - (long long)timer_s) * 1e9),
		};
		uint8_t *vmas = map_anon(2 * FIRST_USE_VMAS * PG);
		uint8_t *buf = map_anon(FIRST_USE_LEN);
		int fd = cxla_open_dev(path), i;
		uint64_t v = 0;
		double t0;

		close(pfd[0]);
		if (fd < 0 || !vmas || !buf)
			_exit(1);
		/* every other page read-only: that many vmas */
		memset(vmas, 1, 2 * FIRST_USE_VMAS * PG);
		for (i = 0; i < FIRST_USE_VMAS; i++)
			if (mprotect(vmas + (2 * i + 1) * PG, PG, PROT_READ))
				_exit(1);
		memset(buf, 0x5a, FIRST_USE_LEN);
		if (evict && cxla_migrate(fd, buf, FIRST_USE_LEN, true, NULL))
			_exit(1);
		if (timer_s > 0 && uring_timeout(&ts) < 0)
			_exit(1);
		t0 = now_sec();
		if (evict) {
			struct cxl_accel_evict e = { 0 };

			res.r = cxla_ioctl(fd, CXL_ACCEL_IOC_EVICT, &e);
			res.moved = e.evicted == FIRST_USE_LEN / PG &&
				    cxla_all_bytes(buf, FIRST_USE_LEN, 0x5a);
		} else {
			res.r = cxla_svm(fd, CXL_ACCEL_SVM_CHECKSUM, buf,
					 FIRST_USE_LEN, 0, 0, &v, NULL);
		}
		res.s = now_sec() - t0;
		close(fd);
		_exit(write(pfd[1], &res, sizeof(res)) == sizeof(res) ? 0 : 1);
	}
	close(pfd[1]);
	if (pid > 0 && read(pfd[0], &res, sizeof(res)) != sizeof(res))
		res.r = -ECHILD;
	close(pfd[0]);
	if (pid > 0)
		waitpid(pid, &status, 0);
	return res;
}

/*
 * A process's first mmu notifier takes the locks of all its mappings and
 * gives up on anything pending, task work included. The first SVM and an
 * EVICT (which looks at each process's pages through a notifier) must not
 * fail with EINTR when io_uring task work comes meanwhile: an io_uring timer
 * fires at eight points across the call.
 */
CXLA_TEST_F(dev, first_notifier_task_work)
{
	static const char * const what[] = { "first SVM", "EVICT" };
	struct first_use base, res;
	char tb[200], *tp;
	int op, k;

	tp = tb;
	for (op = 0; op < 2; op++) {
		base = first_use_run(c->path, op, 0);
		CHECK(!base.r && (!op || base.moved), "%s of a process with %d mappings: %s",
		      what[op], FIRST_USE_VMAS, base.r ? ename(-base.r) : "pages not back");
		for (k = 1; k <= 8; k++) {
			res = first_use_run(c->path, op, base.s * k / 8);
			CHECK(!res.r && (!op || res.moved),
			      "%s, an io_uring timer firing after %.2f of its %.1f ms: %s%s",
			      what[op], base.s * k / 8 * 1e3, base.s * 1e3,
			      res.r ? ename(-res.r) : "ok",
			      res.r || res.moved || !op ? "" : ", pages not back");
		}
		tp += snprintf(tp, tb + sizeof(tb) - tp, "%s%s %.1f ms", op ? ", " : "",
			       what[op], base.s * 1e3);
	}
	DETAIL("processes with %d mappings, io_uring timers firing at 1/8..8/8 of each call, all went through (%s)",
	       FIRST_USE_VMAS, tb);
	return PASS;
}

struct later {
	int fd;
	unsigned int ms;
	uint64_t value;
	pthread_t victim;	/* SIGUSR1 instead, if set */
	int sig;
};

static void *later_thread(void *arg)
{
	struct later *l = arg;

	msleep_(l->ms);
	if (l->sig)
		pthread_kill(l->victim, l->sig);
	else
		signal_dev(l->fd, l->value);
	return NULL;
}

/*
 * io_uring queues task work with TWA_SIGNAL, which ends interruptible
 * waits although no signal is pending. Commands, migrations, SVM and
 * WAIT_EVENT right after an io_uring was closed must not fail with EINTR;
 * a real signal must still end a long command and a WAIT_EVENT at once.
 */
CXLA_TEST_F(dev, io_uring_task_work)
{
	struct sigaction sa = { .sa_handler = on_tick };	/* no SA_RESTART */
	const size_t len = 4 * MiB;
	int fd = cxla_open_dev(c->path), i, r;
	uint8_t *ram = map_anon(len), *anon = map_anon(1 * MiB);
	struct cxl_accel_wait_event w;
	struct cxl_accel_alloc a;
	struct tally t = { 0 };
	struct later l;
	pthread_t th;
	double t0, atomic_s, wait_s;
	uint64_t v;
	char tb[200];

	CHECK(fd >= 0 && ram && anon, "open");
	CHECK(!sigaction(SIGUSR1, &sa, NULL), "sigaction");
	memset(ram, 7, len);
	memset(anon, 9, 1 * MiB);
	OK(cxla_alloc(fd, len, 0, &a));
	r = uring_churn(ram, 1 * MiB, false);
	CHECK(!r, "io_uring: %s", ename(-r));
	t0 = now_sec();
	for (i = 0; i < 400 && (i < 40 || now_sec() - t0 < 2.0); i++) {
		uring_churn(ram, 1 * MiB, i % 2);
		switch (i % 4) {
		case 0:
		case 1:
			note(&t, cxla_copy(fd, cxla_user(ram), cxla_dev(a.handle, 0), len, 0),
			     NULL, "COPY after an io_uring went");
			break;
		case 2:
			note(&t, cxla_migrate(fd, anon, 1 * MiB, true, NULL), NULL,
			     "migration after an io_uring went");
			note(&t, cxla_migrate(fd, anon, 1 * MiB, false, NULL), NULL,
			     "migration back after an io_uring went");
			v = 0;
			note(&t, cxla_svm(fd, CXL_ACCEL_SVM_CHECKSUM, anon, 1 * MiB, 0, 0, &v, NULL), NULL,
			     "SVM after an io_uring went");
			break;
		default:
			l = (struct later){ .fd = c->fd, .ms = 5, .value = 0x10 + i };
			CHECK(!pthread_create(&th, NULL, later_thread, &l), "thread");
			memset(&w, 0, sizeof(w));
			w.type = CXL_ACCEL_EVENT_SIGNAL;
			w.flags = CXL_ACCEL_WAIT_MATCH_VALUE;
			w.value = 0x10 + i;
			w.timeout_ms = 3000;
			note(&t, cxla_ioctl(fd, CXL_ACCEL_IOC_WAIT_EVENT, &w), NULL,
			     "WAIT_EVENT after an io_uring went");
			pthread_join(th, NULL);
			break;
		}
	}
	TALLY_OK(&t);
	CHECK(cxla_all_bytes(anon, 1 * MiB, 9), "data after the migrations");

	/* a real signal still ends a long command and a wait, at once */
	uring_churn(ram, 1 * MiB, true);
	l = (struct later){ .victim = pthread_self(), .sig = SIGUSR1, .ms = 30 };
	CHECK(!pthread_create(&th, NULL, later_thread, &l), "thread");
	t0 = now_sec();
	r = cxla_atomic(fd, cxla_dev(a.handle, 0), CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 1, 0,
			1 << 26, 60000, NULL);
	atomic_s = now_sec() - t0;
	pthread_join(th, NULL);
	CHECK(r == -EINTR && atomic_s < 1.0, "ATOMIC of 2^26 adds, SIGUSR1 after 30 ms: %d (%s) after %.2f s",
	      r, r ? ename(-r) : "ok", atomic_s);
	uring_churn(ram, 1 * MiB, true);
	CHECK(!pthread_create(&th, NULL, later_thread, &l), "thread");
	memset(&w, 0, sizeof(w));
	w.timeout_ms = 5000;
	w.type = CXL_ACCEL_EVENT_ERROR;
	t0 = now_sec();
	r = cxla_ioctl(fd, CXL_ACCEL_IOC_WAIT_EVENT, &w);
	wait_s = now_sec() - t0;
	pthread_join(th, NULL);
	CHECK(r == -EINTR && wait_s < 1.0, "WAIT_EVENT, SIGUSR1 after 30 ms: %d (%s) after %.2f s",
	      r, r ? ename(-r) : "ok", wait_s);
	munmap(ram, len);
	munmap(anon, 1 * MiB);
	close(fd);
	DETAIL("%d io_urings closed right before a 4 MiB COPY, a migration there and back with SVM, or a WAIT_EVENT: %s; a signal still ended a long ATOMIC after %.2f s and a WAIT_EVENT after %.2f s",
	       i, tally_str(&t, tb, sizeof(tb)), atomic_s, wait_s);
	return PASS;
}

/* ------------------------------------- process killed with commands in flight */

struct kjob {
	int fd, pfd;
	int kind;
	uint32_t a, b, imp;
	uint8_t *ram, *anon;
	size_t len;
};

static void *kill_thread(void *arg)
{
	struct kjob *j = arg;
	struct cxl_accel_wait_event w = { .timeout_ms = 10000 };
	uint32_t crc;
	uint64_t v;
	int i = 0;

	for (;; i++) {
		switch (j->kind) {
		case 0:
			cxla_copy(j->fd, cxla_user(j->ram), cxla_dev(j->a, 0), j->len, 0);
			cxla_copy(j->fd, cxla_dev(j->a, 0), cxla_dev(j->b, 0), j->len, 0);
			break;
		case 1:
			cxla_fill(j->fd, cxla_dev(j->b, 0), j->len, i, 0);
			cxla_checksum(j->fd, cxla_dev(j->a, 0), j->len, 0, &crc);
			break;
		case 2:
			cxla_atomic(j->fd, cxla_dev(j->a, 64), CXL_ACCEL_ATOMIC_FETCH_ADD,
				    8, 1, 0, 1 << 20, 0, NULL);
			break;
		case 3:
			cxla_ioctl(j->fd, CXL_ACCEL_IOC_WAIT_EVENT, &w);
			break;
		case 4:
			cxla_migrate(j->fd, j->anon, 4 * MiB, i % 2 == 0, NULL);
			break;
		case 5:
			v = 0;
			cxla_svm(j->fd, CXL_ACCEL_SVM_CHECKSUM, j->anon, 4 * MiB, 0, 0, &v,
				 NULL);
			break;
		case 6:
			cxla_copy(j->pfd, cxla_dev(j->imp, 0), cxla_user(j->ram), j->len, 0);
			cxla_fill(j->pfd, cxla_dev(j->imp, 0), j->len, i, 0);
			break;
		}
	}
	return NULL;
}

static void kill_child(FIXTURE_DATA(dev) *c, int ready)
{
	struct kjob j = { .len = 8 * MiB };
	struct cxl_accel_dmabuf_import im;
	struct cxl_accel_alloc a, b;
	pthread_t th[7];
	int k, dmabuf;

	j.fd = cxla_open_dev(c->path);
	j.pfd = cxla_open_dev(imp_path(c));
	if (j.fd < 0 || j.pfd < 0 || cxla_alloc(j.fd, j.len, 0, &a) ||
	    cxla_alloc(j.fd, j.len, 0, &b))
		_exit(2);
	j.a = a.handle;
	j.b = b.handle;
	j.ram = malloc(j.len);
	j.anon = map_anon(4 * MiB);
	if (!j.ram || !j.anon)
		_exit(3);
	memset(j.ram, 1, j.len);
	memset(j.anon, 2, 4 * MiB);
	dmabuf = cxla_export_dmabuf_fd(j.fd, j.a);
	if (dmabuf < 0 || cxla_import_dmabuf(j.pfd, dmabuf, &im))
		_exit(4);
	j.imp = im.handle;
	for (k = 0; k < 7; k++) {
		struct kjob *jk = malloc(sizeof(*jk));

		*jk = j;
		jk->kind = k;
		if (pthread_create(&th[k], NULL, kill_thread, jk))
			_exit(5);
	}
	msleep_(20);
	if (write(ready, "r", 1) != 1)
		_exit(6);
	for (;;)
		pause();
}

/*
 * A process with threads copying, filling, checksumming, doing atomics,
 * waiting for events, migrating, using SVM and copying through an imported
 * DMA-BUF is SIGKILLed; everything comes back.
 */
CXLA_TEST_F(dev, kill_inflight)
{
	static const unsigned int delays[] = { 5, 60, 200 };
	long quarantined = 0, intr0 = cxla_sysfs_long(c->name, "interrupted");
	int round, status, p[2];
	double t0;
	pid_t pid;
	char ch;

	for (round = 0; round < (int)ARRAY_SIZE(delays); round++) {
		CHECK(!pipe(p), "pipe");
		pid = fork();
		CHECK(pid >= 0, "fork");
		if (!pid) {
			close(p[0]);
			kill_child(c, p[1]);
		}
		close(p[1]);
		CHECK(read(p[0], &ch, 1) == 1, "round %d: child did not get ready", round);
		close(p[0]);
		msleep_(delays[round]);
		kill(pid, SIGKILL);
		t0 = now_sec();
		waitpid(pid, &status, 0);
		CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
		      "round %d: child status %#x", round, status);
		CHECK(now_sec() - t0 < 10, "round %d: the killed child took %.1f s to go",
		      round, now_sec() - t0);
		quarantined += cxla_sysfs_long(c->name, "quarantined");
	}
	DETAIL("3 processes with 7 threads of commands (copy, fill/checksum, atomics, WAIT_EVENT, migration, SVM, copies through an import) killed after 5/60/200 ms: %ld commands interrupted, %ld still quarantined right after the kills",
	       cxla_sysfs_long(c->name, "interrupted") - intr0, quarantined);
	return PASS;
}

/* ----------------------------------------- unmap during migration */

#define UM_PAGES	1024	/* 4 MiB */
#define UM_PIECE	16	/* pages changed at once */

struct um {
	int fd;
	int efd;		/* for EVICT */
	uint8_t *p;
	uint32_t h;		/* SVM READ target */
	volatile int stop;
	struct tally mig, svm, evict;
	long moved, evicted;
};

static void *um_migrator(void *arg)
{
	static const int allowed[] = { EFAULT, EINTR, 0 };
	struct um *u = arg;
	struct cxl_accel_migrate m;
	int dir = 0, r;

	while (!u->stop) {
		r = cxla_migrate(u->fd, u->p, UM_PAGES * PG, dir ^= 1, &m);
		note(&u->mig, r, allowed, "migrate to %s", dir ? "device" : "RAM");
		if (!r)
			u->moved += m.migrated;
	}
	return NULL;
}

static void *um_svm(void *arg)
{
	static const int allowed[] = { EFAULT, EBUSY, EINTR, 0 };
	struct um *u = arg;
	uint64_t v;
	int i = 0;

	while (!u->stop) {
		v = 0;
		if (i++ % 2)
			note(&u->svm, cxla_svm(u->fd, CXL_ACCEL_SVM_CHECKSUM, u->p,
					       UM_PAGES * PG, 0, 0, &v, NULL),
			     allowed, "SVM CHECKSUM");
		else
			note(&u->svm, cxla_svm(u->fd, CXL_ACCEL_SVM_READ, u->p + 100,
					       UM_PAGES * PG - 200, u->h, 0, NULL,
					       NULL), allowed,
			     "SVM READ");
	}
	return NULL;
}

/* everything on the device back to RAM, now and then */
static void *um_evictor(void *arg)
{
	struct um *u = arg;
	struct cxl_accel_evict e;

	while (!u->stop) {
		memset(&e, 0, sizeof(e));
		note(&u->evict, cxla_ioctl(u->efd, CXL_ACCEL_IOC_EVICT, &e), NULL, "EVICT");
		u->evicted += e.evicted;
		msleep_(100);
	}
	return NULL;
}

static long first_bad_page(const uint8_t *p, const uint8_t *exp)
{
	long i;

	for (i = 0; i < UM_PAGES; i++)
		if (!cxla_all_bytes(p + i * PG, PG, exp[i]))
			return i;
	return -1;
}

/*
 * munmap/mmap, mprotect (read-only, none), MADV_DONTNEED, CPU writes and
 * fork on pieces of a range that one thread migrates to device memory and
 * back while another reads it with SVM; the data is what the CPU wrote.
 */
CXLA_TEST_F(dev, unmap_during_migration)
{
	struct sigaction sa = { .sa_handler = on_tick };	/* no SA_RESTART */
	uint8_t exp[UM_PAGES], v = 1;
	struct um u = { 0 };
	struct cxl_accel_alloc a;
	long acts[7] = { 0 }, bad, child_bad = 0;
	uint64_t seed = c->seed;
	pthread_t tm, ts, te;
	double until;
	char tb[200], tb2[200];
	int i;

	CHECK(!sigaction(SIGUSR1, &sa, NULL), "sigaction");
	u.fd = cxla_open_dev(c->path);
	u.efd = cxla_open_dev(c->path);
	CHECK(u.fd >= 0 && u.efd >= 0, "open");
	OK(cxla_alloc(u.fd, UM_PAGES * PG, 0, &a));
	u.h = a.handle;
	u.p = map_anon(UM_PAGES * PG);
	CHECK(u.p, "mmap");
	for (i = 0; i < UM_PAGES; i++) {
		exp[i] = v++;
		memset(u.p + i * PG, exp[i], PG);
	}
	CHECK(!pthread_create(&tm, NULL, um_migrator, &u) &&
	      !pthread_create(&ts, NULL, um_svm, &u) &&
	      !pthread_create(&te, NULL, um_evictor, &u), "threads");
	/*
	 * The actions in turn, on random pieces: 2 s, longer (6 s at most)
	 * until each ran twice and a migration and an SVM read worked.
	 */
	until = now_sec() + 2.0;
	for (i = 0; now_sec() < until ||
	     ((i < 14 || !u.mig.n[0] || !u.svm.n[0]) && now_sec() < until + 4); i++) {
		int first = rnd32(&seed) % (UM_PAGES / UM_PIECE) * UM_PIECE;
		uint8_t *q = u.p + first * PG;
		int act = i % 7, k, status;
		pid_t pid;

		acts[act]++;
		switch (act) {
		case 0:		/* a new mapping */
			CHECK(!munmap(q, UM_PIECE * PG), "munmap");
			usleep(rnd32(&seed) % 1000);
			CHECK(mmap(q, UM_PIECE * PG, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == q,
			      "mmap fixed");
			for (k = 0; k < UM_PIECE; k++) {
				exp[first + k] = v++;
				memset(q + k * PG, exp[first + k], PG);
			}
			break;
		case 1:		/* read-only for a while */
		case 2:		/* no access for a while */
			CHECK(!mprotect(q, UM_PIECE * PG, act == 1 ? PROT_READ : PROT_NONE),
			      "mprotect");
			usleep(rnd32(&seed) % 2000);
			CHECK(!mprotect(q, UM_PIECE * PG, PROT_READ | PROT_WRITE),
			      "mprotect back");
			break;
		case 3:		/* dropped: zero pages */
			CHECK(!madvise(q, UM_PIECE * PG, MADV_DONTNEED), "madvise");
			for (k = 0; k < UM_PIECE; k++)
				exp[first + k] = 0;
			break;
		case 4:		/* the CPU writes, wherever the pages are */
			for (k = 0; k < UM_PIECE; k++) {
				exp[first + k] = v++;
				memset(q + k * PG, exp[first + k], PG);
			}
			break;
		case 5:		/*
				 * fork: the child sees the data, lets the
				 * device checksum it through the shared file
				 * (a mirror of its own, dropped after it
				 * exits), writes its copy
				 */
			pid = fork();
			CHECK(pid >= 0, "fork");
			if (!pid) {
				uint64_t crc = 0;

				if (first_bad_page(u.p, exp) >= 0)
					_exit(1);
				if (cxla_svm(u.fd, CXL_ACCEL_SVM_CHECKSUM, q,
					     UM_PIECE * PG, 0, 0, &crc, NULL) ||
				    (uint32_t)crc != crc32c(0, q, UM_PIECE * PG))
					_exit(3);
				memset(q, 0xee, UM_PIECE * PG);
				_exit(cxla_all_bytes(q, UM_PIECE * PG, 0xee) ? 0 : 2);
			}
			waitpid(pid, &status, 0);
			child_bad += !WIFEXITED(status) || WEXITSTATUS(status);
			break;
		case 6:		/* interrupt whatever the device does for them */
			usleep(rnd32(&seed) % 2000);
			pthread_kill(tm, SIGUSR1);
			pthread_kill(ts, SIGUSR1);
			break;
		}
		usleep(rnd32(&seed) % 3000);	/* quiet moments */
	}
	u.stop = 1;
	pthread_join(tm, NULL);
	pthread_join(ts, NULL);
	pthread_join(te, NULL);
	TALLY_OK(&u.mig);
	TALLY_OK(&u.svm);
	TALLY_OK(&u.evict);
	bad = first_bad_page(u.p, exp);
	CHECK(bad < 0, "page %ld holds %#x, expected %#x", bad, u.p[bad * PG], exp[bad]);
	CHECK(!child_bad, "%ld forked children saw wrong data", child_bad);
	CHECK(u.mig.n[0] && u.moved && u.svm.n[0] && i >= 14,
	      "%d actions; no migration or SVM access worked: migrate %s, svm %s", i,
	      tally_str(&u.mig, tb, sizeof(tb)), tally_str(&u.svm, tb2, sizeof(tb2)));
	OK(cxla_migrate(u.fd, u.p, UM_PAGES * PG, false, NULL));
	munmap(u.p, UM_PAGES * PG);
	OK(cxla_free(u.fd, u.h));
	close(u.fd);
	close(u.efd);
	DETAIL("munmap/mmap %ld, read-only %ld, PROT_NONE %ld, DONTNEED %ld, CPU writes %ld, forks (with SVM in the child) %ld, signals %ld under migrations (%s; %ld pages moved), SVM reads (%s) and %ld EVICTs (%ld pages): data right",
	       acts[0], acts[1], acts[2], acts[3], acts[4], acts[5], acts[6],
	       tally_str(&u.mig, tb, sizeof(tb)), u.moved,
	       tally_str(&u.svm, tb2, sizeof(tb2)), u.evict.n[0], u.evicted);
	return PASS;
}

/* children exit (or are killed) with pages on the device and migrations in flight */
CXLA_TEST_F(dev, exit_with_device_pages)
{
	int round, status, p[2];
	uint64_t seed = c->seed;
	pid_t pid;
	char ch;

	for (round = 0; round < 6; round++) {
		unsigned int delay = 10 + rnd32(&seed) % 100;

		CHECK(!pipe(p), "pipe");
		pid = fork();
		CHECK(pid >= 0, "fork");
		if (!pid) {
			struct um u = { 0 };
			struct cxl_accel_alloc a;
			pthread_t t1, t2;

			close(p[0]);
			u.fd = cxla_open_dev(c->path);
			u.p = map_anon(UM_PAGES * PG);
			if (u.fd < 0 || !u.p || cxla_alloc(u.fd, UM_PAGES * PG, 0, &a))
				_exit(2);
			u.h = a.handle;
			memset(u.p, 0x42, UM_PAGES * PG);
			if (cxla_migrate(u.fd, u.p, UM_PAGES * PG, true, NULL))
				_exit(3);
			if (pthread_create(&t1, NULL, um_migrator, &u) ||
			    pthread_create(&t2, NULL, um_svm, &u))
				_exit(4);
			if (round % 3 == 2 && !fork()) {
				/* a grandchild shares the pages copy-on-write */
				msleep_(30);
				_exit(u.p[12345] == 0x42 ? 0 : 1);
			}
			if (write(p[1], "r", 1) != 1)
				_exit(5);
			msleep_(delay);
			if (round % 3 == 0)
				exit(0);	/* threads still migrating */
			for (;;)
				pause();
		}
		close(p[1]);
		CHECK(read(p[0], &ch, 1) == 1, "round %d: child not ready", round);
		close(p[0]);
		if (round % 3)
			kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		CHECK(round % 3 ? WIFSIGNALED(status) :
				  WIFEXITED(status) && !WEXITSTATUS(status),
		      "round %d: child status %#x", round, status);
		msleep_(40);	/* the grandchild */
	}
	DETAIL("6 processes with 4 MiB on device memory and threads migrating and reading it exited or were killed (2 with a forked grandchild sharing the pages)");
	return PASS;
}

/* --------------------------------------------------------- DMA-BUF */

struct db_worker {
	int fd;			/* importer */
	uint32_t imp, y;
	size_t len;
	volatile int stop;
	int in_call;
	struct tally t;
	long after, after_ok;	/* calls begun after the action, that worked */
	volatile int acted;
};

static void *db_thread(void *arg)
{
	static const int allowed[] = { ENOENT, EBADF, 0 };
	struct db_worker *w = arg;
	uint32_t crc;
	int i = 0, r;

	while (!w->stop) {
		int acted = w->acted;

		__atomic_store_n(&w->in_call, 1, __ATOMIC_SEQ_CST);
		switch (i++ % 3) {
		case 0:
			r = cxla_copy(w->fd, cxla_dev(w->imp, 0), cxla_dev(w->y, 0), w->len, 0);
			break;
		case 1:
			r = cxla_copy(w->fd, cxla_dev(w->y, 0), cxla_dev(w->imp, 0), w->len, 0);
			break;
		default:
			r = cxla_checksum(w->fd, cxla_dev(w->imp, 0), w->len, 0, &crc);
			break;
		}
		__atomic_store_n(&w->in_call, 0, __ATOMIC_SEQ_CST);
		note(&w->t, r, allowed, "copy through an import, call %d", i);
		w->after += acted;
		if (!r && acted)
			w->after_ok++;
	}
	return NULL;
}

enum { DB_EXPORTER_GONE, DB_FREE_IMPORT, DB_CLOSE_IMPORTER, DB_HEAP, DB_MODES };
static const char * const db_mode_name[] = {
	"exporter fd, handle and file closed", "import freed", "importer file closed",
	"heap DMA-BUF closed and unmapped",
};

/*
 * Copies through an imported DMA-BUF while the exporter's fd, buffer handle
 * and file go, the import is freed, or the importer's file is closed; a
 * system heap DMA-BUF closed and unmapped under copies.
 */
CXLA_TEST_F(dev, dmabuf_close_during_copy)
{
	const size_t len = 4 * MiB;
	struct tally t = { 0 };
	uint64_t seed = c->seed;
	int round, mode, hits[DB_MODES] = { 0 };
	long after_ok[DB_MODES] = { 0 };
	char tb[200];

	for (round = 0; round < 3 * DB_MODES; round++) {
		struct db_worker w = { .len = len };
		struct cxl_accel_dmabuf_import im;
		struct cxl_accel_alloc x = { 0 }, y;
		int efd = -1, dmabuf = -1, hfd = -1, in, k;
		uint8_t *m = NULL;
		uint32_t crc;
		pthread_t th;

		mode = round % DB_MODES;
		w.fd = cxla_open_dev(imp_path(c));
		CHECK(w.fd >= 0, "open");
		OK(cxla_alloc(w.fd, len, 0, &y));
		w.y = y.handle;
		if (mode == DB_HEAP) {
			struct dma_heap_allocation_data hd = {
				.len = len, .fd_flags = O_RDWR | O_CLOEXEC,
			};

			hfd = open("/dev/dma_heap/system", O_RDWR | O_CLOEXEC);
			CHECK(hfd >= 0 && !ioctl(hfd, DMA_HEAP_IOCTL_ALLOC, &hd),
			      "system heap: %s", strerror(errno));
			dmabuf = hd.fd;
			close(hfd);
		} else {
			efd = cxla_open_dev(c->path);
			CHECK(efd >= 0, "open");
			OK(cxla_alloc(efd, len, 0, &x));
			dmabuf = cxla_export_dmabuf_fd(efd, x.handle);
			CHECK(dmabuf >= 0, "export: %d", dmabuf);
		}
		m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, dmabuf, 0);
		CHECK(m != MAP_FAILED, "mmap DMA-BUF: %s", strerror(errno));
		OK(cxla_import_dmabuf(w.fd, dmabuf, &im));
		w.imp = im.handle;
		/* the import reaches what the CPU wrote, and the other way */
		fill_random(m, len, seed + round);
		OK(cxla_checksum(w.fd, cxla_dev(w.imp, 0), len, 0, &crc));
		CHECK(crc == crc32c(0, m, len), "round %d: checksum through the import", round);
		OK(cxla_fill(w.fd, cxla_dev(w.imp, 4096), 8192, 0x3131313131313131ULL, 0));
		CHECK(cxla_all_bytes(m + 4096, 8192, 0x31), "round %d: FILL through the import", round);

		CHECK(!pthread_create(&th, NULL, db_thread, &w), "thread");
		msleep_(1 + rnd32(&seed) % 10);
		wait_flag(&w.in_call, 500);	/* strike while a copy runs */
		in = __atomic_load_n(&w.in_call, __ATOMIC_SEQ_CST);
		switch (mode) {
		case DB_EXPORTER_GONE:
			CHECK(!close(dmabuf), "close");
			CHECK(!munmap(m, len), "munmap");
			OK(cxla_free(efd, x.handle));
			CHECK(!close(efd), "close");
			break;
		case DB_FREE_IMPORT:
			OK(cxla_free(w.fd, w.imp));
			break;
		case DB_CLOSE_IMPORTER:
			CHECK(!close(w.fd), "close");
			break;
		case DB_HEAP:
			CHECK(!munmap(m, len), "munmap");
			CHECK(!close(dmabuf), "close");
			break;
		}
		w.acted = 1;
		hits[mode] += in;
		for (k = 0; k < 2000 && w.after < 3; k++)
			usleep(1000);
		w.stop = 1;
		pthread_join(th, NULL);
		tally_add(&t, &w.t);
		after_ok[mode] += w.after_ok;
		if (mode == DB_FREE_IMPORT)
			EXPECT_ERR(cxla_checksum(w.fd, cxla_dev(w.imp, 0), 8, 0, &crc), ENOENT);
		if (mode == DB_EXPORTER_GONE || mode == DB_HEAP)
			OK(cxla_checksum(w.fd, cxla_dev(w.imp, 0), len, 0, &crc));
		if (mode != DB_CLOSE_IMPORTER)
			close(w.fd);
		if (mode == DB_FREE_IMPORT || mode == DB_CLOSE_IMPORTER) {
			munmap(m, len);
			close(dmabuf);
			OK(cxla_free(efd, x.handle));
			close(efd);
		}
	}
	TALLY_OK(&t);
	for (mode = 0; mode < DB_MODES; mode++)
		CHECK(hits[mode], "%s never while a copy was in flight", db_mode_name[mode]);
	CHECK(after_ok[DB_EXPORTER_GONE] && after_ok[DB_HEAP],
	      "no copy through the import worked after the exporter went (%ld, %ld)",
	      after_ok[DB_EXPORTER_GONE], after_ok[DB_HEAP]);
	DETAIL("12 rounds of 4 MiB copies through an import (%s): exporter gone %d, import freed %d, importer closed %d, heap closed %d times with a copy in flight; copies kept working without the exporter: %s",
	       c->peer_path ? "peer-to-peer" : "self import", hits[0], hits[1], hits[2],
	       hits[3], tally_str(&t, tb, sizeof(tb)));
	return PASS;
}

#define EXP_ROUNDS	30

struct exp_racer {
	int fd;
	uint32_t h;
	pthread_barrier_t *bar;
	ino_t ino[EXP_ROUNDS];	/* of the DMA-BUF this thread got, 0: none */
	struct tally t;
};

/*
 * Each round: all threads export the buffer at once, look at what they got
 * while all of them hold it, then close it (the next round exports anew,
 * maybe while the last one is being released).
 */
static void *export_racer(void *arg)
{
	struct exp_racer *x = arg;
	struct stat st;
	int i, d;

	for (i = 0; i < EXP_ROUNDS; i++) {
		pthread_barrier_wait(x->bar);
		d = cxla_export_dmabuf_fd(x->fd, x->h);
		note(&x->t, d < 0 ? d : 0, NULL, "export, round %d", i);
		x->ino[i] = d >= 0 && !fstat(d, &st) ? st.st_ino : 0;
		pthread_barrier_wait(x->bar);
		if (d >= 0)
			close(d);
	}
	return NULL;
}

struct churn {
	int fd;
	uint32_t h;
	volatile int stop;
	struct tally t;
	long n;
};

static void *export_churn(void *arg)
{
	static const int allowed[] = { ENOENT, 0 };
	struct churn *x = arg;
	int d;

	while (!x->stop) {
		d = cxla_export_dmabuf_fd(x->fd, x->h);
		note(&x->t, d < 0 ? d : 0, allowed, "export/close");
		if (d >= 0)
			close(d);
		x->n++;
	}
	return NULL;
}

/*
 * Export then FREE: the DMA-BUF keeps the memory, through an import too.
 * Exports of one buffer racing each other (one DMA-BUF per buffer), and
 * racing the close of its last fd and a FREE.
 */
CXLA_TEST_F(dev, export_then_free)
{
	const size_t len = 1 * MiB;
	struct cxl_accel_dmabuf_import im;
	struct cxl_accel_alloc a;
	struct exp_racer xr[4];
	struct churn ch[2];
	pthread_barrier_t bar;
	pthread_t th[4];
	int fd = cxla_open_dev(c->path), ifd = cxla_open_dev(imp_path(c)), dmabuf, i, k;
	struct tally t = { 0 };
	uint64_t free0 = cxla_devmem_free(c->fd);
	uint8_t *m;
	uint32_t crc;
	char tb[200];

	CHECK(fd >= 0 && ifd >= 0, "open");
	/* export, FREE, use through the fd and an import, then let go */
	OK(cxla_alloc(fd, len, 0, &a));
	dmabuf = cxla_export_dmabuf_fd(fd, a.handle);
	CHECK(dmabuf >= 0, "export");
	OK(cxla_free(fd, a.handle));
	EXPECT_ERR(cxla_export_dmabuf_fd(fd, a.handle), ENOENT);
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, dmabuf, 0);
	CHECK(m != MAP_FAILED, "mmap: %s", strerror(errno));
	fill_random(m, len, c->seed);
	OK(cxla_import_dmabuf(ifd, dmabuf, &im));
	CHECK(!close(dmabuf), "close");
	OK(cxla_checksum(ifd, cxla_dev(im.handle, 0), len, 0, &crc));
	CHECK(crc == crc32c(0, m, len), "checksum through the import of a freed buffer");
	CHECK(!munmap(m, len), "munmap");
	CHECK(cxla_devmem_free(c->fd) == free0 - len, "memory of the import went back (%llu free, %llu before)",
	      (unsigned long long)cxla_devmem_free(c->fd), (unsigned long long)free0);
	OK(cxla_fill(ifd, cxla_dev(im.handle, 0), len, 1, 0));
	OK(cxla_free(ifd, im.handle));
	for (i = 0; i < 100 && cxla_devmem_free(c->fd) != free0; i++)
		usleep(20000);
	CHECK(cxla_devmem_free(c->fd) == free0, "memory not back after the import went");

	/* four threads export one buffer at the same moment */
	OK(cxla_alloc(fd, len, 0, &a));
	pthread_barrier_init(&bar, NULL, 4);
	for (k = 0; k < 4; k++) {
		memset(&xr[k], 0, sizeof(xr[k]));
		xr[k].fd = fd;
		xr[k].h = a.handle;
		xr[k].bar = &bar;
		CHECK(!pthread_create(&th[k], NULL, export_racer, &xr[k]), "thread");
	}
	for (k = 0; k < 4; k++)
		pthread_join(th[k], NULL);
	pthread_barrier_destroy(&bar);
	for (k = 0; k < 4; k++)
		tally_add(&t, &xr[k].t);
	TALLY_OK(&t);
	for (i = 0; i < EXP_ROUNDS; i++)
		for (k = 1; k < 4; k++)
			CHECK(xr[k].ino[i] == xr[0].ino[i],
			      "round %d: two DMA-BUFs for one buffer (inodes %lu, %lu)", i,
			      (unsigned long)xr[0].ino[i], (unsigned long)xr[k].ino[i]);

	/* export/close loops on one buffer, then FREE under them */
	for (k = 0; k < 2; k++) {
		ch[k] = (struct churn){ .fd = fd, .h = a.handle };
		CHECK(!pthread_create(&th[k], NULL, export_churn, &ch[k]), "thread");
	}
	msleep_(300);
	OK(cxla_free(fd, a.handle));
	for (i = 0; i < 2000 && !(ch[0].t.n[ENOENT] && ch[1].t.n[ENOENT]); i++)
		usleep(1000);
	for (k = 0; k < 2; k++) {
		ch[k].stop = 1;
		pthread_join(th[k], NULL);
		tally_add(&t, &ch[k].t);
	}
	TALLY_OK(&t);
	CHECK(ch[0].t.n[ENOENT] && ch[1].t.n[ENOENT], "exports did not see the FREE");
	close(ifd);
	close(fd);
	DETAIL("FREE after EXPORT: memory held by the fd, then the import, back after both; 4 simultaneous exports x 30 got one DMA-BUF each time; export/close loops with FREE under them: %s",
	       tally_str(&t, tb, sizeof(tb)));
	return PASS;
}

struct busy {
	int fd;
	uint32_t h;
	uint64_t off;
	volatile int stop;
};

/* keeps a DMA engine busy with long atomics */
static void *busy_thread(void *arg)
{
	struct busy *b = arg;

	while (!b->stop)
		cxla_atomic(b->fd, cxla_dev(b->h, b->off), CXL_ACCEL_ATOMIC_FETCH_ADD,
			    8, 1, 0, 1 << 22, 0, NULL);
	return NULL;
}

struct kicker {
	pthread_t victim;
	int armed;
	volatile int stop;
	uint64_t seed;
};

/* SIGUSR1 to the victim a few ms after it armed us */
static void *kick_thread(void *arg)
{
	struct kicker *k = arg;

	while (!k->stop) {
		if (!__atomic_load_n(&k->armed, __ATOMIC_SEQ_CST)) {
			usleep(200);
			continue;
		}
		usleep(1000 + rnd32(&k->seed) % 4000);
		if (__atomic_exchange_n(&k->armed, 0, __ATOMIC_SEQ_CST))
			pthread_kill(k->victim, SIGUSR1);
	}
	return NULL;
}

/*
 * EXPORT interrupted by a signal while the engines are busy (the driver
 * takes the UUID back with a fenced UNEXPORT that waits for them), then
 * exported again at once: the new export must not fail because the device
 * still knows the old UUID.
 */
CXLA_TEST_F(dev, export_interrupted)
{
	struct sigaction sa = { .sa_handler = on_tick };	/* no SA_RESTART */
	struct kicker k = { .victim = pthread_self(), .seed = c->seed };
	struct busy b[2];
	struct cxl_accel_alloc a, x;
	struct tally t = { 0 };
	static const int allowed[] = { EINTR, 0 };
	pthread_t tb[2], tk;
	int fd = cxla_open_dev(c->path), round, r, d, tries, intr = 0;
	char tbuf[200];

	CHECK(fd >= 0, "open");
	CHECK(!sigaction(SIGUSR1, &sa, NULL), "sigaction");
	OK(cxla_alloc(fd, 4096, 0, &a));
	OK(cxla_alloc(fd, 64 * KiB, 0, &x));
	for (r = 0; r < 2; r++) {
		b[r] = (struct busy){ .fd = fd, .h = a.handle, .off = 64 * r };
		CHECK(!pthread_create(&tb[r], NULL, busy_thread, &b[r]), "thread");
	}
	CHECK(!pthread_create(&tk, NULL, kick_thread, &k), "thread");
	/* 16 rounds, more until one was interrupted (timing decides that) */
	for (round = 0; round < 16 || (!intr && round < 400); round++) {
		__atomic_store_n(&k.armed, 1, __ATOMIC_SEQ_CST);
		d = cxla_export_dmabuf_fd(fd, x.handle);
		__atomic_store_n(&k.armed, 0, __ATOMIC_SEQ_CST);
		note(&t, d < 0 ? d : 0, allowed, "export, round %d", round);
		intr += d == -EINTR;
		/* again at once (a late signal may interrupt this one too) */
		for (tries = 0; d == -EINTR && tries < 5; tries++) {
			d = cxla_export_dmabuf_fd(fd, x.handle);
			note(&t, d < 0 ? d : 0, allowed, "export again after EINTR, round %d",
			     round);
		}
		if (d >= 0)
			close(d);
	}
	k.stop = 1;
	b[0].stop = b[1].stop = 1;
	pthread_join(tk, NULL);
	pthread_join(tb[0], NULL);
	pthread_join(tb[1], NULL);
	TALLY_OK(&t);
	CHECK(intr, "no EXPORT was interrupted (%s)", tally_str(&t, tbuf, sizeof(tbuf)));
	close(fd);
	DETAIL("%d EXPORTs with a signal 1-5 ms in while both engines run long atomics: %d interrupted, exported again at once: %s",
	       round, intr, tally_str(&t, tbuf, sizeof(tbuf)));
	return PASS;
}

/* --------------------------------------------------------- alloc storm */

#define STORM_THREADS	4
#define STORM_MAX	2048

static long storm_nospc;	/* ENOSPC seen by any storm thread */

struct storm {
	int fd;
	int id;
	uint64_t seed;
	double until;
	pthread_barrier_t *bar;
	struct cxl_accel_alloc live[STORM_MAX];
	int nlive;
	long allocs, frees, maps;
	struct tally t;
};

static void storm_free(struct storm *s, int i)
{
	note(&s->t, cxla_free(s->fd, s->live[i].handle), NULL, "FREE");
	s->live[i] = s->live[--s->nlive];
	s->frees++;
}

static void *storm_thread(void *arg)
{
	static const int allowed[] = { ENOSPC, 0 };
	static const uint64_t aligns[] = { 0, 4096, 64 * KiB, 2 * MiB };
	struct storm *s = arg;
	int r, i;

	/* 2 s, longer (8 s at most) until the device was full */
	while (now_sec() < s->until ||
	       (!__atomic_load_n(&storm_nospc, __ATOMIC_SEQ_CST) &&
		now_sec() < s->until + 6)) {
		uint32_t x = rnd32(&s->seed);

		if (s->nlive && (x % 4 == 0 || s->nlive == STORM_MAX)) {
			storm_free(s, x % s->nlive);
			continue;
		}
		if (s->nlive && x % 16 == 1) {
			/* map, touch, unmap one */
			struct cxl_accel_alloc *a = &s->live[x % s->nlive];
			uint8_t *p = cxla_map(s->fd, a);

			if (p) {
				p[0] = 1;
				p[a->alloc_size - 1] = 2;
				munmap(p, a->alloc_size);
				s->maps++;
			}
			continue;
		}
		r = cxla_alloc(s->fd, 4096 * (1 + (x >> 8) % 1024),
			       aligns[(x >> 4) % 4], &s->live[s->nlive]);
		note(&s->t, r, allowed, "ALLOC");
		s->allocs++;
		if (!r) {
			s->nlive++;
		} else if (r == -ENOSPC) {
			__atomic_add_fetch(&storm_nospc, 1, __ATOMIC_SEQ_CST);
			/* full: let half go */
			for (i = s->nlive / 2; i > 0 && s->nlive; i--)
				storm_free(s, rnd32(&s->seed) % s->nlive);
		}
	}
	pthread_barrier_wait(s->bar);	/* main looks at the live buffers */
	pthread_barrier_wait(s->bar);
	while (s->nlive)
		storm_free(s, s->nlive - 1);
	return NULL;
}

struct storm_mig {
	int fd;
	uint8_t *p;
	size_t len;
	double until;
	pthread_barrier_t *bar;
	long no_space, moved;
	struct tally t;
};

static void *storm_migrator(void *arg)
{
	struct storm_mig *m = arg;
	struct cxl_accel_migrate r;
	int dir = 0;

	while (now_sec() < m->until ||
	       (!__atomic_load_n(&storm_nospc, __ATOMIC_SEQ_CST) &&
		now_sec() < m->until + 6)) {
		note(&m->t, cxla_migrate(m->fd, m->p, m->len, dir ^= 1, &r), NULL, "migrate");
		m->no_space += r.no_space;
		m->moved += r.migrated;
	}
	note(&m->t, cxla_migrate(m->fd, m->p, m->len, false, NULL), NULL, "migrate back");
	pthread_barrier_wait(m->bar);
	pthread_barrier_wait(m->bar);
	return NULL;
}

static int cmp_off(const void *a, const void *b)
{
	const struct cxl_accel_alloc *x = a, *y = b;

	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/*
 * Four threads (two sharing a file) allocate random sizes and alignments
 * until the device is full, free half, go on; one maps and unmaps; a fifth
 * migrates 8 MiB back and forth (its pool competes for the memory). Then:
 * buffers disjoint, sizes add up with the free memory, all freed.
 */
CXLA_TEST_F(dev, alloc_storm)
{
	static struct storm s[STORM_THREADS];
	static struct cxl_accel_alloc all[STORM_THREADS * STORM_MAX];
	struct storm_mig mg = { .len = 8 * MiB };
	struct cxl_accel_identify id;
	struct cxl_accel_hmm_info h;
	pthread_t th[STORM_THREADS + 1];
	pthread_barrier_t bar;
	struct tally t = { 0 };
	int fds[3], k, n = 0, i;
	uint64_t used = 0;
	double until = now_sec() + 2.0;
	long nospc = 0, allocs = 0, frees = 0, maps = 0;
	char tb[200];

	for (k = 0; k < 3; k++) {
		fds[k] = cxla_open_dev(c->path);
		CHECK(fds[k] >= 0, "open");
	}
	pthread_barrier_init(&bar, NULL, STORM_THREADS + 2);
	for (k = 0; k < STORM_THREADS; k++) {
		memset(&s[k], 0, sizeof(s[k]));
		s[k].fd = fds[k < 2 ? 0 : k - 1];
		s[k].id = k;
		s[k].seed = c->seed + k * 7919;
		s[k].until = until;
		s[k].bar = &bar;
		CHECK(!pthread_create(&th[k], NULL, storm_thread, &s[k]), "thread");
	}
	mg.fd = fds[2];
	mg.p = map_anon(mg.len);
	CHECK(mg.p, "mmap");
	memset(mg.p, 0x61, mg.len);
	mg.until = until;
	mg.bar = &bar;
	CHECK(!pthread_create(&th[k], NULL, storm_migrator, &mg), "thread");

	pthread_barrier_wait(&bar);
	/* everybody stopped: the live buffers are disjoint and add up */
	for (k = 0; k < STORM_THREADS; k++) {
		memcpy(all + n, s[k].live, s[k].nlive * sizeof(*all));
		n += s[k].nlive;
	}
	qsort(all, n, sizeof(*all), cmp_off);
	for (i = 0; i < n; i++) {
		used += all[i].alloc_size;
		if (i)
			CHECK(all[i].offset >= all[i - 1].offset + all[i - 1].alloc_size,
			      "buffers overlap at %#llx", (unsigned long long)all[i].offset);
		CHECK(all[i].offset + all[i].alloc_size <= c->id.devmem_size,
		      "buffer beyond device memory");
	}
	OK(cxla_hmm_info(c->fd, &h));
	OK(cxla_identify(c->fd, &id));
	CHECK(used + h.pool_chunks * h.chunk_size + id.devmem_free == (uint64_t)c->base.free,
	      "%d buffers of %llu bytes + %llu pool chunks + %llu free != %lld free before",
	      n, (unsigned long long)used, (unsigned long long)h.pool_chunks,
	      (unsigned long long)id.devmem_free, c->base.free);
	CHECK(!h.pool_pages_used, "%llu pool pages in use after migrating back",
	      (unsigned long long)h.pool_pages_used);
	pthread_barrier_wait(&bar);
	for (k = 0; k <= STORM_THREADS; k++)
		pthread_join(th[k], NULL);
	pthread_barrier_destroy(&bar);
	for (k = 0; k < STORM_THREADS; k++) {
		tally_add(&t, &s[k].t);
		allocs += s[k].allocs;
		frees += s[k].frees;
		maps += s[k].maps;
	}
	nospc = t.n[ENOSPC];
	TALLY_OK(&t);
	TALLY_OK(&mg.t);
	CHECK(nospc, "device memory never ran out (%ld allocations)", allocs);
	CHECK(mg.moved, "no page migrated");
	munmap(mg.p, mg.len);
	for (k = 0; k < 3; k++)
		close(fds[k]);
	DETAIL("4 threads on 3 files: %ld ALLOCs (%ld ENOSPC), %ld FREEs, %ld map/unmaps; migrator moved %ld pages, %ld left behind for lack of space; %d live buffers at the stop disjoint, adding up with the free memory",
	       allocs, nospc, frees, maps, mg.moved, mg.no_space, n);
	(void)tb;
	return PASS;
}

/* ------------------------------------------------------------ health */

/*
 * Kernel log records that show a problem, since the last call (/dev/kmsg
 * was opened at the end of the log when the program started; the test
 * children share its position).
 */
static int kmsg_problems(char *first, size_t len)
{
	static const char * const bad[] = {
		"WARNING:", "BUG:", "Oops", "Call Trace", "general protection",
		"blocked for more than", "refcount_t", "list_add corruption",
		"list_del corruption", "UBSAN", "KASAN", "kfence",
		"bad page", "Bad page",
	};
	char rec[2048];
	int n = 0, prio;
	ssize_t r;
	unsigned int k;

	first[0] = 0;
	if (kmsg_fd < 0)
		return -1;
	for (;;) {
		r = read(kmsg_fd, rec, sizeof(rec) - 1);
		if (r < 0 && errno == EPIPE)
			continue;	/* overwritten records */
		if (r <= 0)
			break;
		rec[r] = 0;
		prio = atoi(rec) & 7;
		for (k = 0; k < ARRAY_SIZE(bad); k++)
			if (strstr(rec, bad[k]))
				break;
		/*
		 * errors anywhere, or warnings of the driver other than the
		 * expected "request quarantined" of commands that timed out
		 */
		if (k < ARRAY_SIZE(bad) || prio <= 3 ||
		    (prio == 4 && strstr(rec, "cxl") && !strstr(rec, "quarantined"))) {
			if (!n++) {
				char *msg = strchr(rec, ';');

				snprintf(first, len, "%s", msg ? msg + 1 : rec);
				first[strcspn(first, "\n")] = 0;
			}
		}
	}
	return n;
}

/*
 * After everything: the device answers with correct data, every counter of
 * leaks is zero, commands submitted = completed, and the kernel logged
 * nothing bad.
 */
CXLA_TEST_F(dev, health)
{
	const size_t len = 1 * MiB;
	struct cxl_accel_wait_event w = { 0 };
	struct cxl_accel_identify id;
	struct cxl_accel_hmm_info h;
	struct cxl_accel_alloc a;
	struct cxl_accel_atomic at;
	struct cxl_accel_migrate m;
	const char *names[2] = { c->name, c->peer_path ? c->peer_name : NULL };
	int fd = cxla_open_dev(c->path), d, k, problems;
	uint8_t *ram = malloc(len), *ram2 = malloc(len), *p, *anon;
	long sub = 0, comp = 0, live[3];
	char first[300], attr[64];
	uint64_t v;
	uint32_t crc;
	FILE *f;

	CHECK(fd >= 0 && ram && ram2, "open");
	OK(cxla_identify(fd, &id));
	CHECK(id.magic == 0x414c5843 && id.version_major == 1, "magic %#x version %u",
	      id.magic, id.version_major);
	CHECK(id.devmem_size == (uint64_t)cxla_sysfs_long(c->name, "devmem_size"),
	      "size %llu, sysfs %ld", (unsigned long long)id.devmem_size,
	      cxla_sysfs_long(c->name, "devmem_size"));
	CHECK(id.devmem_free == id.devmem_size && id.buffers == 0,
	      "%llu of %llu bytes free, %u buffers on the device",
	      (unsigned long long)id.devmem_free, (unsigned long long)id.devmem_size,
	      id.buffers);
	for (d = 0; d < 2; d++) {
		if (!names[d])
			continue;
		CHECK(cxla_sysfs_long(names[d], "buffers") == 0, "%s: %ld driver buffers",
		      names[d], cxla_sysfs_long(names[d], "buffers"));
		CHECK(cxla_sysfs_long(names[d], "quarantined") == 0, "%s: %ld quarantined",
		      names[d], cxla_sysfs_long(names[d], "quarantined"));
		for (k = 0; k < (int)NDB; k++) {
			snprintf(attr, sizeof(attr), "dmabuf/%s", db_live[k]);
			CHECK(cxla_sysfs_long(names[d], attr) == 0, "%s: %s = %ld", names[d],
			      attr, cxla_sysfs_long(names[d], attr));
		}
		/* quiet now: every command submitted came back */
		for (k = 0; k < 50; k++) {
			sub = cxla_sysfs_long(names[d], "commands_submitted");
			comp = cxla_sysfs_long(names[d], "commands_completed");
			if (sub == comp)
				break;
			usleep(20000);
		}
		CHECK(sub == comp && sub > 0, "%s: %ld commands submitted, %ld completed",
		      names[d], sub, comp);
	}
	CHECK(cxla_sysfs_long(c->name, "protocol_errors") == protocol_at_start,
	      "protocol errors %ld, %ld at the start", cxla_sysfs_long(c->name, "protocol_errors"),
	      protocol_at_start);
	snprintf(attr, sizeof(attr), "/sys/class/cxl-accel/%s/dmabuf/module_live", c->name);
	f = fopen(attr, "r");
	CHECK(f && fscanf(f, "%ld %ld %ld", &live[0], &live[1], &live[2]) == 3,
	      "module_live");
	fclose(f);
	CHECK(!live[0] && !live[1] && !live[2], "module-wide live exports %ld attachments %ld imports %ld",
	      live[0], live[1], live[2]);
	OK(cxla_hmm_info(fd, &h));
	CHECK(!h.pool_chunks && !h.pool_pages_used && !h.svm_mirrors,
	      "pool %llu chunks, %llu pages used, %llu SVM mirrors",
	      (unsigned long long)h.pool_chunks, (unsigned long long)h.pool_pages_used,
	      (unsigned long long)h.svm_mirrors);

	/* the device still computes right */
	fill_random(ram, len, c->seed);
	OK(cxla_alloc(fd, len, 0, &a));
	p = cxla_map(fd, &a);
	CHECK(p, "mmap");
	OK(cxla_copy(fd, cxla_user(ram), cxla_dev(a.handle, 0), len, 0));
	CHECK(!memcmp(p, ram, len), "COPY into device memory wrong");
	OK(cxla_checksum(fd, cxla_dev(a.handle, 0), len, 0, &crc));
	CHECK(crc == crc32c(0, ram, len), "CHECKSUM %#x, expected %#x", crc,
	      crc32c(0, ram, len));
	OK(cxla_copy(fd, cxla_dev(a.handle, 0), cxla_user(ram2), len, 0));
	CHECK(!memcmp(ram, ram2, len), "COPY back wrong");
	OK(cxla_fill(fd, cxla_dev(a.handle, 100), 1000, 0x0101010101010101ULL, 0));
	CHECK(cxla_all_bytes(p + 100, 1000, 1) && p[99] == ram[99] && p[1100] == ram[1100],
	      "FILL wrong");
	memset(p, 0, 8);
	OK(cxla_atomic(fd, cxla_dev(a.handle, 0), CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 3, 0,
		       1000, 0, &at));
	CHECK(*(uint64_t *)p == 3000 && at.count == 1000, "ATOMIC: %llu",
	      (unsigned long long)*(uint64_t *)p);
	OK(signal_dev(fd, 0x4ea17));
	w.type = CXL_ACCEL_EVENT_SIGNAL;
	w.flags = CXL_ACCEL_WAIT_MATCH_VALUE;
	w.value = 0x4ea17;
	w.timeout_ms = 2000;
	OK(cxla_ioctl(fd, CXL_ACCEL_IOC_WAIT_EVENT, &w));
	anon = map_anon(len);
	CHECK(anon, "mmap");
	memcpy(anon, ram, len);
	OK(cxla_migrate(fd, anon, len, true, &m));
	CHECK(m.migrated == len / PG, "%llu pages migrated", (unsigned long long)m.migrated);
	v = 0;
	OK(cxla_svm(fd, CXL_ACCEL_SVM_CHECKSUM, anon, len, 0, 0, &v, NULL));
	CHECK((uint32_t)v == crc32c(0, ram, len), "SVM CHECKSUM on device pages");
	OK(cxla_migrate(fd, anon, len, false, &m));
	CHECK(!memcmp(anon, ram, len), "data after migrating back");
	munmap(anon, len);
	munmap(p, len);
	OK(cxla_free(fd, a.handle));
	close(fd);
	free(ram);
	free(ram2);

	problems = kmsg_problems(first, sizeof(first));
	CHECK(problems >= 0, "/dev/kmsg unreadable");
	CHECK(!problems, "%d kernel log records with problems during the run, first: %s",
	      problems, first);
	DETAIL("IDENTIFY right, all memory free, no buffers, quarantined commands, DMA-BUF objects, pool pages or mirrors left, submitted = completed, protocol errors unchanged; COPY, CHECKSUM, FILL, ATOMIC, SIGNAL, migration and SVM right; kernel log clean");
	return PASS;
}

/* ---------------------------------------------------------- fixture */

static uint64_t name_hash(const char *s)
{
	uint64_t h = 1469598103934665603ULL;

	while (*s)
		h = (h ^ (uint8_t)*s++) * 1099511628211ULL;
	return h;
}

/* open the devices, remember their state */
FIXTURE_SETUP(dev)
{
	struct cxl_accel_hmm_info h;
	int r = cxla_open_devs(&c->devs, CXLA_PEER_IF_GIVEN);

	if (r != PASS)
		return r;
	snprintf(c->name, sizeof(c->name), "cxl-accel%u", c->id.minor);
	if (c->pfd >= 0)
		snprintf(c->peer_name, sizeof(c->peer_name), "cxl-accel%u",
			 c->pid.minor);
	if (cxla_hmm_info(c->fd, &h) || !(h.flags & CXL_ACCEL_HMM_COHERENT)) {
		DETAIL("device memory is not coherent ZONE_DEVICE memory");
		return SKIP;
	}
	if (get_state(c->name, c->fd, &c->base) ||
	    (c->pfd >= 0 && get_state(c->peer_name, c->pfd, &c->pbase))) {
		DETAIL("cannot read the state of the devices");
		return FAIL;
	}
	c->seed = name_hash(cxla_current->name) ^ c->id.minor;
	return PASS;
}

/* nothing left behind, nothing in the kernel log */
FIXTURE_TEARDOWN(dev)
{
	char first[300];
	int n;

	if (verdict == PASS && wait_for_base_state(c))
		verdict = FAIL;
	/* the kernel log since the last test (each test reads its part) */
	n = kmsg_problems(first, sizeof(first));
	if (n && verdict == PASS) {
		DETAIL(n < 0 ? "/dev/kmsg unreadable" :
		       "%d kernel log records with problems, first: %s", n, first);
		verdict = FAIL;
	}
	return verdict;
}

/* the log from here on, and the protocol errors so far */
static int prologue(void)
{
	struct cxl_accel_identify id;
	char name[32];
	int fd = cxla_open_dev(cxla_opt.dev);

	if (fd < 0 || cxla_identify(fd, &id)) {
		cxla_result("open", FAIL, "%s: %s", cxla_opt.dev, strerror(errno));
		return 1;
	}
	close(fd);
	snprintf(name, sizeof(name), "cxl-accel%u", id.minor);
	protocol_at_start = cxla_sysfs_long(name, "protocol_errors");
	kmsg_fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (kmsg_fd >= 0)
		lseek(kmsg_fd, 0, SEEK_END);
	return 0;
}

CXLA_PROGRAM(.name = "race-tests", .prefix = "race.", .timeout_s = TEST_TIMEOUT_S,
	     .prologue = prologue);
