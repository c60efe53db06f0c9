// SPDX-License-Identifier: GPL-2.0
/*
 * Fault injection tests: what user space sees when the device misbehaves,
 * each fault injected from the host through the daemon's control channel
 * while this program works (tests/guest/host/run-faults.sh).
 *
 * Talking to the host: a request is one console line
 *
 *   CXLA-CTL <seq> <device index> <ctl arguments>[; <ctl arguments>...] CXLA-END
 *
 * which the host (tests/guest/host/fault-host.py) runs as "cxl-accel ctl --json
 * ..." against that device's daemon, answering on the second serial port
 * (/dev/ttyS1) with "CXLA-ACK <seq> <exit code> <JSON reply of the last
 * command>". A request whose answer does not come is sent again with the
 * same sequence number: the host answers it again without running it twice
 * (a kernel message may have cut the line on the console).
 *
 * Every test is one child process of the runner (cxla_test.h) and prints a
 * RESULT line. Usage:
 *   fault-tests [-d dev] [-P peer] [-p prefix] [-t test]... [-l] [--supervised]
 *   fault-tests --bench -d dev -P dev-without-control-socket [-p prefix]
 *   fault-tests --cxl-registers [-p prefix]   (the register table, below)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <termios.h>

#include "cxla_harness.h"

#define PG		4096UL
#define MIB		(1UL << 20)
#define TEST_TIMEOUT_S	180
#define ANSWER_WAIT_S	10	/* per attempt */
#define ANSWER_TRIES	6

/* one test's device; the tests open it themselves (one unbinds it) */
FIXTURE(fault) {
	CXLA_DEVS;
	char name[32];		/* cxl-accelN */
	int index;		/* device_index: the daemon the host talks to */
	bool supervised;	/* the daemon runs under --supervise */
};

/* ------------------------------------------------------- the host */

static int con_fd = -1;		/* requests: the console */
static int ser_fd = -1;		/* answers: ttyS1, raw */
static unsigned int *seqp;	/* shared by the test processes */
static char reply[65536];	/* the last answer's JSON */

static int host_open(void)
{
	struct termios t;

	con_fd = open("/dev/console", O_WRONLY | O_NOCTTY);
	ser_fd = open("/dev/ttyS1", O_RDWR | O_NOCTTY);
	if (con_fd < 0 || ser_fd < 0)
		return -1;
	if (tcgetattr(ser_fd, &t))
		return -1;
	cfmakeraw(&t);
	t.c_cc[VMIN] = 1;
	t.c_cc[VTIME] = 0;
	if (tcsetattr(ser_fd, TCSANOW, &t))
		return -1;
	tcflush(ser_fd, TCIFLUSH);
	seqp = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		    -1, 0);
	if (seqp == MAP_FAILED)
		return -1;
	/* unique across the programs of a boot: the host remembers answers */
	*seqp = (unsigned int)getpid() * 100000u;
	return 0;
}

/*
 * One line from ttyS1 into buf, byte by byte (nothing of the next line is
 * taken from the tty); -1 when none came by the deadline.
 */
static int read_line(char *buf, size_t len, double deadline)
{
	struct pollfd p = { .fd = ser_fd, .events = POLLIN };
	size_t n = 0;
	char ch;

	for (;;) {
		int ms = (int)((deadline - now_sec()) * 1000);

		if (ms <= 0 || poll(&p, 1, ms) <= 0)
			return -1;
		if (read(ser_fd, &ch, 1) != 1)
			return -1;
		if (ch == '\r')
			continue;
		if (ch == '\n') {
			buf[n] = 0;
			return (int)n;
		}
		if (n + 1 < len)
			buf[n++] = ch;
	}
}

/*
 * Run "cxl-accel ctl" commands (';' between them) on the host against the
 * daemon of device index; the exit code, or -1 without an answer. The
 * last command's JSON reply is in reply[].
 */
static int host_to(int index, const char *fmt, ...)
{
	static char line[sizeof(reply) + 64];
	char cmd[4096], req[4200];
	unsigned int seq, s;
	int rc, off, len, tries;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	seq = __atomic_add_fetch(seqp, 1, __ATOMIC_SEQ_CST);
	len = snprintf(req, sizeof(req), "\nCXLA-CTL %u %d %s CXLA-END\n", seq,
		       index, cmd);
	reply[0] = 0;
	for (tries = 0; tries < ANSWER_TRIES; tries++) {
		double deadline = now_sec() + ANSWER_WAIT_S;

		if (write(con_fd, req, len) != len)
			return -1;
		while (read_line(line, sizeof(line), deadline) >= 0) {
			off = 0;
			if (sscanf(line, "CXLA-ACK %u %d %n", &s, &rc, &off) == 2 &&
			    s == seq && off) {
				snprintf(reply, sizeof(reply), "%s", line + off);
				return rc;
			}
		}
	}
	return -1;
}

#define host(c, ...)	host_to((c)->index, __VA_ARGS__)

/* A host request that must succeed */
#define HOST(c, ...) do {						\
	int __r = host(c, __VA_ARGS__);					\
	if (__r)							\
		FAILF("%s:%d: host \"%.60s\" answered %d: %.200s",	\
		      __func__, __LINE__, #__VA_ARGS__, __r,		\
		      __r < 0 ? "no answer from the host" : reply);	\
} while (0)

/* A number (or true/false as 1/0) after "key": in reply; -1 if absent */
static long long json_num(const char *json, const char *key)
{
	char k[64];
	const char *p;

	snprintf(k, sizeof(k), "\"%s\":", key);
	p = strstr(json, k);
	if (!p)
		return -1;
	p += strlen(k);
	if (!strncmp(p, "true", 4))
		return 1;
	if (!strncmp(p, "false", 5))
		return 0;
	return strtoll(p, NULL, 10);
}

/* How often key occurs in the reply */
static int json_count(const char *json, const char *key)
{
	char k[64];
	int n = 0;

	snprintf(k, sizeof(k), "\"%s\":", key);
	for (json = strstr(json, k); json; json = strstr(json + 1, k))
		n++;
	return n;
}

/* -------------------------------------------------------- helpers */

static long sys_long(FIXTURE_DATA(fault) *c, const char *attr)
{
	return cxla_sysfs_long(c->name, attr);
}

static int sys_read(FIXTURE_DATA(fault) *c, const char *attr, char *buf, size_t len)
{
	char p[256];
	ssize_t n;
	int fd;

	snprintf(p, sizeof(p), "/sys/class/cxl-accel/%s/%s", c->name, attr);
	fd = open(p, O_RDONLY);
	if (fd < 0)
		return -1;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = 0;
	return 0;
}

static int sys_write(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY), ok;

	if (fd < 0)
		return -1;
	ok = write(fd, val, strlen(val)) == (ssize_t)strlen(val);
	close(fd);
	return ok ? 0 : -1;
}

static long long dstat(FIXTURE_DATA(fault) *c, int idx)
{
	struct cxl_accel_stats st;

	return cxla_stats(c->fd, &st) ? -1 : (long long)st.driver[idx];
}

static long long devstat(FIXTURE_DATA(fault) *c, int idx)
{
	struct cxl_accel_stats st;

	return cxla_stats(c->fd, &st) ? -1 : (long long)st.device[idx];
}

static int copy_t(int fd, struct cxl_accel_mem src, struct cxl_accel_mem dst,
		  uint64_t len, uint32_t timeout_ms)
{
	struct cxl_accel_copy cp = {
		.src = src, .dst = dst, .len = len, .timeout_ms = timeout_ms,
	};

	return cxla_ioctl(fd, CXL_ACCEL_IOC_COPY, &cp);
}

/* A buffer of size bytes, mapped (map may be NULL: not mapped) */
struct dbuf {
	struct cxl_accel_alloc a;
	uint8_t *p;
};

static int dbuf_new(FIXTURE_DATA(fault) *c, struct dbuf *b, size_t size, bool map)
{
	int r = cxla_alloc(c->fd, size, 0, &b->a);

	b->p = NULL;
	if (r)
		return r;
	if (map) {
		b->p = cxla_map(c->fd, &b->a);
		if (!b->p)
			return -errno;
	}
	return 0;
}

static void dbuf_del(FIXTURE_DATA(fault) *c, struct dbuf *b)
{
	if (b->p)
		munmap(b->p, b->a.alloc_size);
	b->p = NULL;
	if (b->a.handle)
		cxla_free(c->fd, b->a.handle);
	b->a.handle = 0;
}

/*
 * The end of a test: nothing of it may be left once it let go of its
 * buffers and mappings: no quarantined request, no buffer, no pool chunk,
 * no DMA-BUF. Waits up to 10 s for deferred work; 0 or -1 (detail set).
 */
static int settled(FIXTURE_DATA(fault) *c)
{
	struct cxl_accel_hmm_info h = { 0 };
	double t0 = now_sec();
	long q = -1, b = -1, e = -1;

	do {
		if (cxla_hmm_info(c->fd, &h))
			memset(&h, 0xff, sizeof(h));
		q = sys_long(c, "quarantined");
		b = sys_long(c, "buffers");
		e = sys_long(c, "dmabuf/exports");
		if (!q && !b && !e && !h.pool_chunks && !h.pool_pages_used)
			return 0;
		usleep(100000);
	} while (now_sec() - t0 < 10);
	DETAIL("left behind: %ld quarantined requests, %ld buffers, %ld DMA-BUFs, %llu pool chunks, %llu pool pages used",
	       q, b, e, (unsigned long long)h.pool_chunks,
	       (unsigned long long)h.pool_pages_used);
	return -1;
}

#define SETTLED(c) do { if (settled(c)) return FAIL; } while (0)

/* Wait (up to secs) until sysfs attr reads want; the last value read */
static long wait_sys(FIXTURE_DATA(fault) *c, const char *attr, long want, double secs)
{
	double t0 = now_sec();
	long v;

	while ((v = sys_long(c, attr)) != want && now_sec() - t0 < secs)
		usleep(20000);
	return v;
}

/* The poisoned ranges the driver lists in sysfs */
static int poison_lines(FIXTURE_DATA(fault) *c)
{
	char buf[4096], *p;
	int n = 0;

	if (sys_read(c, "poison", buf, sizeof(buf)))
		return -1;
	for (p = buf; (p = strchr(p, '\n')); p++)
		n++;
	return n;
}

/* Wait until the driver lists n poisoned ranges (it acts from a work item) */
static int wait_poison(FIXTURE_DATA(fault) *c, int n)
{
	double t0 = now_sec();

	while (poison_lines(c) != n && now_sec() - t0 < 10)
		usleep(20000);
	return poison_lines(c);
}

/*
 * The SIGBUS code of an access to poisoned memory: BUS_MCEERR_AR where the
 * kernel has CONFIG_MEMORY_FAILURE (its sysctls show it), else the kernel
 * only says BUS_ADRERR.
 */
static int poison_code(void)
{
	return access("/proc/sys/vm/memory_failure_early_kill", F_OK) ?
	       BUS_ADRERR : BUS_MCEERR_AR;
}

static const char *poison_code_name(void)
{
	return poison_code() == BUS_MCEERR_AR ? "BUS_MCEERR_AR" :
	       "BUS_ADRERR, no CONFIG_MEMORY_FAILURE";
}

/*
 * Read one byte: 0 (*val set), or the si_code of the SIGBUS it raised
 * (BUS_MCEERR_AR = 4), or -1 for another signal.
 */
static int read_bus_code(const volatile uint8_t *p, uint8_t *val)
{
	int code = -1, sig = cxla_probe_read(p, val, &code);

	return !sig ? 0 : sig == SIGBUS && code ? code : -1;
}

/* Device-memory offsets of n pages at p (from /proc/self/pagemap); -1 if not there */
static int dev_offsets(FIXTURE_DATA(fault) *c, const void *p, size_t n, int64_t *off)
{
	int fd = open("/proc/self/pagemap", O_RDONLY);
	size_t i;

	if (fd < 0)
		return -1;
	for (i = 0; i < n; i++) {
		uint64_t e, pa;
		off_t at = ((uintptr_t)p / PG + i) * 8;

		off[i] = -1;
		if (pread(fd, &e, 8, at) != 8)
			continue;
		if (!(e >> 63))
			continue;
		pa = (e & ((1ULL << 55) - 1)) * PG;
		if (pa >= c->id.devmem_gpa && pa < c->id.devmem_gpa + c->id.devmem_size)
			off[i] = (int64_t)(pa - c->id.devmem_gpa);
	}
	close(fd);
	return 0;
}

/* ------------------------------------------------------------ tests */

/* The control channel answers for our device */
CXLA_TEST_F(fault, host_channel)
{
	HOST(c, "info");
	CHECK(json_num(reply, "index") == c->index,
	      "the host's daemon has index %lld, this device %d: %.200s",
	      json_num(reply, "index"), c->index, reply);
	CHECK(json_num(reply, "memory_size") == (long long)c->id.devmem_size,
	      "memory size %lld, IDENTIFY says %llu", json_num(reply, "memory_size"),
	      (unsigned long long)c->id.devmem_size);
	CHECK(json_num(reply, "stalled") == 0, "the daemon is stalled: %.200s", reply);
	DETAIL("daemon pid %lld serves device index %d (%s), trace %s",
	       json_num(reply, "pid"), c->index, c->name,
	       json_num(reply, "trace") == 1 ? "on" : "off");
	HOST(c, "fault clear; fault list");
	CHECK(json_count(reply, "fired") == 0, "rules left: %.200s", reply);
	return PASS;
}

static const struct {
	const char *status;
	int err;
} status_errno[] = {
	{ "UNSUPPORTED", EOPNOTSUPP }, { "INVALID", EINVAL },
	{ "TRUNCATED", EIO }, { "BAD_GPA", EFAULT }, { "BAD_DEVMEM", EFAULT },
	{ "OVERFLOW", EINVAL }, { "UNALIGNED", EINVAL }, { "TOO_LARGE", E2BIG },
	{ "LENGTH_MISMATCH", EINVAL }, { "NO_SPACE", ENOSPC },
	{ "NOT_FOUND", ENOENT }, { "BAD_CHAIN", EIO }, { "NOT_READY", EAGAIN },
	{ "EXISTS", EEXIST }, { "INTERNAL", EIO }, { "INTERRUPTED", EIO },
	{ "MEDIA_ERROR", EIO },
};

/*
 * Every error status the device can answer, injected into COPY: the
 * documented errno, counted as a device error (not a protocol error), and
 * the next command works.
 */
CXLA_TEST_F(fault, error_status)
{
	char cmds[4096];
	size_t n = 0, i;
	struct dbuf s, d;
	long long err0, proto0;
	int r;

	OK(dbuf_new(c, &s, 64 * 1024, true));
	OK(dbuf_new(c, &d, 64 * 1024, true));
	memset(s.p, 0x3c, 64 * 1024);
	/* rule i fires on COPY 2i+1: every failure is followed by a good copy */
	n += snprintf(cmds + n, sizeof(cmds) - n, "fault clear");
	for (i = 0; i < ARRAY_SIZE(status_errno); i++)
		n += snprintf(cmds + n, sizeof(cmds) - n,
			      "; fault add --opcode COPY --nth %zu --fail %s",
			      2 * i + 1, status_errno[i].status);
	HOST(c, "%s", cmds);
	err0 = dstat(c, CXL_ACCEL_DSTAT_ERRORS);
	proto0 = dstat(c, CXL_ACCEL_DSTAT_PROTOCOL);
	for (i = 0; i < ARRAY_SIZE(status_errno); i++) {
		memset(d.p, 0, 64 * 1024);
		r = copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(d.a.handle, 0),
			   64 * 1024, 5000);
		CHECK(r == -status_errno[i].err, "status %s: COPY returned %d (%s), expected -%s",
		      status_errno[i].status, r, r ? strerror(-r) : "ok",
		      strerror(status_errno[i].err));
		r = copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(d.a.handle, 0),
			   64 * 1024, 5000);
		CHECK(!r && d.p[0] == 0x3c && d.p[64 * 1024 - 1] == 0x3c,
		      "the COPY after status %s: %d (%s), data %#x",
		      status_errno[i].status, r, r ? strerror(-r) : "ok", d.p[0]);
	}
	CHECK(dstat(c, CXL_ACCEL_DSTAT_ERRORS) - err0 == (long long)ARRAY_SIZE(status_errno),
	      "command_errors went up by %lld, expected %zu",
	      dstat(c, CXL_ACCEL_DSTAT_ERRORS) - err0, ARRAY_SIZE(status_errno));
	CHECK(dstat(c, CXL_ACCEL_DSTAT_PROTOCOL) == proto0,
	      "protocol_errors went up by %lld", dstat(c, CXL_ACCEL_DSTAT_PROTOCOL) - proto0);
	HOST(c, "fault list");
	CHECK(json_count(reply, "fired") == (int)ARRAY_SIZE(status_errno) &&
	      !strstr(reply, "\"fired\":0"), "not every rule fired: %.300s", reply);
	HOST(c, "fault clear");
	dbuf_del(c, &s);
	dbuf_del(c, &d);
	SETTLED(c);
	DETAIL("%zu statuses injected into COPY: each gave its errno (MEDIA_ERROR -EIO), counted in command_errors, no protocol error, the next COPY worked",
	       ARRAY_SIZE(status_errno));
	return PASS;
}

/*
 * Responses the protocol does not allow: a status above the highest one it
 * defines, a used length shorter than a response. Both are protocol errors
 * (-EIO, counted, logged); the driver goes on and later commands work.
 */
CXLA_TEST_F(fault, corrupted_responses)
{
	long long proto0, err0;
	struct dbuf s, d;
	int r;

	OK(dbuf_new(c, &s, 64 * 1024, true));
	OK(dbuf_new(c, &d, 64 * 1024, true));
	memset(s.p, 0x77, 64 * 1024);
	HOST(c, "fault clear; fault add --opcode COPY --nth 1 --corrupt-status; "
		"fault add --opcode COPY --nth 3 --corrupt-length; "
		"fault add --opcode NOP --nth 1 --corrupt-status; "
		"fault add --opcode NOP --nth 2 --corrupt-length");
	proto0 = dstat(c, CXL_ACCEL_DSTAT_PROTOCOL);
	err0 = dstat(c, CXL_ACCEL_DSTAT_ERRORS);
	r = copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(d.a.handle, 0), 64 * 1024, 5000);
	EXPECT_ERR(r, EIO);
	OK(copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(d.a.handle, 0), 64 * 1024, 5000));
	r = copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(d.a.handle, 0), 64 * 1024, 5000);
	EXPECT_ERR(r, EIO);
	memset(d.p, 0, 64 * 1024);
	OK(copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(d.a.handle, 0), 64 * 1024, 5000));
	CHECK(d.p[0] == 0x77 && d.p[64 * 1024 - 1] == 0x77, "COPY after the corrupted ones: data %#x", d.p[0]);
	EXPECT_ERR(cxla_nop(c->fd, 5000), EIO);
	EXPECT_ERR(cxla_nop(c->fd, 5000), EIO);
	OK(cxla_nop(c->fd, 5000));
	CHECK(dstat(c, CXL_ACCEL_DSTAT_PROTOCOL) - proto0 == 4,
	      "protocol_errors went up by %lld, expected 4",
	      dstat(c, CXL_ACCEL_DSTAT_PROTOCOL) - proto0);
	CHECK(dstat(c, CXL_ACCEL_DSTAT_ERRORS) == err0,
	      "command_errors went up by %lld (protocol errors are not device errors)",
	      dstat(c, CXL_ACCEL_DSTAT_ERRORS) - err0);
	HOST(c, "fault clear");
	dbuf_del(c, &s);
	dbuf_del(c, &d);
	SETTLED(c);
	DETAIL("undefined status (0xdead) and short used length (3 bytes) on COPY and NOP: -EIO, protocol_errors +4, command_errors +0, the next commands worked");
	return PASS;
}

/* A line "name N" of a sysfs file of the device; -1 when missing */
static long long sys_field(FIXTURE_DATA(fault) *c, const char *attr,
			   const char *name)
{
	static char buf[8192];
	const char *l;
	size_t n = strlen(name);

	if (sys_read(c, attr, buf, sizeof(buf)))
		return -1;
	for (l = buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (!strncmp(l, name, n) && l[n] == ' ')
			return strtoll(l + n + 1, NULL, 0);
	return -1;
}

#define PARAM(name)	"/sys/module/cxl_accel/parameters/" name

/*
 * A device that answers OK without copying (--skip on COPY_PAGES) would map
 * stale device memory into the process. With verify_copies the driver
 * compares each destination with its source before the kernel maps it: the
 * pages of the skipped copy stay where they were, the next pass moves them,
 * and the data is whole.
 */
CXLA_TEST_F(fault, skipped_copy_caught)
{
	const size_t n = 128;
	struct cxl_accel_migrate mg;
	struct cxl_accel_hmm_info h;
	char cpu_copy[32] = "64";
	long long mism0, fired;
	uint8_t *p, *ref;
	int fd;
	ssize_t got;

	OK(cxla_hmm_info(c->fd, &h));
	if (!(h.flags & CXL_ACCEL_HMM_COHERENT)) {
		DETAIL("no coherent device memory (flags %#x)", h.flags);
		return SKIP;
	}
	fd = open(PARAM("cpu_copy_pages"), O_RDONLY);
	CHECK(fd >= 0, "cpu_copy_pages: %s", strerror(errno));
	got = read(fd, cpu_copy, sizeof(cpu_copy) - 1);
	close(fd);
	cpu_copy[got > 0 ? got : 0] = 0;
	p = map_anon(n * PG);
	ref = malloc(n * PG);
	CHECK(p && ref, "memory");
	fill_random(ref, n * PG, 27);
	memcpy(p, ref, n * PG);
	/* the device copies every window, and the driver checks each page */
	OK(sys_write(PARAM("cpu_copy_pages"), "0"));
	OK(sys_write(PARAM("verify_copies"), "1"));
	mism0 = sys_field(c, "migration", "copy_mismatches");
	HOST(c, "fault clear; fault add --opcode COPY_PAGES --nth 1 --skip");
	memset(&mg, 0, sizeof(mg));
	got = cxla_migrate(c->fd, p, n * PG, true, &mg);
	sys_write(PARAM("verify_copies"), "0");
	sys_write(PARAM("cpu_copy_pages"), cpu_copy);
	HOST(c, "fault list");
	fired = json_num(reply, "fired");
	HOST(c, "fault clear");
	OK(got);
	CHECK(fired == 1, "the skip rule fired %lld times", fired);
	CHECK(sys_field(c, "migration", "copy_mismatches") > mism0,
	      "copy_mismatches did not go up (%lld before)", mism0);
	CHECK(mg.migrated == n, "%llu of %zu pages migrated (busy %llu)",
	      (unsigned long long)mg.migrated, n, (unsigned long long)mg.busy);
	CHECK(!memcmp(p, ref, n * PG), "data differs on the device");
	OK(cxla_migrate(c->fd, p, n * PG, false, &mg));
	CHECK(!memcmp(p, ref, n * PG), "data differs back in RAM");
	munmap(p, n * PG);
	free(ref);
	SETTLED(c);
	DETAIL("COPY_PAGES answered OK without copying: %lld pages caught by verify_copies and moved by the next pass, %zu pages whole there and back",
	       sys_field(c, "migration", "copy_mismatches") - mism0, n);
	return PASS;
}

/* Wait until cxl_ras's field name reaches want; its value */
static long long wait_ras(FIXTURE_DATA(fault) *c, const char *name,
			  long long want)
{
	long long v = -1;
	int i;

	for (i = 0; i < 100; i++) {
		v = sys_field(c, "cxl_ras", name);
		if (v >= want)
			break;
		usleep(50 * 1000);
	}
	return v;
}

static int ras_mask(FIXTURE_DATA(fault) *c, const char *masks)
{
	char p[256];

	snprintf(p, sizeof(p), "/sys/class/cxl-accel/%s/cxl_ras_mask", c->name);
	return sys_write(p, masks);
}

/*
 * CXL RAS errors raised through the control channel (--attach cxl): each
 * class reaches the driver's handler, which logs it and clears the status
 * as the kernel's CXL code does; a masked error stays in the status
 * register unsignalled, and the next handled error clears it with its own;
 * several uncorrectable bits report the first error's bit and header log.
 */
CXLA_TEST_F(fault, cxl_ras)
{
	char buf[1024];
	long long ce0, ue0, rec0;

	if (sys_read(c, "cxl_ras", buf, sizeof(buf)) || !strncmp(buf, "none", 4)) {
		DETAIL("not a CXL endpoint (no RAS registers): --attach cxl has them");
		return SKIP;
	}
	ce0 = sys_field(c, "cxl_ras", "correctable_events");
	ue0 = sys_field(c, "cxl_ras", "uncorrectable_events");
	rec0 = sys_field(c, "cxl_ras", "recoveries");

	/* correctable */
	HOST(c, "ras --correctable 3");
	CHECK(json_num(reply, "unmasked") == 1, "not signalled: %.200s", reply);
	CHECK(wait_ras(c, "correctable_events", ce0 + 1) == ce0 + 1,
	      "correctable_events %lld, expected %lld",
	      sys_field(c, "cxl_ras", "correctable_events"), ce0 + 1);
	CHECK(sys_field(c, "cxl_ras", "last_correctable_status") == 0x8,
	      "last_correctable_status %#llx",
	      sys_field(c, "cxl_ras", "last_correctable_status"));
	HOST(c, "ras");
	CHECK(json_num(reply, "correctable_status") == 0, "status not cleared: %.200s", reply);

	/* uncorrectable, with its header log */
	HOST(c, "ras --uncorrectable 14 --header 0x11,0x22,0x33,0x44");
	CHECK(wait_ras(c, "uncorrectable_events", ue0 + 1) == ue0 + 1,
	      "uncorrectable_events %lld, expected %lld",
	      sys_field(c, "cxl_ras", "uncorrectable_events"), ue0 + 1);
	OK(sys_read(c, "cxl_ras", buf, sizeof(buf)));
	CHECK(sys_field(c, "cxl_ras", "last_uncorrectable_status") == 0x4000 &&
	      sys_field(c, "cxl_ras", "last_first_error") == 0x4000 &&
	      strstr(buf, "last_header_log 00000011 00000022 00000033 00000044"),
	      "what the driver logged: %s", buf);
	HOST(c, "ras");
	CHECK(json_num(reply, "uncorrectable_status") == 0, "status not cleared: %.200s", reply);
	/* fatal by default (severity): the driver recovers (cxl_ras_recovery) */
	CHECK(wait_ras(c, "recoveries", rec0 + 1) == rec0 + 1, "no recovery after a fatal error");

	/* masked: set, not signalled; the next handled error clears it too */
	OK(ras_mask(c, "0 0x4"));
	HOST(c, "ras --correctable 2");
	CHECK(json_num(reply, "unmasked") == 0, "a masked error was signalled: %.200s", reply);
	usleep(300 * 1000);
	CHECK(sys_field(c, "cxl_ras", "correctable_events") == ce0 + 1,
	      "a masked error reached the handler");
	HOST(c, "ras");
	CHECK(json_num(reply, "correctable_status") == 0x4, "status %.200s", reply);
	OK(ras_mask(c, "0 0"));
	HOST(c, "ras --correctable 1");
	CHECK(wait_ras(c, "correctable_events", ce0 + 2) == ce0 + 2, "the unmasked error after it was not handled");
	CHECK(sys_field(c, "cxl_ras", "last_correctable_status") == 0x6,
	      "last_correctable_status %#llx, expected both bits",
	      sys_field(c, "cxl_ras", "last_correctable_status"));

	/* two uncorrectable bits: the first error pointer and its header */
	OK(ras_mask(c, "0x20 0"));
	HOST(c, "ras --uncorrectable 5 --header 0xa1,0xa2");
	OK(ras_mask(c, "0 0"));
	HOST(c, "ras --uncorrectable 8 --header 0xb1,0xb2");
	CHECK(wait_ras(c, "uncorrectable_events", ue0 + 2) == ue0 + 2, "the second uncorrectable error was not handled");
	OK(sys_read(c, "cxl_ras", buf, sizeof(buf)));
	CHECK(sys_field(c, "cxl_ras", "last_uncorrectable_status") == 0x120 &&
	      sys_field(c, "cxl_ras", "last_first_error") == 0x20 &&
	      strstr(buf, "last_header_log 000000a1 000000a2 00000000 00000000"),
	      "two errors, the first bit 5: %s", buf);
	HOST(c, "ras");
	CHECK(json_num(reply, "uncorrectable_status") == 0 &&
	      json_num(reply, "correctable_status") == 0, "not cleared: %.200s", reply);
	CHECK(wait_ras(c, "recoveries", rec0 + 2) == rec0 + 2, "no recovery after the second fatal error");
	SETTLED(c);
	DETAIL("correctable (bit 3), uncorrectable with header log (bit 14), masked (held, cleared with the next), two uncorrectable (first error bit 5 and its header): each handled and cleared by the driver");
	return PASS;
}

/*
 * A fatal uncorrectable error (the severity register's default) while a
 * buffer holds data and pages are migrated to the device: the driver
 * recovers with a CXL Reset that keeps device memory, and nothing is lost.
 */
CXLA_TEST_F(fault, cxl_ras_recovery)
{
	const size_t n = 64;
	struct cxl_accel_migrate mg;
	long long rec0, rec;
	uint8_t *p, *ref;
	struct dbuf b;
	char buf[1024];
	double t0, t;
	uint32_t crc;

	if (sys_read(c, "cxl_ras", buf, sizeof(buf)) || !strncmp(buf, "none", 4)) {
		DETAIL("not a CXL endpoint (no RAS registers): --attach cxl has them");
		return SKIP;
	}
	CHECK(sys_field(c, "cxl_ras", "uncorrectable_severity") & (1 << 3),
	      "uncorrectable error bit 3 is not fatal: %s", buf);
	ref = malloc(n * PG);
	p = map_anon(n * PG);
	CHECK(ref && p, "memory");
	fill_random(ref, n * PG, 33);
	OK(dbuf_new(c, &b, n * PG, true));
	memcpy(b.p, ref, n * PG);
	memcpy(p, ref, n * PG);
	OK(cxla_migrate(c->fd, p, n * PG, true, &mg));
	rec0 = sys_field(c, "cxl_ras", "recoveries");

	t0 = now_sec();
	HOST(c, "ras --uncorrectable 3 --header 0x33");
	rec = wait_ras(c, "recoveries", rec0 + 1);
	t = now_sec() - t0;
	CHECK(rec == rec0 + 1, "recoveries %lld, expected %lld", rec, rec0 + 1);
	CHECK(sys_field(c, "cxl_ras", "last_recovery") == 0, "the recovery failed: %lld",
	      sys_field(c, "cxl_ras", "last_recovery"));
	CHECK(!memcmp(b.p, ref, n * PG), "the buffer changed through the recovery");
	CHECK(!memcmp(p, ref, n * PG), "the migrated pages changed");
	OK(cxla_checksum(c->fd, cxla_dev(b.a.handle, 0), n * PG, 0, &crc));
	CHECK(crc == crc32c(0, ref, n * PG), "the device reads other data");
	OK(cxla_migrate(c->fd, p, n * PG, true, &mg));
	CHECK(!memcmp(p, ref, n * PG), "the pages changed moving again");
	OK(cxla_migrate(c->fd, p, n * PG, false, &mg));
	munmap(p, n * PG);
	dbuf_del(c, &b);
	free(ref);
	SETTLED(c);
	DETAIL("fatal uncorrectable error (bit 3): recovered with a CXL Reset in %.0f ms; buffer and %zu migrated pages intact, device serving",
	       t * 1000, n);
	return PASS;
}

/* A completion that comes late, within the timeout: the command succeeds */
CXLA_TEST_F(fault, delayed_completion)
{
	long long to0 = dstat(c, CXL_ACCEL_DSTAT_TIMEOUTS);
	struct dbuf s, d;
	double t0, t;

	OK(dbuf_new(c, &s, MIB, true));
	OK(dbuf_new(c, &d, MIB, true));
	fill_random(s.p, MIB, 12);
	HOST(c, "fault clear; fault add --opcode COPY --nth 1 --delay-ms 1500");
	t0 = now_sec();
	OK(copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(d.a.handle, 0), MIB, 5000));
	t = now_sec() - t0;
	CHECK(t >= 1.45, "the delayed COPY took %.2f s, the rule says 1.5 s", t);
	CHECK(!memcmp(s.p, d.p, MIB), "data of the delayed COPY differs");
	CHECK(dstat(c, CXL_ACCEL_DSTAT_TIMEOUTS) == to0, "a timeout was counted");
	t0 = now_sec();
	OK(copy_t(c->fd, cxla_dev(d.a.handle, 0), cxla_dev(s.a.handle, 0), MIB, 5000));
	HOST(c, "fault clear");
	dbuf_del(c, &s);
	dbuf_del(c, &d);
	SETTLED(c);
	DETAIL("COPY delayed by 1.5 s with a 5 s timeout: succeeded after %.2f s, data intact, no timeout counted", t);
	return PASS;
}

/*
 * One device's deferred work never holds up another: the last reference
 * to a buffer goes with its munmap, and the FREE it sends from the driver's
 * workqueue is delayed by the host for 3 s. Meanwhile IDENTIFY on the other
 * device answers at once; on this one it waits for that FREE, so that its
 * free count is exact.
 */
CXLA_TEST_F(fault, deferred_free_per_device)
{
	struct cxl_accel_identify id0, id;
	double t0, t_peer, t_own;
	struct dbuf b;

	if (c->pfd < 0) {
		DETAIL("needs a second device (-P)");
		return SKIP;
	}
	OK(cxla_identify(c->fd, &id0));
	OK(dbuf_new(c, &b, MIB, true));
	memset(b.p, 0x5a, MIB);
	/* the mapping keeps the buffer: no FREE is sent yet */
	OK(cxla_free(c->fd, b.a.handle));
	b.a.handle = 0;
	HOST(c, "fault clear; fault add --opcode FREE --nth 1 --delay-ms 3000");
	t0 = now_sec();
	munmap(b.p, MIB);
	b.p = NULL;
	OK(cxla_identify(c->pfd, &id));
	t_peer = now_sec() - t0;
	OK(cxla_identify(c->fd, &id));
	t_own = now_sec() - t0;
	HOST(c, "fault clear");
	CHECK(t_peer < 1.0,
	      "IDENTIFY of the other device took %.2f s, behind this device's delayed FREE",
	      t_peer);
	CHECK(t_own >= 2.9,
	      "IDENTIFY of this device answered after %.2f s, before its FREE (delayed 3 s) ran",
	      t_own);
	CHECK(id.devmem_free == id0.devmem_free,
	      "devmem_free %llu after the FREE, %llu before the buffer",
	      (unsigned long long)id.devmem_free, (unsigned long long)id0.devmem_free);
	SETTLED(c);
	DETAIL("FREE of an unmapped buffer delayed 3 s: IDENTIFY of the other device in %.3f s, of this one after %.2f s with all its memory free again",
	       t_peer, t_own);
	return PASS;
}

/*
 * A completion after the driver gave up: the command timed out
 * (-ETIMEDOUT) and was quarantined with its pinned pages; the late
 * completion only releases it. The destination was unmapped by user space
 * meanwhile: the pin kept the pages from being reused. A late ALLOC is
 * given back to the device.
 */
CXLA_TEST_F(fault, late_completion)
{
	const char *param = "/sys/module/cxl_accel/parameters/cmd_timeout_ms";
	long q0 = sys_long(c, "quarantined"), to0 = sys_long(c, "timeouts");
	char saved[32] = "5000";
	double t0, t_to, t_back;
	struct cxl_accel_alloc a;
	struct dbuf s;
	uint8_t *dst;
	int bufs0, r, fd;

	OK(dbuf_new(c, &s, MIB, true));
	memset(s.p, 0x5e, MIB);
	dst = map_anon(MIB);
	CHECK(dst, "mmap");
	memset(dst, 1, MIB);
	HOST(c, "fault clear; fault add --opcode COPY --nth 1 --late-ms 3000");
	t0 = now_sec();
	r = copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_user(dst), MIB, 1000);
	t_to = now_sec() - t0;
	EXPECT_ERR(r, ETIMEDOUT);
	CHECK(sys_long(c, "quarantined") == q0 + 1, "quarantined %ld, expected %ld",
	      sys_long(c, "quarantined"), q0 + 1);
	/* the pages stay pinned by the quarantined request */
	munmap(dst, MIB);
	CHECK(wait_sys(c, "quarantined", q0, 8) == q0,
	      "quarantined still %ld 8 s after the timeout", sys_long(c, "quarantined"));
	t_back = now_sec() - t0;
	CHECK(t_back >= 2.9, "the late completion was reaped %.2f s after the COPY, the rule says 3 s", t_back);
	CHECK(sys_long(c, "timeouts") == to0 + 1, "timeouts %ld, expected %ld",
	      sys_long(c, "timeouts"), to0 + 1);
	OK(copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(s.a.handle, MIB / 2), MIB / 2, 5000));

	/* a late ALLOC: the driver frees what the device allocated after all */
	HOST(c, "fault clear; buffers");
	bufs0 = json_count(reply, "id");
	fd = open(param, O_RDONLY);
	if (fd >= 0) {
		ssize_t n = read(fd, saved, sizeof(saved) - 1);

		saved[n > 0 ? n : 0] = 0;
		close(fd);
	}
	HOST(c, "fault add --opcode ALLOC --nth 1 --late-ms 2500");
	CHECK(!sys_write(param, "1000"), "cannot set cmd_timeout_ms");
	r = cxla_alloc(c->fd, 64 * 1024, 0, &a);
	sys_write(param, saved);
	EXPECT_ERR(r, ETIMEDOUT);
	CHECK(wait_sys(c, "quarantined", q0, 8) == q0, "the late ALLOC stays quarantined");
	t0 = now_sec();
	do {
		HOST(c, "buffers");
	} while (json_count(reply, "id") != bufs0 && now_sec() - t0 < 5 && !usleep(100000));
	CHECK(json_count(reply, "id") == bufs0,
	      "the device has %d buffers after the late ALLOC, %d before: %.200s",
	      json_count(reply, "id"), bufs0, reply);
	HOST(c, "fault clear");
	dbuf_del(c, &s);
	SETTLED(c);
	DETAIL("COPY into user memory completing 3 s late: -ETIMEDOUT after %.2f s, quarantined with its pinned pages while user space unmapped them, released %.1f s after the start; a late ALLOC was freed on the device",
	       t_to, t_back);
	return PASS;
}

/* sysfs name of the device with device_index index, or "" */
static void find_index(int index, char *name, size_t len)
{
	char p[128];
	int i;

	name[0] = 0;
	for (i = 0; i < 64; i++) {
		snprintf(p, sizeof(p), "cxl-accel%d", i);
		if (cxla_sysfs_long(p, "device_index") == index) {
			snprintf(name, len, "%s", p);
			return;
		}
	}
}

/* /dev/NAME exists (devtmpfs makes it; else from sysfs dev) */
static void ensure_node(const char *name)
{
	char p[128], dev[64];
	struct stat st;
	unsigned int ma, mi;
	FILE *f;

	snprintf(p, sizeof(p), "/dev/%s", name);
	if (!stat(p, &st))
		return;
	snprintf(dev, sizeof(dev), "/sys/class/cxl-accel/%s/dev", name);
	f = fopen(dev, "r");
	if (!f)
		return;
	if (fscanf(f, "%u:%u", &ma, &mi) == 2)
		mknod(p, S_IFCHR | 0600, makedev(ma, mi));
	fclose(f);
}

struct stall_loop {
	FIXTURE_DATA(fault) *c;
	uint32_t hs, hd;
	volatile int stop;
	volatile long ok, timedout, other;
	volatile int other_err;
};

static void *stall_worker(void *arg)
{
	struct stall_loop *l = arg;

	while (!l->stop) {
		int r = copy_t(l->c->fd, cxla_dev(l->hs, 0), cxla_dev(l->hd, 0),
			       256 * 1024, 700);

		if (!r)
			l->ok++;
		else if (r == -ETIMEDOUT)
			l->timedout++;
		else {
			l->other++;
			l->other_err = r;
		}
	}
	return NULL;
}

/*
 * Stalled engines (ctl stall) under a loop of copies: they time out and
 * are quarantined; after ctl unstall the stalled commands run, their late
 * completions are reaped, and the loop goes on.
 */
CXLA_TEST_F(fault, engine_stall)
{
	struct stall_loop l = { .c = c };
	long q0 = sys_long(c, "quarantined"), ok_stalled, to_stalled, qmax;
	double t0, t_stall;
	struct dbuf s, d;
	pthread_t th;

	OK(dbuf_new(c, &s, 256 * 1024, true));
	OK(dbuf_new(c, &d, 256 * 1024, true));
	fill_random(s.p, 256 * 1024, 7);
	l.hs = s.a.handle;
	l.hd = d.a.handle;
	CHECK(!pthread_create(&th, NULL, stall_worker, &l), "pthread_create");
	usleep(500000);
	if (host(c, "stall")) {
		l.stop = 1;
		pthread_join(th, NULL);
		FAILF("stall: %.200s", reply);
	}
	t0 = now_sec();
	while (l.timedout < 3 && now_sec() - t0 < 15)
		usleep(50000);
	t_stall = now_sec() - t0;
	host(c, "info");
	ok_stalled = l.ok;
	to_stalled = l.timedout;
	qmax = sys_long(c, "quarantined");
	if (json_num(reply, "stalled") != 1 || host(c, "unstall")) {
		host(c, "unstall");
		l.stop = 1;
		pthread_join(th, NULL);
		FAILF("the daemon does not say it is stalled, or unstall failed: %.200s", reply);
	}
	t0 = now_sec();
	while (l.ok < ok_stalled + 5 && now_sec() - t0 < 15)
		usleep(50000);
	l.stop = 1;
	pthread_join(th, NULL);
	CHECK(to_stalled >= 3, "%ld timeouts in %.1f s of stall", to_stalled, t_stall);
	CHECK(l.ok >= ok_stalled + 5, "only %ld copies after the unstall", l.ok - ok_stalled);
	CHECK(!l.other, "%ld copies failed otherwise (last %d, %s)", l.other, l.other_err,
	      strerror(-l.other_err));
	CHECK(wait_sys(c, "quarantined", q0, 10) == q0, "quarantined %ld after the unstall",
	      sys_long(c, "quarantined"));
	memset(d.p, 0, 256 * 1024);
	OK(copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(d.a.handle, 0), 256 * 1024, 5000));
	CHECK(!memcmp(s.p, d.p, 256 * 1024), "data after the stall");
	HOST(c, "info");
	CHECK(json_num(reply, "stalled") == 0, "still stalled: %.200s", reply);
	dbuf_del(c, &s);
	dbuf_del(c, &d);
	SETTLED(c);
	DETAIL("%ld copies before the stall, %ld timed out (%ld quarantined at once) while the engines were stalled, all reaped after unstall, %ld copies after; data intact",
	       ok_stalled, to_stalled, qmax - q0, l.ok - ok_stalled);
	return PASS;
}

/*
 * MB/s of COPYs of len bytes between two buffers (one command each), from
 * the median time of n of them: a vCPU the host took away for a while
 * (TCG on a shared machine) spoils one sample, not the measurement.
 */
static double copy_rate(FIXTURE_DATA(fault) *c, uint32_t hs, uint32_t hd, size_t len, int n)
{
	double t[16];
	int i;

	for (i = 0; i < n && i < 16; i++) {
		double t0 = now_sec();

		if (copy_t(c->fd, cxla_dev(hs, 0), cxla_dev(hd, 0), len, 30000))
			return -1;
		t[i] = now_sec() - t0;
	}
	return (double)len / cxla_median(t, i) / 1e6;
}

/*
 * The latency and bandwidth model: COPY throughput follows the configured
 * bandwidth (a COPY reads and writes every byte: 1 / (1/read + 1/write)),
 * a NOP takes the configured latency, and without enforcement the device
 * runs flat out again.
 */
CXLA_TEST_F(fault, model)
{
	const size_t len = 4 * MIB;
	double r_free, r1, r2, exp1, exp2, lat[15], nop_ms;
	struct dbuf s, d;
	int i;

	OK(dbuf_new(c, &s, len, true));
	OK(dbuf_new(c, &d, len, true));
	memset(s.p, 9, len);
	memset(d.p, 0, len);
	copy_rate(c, s.a.handle, d.a.handle, len, 4);	/* warm up */
	r_free = copy_rate(c, s.a.handle, d.a.handle, len, 8);
	HOST(c, "model --enforce true --read-bandwidth-mbs 200 --write-bandwidth-mbs 200 --read-latency-ns 0 --write-latency-ns 0");
	r1 = copy_rate(c, s.a.handle, d.a.handle, len, 7);
	HOST(c, "model --read-bandwidth-mbs 50 --write-bandwidth-mbs 100");
	r2 = copy_rate(c, s.a.handle, d.a.handle, len, 5);
	HOST(c, "model --read-bandwidth-mbs 0 --write-bandwidth-mbs 0 --read-latency-ns 3000000 --write-latency-ns 3000000");
	for (i = 0; i < (int)ARRAY_SIZE(lat); i++) {
		double t0 = now_sec();

		OK(cxla_nop(c->fd, 5000));
		lat[i] = (now_sec() - t0) * 1000;
	}
	nop_ms = cxla_median(lat, ARRAY_SIZE(lat));
	HOST(c, "model --enforce false --read-latency-ns 0 --write-latency-ns 0");
	HOST(c, "fault list");
	CHECK(strstr(reply, "\"enforce\":false"), "the model is still enforced: %.200s", reply);
	dbuf_del(c, &s);
	dbuf_del(c, &d);
	exp1 = 1 / (1 / 200.0 + 1 / 200.0);
	exp2 = 1 / (1 / 50.0 + 1 / 100.0);
	DETAIL("4 MiB COPYs: flat out %.0f MB/s; model read/write 200/200 MB/s: %.1f MB/s (expected %.1f); 50/100 MB/s: %.1f MB/s (expected %.1f); 3 ms latency: NOP %.2f ms",
	       r_free, r1, exp1, r2, exp2, nop_ms);
	if (r1 < 0 || r2 < 0 || r_free < 0)
		return FAIL;
	/*
	 * Never faster than the model; the guest's own overhead a little
	 * slower. The detail above says what was measured.
	 */
	if (r1 > exp1 * 1.03 || r1 < exp1 * 0.75 || r2 > exp2 * 1.03 ||
	    r2 < exp2 * 0.75 || r_free < 2 * exp1 || nop_ms < 2.9 || nop_ms > 30)
		return FAIL;
	SETTLED(c);
	return PASS;
}

/*
 * Poisoned device memory in buffers: the driver lists the ranges, commands
 * touching them fail with -EIO, CPU mappings (the buffer's and a DMA-BUF's)
 * get SIGBUS with BUS_MCEERR_AR (see poison_code) there and work
 * elsewhere; once the host clears the poison everything works again.
 */
CXLA_TEST_F(fault, poison_buffer)
{
	struct cxl_accel_dmabuf_export e = { .flags = CXL_ACCEL_DMABUF_CLOEXEC };
	long long ev0 = dstat(c, CXL_ACCEL_DSTAT_POISON);
	long long hw0 = dstat(c, CXL_ACCEL_DSTAT_HWPOISON);
	long long me0 = devstat(c, CXL_ACCEL_STAT_MEDIA_ERRORS);
	uint64_t pa, pb;
	struct dbuf a, b, x;
	uint8_t *bm, v = 0;
	int code, code_b;

	OK(dbuf_new(c, &a, MIB, true));
	OK(dbuf_new(c, &b, 256 * 1024, false));
	memset(a.p, 0xa5, MIB);
	e.handle = b.a.handle;
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_EXPORT_DMABUF, &e));
	bm = mmap(NULL, 256 * 1024, PROT_READ | PROT_WRITE, MAP_SHARED, e.fd, 0);
	CHECK(bm != MAP_FAILED, "mmap of the DMA-BUF: %s", strerror(errno));
	memset(bm, 0xb6, 256 * 1024);
	pa = a.a.offset + 16 * PG;		/* pages 16 and 17 of a */
	pb = b.a.offset + PG;			/* page 1 of b */
	HOST(c, "poison %#llx 8192; poison %#llx 4096", (unsigned long long)pa,
	     (unsigned long long)pb);
	if (wait_poison(c, 2) != 2) {
		char st[512] = "", pl[256] = "";

		sys_read(c, "poison_stats", st, sizeof(st));
		sys_read(c, "poison", pl, sizeof(pl));
		FAILF("the driver lists %d poisoned ranges, expected 2: '%s' stats: %s",
		      poison_lines(c), pl, st);
	}
	CHECK(dstat(c, CXL_ACCEL_DSTAT_POISON) - ev0 == 2, "poison events %lld",
	      dstat(c, CXL_ACCEL_DSTAT_POISON) - ev0);

	/* CPU: SIGBUS on the poisoned pages, which were mapped before */
	code = read_bus_code(a.p + 16 * PG + 100, &v);
	CHECK(code == poison_code(), "read of a poisoned buffer page: %s (si_code %d, want %d)",
	      code ? "SIGBUS" : "no fault", code, poison_code());
	CHECK(read_bus_code(a.p + 17 * PG, &v) == poison_code(), "second poisoned page");
	CHECK(!read_bus_code(a.p + 15 * PG, &v) && v == 0xa5, "page 15: %#x", v);
	CHECK(!read_bus_code(a.p + 18 * PG, &v) && v == 0xa5, "page 18: %#x", v);
	code_b = read_bus_code(bm + PG, &v);
	CHECK(code_b == poison_code(), "read of a poisoned DMA-BUF page: si_code %d", code_b);
	CHECK(!read_bus_code(bm, &v) && v == 0xb6, "DMA-BUF page 0: %#x", v);
	CHECK(dstat(c, CXL_ACCEL_DSTAT_HWPOISON) - hw0 == 3, "hwpoison_faults +%lld, expected 3",
	      dstat(c, CXL_ACCEL_DSTAT_HWPOISON) - hw0);

	/* commands: -EIO across the poison, fine beside it */
	OK(dbuf_new(c, &x, MIB, false));
	EXPECT_ERR(copy_t(c->fd, cxla_dev(a.a.handle, 15 * PG), cxla_dev(x.a.handle, 0), 2 * PG, 5000), EIO);
	EXPECT_ERR(copy_t(c->fd, cxla_dev(x.a.handle, 0), cxla_dev(a.a.handle, 17 * PG), PG, 5000), EIO);
	EXPECT_ERR(cxla_fill(c->fd, cxla_dev(b.a.handle, 0), 256 * 1024, 1, 0), EIO);
	OK(copy_t(c->fd, cxla_dev(a.a.handle, 0), cxla_dev(x.a.handle, 0), 16 * PG, 5000));
	OK(copy_t(c->fd, cxla_dev(a.a.handle, 18 * PG), cxla_dev(x.a.handle, 0), MIB - 18 * PG, 5000));
	CHECK(devstat(c, CXL_ACCEL_STAT_MEDIA_ERRORS) - me0 == 3, "device media_errors +%lld, expected 3",
	      devstat(c, CXL_ACCEL_STAT_MEDIA_ERRORS) - me0);
	/* a new buffer never lands on poison (the device's allocator) */
	dbuf_del(c, &x);

	HOST(c, "unpoison %#llx 8192; unpoison %#llx 4096", (unsigned long long)pa,
	     (unsigned long long)pb);
	CHECK(wait_poison(c, 0) == 0, "%d ranges still listed after the host cleared them",
	      poison_lines(c));
	CHECK(!read_bus_code(a.p + 16 * PG, &v), "the cleared page still faults");
	CHECK(!read_bus_code(bm + PG, &v), "the cleared DMA-BUF page still faults");
	OK(copy_t(c->fd, cxla_dev(a.a.handle, 0), cxla_dev(a.a.handle, MIB / 2), MIB / 2, 5000));
	OK(cxla_fill(c->fd, cxla_dev(b.a.handle, 0), 256 * 1024, 1, 0));
	munmap(bm, 256 * 1024);
	close(e.fd);
	dbuf_del(c, &a);
	dbuf_del(c, &b);
	SETTLED(c);
	DETAIL("2 ranges listed in sysfs; SIGBUS (%s) on 2 buffer pages and 1 DMA-BUF page, neighbours readable; COPY/FILL across them -EIO (device media_errors +3), beside them fine; all usable again once cleared",
	       poison_code_name());
	return PASS;
}

/* offsets[] of n pages: are all on this device? */
static bool all_local(const int64_t *off, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (off[i] < 0)
			return false;
	return true;
}

/* n consecutive free pages of the 2 MiB chunk at chunk, not in used[]; -1 */
static int64_t free_run(int64_t chunk, const int64_t *used, size_t nused, size_t n)
{
	int64_t at;
	size_t i;

	for (at = chunk + 2 * (int64_t)MIB - (int64_t)(n * PG); at >= chunk; at -= PG) {
		for (i = 0; i < nused; i++)
			if (used[i] >= at && used[i] < at + (int64_t)(n * PG))
				break;
		if (i == nused)
			return at;
	}
	return -1;
}

/*
 * Poison under the migration pool: free pool pages in the range are never
 * handed out (quarantined), pages freed there later join them; migrated
 * pages on poisoned memory stay where they are (MIGRATE_TO_RAM and EVICT
 * count them); a chunk whose other pages are all free goes back to the
 * device; clearing the poison frees the quarantined pages.
 */
CXLA_TEST_F(fault, poison_pool)
{
	const size_t n = 256, m = 300;
	int64_t off[300], poff[4], chunk, runb;
	struct cxl_accel_migrate mg;
	struct cxl_accel_evict ev = { 0 };
	struct cxl_accel_hmm_info h;
	uint8_t *p, *q, *ref;
	size_t i;
	double t0, t_evict;

	OK(cxla_hmm_info(c->fd, &h));
	if (!(h.flags & CXL_ACCEL_HMM_COHERENT)) {
		DETAIL("no coherent device memory (flags %#x)", h.flags);
		return SKIP;
	}
	p = map_anon(n * PG);
	q = map_anon(m * PG);
	ref = malloc(m * PG);
	CHECK(p && q && ref, "memory");
	fill_random(ref, m * PG, 99);
	memcpy(p, ref, n * PG);
	OK(cxla_migrate(c->fd, p, n * PG, true, &mg));
	CHECK(mg.migrated == n, "%llu of %zu pages migrated", (unsigned long long)mg.migrated, n);
	CHECK(!dev_offsets(c, p, n, off) && all_local(off, n), "pagemap: pages not on the device");
	chunk = off[10] & ~(int64_t)(2 * MIB - 1);
	runb = free_run(chunk, off, n, 16);
	CHECK(runb >= 0, "no 16 free pages in the chunk at %#llx", (long long)chunk);
	/* pages 10..13 (in use) and 16 free pool pages */
	memcpy(poff, off + 10, sizeof(poff));
	HOST(c, "poison %#llx 4096; poison %#llx 4096; poison %#llx 4096; poison %#llx 4096; poison %#llx 65536",
	     (long long)off[10], (long long)off[11], (long long)off[12],
	     (long long)off[13], (long long)runb);
	for (t0 = now_sec(); now_sec() - t0 < 10; usleep(20000)) {
		OK(cxla_hmm_info(c->fd, &h));
		if (h.pool_pages_poisoned == 16 && poison_lines(c) > 0)
			break;
	}
	CHECK(h.pool_pages_poisoned == 16, "%llu pool pages quarantined, expected 16",
	      (unsigned long long)h.pool_pages_poisoned);

	/* back to RAM: the 4 poisoned pages stay */
	OK(cxla_migrate(c->fd, p, n * PG, false, &mg));
	CHECK(mg.migrated == n - 4 && mg.poisoned == 4 && mg.busy == 4,
	      "MIGRATE_TO_RAM: %llu migrated, %llu poisoned, %llu busy; expected %zu, 4, 4",
	      (unsigned long long)mg.migrated, (unsigned long long)mg.poisoned,
	      (unsigned long long)mg.busy, n - 4);
	for (i = 0; i < n; i++)
		if ((i < 10 || i > 13) && memcmp(p + i * PG, ref + i * PG, PG))
			FAILF("page %zu differs after MIGRATE_TO_RAM", i);
	t0 = now_sec();
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_EVICT, &ev));
	t_evict = now_sec() - t0;
	CHECK(ev.poisoned == 4 && ev.evicted == 0, "EVICT: %llu evicted, %llu poisoned; expected 0, 4",
	      (unsigned long long)ev.evicted, (unsigned long long)ev.poisoned);

	/* new migrations never use poisoned pages */
	memcpy(q, ref, m * PG);
	OK(cxla_migrate(c->fd, q, m * PG, true, &mg));
	CHECK(mg.migrated == m, "%llu of %zu pages migrated while poisoned",
	      (unsigned long long)mg.migrated, m);
	CHECK(!dev_offsets(c, q, m, off) && all_local(off, m), "pagemap");
	for (i = 0; i < m; i++)
		CHECK(off[i] < runb || off[i] >= runb + 16 * (int64_t)PG,
		      "page %zu went to quarantined pool page %#llx", i, (long long)off[i]);

	/* the poisoned migrated pages come back to the pool: quarantined too */
	munmap(p, n * PG);
	OK(cxla_hmm_info(c->fd, &h));
	CHECK(h.pool_pages_poisoned == 20, "%llu pool pages quarantined after munmap, expected 20",
	      (unsigned long long)h.pool_pages_poisoned);

	HOST(c, "unpoison %#llx 4096; unpoison %#llx 4096; unpoison %#llx 4096; unpoison %#llx 4096; unpoison %#llx 65536",
	     (long long)poff[0], (long long)poff[1], (long long)poff[2],
	     (long long)poff[3], (long long)runb);
	CHECK(wait_poison(c, 0) == 0, "%d ranges listed after clearing", poison_lines(c));
	OK(cxla_hmm_info(c->fd, &h));
	CHECK(h.pool_pages_poisoned == 0, "%llu pool pages still quarantined after clearing",
	      (unsigned long long)h.pool_pages_poisoned);
	OK(cxla_migrate(c->fd, q, m * PG, false, &mg));
	CHECK(mg.migrated == m && !memcmp(q, ref, m * PG), "q back to RAM: %llu migrated",
	      (unsigned long long)mg.migrated);
	munmap(q, m * PG);

	/* a chunk whose pages are free or quarantined goes back to the device */
	p = map_anon(64 * PG);
	CHECK(p, "mmap");
	memset(p, 3, 64 * PG);
	OK(cxla_migrate(c->fd, p, 64 * PG, true, &mg));
	CHECK(!dev_offsets(c, p, 64, off) && all_local(off, 64), "pagemap");
	chunk = off[0] & ~(int64_t)(2 * MIB - 1);
	runb = free_run(chunk, off, 64, 16);
	CHECK(runb >= 0, "no free run");
	HOST(c, "poison %#llx 65536", (long long)runb);
	CHECK(wait_poison(c, 1) == 1, "poison not listed");
	OK(cxla_hmm_info(c->fd, &h));
	CHECK(h.pool_pages_poisoned == 16 && h.pool_chunks == 1,
	      "%llu quarantined, %llu chunks", (unsigned long long)h.pool_pages_poisoned,
	      (unsigned long long)h.pool_chunks);
	munmap(p, 64 * PG);
	OK(cxla_hmm_info(c->fd, &h));
	CHECK(h.pool_chunks == 0 && h.pool_pages_poisoned == 0 && h.pool_pages_used == 0,
	      "with only quarantined and free pages left: %llu chunks, %llu quarantined, %llu used",
	      (unsigned long long)h.pool_chunks, (unsigned long long)h.pool_pages_poisoned,
	      (unsigned long long)h.pool_pages_used);
	HOST(c, "unpoison %#llx 65536", (long long)runb);
	CHECK(wait_poison(c, 0) == 0, "poison still listed");
	free(ref);
	SETTLED(c);
	DETAIL("16 free pool pages quarantined, 4 migrated pages on poison stayed (MIGRATE_TO_RAM poisoned 4, EVICT poisoned 4 in %.2f s), 300 new pages avoided the poison, the 4 joined the quarantine when freed (20), clearing released them; a chunk with free and quarantined pages only went back to the device",
	       t_evict);
	return PASS;
}

/*
 * Device-private pages (kernels with DEVICE_PRIVATE) whose backing is
 * poisoned: a CPU access cannot bring them back (SIGBUS, BUS_MCEERR_AR),
 * MIGRATE_TO_RAM leaves them; once cleared they come back intact.
 */
CXLA_TEST_F(fault, poison_private)
{
	struct cxl_accel_hmm_info h;
	struct cxl_accel_migrate mg;
	int64_t off, chunk;
	uint8_t *one, *p, *ref, v;
	size_t i;
	int code;

	OK(cxla_hmm_info(c->fd, &h));
	if (!(h.flags & CXL_ACCEL_HMM_PRIVATE)) {
		DETAIL("no device-private memory on this kernel (flags %#x)", h.flags);
		return SKIP;
	}
	/* a coherent page shows which pool chunk the backings come from */
	one = map_anon(PG);
	p = map_anon(8 * PG);
	ref = malloc(8 * PG);
	CHECK(one && p && ref, "memory");
	one[0] = 1;
	OK(cxla_migrate(c->fd, one, PG, true, &mg));
	CHECK(!dev_offsets(c, one, 1, &off) && off >= 0, "pagemap");
	chunk = off & ~(int64_t)(2 * MIB - 1);
	fill_random(ref, 8 * PG, 5);
	memcpy(p, ref, 8 * PG);
	OK(cxla_migrate_flags(c->fd, p, 8 * PG, true, CXL_ACCEL_MIGRATE_PRIVATE, &mg));
	CHECK(mg.migrated == 8, "%llu private pages", (unsigned long long)mg.migrated);
	HOST(c, "poison %#llx %#lx", (long long)chunk, 2 * MIB);
	CHECK(wait_poison(c, 1) == 1, "poison not listed");
	code = read_bus_code(p + 3 * PG, &v);
	CHECK(code == poison_code(), "CPU read of a private page on poison: %s (si_code %d, want %d)",
	      code ? "SIGBUS" : "no fault", code, poison_code());
	OK(cxla_migrate_flags(c->fd, p, 8 * PG, false, CXL_ACCEL_MIGRATE_PRIVATE, &mg));
	CHECK(mg.migrated == 0 && mg.poisoned == 8, "MIGRATE_TO_RAM: %llu migrated, %llu poisoned",
	      (unsigned long long)mg.migrated, (unsigned long long)mg.poisoned);
	HOST(c, "unpoison %#llx %#lx", (long long)chunk, 2 * MIB);
	CHECK(wait_poison(c, 0) == 0, "poison still listed");
	for (i = 0; i < 8; i++)
		CHECK(!read_bus_code(p + i * PG, &v), "page %zu faults after clearing", i);
	CHECK(!memcmp(p, ref, 8 * PG), "private pages differ after coming back");
	munmap(p, 8 * PG);
	munmap(one, PG);
	free(ref);
	SETTLED(c);
	DETAIL("8 private pages on a poisoned chunk: CPU read SIGBUS (%s), MIGRATE_TO_RAM left all 8 (poisoned 8); after clearing a read brought them back intact",
	       poison_code_name());
	return PASS;
}

/*
 * A CPU access to a 2 MiB private folio while the device fails the copy
 * back (COPY_PAGES answers INTERNAL): the CPU copies it from the backing
 * instead, and the access goes on with the data, no SIGBUS (it used to get
 * one: the window's copy error outlived the CPU's copy).
 */
CXLA_TEST_F(fault, private_fault_copy_fails)
{
	size_t len = 2 * MIB, i;
	uint8_t *raw, *p, *ref, v = 0, snap[512];
	struct cxl_accel_hmm_info h0, h1;
	struct cxl_accel_migrate mg;
	struct cxl_accel_snapshot s;
	int code, ret = FAIL;

	OK(cxla_hmm_info(c->fd, &h0));
	if (!(h0.flags & CXL_ACCEL_HMM_PRIVATE)) {
		DETAIL("no device-private memory on this kernel (flags %#x)", h0.flags);
		return SKIP;
	}
	raw = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ref = malloc(len);
	CHECK(raw != MAP_FAILED && ref, "memory");
	p = (uint8_t *)(((uintptr_t)raw + len - 1) & ~(uintptr_t)(len - 1));
	madvise(p, len, MADV_HUGEPAGE);
	fill_random(ref, len, 17);
	memcpy(p, ref, len);
	s = (struct cxl_accel_snapshot){ .addr = (uintptr_t)p, .len = len,
					 .flags_ptr = (uintptr_t)snap };
	if (cxla_ioctl(c->fd, CXL_ACCEL_IOC_SNAPSHOT, &s) ||
	    !(snap[0] & CXL_ACCEL_SNAP_HUGE)) {
		DETAIL("no transparent huge page here (snapshot %#x)", snap[0]);
		ret = SKIP;
		goto out;
	}
	if (cxla_migrate_flags(c->fd, p, len, true, CXL_ACCEL_MIGRATE_PRIVATE, &mg) ||
	    mg.migrated != len / PG) {
		DETAIL("to private memory: %s, %llu migrated", strerror(errno),
		       (unsigned long long)mg.migrated);
		goto out;
	}
	if (host(c, "fault clear; fault add --opcode COPY_PAGES --nth 1 --fail INTERNAL")) {
		DETAIL("host: %.200s", reply);
		goto out;
	}
	code = read_bus_code(p + 5 * PG, &v);
	host(c, "fault list");
	i = json_count(reply, "fired");
	host(c, "fault clear");
	if (code) {
		DETAIL("CPU read of a private folio whose device copy failed: SIGBUS (si_code %d)", code);
		goto out;
	}
	if (strstr(reply, "\"fired\":0") || !i) {
		DETAIL("the COPY_PAGES failure was not injected: %.200s", reply);
		goto out;
	}
	if (v != ref[5 * PG] || memcmp(p, ref, len)) {
		DETAIL("data differ after the CPU copied the folio back");
		goto out;
	}
	OK(cxla_hmm_info(c->fd, &h1));
	DETAIL("2 MiB private folio, its COPY_PAGES back failed (INTERNAL): the CPU copied it, the read went on, data right (%llu CPU faults)",
	       (unsigned long long)(h1.cpu_faults - h0.cpu_faults));
	ret = PASS;
out:
	munmap(raw, 2 * len);
	free(ref);
	if (ret == PASS)
		SETTLED(c);
	return ret;
}

/*
 * A completion that never comes: -ETIMEDOUT, the request stays
 * quarantined (its buffers alive), the other engine goes on; the device
 * reset of an unbind ends it, and nothing is left after the rebind.
 */
CXLA_TEST_F(fault, never_completes)
{
	long q0 = sys_long(c, "quarantined");
	char link[256], vdev[64], p[128], name[32];
	struct dbuf s, d;
	ssize_t n;
	double t0, t;
	int r;

	OK(dbuf_new(c, &s, MIB, true));
	OK(dbuf_new(c, &d, MIB, true));
	memset(s.p, 0x42, MIB);
	HOST(c, "fault clear; fault add --opcode COPY --nth 1 --hang");
	t0 = now_sec();
	r = copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(d.a.handle, 0), MIB, 1000);
	t = now_sec() - t0;
	EXPECT_ERR(r, ETIMEDOUT);
	CHECK(sys_long(c, "quarantined") == q0 + 1, "quarantined %ld, expected %ld",
	      sys_long(c, "quarantined"), q0 + 1);
	/* the other engine still works */
	OK(copy_t(c->fd, cxla_dev(s.a.handle, 0), cxla_dev(d.a.handle, 0), MIB, 5000));
	CHECK(d.p[0] == 0x42, "data");
	HOST(c, "fault clear; counters");
	CHECK(json_num(reply, "executing") == 1, "the daemon executes %lld commands, expected the hung one",
	      json_num(reply, "executing"));
	/* our buffers go; the hung request still holds its own references */
	dbuf_del(c, &s);
	dbuf_del(c, &d);
	CHECK(sys_long(c, "quarantined") == q0 + 1, "quarantine ended by itself");

	/* unbind: the device reset ends the hung command; then bind again */
	snprintf(p, sizeof(p), "/sys/class/cxl-accel/%s/device", c->name);
	n = readlink(p, link, sizeof(link) - 1);
	CHECK(n > 0, "readlink %s", p);
	link[n] = 0;
	snprintf(vdev, sizeof(vdev), "%s", strrchr(link, '/') ? strrchr(link, '/') + 1 : link);
	close(c->fd);
	c->fd = -1;
	t0 = now_sec();
	CHECK(!sys_write("/sys/bus/virtio/drivers/cxl_accel/unbind", vdev), "unbind %s", vdev);
	t = now_sec() - t0;
	CHECK(!sys_write("/sys/bus/virtio/drivers/cxl_accel/bind", vdev), "bind %s", vdev);
	find_index(c->index, name, sizeof(name));
	CHECK(!strcmp(name, c->name), "after the rebind device index %d is '%s', was %s",
	      c->index, name, c->name);
	ensure_node(name);
	c->fd = open(c->path, O_RDWR);
	CHECK(c->fd >= 0, "open %s after the rebind: %s", c->path, strerror(errno));
	CHECK(sys_long(c, "devmem_free") == (long)c->id.devmem_size,
	      "devmem_free %ld of %llu after the rebind", sys_long(c, "devmem_free"),
	      (unsigned long long)c->id.devmem_size);
	HOST(c, "counters");
	CHECK(json_num(reply, "executing") == 0, "the daemon still executes %lld commands",
	      json_num(reply, "executing"));
	HOST(c, "buffers");
	CHECK(json_count(reply, "id") == 0, "buffers left on the device: %.200s", reply);
	OK(cxla_nop(c->fd, 5000));
	SETTLED(c);
	DETAIL("hung COPY: -ETIMEDOUT, quarantined, the second engine went on; unbind (%.2f s) ended it, after the rebind all device memory free, no buffer, nothing executing",
	       t);
	return PASS;
}

/*
 * Under --supervise: which fault state survives a worker restart. The host
 * kills the worker; the supervisor starts another from the state file:
 * buffers and device counters are still there; rules, stall, model, trace
 * and poison are not (the driver keeps its poison record until the device
 * says the range is clear, so the host poisons and clears it again).
 */
CXLA_TEST_F(fault, worker_restart)
{
	long long pid0, pid1, cmds0, cmds1;
	struct dbuf a;
	uint64_t pa;

	if (!c->supervised) {
		DETAIL("the daemon is not supervised (--supervised)");
		return SKIP;
	}
	OK(dbuf_new(c, &a, MIB, true));
	memset(a.p, 0x11, MIB);
	pa = a.a.offset + 4 * PG;
	HOST(c, "fault clear; fault add --opcode FILL --nth 1000 --fail INTERNAL; model --enforce true --read-latency-ns 1000; trace on; poison %#llx 4096; info",
	     (unsigned long long)pa);
	pid0 = json_num(reply, "pid");
	CHECK(json_num(reply, "trace") == 1, "trace not on: %.200s", reply);
	CHECK(wait_poison(c, 1) == 1, "poison not listed");
	HOST(c, "counters");
	cmds0 = json_num(reply, "commands");
	HOST(c, "!kill-worker");
	pid1 = json_num(reply, "pid");
	CHECK(pid1 > 0 && pid1 != pid0, "worker pid %lld before, %lld after", pid0, pid1);
	CHECK(json_num(reply, "trace") == 0 && json_num(reply, "stalled") == 0,
	      "the new worker traces or is stalled: %.200s", reply);
	HOST(c, "fault list");
	CHECK(json_count(reply, "fired") == 0, "rules survived: %.200s", reply);
	CHECK(strstr(reply, "\"enforce\":false") && strstr(reply, "\"poison\":[]"),
	      "model or poison survived: %.300s", reply);
	HOST(c, "buffers");
	CHECK(strstr(reply, "\"size\":1048576"), "our buffer is gone: %.200s", reply);
	HOST(c, "counters");
	cmds1 = json_num(reply, "commands");
	CHECK(cmds1 >= cmds0, "device commands counter %lld, was %lld", cmds1, cmds0);
	OK(cxla_nop(c->fd, 5000));
	CHECK(a.p[0] == 0x11, "buffer data");
	/* the driver still refuses the page: the device never said it is clear */
	CHECK(poison_lines(c) == 1, "driver poison record: %d ranges", poison_lines(c));
	HOST(c, "poison %#llx 4096; unpoison %#llx 4096", (unsigned long long)pa,
	     (unsigned long long)pa);
	CHECK(wait_poison(c, 0) == 0, "poison still listed after poison+unpoison");
	OK(copy_t(c->fd, cxla_dev(a.a.handle, 0), cxla_dev(a.a.handle, MIB / 2), MIB / 2, 5000));
	dbuf_del(c, &a);
	SETTLED(c);
	DETAIL("worker %lld killed, %lld took over: buffer and counters (%lld -> %lld commands) kept; rules, model, trace and poison gone (driver record cleared by poison+unpoison)",
	       pid0, pid1, cmds0, cmds1);
	return PASS;
}

/* ------------------------------------------------------------ bench */

static double nop_us(int fd, int n)
{
	double v[2000];
	int i;

	n = n > 2000 ? 2000 : n;
	for (i = 0; i < n; i++) {
		double t0 = now_sec();

		if (cxla_nop(fd, 5000))
			return -1;
		v[i] = (now_sec() - t0) * 1e6;
	}
	return cxla_median(v, n);
}

/*
 * What the control channel and tracing cost: NOP round trip and COPY
 * bandwidth on dev (control socket present; trace off, then on) and on
 * peer (no control socket), alternating over a few rounds, medians.
 */
static int bench(FIXTURE_DATA(fault) *c, FIXTURE_DATA(fault) *p, const char *prefix)
{
	enum { ABSENT, PRESENT, TRACE, NCFG, ROUNDS = 5 };
	static const char * const cfg[NCFG] = { "no control socket",
		"control socket, trace off", "control socket, trace on" };
	const size_t len = 64 * MIB;
	double nopv[NCFG][ROUNDS], bwv[NCFG][ROUNDS], nopm[NCFG], bwm[NCFG];
	struct dbuf s[2], d[2];
	FIXTURE_DATA(fault) *cc;
	int round, k, rc = 0;

	if (dbuf_new(c, &s[0], len, false) || dbuf_new(c, &d[0], len, false) ||
	    dbuf_new(p, &s[1], len, false) || dbuf_new(p, &d[1], len, false)) {
		printf("RESULT %sbench FAIL buffers: %s\n", prefix, strerror(errno));
		return 1;
	}
	for (k = 0; k < 2; k++) {
		cc = k ? p : c;
		cxla_fill(cc->fd, cxla_dev(s[k].a.handle, 0), len, 0x1234, 0);
	}
	host(c, "trace off");
	for (round = 0; round < ROUNDS; round++) {
		for (k = 0; k < NCFG; k++) {
			int di = k == ABSENT;

			cc = di ? p : c;
			if (k == TRACE && host(c, "trace on")) {
				printf("RESULT %sbench FAIL trace on: %s\n", prefix, reply);
				return 1;
			}
			nopv[k][round] = nop_us(cc->fd, 1000);
			bwv[k][round] = copy_rate(cc, s[di].a.handle, d[di].a.handle, len, 3);
			if (k == TRACE)
				host(c, "trace off");
		}
	}
	for (k = 0; k < NCFG; k++) {
		nopm[k] = cxla_median(nopv[k], ROUNDS);
		bwm[k] = cxla_median(bwv[k], ROUNDS);
		if (nopm[k] <= 0 || bwm[k] <= 0)
			rc = 1;
	}
	printf("# cost of the control channel and tracing (median of %d rounds, each: NOP median of 1000, COPY of 64 MiB device to device median of 3)\n",
	       ROUNDS);
	for (k = 0; k < NCFG; k++)
		printf("#   %-28s NOP %7.1f us   COPY %7.0f MB/s\n", cfg[k], nopm[k], bwm[k]);
	printf("RESULT %sbench_nop_roundtrip %s absent %.1f us, present %.1f us (%+.1f%%), trace on %.1f us (%+.1f%%)\n",
	       prefix, rc ? "FAIL" : "PASS", nopm[ABSENT], nopm[PRESENT],
	       100 * (nopm[PRESENT] / nopm[ABSENT] - 1), nopm[TRACE],
	       100 * (nopm[TRACE] / nopm[PRESENT] - 1));
	printf("RESULT %sbench_copy_bandwidth %s absent %.0f MB/s, present %.0f MB/s (%+.1f%%), trace on %.0f MB/s (%+.1f%%)\n",
	       prefix, rc ? "FAIL" : "PASS", bwm[ABSENT], bwm[PRESENT],
	       100 * (bwm[PRESENT] / bwm[ABSENT] - 1), bwm[TRACE],
	       100 * (bwm[TRACE] / bwm[PRESENT] - 1));
	dbuf_del(c, &s[0]);
	dbuf_del(c, &d[0]);
	dbuf_del(p, &s[1]);
	dbuf_del(p, &d[1]);
	return rc;
}

static bool supervised;		/* --supervised */

/* cxl-accelN and the daemon's index, from the path and IDENTIFY */
static void name_device(FIXTURE_DATA(fault) *c)
{
	const char *slash = strrchr(c->path, '/');

	snprintf(c->name, sizeof(c->name), "%s", slash ? slash + 1 : c->path);
	c->index = (int)c->id.device_index;
	c->supervised = supervised;
}

FIXTURE_SETUP(fault)
{
	int r = cxla_open_devs(&c->devs, CXLA_PEER_IF_GIVEN);

	if (r == PASS)
		name_device(c);
	return r;
}

/* a failed test may have left its fault behind: the next one starts clean */
FIXTURE_TEARDOWN(fault)
{
	/* poison too: what a failed poison test left would fail the next */
	if (verdict == FAIL)
		host(c, "fault clear; unstall; model --enforce false; unpoison 0 %#llx",
		     (unsigned long long)c->id.devmem_size);
	close(c->fd);
	if (c->pfd >= 0)
		close(c->pfd);
	return verdict;
}

CXLA_OPTION(supervised, "--supervised", NULL)
{
	supervised = true;
}

static int prologue(void)
{
	if (host_open()) {
		cxla_result("host_channel", FAIL, "console or /dev/ttyS1: %s",
			    strerror(errno));
		return 1;
	}
	return 0;
}

/* -d DEV (control socket) -P DEV (none) --bench: the cost table */
CXLA_MODE(bench, "--bench", "", 0)
{
	FIXTURE_DATA(fault) base = { 0 }, pc = { 0 };
	cpu_set_t one;

	base.devs.pfd = -1;
	pc.devs.pfd = -1;
	if (!cxla_opt.peer) {
		printf("RESULT %sbench FAIL a second device without control socket (-P) is needed\n",
		       cxla_opt.prefix);
		return 1;
	}
	base.path = cxla_opt.dev;
	pc.path = cxla_opt.peer;
	base.fd = open(base.path, O_RDWR | O_CLOEXEC);
	pc.fd = open(pc.path, O_RDWR | O_CLOEXEC);
	if (base.fd < 0 || pc.fd < 0 || cxla_identify(base.fd, &base.id) ||
	    cxla_identify(pc.fd, &pc.id)) {
		printf("RESULT %sbench FAIL open %s and %s: %s\n", cxla_opt.prefix,
		       base.path, pc.path, strerror(errno));
		return 1;
	}
	name_device(&base);
	name_device(&pc);
	if (prologue())
		return 1;
	/* where the interrupts go too (run-faults.sh): no cross-CPU wakeups */
	CPU_ZERO(&one);
	CPU_SET(0, &one);
	sched_setaffinity(0, sizeof(one), &one);
	return bench(&base, &pc, cxla_opt.prefix);
}

CXLA_PROGRAM(.name = "fault-tests", .prefix = "faults.",
	     .timeout_s = TEST_TIMEOUT_S, .prologue = prologue);

/* -------------------------------------------- CXL registers, as specified */

/*
 * --cxl-registers: the CXL endpoint's registers as a driver sees them through
 * QEMU, without the kernel's CXL core or our driver (run-faults.sh
 * --cxl-registers boots one device and loads neither): the DVSECs in config
 * space (/sys/bus/pci/devices/BDF/config) and the component registers in the
 * BAR the Register Locator names (resourceN, mapped), each row a register,
 * what is written, what the CXL specification (r3.1) says must be read. The
 * decoder and DVSEC locks hold until reset, so their rows come last. RAS
 * errors are raised by the daemon (the host channel: "ras ..."). One RESULT
 * line per row: <prefix>cxl_regs.<row>.
 */
#define CXL_VENDOR		0x1E98
#define CXL_UE_BITS		0x1CFFF		/* 8.2.4.17.1 */
#define CXL_CE_BITS		0x7F		/* 8.2.4.17.4 */
#define HDM_COMMIT		(1U << 9)
#define HDM_LOCK		(1U << 8)
#define HDM_COMMITTED		(1U << 10)
#define HDM_ERR			(1U << 11)

struct cxlregs {
	char bdf[32];
	int cfg;			/* config space */
	unsigned int dvsec[9];		/* DVSEC ID -> config offset (0: none) */
	volatile uint32_t *blk;		/* the component register block */
	size_t blk_len;
	unsigned int cm, ras, hdm;	/* offsets in the block */
	uint64_t size;			/* Range 1 size */
};

static uint32_t cfg_rd(struct cxlregs *r, unsigned int off)
{
	uint32_t v = ~0U;

	if (pread(r->cfg, &v, 4, off) != 4)
		return ~0U;
	return v;
}

static void cfg_wr(struct cxlregs *r, unsigned int off, uint32_t v)
{
	if (pwrite(r->cfg, &v, 4, off) != 4)
		fprintf(stderr, "config write %#x: %s\n", off, strerror(errno));
}

static uint32_t blk_rd(struct cxlregs *r, unsigned int off)
{
	return r->blk[off / 4];
}

static void blk_wr(struct cxlregs *r, unsigned int off, uint32_t v)
{
	r->blk[off / 4] = v;
}

/* Each CXL DVSEC's config offset, by its DVSEC ID; how many there are */
static unsigned int cxl_dvsecs(struct cxlregs *r)
{
	unsigned int off = 0x100, n = 0, hops;

	for (hops = 0; off && hops < 64; hops++) {
		uint32_t h = cfg_rd(r, off);

		if ((h & 0xFFFF) == 0x23 && (cfg_rd(r, off + 4) & 0xFFFF) == CXL_VENDOR &&
		    (cfg_rd(r, off + 8) & 0xFFFF) < 9) {
			r->dvsec[cfg_rd(r, off + 8) & 0xFFFF] = off;
			n++;
		}
		off = h >> 20;
	}
	return n;
}

/* len bytes at off of BAR bar of function bdf, through sysfs; MAP_FAILED (errno) */
static void *bar_map(const char *bdf, unsigned int bar, off_t off, size_t len)
{
	char p[128];
	void *m;
	int fd;

	snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/resource%u", bdf, bar);
	fd = open(p, O_RDWR | O_SYNC);
	if (fd < 0)
		return MAP_FAILED;
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);
	close(fd);
	return m;
}

/* The function with the CXL Device DVSEC: its config space, and the block */
static int cxl_regs_open(struct cxlregs *r, char *why, size_t n)
{
	DIR *d = opendir("/sys/bus/pci/devices");
	struct dirent *e;
	char p[256];
	uint32_t lo, bir, off;

	memset(r, 0, sizeof(*r));
	r->cfg = -1;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/config", e->d_name);
		r->cfg = open(p, O_RDWR);
		if (r->cfg < 0)
			continue;
		memset(r->dvsec, 0, sizeof(r->dvsec));
		if (cxl_dvsecs(r) && r->dvsec[0]) {
			snprintf(r->bdf, sizeof(r->bdf), "%s", e->d_name);
			break;
		}
		close(r->cfg);
		r->cfg = -1;
	}
	if (d)
		closedir(d);
	if (r->cfg < 0) {
		snprintf(why, n, "no PCI function with a CXL Device DVSEC");
		return -1;
	}
	if (!r->dvsec[8]) {
		snprintf(why, n, "%s: no Register Locator DVSEC", r->bdf);
		return -1;
	}
	/* Register Block 1 (8.1.9.1): BIR in bits 2:0, identifier 15:8, offset */
	lo = cfg_rd(r, r->dvsec[8] + 0xC);
	bir = lo & 7;
	off = lo & 0xFFFF0000;
	if (((lo >> 8) & 0xFF) != 1) {
		snprintf(why, n, "%s: register block 1 is not the component registers (%#x)",
			 r->bdf, lo);
		return -1;
	}
	r->blk_len = 0x10000;
	r->blk = bar_map(r->bdf, bir, off, r->blk_len);
	if (r->blk == MAP_FAILED) {
		snprintf(why, n, "%s: mmap of BAR%u at %#x: %s", r->bdf, bir, off, strerror(errno));
		return -1;
	}
	r->cm = 0x1000;			/* CXL.cache/mem registers (8.2.3) */
	return 0;
}

typedef int (*cxl_row_fn)(struct cxlregs *r, char *d, size_t n);
#define ROW_CHECK(cond, ...) do { if (!(cond)) { snprintf(d, n, __VA_ARGS__); return FAIL; } } while (0)

/* 8.1.3: the device DVSEC, revision and length; Flex Bus Port (7), Register Locator (8) */
static int row_dvsecs(struct cxlregs *r, char *d, size_t n)
{
	uint32_t h1 = cfg_rd(r, r->dvsec[0] + 4);

	ROW_CHECK(r->dvsec[7], "no Flex Bus Port DVSEC (ID 7)");
	ROW_CHECK(h1 >> 20 == 0x3C, "CXL Device DVSEC length %#x, want 0x3c", h1 >> 20);
	snprintf(d, n, "DVSEC IDs 0 at %#x (revision %u, length 0x3c), 7 at %#x, 8 at %#x, vendor 0x1e98",
		 r->dvsec[0], (h1 >> 16) & 0xF, r->dvsec[7], r->dvsec[8]);
	return PASS;
}

/* 8.1.3.1: Cache, IO and Mem capable, one HDM range */
static int row_capability(struct cxlregs *r, char *d, size_t n)
{
	uint32_t cap = cfg_rd(r, r->dvsec[0] + 8) >> 16;

	ROW_CHECK((cap & 0x37) == 0x17, "DVSEC CXL Capability %#x: want Cache, IO, Mem capable, HDM_Count 1", cap);
	snprintf(d, n, "Capability %#x: Cache_Capable, IO_Capable, Mem_Capable, HDM_Count 1", cap);
	return PASS;
}

/* 8.1.3.8: Range 1 size, Memory_Info_Valid and Memory_Active */
static int row_range_size(struct cxlregs *r, char *d, size_t n)
{
	uint32_t hi = cfg_rd(r, r->dvsec[0] + 0x18), lo = cfg_rd(r, r->dvsec[0] + 0x1C);

	r->size = (uint64_t)hi << 32 | (lo & 0xF0000000);
	ROW_CHECK((lo & 3) == 3, "Range 1 Size Low %#x: Memory_Info_Valid/Active not set", lo);
	ROW_CHECK(r->size && !(r->size & ((256 << 20) - 1)), "Range 1 size %#llx", (unsigned long long)r->size);
	snprintf(d, n, "Range 1 %llu MiB, Memory_Info_Valid, Memory_Active", (unsigned long long)(r->size >> 20));
	return PASS;
}

/* 8.1.3.2: IO_Enable reads 1 (RO), Mem_Enable is RW(L) */
static int row_control(struct cxlregs *r, char *d, size_t n)
{
	unsigned int c = r->dvsec[0] + 0xC;
	uint32_t v0, v1, v2;

	cfg_wr(r, c, 0);
	v0 = cfg_rd(r, c) & 0xFFFF;
	cfg_wr(r, c, 1U << 2);
	v1 = cfg_rd(r, c) & 0xFFFF;
	cfg_wr(r, c, 0);
	v2 = cfg_rd(r, c) & 0xFFFF;
	ROW_CHECK(v0 == 2 && v1 == 6 && v2 == 2, "Control after 0, Mem_Enable, 0: %#x %#x %#x (want 0x2 0x6 0x2)", v0, v1, v2);
	snprintf(d, n, "Control: 0 reads %#x (IO_Enable hardwired), Mem_Enable reads back %#x, cleared %#x", v0, v1, v2);
	return PASS;
}

/* 8.1.3.8: Range 1 base RW(L), 256 MiB granular */
static int row_range_base(struct cxlregs *r, char *d, size_t n)
{
	unsigned int b = r->dvsec[0] + 0x20;
	uint32_t hi, lo;

	cfg_wr(r, b, 0x1);
	cfg_wr(r, b + 4, 0x1FFFFFFF);
	hi = cfg_rd(r, b);
	lo = cfg_rd(r, b + 4);
	ROW_CHECK(hi == 1 && lo == 0x10000000, "Range 1 base after 0x1_1fffffff: %#x_%08x (want 0x1_10000000)", hi, lo);
	snprintf(d, n, "Range 1 base 0x1_1fffffff written, %#x_%08x read (bits 27:0 zero)", hi, lo);
	return PASS;
}

/* 8.1.3.6: CONFIG_LOCK, once set, freezes the RWL fields and itself */
static int row_config_lock(struct cxlregs *r, char *d, size_t n)
{
	unsigned int c = r->dvsec[0] + 0xC, b = r->dvsec[0] + 0x20, l = r->dvsec[0] + 0x14;
	uint32_t ctl, lo, lk;

	cfg_wr(r, l, 1);
	cfg_wr(r, c, 1U << 2);
	cfg_wr(r, b + 4, 0x20000000);
	cfg_wr(r, l, 0);
	ctl = cfg_rd(r, c) & 0xFFFF;
	lo = cfg_rd(r, b + 4);
	lk = cfg_rd(r, l) & 0xFFFF;
	ROW_CHECK(lk == 1 && ctl == 2 && lo == 0x10000000,
		  "after CONFIG_LOCK: lock %#x, Control %#x, base low %#x (want 1, 0x2, 0x10000000)", lk, ctl, lo);
	snprintf(d, n, "CONFIG_LOCK set: Mem_Enable and Range 1 base writes ignored, the lock stays (%#x)", lk);
	return PASS;
}

/* 8.2.4: the capability header and array (RAS and HDM decoder) */
static int row_capability_array(struct cxlregs *r, char *d, size_t n)
{
	uint32_t h = blk_rd(r, r->cm), e;
	unsigned int i, count = h >> 24;

	ROW_CHECK((h & 0xFFFF) == 1 && ((h >> 16) & 0xF) == 1, "CXL Capability Header %#x", h);
	for (i = 1; i <= count && i < 16; i++) {
		e = blk_rd(r, r->cm + 4 * i);
		if ((e & 0xFFFF) == 2)
			r->ras = r->cm + (e >> 20);
		if ((e & 0xFFFF) == 5)
			r->hdm = r->cm + (e >> 20);
	}
	ROW_CHECK(r->ras && r->hdm, "array of %u: RAS at %#x, HDM decoder at %#x", count, r->ras, r->hdm);
	snprintf(d, n, "header %#x: %u capabilities, RAS (ID 2) at %#x, HDM decoder (ID 5) at %#x",
		 h, count, r->ras, r->hdm);
	return PASS;
}

/* 8.2.4.20.1-2: one decoder, the global enable RW */
static int row_hdm(struct cxlregs *r, char *d, size_t n)
{
	uint32_t cap = blk_rd(r, r->hdm), g;

	blk_wr(r, r->hdm + 4, 2);
	g = blk_rd(r, r->hdm + 4);
	ROW_CHECK((cap & 0xF) == 0 && g == 2, "HDM Decoder Capability %#x (want count 0: one), Global Control %#x (want 2)", cap, g);
	snprintf(d, n, "HDM Decoder Capability %#x (one decoder), HDM_Decoder_Enable written, read %#x", cap, g);
	return PASS;
}

/* program decoder 0 and write its control; the control read back */
static uint32_t decoder0(struct cxlregs *r, uint64_t base, uint64_t size, uint32_t ctrl)
{
	unsigned int d0 = r->hdm + 0x10;

	blk_wr(r, d0 + 0x10, 0);		/* uncommitted first */
	blk_wr(r, d0, (uint32_t)base);
	blk_wr(r, d0 + 4, base >> 32);
	blk_wr(r, d0 + 8, (uint32_t)size);
	blk_wr(r, d0 + 0xC, size >> 32);
	blk_wr(r, d0 + 0x10, ctrl);
	return blk_rd(r, d0 + 0x10);
}

/* 8.2.4.20.7: Commit sets Committed; clearing Commit uncommits */
static int row_commit(struct cxlregs *r, char *d, size_t n)
{
	uint32_t c1 = decoder0(r, 0x100000000ULL, r->size, HDM_COMMIT), c2;

	blk_wr(r, r->hdm + 0x20, 0);
	c2 = blk_rd(r, r->hdm + 0x20);
	ROW_CHECK((c1 & (HDM_COMMITTED | HDM_ERR)) == HDM_COMMITTED && !(c2 & HDM_COMMITTED),
		  "commit: control %#x; uncommit: %#x", c1, c2);
	snprintf(d, n, "base 4 GiB, size %llu MiB, Commit: Committed (%#x); Commit cleared: not committed (%#x)",
		 (unsigned long long)(r->size >> 20), c1, c2);
	return PASS;
}

/* 8.2.4.20.7: what cannot be decoded is Error Not Committed */
static int row_commit_errors(struct cxlregs *r, char *d, size_t n)
{
	uint32_t zero = decoder0(r, 0x100000000ULL, 0, HDM_COMMIT);
	uint32_t big = decoder0(r, 0x100000000ULL, 2 * r->size, HDM_COMMIT);
	uint32_t ways = decoder0(r, 0x100000000ULL, r->size, HDM_COMMIT | (1U << 4));
	uint32_t base;

	blk_wr(r, r->hdm + 0x10, 0x1FFFFFFF);
	base = blk_rd(r, r->hdm + 0x10);
	ROW_CHECK((zero & (HDM_COMMITTED | HDM_ERR)) == HDM_ERR &&
		  (big & (HDM_COMMITTED | HDM_ERR)) == HDM_ERR &&
		  (ways & (HDM_COMMITTED | HDM_ERR)) == HDM_ERR && base == 0x10000000,
		  "size 0: %#x, twice the device: %#x, 2 ways: %#x (want Error Not Committed); base low %#x",
		  zero, big, ways, base);
	blk_wr(r, r->hdm + 0x20, 0);
	snprintf(d, n, "size 0, twice the device, 2-way interleave: Error Not Committed (%#x %#x %#x); base bits 27:0 read 0",
		 zero, big, ways);
	return PASS;
}

/* 8.2.4.17: the masks hold only the defined bits; severity likewise */
static int row_ras_masks(struct cxlregs *r, char *d, size_t n)
{
	uint32_t ue, ce, sev;

	blk_wr(r, r->ras + 4, ~0U);
	blk_wr(r, r->ras + 0x10, ~0U);
	blk_wr(r, r->ras + 8, ~0U);
	ue = blk_rd(r, r->ras + 4);
	ce = blk_rd(r, r->ras + 0x10);
	sev = blk_rd(r, r->ras + 8);
	ROW_CHECK(ue == CXL_UE_BITS && ce == CXL_CE_BITS && sev == CXL_UE_BITS,
		  "all ones written: UE mask %#x, CE mask %#x, severity %#x", ue, ce, sev);
	blk_wr(r, r->ras + 4, 0);
	blk_wr(r, r->ras + 0x10, 0);
	ue = blk_rd(r, r->ras + 4);
	ce = blk_rd(r, r->ras + 0x10);
	ROW_CHECK(!ue && !ce, "zeros written: UE mask %#x, CE mask %#x", ue, ce);
	snprintf(d, n, "all ones written: UE mask %#x, CE mask %#x, UE severity %#x; zeros read back", CXL_UE_BITS, CXL_CE_BITS, CXL_UE_BITS);
	return PASS;
}

/* 8.2.4.17.1-3, 7: an uncorrectable error, its pointer and header; RW1C */
static int row_ras_uncorrectable(struct cxlregs *r, char *d, size_t n)
{
	uint32_t st, fe, h0, st0, st1, h1;

	if (host_to(0, "ras --uncorrectable 14 --header 0x11,0x22,0x33,0x44")) {
		snprintf(d, n, "host: %.200s", reply);
		return FAIL;
	}
	st = blk_rd(r, r->ras);
	fe = blk_rd(r, r->ras + 0x14) & 0x3F;
	h0 = blk_rd(r, r->ras + 0x18);
	blk_wr(r, r->ras, 0);
	st0 = blk_rd(r, r->ras);
	blk_wr(r, r->ras, 1U << 14);
	st1 = blk_rd(r, r->ras);
	h1 = blk_rd(r, r->ras + 0x18);
	ROW_CHECK(st == 1U << 14 && fe == 14 && h0 == 0x11 && st0 == st && !st1 && !h1,
		  "raised bit 14: status %#x, first error %u, header %#x; 0 written %#x; 1 written %#x, header %#x",
		  st, fe, h0, st0, st1, h1);
	snprintf(d, n, "bit 14 raised: status %#x, First_Error_Pointer 14, header log 0x11..; 0 written: unchanged; 1 written: cleared, log cleared", st);
	return PASS;
}

/* 8.2.4.17.4: a correctable error, RW1C */
static int row_ras_correctable(struct cxlregs *r, char *d, size_t n)
{
	uint32_t st, st1;

	if (host_to(0, "ras --correctable 3")) {
		snprintf(d, n, "host: %.200s", reply);
		return FAIL;
	}
	st = blk_rd(r, r->ras + 0xC);
	blk_wr(r, r->ras + 0xC, 1U << 3);
	st1 = blk_rd(r, r->ras + 0xC);
	ROW_CHECK(st == 1U << 3 && !st1, "raised bit 3: status %#x; 1 written: %#x", st, st1);
	snprintf(d, n, "bit 3 raised: status %#x; 1 written: cleared", st);
	return PASS;
}

/* 8.2.4.20.7: Lock On Commit: fixed until reset (the resets below keep it) */
static int row_lock_on_commit(struct cxlregs *r, char *d, size_t n)
{
	uint32_t c1 = decoder0(r, 0x100000000ULL, r->size, HDM_COMMIT | HDM_LOCK), c2, base;

	blk_wr(r, r->hdm + 0x20, 0);
	blk_wr(r, r->hdm + 0x10, 0x20000000);
	c2 = blk_rd(r, r->hdm + 0x20);
	base = blk_rd(r, r->hdm + 0x10);
	ROW_CHECK((c1 & HDM_COMMITTED) && (c2 & (HDM_COMMITTED | HDM_LOCK)) == (HDM_COMMITTED | HDM_LOCK) &&
		  base == 0, "committed with Lock On Commit: %#x; after uncommit and a new base: %#x, base low %#x",
		  c1, c2, base);
	snprintf(d, n, "Commit with Lock On Commit: %#x; Commit cleared and base written: still %#x, base unchanged", c1, c2);
	return PASS;
}

/* the PCI Express capability's config offset (0: none) */
static unsigned int pcie_cap(struct cxlregs *r)
{
	unsigned int off = cfg_rd(r, 0x34) & 0xFC, hops;

	for (hops = 0; off && hops < 48; hops++) {
		uint32_t h = cfg_rd(r, off);

		if ((h & 0xFF) == 0x10)
			return off;
		off = (h >> 8) & 0xFC;
	}
	return 0;
}

/*
 * What the rows before left, which a reset must keep: decoder 0 committed
 * with Lock On Commit, CONFIG_LOCK with the Range 1 base, RAS masks cleared
 * (sticky). Empty when kept, else what changed.
 */
static void cxl_mem_state(struct cxlregs *r, char *d, size_t n)
{
	uint32_t c = blk_rd(r, r->hdm + 0x20);
	uint32_t lk = cfg_rd(r, r->dvsec[0] + 0x14) & 0xFFFF;
	uint32_t lo = cfg_rd(r, r->dvsec[0] + 0x24);
	uint32_t ue = blk_rd(r, r->ras + 4);

	d[0] = 0;
	if ((c & (HDM_COMMITTED | HDM_LOCK)) != (HDM_COMMITTED | HDM_LOCK) ||
	    lk != 1 || lo != 0x10000000 || ue)
		snprintf(d, n, "decoder 0 control %#x, CONFIG_LOCK %#x, base low %#x, UE mask %#x (want committed and locked, 1, 0x10000000, 0)",
			 c, lk, lo, ue);
}

/* PCIe r6 6.6.2, CXL r3.1 9.5: FLR resets the function, not CXL.mem state */
static int row_flr(struct cxlregs *r, char *d, size_t n)
{
	unsigned int pe = pcie_cap(r);
	uint32_t devcap, cmd, ctl;

	ROW_CHECK(pe, "no PCI Express capability");
	devcap = cfg_rd(r, pe + 4);
	ROW_CHECK(devcap & (1U << 28), "Device Capabilities %#x: not FLR capable", devcap);
	cmd = cfg_rd(r, 4) & 0xFFFF;
	cfg_wr(r, pe + 8, (cfg_rd(r, pe + 8) & 0xFFFF) | (1U << 15));
	usleep(100000);			/* the 100 ms after an FLR */
	ctl = cfg_rd(r, pe + 8) & 0xFFFF;
	cfg_wr(r, 4, cmd);		/* as the kernel restores it */
	ROW_CHECK(!(ctl & (1U << 15)), "Device Control %#x after FLR: Initiate FLR reads 1", ctl);
	cxl_mem_state(r, d, n);
	if (d[0])
		return FAIL;
	snprintf(d, n, "FLR capable (%#x); Initiate FLR written, reads 0; decoder 0 still committed and locked, CONFIG_LOCK and the base kept, RAS masks kept", devcap);
	return PASS;
}

/*
 * CXL r3.1 8.1.3.1, 8.1.3.4-5, 9.7: CXL Reset with Mem Clr: Reset Complete
 * within the advertised timeout, device memory zeroed, what is locked and
 * the sticky RAS registers kept (it clears device memory)
 */
static int row_cxl_reset(struct cxlregs *r, char *d, size_t n)
{
	unsigned int c2 = r->dvsec[0] + 0x10;
	uint32_t cap = cfg_rd(r, r->dvsec[0] + 8) >> 16, cmd, st = 0, before, after;
	volatile uint32_t *mem;
	int ms;

	ROW_CHECK((cap & 0x880) == 0x880 && ((cap >> 8) & 7) >= 1 && ((cap >> 8) & 7) <= 4,
		  "Capability %#x: want CXL Reset capable, Mem Clr capable, a timeout code 1-4", cap);
	mem = bar_map(r->bdf, 4, 0, 4096);
	ROW_CHECK(mem != MAP_FAILED, "device memory (BAR4): %s", strerror(errno));
	mem[0] = 0xC0FFEE;
	before = mem[0];
	cmd = cfg_rd(r, 4) & 0xFFFF;
	cfg_wr(r, c2, (1U << 2) | (1U << 3));	/* Initiate CXL Reset, Mem Clr Enable */
	for (ms = 0; ms <= 10000; ms += 10) {
		st = cfg_rd(r, c2) >> 16;
		if (st & (3U << 1))
			break;
		usleep(10000);
	}
	cfg_wr(r, 4, cmd);
	after = mem[0];
	munmap((void *)mem, 4096);
	ROW_CHECK((st & 6) == 2, "Status2 %#x: want CXL Reset Complete, no Reset Error", st);
	ROW_CHECK(before == 0xC0FFEE && !after,
		  "device memory word %#x before, %#x after (want 0: Mem Clr)", before, after);
	cxl_mem_state(r, d, n);
	if (d[0])
		return FAIL;
	snprintf(d, n, "Capability %#x; Initiate CXL Reset with Mem Clr: Reset Complete (Status2 %#x) within %d ms, device memory zeroed, locked decoder, CONFIG_LOCK, base and RAS masks kept", cap, st, ms);
	return PASS;
}

/*
 * PCIe r6 6.6.1, CXL r3.1 8.2.4.17: a conventional reset (a secondary bus
 * reset, through the kernel's cxl_bus reset method) takes the decoder, the
 * lock and the range base, keeps the sticky RAS masks and device memory
 * (the last row: it undoes the rows before)
 */
static int row_conventional_reset(struct cxlregs *r, char *d, size_t n)
{
	uint32_t c, lk, lo, ue, word;
	volatile uint32_t *mem;
	char p[256];
	int ret;

	mem = bar_map(r->bdf, 4, 0, 4096);
	ROW_CHECK(mem != MAP_FAILED, "device memory (BAR4): %s", strerror(errno));
	mem[1] = 0xBEEF;
	snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/reset_method", r->bdf);
	ROW_CHECK(!cxla_write_str(p, "cxl_bus"), "%s: cxl_bus: %s", p, strerror(errno));
	snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/reset", r->bdf);
	ret = cxla_write_str(p, "1");
	snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/reset_method", r->bdf);
	cxla_write_str(p, "default");
	ROW_CHECK(!ret, "bus reset: %s", strerror(-ret));
	c = blk_rd(r, r->hdm + 0x20);
	lk = cfg_rd(r, r->dvsec[0] + 0x14) & 0xFFFF;
	lo = cfg_rd(r, r->dvsec[0] + 0x24);
	ue = blk_rd(r, r->ras + 4);
	word = mem[1];
	munmap((void *)mem, 4096);
	ROW_CHECK(!(c & (HDM_COMMITTED | HDM_LOCK)) && !lk && !lo,
		  "decoder 0 control %#x, CONFIG_LOCK %#x, base low %#x: want all at their defaults",
		  c, lk, lo);
	ROW_CHECK(!ue && word == 0xBEEF, "UE mask %#x (want the sticky 0), memory word %#x (want kept)",
		  ue, word);
	snprintf(d, n, "bus reset (cxl_bus): decoder 0 uncommitted and unlocked (%#x), CONFIG_LOCK and the base cleared; RAS masks and device memory kept", c);
	return PASS;
}

static const struct { const char *name; cxl_row_fn fn; } cxl_rows[] = {
	{ "dvsecs", row_dvsecs }, { "capability", row_capability },
	{ "range_size", row_range_size }, { "control", row_control },
	{ "range_base", row_range_base }, { "config_lock", row_config_lock },
	{ "capability_array", row_capability_array }, { "hdm", row_hdm },
	{ "commit", row_commit }, { "commit_errors", row_commit_errors },
	{ "ras_masks", row_ras_masks }, { "ras_uncorrectable", row_ras_uncorrectable },
	{ "ras_correctable", row_ras_correctable }, { "lock_on_commit", row_lock_on_commit },
	{ "flr", row_flr }, { "cxl_reset", row_cxl_reset },
	{ "conventional_reset", row_conventional_reset },
};

CXLA_MODE(cxl_registers, "--cxl-registers", "", 0)
{
	struct cxlregs r;
	char why[512];
	size_t i;
	int rc = 0, v;

	if (prologue())
		return 1;
	if (cxl_regs_open(&r, why, sizeof(why))) {
		printf("RESULT %scxl_regs.open FAIL %s\n", cxla_opt.prefix, why);
		return 1;
	}
	printf("# CXL registers of %s (config space, component block)\n", r.bdf);
	for (i = 0; i < ARRAY_SIZE(cxl_rows); i++) {
		why[0] = 0;
		v = cxl_rows[i].fn(&r, why, sizeof(why));
		printf("RESULT %scxl_regs.%s %s %s\n", cxla_opt.prefix, cxl_rows[i].name,
		       v == PASS ? "PASS" : "FAIL", why);
		rc |= v != PASS;
	}
	return rc;
}
