// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: device-coherent against device-private memory, the same
 * workloads on the same pages in one boot.
 *
 * Coherent: the pages move to the device once and CPU and device share them
 * there. Private: coherence is emulated by migration: the device works on
 * its pages in place, a CPU access faults them back to RAM (migrate_to_ram
 * through the device), and before each device phase the driver moves them
 * to the device again; device atomics on system memory take the page
 * exclusively (make_device_exclusive), and the CPU's next access takes it
 * back.
 *
 *   ping-pong: N rounds of device fill, CPU read and check, CPU write,
 *              device checksum, on one buffer;
 *   counter:   CPU threads and the device add to one 64-bit counter at once
 *              for a while; nothing may be lost;
 *   phases:    the device reads and writes a buffer, then the CPU does.
 *
 * For each mode: time per round or phase, operations per second, page
 * migrations (both ways) and CPU faults, from the driver's counters. With a
 * device in NUMA mode (-N /dev/cxl-accelM) the third column is the kernel's
 * move_pages() to its node doing the moves.
 *
 * Usage: mode-bench [-d /dev/cxl-accelN] [-N numa-dev] [--quick]
 * Prints a table and "RESULT mode_bench PASS|FAIL|SKIP".
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>

#include "cxla_test.h"

#define PG		4096UL
#define MiB		(1024UL * 1024)

enum mode { COHERENT, PRIVATE, NUMA, NMODES };
static const char *const mode_names[NMODES] = { "coherent", "private", "NUMA move_pages" };

struct figures {
	bool valid;
	double pp_round_us;	/* ping-pong: time per round */
	double pp_migr;		/* ... pages migrated per round */
	double pp_faults;	/* ... CPU faults per round */
	double ctr_mops;	/* counter: million adds per second */
	double ctr_faults;	/* ... CPU faults */
	double ctr_excl;	/* ... device-exclusive takes */
	double dev_phase_ms, cpu_phase_ms;
	double ph_migr;		/* phases: pages migrated */
};

static int fd, nfd = -1, numa_node = -1;
static bool quick;
static char err[256];

#define BAD(...) do { snprintf(err, sizeof(err), __VA_ARGS__); return -1; } while (0)

/* pages migrated so far: the driver's counters; the kernel's for NUMA */
static uint64_t migrations(int f)
{
	struct cxl_accel_hmm_info h;
	char line[128];
	uint64_t v = 0;
	FILE *vm;

	if (f == nfd) {
		vm = fopen("/proc/vmstat", "r");
		while (vm && fgets(line, sizeof(line), vm))
			if (sscanf(line, "pgmigrate_success %llu",
				   (unsigned long long *)&v) == 1)
				break;
		if (vm)
			fclose(vm);
		return v;
	}
	if (cxla_hmm_info(f, &h))
		return 0;
	/* a CPU fault's page counts in migrated_to_ram */
	return h.migrated_to_dev + h.migrated_to_ram + h.evicted;
}

/* device-exclusive takes so far (ATOMIC_EXCLUSIVE) */
static uint64_t exclusive_takes(int f)
{
	struct cxl_accel_stats st;

	return cxla_stats(f, &st) ? 0 : st.driver[CXL_ACCEL_DSTAT_EXCLUSIVE];
}

static uint64_t cpu_faults(int f)
{
	struct cxl_accel_hmm_info h;

	return cxla_hmm_info(f, &h) ? 0 : h.cpu_faults;
}

/* Put [p, p + len) where the mode's device phase wants it. */
static int to_device(enum mode m, void *p, size_t len)
{
	struct cxl_accel_migrate r;

	if (m == NUMA)
		return cxla_move_pages(p, len, numa_node) < 0 ? -1 : 0;
	return cxla_migrate_flags(fd, p, len, true,
				  m == PRIVATE ? CXL_ACCEL_MIGRATE_PRIVATE : 0, &r);
}

static int svm_op(int f, uint32_t op, void *p, size_t len, uint64_t *value)
{
	struct cxl_accel_svm s = {
		.addr = (uintptr_t)p, .len = len, .op = op, .value = *value,
	};
	int r = cxla_ioctl(f, CXL_ACCEL_IOC_SVM, &s);

	*value = s.value;
	return r;
}

/* ping-pong: device fill, CPU check, CPU write, device checksum */
static int ping_pong(enum mode m, struct figures *fg, int rounds)
{
	size_t len = MiB, i;
	uint64_t *p = map_anon(len), m0, f0, v;
	int dfd = m == NUMA ? nfd : fd, k;
	double t0;

	if (!p)
		BAD("mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	memset(p, 1, len);
	m0 = migrations(dfd);
	f0 = cpu_faults(dfd);
	t0 = now_sec();
	for (k = 0; k < rounds; k++) {
		uint64_t pat = 0x0101010101010101ULL * (uint64_t)(k + 2);

		if ((m != COHERENT || k == 0) && to_device(m, p, len))
			BAD("%s: migration to the device: %s", mode_names[m], strerror(errno));
		v = pat;
		if (svm_op(dfd, CXL_ACCEL_SVM_FILL, p, len, &v))
			BAD("%s: device fill", mode_names[m]);
		for (i = 0; i < len / 8; i += 64)
			if (p[i] != pat)
				BAD("%s: CPU read %#llx at word %zu, round %d", mode_names[m],
				    (unsigned long long)p[i], i, k);
		for (i = 0; i < len / 8; i += 512)
			p[i] = pat + 1;
		v = 0;
		if (svm_op(dfd, CXL_ACCEL_SVM_CHECKSUM, p, len, &v))
			BAD("%s: device checksum", mode_names[m]);
		if ((uint32_t)v != crc32c(0, p, len))
			BAD("%s: device checksum differs from the CPU's, round %d", mode_names[m], k);
	}
	fg->pp_round_us = (now_sec() - t0) / rounds * 1e6;
	fg->pp_migr = (double)(migrations(dfd) - m0) / rounds;
	fg->pp_faults = (double)(cpu_faults(dfd) - f0) / rounds;
	munmap(p, len);
	return 0;
}

/* counter: two CPU threads and the device add at once */
static int counter(enum mode m, struct figures *fg, double secs)
{
	uint64_t *w = map_anon(PG), f0, e0, dev = 0;
	struct cxla_adder ad[2];
	volatile int stop = 0;
	int dfd = m == NUMA ? nfd : fd, i;
	pthread_t t[2];
	struct cxl_accel_atomic a;
	double t0, dt;

	if (!w)
		BAD("mmap");
	*w = 0;
	if (to_device(m, w, PG))
		BAD("%s: migration to the device", mode_names[m]);
	f0 = cpu_faults(dfd);
	e0 = exclusive_takes(dfd);
	for (i = 0; i < 2; i++) {
		ad[i] = (struct cxla_adder){ .word = w, .stop = &stop };
		pthread_create(&t[i], NULL, cxla_cpu_adder, &ad[i]);
	}
	t0 = now_sec();
	while (now_sec() - t0 < secs) {
		memset(&a, 0, sizeof(a));
		a.target = cxla_user(w);
		a.op = CXL_ACCEL_ATOMIC_FETCH_ADD;
		a.width = 8;
		a.operand = 1;
		a.repeat = 1000;
		/* private: the device takes the page back for every batch */
		a.flags = m == PRIVATE ? CXL_ACCEL_ATOMIC_EXCLUSIVE : 0;
		if (cxla_ioctl(dfd, CXL_ACCEL_IOC_ATOMIC, &a)) {
			stop = 1;
			BAD("%s: device atomic: %s", mode_names[m], strerror(errno));
		}
		dev += a.count;
	}
	stop = 1;
	dt = now_sec() - t0;
	for (i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	if (*w != dev + ad[0].adds + ad[1].adds)
		BAD("%s: counter %llu, %llu adds made", mode_names[m],
		    (unsigned long long)*w,
		    (unsigned long long)(dev + ad[0].adds + ad[1].adds));
	fg->ctr_mops = (dev + ad[0].adds + ad[1].adds) / dt / 1e6;
	fg->ctr_faults = cpu_faults(dfd) - f0;
	fg->ctr_excl = exclusive_takes(dfd) - e0;
	munmap(w, PG);
	return 0;
}

/* phases: device reads and writes, then the CPU does, on 16 MiB */
static int phases(enum mode m, struct figures *fg, int passes)
{
	size_t len = 16 * MiB, i;
	uint64_t *p = map_anon(len), m0, v, sum = 0;
	int dfd = m == NUMA ? nfd : fd, k;
	double t0;

	if (!p)
		BAD("mmap");
	madvise(p, len, MADV_NOHUGEPAGE);
	memset(p, 3, len);
	if (to_device(m, p, len))
		BAD("%s: migration to the device", mode_names[m]);
	m0 = migrations(dfd);
	t0 = now_sec();
	for (k = 0; k < passes; k++) {
		v = 0;
		if (svm_op(dfd, CXL_ACCEL_SVM_CHECKSUM, p, len, &v))
			BAD("%s: device checksum", mode_names[m]);
		v = (uint64_t)k;
		if (svm_op(dfd, CXL_ACCEL_SVM_FILL, p, len, &v))
			BAD("%s: device fill", mode_names[m]);
	}
	fg->dev_phase_ms = (now_sec() - t0) * 1e3;
	t0 = now_sec();
	for (k = 0; k < passes; k++) {
		for (i = 0; i < len / 8; i++)
			sum += p[i];
		for (i = 0; i < len / 8; i++)
			p[i] = sum + i;
	}
	fg->cpu_phase_ms = (now_sec() - t0) * 1e3;
	fg->ph_migr = migrations(dfd) - m0;
	munmap(p, len);
	return sum == 42 ? 1 : 0;	/* keeps the loop */
}

static int run_mode(enum mode m, struct figures *fg)
{
	int rounds = quick ? 20 : 200, passes = quick ? 2 : 8;

	if (ping_pong(m, fg, rounds) < 0 || counter(m, fg, quick ? 0.5 : 3) < 0 ||
	    phases(m, fg, passes) < 0)
		return -1;
	fg->valid = true;
	return 0;
}

static void row(const char *what, const struct figures *fg, size_t off,
		const char *fmt)
{
	int m;

	printf("  %-34s", what);
	for (m = 0; m < NMODES; m++) {
		if (fg[m].valid)
			printf(fmt, *(const double *)((const char *)&fg[m] + off));
		else
			printf("%16s", "-");
	}
	printf("\n");
}

int main(int argc, char **argv)
{
	const char *dev = "/dev/cxl-accel0", *ndev = NULL;
	struct figures fg[NMODES] = { 0 };
	struct cxl_accel_hmm_info h;
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-d") && i + 1 < argc)
			dev = argv[++i];
		else if (!strcmp(argv[i], "-N") && i + 1 < argc)
			ndev = argv[++i];
		else if (!strcmp(argv[i], "--quick"))
			quick = true;
		else {
			fprintf(stderr, "usage: %s [-d dev] [-N numa-dev] [--quick]\n", argv[0]);
			return 2;
		}
	}
	fd = open(dev, O_RDWR);
	if (fd < 0 || cxla_hmm_info(fd, &h)) {
		printf("RESULT mode_bench FAIL open %s: %s\n", dev, strerror(errno));
		return 1;
	}
	if (!(h.flags & CXL_ACCEL_HMM_PRIVATE)) {
		printf("RESULT mode_bench SKIP no device-private memory on this kernel (CONFIG_DEVICE_PRIVATE)\n");
		return 0;
	}
	if (ndev) {
		nfd = open(ndev, O_RDWR);
		if (nfd >= 0 && !cxla_hmm_info(nfd, &h) && (h.flags & CXL_ACCEL_HMM_NUMA))
			numa_node = h.numa_node;
	}
	for (i = 0; i < NMODES; i++) {
		if (i == NUMA && numa_node < 0)
			continue;
		if (run_mode(i, &fg[i])) {
			printf("RESULT mode_bench FAIL %s\n", err);
			return 1;
		}
	}
	printf("coherent against private device memory (%s%s):\n", dev,
	       quick ? ", quick" : "");
	printf("  %-34s%16s%16s%16s\n", "", mode_names[0], mode_names[1], mode_names[2]);
	row("ping-pong: us per round", fg, offsetof(struct figures, pp_round_us), "%16.0f");
	row("ping-pong: pages migrated/round", fg, offsetof(struct figures, pp_migr), "%16.1f");
	row("ping-pong: CPU faults/round", fg, offsetof(struct figures, pp_faults), "%16.1f");
	row("counter: million adds/s", fg, offsetof(struct figures, ctr_mops), "%16.2f");
	row("counter: CPU faults", fg, offsetof(struct figures, ctr_faults), "%16.0f");
	row("counter: device-exclusive takes", fg, offsetof(struct figures, ctr_excl), "%16.0f");
	row("phases: device ms", fg, offsetof(struct figures, dev_phase_ms), "%16.1f");
	row("phases: CPU ms", fg, offsetof(struct figures, cpu_phase_ms), "%16.1f");
	row("phases: pages migrated", fg, offsetof(struct figures, ph_migr), "%16.0f");
	printf("RESULT mode_bench PASS ping-pong %.0f us (coherent) vs %.0f us (private) per round; counter %.2f vs %.2f M adds/s\n",
	       fg[COHERENT].pp_round_us, fg[PRIVATE].pp_round_us,
	       fg[COHERENT].ctr_mops, fg[PRIVATE].ctr_mops);
	return 0;
}
