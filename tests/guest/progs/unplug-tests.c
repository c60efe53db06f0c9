// SPDX-License-Identifier: GPL-2.0
/*
 * Guest side of the hot-unplug test (tests/guest/host/run-unplug.sh), on the
 * harness of cxla_harness.h.
 *
 *   unplug-tests -d GONE -P KEEP [--wait SECS]
 *
 * GONE and KEEP are /dev/cxl-accelN of two devices; the host removes GONE
 * (QEMU device_del) while this program holds, one process each:
 *   mmap      a mapped buffer of GONE, written and read by the CPU in a loop
 *   cmdloop   COPY/CHECKSUM/FILL on a buffer of GONE in a loop
 *   dmabuf    a buffer of GONE exported as a DMA-BUF, mapped, imported by
 *             KEEP, which copies into it peer-to-peer in a loop
 *   import    the reverse: GONE imports a DMA-BUF of KEEP and checksums it
 *             in a loop
 *   migrated  8 MiB of process memory migrated to GONE (the CPU checks it
 *             in a loop) and 4 MiB to KEEP
 *   survivor  commands on KEEP in a loop, which must never fail
 * When every process is set up it prints "UNPLUG-READY" (the host waits for
 * that line), then waits up to SECS (default 120) for GONE to disappear and
 * checks that each process ended with the right error instead of hanging,
 * that the migrated data is intact in system RAM, that KEEP still works and
 * that nothing is left behind on KEEP or in the module. The test (removal)
 * reports each check as a result of its own (cxla_result()):
 * "RESULT unplug_<check> PASS|FAIL <detail>". Exit status 1 on any failure.
 *
 *   unplug-tests -d DEV -t reload
 *
 * After a reload: DEV has all of its memory free and computes correctly.
 */
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>

#include "cxla_harness.h"

#define KiB		1024UL
#define MiB		(1024 * KiB)
#define PG		4096UL
#define END_WAIT	30.0	/* s after the removal a process may take to notice */
#define TEST_TIMEOUT_S	600	/* the removal sets its own, from --wait */

/* ------------------------------------------------------------ state */

enum { W_MMAP, W_CMDLOOP, W_DMABUF, W_IMPORT, W_MIGRATED, W_SURVIVOR, W_COUNT };

static const char *const wname[W_COUNT] = {
	"mmap", "cmdloop", "dmabuf", "import", "migrated", "survivor",
};

/* One per process, in memory shared with the parent. */
struct worker {
	volatile int ready;		/* set up, looping */
	volatile int ended;		/* the loop stopped */
	volatile int done;		/* post-removal checks finished */
	volatile int verdict;		/* PASS or FAIL of the whole process */
	volatile long ops;		/* loop iterations */
	volatile int err;		/* -errno that ended the loop */
	volatile int sigbus;		/* the loop ended with SIGBUS */
	volatile double t_end;		/* when the loop stopped */
	char detail[DETAIL_LEN];
};

struct shared {
	volatile int gone;		/* GONE's remove() has returned */
	volatile int stop;		/* survivor: stop looping */
	volatile double t_gone;
	struct worker w[W_COUNT];
};

static struct shared *sh;
static int wait_s = 120;		/* --wait: for GONE to go */
static const char *gone_path, *keep_path;
static char gone_name[64], keep_name[64];
static char gone_vdev[PATH_MAX];	/* sysfs path of GONE's virtio device */

/* A worker's verdict, with a detail line. */
static int wfinish(struct worker *w, int verdict, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(w->detail, DETAIL_LEN, fmt, ap);
	va_end(ap);
	w->verdict = verdict;
	w->done = 1;
	return verdict;
}

#define WFAIL(...)	return wfinish(w, FAIL, __VA_ARGS__)
#define WCHECK(cond, ...) do { if (!(cond)) WFAIL(__VA_ARGS__); } while (0)

static void loop_ended(struct worker *w, int err)
{
	w->err = err;
	w->t_end = now_sec();
	w->ended = 1;
}

/* Wait until the parent saw the removal; false after secs. */
static bool wait_gone(double secs)
{
	double t0 = now_sec();

	while (!sh->gone) {
		if (now_sec() - t0 > secs)
			return false;
		usleep(20000);
	}
	return true;
}

/* ------------------------------------------------------------ helpers */

/* pages of [p, p + len) with any of the flags in mask, per SNAPSHOT */
static long snap_count(int fd, const void *p, size_t len, uint8_t mask)
{
	static uint8_t f[8192];
	struct cxl_accel_snapshot s = {
		.addr = (uintptr_t)p, .len = len, .flags_ptr = (uintptr_t)f,
	};
	size_t i, n = len / PG;
	long k = 0;

	if (n > sizeof(f) || cxla_ioctl(fd, CXL_ACCEL_IOC_SNAPSHOT, &s))
		return -1;
	for (i = 0; i < n; i++)
		k += !!(f[i] & mask);
	return k;
}

/* one 32-bit word per position, different per page and seed */
static uint32_t pat(uint64_t seed, size_t word)
{
	return (uint32_t)(seed * 0x9E3779B97F4A7C15ULL >> 32) ^ (uint32_t)word ^
	       (uint32_t)(word >> 10) * 0x85EBCA6Bu;
}

static void fill_pat(volatile uint32_t *q, size_t len, uint64_t seed)
{
	size_t i;

	for (i = 0; i < len / 4; i++)
		q[i] = pat(seed, i);
}

/* first byte offset in [off, off + len) that differs from fill_pat(), or -1 */
static long check_pat_at(const volatile uint32_t *q, size_t off, size_t len,
			 uint64_t seed)
{
	size_t i;

	for (i = off / 4; i < (off + len) / 4; i++)
		if (q[i] != pat(seed, i))
			return (long)(i * 4);
	return -1;
}

static long check_pat(const volatile uint32_t *q, size_t len, uint64_t seed)
{
	return check_pat_at(q, 0, len, seed);
}

/* ------------------------------------------------------------ workers */

/* mmap's CPU loop: a word per page written and read back, round after round */
struct cpu_rounds {
	struct worker *w;
	volatile uint32_t *map;
	size_t len;
	long bad;		/* the word that read back wrong, or -1 */
};

static void cpu_rounds(void *arg)
{
	struct cpu_rounds *l = arg;
	size_t i;

	for (;;) {
		for (i = 0; i < l->len / 4; i += PG / 4) {
			l->map[i] = (uint32_t)l->w->ops;
			if (l->map[i] != (uint32_t)l->w->ops) {
				l->bad = (long)i;
				return;
			}
		}
		l->w->ops++;
	}
}

/*
 * mmap: the CPU writes and reads a mapped 2 MiB buffer of GONE until the
 * mapping is zapped (SIGBUS). Then the file gives -ENODEV and a new mmap
 * fails.
 */
static int w_mmap(struct worker *w)
{
	const size_t len = 2 * MiB;
	struct cxl_accel_identify id;
	struct cxl_accel_alloc a;
	struct cpu_rounds l = { .w = w, .len = len, .bad = -1 };
	volatile uint32_t *map;
	uint32_t crc;
	uint8_t v;
	void *p;
	int fd = cxla_open_dev(gone_path), sig;

	WCHECK(fd >= 0, "open %s: %s", gone_path, strerror(errno));
	WCHECK(!cxla_alloc(fd, len, 0, &a), "alloc");
	map = cxla_map(fd, &a);
	WCHECK(map, "mmap: %s", strerror(errno));
	fill_pat(map, len, 1);
	WCHECK(!cxla_checksum(fd, cxla_dev(a.handle, 0), len, 0, &crc) &&
	       crc == crc32c(0, (const void *)map, len),
	       "device checksum of the CPU's writes differs");
	w->ready = 1;

	l.map = map;
	sig = cxla_catch_fault(cpu_rounds, &l, NULL);
	if (!sig) {
		loop_ended(w, -EIO);
		WFAIL("read back a different word at %ld", l.bad * 4);
	}
	w->sigbus = sig == SIGBUS;
	loop_ended(w, 0);
	WCHECK(sig == SIGBUS, "the CPU loop ended with signal %d, not SIGBUS", sig);

	WCHECK(wait_gone(60), "SIGBUS, but the device did not go away");
	WCHECK(cxla_probe_read((volatile uint8_t *)map + len - 1, &v, NULL) == SIGBUS,
	       "the mapping is readable again after the SIGBUS");
	WCHECK(cxla_identify(fd, &id) == -ENODEV, "IDENTIFY after removal: %d",
	       cxla_identify(fd, &id));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		 (off_t)a.mmap_offset);
	WCHECK(p == MAP_FAILED && errno == ENODEV,
	       "new mmap after removal: %s", p == MAP_FAILED ? strerror(errno) : "mapped");
	WCHECK(cxla_free(fd, a.handle) == -ENODEV, "FREE after removal");
	WCHECK(!munmap((void *)map, len), "munmap");
	WCHECK(!close(fd), "close");
	return wfinish(w, PASS, "SIGBUS after %ld rounds of CPU writes; IDENTIFY, mmap, FREE -ENODEV", w->ops);
}

/* cmdloop: COPY RAM -> GONE, CHECKSUM, FILL until an error (-ENODEV). */
static int w_cmdloop(struct worker *w)
{
	const size_t len = 1 * MiB;
	struct cxl_accel_alloc a;
	uint8_t *ram = malloc(len);
	uint32_t crc, want;
	int fd = cxla_open_dev(gone_path), r;

	WCHECK(fd >= 0 && ram, "open %s: %s", gone_path, strerror(errno));
	WCHECK(!cxla_alloc(fd, len, 0, &a), "alloc");
	fill_random(ram, len, 7);
	want = crc32c(0, ram, len);
	w->ready = 1;
	for (;;) {
		r = cxla_copy(fd, cxla_user(ram), cxla_dev(a.handle, 0), len, 0);
		if (!r)
			r = cxla_checksum(fd, cxla_dev(a.handle, 0), len, 0, &crc);
		if (!r && crc != want) {
			loop_ended(w, 0);
			WFAIL("device checksum %#x, expected %#x", crc, want);
		}
		if (!r)
			r = cxla_fill(fd, cxla_dev(a.handle, 0), len, w->ops, 0);
		if (r)
			break;
		w->ops++;
	}
	loop_ended(w, r);
	WCHECK(r == -ENODEV, "loop ended with %d (%s), expected -ENODEV", r, strerror(-r));
	WCHECK(wait_gone(60), "-ENODEV, but the device did not go away");
	WCHECK(cxla_fill(fd, cxla_dev(a.handle, 0), 4096, 0, 0) == -ENODEV,
	       "FILL after removal");
	WCHECK(!close(fd), "close");
	return wfinish(w, PASS, "-ENODEV after %ld rounds of COPY/CHECKSUM/FILL", w->ops);
}

/*
 * dmabuf: a buffer of GONE, exported, mapped through the DMA-BUF fd and
 * imported by KEEP, which copies into it peer-to-peer and checksums it in a
 * loop until the export is revoked (-ENODEV). Then the DMA-BUF's mapping
 * gives SIGBUS, SYNC and new mmaps and imports -ENODEV, and KEEP's own
 * work goes on.
 */
static int w_dmabuf(struct worker *w)
{
	const size_t len = 2 * MiB;
	struct cxl_accel_dmabuf_export e;
	struct cxl_accel_dmabuf_import im, im2;
	struct cxl_accel_alloc a, b;
	volatile uint8_t *map;
	uint32_t crc, want;
	uint8_t v;
	void *p;
	int g = cxla_open_dev(gone_path), k = cxla_open_dev(keep_path), r;

	WCHECK(g >= 0 && k >= 0, "open: %s", strerror(errno));
	WCHECK(!cxla_alloc(g, len, 0, &a), "alloc on %s", gone_name);
	WCHECK(!cxla_export_dmabuf(g, a.handle, CXL_ACCEL_DMABUF_CLOEXEC, &e), "export");
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, e.fd, 0);
	WCHECK(p != MAP_FAILED, "mmap of the DMA-BUF: %s", strerror(errno));
	map = p;
	WCHECK(!close(g), "close %s", gone_name);	/* the DMA-BUF holds it */
	WCHECK(!cxla_import_dmabuf(k, e.fd, &im), "import into %s", keep_name);
	WCHECK(im.kind == CXL_ACCEL_IMPORT_PEER &&
	       (im.attach_flags & CXL_ACCEL_IMPORT_DYNAMIC),
	       "import kind %u flags %#x", im.kind, im.attach_flags);
	WCHECK(!cxla_alloc(k, len, 0, &b), "alloc on %s", keep_name);
	WCHECK(!cxla_fill(k, cxla_dev(b.handle, 0), len, 0x5a5aa5a5c3c33c3cULL, 0),
	       "fill on %s", keep_name);
	WCHECK(!cxla_checksum(k, cxla_dev(b.handle, 0), len, 0, &want), "checksum");
	w->ready = 1;
	for (;;) {
		r = cxla_copy(k, cxla_dev(b.handle, 0), cxla_dev(im.handle, 0), len, 0);
		if (!r)
			r = cxla_checksum(k, cxla_dev(im.handle, 0), len, 0, &crc);
		if (!r && crc != want) {
			loop_ended(w, 0);
			WFAIL("checksum of the peer buffer %#x, expected %#x", crc, want);
		}
		if (r)
			break;
		w->ops++;
	}
	loop_ended(w, r);
	WCHECK(r == -ENODEV, "peer-to-peer loop ended with %d (%s), expected -ENODEV",
	       r, strerror(-r));
	WCHECK(wait_gone(60), "-ENODEV, but the device did not go away");
	WCHECK(cxla_probe_read(map, &v, NULL) == SIGBUS,
	       "the DMA-BUF mapping is still readable");
	WCHECK(cxla_sync_dmabuf(e.fd, DMA_BUF_SYNC_START | DMA_BUF_SYNC_RW) == -ENODEV,
	       "DMA_BUF_IOCTL_SYNC on the revoked buffer");
	p = mmap(NULL, len, PROT_READ, MAP_SHARED, e.fd, 0);
	WCHECK(p == MAP_FAILED && errno == ENODEV, "new mmap of the revoked DMA-BUF: %s",
	       p == MAP_FAILED ? strerror(errno) : "mapped");
	WCHECK(lseek(e.fd, 0, SEEK_END) == (off_t)len, "lseek on the revoked DMA-BUF");
	WCHECK(cxla_import_dmabuf(k, e.fd, &im2) == -ENODEV, "new import of the revoked DMA-BUF");
	WCHECK(cxla_fill(k, cxla_dev(im.handle, 0), 4096, 0, 0) == -ENODEV,
	       "FILL on the revoked import");
	/* KEEP's own buffer still works */
	WCHECK(!cxla_checksum(k, cxla_dev(b.handle, 0), len, 0, &crc) && crc == want,
	       "%s's own buffer after the removal", keep_name);
	WCHECK(!cxla_free(k, im.handle), "FREE of the import");
	WCHECK(!cxla_free(k, b.handle), "FREE on %s", keep_name);
	WCHECK(!munmap((void *)map, len), "munmap");
	WCHECK(!close(e.fd) && !close(k), "close");
	return wfinish(w, PASS, "%ld peer-to-peer copies by %s into %s's memory, then -ENODEV; mapping SIGBUS, SYNC/mmap/import -ENODEV",
		       w->ops, keep_name, gone_name);
}

/*
 * import: KEEP exports a buffer, GONE imports it and checksums it in a loop
 * (reads KEEP's memory) until -ENODEV. Removal must detach the import at
 * once: KEEP's export has no attachment while our file is still open.
 */
static int w_import(struct worker *w)
{
	const size_t len = 2 * MiB;
	struct cxl_accel_dmabuf_export e;
	struct cxl_accel_dmabuf_import im;
	struct cxl_accel_alloc a;
	volatile uint8_t *map;
	uint32_t crc, want;
	long att;
	int g = cxla_open_dev(gone_path), k = cxla_open_dev(keep_path), r;

	WCHECK(g >= 0 && k >= 0, "open: %s", strerror(errno));
	WCHECK(!cxla_alloc(k, len, 0, &a), "alloc on %s", keep_name);
	WCHECK(!cxla_fill(k, cxla_dev(a.handle, 0), len, 0x0123456789abcdefULL, 0),
	       "fill");
	WCHECK(!cxla_checksum(k, cxla_dev(a.handle, 0), len, 0, &want), "checksum");
	WCHECK(!cxla_export_dmabuf(k, a.handle, CXL_ACCEL_DMABUF_CLOEXEC, &e), "export");
	map = mmap(NULL, len, PROT_READ, MAP_SHARED, e.fd, 0);
	WCHECK(map != MAP_FAILED, "mmap of the DMA-BUF: %s", strerror(errno));
	WCHECK(!cxla_import_dmabuf(g, e.fd, &im), "import into %s", gone_name);
	WCHECK(im.kind == CXL_ACCEL_IMPORT_PEER, "import kind %u", im.kind);
	w->ready = 1;
	for (;;) {
		r = cxla_checksum(g, cxla_dev(im.handle, 0), len, 0, &crc);
		if (!r && crc != want) {
			loop_ended(w, 0);
			WFAIL("checksum by %s %#x, expected %#x", gone_name, crc, want);
		}
		if (r)
			break;
		w->ops++;
	}
	loop_ended(w, r);
	WCHECK(r == -ENODEV, "loop ended with %d (%s), expected -ENODEV", r, strerror(-r));
	WCHECK(wait_gone(60), "-ENODEV, but the device did not go away");
	/* our file is still open: removal alone must have detached */
	att = cxla_sysfs_long(keep_name, "dmabuf/attachments");
	WCHECK(att == 0, "%s's export still has %ld attachments after the importer went",
	       keep_name, att);
	WCHECK(cxla_free(g, im.handle) == -ENODEV,
	       "FREE of the import on the removed device: %d", cxla_free(g, im.handle));
	WCHECK(crc32c(0, (const void *)map, len) == want,
	       "%s's exported buffer changed", keep_name);
	WCHECK(!cxla_checksum(k, cxla_dev(a.handle, 0), len, 0, &crc) && crc == want,
	       "%s checksums its exported buffer", keep_name);
	WCHECK(!close(g), "close %s", gone_name);
	munmap((void *)map, len);
	WCHECK(!close(e.fd) && !cxla_free(k, a.handle) && !close(k), "close");
	return wfinish(w, PASS, "%ld checksums by %s of %s's DMA-BUF, then -ENODEV; detached at removal, exporter's data intact",
		       w->ops, gone_name, keep_name);
}

/*
 * migrated: 8 MiB of this process on GONE's memory, checked by the CPU in a
 * loop while the device goes; 4 MiB on KEEP's, which must stay there.
 * After the removal every page of the first range is back in system RAM
 * with its data (the driver evicts at removal), both still writable.
 */
static int w_migrated(struct worker *w)
{
	const size_t lg = 8 * MiB, lk = 4 * MiB;
	struct cxl_accel_migrate m;
	struct cxl_accel_hmm_info h;
	uint32_t *pg = map_anon(lg), *pk = map_anon(lk);
	int g = cxla_open_dev(gone_path), k = cxla_open_dev(keep_path), r;
	long bad, on;

	WCHECK(g >= 0 && k >= 0 && pg && pk, "open/mmap: %s", strerror(errno));
	madvise(pg, lg, MADV_NOHUGEPAGE);
	madvise(pk, lk, MADV_NOHUGEPAGE);
	fill_pat(pg, lg, 11);
	fill_pat(pk, lk, 12);
	WCHECK(!cxla_migrate(g, pg, lg, true, &m) && m.migrated == lg / PG,
	       "migrate to %s: %llu of %lu pages", gone_name,
	       (unsigned long long)m.migrated, lg / PG);
	WCHECK(!cxla_migrate(k, pk, lk, true, &m) && m.migrated == lk / PG,
	       "migrate to %s: %llu of %lu pages", keep_name,
	       (unsigned long long)m.migrated, lk / PG);
	fill_pat(pg, lg / 2, 13);	/* CPU writes on device memory */
	WCHECK(snap_count(k, pg, lg, CXL_ACCEL_SNAP_REMOTE) == (long)(lg / PG),
	       "pages not on %s", gone_name);
	WCHECK(!close(g), "close %s", gone_name);	/* the pages stay there */
	w->ready = 1;
	/* the CPU keeps reading while the pages move back */
	while (!sh->gone) {
		bad = check_pat(pg, lg / 2, 13);
		if (bad < 0)
			bad = check_pat_at(pg, lg / 2, lg / 2, 11);
		if (bad >= 0) {
			loop_ended(w, 0);
			WFAIL("data differs at byte %ld while the device went", bad);
		}
		w->ops++;
	}
	loop_ended(w, 0);
	bad = check_pat(pg, lg / 2, 13);
	WCHECK(bad < 0, "first half differs at byte %ld after removal", bad);
	bad = check_pat_at(pg, lg / 2, lg / 2, 11);
	WCHECK(bad < 0, "second half differs at byte %ld after removal", bad);
	on = snap_count(k, pg, lg, CXL_ACCEL_SNAP_LOCAL | CXL_ACCEL_SNAP_REMOTE);
	WCHECK(on == 0, "%ld pages still on device memory after removal", on);
	WCHECK(snap_count(k, pg, lg, CXL_ACCEL_SNAP_PRESENT) == (long)(lg / PG),
	       "pages not present after removal");
	fill_pat(pg, lg, 14);
	WCHECK(check_pat(pg, lg, 14) < 0, "rewrite after removal");
	/* KEEP's pages: untouched, still on KEEP, and they come back */
	on = snap_count(k, pk, lk, CXL_ACCEL_SNAP_LOCAL);
	WCHECK(on == (long)(lk / PG), "%ld of %lu pages on %s after the other device went",
	       on, lk / PG, keep_name);
	WCHECK(check_pat(pk, lk, 12) < 0, "data on %s differs", keep_name);
	r = cxla_migrate(k, pk, lk, false, &m);
	WCHECK(!r && m.migrated == lk / PG, "migrate back from %s: %d, %llu pages",
	       keep_name, r, (unsigned long long)m.migrated);
	WCHECK(check_pat(pk, lk, 12) < 0, "data from %s differs", keep_name);
	WCHECK(!cxla_hmm_info(k, &h) && !h.pool_pages_used, "%s pool pages still used: %llu",
	       keep_name, (unsigned long long)h.pool_pages_used);
	WCHECK(!close(k), "close");
	return wfinish(w, PASS, "%lu pages intact in system RAM (CPU checked them %ld times meanwhile); %lu pages on %s untouched",
		       lg / PG, w->ops, lk / PG, keep_name);
}

/* survivor: commands on KEEP all along; none may fail. */
static int w_survivor(struct worker *w)
{
	const size_t len = 1 * MiB;
	struct cxl_accel_alloc a, b;
	uint8_t *ram = malloc(len);
	uint32_t crc = 0, want;
	int k = cxla_open_dev(keep_path), r = 0;

	WCHECK(k >= 0 && ram, "open %s: %s", keep_path, strerror(errno));
	WCHECK(!cxla_alloc(k, len, 0, &a), "alloc");
	fill_random(ram, len, 9);
	want = crc32c(0, ram, len);
	w->ready = 1;
	while (!sh->stop) {
		r = cxla_copy(k, cxla_user(ram), cxla_dev(a.handle, 0), len, 0);
		if (!r)
			r = cxla_checksum(k, cxla_dev(a.handle, 0), len, 0, &crc);
		if (r || crc != want) {
			loop_ended(w, r);
			WFAIL("round %ld on %s: %d (%s), crc %#x of %#x", w->ops, keep_name,
			      r, strerror(-r), crc, want);
		}
		w->ops++;
	}
	loop_ended(w, 0);
	/* new work after the removal */
	WCHECK(!cxla_alloc(k, 4 * MiB, 0, &b), "new alloc on %s", keep_name);
	WCHECK(!cxla_fill(k, cxla_dev(b.handle, 0), 4 * MiB, 0x1111111111111111ULL, 0),
	       "fill");
	memset(ram, 0x11, len);
	WCHECK(!cxla_checksum(k, cxla_dev(b.handle, 0), len, 0, &crc) &&
	       crc == crc32c(0, ram, len), "checksum of the fill");
	WCHECK(!cxla_free(k, b.handle) && !cxla_free(k, a.handle) && !close(k), "free");
	return wfinish(w, PASS, "%ld rounds of COPY/CHECKSUM on %s, none failed; new buffers work",
		       w->ops, keep_name);
}

static int (*const wfn[W_COUNT])(struct worker *) = {
	w_mmap, w_cmdloop, w_dmabuf, w_import, w_migrated, w_survivor,
};

/* ------------------------------------------------------------ parent */

static bool dev_present(const char *name)
{
	char p[256];

	snprintf(p, sizeof(p), "/sys/class/cxl-accel/%s", name);
	return !access(p, F_OK);
}

/*
 * After every process closed everything: nothing left on KEEP or in the
 * module (removed devices included). Pool pages and buffer frees are
 * deferred, so wait a little for them. The verdict of the check.
 */
static int check_leaks(int k, uint64_t size)
{
	static const char *const zero[] = {
		"buffers", "quarantined", "timeouts", "dmabuf/exports",
		"dmabuf/attachments", "dmabuf/mappings", "dmabuf/pins",
		"dmabuf/imports", "dmabuf/imports_mapped",
	};
	char bad[DETAIL_LEN] = "";
	struct cxl_accel_identify id;
	struct cxl_accel_hmm_info h;
	long live[3] = { -1, -1, -1 }, v;
	int i, t, bi = -1;

	for (t = 0; t < 50; t++) {
		bad[0] = 0;
		if (cxla_hmm_info(k, &h) || h.pool_chunks || h.pool_pages_used)
			snprintf(bad, sizeof(bad), "pool chunks %llu pages %llu",
				 (unsigned long long)h.pool_chunks,
				 (unsigned long long)h.pool_pages_used);
		for (i = 0; i < (int)ARRAY_SIZE(zero) && !bad[0]; i++) {
			v = cxla_sysfs_long(keep_name, zero[i]);
			if (v)
				snprintf(bad, sizeof(bad), "%s %s = %ld", keep_name, zero[i], v);
		}
		if (!bad[0] && (cxla_identify(k, &id) || id.devmem_free != size))
			snprintf(bad, sizeof(bad), "%s: %llu of %llu bytes free", keep_name,
				 (unsigned long long)id.devmem_free, (unsigned long long)size);
		if (!bad[0] && (cxla_dmabuf_module_live(keep_name, live) ||
				live[0] || live[1] || live[2]))
			snprintf(bad, sizeof(bad),
				 "module-wide live exports %ld attachments %ld imports %ld",
				 live[0], live[1], live[2]);
		bi = cxla_debugfs_dmabufs();
		if (!bad[0] && bi)
			snprintf(bad, sizeof(bad), "%d cxl_accel DMA-BUFs in debugfs bufinfo", bi);
		if (!bad[0])
			break;
		usleep(100000);
	}
	if (bad[0]) {
		cxla_result("no_leaks", FAIL, "%s", bad);
		return FAIL;
	}
	cxla_result("no_leaks", PASS, "KEEP: no buffers, pool pages, quarantined requests or DMA-BUF objects, all memory free; module-wide 0 exports/attachments/imports; debugfs bufinfo clean");
	return PASS;
}

static void base_name(const char *path, char *out, size_t len)
{
	const char *s = strrchr(path, '/');

	snprintf(out, len, "%s", s ? s + 1 : path);
}

/* -d GONE -P KEEP: KEEP stays open here (the workers open their own files) */
FIXTURE(removal) {
	int keep;
	struct cxl_accel_identify keep_id;
};

FIXTURE_PEER(removal);

/* A set-up that fails is the result "setup". */
FIXTURE_SETUP(removal)
{
	char link[300];

	c->keep = -1;
	gone_path = cxla_opt.dev;
	keep_path = cxla_opt.peer;
	if (!keep_path) {
		cxla_result("setup", FAIL, "two devices are needed: -d GONE -P KEEP");
		return FAIL;
	}
	base_name(gone_path, gone_name, sizeof(gone_name));
	base_name(keep_path, keep_name, sizeof(keep_name));
	if (!dev_present(gone_name) || !dev_present(keep_name) ||
	    !strcmp(gone_name, keep_name)) {
		cxla_result("setup", FAIL, "%s and %s are not two cxl-accel devices",
			    gone_path, keep_path);
		return FAIL;
	}
	snprintf(link, sizeof(link), "/sys/class/cxl-accel/%s/device", gone_name);
	if (!realpath(link, gone_vdev)) {
		cxla_result("setup", FAIL, "no virtio device for %s", gone_name);
		return FAIL;
	}
	c->keep = cxla_open_dev(keep_path);
	if (c->keep < 0 || cxla_identify(c->keep, &c->keep_id)) {
		cxla_result("setup", FAIL, "open %s: %s", keep_path, strerror(errno));
		return FAIL;
	}
	return PASS;
}

FIXTURE_TEARDOWN(removal)
{
	close(c->keep);
	return verdict;
}

static void kill_workers(const pid_t *pid)
{
	int i;

	for (i = 0; i < W_COUNT; i++)
		kill(pid[i], SIGKILL);
	while (wait(NULL) > 0)
		;
}

/*
 * The removal, one result per check: setup (only when it fails), removed,
 * each process's own (mmap ... survivor), no_leaks.
 */
CXLA_TEST_F(removal, removal)
{
	double t0, t_req, t_cdev;
	pid_t pid[W_COUNT];
	int i, status, verdict = PASS;

	alarm(wait_s + 300);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		cxla_result("setup", FAIL, "mmap");
		return FAIL;
	}
	memset((void *)sh, 0, sizeof(*sh));
	for (i = 0; i < W_COUNT; i++) {
		fflush(stdout);
		pid[i] = fork();
		if (!pid[i]) {
			close(c->keep);
			_exit(wfn[i](&sh->w[i]) == PASS ? 0 : 1);
		}
	}

	/* everyone set up, or a setup failed */
	t0 = now_sec();
	for (;;) {
		int ready = 0, bad = -1;

		for (i = 0; i < W_COUNT; i++) {
			ready += sh->w[i].ready;
			if (sh->w[i].done && !sh->w[i].ready)
				bad = i;
		}
		if (ready == W_COUNT)
			break;
		if (bad >= 0 || now_sec() - t0 > 60) {
			cxla_result("setup", FAIL, "%s: %s", bad >= 0 ? wname[bad] : "timeout",
				    bad >= 0 ? sh->w[bad].detail : "processes not ready in 60 s");
			kill_workers(pid);
			return FAIL;
		}
		usleep(20000);
	}
	printf("UNPLUG-READY %s will be removed, %s stays\n", gone_name, keep_name);
	fflush(stdout);

	/*
	 * The host sends device_del now. The char device goes first, at the
	 * start of remove(); the virtio device once remove() returned.
	 */
	t_req = now_sec();
	while (dev_present(gone_name) && now_sec() - t_req < wait_s)
		usleep(20000);
	t_cdev = now_sec();
	while (!access(gone_vdev, F_OK) && now_sec() - t_req < wait_s)
		usleep(20000);
	if (!access(gone_vdev, F_OK)) {
		cxla_result("removed", FAIL, "%s still there %d s after UNPLUG-READY",
			    dev_present(gone_name) ? gone_name : gone_vdev, wait_s);
		sh->stop = 1;
		kill_workers(pid);
		return FAIL;
	}
	sh->t_gone = now_sec();
	sh->gone = 1;
	cxla_result("removed", PASS, "%s gone %.1f s after UNPLUG-READY, its virtio device %.1f s later",
		    gone_name, t_cdev - t_req, sh->t_gone - t_cdev);

	/* the survivor keeps going a little after the removal */
	{
		long at = sh->w[W_SURVIVOR].ops;

		while (sh->w[W_SURVIVOR].ops < at + 20 && !sh->w[W_SURVIVOR].ended &&
		       now_sec() - sh->t_gone < END_WAIT)
			usleep(20000);
		sh->stop = 1;
	}

	/* every process ends, with its checks, in bounded time */
	for (i = 0; i < W_COUNT; i++) {
		struct worker *w = &sh->w[i];

		while (!w->done && now_sec() - sh->t_gone < END_WAIT + 30)
			usleep(20000);
		if (!w->done) {
			cxla_result(wname[i], FAIL, "%s after the removal (%ld rounds, loop %s)",
				    "hangs 60 s", w->ops, w->ended ? "ended" : "still running");
			kill(pid[i], SIGKILL);
			verdict = FAIL;
			continue;
		}
		if (w->verdict == PASS && w->ended && w->t_end - sh->t_gone > END_WAIT) {
			cxla_result(wname[i], FAIL, "ended %.1f s after the removal: %s",
				    w->t_end - sh->t_gone, w->detail);
			verdict = FAIL;
		} else {
			cxla_result(wname[i], w->verdict, "%s (ended %+.2f s from removal)",
				    w->detail, w->t_end - sh->t_gone);
			if (w->verdict != PASS)
				verdict = FAIL;
		}
	}
	for (i = 0; i < W_COUNT; i++) {
		waitpid(pid[i], &status, 0);
		if (sh->w[i].done && sh->w[i].verdict == PASS &&
		    !(WIFEXITED(status) && !WEXITSTATUS(status))) {
			cxla_result(wname[i], FAIL, "process status %#x", status);
			verdict = FAIL;
		}
	}
	if (check_leaks(c->keep, c->keep_id.devmem_size) != PASS)
		verdict = FAIL;
	return verdict;
}

/* -d DEV -t reload: the check after a reload, only when named */
FIXTURE(one) {
	CXLA_DEVS;
};

FIXTURE_SETUP(one)
{
	return cxla_open_devs(&c->devs, CXLA_NO_PEER);
}

FIXTURE_APPLIES(one)
{
	return false;
}

/* After a reload: all memory free, alloc, fill, checksum. */
CXLA_TEST_F(one, reload)
{
	const size_t len = 8 * MiB;
	struct cxl_accel_alloc a;
	uint8_t *ram = malloc(len);
	uint32_t crc;

	CHECK(ram, "malloc");
	memset(ram, 0x77, len);
	CHECK(c->id.devmem_free == c->id.devmem_size && !c->id.buffers,
	      "%s: %llu of %llu bytes free, %u buffers", c->path,
	      (unsigned long long)c->id.devmem_free,
	      (unsigned long long)c->id.devmem_size, c->id.buffers);
	CHECK(!cxla_alloc(c->fd, len, 0, &a) &&
	      !cxla_fill(c->fd, cxla_dev(a.handle, 0), len, 0x7777777777777777ULL, 0) &&
	      !cxla_checksum(c->fd, cxla_dev(a.handle, 0), len, 0, &crc) &&
	      crc == crc32c(0, ram, len) && !cxla_free(c->fd, a.handle),
	      "%s: alloc/fill/checksum failed", c->path);
	DETAIL("%s (device index %u): all %llu MiB free, alloc/fill/checksum right",
	       c->path, c->id.device_index, (unsigned long long)c->id.devmem_size >> 20);
	return PASS;
}

CXLA_OPTION(wait, "--wait", "SECS")
{
	wait_s = atoi(arg);
}

CXLA_PROGRAM(.name = "unplug-tests", .prefix = "unplug_", .timeout_s = TEST_TIMEOUT_S);
