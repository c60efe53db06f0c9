// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel migration benchmark, one boot, one table: moving anonymous
 * memory to the device and back with MIGRATE_TO_DEV / MIGRATE_TO_RAM
 * (migrate_vma; coherent memory, and private memory where the kernel has
 * it), next to the kernel's move_pages() to a NUMA node of plain RAM and
 * back, measured in the same boot, round after round in turn, so that the
 * ratio carries no boot-to-boot noise. Sizes: 4 KiB pages one call each
 * (128; full form 512), 64 KiB, 2 MiB and 16 MiB ranges (full form: and
 * 256 MiB). Figures are medians of the rounds (--quick 3, else 7), after
 * a round trip of each size that is not counted: the first run of a path
 * pays for what later ones find ready (an emulator translating the code, the
 * daemon mapping guest pages, the driver's RAM reserve filling after its
 * first use). Data is checked after every round trip.
 *
 * The node: -N NODE, else the first node other than 0 that has memory and
 * no CPU (ci/run-guest.sh --ram-node). Without one, only migrate_vma is
 * measured. On a device in NUMA mode, move_pages() to the device's own node
 * is the only target (migrate_vma does not apply there).
 *
 * --sweep measures instead where the driver's CPU copy of small windows
 * stops paying (module parameter cpu_copy_pages): one call each of 1 to 256
 * pages, copied by the device (cpu_copy_pages=0) and by the CPU, round after
 * round in turn, coherent memory; prints the break-even.
 *
 * Usage: hmm-bench [-d /dev/cxl-accelN] [-N NODE] [--quick] [--rounds R]
 *                  [--sweep]
 * Prints a table, one "BENCH" line per size and direction (both figures and
 * "ratio N.NN", migrate_vma / move_pages), then where migrate_vma's time went
 * per page moved (the driver's sysfs migration_stages: setup, destination,
 * copy, migrate, finalize; one "BENCH stages" line each) and a RESULT line.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <sys/syscall.h>
#include <linux/mempolicy.h>

#include "cxla_test.h"

#define MiB		(1024UL * 1024)
#define PG		4096UL
#define MAX_ROUNDS	15
#define MAX_SIZES	5

enum { T_COHERENT, T_PRIVATE, T_MOVE_PAGES, T_COUNT };
static const char *const target_names[T_COUNT] = {
	"coherent", "private", "move_pages",
};

struct size {
	const char *name;
	size_t bytes;
	size_t chunk;		/* bytes per call */
};

/* the driver's stages of a migration window (sysfs migration_stages) */
enum { S_WINDOWS, S_PAGES, S_SETUP, S_DEST, S_COPY, S_MIGRATE, S_FINALIZE,
       S_COUNT };
static const char *const stage_names[S_COUNT] = {
	"windows", "pages", "setup", "destination", "copy", "migrate",
	"finalize",
};

/* seconds per round, per target and direction; the stages, all rounds */
struct fig {
	double s[T_COUNT][2][MAX_ROUNDS];
	unsigned long long stage[T_COUNT][2][S_COUNT];
};

static int fd;
static int node = -1;		/* move_pages() target, -1: none */
static bool have[T_COUNT];
static void **mp_pages;		/* move_pages() arrays, for the largest size */
static int *mp_nodes, *mp_status;

static char stages_path[128];	/* empty: the driver has no stage counters */

/* The stage counters of one kind of window (e.g. "coherent_to_ram"). */
static bool read_stages(const char *kind, unsigned long long *v)
{
	char line[512], name[32];
	bool found = false;
	FILE *f;

	if (!*stages_path || !(f = fopen(stages_path, "r")))
		return false;
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "%31s windows %llu pages %llu setup_ns %llu destination_ns %llu copy_ns %llu migrate_ns %llu finalize_ns %llu",
			       name, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
			       &v[6]) == 8 && !strcmp(name, kind);
	fclose(f);
	return found;
}

static const char *stage_kind(int t, int dir)
{
	static const char *const kinds[2][2] = {
		{ "coherent_to_dev", "coherent_to_ram" },
		{ "private_to_dev", "private_to_ram" },
	};

	return kinds[t == T_PRIVATE][dir];
}

/* anonymous memory without transparent huge pages; NULL on failure */
static void *map_pages(size_t len)
{
	void *p = map_anon(len);

	if (p)
		madvise(p, len, MADV_NOHUGEPAGE);
	return p;
}

static int move_pages_to(void *p, size_t len, int to)
{
	size_t n = len / PG, i;

	for (i = 0; i < n; i++) {
		mp_pages[i] = (uint8_t *)p + i * PG;
		mp_nodes[i] = to;
	}
	if (syscall(SYS_move_pages, 0, n, mp_pages, mp_nodes, mp_status,
		    MPOL_MF_MOVE) < 0)
		return -errno;
	for (i = 0; i < n; i++)
		if (mp_status[i] != to)
			return -EAGAIN;
	return 0;
}

/* One call: the whole of [p, p + len) to the target (to) or back. */
static int move(int t, void *p, size_t len, bool to, uint64_t *moved)
{
	struct cxl_accel_migrate m = { .addr = (uintptr_t)p, .len = len };
	int r;

	if (t == T_MOVE_PAGES) {
		r = move_pages_to(p, len, to ? node : 0);
		*moved = r ? 0 : len / PG;
		return r;
	}
	if (t == T_PRIVATE)
		m.flags = CXL_ACCEL_MIGRATE_PRIVATE;
	r = cxla_ioctl(fd, to ? CXL_ACCEL_IOC_MIGRATE_TO_DEV :
		       CXL_ACCEL_IOC_MIGRATE_TO_RAM, &m);
	*moved = m.migrated;
	return r;
}

/* Round r of size z: every target in turn, there and back. */
static int round_trip(const struct size *z, struct fig *f, int r, uint8_t *p,
		      uint32_t crc)
{
	int t, dir;

	for (t = 0; t < T_COUNT; t++) {
		if (!have[t])
			continue;
		for (dir = 0; dir < 2; dir++) {
			unsigned long long before[S_COUNT], after[S_COUNT];
			bool staged = t != T_MOVE_PAGES &&
				      read_stages(stage_kind(t, dir), before);
			uint64_t moved, total = 0;
			double t0 = now_sec();
			size_t off;
			int e, k;

			for (off = 0; off < z->bytes; off += z->chunk) {
				e = move(t, p + off, z->chunk, dir == 0, &moved);
				if (e) {
					fprintf(stderr, "%s %s %s: %s\n", z->name,
						target_names[t], dir ? "back" : "there",
						strerror(-e));
					return -EIO;
				}
				total += moved;
			}
			f->s[t][dir][r] = now_sec() - t0;
			if (staged && read_stages(stage_kind(t, dir), after))
				for (k = 0; k < S_COUNT; k++)
					f->stage[t][dir][k] += after[k] - before[k];
			if (total != z->bytes / PG) {
				fprintf(stderr, "%s %s: moved %llu pages of %zu\n",
					z->name, target_names[t],
					(unsigned long long)total, z->bytes / PG);
				return -EIO;
			}
		}
		if (crc32c(0, p, z->bytes) != crc)
			return -EILSEQ;
	}
	return 0;
}

#define CPU_COPY_PARAM	"/sys/module/cxl_accel/parameters/cpu_copy_pages"

static int set_cpu_copy(unsigned int pages)
{
	FILE *f = fopen(CPU_COPY_PARAM, "w");
	int r;

	if (!f)
		return -errno;
	r = fprintf(f, "%u\n", pages) < 0 ? -EIO : 0;
	return fclose(f) ? -errno : r;
}

/*
 * Where the CPU copy of a window stops paying: us per call (there and back)
 * of n pages, the device copying and the CPU copying, medians of rounds.
 */
static int sweep(int rounds)
{
	static const unsigned int ns[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256 };
	double s[2][MAX_ROUNDS];
	unsigned int old = 16, i, even = 0;
	FILE *f = fopen(CPU_COPY_PARAM, "r");
	int r, how, e = 0;

	if (!f || fscanf(f, "%u", &old) != 1) {
		printf("RESULT hmm_bench_sweep FAIL %s: %s\n", CPU_COPY_PARAM,
		       strerror(errno));
		return 1;
	}
	fclose(f);
	printf("window copy, us per call there and back (median of %d rounds), coherent memory:\n",
	       rounds);
	printf("  %6s %10s %10s\n", "pages", "device", "CPU");
	for (i = 0; i < ARRAY_SIZE(ns) && !e; i++) {
		size_t len = ns[i] * PG;
		uint8_t *p = map_pages(len);
		uint32_t crc;

		if (!p)
			return 1;
		fill_random(p, len, ns[i]);
		crc = crc32c(0, p, len);
		for (r = 0; r < rounds && !e; r++) {
			for (how = 0; how < 2 && !e; how++) {
				uint64_t moved;
				double t0;

				e = set_cpu_copy(how ? ns[i] : 0);
				t0 = now_sec();
				e = e ?: move(T_COHERENT, p, len, true, &moved);
				e = e ?: move(T_COHERENT, p, len, false, &moved);
				s[how][r] = now_sec() - t0;
				if (!e && crc32c(0, p, len) != crc)
					e = -EILSEQ;
			}
		}
		munmap(p, len);
		if (e)
			break;
		printf("  %6u %10.1f %10.1f\n", ns[i], cxla_median(s[0], rounds) * 1e6,
		       cxla_median(s[1], rounds) * 1e6);
		printf("BENCH cpu_copy pages=%u device_us=%.1f cpu_us=%.1f\n", ns[i],
		       cxla_median(s[0], rounds) * 1e6, cxla_median(s[1], rounds) * 1e6);
		if (cxla_median(s[1], rounds) <= cxla_median(s[0], rounds))
			even = ns[i];
	}
	set_cpu_copy(old);
	if (e) {
		printf("RESULT hmm_bench_sweep FAIL %s\n", strerror(-e));
		return 1;
	}
	printf("RESULT hmm_bench_sweep PASS the CPU copy is as fast or faster up to %u pages per window (cpu_copy_pages is %u); data checked\n",
	       even, old);
	return 0;
}

static double mbs(size_t bytes, double s)
{
	return bytes / s / 1e6;
}

/* The first node other than 0 with memory and no CPU, or -1. */
static int ram_node(void)
{
	char path[96], buf[64];
	int n, found = -1;

	for (n = 1; n < 64 && found < 0; n++) {
		FILE *f;
		bool cpus;

		snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", n);
		f = fopen(path, "r");
		if (!f)
			continue;
		cpus = fgets(buf, sizeof(buf), f) && buf[0] != '\n';
		fclose(f);
		snprintf(path, sizeof(path),
			 "/sys/devices/system/node/node%d/meminfo", n);
		if (!cpus && access(path, R_OK) == 0)
			found = n;
	}
	return found;
}

/* Is the kernel told to zero every page it allocates (init_on_alloc)? */
static const char *init_on_alloc(void)
{
	static char v[16] = "default";
	char cmd[4096], *o;
	FILE *f = fopen("/proc/cmdline", "r");

	if (f) {
		if (fgets(cmd, sizeof(cmd), f) &&
		    (o = strstr(cmd, "init_on_alloc=")))
			sscanf(o + strlen("init_on_alloc="), "%15[^ \n]", v);
		fclose(f);
	}
	return v;
}

/*
 * Where migrate_vma's time went, per page moved, from the driver's stage
 * counters (all rounds): the kernel's collect and unmap (setup), the
 * destination pages, the copy, migrate_vma_pages(), the remap (finalize).
 */
static void print_stages(const struct size *sizes, const struct fig *figs,
			 int nsizes)
{
	int i, t, dir, k;

	if (!*stages_path)
		return;
	printf("migrate_vma stages, us per page moved (kernel command line init_on_alloc=%s: the kernel zeroes every page it allocates unless 0)\n",
	       init_on_alloc());
	printf("  %-9s %-9s %-4s", "size", "memory", "to");
	for (k = S_SETUP; k < S_COUNT; k++)
		printf(" %11s", stage_names[k]);
	printf("\n");
	for (i = 0; i < nsizes; i++)
		for (t = T_COHERENT; t <= T_PRIVATE; t++)
			for (dir = 0; have[t] && dir < 2; dir++) {
				const unsigned long long *v = figs[i].stage[t][dir];

				if (!v[S_PAGES])
					continue;
				printf("  %-9s %-9s %-4s", sizes[i].name,
				       target_names[t], dir ? "RAM" : "dev");
				for (k = S_SETUP; k < S_COUNT; k++)
					printf(" %11.2f", v[k] / 1e3 / v[S_PAGES]);
				printf("\n");
				printf("BENCH stages %s %s %s", sizes[i].name,
				       target_names[t], dir ? "to_ram" : "to_dev");
				for (k = S_SETUP; k < S_COUNT; k++)
					printf(" %s=%.2f", stage_names[k],
					       v[k] / 1e3 / v[S_PAGES]);
				printf("\n");
			}
}

int main(int argc, char **argv)
{
	const char *path = "/dev/cxl-accel0";
	struct size sizes[MAX_SIZES] = {
		{ "4KiBx128", 128 * PG, PG },
		{ "64KiB", 64 * 1024, 64 * 1024 },
		{ "2MiB", 2 * MiB, 2 * MiB },
		{ "16MiB", 16 * MiB, 16 * MiB },
		{ "256MiB", 256 * MiB, 256 * MiB },
	};
	static struct fig figs[MAX_SIZES], warm;
	struct cxl_accel_hmm_info h;
	int nsizes = MAX_SIZES, rounds = 7, i, r, t, dir, node_arg = -2;
	bool quick = false, numa, do_sweep = false;
	size_t maxbytes = 0;
	char summary[512] = "";

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-d") && i + 1 < argc) {
			path = argv[++i];
		} else if (!strcmp(argv[i], "-N") && i + 1 < argc) {
			node_arg = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--quick")) {
			quick = true;
		} else if (!strcmp(argv[i], "--sweep")) {
			do_sweep = true;
		} else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
			rounds = atoi(argv[++i]);
		} else {
			fprintf(stderr, "usage: %s [-d dev] [-N node] [--quick] [--rounds R] [--sweep]\n",
				argv[0]);
			return 2;
		}
	}
	if (quick) {
		nsizes = 4;
		if (rounds == 7)
			rounds = 3;
	} else {
		sizes[0].name = "4KiBx512";
		sizes[0].bytes = 512 * PG;
	}
	if (rounds < 1 || rounds > MAX_ROUNDS) {
		fprintf(stderr, "--rounds: 1 to %d\n", MAX_ROUNDS);
		return 2;
	}
	fd = open(path, O_RDWR);
	if (fd < 0 || cxla_ioctl(fd, CXL_ACCEL_IOC_HMM_INFO, &h)) {
		printf("RESULT hmm_bench FAIL %s: %s\n", path, strerror(errno));
		return 1;
	}
	numa = h.flags & CXL_ACCEL_HMM_NUMA;
	snprintf(stages_path, sizeof(stages_path),
		 "/sys/class/cxl-accel/%s/migration_stages",
		 strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
	if (access(stages_path, R_OK))
		*stages_path = 0;
	if (numa) {
		node = h.numa_node;
	} else {
		have[T_COHERENT] = h.flags & CXL_ACCEL_HMM_COHERENT;
		have[T_PRIVATE] = h.flags & CXL_ACCEL_HMM_PRIVATE;
		node = node_arg >= -1 ? node_arg : ram_node();
	}
	have[T_MOVE_PAGES] = node >= 0;
	if (do_sweep) {
		if (!have[T_COHERENT]) {
			printf("RESULT hmm_bench_sweep FAIL no coherent device memory\n");
			return 1;
		}
		return sweep(rounds);
	}
	if (!have[T_COHERENT] && !have[T_MOVE_PAGES]) {
		printf("RESULT hmm_bench FAIL no migration support (flags %#x) and no RAM node\n",
		       h.flags);
		return 1;
	}
	for (i = 0; i < nsizes; i++)
		if (sizes[i].bytes > maxbytes)
			maxbytes = sizes[i].bytes;
	mp_pages = malloc(maxbytes / PG * sizeof(*mp_pages));
	mp_nodes = malloc(maxbytes / PG * sizeof(*mp_nodes));
	mp_status = malloc(maxbytes / PG * sizeof(*mp_status));
	if (!mp_pages || !mp_nodes || !mp_status)
		return 1;

	for (i = 0; i < nsizes; i++) {
		uint8_t *p = map_pages(sizes[i].bytes);
		uint32_t crc;

		if (!p) {
			printf("RESULT hmm_bench FAIL %s: no memory\n", sizes[i].name);
			return 1;
		}
		fill_random(p, sizes[i].bytes, sizes[i].bytes);
		crc = crc32c(0, p, sizes[i].bytes);
		/* round -1 warms up and is not counted */
		for (r = -1; r < rounds; r++) {
			int e = round_trip(&sizes[i], r < 0 ? &warm : &figs[i],
					   r < 0 ? 0 : r, p, crc);

			if (e) {
				printf("RESULT hmm_bench FAIL %s round %d: %s\n",
				       sizes[i].name, r, strerror(-e));
				return 1;
			}
		}
		munmap(p, sizes[i].bytes);
	}

	printf("migration, %s, MB/s (median of %d rounds, guest wall clock); move_pages() to node %d and back%s\n",
	       path, rounds, node, numa ? " (the device's own node)" : "");
	printf("  %-9s %-7s", "size", "to");
	for (t = 0; t < T_COUNT; t++)
		if (have[t])
			printf(" %11s", target_names[t]);
	if (have[T_MOVE_PAGES] && (have[T_COHERENT] || have[T_PRIVATE]))
		printf("  ratio (migrate_vma / move_pages)");
	printf("\n");
	for (i = 0; i < nsizes; i++) {
		for (dir = 0; dir < 2; dir++) {
			double v[T_COUNT] = { 0 };
			char line[256], *e = line;

			for (t = 0; t < T_COUNT; t++)
				if (have[t])
					v[t] = mbs(sizes[i].bytes,
						   cxla_median(figs[i].s[t][dir], rounds));
			printf("  %-9s %-7s", sizes[i].name, dir ? "RAM" : "target");
			for (t = 0; t < T_COUNT; t++)
				if (have[t])
					printf(" %11.1f", v[t]);
			e += sprintf(e, "BENCH migration %s %s", sizes[i].name,
				     dir ? "to_ram" : "to_target");
			for (t = 0; t < T_COUNT; t++)
				if (have[t])
					e += sprintf(e, " %s=%.1f", target_names[t], v[t]);
			for (t = T_COHERENT; t <= T_PRIVATE; t++) {
				if (!have[t] || !have[T_MOVE_PAGES])
					continue;
				printf("  %s %.2f", target_names[t],
				       v[t] / v[T_MOVE_PAGES]);
				e += sprintf(e, " %sratio %.2f",
					     t == T_COHERENT ? "" : "private_",
					     v[t] / v[T_MOVE_PAGES]);
			}
			printf("\n");
			puts(line);
			if (have[T_COHERENT] && have[T_MOVE_PAGES] &&
			    strlen(summary) < sizeof(summary) - 40)
				sprintf(summary + strlen(summary), "%s%s %s %.2f",
					*summary ? ", " : "", sizes[i].name,
					dir ? "back" : "there",
					v[T_COHERENT] / v[T_MOVE_PAGES]);
		}
	}
	print_stages(sizes, figs, nsizes);
	if (numa)
		printf("RESULT hmm_bench_numa PASS move_pages to node %d and back, %d sizes, data checked\n",
		       node, nsizes);
	else if (have[T_MOVE_PAGES])
		printf("RESULT hmm_bench PASS migrate_vma / move_pages to node %d, one boot: %s; data checked\n",
		       node, summary);
	else
		printf("RESULT hmm_bench PASS migrate_vma only (no RAM node for move_pages), %d sizes, data checked\n",
		       nsizes);
	return 0;
}
