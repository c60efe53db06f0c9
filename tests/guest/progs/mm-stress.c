// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel seeded random memory stress with oracles, one test (mm_stress)
 * on the harness of cxla_harness.h.
 *
 *   mm-stress [-s SEED] [-t SECONDS] [-n PROCS] [-d DEV] [-P PEER-DEV]
 *             [-x OP[,OP...]] [-v] [-T]
 *
 * -x leaves operations out (names as in the summary), to narrow a failure
 * down; -T gives every process a helper thread (see helper_main()). -t is
 * the run's length here, not a test name.
 *
 * PROCS process trees each own a private anonymous region and do random
 * operations on it (half the trees only read it with the device, and
 * those start from one region that the top process wrote, inside a
 * transparent huge page, so that their pages are shared copy-on-write
 * across trees until migrations and writes split them): CPU writes,
 * migration to either device (coherent, and device-private where the
 * kernel has it) and back, device
 * writes and reads through SVM (some with a 1 ms timeout, so that they are
 * given up and land later), long-term-pinned checksums, EVICT, munmap and
 * mmap, madvise(DONTNEED), mprotect, vmsplice() into pipes kept open, fork
 * (to depth 2) and SIGKILL of their children at random moments. One more
 * process per device keeps its DMA engines busy for random stretches (long
 * device atomics), so that short-timeout device writes are given up. After
 * every operation the process compares its whole region with what it must hold
 * (each page: which process wrote it, which generation, or a fill pattern,
 * or zeros), also in children and grandchildren whose parents were killed
 * (the top process is their subreaper). Device checksums are compared with
 * the CPU's.
 *
 * A process that finds its memory changed prints the seed, its place in
 * the process tree, the operation and the last operations before it, and
 * exits with status 3. The run fails when any process did. The harness
 * prints "RESULT mm_stress PASS|FAIL <summary>". Timing (kills, timeouts)
 * makes a replay with the same seed do the same operations, not the same
 * races.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/uio.h>

#include "cxla_harness.h"

#define PG		4096UL
#define MAX_REGION_PAGES	512	/* 2 MiB: a huge page */
#define MAX_DEPTH	2
#define MAX_CHILDREN	4
#define MAX_PIPES	4
#define MAX_SLOTS	4096	/* processes over the whole run */
#define HISTORY		16
#define MAX_BUFS	4
#define BUF_PAGES	16

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
	OP_KILL_PARENT, OP_BUF_NEW, OP_BUF_WORK, OP_BUF_FREE, OP_BUF_DMABUF,
	OP_IMPORT_WORK, OP_TO_PRIVATE, OP_COPY_MODE, OP_BAD_MIGRATE,
	OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
	"cpu_write", "to_dev", "to_peer", "to_ram", "svm_fill",
	"svm_fill_1ms", "svm_crc", "pin_crc", "evict", "remap", "dontneed",
	"mprotect", "splice", "unsplice", "fork", "kill", "kill_parent",
	"buf_new", "buf_work", "buf_free", "buf_dmabuf", "import_work",
	"to_private", "copy_mode", "bad_migrate",
};

/* relative weights (-x sets some to 0) */
static unsigned int op_weight[OP_COUNT] = {
	10, 8, 4, 6, 6, 3, 4, 2, 1, 2, 2, 2, 2, 2, 2, 2, 1, 2, 3, 2, 1, 2,
	6,	/* to_private: 0 where the kernel has no DEVICE_PRIVATE */
	1,	/* copy_mode: 0 where the driver has no cpu_copy_pages */
	2,	/* bad_migrate */
};

/*
 * The driver copies small migrations with the CPU (cpu_copy_pages): most
 * of this stress's sub-ranges would never see the device's copy engine,
 * its page holds and quarantine. copy_mode switches the whole guest
 * between that and device copies for every migration, so a run has both.
 */
#define COPY_PARAM "/sys/module/cxl_accel/parameters/cpu_copy_pages"
static unsigned int copy_default;	/* the value before the run */
static pid_t copy_owner;		/* the process that puts it back */

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
	uint64_t helper_ops;		/* -T: by the helper threads */
	pid_t top;			/* the subreaper: never killed */
};

/* A device buffer of the process, mapped, with what each page must hold */
struct dbuf {
	int fd;				/* the device it is on */
	uint32_t handle;
	uint64_t mmap_offset;
	size_t pages;
	uint8_t *map;
	struct pstate st[BUF_PAGES];
	uint8_t shadow[BUF_PAGES * PG];	/* what map must hold */
};

/*
 * An import kept after its exporter freed the buffer: the DMA-BUF alone
 * keeps the memory, which the importer fills and everyone reads.
 */
#define MAX_KEPT	2
struct kept {
	int ifd;			/* the importing device's file */
	uint32_t handle;		/* the import */
	int dmabuf;
	size_t pages;
	uint8_t *map;			/* the DMA-BUF's own mapping */
	uint8_t shadow[BUF_PAGES * PG];
};

struct proc {
	uint32_t slot;			/* unique id: writer of its pages */
	uint64_t rng;
	int depth;
	char path[64];			/* place in the process tree, e.g. 2.1.0 */
	uint8_t *region;
	struct pstate st[MAX_REGION_PAGES];
	size_t npages;			/* of the region */
	uint8_t *shadow;		/* what region must hold, byte for byte */
	int fd, pfd;			/* devices (pfd may be -1) */
	pid_t children[MAX_CHILDREN];
	int nchildren;
	int pipes[MAX_PIPES];
	int npipes;
	unsigned long opno;
	int history[HISTORY];
	bool cpu_only;			/* the device never writes the region */
	bool helper;			/* the helper thread's view of a process */
	struct dbuf bufs[MAX_BUFS];
	struct kept kept[MAX_KEPT];	/* imports that outlive their buffer */
	int nkept;
	int nbufs;
	uint32_t buf_gen;		/* writer ids of buffer contents */
};

static struct shared *sh;
static uint64_t run_seed;
static bool seed_given;		/* -s */
static int run_secs = 60;	/* -t */
static int nprocs = 4;		/* -n: process trees */
static double deadline;
static bool verbose;		/* -v */
static bool with_helper;	/* -T: a second thread per process */
static bool own_files;		/* -F: every process opens the devices itself */
static bool self_test;		/* -B: a page changes behind the oracle's back */
static const char *dev_path, *peer_path;

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

/* Page i must hold state s from now on (its copy in the shadow too). */
static void set_page(struct proc *p, size_t i, const struct pstate *s)
{
	p->st[i] = *s;
	page_expect(s, i, p->shadow + i * PG);
}

/* Does page i hold what it must? scratch gets what it must hold. */
static bool page_ok(struct proc *p, size_t i, uint8_t *scratch)
{
	memcpy(scratch, p->shadow + i * PG, PG);
	return !memcmp(p->region + i * PG, scratch, PG);
}

/* The frame a virtual page is mapped to (root's pagemap), or 0 */
static uint64_t frame_of(const void *addr)
{
	uint64_t e = 0;
	int fd = open("/proc/self/pagemap", O_RDONLY);

	if (fd < 0)
		return 0;
	if (pread(fd, &e, sizeof(e), (uintptr_t)addr / PG * sizeof(e)) != sizeof(e))
		e = 0;
	close(fd);
	return e >> 63 ? e & ((1ULL << 55) - 1) : 0;
}

/* What page i holds instead, if it is something this run wrote: a guess. */
static void identify(struct proc *p, size_t i, char *buf, size_t len)
{
	const uint8_t *got = p->region + i * PG;
	uint8_t *cand = malloc(PG);
	struct pstate s = { .kind = ST_DATA };
	size_t j;

	snprintf(buf, len, "nothing this run wrote there");
	if (!cand)
		return;
	for (j = 0; j < p->npages; j++) {
		if (j != i && !memcmp(got, p->shadow + j * PG, PG)) {
			snprintf(buf, len, "what page %zu must hold", j);
			goto out;
		}
	}
	memset(cand, 0, PG);
	if (!memcmp(got, cand, PG)) {
		snprintf(buf, len, "zeros");
		goto out;
	}
	/* older data of any process at this page */
	for (s.writer = 0; s.writer < sh->next_slot; s.writer++) {
		for (s.gen = 1; s.gen <= p->st[i].gen + 16; s.gen++) {
			page_expect(&s, i, cand);
			if (!memcmp(got, cand, PG)) {
				snprintf(buf, len, "data of process %u generation %u",
					 s.writer, s.gen);
				goto out;
			}
		}
	}
out:
	free(cand);
}

/*
 * Before the report: how many pages are wrong, what they hold, and whether
 * the CPU saw what the page tables map. The device reads through the page
 * tables (SVM CHECKSUM); an mprotect() round trip flushes every CPU's TLB
 * for the region: a page that reads differently after it had been read
 * through a stale TLB entry before.
 */
static void diagnose(struct proc *p)
{
	uint8_t *before = malloc(p->npages * PG);
	size_t i, bad = 0, shown = 0, changed = 0;
	char what[96];

	if (!before)
		return;
	memcpy(before, p->region, p->npages * PG);
	for (i = 0; i < p->npages; i++) {
		struct cxl_accel_svm sv = {
			.addr = (uintptr_t)(p->region + i * PG),
			.len = PG, .op = CXL_ACCEL_SVM_CHECKSUM,
		};
		bool dev_ok;

		if (!memcmp(before + i * PG, p->shadow + i * PG, PG))
			continue;
		bad++;
		if (shown == 8)
			continue;
		shown++;
		dev_ok = !cxla_ioctl(p->fd, CXL_ACCEL_IOC_SVM, &sv);
		identify(p, i, what, sizeof(what));
		printf("mm-stress:   page %zu (frame %#llx) holds %s; the device reads %s\n",
		       i, (unsigned long long)frame_of(p->region + i * PG), what,
		       !dev_ok ? "nothing (SVM failed)" :
		       (uint32_t)sv.value == crc32c(0, before + i * PG, PG) ?
		       "the same" :
		       (uint32_t)sv.value == crc32c(0, p->shadow + i * PG, PG) ?
		       "what it must hold" : "something else");
	}
	if (!mprotect(p->region, p->npages * PG, PROT_READ) &&
	    !mprotect(p->region, p->npages * PG, PROT_READ | PROT_WRITE))
		for (i = 0; i < p->npages; i++)
			changed += !!memcmp(before + i * PG, p->region + i * PG, PG);
	printf("mm-stress:   %zu of %zu pages wrong; %zu read differently after a TLB flush\n",
	       bad, p->npages, changed);
	free(before);
}

static void verify(struct proc *p, int op)
{
	uint8_t want[PG];
	size_t i;

	if (!memcmp(p->region, p->shadow, p->npages * PG)) {
		__sync_fetch_and_add(&sh->pages_checked, p->npages);
		return;
	}
	for (i = 0; i < p->npages; i++) {
		if (page_ok(p, i, want))
			continue;
		{
			const uint8_t *got = p->region + i * PG;
			char d[80];
			size_t k = 0;

			while (k < PG && got[k] == want[k])
				k++;
			describe(&p->st[i], d, sizeof(d));
			diagnose(p);
			report(p, op, "page %zu of %zu differs from byte %zu on (must hold %s; holds %02x%02x%02x%02x%02x%02x%02x%02x...)",
			       i, p->npages, k, d, got[0], got[1], got[2],
			       got[3], got[4], got[5], got[6], got[7]);
		}
	}
	__sync_fetch_and_add(&sh->pages_checked, p->npages);
}

static void write_page(struct proc *p, size_t i)
{
	struct pstate s = {
		.kind = ST_DATA, .writer = p->slot, .gen = p->st[i].gen + 1,
	};

	set_page(p, i, &s);
	memcpy(p->region + i * PG, p->shadow + i * PG, PG);
}

/* a random page range [*first, *first + *n) */
static void pick_range(struct proc *p, size_t *first, size_t *n)
{
	*first = rnd_below(p, p->npages);
	*n = 1 + rnd_below(p, p->npages - *first);
	if (rnd_below(p, 4) == 0) {	/* often the whole region */
		*first = 0;
		*n = p->npages;
	}
}

static uint32_t expected_crc(struct proc *p, size_t first, size_t n)
{
	return crc32c(0, p->shadow + first * PG, n * PG);
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
static void settle_given_up_write(struct proc *p, int op, size_t first, size_t n,
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
			set_page(p, i, new);
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
			set_page(p, i, &fill);
		return;
	}
	if (!benign(r))
		fail_op(p, op, r);
	__sync_fetch_and_add(&sh->timeouts, 1);
	settle_given_up_write(p, op, first, n, &fill);
}

static void do_migrate(struct proc *p, int op, int fd, bool to_dev,
		       uint32_t flags)
{
	struct cxl_accel_migrate m;
	size_t first, n;
	int r;

	pick_range(p, &first, &n);
	r = cxla_migrate_flags(fd, p->region + first * PG, n * PG, to_dev,
			       flags, &m);
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

/*
 * A migration a hostile program asks for: misaligned, empty, flags or
 * reserved fields set, a bad argument pointer, or a range that runs past
 * the region into what lies beyond it (mapped or not). The answer is an
 * error or a partial migration; the region must stay as it was.
 */
static void do_bad_migrate(struct proc *p, int op)
{
	unsigned long req = rnd_below(p, 2) ? CXL_ACCEL_IOC_MIGRATE_TO_DEV :
				CXL_ACCEL_IOC_MIGRATE_TO_RAM;
	int fd = rnd_below(p, 2) && p->pfd >= 0 ? p->pfd : p->fd;
	struct cxl_accel_migrate m = { 0 };
	size_t first, n;
	int r, how = rnd_below(p, 6);

	pick_range(p, &first, &n);
	m.addr = (uintptr_t)(p->region + first * PG);
	m.len = n * PG;
	switch (how) {
	case 0:
		m.addr += 1 + rnd_below(p, PG - 1);
		break;
	case 1:
		m.len = 0;
		break;
	case 2:
		m.flags = 1U << (1 + rnd_below(p, 31));
		break;
	case 3:
		m.reserved[rnd_below(p, 2)] = 1;
		break;
	case 4:
		/* past the end of the region, by up to 16 pages */
		m.len = (p->npages - first + 1 + rnd_below(p, 16)) * PG;
		break;
	default:
		r = ioctl(fd, req, (void *)16) ? -errno : 0;
		if (r != -EFAULT)
			fail_op(p, op, r);
		return;
	}
	r = ioctl(fd, req, &m) ? -errno : 0;
	if (how < 4 ? r != -EINVAL :
	    r && r != -EFAULT && r != -EINVAL && !benign(r))
		fail_op(p, op, r);
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
		set_page(p, i, &(struct pstate){ .kind = ST_ZERO });
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
	first = rnd_below(p, p->npages - 8);
	n = 1 + rnd_below(p, 8);
	iov.iov_base = p->region + first * PG;
	iov.iov_len = n * PG;
	/* the pipe holds these pages (wherever they are) while it lives */
	if (vmsplice(fds[1], &iov, 1, SPLICE_F_NONBLOCK) < 0 && errno != EAGAIN)
		fail_op(p, op, -errno);
	close(fds[0]);
	p->pipes[p->npipes++] = fds[1];
}

/* ---------------------------------------------------- device buffers */

/* does buffer b hold what it must, seen by the CPU and by its device? */
static void verify_buf(struct proc *p, int op, struct dbuf *b, bool device)
{
	uint32_t crc, got;
	size_t i;
	int r;

	if (memcmp(b->map, b->shadow, b->pages * PG))
		for (i = 0; i < b->pages; i++)
			if (memcmp(b->map + i * PG, b->shadow + i * PG, PG))
				report(p, op, "device buffer %#x page %zu of %zu is not what was written (CPU view)",
				       b->handle, i, b->pages);
	if (!device)
		return;
	crc = crc32c(0, b->shadow, b->pages * PG);
	r = cxla_checksum(b->fd, cxla_dev(b->handle, 0), b->pages * PG, 0, &got);
	if (r) {
		if (!benign(r))
			fail_op(p, op, r);
		return;
	}
	if (got != crc)
		report(p, op, "device crc32c of buffer %#x is %#x, its contents give %#x",
		       b->handle, got, crc);
}

static void verify_bufs(struct proc *p, int op)
{
	int i;

	for (i = 0; i < p->nbufs; i++)
		verify_buf(p, op, &p->bufs[i], false);
}

static void buf_set_page(struct dbuf *b, size_t i, const struct pstate *s)
{
	b->st[i] = *s;
	page_expect(s, i, b->shadow + i * PG);
}

static int pick_fd(struct proc *p)
{
	return rnd_below(p, 2) && p->pfd >= 0 ? p->pfd : p->fd;
}

/* the CPU writes pages [first, first + n) of b with new data */
static void buf_cpu_write(struct proc *p, struct dbuf *b, size_t first,
			  size_t n)
{
	uint32_t id = 0x80000000u | (p->slot << 16) | (p->buf_gen++ & 0xffff);
	size_t i;

	for (i = first; i < first + n; i++) {
		buf_set_page(b, i, &(struct pstate){ .kind = ST_DATA,
						     .writer = id, .gen = 1 });
		memcpy(b->map + i * PG, b->shadow + i * PG, PG);
	}
}

static void do_buf_new(struct proc *p, int op)
{
	struct dbuf *b = &p->bufs[p->nbufs];
	struct cxl_accel_alloc a;
	int r;

	if (p->nbufs == MAX_BUFS)
		return;
	memset(b, 0, sizeof(*b));
	b->fd = pick_fd(p);
	b->pages = 1 + rnd_below(p, BUF_PAGES);
	r = cxla_alloc(b->fd, b->pages * PG, 0, &a);
	if (r) {
		if (!benign(r))
			fail_op(p, op, r);
		return;
	}
	b->handle = a.handle;
	b->mmap_offset = a.mmap_offset;
	b->map = cxla_map(b->fd, &a);
	if (!b->map)
		fail_op(p, op, -errno);
	p->nbufs++;
	buf_cpu_write(p, b, 0, b->pages);
	verify_buf(p, op, b, true);
}

static void buf_forget(struct proc *p, int op, struct dbuf *b)
{
	int r;

	munmap(b->map, b->pages * PG);
	r = cxla_free(b->fd, b->handle);
	if (r && !benign(r))
		fail_op(p, op, r);
	*b = p->bufs[--p->nbufs];
}

static void do_buf_free(struct proc *p, int op)
{
	if (p->nbufs)
		buf_forget(p, op, &p->bufs[rnd_below(p, p->nbufs)]);
}

/*
 * A buffer exported as a DMA-BUF and imported by the other device (or its
 * own): read through the DMA-BUF's own mapping, and by the importer.
 */
static void do_buf_dmabuf(struct proc *p, int op)
{
	struct cxl_accel_dmabuf_export e;
	struct cxl_accel_dmabuf_import im;
	uint8_t *m;
	uint32_t crc = 0, got;
	struct dbuf *b;
	int ifd, r;
	size_t i;

	if (!p->nbufs)
		return;
	b = &p->bufs[rnd_below(p, p->nbufs)];
	r = cxla_export_dmabuf(b->fd, b->handle, CXL_ACCEL_DMABUF_CLOEXEC, &e);
	if (r) {
		if (!benign(r))
			fail_op(p, op, r);
		return;
	}
	m = mmap(NULL, b->pages * PG, PROT_READ, MAP_SHARED, e.fd, 0);
	if (m == MAP_FAILED)
		fail_op(p, op, -errno);
	for (i = 0; i < b->pages; i++)
		if (memcmp(m + i * PG, b->shadow + i * PG, PG))
			report(p, op, "page %zu of buffer %#x read through its DMA-BUF is not what was written",
			       i, b->handle);
	crc = crc32c(0, b->shadow, b->pages * PG);
	munmap(m, b->pages * PG);
	ifd = b->fd == p->fd && p->pfd >= 0 ? p->pfd : p->fd;
	r = cxla_import_dmabuf(ifd, e.fd, &im);
	if (!r && p->nkept < MAX_KEPT && !rnd_below(p, 3)) {
		/* kept: the buffer goes, the import and the DMA-BUF stay */
		struct kept *k = &p->kept[p->nkept];

		k->map = mmap(NULL, b->pages * PG, PROT_READ, MAP_SHARED, e.fd, 0);
		if (k->map == MAP_FAILED)
			fail_op(p, op, -errno);
		k->ifd = ifd;
		k->handle = im.handle;
		k->dmabuf = e.fd;
		k->pages = b->pages;
		memcpy(k->shadow, b->shadow, b->pages * PG);
		p->nkept++;
		buf_forget(p, op, b);
		return;
	}
	if (!r) {
		r = cxla_checksum(ifd, cxla_dev(im.handle, 0), b->pages * PG, 0,
				  &got);
		if (!r && got != crc)
			report(p, op, "the importer's crc32c of buffer %#x is %#x, its contents give %#x",
			       b->handle, got, crc);
		if (r && !benign(r) && r != -EOPNOTSUPP)
			fail_op(p, op, r);
		r = cxla_free(ifd, im.handle);
	}
	if (r && !benign(r) && r != -EOPNOTSUPP)
		fail_op(p, op, r);
	close(e.fd);
}

/* An import that lost its exporter's buffer: gone for good. */
static void kept_drop(struct proc *p, int op, struct kept *k)
{
	int r;

	munmap(k->map, k->pages * PG);
	r = cxla_free(k->ifd, k->handle);
	if (r && !benign(r))
		fail_op(p, op, r);
	close(k->dmabuf);
	*k = p->kept[--p->nkept];
}

/*
 * A kept import: the importer fills some of it (its only writer now), and
 * the DMA-BUF's mapping and the importer's checksum must show it; or it goes.
 */
static void do_import_work(struct proc *p, int op)
{
	struct kept *k;
	size_t first, n, i;
	uint32_t got;
	uint64_t pat;
	int r;

	if (!p->nkept)
		return;
	k = &p->kept[rnd_below(p, p->nkept)];
	if (!rnd_below(p, 3)) {
		kept_drop(p, op, k);
		return;
	}
	first = rnd_below(p, k->pages);
	n = 1 + rnd_below(p, k->pages - first);
	pat = rnd(p) | 1;
	r = cxla_fill(k->ifd, cxla_dev(k->handle, first * PG), n * PG, pat, 0);
	if (r) {
		if (!benign(r) && r != -EOPNOTSUPP)
			fail_op(p, op, r);
		kept_drop(p, op, k);	/* it may still land */
		return;
	}
	for (i = first * PG; i < (first + n) * PG; i += 8)
		memcpy(k->shadow + i, &pat, 8);
	if (memcmp(k->map, k->shadow, k->pages * PG))
		report(p, op, "an import whose exporter freed the buffer does not hold what its importer wrote (DMA-BUF mapping)");
	r = cxla_checksum(k->ifd, cxla_dev(k->handle, 0), k->pages * PG, 0, &got);
	if (!r && got != crc32c(0, k->shadow, k->pages * PG))
		report(p, op, "the importer's crc32c of a kept import is %#x, its contents give %#x",
		       got, crc32c(0, k->shadow, k->pages * PG));
	if (r && !benign(r) && r != -EOPNOTSUPP)
		fail_op(p, op, r);
}

/*
 * Device work on a buffer: a FILL of some pages, a COPY from the process's
 * region (the device reads pinned process pages), a COPY between two
 * buffers of one device, CPU writes, or a new mapping of it.
 */
static void do_buf_work(struct proc *p, int op)
{
	struct dbuf *b, *o;
	size_t first, n, i, rfirst;
	uint64_t pat;
	int r, kind = rnd_below(p, 5);

	if (kind == 1 && p->helper)	/* the main thread writes the region */
		kind = 0;

	if (!p->nbufs)
		return;
	b = &p->bufs[rnd_below(p, p->nbufs)];
	first = rnd_below(p, b->pages);
	n = 1 + rnd_below(p, b->pages - first);
	switch (kind) {
	case 0:
		pat = rnd(p) | 1;
		r = cxla_fill(b->fd, cxla_dev(b->handle, first * PG), n * PG,
			      pat, 0);
		if (r) {
			if (!benign(r))
				fail_op(p, op, r);
			/* given up: it may still land, the buffer is unknown */
			buf_forget(p, op, b);
			return;
		}
		for (i = first; i < first + n; i++)
			buf_set_page(b, i, &(struct pstate){ .kind = ST_FILL,
							     .fill = pat });
		break;
	case 1:
		rfirst = rnd_below(p, p->npages - n + 1);
		r = cxla_copy(b->fd, cxla_user(p->region + rfirst * PG),
			      cxla_dev(b->handle, first * PG), n * PG, 0);
		if (r) {
			if (!benign(r))
				fail_op(p, op, r);
			buf_forget(p, op, b);	/* it may still land */
			return;
		}
		/* the region's pages, by their own page numbers' data */
		for (i = 0; i < n; i++) {
			uint8_t *got = b->map + (first + i) * PG;

			if (memcmp(got, p->shadow + (rfirst + i) * PG, PG))
				report(p, op, "a device copy of region page %zu into buffer %#x page %zu copied other contents",
				       rfirst + i, b->handle, first + i);
			/* from now on the buffer page is checked byte for byte */
			buf_cpu_write(p, b, first + i, 1);
		}
		break;
	case 2:
		for (o = p->bufs; o < p->bufs + p->nbufs; o++)
			if (o != b && o->fd == b->fd && o->pages >= n)
				break;
		if (o == p->bufs + p->nbufs)
			return;
		r = cxla_copy(b->fd, cxla_dev(o->handle, 0),
			      cxla_dev(b->handle, first * PG), n * PG, 0);
		if (r) {
			if (!benign(r))
				fail_op(p, op, r);
			buf_forget(p, op, b);	/* it may still land */
			return;
		}
		for (i = 0; i < n; i++) {
			if (memcmp(b->map + (first + i) * PG, o->shadow + i * PG, PG))
				report(p, op, "a device copy of buffer %#x page %zu into buffer %#x page %zu copied other contents",
				       o->handle, i, b->handle, first + i);
			buf_cpu_write(p, b, first + i, 1);
		}
		break;
	case 3:
		buf_cpu_write(p, b, first, n);
		break;
	default:
		/* a new mapping: the old one's pages go, the new one faults */
		munmap(b->map, b->pages * PG);
		b->map = mmap(NULL, b->pages * PG, PROT_READ | PROT_WRITE,
			      MAP_SHARED, b->fd, (off_t)b->mmap_offset);
		if (b->map == MAP_FAILED)
			fail_op(p, op, -errno);
		break;
	}
	verify_buf(p, op, b, true);
}

static void worker(struct proc *p);

/*
 * -T: the helper thread of a process does the other operations at the
 * same time as the main thread works on the region: device buffers
 * (mmap, munmap, fills, copies, DMA-BUF export and import), vmsplice() of
 * region pages into pipes, madvise(COLD, PAGEOUT) of region ranges, and
 * mmap/munmap of scratch memory. It never writes the region.
 */
static void *helper_main(void *arg)
{
	struct proc *h = arg;
	size_t first, n;
	void *scratch;
	int op;

	while (now_sec() < deadline) {
		switch (rnd_below(h, 10)) {
		case 0:
			op = OP_BUF_NEW;
			do_buf_new(h, op);
			break;
		case 1:
		case 2:
			op = OP_BUF_WORK;
			do_buf_work(h, op);
			break;
		case 3:
			op = OP_BUF_FREE;
			do_buf_free(h, op);
			break;
		case 4:
			op = OP_BUF_DMABUF;
			do_buf_dmabuf(h, op);
			break;
		case 9:
			op = OP_IMPORT_WORK;
			do_import_work(h, op);
			break;
		case 5:
			op = OP_SPLICE;
			do_splice(h, op);
			break;
		case 6:
			op = OP_UNSPLICE;
			if (h->npipes)
				close(h->pipes[--h->npipes]);
			break;
		case 7:
			op = OP_DONTNEED;	/* counted with it: a madvise */
			pick_range(h, &first, &n);
			madvise(h->region + first * PG, n * PG,
				rnd_below(h, 2) ? MADV_COLD : MADV_PAGEOUT);
			break;
		default:
			op = OP_REMAP;
			scratch = map_anon((1 + rnd_below(h, 16)) * PG);
			if (scratch) {
				memset(scratch, 0x5a, PG);
				munmap(scratch, PG);
			}
			break;
		}
		__sync_fetch_and_add(&sh->helper_ops, 1);
		verify_bufs(h, op);
	}
	return NULL;
}

static void helper_start(struct proc *p)
{
	struct proc *h = malloc(sizeof(*h));
	pthread_t t;

	if (!h)
		return;
	memcpy(h, p, sizeof(*h));
	h->helper = true;
	h->rng = splitmix(p->rng ^ 0x68656c70ULL) | 1;
	h->nbufs = 0;
	h->nkept = 0;
	h->npipes = 0;
	h->nchildren = 0;
	if (pthread_create(&t, NULL, helper_main, h)) {
		free(h);
		return;
	}
	pthread_detach(t);
}

static int copy_mode_set(unsigned int pages)
{
	char v[16];
	int fd = open(COPY_PARAM, O_WRONLY), n, r;

	if (fd < 0)
		return -errno;
	n = snprintf(v, sizeof(v), "%u\n", pages);
	r = write(fd, v, n) == n ? 0 : -errno;
	close(fd);
	return r;
}

/*
 * Put the value from before the run back when the top process ends: at the
 * end, at a failed check (any return: the harness then _exit()s) and at its
 * alarm, so that a cut-off run does not leave the guest copying every
 * migration with the device.
 */
static void copy_mode_restore(void)
{
	if (getpid() == copy_owner)	/* not in forked children */
		copy_mode_set(copy_default);
}

static void copy_mode_restore_on_alarm(int sig)
{
	copy_mode_restore();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void copy_mode_restore_at_return(pid_t *owner)
{
	(void)owner;
	copy_mode_restore();
}

/* Device copies for every migration, or the driver's default again */
static void do_copy_mode(struct proc *p, int op)
{
	int r = copy_mode_set(rnd_below(p, 2) ? 0 : copy_default);

	if (r)
		fail_op(p, op, r);
}

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
		/* the parent's buffers are shared mappings: not ours either */
		for (; p->nbufs; p->nbufs--)
			munmap(p->bufs[p->nbufs - 1].map,
			       p->bufs[p->nbufs - 1].pages * PG);
		/* and so are its kept imports: our copies of the fds go */
		for (; p->nkept; p->nkept--) {
			munmap(p->kept[p->nkept - 1].map,
			       p->kept[p->nkept - 1].pages * PG);
			close(p->kept[p->nkept - 1].dmabuf);
		}
		if (own_files) {
			/* files of its own: its own mirrors, buffers, releases */
			close(p->fd);
			if (p->pfd >= 0)
				close(p->pfd);
			p->fd = open(dev_path, O_RDWR);
			p->pfd = peer_path ? open(peer_path, O_RDWR) : -1;
			if (p->fd < 0 || (peer_path && p->pfd < 0))
				_exit(2);
		}
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

/*
 * Kill the parent (not the top process): its children, this one among
 * them, go on with pages that it shared with them copy-on-write.
 */
static void do_kill_parent(struct proc *p)
{
	pid_t parent = getppid();

	if (p->depth < 1 || parent == sh->top || parent <= 1)
		return;
	/* -B: the tree's top process changes a page at its 10th operation */
	if (self_test && p->depth == 1)
		return;
	if (kill(parent, SIGKILL) == 0)
		__sync_fetch_and_add(&sh->killed, 1);
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

	if (with_helper)
		helper_start(p);
	while (now_sec() < deadline) {
		op = pick_op(p);
		/* with -T, the helper thread does these */
		if (with_helper && (op == OP_SPLICE || op == OP_UNSPLICE ||
				    (op >= OP_BUF_NEW && op <= OP_IMPORT_WORK)))
			continue;
		p->history[p->opno % HISTORY] = op;
		switch (op) {
		case OP_CPU_WRITE:
			if (p->cpu_only) {
				/*
				 * A page at a time: most of the region stays
				 * shared copy-on-write with the relatives
				 */
				write_page(p, rnd_below(p, p->npages));
				break;
			}
			pick_range(p, &first, &n);
			for (i = first; i < first + n; i++)
				if (rnd_below(p, 2))
					write_page(p, i);
			break;
		case OP_TO_DEV:
			do_migrate(p, op, p->fd, true, 0);
			break;
		case OP_TO_PEER:
			if (p->pfd >= 0)
				do_migrate(p, op, p->pfd, true, 0);
			break;
		case OP_TO_PRIVATE:
			do_migrate(p, op, rnd_below(p, 2) && p->pfd >= 0 ?
				   p->pfd : p->fd, true, CXL_ACCEL_MIGRATE_PRIVATE);
			break;
		case OP_TO_RAM:
			/* private pages come back only when asked for by name */
			do_migrate(p, op, rnd_below(p, 2) && p->pfd >= 0 ?
				   p->pfd : p->fd, false,
				   op_weight[OP_TO_PRIVATE] && rnd_below(p, 2) ?
				   CXL_ACCEL_MIGRATE_PRIVATE : 0);
			break;
		case OP_SVM_FILL:
		case OP_SVM_FILL_SHORT:
			if (p->cpu_only)	/* the device only reads */
				do_crc(p, op, false);
			else
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
			if (!p->cpu_only)	/* keep the sharing */
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
		case OP_KILL_PARENT:
			do_kill_parent(p);
			break;
		case OP_BUF_NEW:
			do_buf_new(p, op);
			break;
		case OP_BUF_WORK:
			do_buf_work(p, op);
			break;
		case OP_BUF_FREE:
			do_buf_free(p, op);
			break;
		case OP_IMPORT_WORK:
			do_import_work(p, op);
			break;
		case OP_BUF_DMABUF:
			do_buf_dmabuf(p, op);
			break;
		case OP_COPY_MODE:
			do_copy_mode(p, op);
			break;
		case OP_BAD_MIGRATE:
			do_bad_migrate(p, op);
			break;
		}
		__sync_fetch_and_add(&sh->ops[op], 1);
		if (self_test && !p->depth && p->opno == 10) {
			/* the oracle's own test: it must find this and say what */
			size_t k = rnd_below(p, p->npages);

			p->region[k * PG + 100] ^= 0x5a;
		}
		verify(p, op);
		verify_bufs(p, op);
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
	int fd = cxla_open_dev(path), r;

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

/*
 * The region: every third tree gets a 2 MiB-aligned one backed by a huge
 * page (split by the first sub-range migration, shared whole by fork before
 * that); the others 128 (the CPU-only trees) or 256 small pages.
 */
static uint8_t *map_region(struct proc *p)
{
	size_t len;
	uint8_t *a;

	if (p->slot % 3 == 2) {
		p->npages = MAX_REGION_PAGES;
		len = p->npages * PG;
		a = map_anon(2 * len);
		if (!a)
			return NULL;
		a = (uint8_t *)(((uintptr_t)a + len - 1) & ~(uintptr_t)(len - 1));
		madvise(a, len, MADV_HUGEPAGE);
		return a;
	}
	p->npages = p->cpu_only ? 128 : 256;
	if (p->cpu_only) {
		/* inside a transparent huge page, which migrations split */
		len = MAX_REGION_PAGES * PG;
		a = map_anon(2 * len);
		if (!a)
			return NULL;
		a = (uint8_t *)(((uintptr_t)a + len - 1) & ~(uintptr_t)(len - 1));
		madvise(a, len, MADV_HUGEPAGE);
		return a + (p->slot % 4) * 96 * PG;
	}
	a = map_anon(p->npages * PG);
	if (a)
		madvise(a, p->npages * PG, MADV_NOHUGEPAGE);
	return a;
}

/* A device of a process tree: its own file; a process that cannot open it fails */
static int open_tree_dev(const char *path)
{
	int fd = cxla_open_dev(path);

	if (fd < 0) {
		printf("mm-stress: open %s: %s\n", path, strerror(errno));
		fflush(stdout);
		_exit(2);
	}
	return fd;
}

/* -d DEV and, with -P, PEER-DEV: checked here, each tree opens its own */
FIXTURE(devs) {
	CXLA_DEVS;
};

FIXTURE_SETUP(devs)
{
	return cxla_open_devs(&c->devs, CXLA_PEER_IF_GIVEN);
}

FIXTURE_TEARDOWN(devs)
{
	close(c->fd);
	if (c->pfd >= 0)
		close(c->pfd);
	return verdict;
}

CXLA_TEST_F(devs, mm_stress)
{
	const char *dev = c->path, *peer = c->peer_path;

	dev_path = dev;
	peer_path = peer;
	int i, status, bad = 0, errors = 0;
	struct proc *tmpl = NULL;
	uint64_t total = 0;
	double t0;
	pid_t pid;

	if (!seed_given)
		run_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
	{
		struct cxl_accel_hmm_info h;

		/* device-private migrations where the kernel has them */
		if (cxla_hmm_info(c->fd, &h) || !(h.flags & CXL_ACCEL_HMM_PRIVATE))
			op_weight[OP_TO_PRIVATE] = 0;
	}
	{
		FILE *f = fopen(COPY_PARAM, "r");

		/* a driver without the CPU copy copies with the device anyway */
		if (!f || fscanf(f, "%u", &copy_default) != 1 ||
		    access(COPY_PARAM, W_OK))
			op_weight[OP_COPY_MODE] = 0;
		if (f)
			fclose(f);
		if (op_weight[OP_COPY_MODE]) {
			copy_owner = getpid();
			signal(SIGALRM, copy_mode_restore_on_alarm);
		}
	}
	/* the end and every failed check below put copy_mode back */
	pid_t restorer __attribute__((cleanup(copy_mode_restore_at_return))) =
		copy_owner;
	alarm(run_secs + 600);	/* after every process's own (run_secs + 300) */
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED, "mmap: %s", strerror(errno));
	printf("mm-stress: seed %llu, %d processes, %d s, devices %s%s%s, %s%s\n",
	       (unsigned long long)run_seed, nprocs, run_secs, dev,
	       peer ? " and " : "", peer ? peer : "",
	       op_weight[OP_TO_PRIVATE] ? "coherent and private migrations" :
	       "coherent migrations",
	       op_weight[OP_COPY_MODE] ? ", copies by the CPU and the device" :
	       ", copies by the device");
	fflush(stdout);
	/* orphaned grandchildren come to us: their verdicts count */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	sh->top = getpid();
	t0 = now_sec();
	deadline = t0 + run_secs;
	{
		/* the CPU-only trees start from one region, shared copy-on-write */
		tmpl = calloc(1, sizeof(*tmpl));
		CHECK(tmpl, "calloc");
		tmpl->slot = __sync_fetch_and_add(&sh->next_slot, 1);
		tmpl->cpu_only = true;
		tmpl->region = map_region(tmpl);
		tmpl->shadow = malloc(tmpl->npages * PG);
		CHECK(tmpl->region && tmpl->shadow, "region");
		for (size_t k = 0; k < tmpl->npages; k++)
			write_page(tmpl, k);
	}
	for (i = 0; i < nprocs; i++) {
		struct proc *p = calloc(1, sizeof(*p));

		CHECK(p, "calloc");
		p->slot = __sync_fetch_and_add(&sh->next_slot, 1);
		p->rng = splitmix(run_seed ^ ((uint64_t)p->slot << 32)) | 1;
		snprintf(p->path, sizeof(p->path), "%d", i);
		p->cpu_only = i % 2;	/* half the trees: as a read-only device user */
		memset(p->history, -1, sizeof(p->history));
		pid = fork();
		CHECK(pid >= 0, "fork: %s", strerror(errno));
		if (!pid) {
			alarm(run_secs + 300);	/* a hang ends as a failure */
			p->fd = open_tree_dev(dev);
			p->pfd = peer ? open_tree_dev(peer) : -1;
			if (tmpl && p->cpu_only) {
				p->region = tmpl->region;
				p->npages = tmpl->npages;
				p->shadow = tmpl->shadow;
				memcpy(p->st, tmpl->st, sizeof(p->st));
				worker(p);
			}
			p->region = map_region(p);
			p->shadow = malloc(p->npages * PG);
			if (!p->region || !p->shadow)
				_exit(2);
			for (size_t k = 0; k < p->npages; k++)
				write_page(p, k);
			worker(p);
		}
		free(p);
	}
	/* engine hogs, one per device (as many engines as it has) */
	for (i = 0; i < (peer ? 4 : 2); i++) {
		pid = fork();
		CHECK(pid >= 0, "fork: %s", strerror(errno));
		if (!pid) {
			alarm(run_secs + 300);
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
	if (with_helper)
		printf("mm-stress: %llu operations by helper threads\n",
		       (unsigned long long)sh->helper_ops);
	printf("mm-stress: per operation:");
	for (i = 0; i < OP_COUNT; i++)
		printf(" %s %llu", op_names[i], (unsigned long long)sh->ops[i]);
	printf("\n");
	fflush(stdout);
	DETAIL("seed %llu: %llu operations, %u processes, %d corrupted, %d failed otherwise",
	       (unsigned long long)run_seed, (unsigned long long)total,
	       sh->next_slot, bad, errors);
	return bad || errors ? FAIL : PASS;
}

CXLA_OPTION(seed, "-s", "SEED")
{
	run_seed = strtoull(arg, NULL, 0);
	seed_given = true;
}

CXLA_OPTION(secs, "-t", "SECONDS")
{
	run_secs = atoi(arg);
}

CXLA_OPTION(procs, "-n", "PROCS")
{
	nprocs = atoi(arg);
}

/* -x OP[,OP...]: leave these operations out */
CXLA_OPTION(exclude, "-x", "OP,...")
{
	char *ops = strdup(arg), *t;
	int i;

	for (t = strtok(ops, ","); t; t = strtok(NULL, ",")) {
		for (i = 0; i < OP_COUNT && strcmp(t, op_names[i]); i++)
			;
		if (i == OP_COUNT) {
			fprintf(stderr, "mm-stress: no operation %s\n", t);
			exit(2);
		}
		op_weight[i] = 0;
	}
	free(ops);
}

CXLA_OPTION(verbose, "-v", NULL)
{
	verbose = true;
}

CXLA_OPTION(helper, "-T", NULL)
{
	with_helper = true;
}

CXLA_OPTION(own_files, "-F", NULL)
{
	own_files = true;
}

/* -B: the oracle's self-test (the run must fail: one page wrong per tree) */
CXLA_OPTION(self_test, "-B", NULL)
{
	self_test = true;
}

/* no alarm from the runner: the test sets its own from -t */
CXLA_PROGRAM(.name = "mm-stress", .prefix = "", .timeout_s = 0);
