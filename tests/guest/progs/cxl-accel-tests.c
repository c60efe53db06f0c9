// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel guest tests of the device's commands, memory and files, on the
 * harness of cxla_harness.h: each test in its own child process with a fresh
 * file descriptor (so a crash or a leak in one test cannot spoil the next),
 * one line per test:
 *
 *   RESULT <prefix><name> PASS|FAIL <detail>
 *
 * Usage: cxl-accel-tests [-d /dev/cxl-accelN] [-p prefix] [-t name]... [-l]
 *        cxl-accel-tests --stall SECS DEV         (run-stall.sh)
 *        cxl-accel-tests --hold /dev/cxl-accelN   (helper for the unbind test)
 *        cxl-accel-tests --multi                  (tests across all devices)
 *        cxl-accel-tests --restart SECS DEV       (commands while the host kills the daemon)
 *        cxl-accel-tests --soak SECS DEV          (the same, one part of run-soak.sh)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sched.h>
#include <sys/wait.h>

#include "cxla_harness.h"

#define KiB		1024ULL
#define MiB		(1024 * KiB)
#define TEST_TIMEOUT_S	240

/* every test: the device (-d), opened and identified */
FIXTURE(dev) {
	CXLA_DEVS;
};

FIXTURE_SETUP(dev)
{
	return cxla_open_devs(&c->devs, CXLA_NO_PEER);
}

static int page_size;

CXLA_CTOR(init_page_size)
{
	page_size = getpagesize();
}

/* ------------------------------------------------------------ basics */

CXLA_TEST_F(dev, identify)
{
	struct cxl_accel_identify *id = &c->id;

	CHECK(id->magic == 0x414c5843, "magic %#x", id->magic);
	CHECK(id->version_major == 1, "version %u.%u", id->version_major,
	      id->version_minor);
	CHECK(id->devmem_size >= 2 * MiB && id->devmem_size % (2 * MiB) == 0,
	      "devmem_size %llu", (unsigned long long)id->devmem_size);
	CHECK(id->devmem_gpa && id->devmem_gpa % (2 * MiB) == 0,
	      "devmem_gpa %#llx", (unsigned long long)id->devmem_gpa);
	CHECK(id->devmem_free <= id->devmem_size, "free %llu > size",
	      (unsigned long long)id->devmem_free);
	CHECK(id->features & CXL_ACCEL_F_ALLOC, "features %#llx",
	      (unsigned long long)id->features);
	CHECK(id->num_dma_engines >= 1, "engines %u", id->num_dma_engines);
	DETAIL("%llu MiB at %#llx, free %llu MiB, %u engines, features %#llx, index %u, node %d, latency r/w %u/%u ns, bandwidth r/w %u/%u MB/s",
	       (unsigned long long)(id->devmem_size >> 20),
	       (unsigned long long)id->devmem_gpa,
	       (unsigned long long)(id->devmem_free >> 20), id->num_dma_engines,
	       (unsigned long long)id->features, id->device_index, id->numa_node,
	       id->read_latency_ns, id->write_latency_ns,
	       id->read_bandwidth_mbs, id->write_bandwidth_mbs);
	return PASS;
}

CXLA_TEST_F(dev, crc_known)
{
	static const char msg[] = "123456789";
	uint32_t crc, crc2;

	CHECK(crc32c(0, msg, 9) == 0xE3069283, "software crc32c %#x",
	      crc32c(0, msg, 9));
	OK(cxla_checksum(c->fd, cxla_user(msg), 9, 0, &crc));
	CHECK(crc == 0xE3069283, "device crc32c(\"123456789\") = %#x", crc);
	/* chaining through the seed */
	OK(cxla_checksum(c->fd, cxla_user(msg), 4, 0, &crc2));
	OK(cxla_checksum(c->fd, cxla_user(msg + 4), 5, crc2, &crc2));
	CHECK(crc2 == crc, "chained crc %#x != %#x", crc2, crc);
	DETAIL("crc32c(\"123456789\") = %#x", crc);
	return PASS;
}

/* ----------------------------------------------- coherence, device memory */

CXLA_TEST_F(dev, devmem_cpu_write_dev_checksum)
{
	struct cxl_accel_alloc a;
	uint32_t crc;
	uint8_t *p;

	OK(cxla_alloc(c->fd, 1 * MiB, 0, &a));
	p = cxla_map(c->fd, &a);
	CHECK(p, "mmap: %s", strerror(errno));
	fill_random(p, 1 * MiB, 42);
	/* no flush, no sync: the device reads what the CPU just wrote */
	OK(cxla_checksum(c->fd, cxla_dev(a.handle, 0), 1 * MiB, 0, &crc));
	CHECK(crc == crc32c(0, p, 1 * MiB), "device crc %#x, cpu %#x", crc,
	      crc32c(0, p, 1 * MiB));
	/* an unaligned piece, rewritten */
	memset(p + 4097, 0x5a, 100000);
	OK(cxla_checksum(c->fd, cxla_dev(a.handle, 4097), 100000, 7, &crc));
	CHECK(crc == crc32c(7, p + 4097, 100000), "partial crc %#x", crc);
	DETAIL("1 MiB written by the CPU through mmap, crc %#x", crc);
	return PASS;
}

CXLA_TEST_F(dev, devmem_dev_fill_cpu_read)
{
	const uint64_t pat = 0x0123456789abcdefULL;
	const size_t off = 13, len = 500000;
	struct cxl_accel_alloc a;
	uint8_t *p;
	size_t i;

	OK(cxla_alloc(c->fd, 1 * MiB, 0, &a));
	p = cxla_map(c->fd, &a);
	CHECK(p, "mmap: %s", strerror(errno));
	memset(p, 0xee, 1 * MiB);
	OK(cxla_fill(c->fd, cxla_dev(a.handle, off), len, pat, 0));
	for (i = 0; i < off; i++)
		CHECK(p[i] == 0xee, "byte %zu before the fill changed", i);
	for (i = 0; i < len; i++)
		CHECK(p[off + i] == (uint8_t)(pat >> (8 * (i % 8))),
		      "byte %zu of the fill is %#x", i, p[off + i]);
	CHECK(p[off + len] == 0xee, "byte after the fill changed");
	DETAIL("device filled %zu bytes at offset %zu, CPU read them through mmap",
	       len, off);
	return PASS;
}

CXLA_TEST_F(dev, ram_cpu_write_dev_checksum)
{
	size_t len = 3 * MiB + 5;
	uint8_t *buf = malloc(len + 5);
	uint32_t crc;

	CHECK(buf, "malloc");
	fill_random(buf, len + 5, 7);
	OK(cxla_checksum(c->fd, cxla_user(buf + 5), len, 0, &crc));
	CHECK(crc == crc32c(0, buf + 5, len), "device %#x cpu %#x", crc,
	      crc32c(0, buf + 5, len));
	free(buf);
	DETAIL("%zu bytes of malloc memory at an odd address, crc %#x", len, crc);
	return PASS;
}

CXLA_TEST_F(dev, ram_dev_fill_cpu_read)
{
	const uint64_t pat = 0xfeedfacecafebeefULL;
	size_t len = 2 * MiB, i;
	uint8_t *p = map_anon(len);

	CHECK(p, "mmap");
	/* pages never touched by the CPU: pinning faults them in */
	OK(cxla_fill(c->fd, cxla_user(p), len, pat, 0));
	for (i = 0; i < len; i++)
		CHECK(p[i] == (uint8_t)(pat >> (8 * (i % 8))), "byte %zu = %#x",
		      i, p[i]);
	DETAIL("device filled 2 MiB of untouched anonymous memory");
	return PASS;
}

CXLA_TEST_F(dev, copy_roundtrip)
{
	size_t len = 16 * MiB + 123;
	uint8_t *src = malloc(len + 16), *dst = malloc(len + 16);
	struct cxl_accel_alloc a;
	double t0, t1;
	uint32_t crc;

	CHECK(src && dst, "malloc");
	fill_random(src, len + 16, 99);
	memset(dst, 0, len + 16);
	OK(cxla_alloc(c->fd, len + 4096, 0, &a));
	t0 = now_sec();
	OK(cxla_copy(c->fd, cxla_user(src + 1), cxla_dev(a.handle, 7), len, 0));
	OK(cxla_copy(c->fd, cxla_dev(a.handle, 7), cxla_user(dst + 3), len, 0));
	t1 = now_sec();
	CHECK(!memcmp(src + 1, dst + 3, len), "data differs after the round trip");
	OK(cxla_checksum(c->fd, cxla_dev(a.handle, 7), len, 0, &crc));
	CHECK(crc == crc32c(0, src + 1, len), "device buffer crc %#x", crc);
	free(src);
	free(dst);
	DETAIL("%zu bytes RAM->devmem->RAM in %.3f s (%.0f MB/s)", len, t1 - t0,
	       2 * len / (t1 - t0) / 1e6);
	return PASS;
}

CXLA_TEST_F(dev, copy_dev_to_dev)
{
	struct cxl_accel_alloc a, b;
	uint8_t *pa, *pb;

	OK(cxla_alloc(c->fd, 2 * MiB, 0, &a));
	OK(cxla_alloc(c->fd, 2 * MiB, 0, &b));
	pa = cxla_map(c->fd, &a);
	pb = cxla_map(c->fd, &b);
	CHECK(pa && pb, "mmap: %s", strerror(errno));
	fill_random(pa, 2 * MiB, 5);
	memset(pb, 0, 2 * MiB);
	OK(cxla_copy(c->fd, cxla_dev(a.handle, 100), cxla_dev(b.handle, 300),
		     1 * MiB, 0));
	CHECK(!memcmp(pa + 100, pb + 300, 1 * MiB), "copy differs");
	CHECK(pb[299] == 0 && pb[300 + MiB] == 0, "bytes outside the copy changed");
	DETAIL("1 MiB between two buffers, checked through mmap");
	return PASS;
}

/*
 * A buffer mapped through the CXL region's host-physical range
 * (CXL_ACCEL_MMAP_REGION) is the same device memory as its own mapping: the
 * device checksums what the CPU stored through the region, the CPU loads
 * through the region what the device filled. Where the region does not
 * reach device memory (not CXL, or a QEMU that does not route the window to
 * the device: sysfs cxl says so) the mapping is refused with ENXIO, so
 * nothing reads zeros unawares.
 */
CXLA_TEST_F(dev, region_mmap)
{
	const uint64_t pat = 0x0123456789abcdefULL;
	size_t len = 2 * MiB, i;
	struct cxl_accel_alloc a;
	char attr[128] = "", path[256];
	uint8_t *r, *p;
	uint32_t crc;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/class/cxl-accel/%s/cxl",
		 strrchr(c->path, '/') + 1);
	f = fopen(path, "r");
	CHECK(f, "%s: %s", path, strerror(errno));
	CHECK(fgets(attr, sizeof(attr), f), "%s: empty", path);
	fclose(f);
	attr[strcspn(attr, "\n")] = 0;
	OK(cxla_alloc(c->fd, len, 0, &a));
	r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd,
		 (off_t)(a.mmap_offset | CXL_ACCEL_MMAP_REGION));
	if (!strstr(attr, " backed")) {
		CHECK(r == MAP_FAILED && errno == ENXIO,
		      "the region is '%s' but its mmap gave %s", attr,
		      r == MAP_FAILED ? strerror(errno) : "a mapping");
		DETAIL("refused with ENXIO: sysfs cxl says '%s'", attr);
		return PASS;
	}
	CHECK(r != MAP_FAILED, "region mmap (sysfs cxl '%s'): %s", attr,
	      strerror(errno));
	p = cxla_map(c->fd, &a);
	CHECK(p, "mmap: %s", strerror(errno));
	/* CPU stores through the region, the device reads its memory */
	for (i = 0; i < len; i += 8)
		*(volatile uint64_t *)(r + i) = pat ^ (i * 0x9e3779b97f4a7c15ULL);
	OK(cxla_checksum(c->fd, cxla_dev(a.handle, 0), len, 0, &crc));
	CHECK(crc == crc32c(0, p, len), "device crc %#x, the buffer's %#x", crc,
	      crc32c(0, p, len));
	for (i = 0; i < len; i += 8)
		CHECK(*(uint64_t *)(p + i) == (pat ^ (i * 0x9e3779b97f4a7c15ULL)),
		      "byte %zu differs through the buffer's own mapping", i);
	/* the device fills its memory, the CPU loads through the region */
	OK(cxla_fill(c->fd, cxla_dev(a.handle, 0), len, pat, 0));
	for (i = 0; i < len; i += 8)
		CHECK(*(volatile uint64_t *)(r + i) == pat,
		      "byte %zu through the region: %#llx", i,
		      (unsigned long long)*(volatile uint64_t *)(r + i));
	munmap(r, len);
	munmap(p, len);
	DETAIL("sysfs cxl '%s': 2 MiB stored through the region checksummed by the device (crc %#x), a device fill loaded through it",
	       attr, crc);
	return PASS;
}

/* Pointers into an mmap of device memory are valid "user memory" too. */
CXLA_TEST_F(dev, copy_mmap_pointer)
{
	size_t len = 1 * MiB;
	struct cxl_accel_alloc a;
	uint8_t *p, *ram = malloc(len);
	struct cxl_accel_stats s0, s1;

	CHECK(ram, "malloc");
	OK(cxla_alloc(c->fd, len, 0, &a));
	p = cxla_map(c->fd, &a);
	CHECK(p, "mmap: %s", strerror(errno));
	fill_random(p, len, 11);
	OK(cxla_stats(c->fd, &s0));
	OK(cxla_copy(c->fd, cxla_user(p), cxla_user(ram), len, 0));
	CHECK(!memcmp(p, ram, len), "devmem(mmap)->RAM differs");
	fill_random(ram, len, 12);
	OK(cxla_copy(c->fd, cxla_user(ram + 1), cxla_user(p + 2), len - 2, 0));
	CHECK(!memcmp(p + 2, ram + 1, len - 2), "RAM->devmem(mmap) differs");
	OK(cxla_stats(c->fd, &s1));
	free(ram);
	DETAIL("device used mmap pointers (pinned coherent pages), %llu bytes copied",
	       (unsigned long long)(s1.device[CXL_ACCEL_STAT_BYTES_COPIED] -
				    s0.device[CXL_ACCEL_STAT_BYTES_COPIED]));
	return PASS;
}

/*
 * A device write asked for across the end of one mapping into the next
 * lands in exactly the range asked for, as a CPU memset would: the device
 * buffer's tail and the anonymous memory after it, nothing before or after.
 * A range that runs into an inaccessible page writes nothing. (An outside
 * fuzzer once took such writes, which reached its own reference copies
 * lying next to its device mappings, for user memory corrupted by the
 * driver: issue 40.)
 */
CXLA_TEST_F(dev, writes_across_mappings)
{
	const size_t blen = 64 * 1024, alen = 64 * 1024, head = 8 * 1024, tail = 12 * 1024;
	const uint64_t pat = 0x0123456789abcdefULL;
	uint64_t svm_pat = 0x1122334455667788ULL;
	size_t g = page_size, win_len = g + blen + alen + g;
	struct cxl_accel_alloc a;
	uint8_t *win, *buf, *anon;
	const char *svm = "SVM FILL across it too";
	int r;

	if (!(c->id.features & CXL_ACCEL_F_ALLOC)) {
		DETAIL("device without ALLOC (NUMA mode)");
		return SKIP;
	}
	/* guard, device buffer, anonymous memory, guard: adjacent by MAP_FIXED */
	win = mmap(NULL, win_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(win != MAP_FAILED, "mmap: %s", strerror(errno));
	OK(cxla_alloc(c->fd, blen, 0, &a));
	CHECK(a.alloc_size == blen, "alloc_size %llu", (unsigned long long)a.alloc_size);
	buf = mmap(win + g, blen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
		   c->fd, (off_t)a.mmap_offset);
	CHECK(buf == win + g, "mmap of the buffer: %s", strerror(errno));
	anon = mmap(buf + blen, alen, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	CHECK(anon == buf + blen, "mmap of the anonymous part: %s", strerror(errno));
	memset(buf, 0xa5, blen);
	memset(anon, 0x5a, alen);

	OK(cxla_fill(c->fd, cxla_user(buf + blen - head), head + tail, pat, 0));
	CHECK(cxla_all_bytes(buf, blen - head, 0xa5), "FILL wrote before its range");
	CHECK(cxla_holds_pattern(buf + blen - head, head + tail, pat),
	      "FILL did not write all of its range across the two mappings");
	CHECK(cxla_all_bytes(anon + tail, alen - tail, 0x5a), "FILL wrote after its range");

	/* into the guard: an error, and not a byte written */
	memset(anon, 0x5a, alen);
	EXPECT_ERR(cxla_fill(c->fd, cxla_user(anon + alen - head), 2 * head, pat, 0),
		   EFAULT);
	CHECK(cxla_all_bytes(anon, alen, 0x5a), "a FILL that failed wrote memory");

	r = cxla_svm(c->fd, CXL_ACCEL_SVM_FILL, buf + blen - head, head + tail, 0, 0,
		     &svm_pat, NULL);
	if (r == -EOPNOTSUPP) {
		svm = "no SVM on this device";
	} else {
		OK(r);
		CHECK(cxla_all_bytes(buf, blen - head, 0xa5), "SVM FILL wrote before its range");
		CHECK(cxla_holds_pattern(buf + blen - head, head + tail, svm_pat),
		      "SVM FILL did not write all of its range across the two mappings");
		CHECK(cxla_all_bytes(anon + tail, alen - tail, 0x5a),
		      "SVM FILL wrote after its range");
	}
	munmap(win, win_len);
	OK(cxla_free(c->fd, a.handle));
	DETAIL("FILL of [buffer end - %zu KiB, +%zu KiB) wrote exactly that, across the buffer and the anonymous memory after it; into a guard page: -EFAULT, nothing written; %s",
	       head >> 10, (head + tail) >> 10, svm);
	return PASS;
}

/* ---------------------------------------------------------- atomics */

struct atomic_job {
	int fd;
	struct cxl_accel_mem target;
	uint64_t repeat;
	int ret;
	struct cxl_accel_atomic out;
	double secs;
	volatile int *go;
};

static void *atomic_thread(void *arg)
{
	struct atomic_job *j = arg;
	double t0;

	while (!__atomic_load_n(j->go, __ATOMIC_ACQUIRE))
		;
	t0 = now_sec();
	j->ret = cxla_atomic(j->fd, j->target, CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 1,
			     0, j->repeat, 120000, &j->out);
	j->secs = now_sec() - t0;
	return NULL;
}

static int race_atomics(FIXTURE_DATA(dev) *c, uint64_t *word, struct cxl_accel_mem target,
			const char *where)
{
	const uint64_t n = 1000000;
	volatile int go = 0;
	struct atomic_job j = {
		.fd = c->fd, .target = target, .repeat = n, .go = &go,
	};
	uint64_t i, final, first, last = 0;
	pthread_t th;
	double t0, cpu;

	__atomic_store_n(word, 0, __ATOMIC_SEQ_CST);
	CHECK(!pthread_create(&th, NULL, atomic_thread, &j), "pthread_create");
	__atomic_store_n(&go, 1, __ATOMIC_RELEASE);
	t0 = now_sec();
	first = __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
	for (i = 1; i < n; i++)
		last = __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
	cpu = now_sec() - t0;
	pthread_join(th, NULL);
	OK(j.ret);
	final = __atomic_load_n(word, __ATOMIC_SEQ_CST);
	CHECK(j.out.count == n, "device did %llu ops",
	      (unsigned long long)j.out.count);
	CHECK(final == 2 * n, "final value %llu, expected %llu (lost updates)",
	      (unsigned long long)final, (unsigned long long)(2 * n));
	/*
	 * Old values seen by the first and last adds of each side show the
	 * interleaving: with no overlap the CPU would see 0..n-1 or n..2n-1.
	 */
	DETAIL("%s: %llu CPU + %llu device fetch-adds, final %llu exact; CPU %.3f s, device %.3f s; CPU's adds saw %llu..%llu, device's last saw %llu",
	       where, (unsigned long long)n, (unsigned long long)n,
	       (unsigned long long)final, cpu, j.secs,
	       (unsigned long long)first, (unsigned long long)last,
	       (unsigned long long)j.out.result);
	return PASS;
}

CXLA_TEST_F(dev, atomics_devmem)
{
	struct cxl_accel_alloc a;
	uint64_t *p;

	OK(cxla_alloc(c->fd, 4096, 0, &a));
	p = cxla_map(c->fd, &a);
	CHECK(p, "mmap: %s", strerror(errno));
	return race_atomics(c, p + 8, cxla_dev(a.handle, 64), "device memory");
}

CXLA_TEST_F(dev, atomics_ram)
{
	uint64_t *p;

	CHECK(!posix_memalign((void **)&p, 4096, 4096), "posix_memalign");
	memset(p, 0, 4096);
	return race_atomics(c, p + 3, cxla_user(p + 3), "system RAM");
}

CXLA_TEST_F(dev, atomic_ops)
{
	struct cxl_accel_atomic r;
	struct cxl_accel_alloc a;
	uint32_t *w32;
	uint64_t *w;

	OK(cxla_alloc(c->fd, 4096, 0, &a));
	w = cxla_map(c->fd, &a);
	CHECK(w, "mmap: %s", strerror(errno));
	w[0] = 5;
	OK(cxla_atomic(c->fd, cxla_dev(a.handle, 0), CXL_ACCEL_ATOMIC_CMPXCHG, 8,
		       9, 5, 0, 0, &r));
	CHECK(r.count == 1 && r.result == 5 && w[0] == 9,
	      "cmpxchg hit: count %llu result %llu word %llu",
	      (unsigned long long)r.count, (unsigned long long)r.result,
	      (unsigned long long)w[0]);
	OK(cxla_atomic(c->fd, cxla_dev(a.handle, 0), CXL_ACCEL_ATOMIC_CMPXCHG, 8,
		       1, 5, 0, 0, &r));
	CHECK(r.count == 0 && r.result == 9 && w[0] == 9,
	      "cmpxchg miss: count %llu result %llu word %llu",
	      (unsigned long long)r.count, (unsigned long long)r.result,
	      (unsigned long long)w[0]);
	OK(cxla_atomic(c->fd, cxla_dev(a.handle, 0), CXL_ACCEL_ATOMIC_SWAP, 8,
		       42, 0, 0, 0, &r));
	CHECK(r.result == 9 && w[0] == 42, "swap: result %llu word %llu",
	      (unsigned long long)r.result, (unsigned long long)w[0]);
	/* 32-bit add wraps and leaves its neighbour alone */
	w32 = (uint32_t *)(w + 1);
	w32[0] = 0xffffffffu;
	w32[1] = 0x11111111u;
	OK(cxla_atomic(c->fd, cxla_dev(a.handle, 8), CXL_ACCEL_ATOMIC_FETCH_ADD, 4,
		       1, 0, 1, 0, &r));
	CHECK(w32[0] == 0 && w32[1] == 0x11111111u && r.result == 0xffffffffu,
	      "32-bit add: %#x %#x result %#llx", w32[0], w32[1],
	      (unsigned long long)r.result);
	DETAIL("cmpxchg hit/miss, swap, 32-bit wrap-around");
	return PASS;
}

/* ----------------------------------------------------- message passing */

#define MP_ITER		1000
#define MP_PAYLOAD	(64 * KiB)

struct mp {
	volatile uint64_t *flag;	/* CPU view */
	volatile uint64_t *payload;	/* CPU view */
	volatile uint64_t *ack;		/* RAM, CPU only */
	uint64_t stale;			/* reader: bad payload words seen */
	uint64_t stale_iter;
	int fail;
};

/* CPU reader for device -> CPU */
static void *mp_cpu_reader(void *arg)
{
	struct mp *m = arg;
	uint64_t i, k, f;

	for (i = 1; i <= MP_ITER; i++) {
		while ((f = __atomic_load_n(m->flag, __ATOMIC_ACQUIRE)) < i)
			sched_yield();
		for (k = 0; k < MP_PAYLOAD / 8; k++) {
			if (m->payload[k] != f) {
				m->stale++;
				m->stale_iter = f;
			}
		}
		__atomic_store_n(m->ack, f, __ATOMIC_RELEASE);
	}
	return NULL;
}

static int mp_dev_to_cpu(FIXTURE_DATA(dev) *c, struct mp *m, struct cxl_accel_mem flag,
			 struct cxl_accel_mem payload, const char *where)
{
	pthread_t th;
	uint64_t i;
	double t0;

	*m->flag = 0;
	*m->ack = 0;
	CHECK(!pthread_create(&th, NULL, mp_cpu_reader, m), "pthread_create");
	t0 = now_sec();
	for (i = 1; i <= MP_ITER; i++) {
		OK(cxla_fill(c->fd, payload, MP_PAYLOAD, i, 0));
		OK(cxla_atomic(c->fd, flag, CXL_ACCEL_ATOMIC_SWAP, 8, i, 0, 0, 0,
			       NULL));
		while (__atomic_load_n(m->ack, __ATOMIC_ACQUIRE) != i)
			sched_yield();
	}
	pthread_join(th, NULL);
	CHECK(!m->stale, "%s: %llu stale payload words, last at iteration %llu",
	      where, (unsigned long long)m->stale,
	      (unsigned long long)m->stale_iter);
	DETAIL("%s: %d messages (64 KiB payload by FILL, flag by atomic SWAP), no stale payload, %.0f us per message",
	       where, MP_ITER, (now_sec() - t0) * 1e6 / MP_ITER);
	return PASS;
}

/* CPU writer for CPU -> device */
static void *mp_cpu_writer(void *arg)
{
	struct mp *m = arg;
	uint64_t i, k;

	for (i = 1; i <= MP_ITER; i++) {
		for (k = 0; k < MP_PAYLOAD / 8; k++)
			m->payload[k] = i;
		__atomic_store_n(m->flag, i, __ATOMIC_RELEASE);
		while (__atomic_load_n(m->ack, __ATOMIC_ACQUIRE) != i)
			sched_yield();
	}
	return NULL;
}

static int mp_cpu_to_dev(FIXTURE_DATA(dev) *c, struct mp *m, struct cxl_accel_mem flag,
			 struct cxl_accel_mem payload, const char *where)
{
	uint64_t *expect = malloc(MP_PAYLOAD);
	uint64_t i, k, polls = 0, stale = 0;
	struct cxl_accel_atomic r;
	uint32_t crc;
	pthread_t th;
	double t0;

	CHECK(expect, "malloc");
	*m->flag = 0;
	*m->ack = 0;
	CHECK(!pthread_create(&th, NULL, mp_cpu_writer, m), "pthread_create");
	t0 = now_sec();
	for (i = 1; i <= MP_ITER; i++) {
		/* device acquire: read the flag with an atomic (add 0) */
		do {
			OK(cxla_atomic(c->fd, flag, CXL_ACCEL_ATOMIC_FETCH_ADD, 8,
				       0, 0, 1, 0, &r));
			polls++;
		} while (r.result < i);
		CHECK(r.result == i, "flag %llu ahead of %llu",
		      (unsigned long long)r.result, (unsigned long long)i);
		for (k = 0; k < MP_PAYLOAD / 8; k++)
			expect[k] = i;
		OK(cxla_checksum(c->fd, payload, MP_PAYLOAD, 0, &crc));
		if (crc != crc32c(0, expect, MP_PAYLOAD))
			stale++;
		__atomic_store_n(m->ack, i, __ATOMIC_RELEASE);
	}
	pthread_join(th, NULL);
	free(expect);
	CHECK(!stale, "%s: device saw a stale payload in %llu of %d messages",
	      where, (unsigned long long)stale, MP_ITER);
	DETAIL("%s: %d messages (CPU payload + release flag, device atomic read + checksum), no stale payload, %.1f polls per message",
	       where, MP_ITER, (double)polls / MP_ITER);
	(void)t0;
	return PASS;
}

typedef int mp_fn(FIXTURE_DATA(dev) *c, struct mp *m, struct cxl_accel_mem flag,
		  struct cxl_accel_mem payload, const char *where);

/* a message-passing test, the flag and the payload in device memory or system RAM */
static int msgpass(FIXTURE_DATA(dev) *c, mp_fn *run, bool devmem)
{
	struct cxl_accel_alloc a;
	uint64_t ack = 0;
	struct mp m = { 0 };
	uint8_t *p;

	if (devmem) {
		OK(cxla_alloc(c->fd, MP_PAYLOAD + 4096, 0, &a));
		p = cxla_map(c->fd, &a);
		CHECK(p, "mmap: %s", strerror(errno));
	} else {
		p = map_anon(MP_PAYLOAD + 4096);
		CHECK(p, "mmap");
		memset(p, 0, MP_PAYLOAD + 4096);
	}
	m.flag = (uint64_t *)p;
	m.payload = (uint64_t *)(p + 4096);
	m.ack = &ack;
	if (devmem)
		return run(c, &m, cxla_dev(a.handle, 0), cxla_dev(a.handle, 4096),
			   "device memory");
	return run(c, &m, cxla_user(p), cxla_user(p + 4096), "system RAM");
}

CXLA_TEST_F(dev, msgpass_dev_to_cpu_devmem)
{
	return msgpass(c, mp_dev_to_cpu, true);
}

CXLA_TEST_F(dev, msgpass_dev_to_cpu_ram)
{
	return msgpass(c, mp_dev_to_cpu, false);
}

CXLA_TEST_F(dev, msgpass_cpu_to_dev_devmem)
{
	return msgpass(c, mp_cpu_to_dev, true);
}

CXLA_TEST_F(dev, msgpass_cpu_to_dev_ram)
{
	return msgpass(c, mp_cpu_to_dev, false);
}

/* ------------------------------------------------ allocation, exhaustion */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

CXLA_TEST_F(dev, alloc_many)
{
	const int n = 1000;
	struct cxl_accel_alloc *a = calloc(n, sizeof(*a));
	uint64_t *offs = calloc(n, sizeof(*offs));
	uint64_t start = cxla_devmem_free(c->fd);
	struct cxl_accel_identify id;
	int i;

	CHECK(a && offs, "calloc");
	for (i = 0; i < n; i++) {
		OK(cxla_alloc(c->fd, 4096, 0, &a[i]));
		offs[i] = a[i].offset;
		CHECK(a[i].handle && a[i].alloc_size == 4096,
		      "handle %u size %llu", a[i].handle,
		      (unsigned long long)a[i].alloc_size);
		OK(cxla_fill(c->fd, cxla_dev(a[i].handle, 0), 4096, i, 0));
	}
	qsort(offs, n, sizeof(*offs), cmp_u64);
	for (i = 1; i < n; i++)
		CHECK(offs[i] >= offs[i - 1] + 4096, "buffers overlap at %#llx",
		      (unsigned long long)offs[i]);
	for (i = 0; i < n; i += 97) {
		uint64_t *p = cxla_map(c->fd, &a[i]);

		CHECK(p, "mmap %d: %s", i, strerror(errno));
		CHECK(p[0] == (uint64_t)i && p[511] == (uint64_t)i,
		      "buffer %d holds %llu", i, (unsigned long long)p[0]);
		munmap(p, 4096);
	}
	OK(cxla_identify(c->fd, &id));
	CHECK(id.devmem_free == start - n * 4096ULL, "free %llu after %d allocs from %llu",
	      (unsigned long long)id.devmem_free, n, (unsigned long long)start);
	for (i = 0; i < n; i++)
		OK(cxla_free(c->fd, a[i].handle));
	CHECK(cxla_devmem_free(c->fd) == start, "free %llu, expected %llu after freeing all",
	      (unsigned long long)cxla_devmem_free(c->fd), (unsigned long long)start);
	DETAIL("%d buffers of 4 KiB, disjoint, written and freed; free back to %llu",
	       n, (unsigned long long)start);
	free(a);
	free(offs);
	return PASS;
}

CXLA_TEST_F(dev, alloc_exhaustion)
{
	const uint64_t sz = 64 * KiB;
	uint64_t start = cxla_devmem_free(c->fd), max = start / sz + 16;
	struct cxl_accel_alloc *a = calloc(max, sizeof(*a)), extra;
	uint64_t n = 0, i, freed = 0;
	int r, r2;

	CHECK(a, "calloc");
	while (n < max && !(r = cxla_alloc(c->fd, sz, sz, &a[n])))
		n++;
	CHECK(r == -ENOSPC, "allocation %llu failed with %d (%s), expected -ENOSPC",
	      (unsigned long long)n, r, strerror(-r));
	CHECK(n * sz == start, "%llu x 64 KiB fit in %llu free bytes",
	      (unsigned long long)n, (unsigned long long)start);
	CHECK(cxla_devmem_free(c->fd) == 0, "free %llu when exhausted",
	      (unsigned long long)cxla_devmem_free(c->fd));
	/* every other one back: only 64 KiB holes */
	for (i = 0; i < n; i += 2, freed++)
		OK(cxla_free(c->fd, a[i].handle));
	CHECK(cxla_devmem_free(c->fd) == freed * sz, "free %llu after freeing %llu",
	      (unsigned long long)cxla_devmem_free(c->fd), (unsigned long long)freed);
	r = cxla_alloc(c->fd, 2 * sz, 0, &extra);
	CHECK(r == -ENOSPC, "128 KiB in a memory of 64 KiB holes: %d (%s)", r,
	      r ? strerror(-r) : "allocated");
	r2 = cxla_alloc(c->fd, sz, 0, &extra);
	CHECK(!r2, "64 KiB into a hole: %d", r2);
	OK(cxla_free(c->fd, extra.handle));
	for (i = 1; i < n; i += 2)
		OK(cxla_free(c->fd, a[i].handle));
	CHECK(cxla_devmem_free(c->fd) == start, "free %llu, expected %llu",
	      (unsigned long long)cxla_devmem_free(c->fd), (unsigned long long)start);
	DETAIL("%llu x 64 KiB filled device memory, then -ENOSPC; fragmented: 128 KiB -ENOSPC, 64 KiB fits; all freed, %llu bytes free again",
	       (unsigned long long)n, (unsigned long long)start);
	free(a);
	return PASS;
}

CXLA_TEST_F(dev, alloc_bad)
{
	struct cxl_accel_alloc a;
	uint64_t start = cxla_devmem_free(c->fd);

	EXPECT_ERR(cxla_alloc(c->fd, 0, 0, &a), EINVAL);
	EXPECT_ERR(cxla_alloc(c->fd, c->id.devmem_size + 4096, 0, &a), ENOSPC);
	EXPECT_ERR(cxla_alloc(c->fd, 1ULL << 63, 0, &a), ENOSPC);
	EXPECT_ERR(cxla_alloc(c->fd, ~0ULL, 0, &a), ENOSPC);
	EXPECT_ERR(cxla_alloc(c->fd, 4096, 3, &a), EINVAL);
	EXPECT_ERR(cxla_alloc(c->fd, 4096, c->id.devmem_size * 2, &a), EINVAL);
	memset(&a, 0, sizeof(a));
	a.size = 4096;
	a.flags = 1;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_ALLOC, &a), EINVAL);
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_ALLOC, NULL), EFAULT);
	/* odd size rounds up, large alignment honoured */
	OK(cxla_alloc(c->fd, 5000, 2 * MiB, &a));
	CHECK(a.alloc_size == 8192 && a.offset % (2 * MiB) == 0,
	      "size %llu offset %#llx", (unsigned long long)a.alloc_size,
	      (unsigned long long)a.offset);
	OK(cxla_free(c->fd, a.handle));
	CHECK(cxla_devmem_free(c->fd) == start, "leak: free %llu",
	      (unsigned long long)cxla_devmem_free(c->fd));
	DETAIL("size 0/too big/2^63/~0, bad alignment, flags, NULL arg rejected");
	return PASS;
}

CXLA_TEST_F(dev, free_bad)
{
	struct cxl_accel_free f = { .handle = 1, .flags = 1 };
	struct cxl_accel_alloc a;

	EXPECT_ERR(cxla_free(c->fd, 0), ENOENT);
	EXPECT_ERR(cxla_free(c->fd, 12345), ENOENT);
	OK(cxla_alloc(c->fd, 4096, 0, &a));
	f.handle = a.handle;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_FREE, &f), EINVAL);
	OK(cxla_free(c->fd, a.handle));
	EXPECT_ERR(cxla_free(c->fd, a.handle), ENOENT);
	EXPECT_ERR(cxla_copy(c->fd, cxla_dev(a.handle, 0), cxla_dev(a.handle, 0),
			     8, 0), ENOENT);
	DETAIL("handle 0, unknown, double free, flags, use after free");
	return PASS;
}

/* Another file's handle means nothing here. */
CXLA_TEST_F(dev, handles_per_file)
{
	int fd2 = open(c->path, O_RDWR);
	struct cxl_accel_alloc a;

	CHECK(fd2 >= 0, "open: %s", strerror(errno));
	OK(cxla_alloc(fd2, 4096, 0, &a));
	EXPECT_ERR(cxla_fill(c->fd, cxla_dev(a.handle, 0), 8, 0, 0), ENOENT);
	EXPECT_ERR(cxla_free(c->fd, a.handle), ENOENT);
	CHECK(mmap(NULL, 4096, PROT_READ, MAP_SHARED, c->fd, a.mmap_offset) ==
	      MAP_FAILED && errno == ENOENT, "mmap of a foreign handle");
	close(fd2);
	DETAIL("handles are private to their file");
	return PASS;
}

CXLA_TEST_F(dev, free_while_mapped)
{
	uint64_t start = cxla_devmem_free(c->fd);
	struct cxl_accel_alloc a;
	uint32_t *p;
	size_t i;

	OK(cxla_alloc(c->fd, 256 * KiB, 0, &a));
	p = cxla_map(c->fd, &a);
	CHECK(p, "mmap: %s", strerror(errno));
	for (i = 0; i < 256 * KiB / 4; i++)
		p[i] = (uint32_t)i;
	OK(cxla_free(c->fd, a.handle));
	/* the mapping keeps the memory */
	for (i = 0; i < 256 * KiB / 4; i++)
		CHECK(p[i] == (uint32_t)i, "word %zu = %u after FREE", i, p[i]);
	p[7] = 77;
	CHECK(cxla_devmem_free(c->fd) == start - 256 * KiB, "memory returned while mapped (free %llu)",
	      (unsigned long long)cxla_devmem_free(c->fd));
	munmap(p, 256 * KiB);
	CHECK(cxla_devmem_free(c->fd) == start, "not returned after munmap (free %llu, start %llu)",
	      (unsigned long long)cxla_devmem_free(c->fd), (unsigned long long)start);
	DETAIL("FREE while mapped: mapping stays valid, memory returns at munmap");
	return PASS;
}

CXLA_TEST_F(dev, mmap_bad)
{
	struct cxl_accel_alloc a;
	uint8_t *p, *q;

	OK(cxla_alloc(c->fd, 4 * 4096, 0, &a));
	p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, c->fd, a.mmap_offset);
	CHECK(p == MAP_FAILED && errno == EINVAL, "MAP_PRIVATE: %p errno %d", p, errno);
	p = mmap(NULL, 5 * 4096, PROT_READ, MAP_SHARED, c->fd, a.mmap_offset);
	CHECK(p == MAP_FAILED && errno == EINVAL, "too long: errno %d", errno);
	p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, c->fd, a.mmap_offset + 4 * 4096);
	CHECK(p == MAP_FAILED && errno == EINVAL, "past the end: errno %d", errno);
	p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, c->fd,
		 (off_t)(a.handle + 100) << CXL_ACCEL_MMAP_SHIFT);
	CHECK(p == MAP_FAILED && errno == ENOENT, "unknown handle: errno %d", errno);
	p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, c->fd, 0);
	CHECK(p == MAP_FAILED && errno == ENOENT, "offset 0: errno %d", errno);
	/* a window into the middle sees the same memory */
	p = cxla_map(c->fd, &a);
	CHECK(p, "mmap: %s", strerror(errno));
	q = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd,
		 a.mmap_offset + 2 * 4096);
	CHECK(q != MAP_FAILED, "window: %s", strerror(errno));
	q[5] = 0x42;
	CHECK(p[2 * 4096 + 5] == 0x42, "window does not alias the buffer");
	DETAIL("private, too long, past the end, unknown handle rejected; windows alias");
	return PASS;
}

/* ------------------------------------------------------------ bad input */

CXLA_TEST_F(dev, ioctl_bad)
{
	struct cxl_accel_copy cp = { 0 };
	struct cxl_accel_wait_event w = { 0 };
	char buf[64];

	EXPECT_ERR(cxla_ioctl(c->fd, _IO(CXL_ACCEL_IOC_MAGIC, 0x4f), NULL), ENOTTY);
	EXPECT_ERR(cxla_ioctl(c->fd, _IOR('x', 1, int), buf), ENOTTY);
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_IDENTIFY, NULL), EFAULT);
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_COPY, NULL), EFAULT);
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_STATS, (void *)16), EFAULT);
	cp.src = cxla_user(buf);
	cp.dst = cxla_user(buf + 32);
	cp.len = 0;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_COPY, &cp), EINVAL);
	cp.len = 8;
	cp.flags = 0x80;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_COPY, &cp), EINVAL);
	cp.flags = 0;
	cp.src.reserved = 1;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_COPY, &cp), EINVAL);
	cp.src.reserved = 0;
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_COPY, &cp));
	w.flags = 0x10;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_WAIT_EVENT, &w), EINVAL);
	DETAIL("unknown ioctls ENOTTY, bad pointers EFAULT, zero length/flags/reserved EINVAL");
	return PASS;
}

CXLA_TEST_F(dev, range_bad)
{
	struct cxl_accel_alloc a;
	char buf[64] = { 0 };
	uint32_t crc;

	OK(cxla_alloc(c->fd, 8192, 0, &a));
	EXPECT_ERR(cxla_copy(c->fd, cxla_user(buf), cxla_dev(a.handle, 8192 - 10),
			     20, 0), EINVAL);
	EXPECT_ERR(cxla_copy(c->fd, cxla_dev(a.handle, 8193), cxla_user(buf), 1, 0),
		   EINVAL);
	EXPECT_ERR(cxla_copy(c->fd, cxla_dev(a.handle, ~0ULL - 3), cxla_user(buf),
			     8, 0), EINVAL);
	EXPECT_ERR(cxla_fill(c->fd, cxla_dev(a.handle, 4096), 4097, 0, 0), EINVAL);
	EXPECT_ERR(cxla_checksum(c->fd, cxla_dev(a.handle, 0), 8193, 0, &crc),
		   EINVAL);
	EXPECT_ERR(cxla_copy(c->fd, cxla_dev(a.handle + 1, 0), cxla_user(buf), 8, 0),
		   ENOENT);
	/* exactly the end is fine */
	OK(cxla_copy(c->fd, cxla_user(buf), cxla_dev(a.handle, 8192 - 20), 20, 0));
	DETAIL("past the end, offset beyond, wrap-around, unknown handle");
	return PASS;
}

CXLA_TEST_F(dev, user_addr_bad)
{
	struct cxl_accel_alloc a;
	uint8_t *hole, *ro, *half;
	uint32_t crc;

	OK(cxla_alloc(c->fd, 64 * KiB, 0, &a));
	hole = map_anon(64 * KiB);
	CHECK(hole, "mmap");
	munmap(hole, 64 * KiB);
	EXPECT_ERR(cxla_copy(c->fd, cxla_user(hole), cxla_dev(a.handle, 0), 4096, 0),
		   EFAULT);
	EXPECT_ERR(cxla_copy(c->fd, cxla_dev(a.handle, 0), cxla_user(hole), 4096, 0),
		   EFAULT);
	EXPECT_ERR(cxla_checksum(c->fd, cxla_user(NULL), 4096, 0, &crc), EFAULT);
	EXPECT_ERR(cxla_checksum(c->fd, cxla_user((void *)0xffff888000000000ULL),
				 4096, 0, &crc), EFAULT);
	EXPECT_ERR(cxla_checksum(c->fd, cxla_user((void *)(~0ULL - 10)), 100, 0,
				 &crc), EFAULT);
	/* a read-only mapping cannot be a destination */
	ro = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(ro != MAP_FAILED, "mmap ro");
	OK(cxla_checksum(c->fd, cxla_user(ro), 8192, 0, &crc));
	EXPECT_ERR(cxla_fill(c->fd, cxla_user(ro), 8192, 1, 0), EFAULT);
	/* half mapped */
	half = map_anon(8192);
	CHECK(half, "mmap");
	munmap(half + 4096, 4096);
	EXPECT_ERR(cxla_fill(c->fd, cxla_user(half), 8192, 1, 0), EFAULT);
	EXPECT_ERR(cxla_atomic(c->fd, cxla_user(hole), CXL_ACCEL_ATOMIC_SWAP, 8, 1,
			       0, 0, 0, NULL), EFAULT);
	DETAIL("unmapped, NULL, kernel, wrapping, read-only and half-mapped user memory: EFAULT");
	return PASS;
}

CXLA_TEST_F(dev, atomic_bad)
{
	struct cxl_accel_alloc a;
	struct cxl_accel_atomic r;

	OK(cxla_alloc(c->fd, 4096, 0, &a));
	EXPECT_ERR(cxla_atomic(c->fd, cxla_dev(a.handle, 4), CXL_ACCEL_ATOMIC_SWAP,
			       8, 1, 0, 0, 0, NULL), EINVAL);
	EXPECT_ERR(cxla_atomic(c->fd, cxla_dev(a.handle, 0), CXL_ACCEL_ATOMIC_SWAP,
			       2, 1, 0, 0, 0, NULL), EINVAL);
	EXPECT_ERR(cxla_atomic(c->fd, cxla_dev(a.handle, 0), 3, 8, 1, 0, 0, 0, NULL),
		   EINVAL);
	EXPECT_ERR(cxla_atomic(c->fd, cxla_dev(a.handle, 0), CXL_ACCEL_ATOMIC_SWAP,
			       8, 1, 0, 2, 0, NULL), EINVAL);
	EXPECT_ERR(cxla_atomic(c->fd, cxla_dev(a.handle, 4096), CXL_ACCEL_ATOMIC_SWAP,
			       8, 1, 0, 0, 0, NULL), EINVAL);
	EXPECT_ERR(cxla_atomic(c->fd, cxla_dev(a.handle, 4092),
			       CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 1, 0, 1, 0, NULL),
		   EINVAL);
	/* too many repeats for the device (limit 2^27) */
	EXPECT_ERR(cxla_atomic(c->fd, cxla_dev(a.handle, 0),
			       CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 1, 0, 1ULL << 40, 0,
			       &r), EINVAL);
	DETAIL("unaligned, width 2, op 3, repeat with swap, past the end, repeat 2^40");
	return PASS;
}

/* ------------------------------------------------------ events, stats */

CXLA_TEST_F(dev, signal_event)
{
	struct cxl_accel_wait_event w = { 0 };
	struct cxl_accel_signal s = { 0 };
	struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
	uint64_t seq1;

	if (!(c->id.features & CXL_ACCEL_F_EVENTS)) {
		DETAIL("device without events");
		return SKIP;
	}
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_WAIT_EVENT, &w), EAGAIN);
	w.timeout_ms = 100;
	EXPECT_ERR(cxla_ioctl(c->fd, CXL_ACCEL_IOC_WAIT_EVENT, &w), ETIMEDOUT);

	s.value = 0xabcdef;
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_SIGNAL, &s));
	CHECK(poll(&pfd, 1, 2000) == 1 && (pfd.revents & POLLIN), "poll: %#x",
	      pfd.revents);
	memset(&w, 0, sizeof(w));
	w.type = CXL_ACCEL_EVENT_SIGNAL;
	w.flags = CXL_ACCEL_WAIT_MATCH_VALUE;
	w.value = 0xabcdef;
	w.timeout_ms = 2000;
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_WAIT_EVENT, &w));
	CHECK(w.event.type == CXL_ACCEL_EVENT_SIGNAL && w.event.value0 == 0xabcdef,
	      "event type %u value %#llx", w.event.type,
	      (unsigned long long)w.event.value0);
	seq1 = w.event.seq;
	s.value = 2;
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_SIGNAL, &s));
	w.value = 2;
	OK(cxla_ioctl(c->fd, CXL_ACCEL_IOC_WAIT_EVENT, &w));
	CHECK(w.event.seq > seq1, "seq %llu after %llu",
	      (unsigned long long)w.event.seq, (unsigned long long)seq1);
	DETAIL("SIGNAL -> event with value, poll, seq %llu -> %llu, EAGAIN/ETIMEDOUT when idle",
	       (unsigned long long)seq1, (unsigned long long)w.event.seq);
	return PASS;
}

CXLA_TEST_F(dev, stats)
{
	struct cxl_accel_stats s0, s1;
	size_t len = 1 * MiB;
	uint8_t *a = malloc(len), *b = malloc(len);

	CHECK(a && b, "malloc");
	memset(a, 1, len);
	OK(cxla_stats(c->fd, &s0));
	OK(cxla_copy(c->fd, cxla_user(a), cxla_user(b), len, 0));
	OK(cxla_stats(c->fd, &s1));
	CHECK(s1.device[CXL_ACCEL_STAT_BYTES_COPIED] -
	      s0.device[CXL_ACCEL_STAT_BYTES_COPIED] >= len,
	      "bytes_copied grew by %llu",
	      (unsigned long long)(s1.device[CXL_ACCEL_STAT_BYTES_COPIED] -
				   s0.device[CXL_ACCEL_STAT_BYTES_COPIED]));
	CHECK(s1.device[CXL_ACCEL_STAT_COMMANDS] > s0.device[CXL_ACCEL_STAT_COMMANDS],
	      "device commands did not grow");
	CHECK(s1.driver[CXL_ACCEL_DSTAT_SUBMITTED] > s0.driver[CXL_ACCEL_DSTAT_SUBMITTED],
	      "driver submitted did not grow");
	free(a);
	free(b);
	DETAIL("device: %llu commands, %llu errors, %llu bytes copied; driver: %llu submitted, %llu timeouts",
	       (unsigned long long)s1.device[CXL_ACCEL_STAT_COMMANDS],
	       (unsigned long long)s1.device[CXL_ACCEL_STAT_ERRORS],
	       (unsigned long long)s1.device[CXL_ACCEL_STAT_BYTES_COPIED],
	       (unsigned long long)s1.driver[CXL_ACCEL_DSTAT_SUBMITTED],
	       (unsigned long long)s1.driver[CXL_ACCEL_DSTAT_TIMEOUTS]);
	return PASS;
}

/* ----------------------------------------------------- robustness */

/* A child that exits with buffers allocated and mapped leaks nothing. */
CXLA_TEST_F(dev, exit_with_buffers)
{
	uint64_t start = cxla_devmem_free(c->fd);
	pid_t pid;
	int status;

	pid = fork();
	CHECK(pid >= 0, "fork");
	if (!pid) {
		int fd = open(c->path, O_RDWR), i;
		struct cxl_accel_alloc a;
		uint8_t *p;

		for (i = 0; i < 8; i++) {
			if (cxla_alloc(fd, (i + 1) * 64 * KiB, 0, &a))
				_exit(2);
			if (i % 2)
				continue;
			p = cxla_map(fd, &a);
			if (!p)
				_exit(3);
			memset(p, i, a.alloc_size);
		}
		_exit(0);	/* no FREE, no munmap, no close */
	}
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && !WEXITSTATUS(status), "child status %#x", status);
	CHECK(cxla_devmem_free(c->fd) == start, "free %llu after the child exited, %llu before",
	      (unsigned long long)cxla_devmem_free(c->fd), (unsigned long long)start);
	DETAIL("8 buffers (4 mapped) released at exit");
	return PASS;
}

struct conc_job {
	int fd;
	int id;
	int iters;
	char err[160];
};

static void *conc_thread(void *arg)
{
	struct conc_job *j = arg;
	size_t len = 256 * KiB + j->id * 4096 + 17;
	uint8_t *src = malloc(len), *dst = malloc(len);
	struct cxl_accel_alloc a;
	uint32_t crc;
	int i, r;

	if (!src || !dst || cxla_alloc(j->fd, len, 0, &a)) {
		snprintf(j->err, sizeof(j->err), "setup failed");
		return NULL;
	}
	for (i = 0; i < j->iters; i++) {
		fill_random(src, len, j->id * 1000 + i);
		r = cxla_copy(j->fd, cxla_user(src), cxla_dev(a.handle, 0), len, 0);
		r = r ?: cxla_checksum(j->fd, cxla_dev(a.handle, 0), len, 0, &crc);
		r = r ?: cxla_copy(j->fd, cxla_dev(a.handle, 0), cxla_user(dst), len, 0);
		if (r) {
			snprintf(j->err, sizeof(j->err), "thread %d iter %d: %s",
				 j->id, i, strerror(-r));
			break;
		}
		if (crc != crc32c(0, src, len) || memcmp(src, dst, len)) {
			snprintf(j->err, sizeof(j->err), "thread %d iter %d: data",
				 j->id, i);
			break;
		}
	}
	cxla_free(j->fd, a.handle);
	free(src);
	free(dst);
	return NULL;
}

CXLA_TEST_F(dev, concurrent_submitters)
{
	struct conc_job jobs[6];
	pthread_t th[6];
	double t0 = now_sec();
	int i;

	for (i = 0; i < 6; i++) {
		jobs[i] = (struct conc_job){ .fd = c->fd, .id = i, .iters = 40 };
		CHECK(!pthread_create(&th[i], NULL, conc_thread, &jobs[i]), "thread");
	}
	for (i = 0; i < 6; i++)
		pthread_join(th[i], NULL);
	for (i = 0; i < 6; i++)
		CHECK(!jobs[i].err[0], "%s", jobs[i].err);
	DETAIL("6 threads x 40 x (copy in, checksum, copy out) in %.2f s",
	       now_sec() - t0);
	return PASS;
}

/*
 * SIGKILL while a command is in flight on a device buffer: the command is
 * abandoned (quarantined) with its buffer reference; the buffer, and the
 * other buffers of the dead process, return to the device once it is done.
 */
CXLA_TEST_F(dev, kill_during_command)
{
	uint64_t start = cxla_devmem_free(c->fd), f = 0;
	struct cxl_accel_stats st;
	int pfd[2], status, i;
	double t0;
	pid_t pid;
	char ch;

	CHECK(!pipe(pfd), "pipe");
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (!pid) {
		int fd = open(c->path, O_RDWR);
		struct cxl_accel_alloc a, b;
		uint64_t *p;

		if (fd < 0 || cxla_alloc(fd, 64 * KiB, 0, &a) ||
		    cxla_alloc(fd, 64 * KiB, 0, &b))
			_exit(2);
		p = cxla_map(fd, &a);
		if (!p)
			_exit(3);
		p[0] = 0;
		if (write(pfd[1], "r", 1) != 1)
			_exit(4);
		cxla_atomic(fd, cxla_dev(a.handle, 0), CXL_ACCEL_ATOMIC_FETCH_ADD,
			    8, 1, 0, 1ULL << 27, 60000, NULL);
		_exit(5);
	}
	close(pfd[1]);
	CHECK(read(pfd[0], &ch, 1) == 1, "child did not get ready");
	usleep(100000);
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
	      "child status %#x (the command finished before the kill?)", status);
	t0 = now_sec();
	for (i = 0; i < 600; i++) {
		f = cxla_devmem_free(c->fd);
		OK(cxla_stats(c->fd, &st));
		if (f == start && !st.driver[CXL_ACCEL_DSTAT_QUARANTINED])
			break;
		usleep(50000);
	}
	CHECK(f == start, "free %llu, expected %llu, 30 s after the kill",
	      (unsigned long long)f, (unsigned long long)start);
	CHECK(!st.driver[CXL_ACCEL_DSTAT_QUARANTINED], "still quarantined");
	DETAIL("killed during a 2^27-add ATOMIC; both buffers back %.2f s later",
	       now_sec() - t0);
	return PASS;
}

/*
 * A command that outlives its timeout: the ioctl returns -ETIMEDOUT, the
 * request stays quarantined (its user page pinned) and the device still
 * completes it into valid memory; then the quarantine empties.
 */
CXLA_TEST_F(dev, timeout_quarantine)
{
	const uint64_t n = 1ULL << 27;	/* the device's maximum repeat */
	struct cxl_accel_stats st;
	uint64_t *word;
	uint32_t crc;
	double t0, t1;
	int r, i;

	CHECK(!posix_memalign((void **)&word, 4096, 4096), "posix_memalign");
	memset(word, 0, 4096);
	t0 = now_sec();
	r = cxla_atomic(c->fd, cxla_user(word), CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 1, 0,
			n, 50, NULL);
	t1 = now_sec();
	CHECK(r == -ETIMEDOUT, "2^27 atomic adds in 50 ms: %d (%s)", r,
	      r ? strerror(-r) : "completed");
	CHECK(t1 - t0 < 2.0, "timeout took %.2f s", t1 - t0);
	OK(cxla_stats(c->fd, &st));
	CHECK(st.driver[CXL_ACCEL_DSTAT_QUARANTINED] >= 1, "nothing quarantined");
	/* the device keeps working meanwhile */
	OK(cxla_checksum(c->fd, cxla_user("123456789"), 9, 0, &crc));
	CHECK(crc == 0xE3069283, "crc %#x", crc);
	for (i = 0; i < 1200; i++) {
		OK(cxla_stats(c->fd, &st));
		if (!st.driver[CXL_ACCEL_DSTAT_QUARANTINED])
			break;
		usleep(100000);
	}
	CHECK(!st.driver[CXL_ACCEL_DSTAT_QUARANTINED],
	      "request still quarantined after 120 s");
	CHECK(__atomic_load_n(word, __ATOMIC_SEQ_CST) == n,
	      "word %llu after the abandoned adds, expected %llu",
	      (unsigned long long)*word, (unsigned long long)n);
	DETAIL("-ETIMEDOUT after %.0f ms, device finished the 2^27 adds %.1f s later into the still-pinned page",
	       (t1 - t0) * 1e3, now_sec() - t1);
	free(word);
	return PASS;
}

/* ------------------------------------------------- the other modes */

/*
 * --hold: keep buffers allocated and mapped until the device goes away,
 * then check that ioctls fail with ENODEV and the mapping with SIGBUS.
 */
static int hold(const char *path)
{
	int fd = open(path, O_RDWR), i, r;
	struct cxl_accel_identify id;
	struct cxl_accel_alloc a;
	static volatile uint8_t *p;
	uint8_t v = 0;

	if (fd < 0) {
		printf("HOLD open: %s\n", strerror(errno));
		return 1;
	}
	for (i = 0; i < 4; i++) {
		if (cxla_alloc(fd, 1 * MiB, 0, &a)) {
			printf("HOLD alloc failed\n");
			return 1;
		}
		if (i % 2 == 0) {
			p = cxla_map(fd, &a);
			if (!p) {
				printf("HOLD mmap failed\n");
				return 1;
			}
			memset((void *)p, 0x33, a.alloc_size);
		}
	}
	printf("HOLD READY\n");
	fflush(stdout);
	for (i = 0; i < 600; i++) {
		r = cxla_identify(fd, &id);
		if (r)
			break;
		usleep(100000);
	}
	printf("HOLD ioctl after removal: %d (%s)\n", r, strerror(-r));
	if (cxla_probe_read(p + 100, &v, NULL) != SIGBUS) {
		printf("HOLD mapping still readable after removal (%#x)\n", v);
		return 1;
	}
	printf("HOLD SIGBUS on the mapping after removal\n");
	r = cxla_alloc(fd, 4096, 0, &a);
	printf("HOLD DONE %s\n", r == -ENODEV ? "ok" : "bad");
	fflush(stdout);
	close(fd);
	return r == -ENODEV ? 0 : 1;
}

/*
 * --stall SECS DEV: keep issuing 1 MiB copies (500 ms timeout each) for SECS
 * seconds while the host stops and resumes the daemon. Expects -ETIMEDOUT
 * while it is stopped, normal service afterwards, the quarantine drained,
 * correct data, and all device memory back after close.
 */
static int stall(int secs, const char *path)
{
	int fd = open(path, O_RDWR), r, last = 1, timeouts = 0, ok_after = 0;
	size_t len = 1 * MiB;
	uint8_t *ram = malloc(len), *p;
	struct cxl_accel_copy cp = { 0 };
	struct cxl_accel_alloc a, b;
	struct cxl_accel_stats st;
	uint64_t start;
	double t0 = now_sec(), t;
	long iter = 0;

	if (fd < 0 || !ram)
		return 1;
	start = ({ struct cxl_accel_identify id; cxla_identify(fd, &id) ? 0 : id.devmem_free; });
	if (cxla_alloc(fd, len, 0, &a) || cxla_alloc(fd, len, 0, &b) ||
	    !(p = cxla_map(fd, &a)))
		return 1;
	cp.src = cxla_user(ram);
	cp.dst = cxla_dev(a.handle, 0);
	cp.len = len;
	cp.timeout_ms = 500;
	while ((t = now_sec() - t0) < secs) {
		fill_random(ram, len, ++iter);
		r = cxla_ioctl(fd, CXL_ACCEL_IOC_COPY, &cp);
		if (r != last) {
			printf("STALL %6.2f s: copy %s\n", t, r ? strerror(-r) : "ok");
			fflush(stdout);
			last = r;
		}
		if (r == -ETIMEDOUT) {
			timeouts++;
			if (b.handle) {
				/* FREE during the stall: must not block for long */
				double f0 = now_sec();

				cxla_free(fd, b.handle);
				printf("STALL FREE during the stall returned after %.2f s\n",
				       now_sec() - f0);
				b.handle = 0;
			}
		} else if (!r && timeouts) {
			ok_after++;
			if (memcmp(p, ram, len)) {
				printf("RESULT stall_recovery FAIL data differs after recovery\n");
				return 1;
			}
		} else if (r) {
			printf("RESULT stall_recovery FAIL copy: %s\n", strerror(-r));
			return 1;
		}
		usleep(100000);
	}
	for (r = 0; r < 100; r++) {
		if (cxla_stats(fd, &st) || !st.driver[CXL_ACCEL_DSTAT_QUARANTINED])
			break;
		usleep(100000);
	}
	munmap(p, len);
	close(fd);
	fd = open(path, O_RDWR);
	{
		struct cxl_accel_identify id;

		cxla_identify(fd, &id);
		printf("RESULT stall_recovery %s %d copies timed out while the daemon was stopped, %d ok after it resumed; quarantine %llu at the end; device memory free %llu of %llu at start; %llu timeouts counted\n",
		       timeouts && ok_after && !st.driver[CXL_ACCEL_DSTAT_QUARANTINED] &&
		       id.devmem_free == start ? "PASS" : "FAIL",
		       timeouts, ok_after,
		       (unsigned long long)st.driver[CXL_ACCEL_DSTAT_QUARANTINED],
		       (unsigned long long)id.devmem_free, (unsigned long long)start,
		       (unsigned long long)st.driver[CXL_ACCEL_DSTAT_TIMEOUTS]);
	}
	close(fd);
	return 0;
}

/* --multi: peer-to-peer between all devices present */
static int multi(void)
{
	char paths[8][300], detail[DETAIL_LEN + 1];
	int fds[8], n = 0, i, j, fails = 0;
	struct dirent *de;
	DIR *d = opendir("/dev");

	while (d && (de = readdir(d)) && n < 8) {
		if (strncmp(de->d_name, "cxl-accel", 9))
			continue;
		snprintf(paths[n], sizeof(paths[n]), "/dev/%s", de->d_name);
		fds[n] = open(paths[n], O_RDWR);
		if (fds[n] >= 0)
			n++;
	}
	if (d)
		closedir(d);
	if (n < 2) {
		printf("RESULT multi_device_p2p SKIP %d device(s)\n", n);
		return 0;
	}
	detail[0] = 0;
	for (i = 0; i < n && !detail[0]; i++) {
		for (j = 0; j < n && !detail[0]; j++) {
			struct cxl_accel_alloc a, b;
			uint8_t *pa, *pb;
			uint32_t crc;
			size_t len = 1 * MiB;
			int r;

			if (i == j)
				continue;
			if (cxla_alloc(fds[i], len, 0, &a) ||
			    cxla_alloc(fds[j], len, 0, &b)) {
				snprintf(detail, DETAIL_LEN, "alloc");
				break;
			}
			pa = cxla_map(fds[i], &a);
			pb = cxla_map(fds[j], &b);
			if (!pa || !pb) {
				snprintf(detail, DETAIL_LEN, "mmap");
				break;
			}
			fill_random(pa, len, i * 16 + j);
			memset(pb, 0, len);
			/* device i pushes into device j's memory (its BAR) */
			r = cxla_copy(fds[i], cxla_dev(a.handle, 0), cxla_user(pb),
				      len, 0);
			if (r) {
				snprintf(detail, DETAIL_LEN, "%s -> %s copy: %s",
					 paths[i], paths[j], strerror(-r));
				break;
			}
			if (memcmp(pa, pb, len)) {
				snprintf(detail, DETAIL_LEN, "%s -> %s: data differs",
					 paths[i], paths[j]);
				break;
			}
			r = cxla_checksum(fds[j], cxla_dev(b.handle, 0), len, 0, &crc);
			if (r || crc != crc32c(0, pa, len)) {
				snprintf(detail, DETAIL_LEN, "%s checksum: %d", paths[j], r);
				break;
			}
			munmap(pa, len);
			munmap(pb, len);
			cxla_free(fds[i], a.handle);
			cxla_free(fds[j], b.handle);
		}
	}
	if (detail[0])
		fails++;
	printf("RESULT multi_device_p2p %s %s\n", fails ? "FAIL" : "PASS",
	       fails ? detail : "every device copied 1 MiB into every other device's memory (peer BAR), checked by CPU and by the peer's checksum");
	for (i = 0; i < n; i++)
		close(fds[i]);
	return fails;
}

/*
 * --restart SECS DEV: four threads keep issuing commands for SECS seconds
 * while the host SIGKILLs the daemon's worker again and again (its
 * supervisor starts a new one). Each command must succeed with correct data
 * or fail with -EIO (in flight when the worker died): no other error, no
 * timeout, no wrong data. A buffer written before the run keeps its
 * contents, and all device memory is back after close.
 *
 * --soak SECS DEV: the same streams as one part of a soak
 * (tests/guest/host/run-soak.sh), next to other programs using the device: the
 * result is named soak_commands.<device>, and device memory is left to the
 * soak's own check at the very end.
 */
#define RESTART_THREADS	4
#define RESTART_LEN	(256 * KiB)
#define RESTART_ADDS	20000ULL
/* thread 0 only runs these, so that the device is busy when a kill lands */
#define RESTART_LONG_ADDS	(1ULL << 22)
/*
 * Threads running only those: 1; in a soak 2 (threads 0 and 1), so that both
 * DMA engines stay busy and the other programs' commands wait in the
 * device's queue, where a kill interrupts them too.
 */
static int restart_long = 1;

struct restart_arg {
	int fd, idx, secs;
	uint32_t counter;	/* buffer handle holding one u64 per thread */
	long ok, eio, atomics_ok, atomics_eio;
	char fail[160];
};

static uint64_t restart_adds(int idx)
{
	return idx >= restart_long ? RESTART_ADDS : RESTART_LONG_ADDS;
}

static int restart_op(struct restart_arg *a, uint64_t iter, uint8_t *ram,
		      uint8_t *map, uint32_t handle)
{
	struct cxl_accel_alloc tmp;
	uint64_t pattern = 0x0101010101010101ULL * (uint8_t)(iter * 13 + a->idx);
	uint32_t crc;
	size_t i;
	int r;

	switch (a->idx >= restart_long ? iter % 5 : 3) {
	case 0:
		fill_random(ram, RESTART_LEN, iter * 7 + a->idx);
		r = cxla_copy(a->fd, cxla_user(ram), cxla_dev(handle, 0),
			      RESTART_LEN, 0);
		if (!r && memcmp(map, ram, RESTART_LEN))
			snprintf(a->fail, sizeof(a->fail), "copy %llu: data differs",
				 (unsigned long long)iter);
		return r;
	case 1:
		r = cxla_fill(a->fd, cxla_dev(handle, 0), RESTART_LEN, pattern, 0);
		for (i = 0; !r && i < RESTART_LEN; i += 8)
			if (*(uint64_t *)(map + i) != pattern) {
				snprintf(a->fail, sizeof(a->fail),
					 "fill %llu: byte %zu differs",
					 (unsigned long long)iter, i);
				break;
			}
		return r;
	case 2:
		r = cxla_checksum(a->fd, cxla_user(ram), RESTART_LEN, 7, &crc);
		if (!r && crc != crc32c(7, ram, RESTART_LEN))
			snprintf(a->fail, sizeof(a->fail), "checksum %llu: %#x",
				 (unsigned long long)iter, crc);
		return r;
	case 3:
		r = cxla_atomic(a->fd, cxla_dev(a->counter, 8 * a->idx),
				CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 1, 0, restart_adds(a->idx),
				0, NULL);
		if (!r)
			a->atomics_ok++;
		else if (r == -EIO)
			a->atomics_eio++;
		return r;
	default:
		r = cxla_alloc(a->fd, 64 * KiB, 0, &tmp);
		if (!r)
			cxla_free(a->fd, tmp.handle);
		return r;
	}
}

static void *restart_thread(void *p)
{
	struct restart_arg *a = p;
	struct cxl_accel_alloc buf;
	uint8_t *ram = malloc(RESTART_LEN), *map = NULL;
	double t0 = now_sec();
	uint64_t iter = 0;
	int r;

	if (!ram || cxla_alloc(a->fd, RESTART_LEN, 0, &buf) ||
	    !(map = cxla_map(a->fd, &buf))) {
		snprintf(a->fail, sizeof(a->fail), "set-up failed");
		return NULL;
	}
	while (now_sec() - t0 < a->secs && !a->fail[0]) {
		r = restart_op(a, iter++, ram, map, buf.handle);
		if (!r)
			a->ok++;
		else if (r == -EIO)
			a->eio++;
		else if (!a->fail[0])
			snprintf(a->fail, sizeof(a->fail), "op %llu: %s",
				 (unsigned long long)(iter - 1) % 5, strerror(-r));
	}
	munmap(map, RESTART_LEN);
	cxla_free(a->fd, buf.handle);
	free(ram);
	return NULL;
}

static int restart_stream(int secs, const char *path, bool soak)
{
	struct restart_arg args[RESTART_THREADS] = { 0 };
	pthread_t th[RESTART_THREADS];
	struct cxl_accel_alloc keep, counter;
	struct cxl_accel_identify id;
	struct cxl_accel_stats st;
	uint8_t *ref = malloc(MiB), *kp, *cp;
	long ok = 0, eio = 0;
	uint64_t start, v;
	uint32_t crc = 0;
	char why[200] = "";
	int fd = open(path, O_RDWR), i, r;

	if (fd < 0 || !ref || cxla_identify(fd, &id))
		return 1;
	if (soak)
		restart_long = 2;
	start = id.devmem_free;
	/* written before the first kill, checked after the last */
	if (cxla_alloc(fd, MiB, 0, &keep) || !(kp = cxla_map(fd, &keep)) ||
	    cxla_alloc(fd, 4096, 0, &counter) || !(cp = cxla_map(fd, &counter)))
		return 1;
	fill_random(ref, MiB, 4242);
	memcpy(kp, ref, MiB);
	memset(cp, 0, 4096);
	/* the host starts killing when it sees this */
	printf("RESTART STREAMING for %d s\n", secs);
	fflush(stdout);
	for (i = 0; i < RESTART_THREADS; i++) {
		args[i] = (struct restart_arg){ .fd = fd, .idx = i, .secs = secs,
						.counter = counter.handle };
		pthread_create(&th[i], NULL, restart_thread, &args[i]);
	}
	for (i = 0; i < RESTART_THREADS; i++) {
		pthread_join(th[i], NULL);
		ok += args[i].ok;
		eio += args[i].eio;
		if (args[i].fail[0] && !why[0])
			snprintf(why, sizeof(why), "thread %d: %s", i, args[i].fail);
		/* completed atomics counted in full; interrupted ones partly at most */
		v = *(volatile uint64_t *)(cp + 8 * i);
		if (!why[0] && (v < args[i].atomics_ok * restart_adds(i) ||
				v > (args[i].atomics_ok + args[i].atomics_eio) * restart_adds(i)))
			snprintf(why, sizeof(why),
				 "thread %d: counter %llu after %ld+%ld atomics", i,
				 (unsigned long long)v, args[i].atomics_ok,
				 args[i].atomics_eio);
	}
	r = cxla_checksum(fd, cxla_dev(keep.handle, 0), MiB, 0, &crc);
	if (!why[0] && (memcmp(kp, ref, MiB) || r || crc != crc32c(0, ref, MiB)))
		snprintf(why, sizeof(why), "buffer written before the kills changed (%d)", r);
	if (!why[0] && (cxla_stats(fd, &st) || st.driver[CXL_ACCEL_DSTAT_TIMEOUTS]))
		snprintf(why, sizeof(why), "%llu commands timed out",
			 (unsigned long long)st.driver[CXL_ACCEL_DSTAT_TIMEOUTS]);
	if (!why[0] && !eio)
		snprintf(why, sizeof(why), "no command was interrupted: were there kills?");
	munmap(kp, MiB);
	munmap(cp, 4096);
	close(fd);
	/* every buffer (interrupted ALLOC/FREE included) is back */
	fd = open(path, O_RDWR);
	for (i = 0; i < 50 && !soak; i++) {
		if (cxla_identify(fd, &id) || id.devmem_free == start)
			break;
		usleep(100000);
	}
	if (!why[0] && !soak && id.devmem_free != start)
		snprintf(why, sizeof(why), "device memory free %llu, %llu at start",
			 (unsigned long long)id.devmem_free,
			 (unsigned long long)start);
	close(fd);
	printf("RESULT %s%s %s %ld commands completed and checked, %ld failed with -EIO (in flight at a kill), 0 timeouts, over %d s with %d threads%s%s\n",
	       soak ? "soak_commands." : "restart_stream",
	       soak ? (strrchr(path, '/') ? strrchr(path, '/') + 1 : path) : "",
	       why[0] ? "FAIL" : "PASS", ok, eio, secs, RESTART_THREADS,
	       why[0] ? "; " : "", why);
	free(ref);
	return why[0] ? 1 : 0;
}

/* ----------------------------------------------------- function reset */

/*
 * A Function Level Reset of the device's PCI function while a thread runs
 * device ATOMICs and pages are migrated to device memory (a kernel with
 * virtio's reset_prepare/reset_done; only with -t: it resets the device
 * under the other tests). Nothing is lost: the buffer and the
 * migrated pages hold their data, every ATOMIC either completed (counted
 * in the word) or failed with EIO, and the device serves on.
 */
FIXTURE_ALIAS(reset, dev);

FIXTURE_SETUP(reset)
{
	return cxla_open_devs(&c->devs, CXLA_NO_PEER);
}

FIXTURE_APPLIES(reset)
{
	return false;
}

struct hammer {
	int fd;
	struct cxl_accel_mem target;
	volatile int stop;
	uint64_t ok, cut, other, added;
	int other_errno;
};

static void *hammer_thread(void *arg)
{
	struct hammer *h = arg;
	struct cxl_accel_atomic out;
	int r;

	while (!h->stop) {
		r = cxla_atomic(h->fd, h->target, CXL_ACCEL_ATOMIC_FETCH_ADD, 8,
				1, 0, 100, 120000, &out);
		if (!r) {
			h->ok++;
			h->added += out.count;
		} else if (r == -EIO) {
			h->cut++;
		} else {
			h->other++;
			h->other_errno = -r;
		}
	}
	return NULL;
}

/* The first line of a sysfs file, without its newline: 0, or -1 (errno). */
static int read_attr(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	bool got;

	if (!f)
		return -1;
	got = fgets(buf, len, f);
	fclose(f);
	if (!got)
		return -1;
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

/* What a reset must keep: a buffer and pages migrated to device memory */
struct reset_data {
	size_t blen, mlen;		/* the buffer, the migrated pages */
	struct cxl_accel_alloc a;
	uint8_t *buf, *mig, *ref;	/* ref holds what both must hold */
};

#define RESET_DATA_INIT	{ .blen = 64 * KiB, .mlen = 64 * (size_t)page_size }

static int reset_data_set_up(FIXTURE_DATA(reset) *c, struct reset_data *d,
			     uint64_t seed)
{
	struct cxl_accel_migrate m;

	d->ref = malloc(d->mlen);
	CHECK(d->ref && d->blen <= d->mlen, "malloc");
	fill_random(d->ref, d->mlen, seed);
	OK(cxla_alloc(c->fd, d->blen, 0, &d->a));
	d->buf = cxla_map(c->fd, &d->a);
	CHECK(d->buf, "mmap: %s", strerror(errno));
	memcpy(d->buf, d->ref, d->blen);
	d->mig = map_anon(d->mlen);
	CHECK(d->mig, "mmap anon");
	memcpy(d->mig, d->ref, d->mlen);
	OK(cxla_migrate(c->fd, d->mig, d->mlen, true, &m));
	CHECK(m.migrated == d->mlen / page_size, "%llu of %zu pages migrated",
	      (unsigned long long)m.migrated, d->mlen / page_size);
	return PASS;
}

CXLA_TEST_F(reset, function_reset)
{
	const char *dev = strrchr(c->path, '/') + 1, *want = getenv("CXLA_RESET_METHOD");
	struct reset_data d = RESET_DATA_INIT;
	struct cxl_accel_alloc w;
	struct cxl_accel_migrate m;
	struct hammer h = { .fd = c->fd };
	uint64_t *word, final;
	char method[128] = "", cxl[128] = "", path[256];
	pthread_t th;
	double t0, took;
	uint32_t crc;
	int r;

	snprintf(path, sizeof(path), "/sys/class/cxl-accel/%s/cxl", dev);
	CHECK(!read_attr(path, cxl, sizeof(cxl)), "%s: %s", path,
	      strerror(errno));
	/* the PCI function is the virtio device's parent */
	snprintf(path, sizeof(path),
		 "/sys/class/cxl-accel/%s/device/../reset_method", dev);
	/* CXLA_RESET_METHOD: another of the kernel's reset methods (cxl_bus) */
	if (want) {
		r = cxla_write_str(path, want);
		CHECK(!r, "%s: %s: %s", path, want, strerror(-r));
	}
	if (read_attr(path, method, sizeof(method)) ||
	    strncmp(method, want ?: "flr", strlen(want ?: "flr"))) {
		/* our CXL function advertises FLR; QEMU's functions may not */
		CHECK(!strncmp(cxl, "none", 4), "reset_method '%s': no FLR first",
		      method);
		DETAIL("reset_method '%s': no FLR", method);
		return SKIP;
	}

	r = reset_data_set_up(c, &d, 0x5e7);
	if (r != PASS)
		return r;
	OK(cxla_alloc(c->fd, 4096, 0, &w));
	word = cxla_map(c->fd, &w);
	CHECK(word, "mmap: %s", strerror(errno));
	*word = 0;

	h.target = cxla_dev(w.handle, 0);
	CHECK(!pthread_create(&th, NULL, hammer_thread, &h), "pthread_create");
	usleep(200000);
	snprintf(path, sizeof(path), "/sys/class/cxl-accel/%s/device/../reset",
		 dev);
	t0 = now_sec();
	r = cxla_write_str(path, "1");
	took = now_sec() - t0;
	if (want) {
		snprintf(path, sizeof(path),
			 "/sys/class/cxl-accel/%s/device/../reset_method", dev);
		cxla_write_str(path, "default");
	}
	if (r) {
		h.stop = 1;
		pthread_join(th, NULL);
		FAILF("reset: %s", strerror(-r));
	}
	usleep(300000);
	h.stop = 1;
	pthread_join(th, NULL);

	final = __atomic_load_n(word, __ATOMIC_SEQ_CST);
	CHECK(!h.other, "%llu ATOMICs failed otherwise (last: %s)",
	      (unsigned long long)h.other, strerror(h.other_errno));
	CHECK(final >= h.added && final <= h.added + 100 * h.cut,
	      "the word holds %llu, the completed ATOMICs added %llu (%llu cut)",
	      (unsigned long long)final, (unsigned long long)h.added,
	      (unsigned long long)h.cut);
	CHECK(!memcmp(d.buf, d.ref, d.blen), "the buffer changed through the reset");
	OK(cxla_checksum(c->fd, cxla_dev(d.a.handle, 0), d.blen, 0, &crc));
	CHECK(crc == crc32c(0, d.ref, d.blen), "the device reads other data");
	CHECK(!memcmp(d.mig, d.ref, d.mlen), "the migrated pages changed");
	OK(cxla_migrate(c->fd, d.mig, d.mlen, true, &m));
	CHECK(!memcmp(d.mig, d.ref, d.mlen), "the pages changed moving again");
	OK(cxla_fill(c->fd, cxla_dev(d.a.handle, 0), d.blen, 0xa5a5a5a5a5a5a5a5ULL, 0));
	CHECK(d.buf[d.blen - 1] == 0xa5, "a device fill after the reset not seen");
	free(d.ref);
	DETAIL("%s (reset_method %s) in %.0f ms under %llu ATOMICs (%llu cut); 64 KiB buffer and %zu migrated pages intact, device serving",
	       want ? "reset" : "FLR", method, took * 1000, (unsigned long long)h.ok,
	       (unsigned long long)h.cut, d.mlen / page_size);
	return PASS;
}

/*
 * A CXL Reset through the driver (sysfs cxl_reset), without and with Mem
 * Clr: migrated pages stay intact either way (the driver moves them back
 * first), a buffer keeps its data with "keep" and reads zeros with "clear",
 * and the device serves on.
 */
CXLA_TEST_F(reset, cxl_reset)
{
	const char *dev = strrchr(c->path, '/') + 1;
	struct reset_data d = RESET_DATA_INIT;
	struct cxl_accel_migrate m;
	uint8_t *zero;
	char path[256], cxl[128] = "";
	double t0, keep_ms, clear_ms;
	uint32_t crc;
	size_t i;
	int r;

	snprintf(path, sizeof(path), "/sys/class/cxl-accel/%s/cxl", dev);
	CHECK(!read_attr(path, cxl, sizeof(cxl)), "%s: %s", path,
	      strerror(errno));
	if (!strncmp(cxl, "none", 4)) {
		DETAIL("not a CXL endpoint (%s)", cxl);
		return SKIP;
	}
	snprintf(path, sizeof(path), "/sys/class/cxl-accel/%s/cxl_reset", dev);
	zero = calloc(1, d.blen);
	CHECK(zero, "calloc");
	r = reset_data_set_up(c, &d, 0xc1e);
	if (r != PASS)
		return r;

	CHECK(cxla_write_str(path, "bogus") == -EINVAL, "'bogus' accepted");
	t0 = now_sec();
	r = cxla_write_str(path, "keep");
	keep_ms = (now_sec() - t0) * 1000;
	CHECK(!r, "writing keep: %s", strerror(-r));
	CHECK(!memcmp(d.buf, d.ref, d.blen), "the buffer changed through a reset without clear");
	CHECK(!memcmp(d.mig, d.ref, d.mlen), "the migrated pages changed");
	OK(cxla_migrate(c->fd, d.mig, d.mlen, true, &m));

	t0 = now_sec();
	r = cxla_write_str(path, "clear");
	clear_ms = (now_sec() - t0) * 1000;
	CHECK(!r, "writing clear: %s", strerror(-r));
	for (i = 0; i < d.blen && !d.buf[i]; i++)
		;
	CHECK(i == d.blen, "byte %zu of the buffer reads %#x after Mem Clr", i, d.buf[i]);
	OK(cxla_checksum(c->fd, cxla_dev(d.a.handle, 0), d.blen, 0, &crc));
	CHECK(crc == crc32c(0, zero, d.blen), "the device reads no zeros after Mem Clr");
	CHECK(!memcmp(d.mig, d.ref, d.mlen), "the migrated pages changed through Mem Clr");
	OK(cxla_fill(c->fd, cxla_dev(d.a.handle, 0), d.blen, 0x5a5a5a5a5a5a5a5aULL, 0));
	CHECK(d.buf[d.blen / 2] == 0x5a, "a device fill after the reset not seen");
	free(d.ref);
	free(zero);
	DETAIL("CXL Reset without clear in %.0f ms: buffer and %zu migrated pages intact; with Mem Clr in %.0f ms: buffer zeroed, migrated pages intact; device serving",
	       keep_ms, d.mlen / page_size, clear_ms);
	return PASS;
}

CXLA_MODE(hold, "--hold", "DEV", 1)
{
	return hold(argv[0]);
}

CXLA_MODE(stall, "--stall", "SECS DEV", 2)
{
	return stall(atoi(argv[0]), argv[1]);
}

CXLA_MODE(restart, "--restart", "SECS DEV", 2)
{
	return restart_stream(atoi(argv[0]), argv[1], false);
}

CXLA_MODE(soak, "--soak", "SECS DEV", 2)
{
	return restart_stream(atoi(argv[0]), argv[1], true);
}

CXLA_MODE(multi, "--multi", "", 0)
{
	return multi();
}

CXLA_PROGRAM(.name = "cxl-accel-tests", .prefix = "", .timeout_s = TEST_TIMEOUT_S);
