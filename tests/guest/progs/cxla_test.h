/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers shared by the cxl-accel guest test programs: device access,
 * ioctl wrappers that return -errno, a software crc32c, timing; and, in
 * cxla_test.c (linked into every program), reads that may fault, the
 * driver's DMA-BUFs in debugfs and sysfs, move_pages(), a CPU adder thread.
 */
#ifndef CXLA_TEST_H
#define CXLA_TEST_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/dma-buf.h>

#include "uapi/cxl_accel.h"

static inline int cxla_ioctl(int fd, unsigned long req, void *arg)
{
	return ioctl(fd, req, arg) ? -errno : 0;
}

/* A device file, O_CLOEXEC: its fd, or -1 (errno set). */
static inline int cxla_open_dev(const char *path)
{
	return open(path, O_RDWR | O_CLOEXEC);
}

static inline int cxla_identify(int fd, struct cxl_accel_identify *id)
{
	memset(id, 0, sizeof(*id));
	return cxla_ioctl(fd, CXL_ACCEL_IOC_IDENTIFY, id);
}

static inline int cxla_alloc(int fd, uint64_t size, uint64_t align,
			     struct cxl_accel_alloc *a)
{
	memset(a, 0, sizeof(*a));
	a->size = size;
	a->align = align;
	return cxla_ioctl(fd, CXL_ACCEL_IOC_ALLOC, a);
}

/* The free device memory, or ~0 when IDENTIFY fails. */
static inline uint64_t cxla_devmem_free(int fd)
{
	struct cxl_accel_identify id;

	return cxla_identify(fd, &id) ? ~0ULL : id.devmem_free;
}

static inline int cxla_free(int fd, uint32_t handle)
{
	struct cxl_accel_free f = { .handle = handle };

	return cxla_ioctl(fd, CXL_ACCEL_IOC_FREE, &f);
}

/*
 * Map a whole buffer; NULL on failure (errno set). With CXLA_MAP_REGION=1 in
 * the environment, through the CXL region (CXL_ACCEL_MMAP_REGION): the same
 * tests then check loads and stores over CXL.mem.
 */
static inline void *cxla_map(int fd, const struct cxl_accel_alloc *a)
{
	static int region = -1;
	void *p;

	if (region < 0)
		region = getenv("CXLA_MAP_REGION") &&
			 !strcmp(getenv("CXLA_MAP_REGION"), "1");
	p = mmap(NULL, a->alloc_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		 (off_t)(a->mmap_offset | (region ? CXL_ACCEL_MMAP_REGION : 0)));

	return p == MAP_FAILED ? NULL : p;
}

static inline struct cxl_accel_mem cxla_user(const void *p)
{
	struct cxl_accel_mem m = { .addr = (uintptr_t)p, .handle = 0 };

	return m;
}

static inline struct cxl_accel_mem cxla_dev(uint32_t handle, uint64_t off)
{
	struct cxl_accel_mem m = { .addr = off, .handle = handle };

	return m;
}

static inline int cxla_nop(int fd, uint32_t timeout_ms)
{
	struct cxl_accel_nop n = { .timeout_ms = timeout_ms };

	return cxla_ioctl(fd, CXL_ACCEL_IOC_NOP, &n);
}

static inline int cxla_copy(int fd, struct cxl_accel_mem src,
			    struct cxl_accel_mem dst, uint64_t len, uint32_t flags)
{
	struct cxl_accel_copy c = {
		.src = src, .dst = dst, .len = len, .flags = flags,
	};

	return cxla_ioctl(fd, CXL_ACCEL_IOC_COPY, &c);
}

static inline int cxla_fill(int fd, struct cxl_accel_mem dst, uint64_t len,
			    uint64_t pattern, uint32_t flags)
{
	struct cxl_accel_fill f = {
		.dst = dst, .len = len, .pattern = pattern, .flags = flags,
	};

	return cxla_ioctl(fd, CXL_ACCEL_IOC_FILL, &f);
}

static inline int cxla_checksum(int fd, struct cxl_accel_mem src, uint64_t len,
				uint32_t seed, uint32_t *crc)
{
	struct cxl_accel_checksum c = { .src = src, .len = len, .seed = seed };
	int ret = cxla_ioctl(fd, CXL_ACCEL_IOC_CHECKSUM, &c);

	if (!ret)
		*crc = c.crc;
	return ret;
}

static inline int cxla_atomic(int fd, struct cxl_accel_mem target, uint16_t op,
			      uint16_t width, uint64_t operand, uint64_t compare,
			      uint64_t repeat, uint32_t timeout_ms,
			      struct cxl_accel_atomic *out)
{
	struct cxl_accel_atomic a = {
		.target = target, .op = op, .width = width, .operand = operand,
		.compare = compare, .repeat = repeat, .timeout_ms = timeout_ms,
	};
	int ret = cxla_ioctl(fd, CXL_ACCEL_IOC_ATOMIC, &a);

	if (out)
		*out = a;
	return ret;
}

/*
 * Move [p, p + len) to this device's memory or back to RAM (flags:
 * CXL_ACCEL_MIGRATE_PRIVATE for device-private pages); *out gets the counts.
 */
static inline int cxla_migrate_flags(int fd, void *p, size_t len, bool to_dev,
				     uint32_t flags,
				     struct cxl_accel_migrate *out)
{
	struct cxl_accel_migrate m = {
		.addr = (uintptr_t)p, .len = len, .flags = flags,
	};
	int r = cxla_ioctl(fd, to_dev ? CXL_ACCEL_IOC_MIGRATE_TO_DEV :
				CXL_ACCEL_IOC_MIGRATE_TO_RAM, &m);

	if (out)
		*out = m;
	return r;
}

/* Move [p, p + len) to this device's memory or back to RAM; *out gets the counts. */
static inline int cxla_migrate(int fd, void *p, size_t len, bool to_dev,
			       struct cxl_accel_migrate *out)
{
	return cxla_migrate_flags(fd, p, len, to_dev, 0, out);
}

/*
 * An SVM command on [p, p + len) of this process (with device buffer handle
 * at off for the copies): *value in and out (a fill pattern, a checksum),
 * *out gets the whole answer; either may be NULL.
 */
static inline int cxla_svm(int fd, uint32_t op, const void *p, size_t len,
			   uint32_t handle, uint64_t off, uint64_t *value,
			   struct cxl_accel_svm *out)
{
	struct cxl_accel_svm s = {
		.addr = (uintptr_t)p, .len = len, .op = op, .handle = handle,
		.offset = off, .value = value ? *value : 0,
	};
	int r = cxla_ioctl(fd, CXL_ACCEL_IOC_SVM, &s);

	if (!r && value)
		*value = s.value;
	if (out)
		*out = s;
	return r;
}

/* Export buffer handle as a DMA-BUF: e->fd is its file. */
static inline int cxla_export_dmabuf(int fd, uint32_t handle, uint32_t flags,
				     struct cxl_accel_dmabuf_export *e)
{
	memset(e, 0, sizeof(*e));
	e->handle = handle;
	e->flags = flags;
	e->fd = -1;
	return cxla_ioctl(fd, CXL_ACCEL_IOC_EXPORT_DMABUF, e);
}

/* Export with FD_CLOEXEC: the DMA-BUF's fd, or -errno. */
static inline int cxla_export_dmabuf_fd(int fd, uint32_t handle)
{
	struct cxl_accel_dmabuf_export e;
	int r = cxla_export_dmabuf(fd, handle, CXL_ACCEL_DMABUF_CLOEXEC, &e);

	return r ? r : e.fd;
}

/* Import the DMA-BUF dmabuf: im->handle names it in commands. */
static inline int cxla_import_dmabuf(int fd, int dmabuf,
				     struct cxl_accel_dmabuf_import *im)
{
	memset(im, 0, sizeof(*im));
	im->fd = dmabuf;
	return cxla_ioctl(fd, CXL_ACCEL_IOC_IMPORT_DMABUF, im);
}

/* DMA_BUF_IOCTL_SYNC on a DMA-BUF's fd (DMA_BUF_SYNC_* flags). */
static inline int cxla_sync_dmabuf(int dmabuf, uint64_t flags)
{
	struct dma_buf_sync s = { .flags = flags };

	return cxla_ioctl(dmabuf, DMA_BUF_IOCTL_SYNC, &s);
}

static inline int cxla_hmm_info(int fd, struct cxl_accel_hmm_info *h)
{
	memset(h, 0, sizeof(*h));
	return cxla_ioctl(fd, CXL_ACCEL_IOC_HMM_INFO, h);
}

/* A number from /sys/class/cxl-accel/DEV/ATTR, or -1. */
static inline long cxla_sysfs_long(const char *dev, const char *attr)
{
	char p[256], buf[64];
	long v = -1;
	FILE *f;

	snprintf(p, sizeof(p), "/sys/class/cxl-accel/%s/%s", dev, attr);
	f = fopen(p, "r");
	if (!f)
		return -1;
	if (fgets(buf, sizeof(buf), f))
		v = strtol(buf, NULL, 0);
	fclose(f);
	return v;
}

static inline int cxla_stats(int fd, struct cxl_accel_stats *st)
{
	memset(st, 0, sizeof(*st));
	return cxla_ioctl(fd, CXL_ACCEL_IOC_STATS, st);
}

/* crc32c (Castagnoli, reflected), crc = ~update(~seed, data) */
static uint32_t crc32c_table[256];

static inline void crc32c_init(void)
{
	uint32_t i, j, c;

	for (i = 0; i < 256; i++) {
		c = i;
		for (j = 0; j < 8; j++)
			c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		crc32c_table[i] = c;
	}
}

static inline uint32_t crc32c(uint32_t seed, const void *data, size_t len)
{
	const uint8_t *p = data;
	uint32_t c = ~seed;

	if (!crc32c_table[1])
		crc32c_init();
	while (len--)
		c = crc32c_table[(c ^ *p++) & 0xff] ^ (c >> 8);
	return ~c;
}

static inline double now_sec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * Soak runner: forks N processes running FN(i, ARG) (their exit status is its
 * result; one that outlives SECS + 180 s ends by SIGALRM) and waits for all of
 * them, calling PROGRESS(PARG, seconds so far) once a minute on runs of 300 s
 * or more. Returns the index of the first process that failed, with its wait
 * status in *STATUS, or -1.
 */
#define CXLA_SOAK_MAX_PROCS	16
static inline int cxla_soak_procs(int n, int secs, int (*fn)(int i, void *arg),
				  void *arg, void (*progress)(void *parg, double t),
				  void *parg, int *status)
{
	pid_t pids[CXLA_SOAK_MAX_PROCS];
	double t0 = now_sec(), last = t0;
	int i, st, left = n, failed = -1;

	for (i = 0; i < n; i++) {
		pids[i] = fork();
		if (!pids[i]) {
			alarm(secs + 180);	/* a hang ends as a failure */
			_exit(fn(i, arg) ? 1 : 0);
		}
	}
	while (left) {
		pid_t p = waitpid(-1, &st, WNOHANG);

		if (p > 0) {
			for (i = 0; i < n && pids[i] != p; i++)
				;
			if (i < n && failed < 0 &&
			    (!WIFEXITED(st) || WEXITSTATUS(st))) {
				failed = i;
				*status = st;
			}
			left--;
			continue;
		}
		if (secs >= 300 && now_sec() - last >= 60) {
			last = now_sec();
			progress(parg, last - t0);
		}
		usleep(100000);
	}
	return failed;
}

/* xorshift64*: fast deterministic pattern data */
static inline uint64_t rnd64(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1DULL;
}

static inline void fill_random(void *buf, size_t len, uint64_t seed)
{
	uint64_t s = seed | 1, v;
	uint8_t *p = buf;
	size_t i;

	for (i = 0; i + 8 <= len; i += 8) {
		v = rnd64(&s);
		memcpy(p + i, &v, 8);
	}
	for (; i < len; i++)
		p[i] = (uint8_t)rnd64(&s);
}

/* Whether len bytes at p all hold v */
static inline bool cxla_all_bytes(const uint8_t *p, size_t len, uint8_t v)
{
	uint64_t w = 0x0101010101010101ULL * v, x;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		memcpy(&x, p + i, 8);
		if (x != w)
			return false;
	}
	for (; i < len; i++)
		if (p[i] != v)
			return false;
	return true;
}

/* Whether len bytes at p hold a FILL's 64-bit pattern, from its phase 0 */
static inline bool cxla_holds_pattern(const uint8_t *p, size_t len, uint64_t pat)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (p[i] != (uint8_t)(pat >> (8 * (i % 8))))
			return false;
	return true;
}

/* private anonymous memory; NULL on failure */
static inline void *map_anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/* ------------------------------------------------ cxla_test.c */

/*
 * Run fn(arg), catching the SIGBUS or SIGSEGV it may raise: 0 when fn
 * returned, else the signal, with its si_code in *si_code (may be NULL).
 * Not for two threads at once.
 */
int cxla_catch_fault(void (*fn)(void *arg), void *arg, int *si_code);

/* Read the byte at p: 0 (*val set), or the signal the read raised. */
int cxla_probe_read(const volatile void *p, uint8_t *val, int *si_code);

/* DMA-BUFs of this driver in the kernel's list (debugfs bufinfo), or -1. */
int cxla_debugfs_dmabufs(void);

/*
 * Module-wide live DMA-BUF exports, attachments and imports, from device
 * dev's dmabuf/module_live (any device says the same): 0, or -1.
 */
int cxla_dmabuf_module_live(const char *dev, long live[3]);

/*
 * move_pages() of every page of [p, p + len) to node: the pages that did
 * not get there, or -errno.
 */
long cxla_move_pages(void *p, size_t len, int node);

/*
 * A thread (pthread_create(..., cxla_cpu_adder, a)) that adds 1 to *word
 * with atomic CPU adds until *stop, counting them in adds.
 */
struct cxla_adder {
	volatile uint64_t *word;
	volatile int *stop;
	uint64_t adds;
};
void *cxla_cpu_adder(void *arg);

/*
 * The median of v[0..n): the middle value, the mean of the middle two for
 * an even n, 0 for none. Sorts v.
 */
double cxla_median(double *v, int n);

/* Write s to a sysfs or procfs file: 0 or -errno (the file's own refusal) */
int cxla_write_str(const char *path, const char *s);

/*
 * Verdicts of a test (the exit status of its child process), and the length
 * of its detail; the harness (cxla_harness.h) has the rest.
 */
enum { PASS, FAIL, SKIP };

#define DETAIL_LEN	500

#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))

#endif /* CXLA_TEST_H */
