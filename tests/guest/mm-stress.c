// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel seeded random memory stress with oracles.
 *
 *   mm-stress [-s SEED] [-t SECONDS] [-n PROCS] [-d DEV] [-P PEER-DEV]
 *             [-x OP[,OP...]] [-v]
 *
 * -x leaves operations out (names as in the summary), to narrow a failure
 * down.
 *
 * PROCS processes each own a private anonymous region and do random
 * operations on it: CPU writes, migration to either device and back, device
 * writes and reads through SVM (some with a 1 ms timeout, so that they are
 * given up and land later), long-term-pinned checksums, EVICT, munmap and
 * mmap, madvise(DONTNEED), mprotect, vmsplice() into pipes kept open, fork
 * (to depth 2) and SIGKILL of their children at random moments. One more
 * process per device keeps its DMA engines busy for random stretches (long
 * device atomics), so that short-timeout device writes are given up. After
 * every
 * operation the process compares its whole region with what it must hold
 * (each page: which process wrote it, which generation, or a fill pattern,
 * or zeros), also in children and grandchildren whose parents were killed
 * (the top process is their subreaper). Device checksums are compared with
 * the CPU's.
 *
 * A process that finds its memory changed prints the seed, its place in
 * the process tree, the operation and the last operations before it, and
 * exits with status 3. The run fails when any process did. Prints
 * "RESULT mm_stress PASS|FAIL <summary>". Timing (kills, timeouts) makes a
 * replay with the same seed do the same operations, not the same races.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/uio.h>

#include "cxla_test.h"

#define PG		4096UL
#define REGION_PAGES	256
#define MAX_DEPTH	2
#define MAX_CHILDREN	4
#define MAX_PIPES	4
#define MAX_SLOTS	4096	/* processes over the whole run */
#define HISTORY		16

enum { ST_DATA, ST_ZERO, ST_FILL };

/* What a page must hold */
struct pstate {
	uint8_t kind;
	uint32_t writer;	/* ST_DATA: the process that wrote it */
	uint32_t gen;		/* ST_DATA: its generation */
	uint64_t fill;		/* ST_FILL: the 64-bit pattern */
};

enum {
	OP_CPU_WRITE, OP_TO_DEV, OP_TO_PEER, OP_TO_RAM, OP_SVM_FILL,
	OP_SVM_FILL_SHORT, OP_SVM_CRC, OP_PIN_CRC, OP_EVICT, OP_REMAP,
	OP_DONTNEED, OP_MPROTECT, OP_SPLICE, OP_UNSPLICE, OP_FORK, OP_KILL,
	OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
	"cpu_write", "to_dev", "to_peer", "to_ram", "svm_fill",
	"svm_fill_1ms", "svm_crc", "pin_crc", "evict", "remap", "dontneed",
	"mprotect", "splice", "unsplice", "fork", "kill",
};

/* relative weights (-x sets some to 0) */
static unsigned int op_weight[OP_COUNT] = {
	10, 8, 4, 6, 6, 3, 4, 2, 1, 2, 2, 2, 2, 2, 2, 2,
};

/* shared by every process of the run */
struct shared {
	volatile uint32_t next_slot;
	volatile uint32_t corrupt;
	uint64_t ops[OP_COUNT];		/* done, all processes */
	uint64_t timeouts;		/* device writes given up (and landed later) */
	uint64_t pages_migrated;
	uint64_t pages_checked;
	uint64_t killed;
	uint64_t forks;
};

struct proc {
	uint32_t slot;			/* unique id: writer of its pages */
	uint64_t rng;
	int depth;
	char path[64];			/* place in the process tree, e.g. 2.1.0 */
	uint8_t *region;
	struct pstate st[REGION_PAGES];
	int fd, pfd;			/* devices (pfd may be -1) */
	pid_t children[MAX_CHILDREN];
	int nchildren;
	int pipes[MAX_PIPES];
	int npipes;
	unsigned long opno;
	int history[HISTORY];
};

static struct shared *sh;
static uint64_t run_seed;
static double deadline;
static bool verbose;

static uint64_t splitmix(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ULL;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
	return x ^ (x >> 31);
}

static uint64_t rnd(struct proc *p)
{
	return rnd64(&p->rng);
}

static unsigned int rnd_below(struct proc *p, unsigned int n)
{
	return (unsigned int)(rnd(p) % n);
}

static void page_expect(const struct pstate *s, size_t page, uint8_t *out)
{
	switch (s->kind) {
	case ST_ZERO:
		memset(out, 0, PG);
		break;
	case ST_FILL:
		for (size_t i = 0; i < PG; i += 8)
			memcpy(out + i, &s->fill, 8);
		break;
	default:
		fill_random(out, PG, splitmix(((uint64_t)s->writer << 40) ^
					      ((uint64_t)page << 24) ^ s->gen));
		break;
	}
}

static void describe(const struct pstate *s, char *buf, size_t len)
{
	if (s->kind == ST_ZERO)
		snprintf(buf, len, "zeros");
	else if (s->kind == ST_FILL)
		snprintf(buf, len, "fill %#llx", (unsigned long long)s->fill);
	else
		snprintf(buf, len, "data of process %u generation %u", s->writer,
			 s->gen);
}

static void report(struct proc *p, int op, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Memory is not what it must be: say everything needed to look into it. */
static void report(struct proc *p, int op, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	int i;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	__sync_fetch_and_add(&sh->corrupt, 1);
	printf("mm-stress: CORRUPTION seed %llu process %s (pid %d, slot %u, depth %d) after op %lu (%s): %s\n",
	       (unsigned long long)run_seed, p->path, getpid(), p->slot,
	       p->depth, p->opno, op_names[op], msg);
	printf("mm-stress:   last operations:");
	for (i = HISTORY; i > 0; i--) {
		int h = p->history[(p->opno + HISTORY - i) % HISTORY];

		if (h >= 0)
			printf(" %s", op_names[h]);
	}
	printf("\n");
	fflush(stdout);
	_exit(3);
}

/* Does page i hold what it must? If not, which known state does it match? */
static bool page_ok(struct proc *p, size_t i, uint8_t *scratch)
{
	page_expect(&p->st[i], i, scratch);
	return !memcmp(p->region + i * PG, scratch, PG);
}

static void verify(struct proc *p, int op)
{
	uint8_t want[PG];
	size_t i;

	for (i = 0; i < REGION_PAGES; i++) {
		if (page_ok(p, i, want))
			continue;
		{
			const uint8_t *got = p->region + i * PG;
			char d[80];
			size_t k = 0;

			while (k < PG && got[k] == want[k])
				k++;
			describe(&p->st[i], d, sizeof(d));
			report(p, op, "page %zu of %d differs from byte %zu on (must hold %s; holds %02x%02x%02x%02x%02x%02x%02x%02x...)",
			       i, REGION_PAGES, k, d, got[0], got[1], got[2],
			       got[3], got[4], got[5], got[6], got[7]);
		}
	}
	__sync_fetch_and_add(&sh->pages_checked, REGION_PAGES);
}

static void write_page(struct proc *p, size_t i)
{
	p->st[i].kind = ST_DATA;
	p->st[i].writer = p->slot;
	p->st[i].gen++;
	page_expect(&p->st[i], i, p->region + i * PG);
}

/* a random page range [*first, *first + *n) */
static void pick_range(struct proc *p, size_t *first, size_t *n)
{
	*first = rnd_below(p, REGION_PAGES);
	*n = 1 + rnd_below(p, REGION_PAGES - *first);
	if (rnd_below(p, 4) == 0) {	/* often the whole region */
		*first = 0;
		*n = REGION_PAGES;
	}
}

static uint32_t expected_crc(struct proc *p, size_t first, size_t n)
{
	uint8_t page[PG];
	uint32_t crc = 0;
	size_t i;

	for (i = first; i < first + n; i++) {
		page_expect(&p->st[i], i, page);
		crc = crc32c(crc, page, PG);
	}
	return crc;
}

/* Errors a random operation may meet without anything being wrong */
static bool benign(int r)
{
	return r == -EBUSY || r == -ENOSPC || r == -ENOMEM || r == -EINTR ||
	       r == -ETIMEDOUT || r == -EAGAIN;
}

static void fail_op(struct proc *p, int op, int r)
{
	printf("mm-stress: process %s op %lu (%s): unexpected error %d (%s)\n",
	       p->path, p->opno, op_names[op], r, strerror(-r));
	fflush(stdout);
	_exit(2);
}

/*
 * A device write in [first, first + n) returned an error: it may still land
 * (quarantined). An mprotect() round trip invalidates the range, and the
 * driver's invalidation waits until the device is done with it; after that
 * each page holds the old or the new contents, whole, and keeps it.
 */
static void settle(struct proc *p, int op, size_t first, size_t n,
		   const struct pstate *new)
{
	uint8_t want[PG];
	size_t i;

	if (mprotect(p->region + first * PG, n * PG, PROT_READ) ||
	    mprotect(p->region + first * PG, n * PG, PROT_READ | PROT_WRITE))
		fail_op(p, op, -errno);
	for (i = first; i < first + n; i++) {
		if (page_ok(p, i, want))
			continue;
		page_expect(new, i, want);
		if (!memcmp(p->region + i * PG, want, PG)) {
			p->st[i] = *new;
			continue;
		}
		report(p, op, "page %zu after a given-up device write holds neither the old nor the new contents",
		       i);
	}
}

static void do_svm_fill(struct proc *p, int op, bool short_timeout)
{
	struct pstate fill = { .kind = ST_FILL, .fill = rnd(p) | 1 };
	struct cxl_accel_svm s = { 0 };
	size_t first, n, i;
	int r;

	pick_range(p, &first, &n);
	s.addr = (uintptr_t)(p->region + first * PG);
	s.len = n * PG;
	s.op = CXL_ACCEL_SVM_FILL;
	s.value = fill.fill;
	s.timeout_ms = short_timeout ? 1 : 0;
	r = cxla_ioctl(rnd_below(p, 2) && p->pfd >= 0 ? p->pfd : p->fd,
		       CXL_ACCEL_IOC_SVM, &s);
	if (!r) {
		for (i = first; i < first + n; i++)
			p->st[i] = fill;
		return;
	}
	if (!benign(r))
		fail_op(p, op, r);
	__sync_fetch_and_add(&sh->timeouts, 1);
	settle(p, op, first, n, &fill);
}

static void do_migrate(struct proc *p, int op, int fd, bool to_dev)
{
	struct cxl_accel_migrate m;
	size_t first, n;
	int r;

	pick_range(p, &first, &n);
	r = cxla_migrate(fd, p->region + first * PG, n * PG, to_dev, &m);
	if (r && !benign(r))
		fail_op(p, op, r);
	if (!r)
		__sync_fetch_and_add(&sh->pages_migrated, m.migrated);
}

static void do_crc(struct proc *p, int op, bool pin)
{
	size_t first, n;
	uint32_t want, got;
	int r;

	pick_range(p, &first, &n);
	want = expected_crc(p, first, n);
	if (pin) {
		struct cxl_accel_pin_checksum pc = {
			.addr = (uintptr_t)(p->region + first * PG),
			.len = n * PG,
		};

		r = cxla_ioctl(p->fd, CXL_ACCEL_IOC_PIN_CHECKSUM, &pc);
		got = pc.crc;
	} else {
		struct cxl_accel_svm s = {
			.addr = (uintptr_t)(p->region + first * PG),
			.len = n * PG, .op = CXL_ACCEL_SVM_CHECKSUM,
		};

		r = cxla_ioctl(p->fd, CXL_ACCEL_IOC_SVM, &s);
		got = (uint32_t)s.value;
	}
	if (r) {
		if (!benign(r))
			fail_op(p, op, r);
		return;
	}
	if (got != want)
		report(p, op, "device crc32c of pages %zu-%zu is %#x, their contents give %#x",
		       first, first + n - 1, got, want);
}

static void do_remap(struct proc *p, int op, bool dontneed)
{
	size_t first, n, i;
	void *a;

	pick_range(p, &first, &n);
	if (dontneed) {
		if (madvise(p->region + first * PG, n * PG, MADV_DONTNEED))
			fail_op(p, op, -errno);
	} else {
		a = mmap(p->region + first * PG, n * PG, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		if (a == MAP_FAILED)
			fail_op(p, op, -errno);
	}
	for (i = first; i < first + n; i++)
		p->st[i] = (struct pstate){ .kind = ST_ZERO };
}

static void do_splice(struct proc *p, int op)
{
	struct iovec iov;
	size_t first, n;
	int fds[2];

	if (p->npipes == MAX_PIPES)
		return;
	if (pipe2(fds, O_NONBLOCK))
		fail_op(p, op, -errno);
	first = rnd_below(p, REGION_PAGES - 8);
	n = 1 + rnd_below(p, 8);
	iov.iov_base = p->region + first * PG;
	iov.iov_len = n * PG;
	/* the pipe holds these pages (wherever they are) while it lives */
	if (vmsplice(fds[1], &iov, 1, SPLICE_F_NONBLOCK) < 0 && errno != EAGAIN)
		fail_op(p, op, -errno);
	close(fds[0]);
	p->pipes[p->npipes++] = fds[1];
}

static void worker(struct proc *p);

static void do_fork(struct proc *p)
{
	uint32_t slot;
	pid_t pid;

	if (p->depth >= MAX_DEPTH || p->nchildren >= MAX_CHILDREN)
		return;
	slot = __sync_fetch_and_add(&sh->next_slot, 1);
	if (slot >= MAX_SLOTS)
		return;
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		return;
	if (!pid) {
		char path[64];

		alarm((unsigned int)(deadline - now_sec()) + 300);
		snprintf(path, sizeof(path), "%s.%d", p->path, p->nchildren);
		snprintf(p->path, sizeof(p->path), "%s", path);
		p->slot = slot;
		p->depth++;
		p->rng = splitmix(run_seed ^ ((uint64_t)slot << 32)) | 1;
		p->nchildren = 0;	/* the parent's children are not ours */
		worker(p);		/* does not return */
	}
	__sync_fetch_and_add(&sh->forks, 1);
	p->children[p->nchildren++] = pid;
}

static void do_kill(struct proc *p)
{
	int i;

	if (!p->nchildren)
		return;
	i = rnd_below(p, p->nchildren);
	if (kill(p->children[i], SIGKILL) == 0)
		__sync_fetch_and_add(&sh->killed, 1);
	/* reaped by the top process (subreaper) or by us at the end */
	p->children[i] = p->children[--p->nchildren];
}

static int pick_op(struct proc *p)
{
	unsigned int total = 0, r, i;

	for (i = 0; i < OP_COUNT; i++)
		total += op_weight[i];
	r = rnd_below(p, total);
	for (i = 0; r >= op_weight[i]; i++)
		r -= op_weight[i];
	return i;
}

static void worker(struct proc *p)
{
	struct cxl_accel_evict e;
	size_t first, n, i;
	int op, r;

	while (now_sec() < deadline) {
		op = pick_op(p);
		p->history[p->opno % HISTORY] = op;
		switch (op) {
		case OP_CPU_WRITE:
			pick_range(p, &first, &n);
			for (i = first; i < first + n; i++)
				if (rnd_below(p, 2))
					write_page(p, i);
			break;
		case OP_TO_DEV:
			do_migrate(p, op, p->fd, true);
			break;
		case OP_TO_PEER:
			if (p->pfd >= 0)
				do_migrate(p, op, p->pfd, true);
			break;
		case OP_TO_RAM:
			do_migrate(p, op, rnd_below(p, 2) && p->pfd >= 0 ?
				   p->pfd : p->fd, false);
			break;
		case OP_SVM_FILL:
		case OP_SVM_FILL_SHORT:
			do_svm_fill(p, op, op == OP_SVM_FILL_SHORT);
			break;
		case OP_SVM_CRC:
		case OP_PIN_CRC:
			do_crc(p, op, op == OP_PIN_CRC);
			break;
		case OP_EVICT:
			memset(&e, 0, sizeof(e));
			r = cxla_ioctl(rnd_below(p, 2) && p->pfd >= 0 ? p->pfd : p->fd,
				       CXL_ACCEL_IOC_EVICT, &e);
			if (r && !benign(r))
				fail_op(p, op, r);
			break;
		case OP_REMAP:
		case OP_DONTNEED:
			do_remap(p, op, op == OP_DONTNEED);
			break;
		case OP_MPROTECT:
			pick_range(p, &first, &n);
			if (mprotect(p->region + first * PG, n * PG, PROT_READ) ||
			    mprotect(p->region + first * PG, n * PG,
				     PROT_READ | PROT_WRITE))
				fail_op(p, op, -errno);
			break;
		case OP_SPLICE:
			do_splice(p, op);
			break;
		case OP_UNSPLICE:
			if (p->npipes)
				close(p->pipes[--p->npipes]);
			break;
		case OP_FORK:
			do_fork(p);
			break;
		case OP_KILL:
			do_kill(p);
			break;
		}
		__sync_fetch_and_add(&sh->ops[op], 1);
		verify(p, op);
		if (verbose && !(p->opno % 500))
			printf("mm-stress: %s at op %lu\n", p->path, p->opno);
		p->opno++;
	}
	_exit(0);
}

/* Keeps a device's engines busy now and then: long fetch-adds. */
static void hog(const char *path, uint64_t seed)
{
	uint64_t rng = splitmix(seed) | 1;
	struct cxl_accel_alloc a;
	int fd = open(path, O_RDWR), r;

	if (fd < 0 || cxla_alloc(fd, PG, 0, &a))
		_exit(2);
	while (now_sec() < deadline) {
		r = cxla_atomic(fd, cxla_dev(a.handle, 0),
				CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 1, 0,
				1 + rnd64(&rng) % (1ULL << 24), 60000, NULL);
		if (r && !benign(r))
			_exit(2);
		usleep(rnd64(&rng) % 200000);
	}
	_exit(0);
}

static int open_dev(const char *path)
{
	int fd = path ? open(path, O_RDWR) : -1;

	if (path && fd < 0) {
		printf("RESULT mm_stress FAIL open %s: %s\n", path, strerror(errno));
		exit(1);
	}
	return fd;
}

int main(int argc, char **argv)
{
	const char *dev = "/dev/cxl-accel0", *peer = NULL;
	int secs = 60, nprocs = 4, i, status, bad = 0, errors = 0, opt;
	uint64_t total = 0;
	double t0;
	pid_t pid;

	run_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
	while ((opt = getopt(argc, argv, "s:t:n:d:P:x:v")) != -1) {
		switch (opt) {
		case 'x':
			for (char *t = strtok(optarg, ","); t; t = strtok(NULL, ",")) {
				for (i = 0; i < OP_COUNT && strcmp(t, op_names[i]); i++)
					;
				if (i == OP_COUNT) {
					fprintf(stderr, "mm-stress: no operation %s\n", t);
					return 2;
				}
				op_weight[i] = 0;
			}
			break;
		case 's':
			run_seed = strtoull(optarg, NULL, 0);
			break;
		case 't':
			secs = atoi(optarg);
			break;
		case 'n':
			nprocs = atoi(optarg);
			break;
		case 'd':
			dev = optarg;
			break;
		case 'P':
			peer = optarg;
			break;
		case 'v':
			verbose = true;
			break;
		default:
			fprintf(stderr, "usage: %s [-s seed] [-t seconds] [-n procs] [-d dev] [-P peer-dev] [-x op,...] [-v]\n",
				argv[0]);
			return 2;
		}
	}
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 2;
	printf("mm-stress: seed %llu, %d processes, %d s, devices %s%s%s\n",
	       (unsigned long long)run_seed, nprocs, secs, dev,
	       peer ? " and " : "", peer ? peer : "");
	fflush(stdout);
	/* orphaned grandchildren come to us: their verdicts count */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	t0 = now_sec();
	deadline = t0 + secs;
	for (i = 0; i < nprocs; i++) {
		struct proc *p = calloc(1, sizeof(*p));

		if (!p)
			return 2;
		p->slot = __sync_fetch_and_add(&sh->next_slot, 1);
		p->rng = splitmix(run_seed ^ ((uint64_t)p->slot << 32)) | 1;
		snprintf(p->path, sizeof(p->path), "%d", i);
		memset(p->history, -1, sizeof(p->history));
		pid = fork();
		if (pid < 0)
			return 2;
		if (!pid) {
			alarm(secs + 300);	/* a hang ends as a failure */
			p->fd = open_dev(dev);
			p->pfd = open_dev(peer);
			p->region = map_anon(REGION_PAGES * PG);
			if (!p->region)
				_exit(2);
			madvise(p->region, REGION_PAGES * PG, MADV_NOHUGEPAGE);
			for (size_t k = 0; k < REGION_PAGES; k++)
				write_page(p, k);
			worker(p);
		}
		free(p);
	}
	/* engine hogs, one per device (as many engines as it has) */
	for (i = 0; i < (peer ? 4 : 2); i++) {
		pid = fork();
		if (pid < 0)
			return 2;
		if (!pid) {
			alarm(secs + 300);
			hog(i % 2 && peer ? peer : dev, run_seed ^ (0x4f6 + i));
		}
	}
	/* every process of the tree, also reparented ones */
	while ((pid = wait(&status)) > 0 || errno == EINTR) {
		if (pid <= 0)
			continue;
		if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
			bad++;
		} else if ((WIFEXITED(status) && WEXITSTATUS(status)) ||
			   (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL)) {
			errors++;
			printf("mm-stress: process %d ended with %s %d\n", pid,
			       WIFEXITED(status) ? "status" : "signal",
			       WIFEXITED(status) ? WEXITSTATUS(status) :
			       WTERMSIG(status));
		}
	}
	for (i = 0; i < OP_COUNT; i++)
		total += sh->ops[i];
	printf("mm-stress: %llu operations in %.0f s by %u processes (%llu forks, %llu killed): %llu pages migrated, %llu device writes given up (landed later), %llu pages verified\n",
	       (unsigned long long)total, now_sec() - t0, sh->next_slot,
	       (unsigned long long)sh->forks, (unsigned long long)sh->killed,
	       (unsigned long long)sh->pages_migrated,
	       (unsigned long long)sh->timeouts,
	       (unsigned long long)sh->pages_checked);
	printf("mm-stress: per operation:");
	for (i = 0; i < OP_COUNT; i++)
		printf(" %s %llu", op_names[i], (unsigned long long)sh->ops[i]);
	printf("\n");
	printf("RESULT mm_stress %s seed %llu: %llu operations, %u processes, %d corrupted, %d failed otherwise\n",
	       bad || errors ? "FAIL" : "PASS", (unsigned long long)run_seed,
	       (unsigned long long)total, sh->next_slot, bad, errors);
	return bad || errors ? 1 : 0;
}
