// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel guest tests of page migration and shared virtual memory (HMM),
 * in the spirit of the kernel's hmm selftests, on the harness of
 * cxla_harness.h (one child process and one RESULT line per test):
 *
 *   RESULT <prefix><name> PASS|FAIL|SKIP <detail>
 *
 * Usage: hmm-tests [-d /dev/cxl-accelN] [-P /dev/cxl-accelM] [-p prefix]
 *                  [-t name]... [-l] [--peer-only] [-s stress-seconds]
 *        hmm-tests --soak SECS DEV PEER-DEV   (migration soak, run-soak.sh)
 *        hmm-tests --stall SECS DEV | --hold-migrated DEV [--close] |
 *                  --hold-spliced DEV [SECS [zeros]]   (helpers of scripts)
 *   -P names a second device for the two-device tests (left out without it).
 * The migration tests (fixture mig) run twice: NAME moves pages to coherent
 * device memory, NAME.private to device-private memory (SKIP on kernels
 * without CONFIG_DEVICE_PRIVATE), asserting where private pages behave
 * otherwise: a CPU access faults one back to RAM, SNAPSHOT reports it LOCAL
 * but not PRESENT. Every test checks at its end that the migration pool of
 * the device holds no page any more (no leaked page references).
 */
#define _GNU_SOURCE
#include <linux/io_uring.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include "cxla_harness.h"

#define KiB		1024ULL
#define MiB		(1024 * KiB)
#define PG		4096UL
#define TEST_TIMEOUT_S	300

/*
 * Every test: the device (-d), and the peer (-P) for the two-device tests;
 * its HMM_INFO at the start. The fixtures (below the helpers) differ in
 * what they need of the device.
 */
FIXTURE(dev) {
	CXLA_DEVS;
	struct cxl_accel_hmm_info h0;
};
FIXTURE_ALIAS(peer, dev);		/* two devices */
FIXTURE_PEER(peer);
FIXTURE_ALIAS(numa, dev);		/* NUMA attach mode */
FIXTURE_ALIAS(numa_peer, dev);
FIXTURE_PEER(numa_peer);
/* migration tests: to coherent device memory, and to device-private memory */
FIXTURE_ALIAS(mig, dev);
FIXTURE_VARIANT(mig) {
	uint32_t flags;		/* of MIGRATE_TO_DEV and _TO_RAM */
};
FIXTURE_VARIANT_ADD_DEFAULT(mig, coherent) { .flags = 0 };
FIXTURE_VARIANT_ADD(mig, private) { .flags = CXL_ACCEL_MIGRATE_PRIVATE };
/*
 * migration tests of what the module shares between devices (the RAM
 * reserve): in the two-device phase, which runs alone (run-all.sh)
 */
FIXTURE_ALIAS(mig_alone, dev);
FIXTURE_PEER(mig_alone);
FIXTURE_VARIANT(mig_alone) {
	uint32_t flags;
};
FIXTURE_VARIANT_ADD_DEFAULT(mig_alone, coherent) { .flags = 0 };
FIXTURE_VARIANT_ADD(mig_alone, private) { .flags = CXL_ACCEL_MIGRATE_PRIVATE };

/* in a test of fixture mig: migrate the variant's kind of pages */
#define MIGRATE(fd, p, len, to_dev, m)					\
	cxla_migrate_flags(fd, p, len, to_dev, variant->flags, m)
/* ...and whether they are private: a CPU access faults them back to RAM */
#define PRIVATE		(variant->flags & CXL_ACCEL_MIGRATE_PRIVATE)

static int stress_secs = 8;


/* ------------------------------------------------------------ helpers */

/* len bytes at an address aligned to align (power of two) */
static void *map_aligned(size_t len, size_t align)
{
	uint8_t *p = mmap(NULL, len + align, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uintptr_t a;

	if (p == MAP_FAILED)
		return NULL;
	a = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
	if (a > (uintptr_t)p)
		munmap(p, a - (uintptr_t)p);
	munmap((void *)(a + len), (uintptr_t)p + align - a);
	return (void *)a;
}

static int evict(int fd, struct cxl_accel_evict *out)
{
	struct cxl_accel_evict e = { 0 };
	int r = cxla_ioctl(fd, CXL_ACCEL_IOC_EVICT, &e);

	if (out)
		*out = e;
	return r;
}

static int svm_crc(int fd, const void *p, size_t len, uint32_t *crc)
{
	uint64_t v = 0;
	int r = cxla_svm(fd, CXL_ACCEL_SVM_CHECKSUM, p, len, 0, 0, &v, NULL);

	*crc = (uint32_t)v;
	return r;
}

static int snapshot(int fd, const void *p, size_t len, uint8_t *flags)
{
	struct cxl_accel_snapshot s = {
		.addr = (uintptr_t)p, .len = len, .flags_ptr = (uintptr_t)flags,
	};

	memset(flags, 0xee, len / PG);
	return cxla_ioctl(fd, CXL_ACCEL_IOC_SNAPSHOT, &s);
}

/* pages whose flags have all of want set and none of unwanted */
static size_t count_pages(const uint8_t *f, size_t n, uint8_t want,
			  uint8_t unwanted)
{
	size_t i, k = 0;

	for (i = 0; i < n; i++)
		k += (f[i] & want) == want && !(f[i] & unwanted);
	return k;
}

/* snapshot and count pages on this device's memory */
static long local_pages(int fd, const void *p, size_t len)
{
	static uint8_t f[65536];
	size_t n = len / PG;

	if (n > sizeof(f) || snapshot(fd, p, len, f))
		return -1;
	return count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, 0);
}

static uint32_t page_word(uint64_t seed, size_t page)
{
	return (uint32_t)(seed * 2654435761u + page * 40503u + 1);
}

/* each page: its own recognisable contents */
static void fill_pages(void *p, size_t len, uint64_t seed)
{
	size_t i, w;
	uint32_t *q = p;

	for (i = 0; i < len / PG; i++)
		for (w = 0; w < PG / 4; w++)
			q[i * PG / 4 + w] = page_word(seed, i) ^ w;
}

/* first page that differs from fill_pages() contents, or -1 */
static long check_pages_at(const void *p, size_t first, size_t len,
			   uint64_t seed)
{
	size_t i, w;
	const uint32_t *q = p;

	for (i = 0; i < len / PG; i++)
		for (w = 0; w < PG / 4; w++)
			if (q[i * PG / 4 + w] != (page_word(seed, first + i) ^ w))
				return i;
	return -1;
}

/* A pipe holds the page at p (vmsplice): it cannot move until the pipe is read. */
static bool pipe_hold_page(void *p, int pipefd[2])
{
	struct iovec iov = { .iov_base = p, .iov_len = PG };

	return !pipe(pipefd) && vmsplice(pipefd[1], &iov, 1, 0) == (ssize_t)PG;
}

static long check_pages(const void *p, size_t len, uint64_t seed)
{
	return check_pages_at(p, 0, len, seed);
}

/* crc32c of fill_pages() contents, computed aside (no access to the pages) */
static uint32_t crc32c_pages(size_t len, uint64_t seed)
{
	uint8_t *b = map_anon(len);
	uint32_t crc;

	if (!b)
		return 0;
	fill_pages(b, len, seed);
	crc = crc32c(0, b, len);
	munmap(b, len);
	return crc;
}

static bool is_zero(const void *p, size_t len)
{
	const uint8_t *b = p;
	size_t i;

	for (i = 0; i < len; i++)
		if (b[i])
			return false;
	return true;
}

/*
 * How long pages may take to come back (20 ms steps): an exited child's
 * memory is torn down when the last reference to its mm goes, which another
 * device's test process walking every process (EVICT) can hold for a while.
 */
#define IDLE_TRIES	250

/* The pool must be empty again: no page reference leaked. */
static int pool_idle(FIXTURE_DATA(dev) *c, int fd)
{
	struct cxl_accel_hmm_info h;
	int i;

	/* pages of exited children come back asynchronously */
	for (i = 0; i < IDLE_TRIES; i++) {
		if (cxla_hmm_info(fd, &h))
			return -1;
		if (!h.pool_pages_used && !h.pool_chunks)
			return 0;
		usleep(20000);
	}
	DETAIL("pool not idle: %llu pages used, %llu chunks",
	       (unsigned long long)h.pool_pages_used,
	       (unsigned long long)h.pool_chunks);
	return -1;
}

#define POOL_IDLE(fd) do { if (pool_idle(c, fd)) return FAIL; } while (0)

/* device-private memory (kernels with CONFIG_DEVICE_PRIVATE) */
#define PRIV	CXL_ACCEL_MIGRATE_PRIVATE

/* private pages of this device in [p, p + len): on it, not CPU-mapped */
static long private_pages(int fd, const void *p, size_t len)
{
	static uint8_t f[65536];
	size_t n = len / PG;

	if (n > sizeof(f) || snapshot(fd, p, len, f))
		return -1;
	return count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, CXL_ACCEL_SNAP_PRESENT);
}

static int need_private(FIXTURE_DATA(dev) *c)
{
	if (c->h0.flags & CXL_ACCEL_HMM_PRIVATE)
		return 0;
	DETAIL("no device-private memory (the kernel has no CONFIG_DEVICE_PRIVATE)");
	return -1;
}

#define NEED_PRIVATE() do { if (need_private(c)) return SKIP; } while (0)

/* The private pool must be empty again. */
static int private_idle(FIXTURE_DATA(dev) *c, int fd)
{
	struct cxl_accel_hmm_info h;
	int i;

	for (i = 0; i < IDLE_TRIES; i++) {
		if (cxla_hmm_info(fd, &h))
			return -1;
		if (!h.private_pages)
			return pool_idle(c, fd);
		usleep(20000);
	}
	DETAIL("%llu private pages still in use", (unsigned long long)h.private_pages);
	return -1;
}

#define PRIVATE_IDLE(fd) do { if (private_idle(c, fd)) return FAIL; } while (0)

static int alloc_map(FIXTURE_DATA(dev) *c, int fd, size_t len,
		     struct cxl_accel_alloc *a, uint8_t **p)
{
	int r = cxla_alloc(fd, len, 0, a);

	if (r)
		return r;
	*p = cxla_map(fd, a);
	return *p ? 0 : -errno;
}

/* ------------------------------------------------------------ fixtures */

/* the device's HMM_INFO, read once in the runner: which tests apply */
static struct cxl_accel_hmm_info runner_h0;

static bool numa_mode(void)
{
	return runner_h0.flags & CXL_ACCEL_HMM_NUMA;
}

/* open the device(s), read HMM_INFO; the device in NUMA mode or coherent */
static int hmm_setup(FIXTURE_DATA(dev) *c, enum cxla_peer peer, bool numa)
{
	int r = cxla_open_devs(&c->devs, peer);

	if (r != PASS)
		return r;
	if (cxla_hmm_info(c->fd, &c->h0)) {
		DETAIL("HMM_INFO: %s", strerror(errno));
		return FAIL;
	}
	if (numa && !(c->h0.flags & CXL_ACCEL_HMM_NUMA)) {
		DETAIL("device not in NUMA mode (flags %#x)", c->h0.flags);
		return SKIP;
	}
	if (!numa && !(c->h0.flags & CXL_ACCEL_HMM_COHERENT)) {
		DETAIL("device memory is not coherent ZONE_DEVICE memory (flags %#x)",
		       c->h0.flags);
		return SKIP;
	}
	return PASS;
}

FIXTURE_SETUP(dev)
{
	return hmm_setup(c, CXLA_NO_PEER, false);
}

FIXTURE_APPLIES(dev)
{
	return !numa_mode();
}

FIXTURE_SETUP(peer)
{
	return hmm_setup(c, CXLA_NEED_PEER, false);
}

FIXTURE_APPLIES(peer)
{
	return !numa_mode();
}

FIXTURE_SETUP(numa)
{
	return hmm_setup(c, CXLA_NO_PEER, true);
}

FIXTURE_APPLIES(numa)
{
	return numa_mode();
}

FIXTURE_SETUP(numa_peer)
{
	return hmm_setup(c, CXLA_NEED_PEER, true);
}

FIXTURE_APPLIES(numa_peer)
{
	return numa_mode();
}

/* the private variant needs a kernel with CONFIG_DEVICE_PRIVATE */
static int mig_setup(FIXTURE_DATA(dev) *c, enum cxla_peer peer, bool private)
{
	int r = hmm_setup(c, peer, false);

	return r == PASS && private && need_private(c) ? SKIP : r;
}

FIXTURE_SETUP(mig)
{
	return mig_setup(c, CXLA_NO_PEER, PRIVATE);
}

FIXTURE_APPLIES(mig)
{
	return !numa_mode();
}

FIXTURE_SETUP(mig_alone)
{
	return mig_setup(c, CXLA_NEED_PEER, PRIVATE);
}

FIXTURE_APPLIES(mig_alone)
{
	return !numa_mode();
}

/* --------------------------------------------------------- info, args */

CXLA_TEST_F(dev, info)
{
	struct cxl_accel_hmm_info *h = &c->h0;

	CHECK(h->flags & CXL_ACCEL_HMM_COHERENT, "flags %#x: not coherent",
	      h->flags);
	CHECK(h->chunk_size == 2 * MiB, "chunk size %llu",
	      (unsigned long long)h->chunk_size);
	CHECK(h->mem_start == c->id.devmem_gpa &&
	      h->mem_size == c->id.devmem_size,
	      "memory %#llx+%#llx, IDENTIFY %#llx+%#llx",
	      (unsigned long long)h->mem_start, (unsigned long long)h->mem_size,
	      (unsigned long long)c->id.devmem_gpa,
	      (unsigned long long)c->id.devmem_size);
	POOL_IDLE(c->fd);
	DETAIL("coherent memory %#llx + %llu MiB, node %d; since probe: %llu pages to device, %llu back, %llu evicted, %llu copy commands (%llu failed), %llu svm faults",
	       (unsigned long long)h->mem_start,
	       (unsigned long long)(h->mem_size >> 20), h->numa_node,
	       (unsigned long long)h->migrated_to_dev,
	       (unsigned long long)h->migrated_to_ram,
	       (unsigned long long)h->evicted,
	       (unsigned long long)h->copy_commands,
	       (unsigned long long)h->copy_failures,
	       (unsigned long long)h->svm_faults);
	return PASS;
}

CXLA_TEST_F(dev, bad_args)
{
	size_t len = 16 * PG;
	uint8_t *p = map_anon(len), f[16];
	struct cxl_accel_migrate m = { 0 };
	struct cxl_accel_svm s = { 0 };
	struct cxl_accel_snapshot sn = { 0 };

	CHECK(p, "mmap");
	EXPECT_ERR(cxla_migrate(c->fd, p + 1, PG, true, NULL), EINVAL);
	EXPECT_ERR(cxla_migrate(c->fd, p, PG + 1, true, NULL), EINVAL);
	EXPECT_ERR(cxla_migrate(c->fd, p, 0, true, NULL), EINVAL);
	m.addr = (uintptr_t)p;
	m.len = PG;
	m.flags = 1U << 31;	/* no such flag */
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_MIGRATE_TO_DEV, &m), EINVAL);
	if (!(c->h0.flags & CXL_ACCEL_HMM_PRIVATE)) {
		m.flags = CXL_ACCEL_MIGRATE_PRIVATE;	/* no private memory */
		EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_MIGRATE_TO_DEV, &m),
			   EOPNOTSUPP);
	}
	m.flags = 0;
	m.reserved[0] = 1;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_MIGRATE_TO_DEV, &m), EINVAL);
	/* a range that is not (entirely) mapped */
	munmap(p + 8 * PG, PG);
	EXPECT_ERR(cxla_migrate(c->fd, p, len, true, NULL), EFAULT);
	EXPECT_ERR(cxla_migrate(c->fd, p + 8 * PG, PG, false, NULL), EFAULT);
	s.addr = (uintptr_t)p;
	s.len = len;
	s.op = 9;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_SVM, &s), EINVAL);
	s.op = CXL_ACCEL_SVM_READ;
	s.handle = 12345;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_SVM, &s), ENOENT);
	s.op = CXL_ACCEL_SVM_CHECKSUM;
	s.handle = 0;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_SVM, &s), EFAULT);
	s.len = 0;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_SVM, &s), EINVAL);
	sn.addr = (uintptr_t)p + 1;
	sn.len = PG;
	sn.flags_ptr = (uintptr_t)f;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_SNAPSHOT, &sn), EINVAL);
	sn.addr = (uintptr_t)p;
	sn.flags_ptr = 16;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_SNAPSHOT, &sn), EFAULT);
	POOL_IDLE(c->fd);
	DETAIL("unaligned, empty, flags, reserved, unmapped (-EFAULT), bad op, handle, user address, snapshot buffer");
	return PASS;
}

/* ------------------------------------------------ shared virtual memory */

/* hmm-tests anon_read: the device reads what the CPU wrote */
CXLA_TEST_F(dev, anon_read)
{
	size_t len = 3 * MiB + 5 * PG;
	uint8_t *p = map_anon(len), *b;
	struct cxl_accel_alloc a;
	struct cxl_accel_svm s;
	uint32_t crc;

	CHECK(p, "mmap");
	OK(alloc_map(c, c->fd, len, &a, &b));
	fill_random(p, len, 11);
	memset(b, 0, len);
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_READ, p, len, a.handle, 0, NULL, &s));
	CHECK(!memcmp(p, b, len), "device copy differs");
	CHECK(s.faults >= 1, "faults %llu", (unsigned long long)s.faults);
	/* unaligned piece, checksum */
	OK(svm_crc(c->fd, p + 123, len - 4000, &crc));
	CHECK(crc == crc32c(0, p + 123, len - 4000), "crc %#x != %#x", crc,
	      crc32c(0, p + 123, len - 4000));
	munmap(p, len);
	munmap(b, len);
	POOL_IDLE(c->fd);
	DETAIL("device read %zu bytes of anonymous memory (%llu faults, %llu retries), crc of an unaligned piece %#x",
	       len, (unsigned long long)s.faults, (unsigned long long)s.retries,
	       crc);
	return PASS;
}

/* hmm-tests anon_read_prot: no access means -EFAULT, then readable */
CXLA_TEST_F(dev, anon_read_prot)
{
	size_t len = 64 * PG;
	uint8_t *p = map_anon(len), *b;
	struct cxl_accel_alloc a;
	uint32_t crc;

	CHECK(p, "mmap");
	OK(alloc_map(c, c->fd, len, &a, &b));
	fill_random(p, len, 12);
	crc = crc32c(0, p, len);
	OK(mprotect(p, len, PROT_NONE) ? -errno : 0);
	EXPECT_ERR(cxla_svm(c->fd, CXL_ACCEL_SVM_READ, p, len, a.handle, 0, NULL,
			    NULL), EFAULT);
	OK(mprotect(p, len, PROT_READ) ? -errno : 0);
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_READ, p, len, a.handle, 0, NULL, NULL));
	CHECK(crc32c(0, b, len) == crc, "data after PROT_READ differs");
	munmap(p, len);
	munmap(b, len);
	POOL_IDLE(c->fd);
	DETAIL("PROT_NONE: -EFAULT; PROT_READ: device read right");
	return PASS;
}

/* hmm-tests anon_read_zero: untouched memory reads as zeros (zero page) */
CXLA_TEST_F(dev, anon_read_zero)
{
	size_t len = 32 * PG;
	uint8_t *p = map_anon(len), *b, f[32];
	struct cxl_accel_alloc a;
	size_t zero;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	OK(alloc_map(c, c->fd, len, &a, &b));
	memset(b, 0x55, len);
	OK(snapshot(c->fd, p, len, f));
	CHECK(count_pages(f, 32, 0, 0xff) == 32, "untouched pages are present");
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_READ, p, len, a.handle, 0, NULL, NULL));
	CHECK(is_zero(b, len), "device read non-zero bytes");
	OK(snapshot(c->fd, p, len, f));
	zero = count_pages(f, 32, CXL_ACCEL_SNAP_PRESENT | CXL_ACCEL_SNAP_ZERO,
			   CXL_ACCEL_SNAP_WRITE);
	CHECK(zero == 32, "%zu of 32 pages are the read-only zero page (f[0]=%#x)",
	      zero, f[0]);
	munmap(p, len);
	munmap(b, len);
	POOL_IDLE(c->fd);
	DETAIL("device read of untouched memory mapped the zero page (32 of 32), read zeros");
	return PASS;
}

/* hmm-tests anon_write: the device writes, the CPU reads */
CXLA_TEST_F(dev, anon_write)
{
	size_t len = 2 * MiB + 7 * PG;
	uint8_t *p = map_anon(len), *b;
	struct cxl_accel_alloc a;

	CHECK(p, "mmap");
	OK(alloc_map(c, c->fd, len, &a, &b));
	fill_random(b, len, 13);
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_WRITE, p + 100, len - 200, a.handle, 100,
		    NULL, NULL));
	CHECK(is_zero(p, 100) && is_zero(p + len - 100, 100),
	      "bytes outside the write changed");
	CHECK(!memcmp(p + 100, b + 100, len - 200), "CPU sees other data");
	munmap(p, len);
	munmap(b, len);
	POOL_IDLE(c->fd);
	DETAIL("device wrote %zu bytes into untouched anonymous memory at an odd offset",
	       len - 200);
	return PASS;
}

/* hmm-tests anon_write_prot: read-only is -EPERM, until it is writable */
CXLA_TEST_F(dev, anon_write_prot)
{
	size_t len = 16 * PG;
	uint8_t *p = map_anon(len), f[16];
	uint64_t pat = 0x1122334455667788ULL;
	size_t i;

	CHECK(p, "mmap");
	memset(p, 1, len);
	OK(mprotect(p, len, PROT_READ) ? -errno : 0);
	EXPECT_ERR(cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, p, len, 0, 0, &pat, NULL),
		   EPERM);
	OK(snapshot(c->fd, p, len, f));
	CHECK(count_pages(f, 16, CXL_ACCEL_SNAP_PRESENT, CXL_ACCEL_SNAP_WRITE) == 16,
	      "read-only pages reported writable (%#x)", f[0]);
	OK(mprotect(p, len, PROT_READ | PROT_WRITE) ? -errno : 0);
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, p, len, 0, 0, &pat, NULL));
	for (i = 0; i < len; i++)
		CHECK(p[i] == (uint8_t)(pat >> (8 * (i % 8))), "byte %zu", i);
	OK(snapshot(c->fd, p, len, f));
	CHECK(count_pages(f, 16, CXL_ACCEL_SNAP_WRITE | CXL_ACCEL_SNAP_MIRRORED, 0) == 16,
	      "pages not writable and mirrored after the fill (%#x)", f[0]);
	munmap(p, len);
	POOL_IDLE(c->fd);
	DETAIL("PROT_READ: -EPERM, snapshot read-only; PROT_READ|PROT_WRITE: device fill seen by the CPU");
	return PASS;
}

/* FILL pattern phase and CHECKSUM chaining across windows */
CXLA_TEST_F(dev, svm_fill_checksum)
{
	size_t len = 5 * MiB;
	uint8_t *p = map_anon(len);
	uint64_t pat = 0x0102030405060708ULL;
	size_t off = 4093, n = len - 9000, i;
	uint32_t crc;

	CHECK(p, "mmap");
	memset(p, 0xcc, len);
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, p + off, n, 0, 0, &pat, NULL));
	for (i = 0; i < off; i++)
		CHECK(p[i] == 0xcc, "byte %zu before the fill", i);
	for (i = 0; i < n; i++)
		CHECK(p[off + i] == (uint8_t)(pat >> (8 * (i % 8))),
		      "fill byte %zu is %#x", i, p[off + i]);
	CHECK(p[off + n] == 0xcc, "byte after the fill");
	fill_random(p, len, 14);
	OK(svm_crc(c->fd, p + 1, len - 2, &crc));
	CHECK(crc == crc32c(0, p + 1, len - 2), "crc %#x, CPU %#x", crc,
	      crc32c(0, p + 1, len - 2));
	munmap(p, len);
	POOL_IDLE(c->fd);
	DETAIL("5 MiB: fill at offset 4093 keeps the pattern phase over 22 windows, chained crc %#x",
	       crc);
	return PASS;
}

/* The mirror: second access without faults; invalidated by munmap */
CXLA_TEST_F(dev, mirror)
{
	size_t len = 256 * PG;
	uint8_t *p = map_anon(len), f[256];
	struct cxl_accel_hmm_info h1, h2;
	struct cxl_accel_svm s;
	uint64_t v, hits;
	size_t mirrored;
	int tries;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_random(p, len, 15);
	OK(cxla_hmm_info(c->fd, &h1));
	v = 0;
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_CHECKSUM, p, len, 0, 0, &v, &s));
	CHECK(s.faults >= 1, "first access: %llu faults",
	      (unsigned long long)s.faults);
	/*
	 * The kernel may move a page meanwhile (compaction for another
	 * process's huge page): its invalidation rightly drops the mirror, so
	 * when one came since the access before, the round is tried again.
	 */
	for (tries = 0;; tries++) {
		v = 0;
		OK(cxla_svm(c->fd, CXL_ACCEL_SVM_CHECKSUM, p, len, 0, 0, &v, &s));
		OK(snapshot(c->fd, p, len, f));
		OK(cxla_hmm_info(c->fd, &h2));
		mirrored = count_pages(f, 256, CXL_ACCEL_SNAP_MIRRORED, 0);
		if ((s.faults == 0 && mirrored == 256) ||
		    h2.svm_invalidations == h1.svm_invalidations || tries == 3)
			break;
		h1 = h2;
	}
	CHECK(s.faults == 0 && s.mirror_hits >= 1,
	      "second access: %llu faults, %llu mirror hits",
	      (unsigned long long)s.faults, (unsigned long long)s.mirror_hits);
	hits = s.mirror_hits;
	CHECK(mirrored == 256, "%zu of 256 pages mirrored", mirrored);
	h1 = h2;
	/* a page written by the CPU stays mirrored (same page)... */
	p[5] = 1;
	/* ...but unmapping drops the mirror */
	OK(munmap(p + 128 * PG, 128 * PG) ? -errno : 0);
	OK(snapshot(c->fd, p, 128 * PG, f));
	CHECK(count_pages(f, 128, CXL_ACCEL_SNAP_MIRRORED, 0) == 128,
	      "the rest lost its mirror");
	OK(cxla_hmm_info(c->fd, &h2));
	CHECK(h2.svm_invalidations > h1.svm_invalidations,
	      "no invalidation counted");
	CHECK(mmap(p + 128 * PG, 128 * PG, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED,
	      "remap");
	OK(snapshot(c->fd, p + 128 * PG, 128 * PG, f));
	CHECK(count_pages(f, 128, 0, CXL_ACCEL_SNAP_MIRRORED | CXL_ACCEL_SNAP_PRESENT) == 128,
	      "unmapped and remapped pages still mirrored or present");
	v = 0;
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_CHECKSUM, p + 128 * PG, 128 * PG, 0, 0, &v, &s));
	CHECK((uint32_t)v == crc32c(0, p + 128 * PG, 128 * PG) && s.faults >= 1,
	      "new mapping: crc %#x, faults %llu", (uint32_t)v,
	      (unsigned long long)s.faults);
	munmap(p, len);
	POOL_IDLE(c->fd);
	DETAIL("second read served by the mirror (%llu window hits, 0 faults); munmap invalidated half (%llu invalidations), the new mapping faulted in",
	       (unsigned long long)hits,
	       (unsigned long long)(h2.svm_invalidations - h1.svm_invalidations));
	return PASS;
}

/* mprotect takes write access away from the mirror too */
CXLA_TEST_F(mig, mprotect_mirror)
{
	size_t len = 32 * PG;
	uint8_t *p = map_anon(len);
	uint64_t pat = 0xabababababababab;
	struct cxl_accel_migrate m;
	uint8_t f[32];

	CHECK(p, "mmap");
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, p, len, 0, 0, &pat, NULL));
	if (PRIVATE) {
		/* the private variant: mprotect of device-private entries */
		OK(MIGRATE(c->fd, p, len, true, &m));
		CHECK(m.migrated == len / PG, "migrated %llu", (unsigned long long)m.migrated);
	}
	OK(mprotect(p, len, PROT_READ) ? -errno : 0);
	if (PRIVATE) {
		OK(snapshot(c->fd, p, len, f));
		CHECK(count_pages(f, 32, CXL_ACCEL_SNAP_LOCAL,
				  CXL_ACCEL_SNAP_WRITE | CXL_ACCEL_SNAP_PRESENT) == 32,
		      "after mprotect: %#x, want private read-only", f[0]);
	}
	pat = 0x5555555555555555;
	EXPECT_ERR(cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, p, len, 0, 0, &pat, NULL),
		   EPERM);
	CHECK(p[0] == 0xab && p[len - 1] == 0xab, "read-only memory changed");
	OK(mprotect(p, len, PROT_READ | PROT_WRITE) ? -errno : 0);
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, p, len, 0, 0, &pat, NULL));
	CHECK(p[0] == 0x55 && p[len - 1] == 0x55, "fill after PROT_WRITE");
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("device write through the mirror; %smprotect(PROT_READ) -> -EPERM, memory unchanged; writable again -> ok",
	       PRIVATE ? "pages made private, read-only by mprotect; " : "");
	return PASS;
}

/* hmm-tests anon_read_child / anon_write_child: fork, private COW */
struct engine_blocker {
	int fd;
	uint32_t handle;
	int ret;
};

/* Keeps one DMA engine busy for a while: a long device fetch-add. */
static void *engine_block(void *arg)
{
	struct engine_blocker *b = arg;

	b->ret = cxla_atomic(b->fd, cxla_dev(b->handle, 0), CXL_ACCEL_ATOMIC_FETCH_ADD,
			     8, 1, 0, 1ULL << 26, 60000, NULL);
	return NULL;
}

/*
 * A device write that its ioctl gave up on (a 1 ms timeout while the
 * engines are busy) still lands later. fork() right after must not share
 * the pages it writes with the child before it has landed: the child's
 * memory must never change under it.
 */
CXLA_TEST_F(dev, svm_timeout_fork)
{
	size_t len = 512 * KiB, i;
	struct engine_blocker b[8];
	struct cxl_accel_alloc a;
	struct cxl_accel_svm s;
	pthread_t t[8];
	uint8_t *p = map_anon(len);
	unsigned int nb = c->id.num_dma_engines, k;
	uint64_t v = 0x5a5a5a5a5a5a5a5aULL;
	int status, r;
	pid_t pid;

	CHECK(p, "mmap");
	CHECK(nb && nb <= 8, "%u engines", nb);
	memset(p, 0x11, len);
	OK(cxla_alloc(c->fd, PG, 0, &a));
	for (k = 0; k < nb; k++) {
		b[k] = (struct engine_blocker){ .fd = c->fd, .handle = a.handle };
		CHECK(!pthread_create(&t[k], NULL, engine_block, &b[k]), "thread");
	}
	usleep(100000);		/* the engines are busy now */
	memset(&s, 0, sizeof(s));
	s.addr = (uintptr_t)p;
	s.len = len;
	s.op = CXL_ACCEL_SVM_FILL;
	s.value = v;
	s.timeout_ms = 1;
	r = cxla_ioctl(c->fd, CXL_ACCEL_IOC_SVM, &s);
	pid = fork();
	if (!pid) {
		uint32_t c1 = crc32c(0, p, len), c2;

		usleep(1500000);	/* the engines are free long before */
		c2 = crc32c(0, p, len);
		_exit(c1 == c2 ? 0 : 1);
	}
	CHECK(pid > 0, "fork");
	for (k = 0; k < nb; k++)
		pthread_join(t[k], NULL);
	waitpid(pid, &status, 0);
	CHECK(r == -ETIMEDOUT, "SVM fill with 1 ms while the engines are busy: %d", r);
	for (k = 0; k < nb; k++)
		CHECK(!b[k].ret, "blocker %u: %d", k, b[k].ret);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status),
	      "the child's memory changed after fork (a late device write landed in a shared page)");
	/*
	 * fork waited for the write (the first window: the ioctl stopped at
	 * its timeout): it landed whole before the pages were shared
	 */
	for (i = 0; i < len; i += PG) {
		uint8_t want[PG];

		memset(want, 0x11, PG);
		if (memcmp(p + i, want, PG)) {
			memcpy(want, &v, 8);
			for (k = 8; k < PG; k *= 2)
				memcpy(want + k, want, k);
			CHECK(!memcmp(p + i, want, PG),
			      "parent: page %zu neither old nor filled", i / PG);
		} else {
			CHECK(i, "parent: the first page was not filled");
		}
	}
	OK(cxla_free(c->fd, a.handle));
	munmap(p, len);
	DETAIL("SVM fill timed out (-ETIMEDOUT) behind %u busy engines; fork waited for it to land, the child's memory never changed",
	       nb);
	return PASS;
}

CXLA_TEST_F(mig, fork_child_private)
{
	size_t len = 64 * PG;
	uint8_t *p = map_anon(len);
	uint32_t crc0, crc;
	int status, pipefd[2];
	char msg[200] = "";
	struct cxl_accel_migrate m;
	pid_t pid;

	CHECK(p, "mmap");
	fill_pages(p, len, 21);
	crc0 = crc32c(0, p, len);
	if (PRIVATE) {
		/* the private variant: the pages are the device's at the fork */
		OK(MIGRATE(c->fd, p, len, true, &m));
		CHECK(m.migrated == len / PG, "migrated %llu", (unsigned long long)m.migrated);
	}
	OK(svm_crc(c->fd, p, len, &crc));	/* the parent has a mirror */
	CHECK(crc == crc0, "parent crc");
	CHECK(!pipe(pipefd), "pipe");
	pid = fork();
	if (!pid) {
		uint64_t pat = 0x7777777777777777;
		int fd2 = open(c->path, O_RDWR);
		uint32_t k;

		/* the inherited file: a mirror of the child's own mm */
		if (svm_crc(c->fd, p, len, &k) || k != crc0)
			snprintf(msg, sizeof(msg), "child inherited fd crc %#x", k);
		else if (fd2 < 0 || svm_crc(fd2, p, len, &k) || k != crc0)
			snprintf(msg, sizeof(msg), "child own fd crc %#x", k);
		else if (cxla_svm(fd2, CXL_ACCEL_SVM_FILL, p, 8 * PG, 0, 0, &pat, NULL))
			snprintf(msg, sizeof(msg), "child device write failed");
		else if (p[0] != 0x77 || check_pages_at(p + 8 * PG, 8, len - 8 * PG, 21) >= 0)
			snprintf(msg, sizeof(msg), "child data after its write");
		if (write(pipefd[1], msg, sizeof(msg)) < 0)
			_exit(2);
		_exit(msg[0] ? 1 : 0);
	}
	CHECK(pid > 0, "fork");
	if (read(pipefd[0], msg, sizeof(msg)) < 0)
		msg[0] = '?';
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "child: %s", msg);
	/* the child's device write broke COW: the parent is unchanged */
	CHECK(check_pages(p, len, 21) < 0, "parent data changed by the child");
	OK(svm_crc(c->fd, p, len, &crc));
	CHECK(crc == crc0, "parent device crc after the child");
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("%schild read through the inherited and its own fd, device-wrote 8 pages (COW); parent unchanged for CPU and device",
	       PRIVATE ? "private pages at the fork: " : "");
	return PASS;
}

/* hmm-tests anon_write_child_shared: MAP_SHARED memory, child writes */
CXLA_TEST_F(mig, fork_child_shared)
{
	size_t len = 64 * PG;
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
			  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint64_t pat = 0x4242424242424242;
	struct cxl_accel_migrate m;
	int status;
	pid_t pid;
	size_t i;

	CHECK(p != MAP_FAILED, "mmap");
	memset(p, 1, len);
	pid = fork();
	if (!pid) {
		int fd2 = open(c->path, O_RDWR);

		_exit(fd2 < 0 || cxla_svm(fd2, CXL_ACCEL_SVM_FILL, p, len, 0, 0, &pat,
					  NULL) ? 1 : 0);
	}
	CHECK(pid > 0, "fork");
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "child device write failed");
	for (i = 0; i < len; i++)
		CHECK(p[i] == 0x42, "parent byte %zu = %#x", i, p[i]);
	/* shared memory cannot move to the device */
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == 0 && m.refused == len / PG,
	      "shared memory: %llu migrated, %llu refused",
	      (unsigned long long)m.migrated, (unsigned long long)m.refused);
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("child's device write into MAP_SHARED memory seen by the parent; %s migration refused all %zu pages",
	       PRIVATE ? "private" : "coherent", len / PG);
	return PASS;
}

static const char *thp_mode(void)
{
	static char buf[128];
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");

	buf[0] = 0;
	if (f) {
		if (!fgets(buf, sizeof(buf), f))
			buf[0] = 0;
		fclose(f);
	}
	buf[strcspn(buf, "\n")] = 0;
	return buf;
}

/* hmm-tests anon_huge: THP read by the device, then migrated */
CXLA_TEST_F(dev, thp)
{
	size_t len = 4 * MiB, n = len / PG;
	uint8_t *p = map_aligned(len, 2 * MiB), *b, f[1024];
	struct cxl_accel_migrate m;
	struct cxl_accel_alloc a;
	size_t huge;

	CHECK(p, "mmap");
	if (madvise(p, len, MADV_HUGEPAGE))
		FAILF("MADV_HUGEPAGE: %s", strerror(errno));
	fill_pages(p, len, 31);
	OK(snapshot(c->fd, p, len, f));
	huge = count_pages(f, n, CXL_ACCEL_SNAP_HUGE | CXL_ACCEL_SNAP_WRITE, 0);
	if (!huge) {
		DETAIL("no THP here (transparent_hugepage: %s)", thp_mode());
		return SKIP;
	}
	OK(alloc_map(c, c->fd, len, &a, &b));
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_READ, p, len, a.handle, 0, NULL, NULL));
	CHECK(!memcmp(p, b, len), "device read of THP differs");
	/* migration splits the THP */
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "%llu of %zu THP pages migrated (busy %llu)",
	      (unsigned long long)m.migrated, n, (unsigned long long)m.busy);
	OK(snapshot(c->fd, p, len, f));
	CHECK(count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, CXL_ACCEL_SNAP_HUGE) == n,
	      "after migration: %zu local 4 KiB pages",
	      count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, CXL_ACCEL_SNAP_HUGE));
	CHECK(check_pages(p, len, 31) < 0, "data after migration");
	OK(cxla_migrate(c->fd, p, len, false, &m));
	CHECK(m.migrated == n, "back: %llu", (unsigned long long)m.migrated);
	CHECK(check_pages(p, len, 31) < 0, "data after the way back");
	munmap(p, len);
	munmap(b, len);
	POOL_IDLE(c->fd);
	DETAIL("%zu of %zu pages PMD-mapped, device read right; migrated (split) to device and back, data right",
	       huge, n);
	return PASS;
}

static int tmp_file(size_t len, uint64_t seed, uint8_t **data)
{
	char name[] = "/tmp/hmm-file-XXXXXX";
	int fd = mkstemp(name);
	uint8_t *d;

	if (fd < 0)
		return -1;
	unlink(name);
	d = malloc(len);
	fill_random(d, len, seed);
	if (write(fd, d, len) != (ssize_t)len) {
		close(fd);
		free(d);
		return -1;
	}
	*data = d;
	return fd;
}

/* hmm-tests file_read / file_write on a shared file mapping */
CXLA_TEST_F(dev, file_read_write)
{
	size_t len = 1 * MiB;
	uint8_t *data, *p, *back = malloc(len);
	uint64_t pat = 0x6565656565656565;
	int ffd = tmp_file(len, 41, &data);
	uint32_t crc;
	size_t i;

	CHECK(ffd >= 0 && back, "tmp file");
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, ffd, 0);
	CHECK(p != MAP_FAILED, "mmap file");
	OK(svm_crc(c->fd, p, len, &crc));
	CHECK(crc == crc32c(0, data, len), "device crc of the file mapping");
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, p + PG, 3 * PG, 0, 0, &pat, NULL));
	CHECK(pread(ffd, back, len, 0) == (ssize_t)len, "pread");
	for (i = 0; i < len; i++) {
		uint8_t want = i >= PG && i < 4 * PG ? 0x65 : data[i];

		CHECK(back[i] == want, "file byte %zu = %#x, want %#x", i,
		      back[i], want);
	}
	munmap(p, len);
	close(ffd);
	free(data);
	free(back);
	POOL_IDLE(c->fd);
	DETAIL("device read a MAP_SHARED file mapping (crc %#x) and wrote 3 pages, read() sees them",
	       crc);
	return PASS;
}

/* ------------------------------------------------------------ migration */

/*
 * 8 MiB to device memory and back, copied by the device. Private pages are
 * not in the CPU page table: the device computes on them where they are,
 * without a fault back; the way back is MIGRATE_TO_RAM with the same flag.
 */
CXLA_TEST_F(mig, migrate)
{
	size_t len = 8 * MiB, n = len / PG;
	uint8_t *p = map_anon(len);
	struct cxl_accel_hmm_info h1, h2;
	struct cxl_accel_migrate m;
	struct cxl_accel_stats st0, st1;
	uint32_t crc, want;
	long local;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 51);
	want = crc32c(0, p, len);
	OK(cxla_hmm_info(c->fd, &h1));
	OK(cxla_stats(c->fd, &st0));
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "migrated %llu of %zu (already %llu refused %llu busy %llu no space %llu)",
	      (unsigned long long)m.migrated, n, (unsigned long long)m.already,
	      (unsigned long long)m.refused, (unsigned long long)m.busy,
	      (unsigned long long)m.no_space);
	OK(cxla_stats(c->fd, &st1));
	CHECK(st1.device[CXL_ACCEL_STAT_PAGES_COPIED] >
	      st0.device[CXL_ACCEL_STAT_PAGES_COPIED],
	      "device counted no page copies: the CPU copied?");
	local = local_pages(c->fd, p, len);
	CHECK(local == (long)n, "%ld of %zu pages on device memory", local, n);
	OK(cxla_hmm_info(c->fd, &h2));
	CHECK(h2.pool_pages_used == n && h2.migrated_to_dev - h1.migrated_to_dev == n,
	      "pool: %llu used, %llu migrated",
	      (unsigned long long)h2.pool_pages_used,
	      (unsigned long long)(h2.migrated_to_dev - h1.migrated_to_dev));
	if (PRIVATE) {
		local = private_pages(c->fd, p, len);
		CHECK(local == (long)n, "%ld of %zu pages private on the device (no CPU mapping)",
		      local, n);
		CHECK(h2.private_pages == n, "HMM_INFO: %llu private pages",
		      (unsigned long long)h2.private_pages);
	} else {
		CHECK(check_pages(p, len, 51) < 0, "CPU reads other data on device memory");
	}
	/* the device reads them where they are */
	OK(svm_crc(c->fd, p, len, &crc));
	CHECK(crc == want, "device crc %#x of migrated pages, want %#x", crc, want);
	CHECK(!PRIVATE || private_pages(c->fd, p, len) == (long)n,
	      "the device read moved private pages");
	/* again: nothing to do */
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == 0 && m.already == n,
	      "second migration: %llu moved, %llu already, %llu busy",
	      (unsigned long long)m.migrated, (unsigned long long)m.already,
	      (unsigned long long)m.busy);
	CHECK(!PRIVATE || private_pages(c->fd, p, len) == (long)n,
	      "the second migration moved private pages");
	OK(MIGRATE(c->fd, p, len, false, &m));
	CHECK(m.migrated == n, "back to RAM: %llu of %zu",
	      (unsigned long long)m.migrated, n);
	CHECK(local_pages(c->fd, p, len) == 0, "pages left on the device");
	CHECK(check_pages(p, len, 51) < 0, "data after the way back");
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("8 MiB: %zu pages to %s device memory (device: %llu COPY_PAGES entries, %llu commands), %s, back to RAM, pool empty",
	       n, PRIVATE ? "private" : "coherent",
	       (unsigned long long)(st1.device[CXL_ACCEL_STAT_PAGES_COPIED] -
				    st0.device[CXL_ACCEL_STAT_PAGES_COPIED]),
	       (unsigned long long)(st1.device[CXL_ACCEL_STAT_COMMANDS] -
				    st0.device[CXL_ACCEL_STAT_COMMANDS]),
	       PRIVATE ? "no CPU mapping, device crc32c there without a fault" :
	       "CPU and device read them there");
	return PASS;
}

/* holes and zero pages become zero-filled device pages */
CXLA_TEST_F(mig, migrate_holes)
{
	size_t len = 64 * PG, n = len / PG;
	uint8_t *p = map_anon(len), *b, f[64];
	struct cxl_accel_migrate m;
	struct cxl_accel_alloc a;
	volatile uint8_t x;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	x = p[10 * PG];		/* zero page */
	(void)x;
	p[20 * PG] = 5;		/* a real page */
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "%llu of %zu migrated", (unsigned long long)m.migrated, n);
	OK(snapshot(c->fd, p, len, f));
	CHECK(count_pages(f, n, CXL_ACCEL_SNAP_LOCAL | CXL_ACCEL_SNAP_WRITE, 0) == n,
	      "%zu local writable pages", count_pages(f, n, CXL_ACCEL_SNAP_LOCAL | CXL_ACCEL_SNAP_WRITE, 0));
	CHECK(!PRIVATE || count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, CXL_ACCEL_SNAP_PRESENT) == n,
	      "%zu private pages", count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, CXL_ACCEL_SNAP_PRESENT));
	/* the device first: a CPU access would fault private pages back */
	OK(alloc_map(c, c->fd, len, &a, &b));
	memset(b, 0xff, len);
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_READ, p, len, a.handle, 0, NULL, NULL));
	CHECK(b[20 * PG] == 5 && b[0] == 0 && b[len - 1] == 0, "device read");
	CHECK(p[20 * PG] == 5 && is_zero(p, 20 * PG) &&
	      is_zero(p + 20 * PG + 1, len - 20 * PG - 1), "contents");
	CHECK(local_pages(c->fd, p, len) == (PRIVATE ? 0 : (long)n),
	      "%ld pages on the device after the CPU read all", local_pages(c->fd, p, len));
	munmap(p, len);
	munmap(b, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("64 pages (holes, a zero page, a written page) became zero-filled (device FILL) or copied %s device pages; %s",
	       PRIVATE ? "private" : "coherent",
	       PRIVATE ? "the CPU's reads faulted them all back" : "the CPU read them in place");
	return PASS;
}

/*
 * A page a pipe holds (vmsplice) cannot move: it is counted busy, not
 * "already there" among the pages moved in the same window; once the pipe
 * let it go, it moves and the others are already there.
 */
CXLA_TEST_F(mig, migrate_busy_page)
{
	size_t len = 64 * PG, n = len / PG, held = 17;
	uint8_t *p = map_anon(len), buf[PG];
	struct cxl_accel_migrate m;
	int pipefd[2];

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 97);
	CHECK(pipe_hold_page(p + held * PG, pipefd), "pipe, vmsplice");
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == n - 1 && m.busy == 1 && m.already == 0,
	      "a page held by a pipe: %llu moved, %llu busy, %llu already",
	      (unsigned long long)m.migrated, (unsigned long long)m.busy,
	      (unsigned long long)m.already);
	CHECK(local_pages(c->fd, p, len) == (long)n - 1, "%ld pages on the device",
	      local_pages(c->fd, p, len));
	CHECK(read(pipefd[0], buf, PG) == (ssize_t)PG, "read pipe");
	CHECK(check_pages_at(buf, held, PG, 97) < 0, "the pipe delivered other data");
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == 1 && m.busy == 0 && m.already == n - 1,
	      "pipe emptied: %llu moved, %llu busy, %llu already",
	      (unsigned long long)m.migrated, (unsigned long long)m.busy,
	      (unsigned long long)m.already);
	OK(MIGRATE(c->fd, p, len, false, &m));
	CHECK(m.migrated == n, "back to RAM: %llu of %zu",
	      (unsigned long long)m.migrated, n);
	CHECK(check_pages(p, len, 97) < 0, "data after the round trip");
	close(pipefd[0]);
	close(pipefd[1]);
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("%s: a page held by a pipe counted busy beside %zu moved, then moved itself once the pipe let go",
	       PRIVATE ? "private" : "coherent", n - 1);
	return PASS;
}

/* hmm-tests migrate of a private file mapping: COW pages move, page cache not */
CXLA_TEST_F(dev, migrate_private_file)
{
	size_t len = 32 * PG, n = len / PG, i;
	uint8_t *data, *p;
	struct cxl_accel_migrate m;
	int ffd = tmp_file(len, 61, &data);
	long local;

	CHECK(ffd >= 0, "tmp file");
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, ffd, 0);
	CHECK(p != MAP_FAILED, "mmap");
	for (i = 0; i < n; i++)
		(void)*(volatile uint8_t *)(p + i * PG);	/* page cache */
	for (i = 0; i < n; i += 2)
		p[i * PG] ^= 0xff;				/* COW copies */
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n / 2 && m.refused == n / 2,
	      "%llu migrated, %llu refused (want %zu each)",
	      (unsigned long long)m.migrated, (unsigned long long)m.refused, n / 2);
	local = local_pages(c->fd, p, len);
	CHECK(local == (long)n / 2, "%ld local pages", local);
	for (i = 0; i < len; i++) {
		uint8_t want = (i % (2 * PG)) == 0 ? data[i] ^ 0xff : data[i];

		CHECK(p[i] == want, "byte %zu", i);
	}
	OK(cxla_migrate(c->fd, p, len, false, &m));
	CHECK(m.migrated == n / 2, "back: %llu", (unsigned long long)m.migrated);
	munmap(p, len);
	close(ffd);
	free(data);
	POOL_IDLE(c->fd);
	DETAIL("MAP_PRIVATE file: %zu written (anonymous COW) pages migrated, %zu page-cache pages refused",
	       n / 2, n / 2);
	return PASS;
}

/* hmm-tests migrate_shared: shared mappings are refused */
CXLA_TEST_F(dev, migrate_shared)
{
	size_t len = 16 * PG, n = len / PG;
	uint8_t *data, *p, *q;
	struct cxl_accel_migrate m;
	int ffd = tmp_file(len, 62, &data);

	CHECK(ffd >= 0, "tmp file");
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	q = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, ffd, 0);
	CHECK(p != MAP_FAILED && q != MAP_FAILED, "mmap");
	memset(p, 3, len);
	q[0] ^= 1;
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == 0 && m.refused == n, "shmem: %llu migrated, %llu refused",
	      (unsigned long long)m.migrated, (unsigned long long)m.refused);
	OK(cxla_migrate(c->fd, q, len, true, &m));
	CHECK(m.migrated == 0 && m.refused == n, "file: %llu migrated, %llu refused",
	      (unsigned long long)m.migrated, (unsigned long long)m.refused);
	CHECK(local_pages(c->fd, p, len) == 0 && local_pages(c->fd, q, len) == 0,
	      "pages on the device");
	CHECK(p[len - 1] == 3 && q[0] == (data[0] ^ 1), "data");
	munmap(p, len);
	munmap(q, len);
	close(ffd);
	free(data);
	POOL_IDLE(c->fd);
	DETAIL("MAP_SHARED anonymous and file mappings: 0 pages migrated, all %zu refused, data intact",
	       n);
	return PASS;
}

/*
 * The CPU keeps using migrated pages: coherent ones in place, where they
 * stay; a CPU access to a private page faults it back to RAM (through the
 * device), that page only.
 */
CXLA_TEST_F(mig, migrate_cpu_access)
{
	size_t len = 2 * MiB, n = len / PG, moved = PRIVATE ? 2 : 0;
	uint8_t *p = map_anon(len);
	struct cxl_accel_hmm_info h0, h1;
	struct cxl_accel_migrate m;
	uint32_t crc;
	long local;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 71);
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "migrated %llu", (unsigned long long)m.migrated);
	/* read page 3, write page 7 */
	OK(cxla_hmm_info(c->fd, &h0));
	CHECK(check_pages_at(p + 3 * PG, 3, PG, 71) < 0, "CPU read of page 3");
	p[7 * PG] ^= 0xff;
	OK(cxla_hmm_info(c->fd, &h1));
	CHECK(h1.cpu_faults - h0.cpu_faults == moved, "%llu CPU faults, want %zu",
	      (unsigned long long)(h1.cpu_faults - h0.cpu_faults), moved);
	local = local_pages(c->fd, p, len);
	CHECK(local == (long)(n - moved), "%ld pages still on the device, want %zu",
	      local, n - moved);
	p[7 * PG] ^= 0xff;
	CHECK(check_pages(p, len, 71) < 0, "data after CPU accesses");
	/* CPU writes: no fault moves coherent pages back */
	fill_pages(p, len, 72);
	CHECK(check_pages(p, len, 72) < 0, "CPU reads back other data");
	local = local_pages(c->fd, p, len);
	CHECK(local == (PRIVATE ? 0 : (long)n), "after CPU writes %ld of %zu pages on device",
	      local, n);
	OK(svm_crc(c->fd, p, len, &crc));
	CHECK(crc == crc32c(0, p, len), "device sees other data than the CPU wrote");
	OK(MIGRATE(c->fd, p, len, false, &m));
	CHECK(m.migrated == (PRIVATE ? 0 : n), "back: %llu migrated",
	      (unsigned long long)m.migrated);
	CHECK(check_pages(p, len, 72) < 0, "data after the way back");
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	if (PRIVATE)
		DETAIL("a read and a write faulted exactly 2 of %zu private pages back to RAM (migrate_to_ram through the device), CPU writes the rest; device checksum agrees",
		       n);
	else
		DETAIL("CPU read and rewrote 2 MiB on device memory without a fault: pages stayed there, device checksum agrees, data right after the way back");
	return PASS;
}

/* hmm-tests migrate_release: EVICT brings everything back */
CXLA_TEST_F(mig, migrate_release)
{
	size_t len = 6 * MiB, n = len / PG;
	uint8_t *p = map_anon(len);
	struct cxl_accel_migrate m;
	struct cxl_accel_evict e;
	struct cxl_accel_hmm_info h;
	uint64_t free0 = c->id.devmem_free;
	struct cxl_accel_identify id;

	CHECK(p, "mmap");
	fill_pages(p, len, 81);
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "migrated %llu", (unsigned long long)m.migrated);
	CHECK(!PRIVATE || private_pages(c->fd, p, len) == (long)n, "%ld private pages",
	      private_pages(c->fd, p, len));
	OK(cxla_identify(c->fd, &id));
	CHECK(id.devmem_free <= free0 - len, "device memory free %llu of %llu",
	      (unsigned long long)id.devmem_free, (unsigned long long)free0);
	OK(evict(c->fd, &e));
	CHECK(e.evicted == n && e.remaining == 0 && e.chunks_freed == 3,
	      "evicted %llu remaining %llu chunks freed %llu",
	      (unsigned long long)e.evicted, (unsigned long long)e.remaining,
	      (unsigned long long)e.chunks_freed);
	CHECK(local_pages(c->fd, p, len) == 0, "pages still local");
	CHECK(check_pages(p, len, 81) < 0, "data after eviction");
	OK(cxla_hmm_info(c->fd, &h));
	CHECK(!h.pool_pages_used && !h.pool_chunks && !h.private_pages,
	      "pool %llu/%llu, %llu private pages",
	      (unsigned long long)h.pool_pages_used, (unsigned long long)h.pool_chunks,
	      (unsigned long long)h.private_pages);
	OK(cxla_identify(c->fd, &id));
	CHECK(id.devmem_free == free0, "device memory free %llu, was %llu",
	      (unsigned long long)id.devmem_free, (unsigned long long)free0);
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("EVICT moved %llu %s pages back, freed %llu pool buffers; data right, device memory all free",
	       (unsigned long long)e.evicted, PRIVATE ? "private" : "coherent",
	       (unsigned long long)e.chunks_freed);
	return PASS;
}

/*
 * Mixed protections in one range: pages move with theirs (a read-only
 * private page is a read-only device-private entry), PROT_NONE is refused.
 */
CXLA_TEST_F(mig, migrate_mixed_prot)
{
	size_t n = 12, len = n * PG, i;
	uint8_t *p = map_anon(len), f[12];
	struct cxl_accel_migrate m;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 91);
	/* RW RW RW | RO RO RO | NONE NONE NONE | RW RW RW */
	OK(mprotect(p + 3 * PG, 3 * PG, PROT_READ) ? -errno : 0);
	OK(mprotect(p + 6 * PG, 3 * PG, PROT_NONE) ? -errno : 0);
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == 9 && m.refused == 3, "%llu migrated %llu refused",
	      (unsigned long long)m.migrated, (unsigned long long)m.refused);
	OK(snapshot(c->fd, p, len, f));
	for (i = 0; i < n; i++) {
		uint8_t want = i >= 6 && i < 9 ? CXL_ACCEL_SNAP_ERROR :
			(PRIVATE ? 0 : CXL_ACCEL_SNAP_PRESENT) | CXL_ACCEL_SNAP_LOCAL |
			(i >= 3 && i < 6 ? 0 : CXL_ACCEL_SNAP_WRITE);

		CHECK((f[i] & ~CXL_ACCEL_SNAP_MIRRORED) == want,
		      "page %zu flags %#x, want %#x", i, f[i], want);
	}
	OK(mprotect(p, len, PROT_READ | PROT_WRITE) ? -errno : 0);
	CHECK(check_pages(p, len, 91) < 0, "data");
	/* writing a read-only-migrated page, now writable, stays on device */
	p[4 * PG] ^= 1;
	p[4 * PG] ^= 1;
	CHECK(local_pages(c->fd, p, len) == (PRIVATE ? 0 : 9), "%ld pages on the device",
	      local_pages(c->fd, p, len));
	OK(MIGRATE(c->fd, p, len, false, &m));
	CHECK(m.migrated == (PRIVATE ? 0 : 9), "back %llu", (unsigned long long)m.migrated);
	CHECK(check_pages(p, len, 91) < 0, "data after the way back");
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("RW/RO/NONE/RW: 9 migrated with their protections%s, PROT_NONE refused and reported as no access%s",
	       PRIVATE ? " (private: local, not present)" : "",
	       PRIVATE ? "; the CPU's reads faulted the 9 back" : "");
	return PASS;
}

/* hmm-tests migrate_multiple: many round trips */
CXLA_TEST_F(mig, migrate_round_trips)
{
	size_t len = 1 * MiB, n = len / PG;
	uint8_t *p = map_anon(len);
	struct cxl_accel_migrate m;
	int i, rounds = 40;
	uint32_t crc;

	CHECK(p, "mmap");
	for (i = 0; i < rounds; i++) {
		fill_pages(p, len, 100 + i);
		OK(MIGRATE(c->fd, p, len, true, &m));
		CHECK(m.migrated == n, "round %d: %llu to device", i,
		      (unsigned long long)m.migrated);
		if (PRIVATE) {
			/* the CPU would fault them back: the device checks */
			OK(svm_crc(c->fd, p, len, &crc));
			CHECK(crc == crc32c_pages(len, 100 + i), "round %d on device: crc", i);
		} else {
			CHECK(check_pages(p, len, 100 + i) < 0, "round %d on device", i);
		}
		OK(MIGRATE(c->fd, p, len, false, &m));
		CHECK(m.migrated == n, "round %d: %llu back", i,
		      (unsigned long long)m.migrated);
		CHECK(check_pages(p, len, 100 + i) < 0, "round %d back", i);
	}
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("%d round trips of 1 MiB with new data each time (%s)", rounds,
	       PRIVATE ? "private; checked by the device there" : "coherent");
	return PASS;
}

/* hmm-tests migrate_fault style: a single page at a time */
CXLA_TEST_F(mig, migrate_single_pages)
{
	size_t len = 64 * PG, i;
	uint8_t *p = map_anon(len);
	struct cxl_accel_migrate m;
	uint32_t crc;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 111);
	for (i = 0; i < 64; i += 3) {
		OK(MIGRATE(c->fd, p + i * PG, PG, true, &m));
		CHECK(m.migrated == 1, "page %zu", i);
	}
	CHECK(local_pages(c->fd, p, len) == 22, "%ld local", local_pages(c->fd, p, len));
	if (PRIVATE) {
		CHECK(private_pages(c->fd, p, len) == 22, "%ld private",
		      private_pages(c->fd, p, len));
		OK(svm_crc(c->fd, p, len, &crc));
		CHECK(crc == crc32c_pages(len, 111), "device crc");
	} else {
		CHECK(check_pages(p, len, 111) < 0, "data");
	}
	OK(MIGRATE(c->fd, p, len, false, &m));
	CHECK(m.migrated == 22 && m.already == 42, "back %llu already %llu",
	      (unsigned long long)m.migrated, (unsigned long long)m.already);
	CHECK(check_pages(p, len, 111) < 0, "data after the way back");
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("every third page migrated on its own%s; whole range back: 22 moved, 42 already in RAM",
	       PRIVATE ? " (private)" : "");
	return PASS;
}

/* The driver's cpu_copy_pages parameter, or -1 */
static long cpu_copy_pages(void)
{
	FILE *f = fopen("/sys/module/cxl_accel/parameters/cpu_copy_pages", "r");
	long v = -1;

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

/* Pages the device copied (COPY_PAGES entries it counted), or -1 */
static long long device_copies(int fd)
{
	struct cxl_accel_stats st;

	return cxla_stats(fd, &st) ? -1 :
	       (long long)st.device[CXL_ACCEL_STAT_PAGES_COPIED];
}

/*
 * A window of at most cpu_copy_pages pages is copied by the CPU, both ways
 * (the device's round trip costs more than such a copy): the device counts
 * no page copy for it; one page more and the device copies. The data
 * arrives either way, holes as zeros.
 */
CXLA_TEST_F(mig, small_windows_cpu_copy)
{
	long lim = cpu_copy_pages();
	size_t small, big, len;
	struct cxl_accel_migrate m;
	long long d0, d1, d2, d3;
	uint8_t *p;
	uint32_t crc;

	if (lim <= 0 || lim > 256) {
		DETAIL("cpu_copy_pages is %ld: not this test's case", lim);
		return SKIP;
	}
	small = lim;
	big = lim + 1;
	len = (small + big) * PG;
	/* within one 2 MiB: a migration window never ends inside the range */
	p = map_aligned(len, 2 * MiB);
	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 121);
	/* a hole in the small window: the CPU zero-fills its device page */
	madvise(p + (small - 1) * PG, PG, MADV_DONTNEED);
	d0 = device_copies(c->fd);
	OK(MIGRATE(c->fd, p, small * PG, true, &m));
	CHECK(m.migrated == small, "small window: %llu of %zu to the device",
	      (unsigned long long)m.migrated, small);
	d1 = device_copies(c->fd);
	CHECK(d0 >= 0 && d1 == d0, "the device copied %lld pages of a %zu-page window",
	      d1 - d0, small);
	if (PRIVATE) {
		OK(svm_crc(c->fd, p, (small - 1) * PG, &crc));
		CHECK(crc == crc32c_pages((small - 1) * PG, 121), "device crc of the small window");
		CHECK(private_pages(c->fd, p, small * PG) == (long)small, "%ld private",
		      private_pages(c->fd, p, small * PG));
	} else {
		CHECK(check_pages(p, (small - 1) * PG, 121) < 0, "small window on the device");
		CHECK(is_zero(p + (small - 1) * PG, PG), "hole not zero on the device");
	}
	OK(MIGRATE(c->fd, p, small * PG, false, &m));
	CHECK(m.migrated == small, "small window back: %llu", (unsigned long long)m.migrated);
	CHECK(device_copies(c->fd) == d1, "the device copied the small window back");
	CHECK(check_pages(p, (small - 1) * PG, 121) < 0, "small window back in RAM");
	CHECK(is_zero(p + (small - 1) * PG, PG), "hole not zero back in RAM");
	d2 = device_copies(c->fd);
	OK(MIGRATE(c->fd, p + small * PG, big * PG, true, &m));
	CHECK(m.migrated == big, "big window: %llu of %zu", (unsigned long long)m.migrated, big);
	d3 = device_copies(c->fd);
	CHECK(d3 > d2, "the device did not copy a %zu-page window", big);
	OK(MIGRATE(c->fd, p + small * PG, big * PG, false, &m));
	CHECK(m.migrated == big, "big window back: %llu", (unsigned long long)m.migrated);
	CHECK(check_pages_at(p + small * PG, small, big * PG, 121) < 0,
	      "big window back in RAM");
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("%s: a %zu-page window (one hole) went there and back with no device copy; %zu pages: %lld page copies by the device",
	       PRIVATE ? "private" : "coherent", small, big, d3 - d2);
	return PASS;
}

static int read_sys(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	size_t n;

	buf[0] = 0;
	if (!f)
		return -errno;
	n = fread(buf, 1, len - 1, f);
	buf[n] = 0;
	fclose(f);
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

/* The number after "KEY " in cxl-accelN's migration attribute, or -1 */
static long long migration_stat(unsigned int minor, const char *key)
{
	char path[128], line[160];
	size_t n = strlen(key);
	long long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/class/cxl-accel/cxl-accel%u/migration",
		 minor);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ' ') {
			v = strtoll(line + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

/* Waits up to 5 s for the RAM reserve to hold lo to hi - 1 pages */
static bool reserve_within(unsigned int minor, long long lo, long long hi)
{
	long long n;
	int i;

	for (i = 0; i < 250; i++) {
		n = migration_stat(minor, "ram_reserve_pages");
		if (n >= lo && n < hi)
			return true;
		usleep(20000);
	}
	return false;
}

#define RESERVE_PARAM	"/sys/module/cxl_accel/parameters/ram_reserve_mb"

/* The reserve's counters; taken and missed since the last call */
struct reserve_seen {
	long long taken, missed;
};

static void reserve_since(unsigned int minor, struct reserve_seen *s,
			  long long *taken, long long *missed)
{
	long long t = migration_stat(minor, "ram_reserve_taken");
	long long m = migration_stat(minor, "ram_reserve_missed");

	*taken = t - s->taken;
	*missed = m - s->missed;
	s->taken = t;
	s->missed = m;
}

/* Pages [first, first + n) of p there and back; whether all moved each way */
static bool round_trip_pages(int fd, uint32_t flags, uint8_t *p, size_t first,
			     size_t n)
{
	struct cxl_accel_migrate m = { .addr = (uintptr_t)(p + first * PG),
				       .len = n * PG, .flags = flags };

	if (cxla_ioctl(fd, CXL_ACCEL_IOC_MIGRATE_TO_DEV, &m) || m.migrated != n)
		return false;
	memset(&m, 0, sizeof(m));
	m.addr = (uintptr_t)(p + first * PG);
	m.len = n * PG;
	m.flags = flags;
	return !cxla_ioctl(fd, CXL_ACCEL_IOC_MIGRATE_TO_RAM, &m) && m.migrated == n;
}

/*
 * Moves back to RAM take their destinations from the driver's reserve of
 * 2 MiB blocks (ram_reserve_mb), counted in pages: at 0 MiB it is empty and
 * moves allocate their own; set to 8 MiB it fills at once, 4 MiB back takes
 * its pages from it, and it fills again once migrations pause; windows of
 * 16, 16 and 500 pages back share blocks (the third takes the first
 * block's last 480 pages and 20 of a second); drop_caches (the kernel's
 * shrinkers) empties it. The data arrives every time: no page is handed
 * out twice. Run alone: every migration of the guest uses the reserve.
 */
CXLA_TEST_F(mig_alone, ram_reserve)
{
	static const size_t small[][2] = { { 0, 16 }, { 16, 16 }, { 32, 500 } };
	size_t len = 4 * MiB, i;
	unsigned int minor = c->id.minor;
	struct reserve_seen seen = { 0 };
	long long taken, missed;
	int step = 0, ret = FAIL;
	char old[32];
	uint8_t *p;

	if (read_sys(RESERVE_PARAM, old, sizeof(old)) || !old[0]) {
		DETAIL("no ram_reserve_mb parameter");
		return FAIL;
	}
	strcat(old, "\n");
	p = map_aligned(len, 2 * MiB);
	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 77);
#define RESERVE_STEP(cond, ...)	do { step++;				\
		if (!(cond)) { DETAIL(__VA_ARGS__); goto out; } } while (0)
	/*
	 * Counts are at least the pages moved: a page busy for a moment is
	 * moved by another pass, which takes a destination again.
	 */
	/* at 0 MiB the reserve empties and moves allocate their own */
	RESERVE_STEP(!cxla_write_str(RESERVE_PARAM, "0\n") && reserve_within(minor, 0, 1),
		     "at 0 MiB the reserve holds %lld pages",
		     migration_stat(minor, "ram_reserve_pages"));
	reserve_since(minor, &seen, &taken, &missed);
	RESERVE_STEP(round_trip_pages(c->fd, variant->flags, p, 0, len / PG),
		     "4 MiB round trip: %s", strerror(errno));
	reserve_since(minor, &seen, &taken, &missed);
	RESERVE_STEP(taken == 0 && missed >= 1024,
		     "at 0 MiB, 4 MiB back took %lld pages and missed %lld, not 0 and at least 1024",
		     taken, missed);
	RESERVE_STEP(check_pages(p, len, 77) < 0, "page %ld wrong at 0 MiB",
		     check_pages(p, len, 77));
	usleep(200000);		/* a refill would have run by now */
	RESERVE_STEP(migration_stat(minor, "ram_reserve_pages") == 0,
		     "at 0 MiB the reserve filled to %lld pages",
		     migration_stat(minor, "ram_reserve_pages"));
	/* 8 MiB: four blocks, at once */
	RESERVE_STEP(!cxla_write_str(RESERVE_PARAM, "8\n") && reserve_within(minor, 2048, 2049),
		     "at 8 MiB the reserve holds %lld pages, not 2048",
		     migration_stat(minor, "ram_reserve_pages"));
	RESERVE_STEP(round_trip_pages(c->fd, variant->flags, p, 0, len / PG),
		     "4 MiB round trip: %s", strerror(errno));
	reserve_since(minor, &seen, &taken, &missed);
	RESERVE_STEP(taken >= 1024 && missed == 0,
		     "4 MiB back took %lld pages of the reserve and missed %lld, not at least 1024 and 0",
		     taken, missed);
	RESERVE_STEP(check_pages(p, len, 77) < 0, "page %ld wrong after 4 MiB back",
		     check_pages(p, len, 77));
	/* four blocks again, and what is left of one shared after a retry */
	RESERVE_STEP(reserve_within(minor, 2048, 2048 + 512),
		     "the reserve did not fill again: %lld pages",
		     migration_stat(minor, "ram_reserve_pages"));
	for (i = 0; i < 3; i++) {
		RESERVE_STEP(round_trip_pages(c->fd, variant->flags, p, small[i][0],
					      small[i][1]),
			     "%zu pages at %zu: %s", small[i][1], small[i][0], strerror(errno));
		reserve_since(minor, &seen, &taken, &missed);
		RESERVE_STEP(taken >= (long long)small[i][1] && missed == 0,
			     "%zu pages back took %lld of the reserve (at least that many), missed %lld (none)",
			     small[i][1], taken, missed);
	}
	RESERVE_STEP(check_pages(p, len, 77) < 0, "page %ld wrong after the small windows",
		     check_pages(p, len, 77));
	/* refilled: four blocks and the rest of the shared one; then shrunk */
	RESERVE_STEP(reserve_within(minor, 2048, 2048 + 512),
		     "the reserve holds %lld pages, not 2048 to 2559",
		     migration_stat(minor, "ram_reserve_pages"));
	RESERVE_STEP(!cxla_write_str("/proc/sys/vm/drop_caches", "2\n") &&
		     migration_stat(minor, "ram_reserve_pages") == 0,
		     "drop_caches left %lld pages in the reserve",
		     migration_stat(minor, "ram_reserve_pages"));
#undef RESERVE_STEP
	DETAIL("%s: at 0 MiB empty; at 8 MiB 4 MiB back took its pages from it and it filled again; 16, 16 and 500 pages back shared blocks; drop_caches emptied it; data checked each time (%d steps)",
	       PRIVATE ? "private" : "coherent", step);
	ret = PASS;
out:
	if (ret != PASS) {
		char why[DETAIL_LEN];

		snprintf(why, sizeof(why), "%s", cxla_detail);
		DETAIL("step %d: %s", step, why);
	}
	cxla_write_str(RESERVE_PARAM, old);
	munmap(p, len);
	if (ret == PASS)
		PRIVATE_IDLE(c->fd);
	return ret;
}

/* ------------------------------------------------------------------ KSM */

#define KSM_SYS		"/sys/kernel/mm/ksm/"
#define KSM_PAGES	128	/* a region: 3 of 4 pages hold one of 3 common contents */
#define KSM_SECS	4

static long long ksm_get(const char *name)
{
	char path[96], buf[32];

	snprintf(path, sizeof(path), KSM_SYS "%s", name);
	if (read_sys(path, buf, sizeof(buf)) || !buf[0])
		return -1;
	return strtoll(buf, NULL, 10);
}

static int ksm_set(const char *name, long long v)
{
	char path[96], buf[32];

	snprintf(path, sizeof(path), KSM_SYS "%s", name);
	snprintf(buf, sizeof(buf), "%lld\n", v);
	return cxla_write_str(path, buf);
}

/* this process's pages that KSM merged (/proc/self/ksm_merging_pages) */
static long ksm_merged_here(void)
{
	char buf[32];

	if (read_sys("/proc/self/ksm_merging_pages", buf, sizeof(buf)) || !buf[0])
		return -1;
	return strtol(buf, NULL, 10);
}

/* page i of a KSM region: a common content (merged), or one of its own */
static void ksm_page(uint8_t *pg, size_t i, uint64_t own)
{
	uint64_t seed = i % 4 == 3 ? own + i : 1000 + i % 3;

	fill_random(pg, PG, seed);
}

struct ksm_mover {
	int fd[2];		/* the device and the peer */
	uint32_t flags;		/* the variant's */
	uint8_t *p;
	uint64_t seed;
	volatile int stop;
	long ops, errors;
	int err;		/* the first unexpected errno */
	int op;			/* and its operation */
};

/* moves random sub-ranges to either device and back, and evicts */
static void *ksm_move(void *arg)
{
	struct ksm_mover *mv = arg;

	while (!mv->stop) {
		size_t first = rnd64(&mv->seed) % KSM_PAGES;
		size_t n = 1 + rnd64(&mv->seed) % (KSM_PAGES - first);
		int fd = mv->fd[rnd64(&mv->seed) % 2], op = rnd64(&mv->seed) % 8, r;
		struct cxl_accel_migrate m;

		if (op == 0)
			r = evict(fd, NULL);
		else
			r = cxla_migrate_flags(fd, mv->p + first * PG, n * PG, op < 5,
					       op < 5 ? mv->flags : 0, &m);
		mv->ops++;
		if (r && errno != EBUSY && !mv->err) {
			mv->err = errno;
			mv->op = op;
		}
		mv->errors += !!r;
	}
	return NULL;
}

/*
 * One process's part: a mergeable region, merged by ksmd (within the region
 * and with the other process's), moved whole to the device and back, then
 * for KSM_SECS moved in pieces by a thread while this one reads and writes
 * it (writes of a common content are merged again) against a reference.
 * The empty string, or what went wrong.
 */
static void ksm_part(FIXTURE_DATA(dev) *c, uint32_t flags, uint64_t own,
		     char *msg, size_t mlen)
{
	size_t len = KSM_PAGES * PG, i;
	uint8_t *p = map_anon(len), *ref = malloc(len), pg[PG];
	struct ksm_mover mv = { .fd = { c->fd, c->pfd }, .flags = flags,
				.seed = own * 7919 + 1 };
	struct cxl_accel_migrate m;
	uint64_t s = own;
	long merged = 0, checks = 0, writes = 0;
	double end;
	pthread_t t;

	if (!p || !ref) {
		snprintf(msg, mlen, "mmap: %s", strerror(errno));
		return;
	}
	mv.p = p;
	madvise(p, len, MADV_NOHUGEPAGE);
	for (i = 0; i < KSM_PAGES; i++)
		ksm_page(p + i * PG, i, own);
	memcpy(ref, p, len);
	if (madvise(p, len, MADV_MERGEABLE)) {
		snprintf(msg, mlen, "MADV_MERGEABLE: %s", strerror(errno));
		return;
	}
	/* 96 pages of 3 contents: at least most of them merged */
	for (end = now_sec() + 20; now_sec() < end; usleep(20000)) {
		merged = ksm_merged_here();
		if (merged >= 64)
			break;
	}
	if (merged < 64) {
		snprintf(msg, mlen, "pid %d: ksmd merged %ld pages, not 64 in 20 s",
			 getpid(), merged);
		return;
	}
	/* merged pages stay in RAM, shared (refused); the others move */
	if (cxla_migrate_flags(c->fd, p, len, true, flags, &m)) {
		snprintf(msg, mlen, "to the device: %s", strerror(errno));
		return;
	}
	if (memcmp(p, ref, len)) {	/* every page read: mapped again? */
		snprintf(msg, mlen, "contents changed by the move to the device");
		return;
	}
	/*
	 * The five counters share the pages out: a page busy at first and
	 * found in place by the pass that looks again counts as already.
	 */
	if (m.migrated + m.already + m.refused + m.busy + m.no_space != KSM_PAGES ||
	    m.refused < (uint64_t)merged) {
		snprintf(msg, mlen, "to the device with %ld merged: migrated %llu already %llu refused %llu busy %llu no space %llu",
			 merged, (unsigned long long)m.migrated,
			 (unsigned long long)m.already, (unsigned long long)m.refused,
			 (unsigned long long)m.busy, (unsigned long long)m.no_space);
		return;
	}
	if (cxla_migrate_flags(c->fd, p, len, false, 0, &m) || memcmp(p, ref, len)) {
		snprintf(msg, mlen, "back to RAM: %s", strerror(errno));
		return;
	}
	if (pthread_create(&t, NULL, ksm_move, &mv)) {
		snprintf(msg, mlen, "thread");
		return;
	}
	for (end = now_sec() + KSM_SECS; now_sec() < end && !msg[0];) {
		i = rnd64(&s) % KSM_PAGES;
		if (rnd64(&s) % 3) {
			checks++;
			if (memcmp(p + i * PG, ref + i * PG, PG))
				snprintf(msg, mlen, "pid %d: page %zu differs from its reference after %ld checks, %ld writes, %ld moves",
					 getpid(), i, checks, writes, mv.ops);
			continue;
		}
		/* a common content again (KSM merges it), or a new one of its own */
		ksm_page(pg, rnd64(&s) % 2 ? i - i % 4 : i, own + ++writes * 131);
		memcpy(p + i * PG, pg, PG);
		memcpy(ref + i * PG, pg, PG);
		if (!(writes % 64))
			usleep(1000);	/* ksmd's turn */
	}
	mv.stop = 1;
	pthread_join(t, NULL);
	if (!msg[0] && mv.err)
		snprintf(msg, mlen, "pid %d: a move (%s) failed: %s", getpid(),
			 mv.op ? mv.op < 5 ? "to the device" : "to RAM" : "EVICT",
			 strerror(mv.err));
	if (!msg[0] && cxla_migrate_flags(c->fd, p, len, false, 0, &m))
		snprintf(msg, mlen, "back to RAM at the end: %s", strerror(errno));
	if (!msg[0] && cxla_migrate_flags(c->pfd, p, len, false, 0, &m))
		snprintf(msg, mlen, "back to RAM from the peer at the end: %s", strerror(errno));
	for (i = 0; !msg[0] && i < KSM_PAGES; i++)
		if (memcmp(p + i * PG, ref + i * PG, PG))
			snprintf(msg, mlen, "pid %d: page %zu differs at the end", getpid(), i);
	if (!msg[0])
		snprintf(msg, mlen, "ok %ld %ld %ld %ld", merged, checks, writes, mv.ops);
	munmap(p, len);
	free(ref);
}

/*
 * KSM-merged pages under migration: ksmd merges identical pages of a
 * region (within a process and across two) while they move to either
 * device and back (MIGRATE_TO_DEV, MIGRATE_TO_RAM, EVICT) and the CPU reads
 * and writes them. Merged pages stay in RAM (refused); the data stays
 * right; the kernel stays sane (the runner fails on any kernel warning).
 * Run alone: KSM's settings are the whole guest's.
 */
CXLA_TEST_F(mig_alone, ksm_merged_pages)
{
	static const char *const knobs[] = { "run", "pages_to_scan", "sleep_millisecs" };
	long long old[3];
	char msg[256] = "", kid[256] = "";
	int pipefd[2], status, i, ret = FAIL;
	pid_t pid;

	for (i = 0; i < 3; i++)
		old[i] = ksm_get(knobs[i]);
	if (old[0] < 0) {
		DETAIL("no KSM in this kernel (" KSM_SYS ")");
		return SKIP;
	}
	CHECK(!ksm_set("pages_to_scan", 4000) && !ksm_set("sleep_millisecs", 5) &&
	      !ksm_set("run", 1), "KSM settings: %s", strerror(errno));
	CHECK(!pipe(pipefd), "pipe");
	pid = fork();
	if (!pid) {
		ksm_part(c, variant->flags, 2000003, kid, sizeof(kid));
		if (write(pipefd[1], kid, sizeof(kid)) < 0)
			_exit(2);
		_exit(0);
	}
	if (pid > 0) {
		ksm_part(c, variant->flags, 1000003, msg, sizeof(msg));
		if (read(pipefd[0], kid, sizeof(kid)) <= 0)
			snprintf(kid, sizeof(kid), "the child died");
		waitpid(pid, &status, 0);
	}
	/* unmerge everything, then KSM as it was */
	ksm_set("run", 2);
	for (i = 2; i >= 0; i--)
		ksm_set(knobs[i], old[i]);
	close(pipefd[0]);
	close(pipefd[1]);
	CHECK(pid > 0, "fork");
	if (strncmp(msg, "ok ", 3))
		DETAIL("parent: %s", msg);
	else if (strncmp(kid, "ok ", 3))
		DETAIL("child: %s", kid);
	else {
		long a[4], b[4];

		sscanf(msg, "ok %ld %ld %ld %ld", &a[0], &a[1], &a[2], &a[3]);
		sscanf(kid, "ok %ld %ld %ld %ld", &b[0], &b[1], &b[2], &b[3]);
		DETAIL("%s: two processes, %ld and %ld pages merged by ksmd; %ld and %ld moves, %ld and %ld CPU writes, %ld and %ld checks, data right",
		       PRIVATE ? "private" : "coherent", a[0], b[0], a[3], b[3],
		       a[2], b[2], a[1], b[1]);
		ret = PASS;
	}
	if (ret == PASS) {
		PRIVATE_IDLE(c->fd);
		PRIVATE_IDLE(c->pfd);
	}
	return ret;
}

/*
 * hmm-tests snapshot: every kind of page; a private page is on the device
 * (LOCAL) but not in the CPU page table (not PRESENT)
 */
CXLA_TEST_F(mig, snapshot)
{
	size_t n = 10, len = n * PG;
	uint8_t *p = map_anon(len), f[10];
	struct cxl_accel_migrate m;
	volatile uint8_t x;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	/* 0 none, 1 zero page, 2 RW RAM, 3 RO RAM, 4 local RW, 5 local RO,
	 * 6 no access, 7 unmapped, 8 none, 9 RW RAM
	 */
	x = p[1 * PG];
	(void)x;
	p[2 * PG] = 1;
	p[3 * PG] = 1;
	p[4 * PG] = 1;
	p[5 * PG] = 1;
	p[9 * PG] = 1;
	OK(MIGRATE(c->fd, p + 4 * PG, 2 * PG, true, &m));
	CHECK(m.migrated == 2, "migrate");
	OK(mprotect(p + 3 * PG, PG, PROT_READ) ? -errno : 0);
	OK(mprotect(p + 5 * PG, PG, PROT_READ) ? -errno : 0);
	OK(mprotect(p + 6 * PG, PG, PROT_NONE) ? -errno : 0);
	OK(munmap(p + 7 * PG, PG) ? -errno : 0);
	OK(snapshot(c->fd, p, len, f));
	{
		const uint8_t P = CXL_ACCEL_SNAP_PRESENT, W = CXL_ACCEL_SNAP_WRITE,
			      L = CXL_ACCEL_SNAP_LOCAL, D = PRIVATE ? 0 : P;
		const uint8_t want[10] = { 0, P | CXL_ACCEL_SNAP_ZERO, P | W, P,
			D | W | L, D | L, CXL_ACCEL_SNAP_ERROR,
			CXL_ACCEL_SNAP_ERROR, 0, P | W };
		size_t i;

		for (i = 0; i < n; i++)
			CHECK(f[i] == want[i], "page %zu: flags %#x, want %#x", i,
			      f[i], want[i]);
	}
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("not present, zero page, RW/RO in RAM, RW/RO on device%s, PROT_NONE and unmapped (error) all reported right",
	       PRIVATE ? " (private: local, not present)" : "");
	return PASS;
}

/*
 * Copy-on-write of device pages after fork: both share them read-only. A
 * private page that either process touches faults back to RAM (for both).
 */
CXLA_TEST_F(mig, cow_device_pages)
{
	size_t len = 16 * PG, n = len / PG;
	uint8_t *p = map_anon(len), f[16];
	struct cxl_accel_migrate m;
	int status, pipefd[2];
	char msg[200] = "";
	pid_t pid;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 121);
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "migrate");
	CHECK(!pipe(pipefd), "pipe");
	pid = fork();
	if (!pid) {
		uint8_t g[16];
		uint8_t notp = PRIVATE ? CXL_ACCEL_SNAP_PRESENT : 0;

		/* shared with the parent: read-only, on device memory */
		if (snapshot(c->fd, p, len, g) ||
		    count_pages(g, n, CXL_ACCEL_SNAP_LOCAL, CXL_ACCEL_SNAP_WRITE | notp) != n)
			snprintf(msg, sizeof(msg), "child: pages not shared read-only on device (%#x)", g[0]);
		else if (check_pages(p, len, 121) >= 0)
			snprintf(msg, sizeof(msg), "child reads other data");
		else {
			p[0] ^= 0xff;	/* COW: the child gets a copy in RAM */
			if (snapshot(c->fd, p, len, g) ||
			    (g[0] & CXL_ACCEL_SNAP_LOCAL) || !(g[0] & CXL_ACCEL_SNAP_WRITE) ||
			    !(g[1] & CXL_ACCEL_SNAP_LOCAL) != !!PRIVATE)
				snprintf(msg, sizeof(msg), "child after COW: %#x %#x", g[0], g[1]);
			else if (p[0] != (uint8_t)(page_word(121, 0) ^ 0xff))
				snprintf(msg, sizeof(msg), "child reads %#x after its write", p[0]);
		}
		if (write(pipefd[1], msg, sizeof(msg)) < 0)
			_exit(2);
		_exit(msg[0] ? 1 : 0);
	}
	CHECK(pid > 0, "fork");
	if (read(pipefd[0], msg, sizeof(msg)) < 0)
		msg[0] = '?';
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "%s", msg);
	CHECK(check_pages(p, len, 121) < 0, "parent sees the child's write");
	OK(snapshot(c->fd, p, len, f));
	CHECK(count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, 0) == (PRIVATE ? 0 : n),
	      "%zu parent pages on the device", count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, 0));
	/* the parent writes: its page is exclusive again (no copy needed) */
	p[PG] ^= 1;
	p[PG] ^= 1;
	OK(MIGRATE(c->fd, p, len, false, &m));
	CHECK(m.migrated == (PRIVATE ? 0 : n), "back %llu", (unsigned long long)m.migrated);
	CHECK(check_pages(p, len, 121) < 0, "parent data at the end");
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	if (PRIVATE)
		DETAIL("after fork private pages are shared read-only (local, not present); the child's reads faulted them back to RAM, its write got its own copy; the parent's data unchanged");
	else
		DETAIL("after fork device pages are shared read-only; the child's write copied one page to RAM, the parent's stayed on the device unchanged");
	return PASS;
}

/* a process exits with pages on the device: they come back to the pool */
CXLA_TEST_F(mig, exit_with_device_pages)
{
	struct cxl_accel_hmm_info h;
	int status;
	pid_t pid;

	pid = fork();
	if (!pid) {
		size_t len = 8 * MiB;
		uint8_t *p = map_anon(len);
		struct cxl_accel_migrate m;

		if (!p)
			_exit(1);
		fill_pages(p, len, 131);
		if (MIGRATE(c->fd, p, len, true, &m) || m.migrated != len / PG)
			_exit(2);
		_exit(0);	/* no munmap, no close */
	}
	CHECK(pid > 0, "fork");
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "child status %d",
	      WEXITSTATUS(status));
	PRIVATE_IDLE(c->fd);
	OK(cxla_hmm_info(c->fd, &h));
	DETAIL("child exited with 8 MiB on %s device memory: every page back in the pool, pool buffers freed",
	       PRIVATE ? "private" : "coherent");
	return PASS;
}

/*
 * Device pages that no process maps any more but that a pipe still
 * references (vmsplice from a process that exited): eviction must leave
 * them alone, since their anon_vmas are gone (a walk of one crashed the
 * kernel), the pipe must still deliver their data, and the pages come back
 * to the pool when the pipe lets them go. The child maps every page as a
 * vma of its own, so that it owns whole slab pages of anon_vmas, which go
 * back to the page allocator and are reused (zeroed) before the EVICT.
 */
#define SPLICE_PAGES	128	/* in the pipe */
#define SPLICE_VMAS	2048	/* enough anon_vmas for whole slab pages */

/* One round: returns PASS or FAIL; *evicted_total accumulates. */
static int evict_spliced_round(FIXTURE_DATA(dev) *c, int round)
{
	size_t n = SPLICE_PAGES, len = n * PG, churn = 128 * MiB, i;
	uint64_t seed = 171 + round * SPLICE_VMAS;
	struct cxl_accel_evict e;
	int pipefd[2], status;
	uint8_t *buf, *q;
	pid_t pid;

	CHECK(!pipe(pipefd), "pipe");
	CHECK(fcntl(pipefd[1], F_SETPIPE_SZ, (int)(2 * len)) >= (int)len,
	      "F_SETPIPE_SZ");
	pid = fork();
	if (!pid) {
		/* RW pages between PROT_NONE ones: a vma and anon_vma each */
		size_t span = 2 * SPLICE_VMAS * PG;
		uint8_t *p = mmap(NULL, span, PROT_NONE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct iovec iov[SPLICE_PAGES];
		struct cxl_accel_migrate m;

		if (p == MAP_FAILED)
			_exit(1);
		for (i = 0; i < SPLICE_VMAS; i++) {
			if (mprotect(p + 2 * i * PG, PG, PROT_READ | PROT_WRITE))
				_exit(1);
			fill_pages(p + 2 * i * PG, PG, seed + i);
		}
		if (cxla_migrate(c->fd, p, span, true, &m) ||
		    m.migrated != SPLICE_VMAS)
			_exit(2);
		/* every 16th page into the pipe */
		for (i = 0; i < n; i++) {
			iov[i].iov_base = p + 2 * (16 * i) * PG;
			iov[i].iov_len = PG;
		}
		if (vmsplice(pipefd[1], iov, n, 0) != (ssize_t)len)
			_exit(3);
		_exit(0);	/* its address space and anon_vmas go */
	}
	CHECK(pid > 0, "fork");
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "child status %d",
	      WEXITSTATUS(status));
	/* past an RCU grace period, the freed slab pages are reused, zeroed */
	usleep(200000);
	q = map_anon(churn);
	CHECK(q, "mmap");
	for (i = 0; i < churn / PG; i++)
		q[i * PG + PG - 1] = 1;
	OK(evict(c->fd, &e));
	CHECK(e.remaining == n, "round %d: evict: %llu evicted, %llu remaining (the pipe holds %zu)",
	      round, (unsigned long long)e.evicted,
	      (unsigned long long)e.remaining, n);
	buf = malloc(len);
	CHECK(buf, "malloc");
	CHECK(read(pipefd[0], buf, len) == (ssize_t)len, "read pipe");
	for (i = 0; i < n; i++)
		CHECK(check_pages(buf + i * PG, PG, seed + 16 * i) < 0,
		      "round %d: the pipe delivered other data in page %zu",
		      round, i);
	free(buf);
	munmap(q, churn);
	close(pipefd[0]);
	close(pipefd[1]);
	POOL_IDLE(c->fd);
	return PASS;
}

CXLA_TEST_F(dev, evict_spliced)
{
	int round;

	for (round = 0; round < 3; round++)
		if (evict_spliced_round(c, round) != PASS)
			return FAIL;
	DETAIL("3 rounds: EVICT left the %d spliced pages of an exited process alone; the pipe delivered their data, then they went back to the pool",
	       SPLICE_PAGES);
	return PASS;
}

/*
 * Eviction finds device pages wherever they are mapped: moved by mremap()
 * in the process that migrated them, and kept only by a forked child after
 * that process exited (the device never saw the child: every process is
 * looked at then). The data stays right, the pool ends empty.
 */
CXLA_TEST_F(mig, evict_moved_and_inherited)
{
	size_t len = 2 * MiB, n = len / PG;
	int tochild[2], toparent[2], status;
	struct cxl_accel_evict e;
	struct cxl_accel_migrate m;
	uint8_t *p, *q, f[512];
	char ok = 0;
	pid_t pid;

	/* mremap: the same process, another address */
	p = map_aligned(len, 2 * MiB);
	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 211);
	OK(MIGRATE(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "migrate %llu", (unsigned long long)m.migrated);
	q = mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED,
		   map_aligned(len, 2 * MiB));
	CHECK(q != MAP_FAILED, "mremap");
	OK(evict(c->fd, &e));
	CHECK(e.evicted == n && !e.remaining, "after mremap: %llu evicted, %llu remaining",
	      (unsigned long long)e.evicted, (unsigned long long)e.remaining);
	CHECK(check_pages(q, len, 211) < 0, "data after mremap and eviction");
	OK(snapshot(c->fd, q, len, f));
	CHECK(!count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, 0), "pages still on the device");
	munmap(q, len);
	PRIVATE_IDLE(c->fd);

	/* a child inherits them, its parent exits */
	CHECK(!pipe(tochild) && !pipe(toparent), "pipe");
	pid = fork();
	if (!pid) {
		pid_t gc;

		p = map_anon(len);
		if (!p)
			_exit(1);
		madvise(p, len, MADV_NOHUGEPAGE);
		fill_pages(p, len, 212);
		if (MIGRATE(c->fd, p, len, true, &m) || m.migrated != n)
			_exit(2);
		gc = fork();
		if (!gc) {
			/* the grandchild, never known to the device */
			if (read(tochild[0], &ok, 1) != 1)
				_exit(1);
			ok = check_pages(p, len, 212) < 0 ? 'y' : 'n';
			if (snapshot(c->fd, p, len, f) ||
			    count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, 0))
				ok = 'd';
			_exit(write(toparent[1], &ok, 1) == 1 ? 0 : 1);
		}
		_exit(gc > 0 ? 0 : 3);	/* the pages live on in the grandchild */
	}
	CHECK(pid > 0, "fork");
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "child %d", WEXITSTATUS(status));
	OK(evict(c->fd, &e));
	CHECK(e.evicted == n && !e.remaining, "inherited: %llu evicted, %llu remaining",
	      (unsigned long long)e.evicted, (unsigned long long)e.remaining);
	CHECK(write(tochild[1], "g", 1) == 1, "pipe");
	CHECK(read(toparent[0], &ok, 1) == 1, "grandchild gone");
	CHECK(ok == 'y', "grandchild: %s", ok == 'n' ? "data changed" :
	      ok == 'd' ? "pages still on the device" : "failed");
	PRIVATE_IDLE(c->fd);
	DETAIL("EVICT moved %zu %s pages after mremap, and %zu pages that only a grandchild of the migrating process still mapped; data intact",
	       n, PRIVATE ? "private" : "coherent", n);
	return PASS;
}

struct racer {
	int fd;
	uint8_t *p;
	size_t len;
	uint32_t handle;
	volatile int stop;
	long ok, efault, other;
	int last_err;
};

static void *race_reader(void *arg)
{
	struct racer *r = arg;

	while (!r->stop) {
		int e = cxla_svm(r->fd, CXL_ACCEL_SVM_READ, r->p, r->len, r->handle,
				 0, NULL, NULL);

		if (!e)
			r->ok++;
		else if (e == -EFAULT)
			r->efault++;
		else {
			r->other++;
			r->last_err = e;
		}
	}
	return NULL;
}

/* munmap while the device reads the range */
CXLA_TEST_F(dev, unmap_race)
{
	size_t len = 2 * MiB;
	struct cxl_accel_hmm_info h1, h2;
	struct cxl_accel_alloc a;
	struct racer r = { .fd = c->fd, .len = len };
	uint8_t *b;
	int i, rounds = 30;
	pthread_t t;

	OK(alloc_map(c, c->fd, len, &a, &b));
	r.handle = a.handle;
	OK(cxla_hmm_info(c->fd, &h1));
	for (i = 0; i < rounds; i++) {
		r.p = map_anon(len);
		CHECK(r.p, "mmap");
		memset(r.p, i, len);
		if (i % 2)
			OK(cxla_migrate(c->fd, r.p, len, true, NULL));
		r.stop = 0;
		CHECK(!pthread_create(&t, NULL, race_reader, &r), "thread");
		usleep(1000 + (i % 5) * 3000);
		OK(munmap(r.p, len) ? -errno : 0);
		usleep(2000);
		r.stop = 1;
		pthread_join(t, NULL);
		/* after munmap returned, the device cannot reach the range */
		EXPECT_ERR(cxla_svm(c->fd, CXL_ACCEL_SVM_READ, r.p, len, a.handle, 0,
				    NULL, NULL), EFAULT);
	}
	CHECK(!r.other, "%ld reads failed with %d", r.other, r.last_err);
	OK(cxla_hmm_info(c->fd, &h2));
	munmap(b, len);
	POOL_IDLE(c->fd);
	DETAIL("%d munmaps under a looping 2 MiB device read: %ld reads ok, %ld -EFAULT, none else; %llu invalidations waited for the device",
	       rounds, r.ok, r.efault,
	       (unsigned long long)(h2.svm_invalidate_waits - h1.svm_invalidate_waits));
	return PASS;
}

struct mig_racer {
	int fd;
	uint8_t *p;
	size_t len;
	uint32_t flags;		/* MIGRATE_* */
	volatile int stop;
	long ok, efault, other, moved;
	int last_err;
};

static void *mig_race_thread(void *arg)
{
	struct mig_racer *r = arg;
	int dir = 0;

	while (!r->stop) {
		struct cxl_accel_migrate m;
		int e = cxla_migrate_flags(r->fd, r->p, r->len, dir ^= 1,
					   r->flags, &m);

		if (!e) {
			r->ok++;
			r->moved += m.migrated;
		} else if (e == -EFAULT) {
			r->efault++;
		} else {
			r->other++;
			r->last_err = e;
		}
	}
	return NULL;
}

/* munmap and mmap pieces of a range while it migrates back and forth */
CXLA_TEST_F(mig, migrate_unmap_race)
{
	struct mig_racer r = { .fd = c->fd, .len = 4 * MiB, .flags = variant->flags };
	uint64_t s = 99;
	pthread_t t;
	int i;

	r.p = map_anon(r.len);
	CHECK(r.p, "mmap");
	memset(r.p, 1, r.len);
	CHECK(!pthread_create(&t, NULL, mig_race_thread, &r), "thread");
	for (i = 0; i < 150; i++) {
		size_t off = (rnd64(&s) % (r.len / (64 * KiB))) * 64 * KiB;
		uint8_t *q = r.p + off;

		munmap(q, 64 * KiB);
		usleep(rnd64(&s) % 2000);
		if (mmap(q, 64 * KiB, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != q) {
			r.stop = 1;
			pthread_join(t, NULL);
			FAILF("remap");
		}
		memset(q, 2, 64 * KiB);
	}
	r.stop = 1;
	pthread_join(t, NULL);
	CHECK(!r.other, "%ld migrations failed with %s", r.other, strerror(-r.last_err));
	for (i = 0; i < (int)r.len; i += PG)
		CHECK(r.p[i] == 1 || r.p[i] == 2, "byte %d = %d", i, r.p[i]);
	OK(MIGRATE(c->fd, r.p, r.len, false, NULL));
	munmap(r.p, r.len);
	PRIVATE_IDLE(c->fd);
	DETAIL("150 munmap/mmap of 64 KiB pieces under %s migrations of the 4 MiB range: %ld ok (%ld pages moved), %ld -EFAULT (range not mapped), no other outcome",
	       PRIVATE ? "private" : "coherent", r.ok, r.moved, r.efault);
	return PASS;
}

static int io_uring_register_buf(void *p, size_t len, int *ring)
{
	struct io_uring_params prm;
	struct iovec iov = { .iov_base = p, .iov_len = len };
	int fd;

	memset(&prm, 0, sizeof(prm));
	fd = syscall(__NR_io_uring_setup, 4, &prm);
	if (fd < 0)
		return -errno;
	if (syscall(__NR_io_uring_register, fd, IORING_REGISTER_BUFFERS, &iov, 1)) {
		int e = -errno;

		close(fd);
		return e;
	}
	*ring = fd;
	return 0;
}

/* long-term pins (FOLL_LONGTERM) move device pages to RAM, block migration */
CXLA_TEST_F(dev, longterm_pin)
{
	size_t len = 1 * MiB, n = len / PG;
	uint8_t *p = map_anon(len);
	struct cxl_accel_pin_checksum pc = { 0 };
	struct cxl_accel_migrate m;
	char uring[120] = "io_uring not available";
	int ring, r;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 141);
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "migrate");
	pc.addr = (uintptr_t)p;
	pc.len = len;
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_PIN_CHECKSUM, &pc));
	CHECK(pc.pages == n && pc.on_device == 0,
	      "pinned %llu pages, %llu of them on device memory",
	      (unsigned long long)pc.pages, (unsigned long long)pc.on_device);
	CHECK(pc.crc == crc32c(0, p, len), "crc of pinned pages");
	CHECK(local_pages(c->fd, p, len) == 0, "pages stayed on the device");
	CHECK(check_pages(p, len, 141) < 0, "data after the long-term pin");

	/* io_uring fixed buffers hold a long-term pin: migration must fail */
	r = io_uring_register_buf(p, len, &ring);
	if (!r) {
		OK(cxla_migrate(c->fd, p, len, true, &m));
		CHECK(m.migrated == 0 && m.busy == n,
		      "pinned by io_uring: %llu migrated, %llu busy",
		      (unsigned long long)m.migrated, (unsigned long long)m.busy);
		syscall(__NR_io_uring_register, ring, IORING_UNREGISTER_BUFFERS, NULL, 0);
		close(ring);
		OK(cxla_migrate(c->fd, p, len, true, &m));
		CHECK(m.migrated == n, "unpinned: %llu migrated",
		      (unsigned long long)m.migrated);
		/* registering device pages moves them out again */
		r = io_uring_register_buf(p, len, &ring);
		CHECK(!r, "register of device pages: %d", r);
		CHECK(local_pages(c->fd, p, len) == 0, "registered pages on device");
		CHECK(check_pages(p, len, 141) < 0, "data");
		close(ring);
		snprintf(uring, sizeof(uring),
			 "io_uring fixed buffers: migration busy for all %zu pages, moved out on registration", n);
	} else {
		snprintf(uring, sizeof(uring), "io_uring: %s", strerror(-r));
	}
	munmap(p, len);
	POOL_IDLE(c->fd);
	DETAIL("PIN_CHECKSUM (FOLL_LONGTERM) moved all %zu pages to RAM before pinning, crc right; %s",
	       n, uring);
	return PASS;
}

/* device memory runs out: the rest stays, counted */
CXLA_TEST_F(dev, migrate_no_space)
{
	struct cxl_accel_identify id;
	struct cxl_accel_migrate m;
	struct cxl_accel_alloc a;
	size_t len = 8 * MiB, n = len / PG;
	uint8_t *p = map_anon(len);
	uint64_t hog;

	CHECK(p, "mmap");
	OK(cxla_identify(c->fd, &id));
	CHECK(id.devmem_free >= 8 * MiB, "only %llu bytes free",
	      (unsigned long long)id.devmem_free);
	hog = id.devmem_free - 4 * MiB;
	OK(cxla_alloc(c->fd, hog, 0, &a));
	fill_pages(p, len, 151);
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n / 2 && m.no_space == n / 2,
	      "%llu migrated, %llu no space (busy %llu)",
	      (unsigned long long)m.migrated, (unsigned long long)m.no_space,
	      (unsigned long long)m.busy);
	CHECK(check_pages(p, len, 151) < 0, "data");
	OK(cxla_free(c->fd, a.handle));
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n / 2 && m.already == n / 2, "after FREE: %llu",
	      (unsigned long long)m.migrated);
	munmap(p, len);
	POOL_IDLE(c->fd);
	DETAIL("4 MiB of device memory left: half of 8 MiB migrated, half reported no space; the rest after FREE");
	return PASS;
}

/*
 * Space runs out and a page is busy (a pipe holds it): the passes that look
 * at busy pages again see the no-space pages again too; each page is still
 * counted once.
 */
CXLA_TEST_F(dev, migrate_no_space_busy)
{
	struct cxl_accel_identify id;
	struct cxl_accel_migrate m, first;
	struct cxl_accel_alloc a;
	size_t len = 8 * MiB, n = len / PG, held = n / 2 + 5;
	uint8_t *p = map_anon(len), buf[PG];
	int pipefd[2];

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);	/* the pipe holds one page, not a THP */
	OK(cxla_identify(c->fd, &id));
	CHECK(id.devmem_free >= 8 * MiB, "only %llu bytes free",
	      (unsigned long long)id.devmem_free);
	OK(cxla_alloc(c->fd, id.devmem_free - 4 * MiB, 0, &a));
	fill_pages(p, len, 163);
	CHECK(pipe_hold_page(p + held * PG, pipefd), "pipe, vmsplice");
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n / 2 && m.busy <= 1 &&
	      m.busy + m.no_space == n / 2 && m.already == 0,
	      "%llu migrated, %llu no space, %llu busy, %llu already",
	      (unsigned long long)m.migrated, (unsigned long long)m.no_space,
	      (unsigned long long)m.busy, (unsigned long long)m.already);
	first = m;
	CHECK(read(pipefd[0], buf, PG) == (ssize_t)PG, "read pipe");
	CHECK(check_pages_at(buf, held, PG, 163) < 0, "the pipe delivered other data");
	close(pipefd[0]);
	close(pipefd[1]);
	CHECK(check_pages(p, len, 163) < 0, "data");
	OK(cxla_free(c->fd, a.handle));
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n / 2 && m.already == n / 2, "after FREE: %llu moved, %llu already",
	      (unsigned long long)m.migrated, (unsigned long long)m.already);
	munmap(p, len);
	POOL_IDLE(c->fd);
	DETAIL("4 MiB left, a page held by a pipe: %llu moved, %llu no space, %llu busy, each page counted once",
	       (unsigned long long)first.migrated,
	       (unsigned long long)first.no_space,
	       (unsigned long long)first.busy);
	return PASS;
}

/* no 2 MiB-aligned free extent: the pool takes an unaligned 2 MiB one */
CXLA_TEST_F(dev, migrate_fragmented)
{
	struct cxl_accel_alloc a, bufs[1024];
	size_t len = 2 * MiB, n = len / PG;
	struct cxl_accel_migrate m;
	uint8_t *p = map_anon(len);
	int nb = 0, i, x = -1, y = -1, r;

	CHECK(p, "mmap");
	while (nb < 1024 && !(r = cxla_alloc(c->fd, 1 * MiB, 0, &a)))
		bufs[nb++] = a;
	CHECK(nb < 1024 && r == -ENOSPC, "filling device memory: %d", r);
	for (i = 0; i < nb && x < 0; i++) {
		int k;

		if (bufs[i].offset % (2 * MiB) != 1 * MiB)
			continue;
		for (k = 0; k < nb; k++)
			if (bufs[k].offset == bufs[i].offset + 1 * MiB) {
				x = i;
				y = k;
				break;
			}
	}
	CHECK(x >= 0, "no two adjacent 1 MiB buffers at an odd MiB");
	OK(cxla_free(c->fd, bufs[x].handle));
	OK(cxla_free(c->fd, bufs[y].handle));
	fill_pages(p, len, 155);
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "%llu migrated (no space %llu)",
	      (unsigned long long)m.migrated, (unsigned long long)m.no_space);
	CHECK(check_pages(p, len, 155) < 0, "data");
	OK(cxla_migrate(c->fd, p, len, false, &m));
	for (i = 0; i < nb; i++)
		if (i != x && i != y)
			OK(cxla_free(c->fd, bufs[i].handle));
	munmap(p, len);
	POOL_IDLE(c->fd);
	DETAIL("device memory full but for 2 MiB at offset %#llx (not 2 MiB aligned): 2 MiB migrated into it",
	       (unsigned long long)bufs[x].offset);
	return PASS;
}

/* ----------------------------------------------------------- stress */

struct stress_proc {
	int fd;
	uint32_t flags;		/* MIGRATE_* */
	uint8_t *p;		/* region, COW-shared with the other processes */
	size_t npages;		/* CPU half then device half */
	uint32_t *ver;		/* CPU half: last version written per page */
	uint64_t *pat;		/* device half: last fill pattern per page */
	volatile int stop;
	long migrations, moved, cpu_writes, dev_fills, dev_reads, errors;
	int last_err;
	int id;
};

static void stress_err(struct stress_proc *s, int e)
{
	s->errors++;
	s->last_err = e;
}

static void *stress_migrator(void *arg)
{
	struct stress_proc *s = arg;
	uint64_t r = 0x9e3779b97f4a7c15ULL * (s->id + 1);

	while (!s->stop) {
		size_t first = rnd64(&r) % s->npages;
		size_t cnt = 1 + rnd64(&r) % 64;
		struct cxl_accel_migrate m;
		int e;

		if (first + cnt > s->npages)
			cnt = s->npages - first;
		e = cxla_migrate_flags(s->fd, s->p + first * PG, cnt * PG,
				       rnd64(&r) & 1, s->flags, &m);
		if (e)
			stress_err(s, e);
		s->migrations++;
		s->moved += m.migrated;
	}
	return NULL;
}

static void *stress_cpu(void *arg)
{
	struct stress_proc *s = arg;
	uint64_t r = 0x1234567ULL * (s->id + 7);
	size_t half = s->npages / 2;

	while (!s->stop) {
		size_t pg = rnd64(&r) % half, w;
		uint32_t v = ++s->ver[pg];
		uint32_t *q = (uint32_t *)(s->p + pg * PG);

		for (w = 0; w < PG / 4; w++)
			q[w] = v * 0x01000193u + w + s->id;
		s->cpu_writes++;
	}
	return NULL;
}

static void *stress_device(void *arg)
{
	struct stress_proc *s = arg;
	uint64_t r = 0x777ULL * (s->id + 3);
	size_t half = s->npages / 2;
	uint32_t crc;

	while (!s->stop) {
		size_t pg = half + rnd64(&r) % half;
		uint64_t pat = rnd64(&r) | 1;
		int e;

		if (rnd64(&r) & 1) {
			e = cxla_svm(s->fd, CXL_ACCEL_SVM_FILL, s->p + pg * PG, PG, 0, 0,
				     &pat, NULL);
			if (!e) {
				s->pat[pg] = pat;
				s->dev_fills++;
			}
		} else {
			/* any range, also what the CPU is writing: no check */
			size_t first = rnd64(&r) % s->npages;
			size_t cnt = 1 + rnd64(&r) % 32;

			if (first + cnt > s->npages)
				cnt = s->npages - first;
			e = svm_crc(s->fd, s->p + first * PG, cnt * PG, &crc);
			s->dev_reads++;
		}
		if (e && e != -EBUSY)
			stress_err(s, e);
	}
	return NULL;
}

static int stress_child(FIXTURE_DATA(dev) *c, uint32_t flags, uint8_t *p,
			size_t npages, int id, char *msg)
{
	struct stress_proc s = { .p = p, .npages = npages, .id = id, .flags = flags };
	size_t half = npages / 2, pg, w;
	pthread_t t[3];
	uint32_t crc;
	int i;

	s.fd = open(c->path, O_RDWR);
	s.ver = calloc(half, sizeof(*s.ver));
	s.pat = calloc(npages, sizeof(*s.pat));
	if (s.fd < 0 || !s.ver || !s.pat)
		return snprintf(msg, 200, "setup"), 1;
	/* own initial contents: breaks COW for this process's CPU half */
	for (pg = 0; pg < half; pg++)
		for (w = 0; w < PG / 4; w++)
			((uint32_t *)(p + pg * PG))[w] = w + id;
	pthread_create(&t[0], NULL, stress_migrator, &s);
	pthread_create(&t[1], NULL, stress_cpu, &s);
	pthread_create(&t[2], NULL, stress_device, &s);
	sleep(stress_secs);
	s.stop = 1;
	for (i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	if (s.errors)
		return snprintf(msg, 200, "proc %d: %ld errors, last %s", id,
				s.errors, strerror(-s.last_err)), 1;
	for (i = 0; i < 2; i++) {
		for (pg = 0; pg < half; pg++)
			for (w = 0; w < PG / 4; w++) {
				uint32_t want = s.ver[pg] ? s.ver[pg] * 0x01000193u + w + id :
					w + id;

				if (((uint32_t *)(p + pg * PG))[w] != want)
					return snprintf(msg, 200, "proc %d pass %d: CPU page %zu word %zu",
							id, i, pg, w), 1;
			}
		for (pg = half; pg < npages; pg++) {
			const uint8_t *b = p + pg * PG;

			for (w = 0; w < PG; w++) {
				uint8_t want = s.pat[pg] ? (uint8_t)(s.pat[pg] >> (8 * (w % 8))) :
					(uint8_t)(0xa5 ^ pg);

				if (b[w] != want)
					return snprintf(msg, 200, "proc %d pass %d: device page %zu byte %zu",
							id, i, pg, w), 1;
			}
		}
		if (svm_crc(s.fd, p, npages * PG, &crc) || crc != crc32c(0, p, npages * PG))
			return snprintf(msg, 200, "proc %d: device checksum differs", id), 1;
		/* second pass after everything came back to RAM */
		if (cxla_migrate_flags(s.fd, p, npages * PG, false, flags, NULL))
			return snprintf(msg, 200, "proc %d: final migration", id), 1;
	}
	snprintf(msg, 200, "%ld migrations (%ld pages), %ld CPU page writes, %ld device fills, %ld device reads",
		 s.migrations, s.moved, s.cpu_writes, s.dev_fills, s.dev_reads);
	return 0;
}

CXLA_TEST_F(mig, stress)
{
	const int nproc = 3;
	size_t npages = 512, len = npages * PG, pg;
	uint8_t *p = map_anon(len);
	char (*msgs)[200];
	pid_t pids[8];
	int i, status, bad = 0;
	struct cxl_accel_hmm_info h1, h2;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	msgs = mmap(NULL, 8 * 200, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(msgs != MAP_FAILED, "mmap");
	for (pg = 0; pg < npages; pg++)
		memset(p + pg * PG, 0xa5 ^ (int)pg, PG);
	/* the initial pages are shared COW by all processes */
	OK(MIGRATE(c->fd, p, len, true, NULL));
	OK(cxla_hmm_info(c->fd, &h1));
	for (i = 0; i < nproc; i++) {
		pids[i] = fork();
		if (!pids[i])
			_exit(stress_child(c, variant->flags, p, npages, i, msgs[i]));
	}
	for (i = 0; i < nproc; i++) {
		waitpid(pids[i], &status, 0);
		if (!WIFEXITED(status) || WEXITSTATUS(status))
			bad = i + 1;
	}
	CHECK(!bad, "%s (status %#x)", msgs[bad - 1][0] ? msgs[bad - 1] : "crashed", status);
	for (pg = 0; pg < npages; pg++)
		CHECK(p[pg * PG] == (uint8_t)(0xa5 ^ pg) &&
		      p[pg * PG + PG - 1] == (uint8_t)(0xa5 ^ pg),
		      "parent page %zu changed", pg);
	munmap(p, len);
	OK(cxla_hmm_info(c->fd, &h2));
	CHECK(h2.copy_failures == h1.copy_failures, "%llu failed copy commands",
	      (unsigned long long)(h2.copy_failures - h1.copy_failures));
	PRIVATE_IDLE(c->fd);
	DETAIL("%d processes x (%s migrator, CPU writer, device filler/reader) on COW-shared 2 MiB for %d s, data verified twice each; e.g. %s",
	       nproc, PRIVATE ? "private" : "coherent", stress_secs, msgs[0]);
	return PASS;
}

/* --------------------------------------------------- two devices (peer) */

/* pages on device A, read by device B (peer-to-peer through A's BAR) */
CXLA_TEST_F(peer, peer_read)
{
	size_t len = 2 * MiB, n = len / PG;
	uint8_t *p, *b, f[512];
	struct cxl_accel_stats st0, st1;
	struct cxl_accel_migrate m;
	struct cxl_accel_alloc a;

	p = map_anon(len);
	CHECK(p, "mmap");
	fill_pages(p, len, 161);
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "migrate to A");
	OK(snapshot(c->pfd, p, len, f));
	CHECK(count_pages(f, n, CXL_ACCEL_SNAP_REMOTE, CXL_ACCEL_SNAP_LOCAL) == n,
	      "B sees %zu remote pages (%#x)",
	      count_pages(f, n, CXL_ACCEL_SNAP_REMOTE, 0), f[0]);
	OK(alloc_map(c, c->pfd, len, &a, &b));
	OK(cxla_stats(c->pfd, &st0));
	OK(cxla_svm(c->pfd, CXL_ACCEL_SVM_READ, p, len, a.handle, 0, NULL, NULL));
	OK(cxla_stats(c->pfd, &st1));
	CHECK(check_pages(b, len, 161) < 0, "B read other data");
	CHECK(st1.device[CXL_ACCEL_STAT_BYTES_P2P] - st0.device[CXL_ACCEL_STAT_BYTES_P2P] >= len,
	      "B counted %llu peer bytes",
	      (unsigned long long)(st1.device[CXL_ACCEL_STAT_BYTES_P2P] -
				   st0.device[CXL_ACCEL_STAT_BYTES_P2P]));
	OK(cxla_migrate(c->pfd, p, len, false, &m));
	CHECK(m.migrated == n, "B moved A's pages to RAM: %llu", (unsigned long long)m.migrated);
	CHECK(check_pages(p, len, 161) < 0, "data");
	munmap(p, len);
	munmap(b, len);
	POOL_IDLE(c->fd);
	POOL_IDLE(c->pfd);
	DETAIL("B read 2 MiB that live on A's memory peer-to-peer (%llu peer bytes), snapshot on B says remote; B brought them back to RAM",
	       (unsigned long long)(st1.device[CXL_ACCEL_STAT_BYTES_P2P] -
				    st0.device[CXL_ACCEL_STAT_BYTES_P2P]));
	return PASS;
}

/* migration from device A to device B directly */
CXLA_TEST_F(peer, peer_migrate)
{
	size_t len = 4 * MiB, n = len / PG;
	uint8_t *p, f[1024];
	struct cxl_accel_migrate m;
	struct cxl_accel_hmm_info ha, hb;

	p = map_anon(len);
	CHECK(p, "mmap");
	fill_pages(p, len, 171);
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "to A");
	OK(cxla_migrate(c->pfd, p, len, true, &m));
	CHECK(m.migrated == n, "A -> B: %llu moved (already %llu busy %llu)",
	      (unsigned long long)m.migrated, (unsigned long long)m.already,
	      (unsigned long long)m.busy);
	OK(snapshot(c->pfd, p, len, f));
	CHECK(count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, 0) == n, "B: %zu local",
	      count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, 0));
	OK(snapshot(c->fd, p, len, f));
	CHECK(count_pages(f, n, CXL_ACCEL_SNAP_REMOTE, 0) == n, "A: %zu remote",
	      count_pages(f, n, CXL_ACCEL_SNAP_REMOTE, 0));
	CHECK(check_pages(p, len, 171) < 0, "data on B");
	OK(cxla_hmm_info(c->fd, &ha));
	OK(cxla_hmm_info(c->pfd, &hb));
	CHECK(ha.pool_pages_used == 0 && hb.pool_pages_used == n,
	      "pools: A %llu B %llu", (unsigned long long)ha.pool_pages_used,
	      (unsigned long long)hb.pool_pages_used);
	/* and back to A, then RAM */
	OK(cxla_migrate(c->fd, p, len, true, &m));
	CHECK(m.migrated == n, "B -> A");
	OK(cxla_migrate(c->fd, p, len, false, &m));
	CHECK(check_pages(p, len, 171) < 0, "data in RAM");
	munmap(p, len);
	POOL_IDLE(c->fd);
	POOL_IDLE(c->pfd);
	DETAIL("4 MiB RAM -> A -> B -> A -> RAM, device to device copies peer-to-peer; pools follow the pages");
	return PASS;
}

/* the same range mirrored by two devices: both invalidated */
CXLA_TEST_F(peer, two_device_mirrors)
{
	size_t len = 64 * PG;
	uint8_t *p, f[64];
	uint64_t pat = 0x3131313131313131;
	uint32_t ca, cb;

	p = map_anon(len);
	CHECK(p, "mmap");
	fill_random(p, len, 181);
	OK(svm_crc(c->fd, p, len, &ca));
	OK(svm_crc(c->pfd, p, len, &cb));
	CHECK(ca == cb && ca == crc32c(0, p, len), "crcs %#x %#x", ca, cb);
	OK(snapshot(c->fd, p, len, f));
	CHECK(count_pages(f, 64, CXL_ACCEL_SNAP_MIRRORED, 0) == 64, "A mirror");
	OK(snapshot(c->pfd, p, len, f));
	CHECK(count_pages(f, 64, CXL_ACCEL_SNAP_MIRRORED, 0) == 64, "B mirror");
	/* A writes through its mirror... */
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, p, len, 0, 0, &pat, NULL));
	/* ...B reads the new data through its own */
	OK(svm_crc(c->pfd, p, len, &cb));
	CHECK(cb == crc32c(0, p, len) && p[0] == 0x31, "B after A's write");
	/* migration to A invalidates both mirrors */
	OK(cxla_migrate(c->fd, p, len, true, NULL));
	OK(snapshot(c->pfd, p, len, f));
	CHECK(count_pages(f, 64, 0, CXL_ACCEL_SNAP_MIRRORED) == 64 &&
	      count_pages(f, 64, CXL_ACCEL_SNAP_REMOTE, 0) == 64,
	      "B after migration to A: %#x", f[0]);
	OK(svm_crc(c->pfd, p, len, &cb));
	CHECK(cb == crc32c(0, p, len), "B reads migrated pages");
	munmap(p, len);
	OK(snapshot(c->fd, p, len, f) == 0 ? 0 : -1);
	CHECK(count_pages(f, 64, 0, CXL_ACCEL_SNAP_MIRRORED) == 64, "A mirror after munmap");
	POOL_IDLE(c->fd);
	POOL_IDLE(c->pfd);
	DETAIL("one range mirrored by both devices: A's device write seen by B, migration and munmap invalidate both mirrors");
	return PASS;
}

/* ------------------------------------------------- removal helpers */

static bool wait_file(const char *name, int secs)
{
	int i;

	for (i = 0; i < secs * 10; i++) {
		if (!access(name, F_OK))
			return true;
		usleep(100000);
	}
	return false;
}

/*
 * --hold-migrated DEV [--close]: move 8 MiB of this process to DEV's memory
 * (and write some of it there), say "HOLD READY", and wait until the file
 * /tmp/hmm-go exists: the script unbinds the device (or, with --close,
 * after closing our file, unloads the module) meanwhile. Then the data
 * must be intact and writable, and the pages no longer on the device.
 */
static int hold_migrated(const char *path, bool close_fd)
{
	size_t len = 8 * MiB, n = len / PG;
	uint8_t *p = map_anon(len), f[2048];
	struct cxl_accel_migrate m;
	struct cxl_accel_hmm_info h;
	int fd = open(path, O_RDWR), r;
	long bad;

	if (fd < 0 || !p) {
		printf("HOLD setup failed\n");
		return 1;
	}
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 191);
	r = cxla_migrate(fd, p, len, true, &m);
	if (r || m.migrated != n) {
		printf("HOLD migrate: %d, %llu pages\n", r, (unsigned long long)m.migrated);
		return 1;
	}
	fill_pages(p, len / 2, 192);	/* CPU writes on device memory */
	if (close_fd)
		close(fd);
	printf("HOLD READY %zu pages on %s%s\n", n, path,
	       close_fd ? ", file closed" : "");
	fflush(stdout);
	if (!close_fd) {
		/* unbind: our file stays, its ioctls fail */
		for (r = 0; r < 600 && !cxla_hmm_info(fd, &h); r++)
			usleep(100000);
		printf("HOLD ioctl after removal: %s\n", strerror(-cxla_hmm_info(fd, &h)));
		fflush(stdout);
		close(fd);	/* frees the minor for the rebind */
	}
	if (!wait_file("/tmp/hmm-go", 120)) {
		printf("HOLD DONE bad: no go\n");
		return 1;
	}
	bad = check_pages(p, len / 2, 192);
	if (bad < 0)
		bad = check_pages_at(p + len / 2, n / 2, len / 2, 191);
	if (bad >= 0) {
		printf("HOLD DONE bad: data differs after removal\n");
		return 1;
	}
	fill_pages(p, len, 193);	/* still writable */
	if (check_pages(p, len, 193) >= 0) {
		printf("HOLD DONE bad: rewrite\n");
		return 1;
	}
	/* the device is back (rebind or reload): none of it is on its memory */
	fd = open(path, O_RDWR);
	if (fd >= 0 && !snapshot(fd, p, len, f) &&
	    count_pages(f, n, CXL_ACCEL_SNAP_LOCAL | CXL_ACCEL_SNAP_REMOTE, 0)) {
		printf("HOLD DONE bad: pages on device memory after removal\n");
		return 1;
	}
	printf("HOLD DONE ok: %zu pages intact in system RAM\n", n);
	return 0;
}

/*
 * --hold-spliced DEV [SECS [zeros]]: a child moves 16 pages to DEV's memory,
 * vmsplice()s them into our pipe and exits, so that only the pipe holds
 * them; say "SPLICE READY" and wait until /tmp/splice-go exists (or SECS
 * have passed), while the script unbinds the device or unloads the module.
 * Then the pipe must still deliver the data, or with "zeros" (an unbind in
 * shared-memory attach: the device reset took the memory away) exactly
 * zeros; closing it releases the pages.
 */
static int hold_spliced(const char *path, int secs, bool zeros)
{
	size_t n = 16, len = n * PG;
	int fd = open(path, O_RDWR), pipefd[2], status;
	uint8_t *buf = malloc(len);
	pid_t pid;

	if (fd < 0 || !buf || pipe(pipefd)) {
		printf("SPLICE setup failed\n");
		return 1;
	}
	pid = fork();
	if (!pid) {
		struct cxl_accel_migrate m;
		uint8_t *p = map_anon(len);
		struct iovec iov = { p, len };

		if (!p)
			_exit(1);
		fill_pages(p, len, 201);
		if (cxla_migrate(fd, p, len, true, &m) || m.migrated != n)
			_exit(2);
		_exit(vmsplice(pipefd[1], &iov, 1, 0) == (ssize_t)len ? 0 : 3);
	}
	waitpid(pid, &status, 0);
	close(fd);
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		printf("SPLICE child failed: %d\n", WEXITSTATUS(status));
		return 1;
	}
	printf("SPLICE READY %zu device pages held by a pipe only\n", n);
	fflush(stdout);
	if (!wait_file("/tmp/splice-go", secs))
		printf("SPLICE releasing after %d s\n", secs);
	if (read(pipefd[0], buf, len) != (ssize_t)len) {
		printf("SPLICE DONE bad: the pipe did not deliver %zu bytes\n", len);
		return 1;
	}
	if (zeros) {
		size_t i;

		for (i = 0; i < len && !buf[i]; i++)
			;
		if (i < len) {
			printf("SPLICE DONE bad: byte %zu is %#x, not the zero of memory the reset took away\n",
			       i, buf[i]);
			return 1;
		}
	} else if (check_pages(buf, len, 201) >= 0) {
		printf("SPLICE DONE bad: the pipe lost the data\n");
		return 1;
	}
	close(pipefd[0]);
	close(pipefd[1]);
	printf("SPLICE DONE ok: the pipe delivered %s\n",
	       zeros ? "zeros (the device reset took shared memory away)" :
		       "the data");
	return 0;
}

/* -------------------------------------------- NUMA attach mode */

#define MPOL_BIND	2

static int node_of(void *p)
{
	int status = -1;

	if (syscall(__NR_move_pages, 0, 1, &p, NULL, &status, 0))
		return -errno;
	return status;
}

static long pages_on(void *p, size_t len, int node)
{
	size_t i;
	long k = 0;

	for (i = 0; i < len / PG; i++)
		k += node_of((uint8_t *)p + i * PG) == node;
	return k;
}

CXLA_TEST_F(numa, numa_info)
{
	struct cxl_accel_hmm_info *h = &c->h0;
	struct cxl_accel_alloc a;
	char path[128], buf[256];
	int node = h->numa_node;

	CHECK(h->flags & CXL_ACCEL_HMM_NUMA, "flags %#x", h->flags);
	CHECK(c->id.features & CXL_ACCEL_F_NUMA, "features %#llx",
	      (unsigned long long)c->id.features);
	CHECK(node >= 0 && c->id.numa_node == node, "node %d, IDENTIFY %d", node,
	      c->id.numa_node);
	CHECK(h->mem_start == c->id.devmem_gpa && h->mem_size == c->id.devmem_size,
	      "memory range");
	snprintf(path, sizeof(path), "/sys/class/cxl-accel/cxl-accel%u/numa_node",
		 c->id.minor);
	OK(read_sys(path, buf, sizeof(buf)));
	CHECK(atoi(buf) == node, "sysfs numa_node %s", buf);
	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", node);
	OK(read_sys(path, buf, sizeof(buf)));
	CHECK(!buf[0], "node %d has CPUs %s", node, buf);
	EXPECT_ERR(cxla_alloc(c->fd, 4096, 0, &a), EOPNOTSUPP);
	{
		uint8_t *p = map_anon(PG);

		CHECK(p, "mmap");
		p[0] = 1;
		EXPECT_ERR(cxla_migrate(c->fd, p, PG, true, NULL), EOPNOTSUPP);
	}
	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/meminfo", node);
	{
		FILE *f = fopen(path, "r");
		unsigned long kb = 0;

		while (f && fgets(buf, sizeof(buf), f))
			if (strstr(buf, "MemTotal:"))
				sscanf(strstr(buf, "MemTotal:") + 9, "%lu", &kb);
		if (f)
			fclose(f);
		DETAIL("device memory %#llx + %llu MiB is CPU-less NUMA node %d (MemTotal %lu KiB); ALLOC and MIGRATE_TO_DEV -EOPNOTSUPP",
		       (unsigned long long)h->mem_start,
		       (unsigned long long)(h->mem_size >> 20), node, kb);
	}
	return PASS;
}

CXLA_TEST_F(numa, numa_move_pages)
{
	size_t len = 8 * MiB, n = len / PG, i;
	uint8_t *p = map_anon(len), f[2048];
	struct cxl_accel_checksum ck = { 0 };
	struct cxl_accel_fill fl = { 0 };
	int node = c->h0.numa_node;
	uint32_t crc;
	long bad;

	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 201);
	bad = cxla_move_pages(p, len, node);
	CHECK(!bad, "move_pages to node %d: %ld pages elsewhere", node, bad);
	CHECK(pages_on(p, len, node) == (long)n, "pages on node %d: %ld", node,
	      pages_on(p, len, node));
	OK(snapshot(c->fd, p, len, f));
	CHECK(count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, 0) == n,
	      "snapshot: %zu of %zu local", count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, 0), n);
	CHECK(check_pages(p, len, 201) < 0, "data after move_pages");
	/* the device computes on them: pinned user memory, then SVM */
	ck.src = cxla_user(p);
	ck.len = len;
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_CHECKSUM, &ck));
	CHECK(ck.crc == crc32c(0, p, len), "device crc %#x, CPU %#x", ck.crc,
	      crc32c(0, p, len));
	OK(svm_crc(c->fd, p, len, &crc));
	CHECK(crc == ck.crc, "SVM crc %#x", crc);
	fl.dst = cxla_user(p + PG);
	fl.len = 2 * PG;
	fl.pattern = 0x2222222222222222;
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_FILL, &fl));
	for (i = PG; i < 3 * PG; i++)
		CHECK(p[i] == 0x22, "device fill byte %zu", i);
	CHECK(node_of(p + PG) == node, "filled page left the node");
	bad = cxla_move_pages(p, len, 0);
	CHECK(!bad, "back to node 0: %ld pages elsewhere", bad);
	OK(snapshot(c->fd, p, len, f));
	CHECK(count_pages(f, n, 0, CXL_ACCEL_SNAP_LOCAL) == n, "pages still local");
	CHECK(check_pages(p, PG, 201) < 0 && check_pages_at(p + 3 * PG, 3, len - 3 * PG, 201) < 0,
	      "data after the way back");
	munmap(p, len);
	DETAIL("8 MiB moved to node %d with move_pages(), device checksum (pinned and SVM) %#x, device fill on node memory, moved back",
	       node, ck.crc);
	return PASS;
}

CXLA_TEST_F(numa, numa_mbind)
{
	size_t len = 4 * MiB, n = len / PG;
	uint8_t *p = map_anon(len);
	int node = c->h0.numa_node;
	unsigned long mask[2] = { 1UL << node, 0 };
	uint64_t pat = 0x0f0e0d0c0b0a0908ULL;
	uint32_t crc;
	size_t i;

	CHECK(p, "mmap");
	CHECK(node < 64, "node %d", node);
	if (syscall(__NR_mbind, p, len, MPOL_BIND, mask, 65, 0))
		FAILF("mbind: %s", strerror(errno));
	/* the device writes first: faulted in on the node by the policy */
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, p, len, 0, 0, &pat, NULL));
	CHECK(pages_on(p, len, node) == (long)n, "%ld of %zu pages on node %d",
	      pages_on(p, len, node), n, node);
	for (i = 0; i < len; i++)
		CHECK(p[i] == (uint8_t)(pat >> (8 * (i % 8))), "byte %zu", i);
	fill_random(p, len, 211);
	OK(svm_crc(c->fd, p, len, &crc));
	CHECK(crc == crc32c(0, p, len), "crc");
	munmap(p, len);
	DETAIL("mbind(MPOL_BIND, node %d): the device's writes faulted all %zu pages in on the node; device crc of CPU data right",
	       node, n);
	return PASS;
}

/* pages on device A's node, read and filled by device B */
CXLA_TEST_F(numa_peer, numa_peer)
{
	size_t len = 2 * MiB, n = len / PG;
	uint8_t *p, f[512];
	struct cxl_accel_hmm_info hb;
	uint32_t crc;

	OK(cxla_hmm_info(c->pfd, &hb));
	CHECK(hb.flags & CXL_ACCEL_HMM_NUMA, "peer not in NUMA mode");
	p = map_anon(len);
	CHECK(p, "mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	fill_pages(p, len, 221);
	CHECK(!cxla_move_pages(p, len, c->h0.numa_node), "move_pages");
	OK(snapshot(c->pfd, p, len, f));
	CHECK(count_pages(f, n, CXL_ACCEL_SNAP_REMOTE, CXL_ACCEL_SNAP_LOCAL) == n,
	      "B sees %zu remote", count_pages(f, n, CXL_ACCEL_SNAP_REMOTE, 0));
	OK(svm_crc(c->pfd, p, len, &crc));
	CHECK(crc == crc32c(0, p, len), "B crc");
	CHECK(!cxla_move_pages(p, len, hb.numa_node), "A's node -> B's node");
	OK(snapshot(c->pfd, p, len, f));
	CHECK(count_pages(f, n, CXL_ACCEL_SNAP_LOCAL, 0) == n, "B local");
	CHECK(check_pages(p, len, 221) < 0, "data");
	munmap(p, len);
	DETAIL("pages on node %d (A) read by B, moved to node %d (B) with move_pages()",
	       c->h0.numa_node, hb.numa_node);
	return PASS;
}

/*
 * --stall SECS DEV: migrations and device accesses (500 ms timeouts) in a
 * loop for SECS seconds while the host stops and resumes the daemon
 * (tests/guest/host/run-hmm-stall.sh). The data must be right after every
 * call, whether it failed or not; afterwards everything must work again,
 * the quarantine drain and the pool give back every page.
 */
static int hmm_stall(int secs, const char *path)
{
	size_t len = 1 * MiB;
	uint8_t *p = map_anon(len);
	int fd = open(path, O_RDWR), r, k = 0, last = 1, timeouts = 0, ok_after = 0;
	struct cxl_accel_stats st;
	struct cxl_accel_hmm_info h;
	double t0 = now_sec(), t;
	char detail[DETAIL_LEN + 1];
	FIXTURE_DATA(dev) cc = { 0 }, *c = &cc;

	cxla_detail = detail;
	if (fd < 0 || !p)
		return 1;
	madvise(p, len, MADV_NOHUGEPAGE);
	while ((t = now_sec() - t0) < secs) {
		struct cxl_accel_migrate m = { .addr = (uintptr_t)p, .len = len,
					       .timeout_ms = 500 };
		struct cxl_accel_svm sv = { .addr = (uintptr_t)p, .len = len,
					    .op = CXL_ACCEL_SVM_CHECKSUM,
					    .timeout_ms = 500 };
		int r2, r3;

		fill_pages(p, len, ++k);
		r = cxla_ioctl(fd, CXL_ACCEL_IOC_MIGRATE_TO_DEV, &m);
		if (check_pages(p, len, k) >= 0) {
			printf("RESULT hmm_stall_recovery FAIL data differs after a migration (%d)\n", r);
			return 1;
		}
		r2 = cxla_ioctl(fd, CXL_ACCEL_IOC_SVM, &sv);
		if (!r2 && (uint32_t)sv.value != crc32c(0, p, len)) {
			printf("RESULT hmm_stall_recovery FAIL device crc differs\n");
			return 1;
		}
		m.migrated = 0;
		r3 = cxla_ioctl(fd, CXL_ACCEL_IOC_MIGRATE_TO_RAM, &m);
		if (check_pages(p, len, k) >= 0) {
			printf("RESULT hmm_stall_recovery FAIL data differs after the way back (%d)\n", r3);
			return 1;
		}
		r = r ?: r2 ?: r3;
		if (r != last) {
			printf("HMM-STALL %6.2f s: %s\n", t, r ? strerror(-r) : "ok");
			fflush(stdout);
			last = r;
		}
		if (r == -ETIMEDOUT)
			timeouts++;
		else if (!r && timeouts)
			ok_after++;
		else if (r) {
			printf("RESULT hmm_stall_recovery FAIL %s\n", strerror(-r));
			return 1;
		}
		usleep(50000);
	}
	/* whatever is still on the device comes back now */
	for (r = 0; r < 100; r++) {
		struct cxl_accel_migrate m;

		if (!cxla_migrate(fd, p, len, false, &m) && local_pages(fd, p, len) == 0)
			break;
		usleep(100000);
	}
	munmap(p, len);
	for (r = 0; r < 100; r++) {
		if (cxla_stats(fd, &st) || !st.driver[CXL_ACCEL_DSTAT_QUARANTINED])
			break;
		usleep(100000);
	}
	detail[0] = 0;
	r = pool_idle(c, fd);
	cxla_hmm_info(fd, &h);
	printf("RESULT hmm_stall_recovery %s %d rounds timed out while the daemon was stopped, %d ok after; data right every time; quarantine %llu, %llu copy commands failed; pool %s\n",
	       timeouts && ok_after && !r && !st.driver[CXL_ACCEL_DSTAT_QUARANTINED] ?
	       "PASS" : "FAIL", timeouts, ok_after,
	       (unsigned long long)st.driver[CXL_ACCEL_DSTAT_QUARANTINED],
	       (unsigned long long)h.copy_failures, r ? detail : "empty");
	close(fd);
	return 0;
}

/* ------------------------------------------------------------- soak */

/*
 * --soak SECS DEV PEER: migration under daemon restarts (tests/guest/
 * run-soak.sh kills the device workers meanwhile). SOAK_PROCS processes,
 * each with a region of anonymous memory and a copy of what it must hold
 * (in system RAM, never migrated), repeat random steps for SECS seconds:
 * migrations to either device (from RAM or from the other device) and back
 * to RAM through either device, CPU writes, device reads (checksum, READ
 * into a device buffer), device writes (FILL, WRITE from a device buffer)
 * on either device, the odd EVICT. Every step may fail with -EIO (a command
 * in flight when a worker died: counted), nothing else. After every step
 * the whole region is compared with its copy. A device write that failed
 * may have written part of its range: each byte must then be the old or
 * the new value, and the copy takes what is there. At the end everything
 * goes back to RAM and both migration pools must be empty.
 */
#define SOAK_PROCS	2

enum {
	SK_TO_DEV, SK_TO_RAM, SK_CPU_WRITE, SK_SVM_CRC, SK_SVM_READ,
	SK_SVM_FILL, SK_SVM_WRITE, SK_EVICT, SK_NOPS
};

static const char * const soak_op_names[SK_NOPS] = {
	"to-dev", "to-ram", "cpu-write", "svm-crc", "svm-read", "svm-fill",
	"svm-write", "evict",
};

struct soak_stats {		/* one per process, shared with the parent */
	long ops[SK_NOPS];
	long eio[SK_NOPS];
	long moved;		/* pages migrated */
	long alloc_eio;		/* ALLOCs of the device buffers */
	long partial;		/* failed device writes that had written part */
	long local_checks;	/* snapshots that agreed with a migration */
	unsigned long long verified;	/* bytes compared */
	char fail[300];
};

struct soak {
	int fd[2];
	uint8_t *p;		/* the region */
	uint8_t *ref;		/* what it must hold */
	size_t len, npages;
	struct cxl_accel_alloc buf[2];	/* one device buffer per device */
	uint8_t *bmap[2];
	uint64_t rnd;
	struct soak_stats *st;
};

#define SOAK_FAIL(s, ...) \
	(snprintf((s)->st->fail, sizeof((s)->st->fail), __VA_ARGS__), -1)

/* The region must equal ref; a difference is described in st->fail. */
static int soak_verify(struct soak *s, const char *what)
{
	size_t i;
	uint8_t f = 0;

	s->st->verified += s->len;
	if (!memcmp(s->p, s->ref, s->len))
		return 0;
	for (i = 0; i < s->len && s->p[i] == s->ref[i]; i++)
		;
	snapshot(s->fd[0], s->p + i / PG * PG, PG, &f);
	return SOAK_FAIL(s, "after %s: byte %zu (page %zu) is %#x, expected %#x (snapshot on dev0 %#x)",
			 what, i, i / PG, s->p[i], s->ref[i], f);
}

/*
 * A device write of [off, off + len) failed: each byte must be the old
 * value (ref) or the new one (want); ref takes what is there.
 */
static int soak_adopt(struct soak *s, size_t off, size_t len,
		      const uint8_t *want, const char *what)
{
	size_t i;
	bool part = false;

	for (i = 0; i < len; i++) {
		uint8_t v = s->p[off + i];

		if (v == s->ref[off + i])
			continue;
		if (v != want[i])
			return SOAK_FAIL(s, "%s failed: byte %zu is %#x, neither old %#x nor new %#x",
					 what, off + i, v, s->ref[off + i], want[i]);
		s->ref[off + i] = v;
		part = true;
	}
	s->st->partial += part;
	return 0;
}

static int soak_step(struct soak *s, int op, int d, size_t off, size_t len,
		     uint8_t *tmp)
{
	int fd = s->fd[d], r = 0;
	uint64_t pat = rnd64(&s->rnd) | 1;
	struct cxl_accel_migrate m;
	struct cxl_accel_evict ev;
	uint32_t crc;
	size_t i;
	long local;

	switch (op) {
	case SK_TO_DEV:
	case SK_TO_RAM:
		/* whole pages */
		off &= ~(PG - 1);
		len = (len + PG - 1) & ~(PG - 1);
		if (off + len > s->len)
			len = s->len - off;
		r = cxla_migrate(fd, s->p + off, len, op == SK_TO_DEV, &m);
		if (!r) {
			s->st->moved += m.migrated;
			/*
			 * Where the pages are agrees with the report (one
			 * thread per region; an EVICT elsewhere only takes
			 * pages off a device).
			 */
			local = local_pages(fd, s->p + off, len);
			if (local < 0 ||
			    local > (long)(op == SK_TO_DEV ?
					   m.migrated + m.already + m.busy :
					   m.already + m.busy))
				return SOAK_FAIL(s, "%s of %zu pages through dev%d: %llu moved, %llu already, %llu busy, but %ld on dev%d",
						 soak_op_names[op], len / PG, d,
						 (unsigned long long)m.migrated,
						 (unsigned long long)m.already,
						 (unsigned long long)m.busy, local, d);
			s->st->local_checks++;
		}
		break;
	case SK_CPU_WRITE:
		fill_random(s->ref + off, len, pat);
		memcpy(s->p + off, s->ref + off, len);
		break;
	case SK_SVM_CRC:
		r = svm_crc(fd, s->p + off, len, &crc);
		if (!r && crc != crc32c(0, s->ref + off, len))
			return SOAK_FAIL(s, "dev%d checksum of %zu bytes at %zu: %#x, expected %#x",
					 d, len, off, crc, crc32c(0, s->ref + off, len));
		s->st->verified += r ? 0 : len;
		break;
	case SK_SVM_READ:
		memset(s->bmap[d], 0x5a, len);
		r = cxla_svm(fd, CXL_ACCEL_SVM_READ, s->p + off, len, s->buf[d].handle,
			     0, NULL, NULL);
		if (!r && memcmp(s->bmap[d], s->ref + off, len)) {
			for (i = 0; s->bmap[d][i] == s->ref[off + i]; i++)
				;
			return SOAK_FAIL(s, "dev%d read %zu bytes at %zu: byte %zu differs",
					 d, len, off, i);
		}
		s->st->verified += r ? 0 : len;
		break;
	case SK_SVM_FILL:
	case SK_SVM_WRITE:
		if (op == SK_SVM_FILL) {
			for (i = 0; i < len; i++)
				tmp[i] = (uint8_t)(pat >> (8 * (i % 8)));
			r = cxla_svm(fd, CXL_ACCEL_SVM_FILL, s->p + off, len, 0, 0, &pat,
				     NULL);
		} else {
			fill_random(s->bmap[d], len, pat);
			memcpy(tmp, s->bmap[d], len);
			r = cxla_svm(fd, CXL_ACCEL_SVM_WRITE, s->p + off, len,
				     s->buf[d].handle, 0, NULL, NULL);
		}
		if (!r)
			memcpy(s->ref + off, tmp, len);
		else if (r == -EIO &&
			 soak_adopt(s, off, len, tmp, soak_op_names[op]))
			return -1;
		break;
	case SK_EVICT:
		memset(&ev, 0, sizeof(ev));
		r = evict(fd, &ev);
		break;
	}
	s->st->ops[op]++;
	if (r == -EIO) {
		s->st->eio[op]++;
	} else if (r) {
		return SOAK_FAIL(s, "%s on dev%d (%zu bytes at %zu): %s",
				 soak_op_names[op], d, len, off, strerror(-r));
	}
	return soak_verify(s, soak_op_names[op]);
}

/* One process: its region, random steps until the time is up. */
static int soak_proc(int id, int secs, const char *path, const char *peer,
		     struct soak_stats *st)
{
	static const int weight[SK_NOPS] = { 30, 20, 10, 10, 8, 8, 6, 1 };
	struct soak s = { .st = st, .rnd = 0x50a4ULL * (id + 1) + (uint64_t)time(NULL) };
	double t0 = now_sec();
	uint8_t *tmp;
	int d, k, tries, total = 0;

	/* process 0: 1 MiB of small pages; 1: 4 MiB that may start as THPs */
	s.len = id ? 4 * MiB : 1 * MiB;
	s.npages = s.len / PG;
	s.p = map_aligned(s.len, 2 * MiB);
	s.ref = malloc(s.len);
	tmp = malloc(s.len);
	s.fd[0] = open(path, O_RDWR);
	s.fd[1] = open(peer, O_RDWR);
	if (!s.p || !s.ref || !tmp || s.fd[0] < 0 || s.fd[1] < 0)
		return SOAK_FAIL(&s, "set-up: %s", strerror(errno));
	madvise(s.p, s.len, id ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	for (d = 0; d < 2; d++) {
		/* ALLOC may be interrupted too */
		for (tries = 0; (k = alloc_map(NULL, s.fd[d], s.len, &s.buf[d],
					       &s.bmap[d])) == -EIO && tries < 5; tries++)
			st->alloc_eio++;
		if (k)
			return SOAK_FAIL(&s, "buffer on dev%d: %s", d, strerror(-k));
	}
	fill_random(s.ref, s.len, s.rnd);
	memcpy(s.p, s.ref, s.len);
	for (k = 0; k < SK_NOPS; k++)
		total += weight[k];

	while (now_sec() - t0 < secs) {
		int pick = (int)(rnd64(&s.rnd) % total), op = 0;
		size_t off, len;

		while (pick >= weight[op])
			pick -= weight[op++];
		/* a random piece, now and then all of it */
		if (rnd64(&s.rnd) % 8 == 0) {
			off = 0;
			len = s.len;
		} else {
			off = rnd64(&s.rnd) % s.len;
			len = 1 + rnd64(&s.rnd) % (s.len - off);
		}
		if (soak_step(&s, op, (int)(rnd64(&s.rnd) & 1), off, len, tmp))
			return -1;
	}
	/* everything back to RAM (through either device), intact */
	for (tries = 0; tries < 10; tries++) {
		d = tries & 1;
		k = cxla_migrate(s.fd[d], s.p, s.len, false, NULL);
		if (k && k != -EIO)
			return SOAK_FAIL(&s, "final migration to RAM: %s", strerror(-k));
		if (!k && local_pages(s.fd[0], s.p, s.len) == 0 &&
		    local_pages(s.fd[1], s.p, s.len) == 0)
			break;
	}
	if (tries == 10)
		return SOAK_FAIL(&s, "pages stay on device memory after 10 migrations to RAM");
	if (soak_verify(&s, "the final migration to RAM"))
		return -1;
	munmap(s.p, s.len);
	for (d = 0; d < 2; d++) {
		munmap(s.bmap[d], s.len);
		cxla_free(s.fd[d], s.buf[d].handle);
		close(s.fd[d]);
	}
	return 0;
}

struct soak_run {
	int secs;
	const char *path, *peer;
	struct soak_stats *st;
};

static int soak_child(int i, void *arg)
{
	struct soak_run *r = arg;

	return soak_proc(i, r->secs, r->path, r->peer, &r->st[i]);
}

static void soak_progress(void *arg, double t)
{
	struct soak_stats *st = arg;
	long ops = 0, eio = 0;
	int i, k;

	for (i = 0; i < SOAK_PROCS; i++)
		for (k = 0; k < SK_NOPS; k++) {
			ops += st[i].ops[k];
			eio += st[i].eio[k];
		}
	printf("# soak_migrate %.0f s: %ld steps, %ld -EIO\n", t, ops, eio);
	fflush(stdout);
}

static int hmm_soak(int secs, const char *path, const char *peer)
{
	struct soak_stats *st = mmap(NULL, SOAK_PROCS * sizeof(*st),
				     PROT_READ | PROT_WRITE,
				     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	long ops = 0, eio = 0, moved = 0, partial = 0, op[SK_NOPS] = { 0 },
	     eop[SK_NOPS] = { 0 }, eop_alloc = 0, placed = 0;
	unsigned long long verified = 0;
	char detail[DETAIL_LEN + 1] = "", why[400] = "", eios[200] = "";
	FIXTURE_DATA(dev) cc = { 0 }, *c = &cc;
	struct cxl_accel_stats sts;
	struct soak_run run = { .secs = secs, .path = path, .peer = peer, .st = st };
	int i, k, status = 0, fds[2];
	size_t el = 0;

	cxla_detail = detail;
	fds[0] = open(path, O_RDWR);
	fds[1] = open(peer, O_RDWR);
	if (st == MAP_FAILED || fds[0] < 0 || fds[1] < 0) {
		printf("RESULT soak_migrate FAIL set-up: %s\n", strerror(errno));
		return 1;
	}
	memset(st, 0, SOAK_PROCS * sizeof(*st));
	i = cxla_soak_procs(SOAK_PROCS, secs, soak_child, &run, soak_progress, st,
			    &status);
	if (i >= 0)
		snprintf(why, sizeof(why), "process %d: %s", i,
			 st[i].fail[0] ? st[i].fail :
			 WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) :
			 "failed");
	ops = eio = 0;
	for (i = 0; i < SOAK_PROCS; i++) {
		for (k = 0; k < SK_NOPS; k++) {
			op[k] += st[i].ops[k];
			eop[k] += st[i].eio[k];
			ops += st[i].ops[k];
			eio += st[i].eio[k];
		}
		moved += st[i].moved;
		partial += st[i].partial;
		eop_alloc += st[i].alloc_eio;
		placed += st[i].local_checks;
		verified += st[i].verified;
	}
	for (k = 0; k < SK_NOPS; k++)
		if (eop[k])
			el += snprintf(eios + el, sizeof(eios) - el, "%s%s %ld",
				       el ? ", " : "", soak_op_names[k], eop[k]);
	if (eop_alloc)
		el += snprintf(eios + el, sizeof(eios) - el, "%salloc %ld",
			       el ? ", " : "", eop_alloc);
	eio += eop_alloc;
	/* every page came back: no leaked page reference, no chunk kept */
	for (i = 0; i < 2 && !why[0]; i++) {
		if (pool_idle(c, fds[i]))
			snprintf(why, sizeof(why), "dev%d: %s", i, detail);
		else if (cxla_stats(fds[i], &sts) ||
			 sts.driver[CXL_ACCEL_DSTAT_TIMEOUTS] ||
			 sts.driver[CXL_ACCEL_DSTAT_QUARANTINED])
			snprintf(why, sizeof(why), "dev%d: %llu timeouts, %llu quarantined",
				 i, (unsigned long long)sts.driver[CXL_ACCEL_DSTAT_TIMEOUTS],
				 (unsigned long long)sts.driver[CXL_ACCEL_DSTAT_QUARANTINED]);
	}
	if (!why[0] && (!op[SK_TO_DEV] || !moved))
		snprintf(why, sizeof(why), "no page was migrated");
	if (!why[0] && !eio)
		snprintf(why, sizeof(why), "no step was interrupted: were there kills?");
	printf("RESULT soak_migrate %s %d processes x %d s: %ld steps (%ld migrations moving %ld pages, placement checked %ld times, %ld device reads, %ld device writes, %ld CPU writes, %ld evictions), %ld -EIO (%s; %ld failed device writes had written part), %.1f MB verified; pools empty%s%s\n",
	       why[0] ? "FAIL" : "PASS", SOAK_PROCS, secs, ops,
	       op[SK_TO_DEV] + op[SK_TO_RAM], moved, placed,
	       op[SK_SVM_CRC] + op[SK_SVM_READ], op[SK_SVM_FILL] + op[SK_SVM_WRITE],
	       op[SK_CPU_WRITE], op[SK_EVICT], eio, el ? eios : "none", partial,
	       verified / 1e6, why[0] ? "; " : "", why);
	return why[0] ? 1 : 0;
}

/* ------------------------------------------- device-private memory */


/* the device writes private pages in place; the CPU sees it after a fault */
CXLA_TEST_F(dev, private_svm_write)
{
	size_t len = 32 * PG, n = len / PG, i;
	uint64_t v = 0x1122334455667788ULL;
	struct cxl_accel_migrate m;
	uint8_t *p = map_anon(len);

	NEED_PRIVATE();
	CHECK(p, "mmap");
	fill_pages(p, len, 306);
	OK(cxla_migrate_flags(c->fd, p, len, true, PRIV, &m));
	CHECK(m.migrated == n, "migrated %llu", (unsigned long long)m.migrated);
	OK(cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, p, len, 0, 0, &v, NULL));
	CHECK(private_pages(c->fd, p, len) == (long)n, "the device write moved pages");
	for (i = 0; i < len; i += 8)
		CHECK(*(uint64_t *)(p + i) == v, "byte %zu not filled", i);
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("device filled 32 private pages in place (no fault back), the CPU read the fill after faulting them back");
	return PASS;
}

/* The driver's private_thp parameter: set it (when v >= 0); returns its value or -1. */
static int private_thp(int v)
{
	const char *path = "/sys/module/cxl_accel/parameters/private_thp";
	char buf[8] = "";
	FILE *f;

	if (v >= 0) {
		f = fopen(path, "w");
		if (!f)
			return -1;
		fputs(v ? "1" : "0", f);
		fclose(f);
	}
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return buf[0] == 'Y' || buf[0] == '1';
}

/*
 * private_thp is one parameter of the module while the suite runs the table
 * on every device at once: whoever changes it holds this lock until it has
 * set it back, so another device's test never migrates under the wrong value.
 */
static int private_thp_lock(void)
{
	int fd = open("/tmp/cxla-private-thp.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);

	if (fd >= 0 && flock(fd, LOCK_EX)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/*
 * 2 MiB of THP to private memory: whole (a device-private PMD, SNAPSHOT
 * says HUGE) or, with private_thp off, split by the kernel into 512 pages.
 * A CPU access brings back what the device holds the way it was moved.
 */
static int private_thp_run(FIXTURE_DATA(dev) *c, bool whole)
{
	size_t len = 4 * MiB, n = len / PG, huge, back;
	uint8_t *p = map_aligned(len, 2 * MiB), f[1024];
	struct cxl_accel_hmm_info h0, h1;
	struct cxl_accel_migrate m;
	uint32_t crc = 0, want;
	int ret = FAIL, lock;

	NEED_PRIVATE();
	if (private_thp(-1) < 0) {
		DETAIL("the kernel has no device-private huge pages (7.x has them)");
		return SKIP;
	}
	CHECK(p, "mmap");
	if (madvise(p, len, MADV_HUGEPAGE))
		FAILF("MADV_HUGEPAGE: %s", strerror(errno));
	fill_pages(p, len, 311);
	want = crc32c(0, p, len);
	OK(snapshot(c->fd, p, len, f));
	huge = count_pages(f, n, CXL_ACCEL_SNAP_HUGE | CXL_ACCEL_SNAP_WRITE, 0);
	if (huge != n) {
		DETAIL("%zu of %zu pages PMD-mapped (transparent_hugepage: %s)",
		       huge, n, thp_mode());
		munmap(p, len);
		return SKIP;
	}
	lock = private_thp_lock();
	CHECK(lock >= 0, "lock for private_thp: %s", strerror(errno));
	if (private_thp(whole) != whole) {
		DETAIL("cannot set private_thp");
		goto out;
	}
	if (cxla_migrate_flags(c->fd, p, len, true, PRIV, &m)) {
		DETAIL("MIGRATE_TO_DEV: %s", strerror(errno));
		goto out;
	}
	if (m.migrated != n) {
		DETAIL("migrated %llu of %zu (busy %llu, no space %llu)",
		       (unsigned long long)m.migrated, n,
		       (unsigned long long)m.busy,
		       (unsigned long long)m.no_space);
		goto out;
	}
	if (snapshot(c->fd, p, len, f))
		goto out;
	huge = count_pages(f, n, CXL_ACCEL_SNAP_LOCAL | CXL_ACCEL_SNAP_HUGE,
			   CXL_ACCEL_SNAP_PRESENT);
	if (private_pages(c->fd, p, len) != (long)n || huge != (whole ? n : 0)) {
		DETAIL("after migration: %ld private pages, %zu of them in device PMDs (want %zu, %zu)",
		       private_pages(c->fd, p, len), huge, n, whole ? n : 0);
		goto out;
	}
	if (svm_crc(c->fd, p, len, &crc) || crc != want) {
		DETAIL("device crc32c %#x, want %#x", crc, want);
		goto out;
	}
	/* one CPU read in the second 2 MiB */
	if (cxla_hmm_info(c->fd, &h0) || check_pages_at(p + 3 * MiB, 768, PG, 311) >= 0 ||
	    cxla_hmm_info(c->fd, &h1)) {
		DETAIL("CPU read of page 768");
		goto out;
	}
	back = n - private_pages(c->fd, p, len);
	if (h1.cpu_faults - h0.cpu_faults != 1 || back != (whole ? 512 : 1)) {
		DETAIL("a CPU read brought back %zu pages in %llu faults (want %d in 1)",
		       back, (unsigned long long)(h1.cpu_faults - h0.cpu_faults),
		       whole ? 512 : 1);
		goto out;
	}
	if (cxla_migrate_flags(c->fd, p, len, false, PRIV, &m) ||
	    check_pages(p, len, 311) >= 0) {
		DETAIL("data after the way back");
		goto out;
	}
	DETAIL(whole ?
	       "4 MiB of THP to private device memory as two 2 MiB folios (device PMDs), device crc32c right in place; a CPU read brought 2 MiB back in one fault; data right" :
	       "private_thp off: the kernel split 4 MiB of THP into 1024 private pages (no PMD); a CPU read brought one page back; data right");
	ret = PASS;
out:
	private_thp(1);
	close(lock);
	munmap(p, len);
	if (ret == PASS)
		PRIVATE_IDLE(c->fd);
	return ret;
}

CXLA_TEST_F(dev, private_thp)
{
	return private_thp_run(c, true);
}

CXLA_TEST_F(dev, private_thp_split)
{
	return private_thp_run(c, false);
}

/* another device's private pages: faulted back to RAM before its access */
CXLA_TEST_F(peer, private_peer)
{
	size_t len = 64 * PG, n = len / PG;
	struct cxl_accel_migrate m;
	uint8_t *p = map_anon(len);
	uint32_t crc, want;

	NEED_PRIVATE();
	CHECK(p, "mmap");
	fill_pages(p, len, 307);
	want = crc32c(0, p, len);
	OK(cxla_migrate_flags(c->fd, p, len, true, PRIV, &m));
	CHECK(m.migrated == n, "migrated %llu", (unsigned long long)m.migrated);
	OK(svm_crc(c->pfd, p, len, &crc));
	CHECK(crc == want, "peer crc %#x, want %#x", crc, want);
	CHECK(private_pages(c->fd, p, len) == 0, "pages still private on the first device");
	munmap(p, len);
	PRIVATE_IDLE(c->fd);
	DETAIL("the second device's access faulted the first one's private pages back to RAM (its owner is not ours), crc right");
	return PASS;
}

/* repeat device fetch-adds of 1 on *w through a device-exclusive entry */
static int exclusive_add(int fd, uint64_t *w, uint64_t repeat,
			 struct cxl_accel_atomic *a)
{
	memset(a, 0, sizeof(*a));
	a->target = cxla_user(w);
	a->op = CXL_ACCEL_ATOMIC_FETCH_ADD;
	a->width = 8;
	a->operand = 1;
	a->repeat = repeat;
	a->flags = CXL_ACCEL_ATOMIC_EXCLUSIVE;
	return cxla_ioctl(fd, CXL_ACCEL_IOC_ATOMIC, a);
}

/*
 * Device atomics on system memory through a device-exclusive entry: the
 * CPU mapping goes while the device works (a CPU access meanwhile waits)
 * and comes back at the next CPU access; fork copies the value.
 */
CXLA_TEST_F(dev, private_exclusive_atomic)
{
	struct cxl_accel_atomic a;
	struct cxla_adder ca;
	volatile int stop = 0;
	uint64_t *w = map_anon(PG);
	uint8_t f[1];
	pthread_t t;
	int status, k;
	pid_t pid;

	NEED_PRIVATE();
	CHECK(w, "mmap");
	*w = 0;
	OK(cxla_atomic(c->fd, cxla_user(w), CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 1, 0,
		       1000, 0, &a));
	CHECK(a.count == 1000 && a.result == 999, "plain: count %llu result %llu",
	      (unsigned long long)a.count, (unsigned long long)a.result);
	OK(exclusive_add(c->fd, w, 1000, &a));
	CHECK(a.count == 1000 && a.result == 1999, "exclusive: count %llu result %llu",
	      (unsigned long long)a.count, (unsigned long long)a.result);
	/* the device keeps the page until the CPU wants it */
	OK(snapshot(c->fd, w, PG, f));
	CHECK(!(f[0] & CXL_ACCEL_SNAP_PRESENT), "after the exclusive atomic: %#x, want not present", f[0]);
	CHECK(*w == 2000, "CPU reads %llu", (unsigned long long)*w);
	OK(snapshot(c->fd, w, PG, f));
	CHECK((f[0] & CXL_ACCEL_SNAP_PRESENT) && (f[0] & CXL_ACCEL_SNAP_WRITE),
	      "after a CPU access: %#x, want present and writable", f[0]);
	/* CPU and device adding at once: none lost */
	ca = (struct cxla_adder){ .word = w, .stop = &stop };
	CHECK(!pthread_create(&t, NULL, cxla_cpu_adder, &ca), "thread");
	for (k = 0; k < 20; k++) {
		a.result = 0;
		OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_ATOMIC, &a));
	}
	stop = 1;
	pthread_join(t, NULL);
	CHECK(*w == 2000 + 20 * 1000 + ca.adds, "word %llu, want %llu",
	      (unsigned long long)*w,
	      (unsigned long long)(2000 + 20 * 1000 + ca.adds));
	/* fork while the device holds the page */
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_ATOMIC, &a));
	pid = fork();
	if (!pid)
		_exit(*w == 2000 + 21 * 1000 + ca.adds ? 0 : 1);
	CHECK(pid > 0, "fork");
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "the child read another value");
	munmap(w, PG);
	DETAIL("device fetch-adds through a device-exclusive entry: the page left the CPU page table and came back at the CPU's access; 21000 device and %llu CPU adds at once, none lost; a forked child read the value",
	       (unsigned long long)ca.adds);
	return PASS;
}

/*
 * mprotect takes a device-exclusive page back: the CPU gets it read-only,
 * and the device cannot take it for atomics (they write) until it is
 * writable again.
 */
CXLA_TEST_F(dev, private_exclusive_mprotect)
{
	struct cxl_accel_atomic a;
	uint64_t *w = map_anon(PG);
	uint8_t f[1];
	int r;

	NEED_PRIVATE();
	CHECK(w, "mmap");
	*w = 5;
	OK(exclusive_add(c->fd, w, 100, &a));
	CHECK(a.count == 100 && a.result == 104, "count %llu result %llu",
	      (unsigned long long)a.count, (unsigned long long)a.result);
	OK(snapshot(c->fd, w, PG, f));
	CHECK(!(f[0] & CXL_ACCEL_SNAP_PRESENT), "after the exclusive atomic: %#x, want not present",
	      f[0]);
	OK(mprotect(w, PG, PROT_READ) ? -errno : 0);
	CHECK(*w == 105, "CPU reads %llu after mprotect", (unsigned long long)*w);
	OK(snapshot(c->fd, w, PG, f));
	CHECK((f[0] & CXL_ACCEL_SNAP_PRESENT) && !(f[0] & CXL_ACCEL_SNAP_WRITE),
	      "after mprotect and a CPU read: %#x, want present read-only", f[0]);
	r = cxla_ioctl(c->fd, CXL_ACCEL_IOC_ATOMIC, &a);
	CHECK(r == -EFAULT, "exclusive atomic on a read-only page: %d, want -EFAULT", r);
	CHECK(*w == 105, "the refused atomic changed the word to %llu", (unsigned long long)*w);
	OK(mprotect(w, PG, PROT_READ | PROT_WRITE) ? -errno : 0);
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_ATOMIC, &a));
	CHECK(a.count == 100 && a.result == 204, "writable again: count %llu result %llu",
	      (unsigned long long)a.count, (unsigned long long)a.result);
	CHECK(*w == 205, "CPU reads %llu at the end", (unsigned long long)*w);
	munmap(w, PG);
	DETAIL("mprotect(PROT_READ) took the device-exclusive page back (the CPU read it, present read-only), an exclusive atomic then got -EFAULT with the word unchanged; writable again, 100 more device adds landed");
	return PASS;
}

/* ------------------------------------------------------- modes, options */

CXLA_OPTION(stress_secs, "-s", "STRESS-SECS")
{
	stress_secs = atoi(arg);
}

CXLA_MODE(hold_migrated, "--hold-migrated", "DEV [--close]", 1)
{
	return hold_migrated(argv[0], argc > 1 && !strcmp(argv[1], "--close"));
}

CXLA_MODE(hold_spliced, "--hold-spliced", "DEV [SECS [zeros]]", 1)
{
	return hold_spliced(argv[0], argc > 1 ? atoi(argv[1]) : 120,
			    argc > 2 && !strcmp(argv[2], "zeros"));
}

CXLA_MODE(stall, "--stall", "SECS DEV", 2)
{
	return hmm_stall(atoi(argv[0]), argv[1]);
}

CXLA_MODE(soak, "--soak", "SECS DEV PEER-DEV", 3)
{
	return hmm_soak(atoi(argv[0]), argv[1], argv[2]);
}

static int prologue(void)
{
	int fd = open(cxla_opt.dev, O_RDWR);

	if (fd < 0 || cxla_hmm_info(fd, &runner_h0)) {
		cxla_result("open", FAIL, "%s: %s", cxla_opt.dev, strerror(errno));
		return 1;
	}
	close(fd);
	return 0;
}

CXLA_PROGRAM(.name = "hmm-tests", .prefix = "hmm.", .timeout_s = TEST_TIMEOUT_S,
	     .prologue = prologue);
