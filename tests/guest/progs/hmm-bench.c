// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel migration benchmark: throughput of moving anonymous memory to
 * device memory and back (MIGRATE_TO_DEV / MIGRATE_TO_RAM, copies by the
 * device's DMA engine), for single 4 KiB pages (one call each), 2 MiB and a
 * large range (256 MiB; --quick: 16 MiB). On a device in NUMA mode it
 * measures move_pages() to the device's node and back instead, the same
 * sizes. Data is checked after every round trip.
 *
 * Usage: hmm-bench [-d /dev/cxl-accelN] [--quick] [--large MiB] [-n pages]
 * Prints one "BENCH" line per figure, a table, and a RESULT line.
 */
#define _GNU_SOURCE
#include <stdbool.h>

#include "cxla_test.h"

#define MiB		(1024UL * 1024)
#define PG		4096UL

struct fig {
	const char *what;
	size_t bytes;
	unsigned long calls;
	double to_s;		/* seconds, to device (best of runs) */
	double back_s;
};

static int fd;
static bool numa;
static int node = -1;

/* anonymous memory without transparent huge pages; NULL on failure */
static void *map_pages(size_t len)
{
	void *p = map_anon(len);

	if (p)
		madvise(p, len, MADV_NOHUGEPAGE);
	return p;
}

static int mig(void *p, size_t len, bool to_dev, uint64_t *moved)
{
	struct cxl_accel_migrate m = { .addr = (uintptr_t)p, .len = len };
	int r = cxla_ioctl(fd, to_dev ? CXL_ACCEL_IOC_MIGRATE_TO_DEV :
			   CXL_ACCEL_IOC_MIGRATE_TO_RAM, &m);

	*moved = m.migrated;
	return r;
}

/* Move len bytes in calls of chunk bytes, to and back; best of runs. */
static int measure(struct fig *f, size_t len, size_t chunk, int runs)
{
	uint8_t *p = map_pages(len);
	uint32_t crc;
	size_t off;
	int r;

	if (!p)
		return -ENOMEM;
	fill_random(p, len, len + chunk);
	crc = crc32c(0, p, len);
	f->bytes = len;
	f->calls = len / chunk;
	f->to_s = f->back_s = 1e9;
	for (r = 0; r < runs; r++) {
		double t0, t1, t2;
		uint64_t moved, total = 0;

		t0 = now_sec();
		for (off = 0; off < len; off += chunk) {
			if (numa) {
				if (cxla_move_pages(p + off, chunk, node))
					return -EIO;
				continue;
			}
			if (mig(p + off, chunk, true, &moved))
				return -EIO;
			total += moved;
		}
		t1 = now_sec();
		for (off = 0; off < len; off += chunk) {
			if (numa) {
				if (cxla_move_pages(p + off, chunk, 0))
					return -EIO;
				continue;
			}
			if (mig(p + off, chunk, false, &moved))
				return -EIO;
			total += moved;
		}
		t2 = now_sec();
		if (!numa && total != 2 * len / PG) {
			fprintf(stderr, "%s: moved %llu pages of %lu\n", f->what,
				(unsigned long long)total, 2 * len / PG);
			return -EIO;
		}
		if (crc32c(0, p, len) != crc)
			return -EILSEQ;
		if (t1 - t0 < f->to_s)
			f->to_s = t1 - t0;
		if (t2 - t1 < f->back_s)
			f->back_s = t2 - t1;
	}
	munmap(p, len);
	return 0;
}

static double mbs(size_t bytes, double s)
{
	return bytes / s / 1e6;
}

int main(int argc, char **argv)
{
	const char *path = "/dev/cxl-accel0";
	struct cxl_accel_hmm_info h;
	struct fig figs[3] = {
		{ .what = "4 KiB pages, one call each" },
		{ .what = "2 MiB range" },
		{ .what = "large range" },
	};
	size_t large = 256 * MiB, single = 512;
	int i, r, runs2m = 5;
	char what3[64];

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-d") && i + 1 < argc) {
			path = argv[++i];
		} else if (!strcmp(argv[i], "--quick")) {
			large = 16 * MiB;
			single = 128;
			runs2m = 3;
		} else if (!strcmp(argv[i], "--large") && i + 1 < argc) {
			large = strtoul(argv[++i], NULL, 0) * MiB;
		} else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
			single = strtoul(argv[++i], NULL, 0);
		} else {
			fprintf(stderr, "usage: %s [-d dev] [--quick] [--large MiB] [-n pages]\n",
				argv[0]);
			return 2;
		}
	}
	fd = open(path, O_RDWR);
	if (fd < 0 || cxla_ioctl(fd, CXL_ACCEL_IOC_HMM_INFO, &h)) {
		printf("RESULT hmm_bench FAIL %s: %s\n", path, strerror(errno));
		return 1;
	}
	numa = h.flags & CXL_ACCEL_HMM_NUMA;
	node = h.numa_node;
	if (!numa && !(h.flags & CXL_ACCEL_HMM_COHERENT)) {
		printf("RESULT hmm_bench FAIL no migration support (flags %#x)\n", h.flags);
		return 1;
	}
	snprintf(what3, sizeof(what3), "%zu MiB range", large / MiB);
	figs[2].what = what3;

	r = measure(&figs[0], single * PG, PG, 1);
	if (!r)
		r = measure(&figs[1], 2 * MiB, 2 * MiB, runs2m);
	if (!r)
		r = measure(&figs[2], large, large, 1);
	if (r) {
		printf("RESULT hmm_bench FAIL measurement: %s\n", strerror(-r));
		return 1;
	}

	printf("migration throughput, %s (%s), guest wall clock:\n", path,
	       numa ? "NUMA mode: move_pages() to the device node and back" :
		      "MIGRATE_TO_DEV / MIGRATE_TO_RAM, device DMA copies");
	printf("  %-28s %10s %12s %12s %12s %12s\n", "", "bytes", "to dev MB/s",
	       "us/page", "to RAM MB/s", "us/page");
	for (i = 0; i < 3; i++) {
		struct fig *f = &figs[i];
		double np = f->bytes / PG;

		printf("  %-28s %10zu %12.1f %12.2f %12.1f %12.2f\n", f->what,
		       f->bytes, mbs(f->bytes, f->to_s), f->to_s * 1e6 / np,
		       mbs(f->bytes, f->back_s), f->back_s * 1e6 / np);
		printf("BENCH %s %s to_dev_mbs=%.1f to_ram_mbs=%.1f calls=%lu\n",
		       numa ? "move_pages" : "migrate", f->what,
		       mbs(f->bytes, f->to_s), mbs(f->bytes, f->back_s), f->calls);
	}
	printf("RESULT hmm_bench%s PASS %s: 4K x %zu %.1f/%.1f MB/s, 2 MiB %.1f/%.1f MB/s, %zu MiB %.1f/%.1f MB/s (to device/back), data checked\n",
	       numa ? "_numa" : "", numa ? "move_pages" : "migrate", single,
	       mbs(figs[0].bytes, figs[0].to_s), mbs(figs[0].bytes, figs[0].back_s),
	       mbs(figs[1].bytes, figs[1].to_s), mbs(figs[1].bytes, figs[1].back_s),
	       large / MiB, mbs(figs[2].bytes, figs[2].to_s),
	       mbs(figs[2].bytes, figs[2].back_s));
	return 0;
}
