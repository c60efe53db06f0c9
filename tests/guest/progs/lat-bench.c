// SPDX-License-Identifier: GPL-2.0
/*
 * lat-bench: command round trips through /dev/cxl-accelN next to the same
 * measurement on a virtio peer device in the same boot (a 64-byte read of
 * /dev/hwrng, served by vhost-device-rng: one device request per read), and
 * ATOMIC throughput with 1, 2 and 4 threads.
 *
 * Round trip = the time one call takes from user space and back, measured
 * with CLOCK_MONOTONIC around it. The kinds are measured in turns (rounds of
 * a few hundred calls each), so that a slow phase of the host hits them all
 * alike. Prints, per kind, median, p10, p90 and p99 in microseconds:
 *
 *   LAT <label> <kind> n=<calls> median=<us> p10=<us> p90=<us> p99=<us>
 *   RATIO <label> <kind>/rng=<median ratio>
 *   OPS <label> atomic threads=<t> ops/s=<n> scaling=<x of 1 thread>
 *   RESULT latency_bench[_<label>] PASS|FAIL <summary>
 *
 * Usage: lat-bench [--quick] [--rounds N] [--calls N] [--seconds S]
 *                  [--kinds LIST] [--threads LIST] [--rng PATH]
 *                  [--label NAME] [/dev/cxl-accelN]
 *   --kinds LIST    round trips to measure (nop,atomic,copy4k,rng; default all)
 *   --threads LIST  thread counts for ATOMIC ops/s (default 1,2,4; "0": none)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>

#include "cxla_test.h"

enum kind { K_NOP, K_ATOMIC, K_COPY, K_RNG, K_COUNT };
static const char *const kind_name[K_COUNT] = { "nop", "atomic", "copy4k", "rng" };

struct bench {
	int fd;			/* the cxl-accel device */
	int rng;		/* /dev/hwrng, or -1 */
	uint64_t *word;		/* ATOMIC target, user memory */
	void *page;		/* COPY source, user memory */
	uint32_t handle;	/* COPY destination, device memory */
	double *samples[K_COUNT];
	size_t n[K_COUNT];
	int errors[K_COUNT];
};

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* One call of a kind; 0 or -errno. */
static int call(struct bench *b, enum kind k)
{
	char buf[64];

	switch (k) {
	case K_NOP:
		return cxla_nop(b->fd, 0);
	case K_ATOMIC:
		return cxla_atomic(b->fd, cxla_user(b->word),
				   CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 1, 0, 1, 0,
				   NULL);
	case K_COPY:
		return cxla_copy(b->fd, cxla_user(b->page), cxla_dev(b->handle, 0),
				 4096, 0);
	case K_RNG:
		return read(b->rng, buf, sizeof(buf)) == sizeof(buf) ? 0 : -EIO;
	default:
		return -EINVAL;
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double pct(const double *sorted, size_t n, double p)
{
	size_t i = (size_t)(p * (n - 1) + 0.5);

	return n ? sorted[i < n ? i : n - 1] : 0;
}

struct worker {
	pthread_t th;
	const char *dev;
	int cpu;
	volatile int *go;
	double seconds;
	uint64_t ops;
	int err;
};

/* ATOMICs on a word of its own (its own cache line), on one CPU. */
static void *atomic_worker(void *arg)
{
	struct worker *w = arg;
	uint64_t word[16] __attribute__((aligned(64))) = { 0 };
	cpu_set_t set;
	double end;
	int fd;

	CPU_ZERO(&set);
	CPU_SET(w->cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
	fd = open(w->dev, O_RDWR);
	if (fd < 0) {
		w->err = -errno;
		return NULL;
	}
	while (!*w->go)
		sched_yield();
	end = now_us() + w->seconds * 1e6;
	while (now_us() < end) {
		/* between clock reads: the clock costs a little under TCG */
		for (int i = 0; i < 16; i++) {
			int r = cxla_atomic(fd, cxla_user(&word[0]),
					    CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 1, 0,
					    1, 0, NULL);

			if (r) {
				w->err = r;
				goto out;
			}
			w->ops++;
		}
	}
	if (word[0] != w->ops)
		w->err = -EIO;
out:
	close(fd);
	return NULL;
}

/* ATOMIC ops/s with nthreads threads, each on a CPU of its own. */
static double atomic_rate(const char *dev, int nthreads, double seconds, int *err)
{
	struct worker w[64];
	volatile int go = 0;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t total = 0;
	double t0, t;
	int i;

	if (nthreads > 64)
		nthreads = 64;
	for (i = 0; i < nthreads; i++) {
		w[i] = (struct worker){ .dev = dev, .cpu = i % (ncpu > 0 ? ncpu : 1),
					.go = &go, .seconds = seconds };
		pthread_create(&w[i].th, NULL, atomic_worker, &w[i]);
	}
	usleep(20000);
	t0 = now_us();
	go = 1;
	for (i = 0; i < nthreads; i++) {
		pthread_join(w[i].th, NULL);
		total += w[i].ops;
		if (w[i].err)
			*err = w[i].err;
	}
	t = (now_us() - t0) / 1e6;
	return t > 0 ? total / t : 0;
}

int main(int argc, char **argv)
{
	const char *dev = "/dev/cxl-accel0", *rng_path = "/dev/hwrng", *label = "";
	int rounds = 20, calls = 250, quick = 0, i, r, k;
	char threads_list[64] = "1,2,4", kinds[64] = "nop,atomic,copy4k,rng";
	int want[K_COUNT] = { 0 };
	double seconds = 3, med[K_COUNT] = { 0 }, rate1 = 0;
	struct cxl_accel_alloc a;
	struct bench b = { .rng = -1 };
	int failed = 0;
	char summary[512] = "";

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick")) {
			quick = 1;
			rounds = 5;
			calls = 100;
			seconds = 1;
		} else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
			rounds = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--calls") && i + 1 < argc) {
			calls = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
			seconds = atof(argv[++i]);
		} else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
			snprintf(threads_list, sizeof(threads_list), "%s", argv[++i]);
		} else if (!strcmp(argv[i], "--kinds") && i + 1 < argc) {
			snprintf(kinds, sizeof(kinds), "%s", argv[++i]);
		} else if (!strcmp(argv[i], "--label") && i + 1 < argc) {
			label = argv[++i];
		} else if (!strcmp(argv[i], "--rng") && i + 1 < argc) {
			rng_path = argv[++i];
		} else if (argv[i][0] != '-') {
			dev = argv[i];
		} else {
			fprintf(stderr, "lat-bench: unknown argument %s\n", argv[i]);
			return 2;
		}
	}
	for (char *t = strtok(kinds, ","); t; t = strtok(NULL, ","))
		for (k = 0; k < K_COUNT; k++)
			if (!strcmp(t, kind_name[k]))
				want[k] = 1;

	b.fd = open(dev, O_RDWR);
	if (b.fd < 0) {
		printf("RESULT latency_bench FAIL open %s: %s\n", dev, strerror(errno));
		return 1;
	}
	b.rng = want[K_RNG] ? open(rng_path, O_RDONLY) : -1;
	if (want[K_RNG] && b.rng < 0)
		printf("lat-bench: no peer device (%s: %s): rng not measured\n",
		       rng_path, strerror(errno));
	b.word = aligned_alloc(4096, 4096);
	b.page = aligned_alloc(4096, 4096);
	if (!b.word || !b.page || cxla_alloc(b.fd, 4096, 0, &a)) {
		printf("RESULT latency_bench FAIL buffers\n");
		return 1;
	}
	memset(b.word, 0, 4096);
	memset(b.page, 0x5a, 4096);
	b.handle = a.handle;
	for (k = 0; k < K_COUNT; k++)
		b.samples[k] = calloc((size_t)rounds * calls, sizeof(double));

	/* warm-up: page tables, caches, the device's first-use paths */
	for (k = 0; k < K_COUNT; k++)
		for (i = 0; i < 20 && want[k] && (k != K_RNG || b.rng >= 0); i++)
			call(&b, k);

	for (r = 0; r < rounds; r++) {
		for (k = 0; k < K_COUNT; k++) {
			if (!want[k] || (k == K_RNG && b.rng < 0))
				continue;
			for (i = 0; i < calls; i++) {
				double t0 = now_us();
				int e = call(&b, k);
				double t1 = now_us();

				if (e) {
					b.errors[k]++;
					continue;
				}
				b.samples[k][b.n[k]++] = t1 - t0;
			}
		}
	}

	for (k = 0; k < K_COUNT; k++) {
		size_t n = b.n[k];

		if (!n)
			continue;
		qsort(b.samples[k], n, sizeof(double), cmp_double);
		med[k] = pct(b.samples[k], n, 0.5);
		printf("LAT %s %-7s n=%zu median=%.1f p10=%.1f p90=%.1f p99=%.1f errors=%d\n",
		       label, kind_name[k], n, med[k], pct(b.samples[k], n, 0.1),
		       pct(b.samples[k], n, 0.9), pct(b.samples[k], n, 0.99),
		       b.errors[k]);
		if (b.errors[k])
			failed = 1;
	}
	if (med[K_RNG] > 0)
		for (k = 0; k < K_RNG; k++)
			if (med[k] > 0)
				printf("RATIO %s %s/rng=%.2f\n", label, kind_name[k],
				       med[k] / med[K_RNG]);
	snprintf(summary, sizeof(summary),
		 "median us: nop %.1f atomic %.1f copy4k %.1f rng %.1f",
		 med[K_NOP], med[K_ATOMIC], med[K_COPY], med[K_RNG]);

	/*
	 * Thread counts in turns, short slices, several rounds: a host that is
	 * busy now and then hits every count alike; each count's figure is the
	 * median of its slices.
	 */
	int counts[8], ncounts = 0;
	double rates[8][16];
	int slices = quick ? 3 : 9;

	for (char *t = strtok(threads_list, ","); t && ncounts < 8; t = strtok(NULL, ","))
		if (atoi(t) >= 1)
			counts[ncounts++] = atoi(t);
	for (r = 0; r < slices; r++) {
		for (i = 0; i < ncounts; i++) {
			int err = 0;

			rates[i][r] = atomic_rate(dev, counts[i], seconds / slices, &err);
			if (err) {
				printf("lat-bench: %d threads: error %d\n", counts[i], err);
				failed = 1;
			}
		}
	}
	for (i = 0; i < ncounts; i++) {
		double rate;

		qsort(rates[i], slices, sizeof(double), cmp_double);
		rate = rates[i][slices / 2];
		if (counts[i] == 1)
			rate1 = rate;
		printf("OPS %s atomic threads=%d ops/s=%.0f scaling=%.2f (slices %.0f..%.0f)\n",
		       label, counts[i], rate, rate1 > 0 ? rate / rate1 : 0,
		       rates[i][0], rates[i][slices - 1]);
		snprintf(summary + strlen(summary), sizeof(summary) - strlen(summary),
			 ", %dT %.0f/s", counts[i], rate);
	}

	cxla_free(b.fd, b.handle);
	printf("RESULT latency_bench%s%s %s %s\n", *label ? "_" : "", label,
	       failed ? "FAIL" : "PASS", summary);
	return failed;
}
