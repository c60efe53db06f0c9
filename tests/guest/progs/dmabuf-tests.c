// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel DMA-BUF tests: export, import, peer-to-peer between devices,
 * udmabuf and DMA heap imports, lifetime and revocation. Tests on the
 * harness of cxla_harness.h, each in its own child process, one line each:
 *
 *   RESULT dmabuf.<name> PASS|FAIL|SKIP <detail>
 *
 * Usage: dmabuf-tests [-t name]... [-l]
 *        dmabuf-tests --bench [--full] [SIZE_MiB...]
 *        dmabuf-tests --soak SECS   (under daemon restarts: run-soak.sh)
 *
 * Devices are every /dev/cxl-accelN (sorted); "dev0" exports and "dev1"
 * imports. Tests that need two devices are skipped with one. The revocation
 * test unbinds dev0 from the driver and binds it again.
 *
 * --bench: copy bandwidth from a buffer of dev0 to a buffer of dev1,
 * peer-to-peer through an imported DMA-BUF (push by dev0, pull by dev1),
 * next to the same copy bounced through system RAM (dev0 -> RAM, RAM ->
 * dev1) and a CPU memcpy between the two mappings. Default sizes 2 and 32
 * MiB (3 runs each); --full: 2 and 256 MiB, 5 runs (give the devices 1 GiB:
 * ci/run-guest.sh --devmem-size 1G).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <linux/dma-buf.h>
#include <linux/dma-heap.h>
#include <linux/udmabuf.h>

#include "cxla_harness.h"

#define KiB		1024ULL
#define MiB		(1024 * KiB)
#define TEST_TIMEOUT_S	240
#define MAX_DEVS	8

/* every test: every device, opened and identified */
FIXTURE(devs) {
	int ndev;
	char path[MAX_DEVS][64];
	char name[MAX_DEVS][32];	/* cxl-accelN */
	int fd[MAX_DEVS];
	struct cxl_accel_identify id[MAX_DEVS];
};

#define NEED2() do {							\
	if (c->ndev < 2) {						\
		DETAIL("needs two devices, found %d", c->ndev);		\
		return SKIP;						\
	}								\
} while (0)

/* ------------------------------------------------------------ helpers */

static bool uuid_zero(const uint8_t *u)
{
	int i;

	for (i = 0; i < 16; i++)
		if (u[i])
			return false;
	return true;
}

static void uuid_str(const uint8_t *u, char *out)
{
	int i, n = 0;

	for (i = 0; i < 16; i++)
		n += sprintf(out + n, "%s%02x",
			     (i == 4 || i == 6 || i == 8 || i == 10) ? "-" : "",
			     u[i]);
}

/* A DMA-BUF counter of DEV (its sysfs dmabuf/ directory), or -1. */
static long sysfs_long(const char *dev, const char *attr)
{
	char a[128];

	snprintf(a, sizeof(a), "dmabuf/%s", attr);
	return cxla_sysfs_long(dev, a);
}

/* Does the kernel's PCI P2PDMA decide who reaches DEV's memory (7.x)? */
static bool p2p_by_kernel(const char *dev)
{
	char p[256], buf[32] = "";
	FILE *f;

	snprintf(p, sizeof(p), "/sys/class/cxl-accel/%s/dmabuf/p2p_path", dev);
	f = fopen(p, "r");
	if (f) {
		if (!fgets(buf, sizeof(buf), f))
			buf[0] = 0;
		fclose(f);
	}
	return !strncmp(buf, "pci-p2pdma", 10);
}

static uint64_t p2p_bytes(int fd)
{
	struct cxl_accel_stats st;

	if (cxla_stats(fd, &st))
		return ~0ULL;
	return st.device[CXL_ACCEL_STAT_BYTES_P2P];
}

static void *map_fd(int fd, size_t len, off_t off)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);

	return p == MAP_FAILED ? NULL : p;
}

static int mmap_err(int fd, size_t len, off_t off, int flags)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, fd, off);

	if (p != MAP_FAILED) {
		munmap(p, len);
		return 0;
	}
	return -errno;
}

static uint32_t pattern_crc(size_t len, uint64_t pat)
{
	uint8_t *b = malloc(len);
	uint32_t crc;
	size_t i;

	for (i = 0; i < len; i++)
		b[i] = (uint8_t)(pat >> (8 * (i % 8)));
	crc = crc32c(0, b, len);
	free(b);
	return crc;
}

static int discover(FIXTURE_DATA(devs) *c)
{
	struct dirent **list;
	int n, i;

	c->ndev = 0;
	n = scandir("/sys/class/cxl-accel", &list, NULL, versionsort);
	for (i = 0; i < n; i++) {
		if (!strncmp(list[i]->d_name, "cxl-accel", 9) &&
		    c->ndev < MAX_DEVS) {
			snprintf(c->name[c->ndev], sizeof(c->name[0]), "%s",
				 list[i]->d_name);
			snprintf(c->path[c->ndev], sizeof(c->path[0]), "/dev/%s",
				 list[i]->d_name);
			c->ndev++;
		}
		free(list[i]);
	}
	if (n >= 0)
		free(list);
	for (i = 0; i < c->ndev; i++) {
		c->fd[i] = open(c->path[i], O_RDWR | O_CLOEXEC);
		if (c->fd[i] < 0 || cxla_identify(c->fd[i], &c->id[i]))
			return -1;
	}
	return c->ndev ? 0 : -1;
}

FIXTURE_SETUP(devs)
{
	if (discover(c)) {
		DETAIL("no usable /dev/cxl-accelN (%d found)", c->ndev);
		return FAIL;
	}
	return PASS;
}

/* the importing device: dev1, or dev0 itself with one device */
static int imp_dev(const FIXTURE_DATA(devs) *c)
{
	return c->ndev > 1 ? 1 : 0;
}

/* ------------------------------------------------------------ tests */

CXLA_TEST_F(devs, export_basic)
{
	struct cxl_accel_dmabuf_export e, e2, e3;
	struct cxl_accel_alloc a;
	long ex0 = sysfs_long(c->name[0], "exports");
	long tot0 = sysfs_long(c->name[0], "exports_total");
	struct stat st, st2;
	char us[40];
	int bi;

	OK(cxla_alloc(c->fd[0], 1 * MiB + 4096, 0, &a));
	OK(cxla_export_dmabuf(c->fd[0], a.handle, CXL_ACCEL_DMABUF_CLOEXEC, &e));
	CHECK(e.fd >= 0, "fd %d", e.fd);
	CHECK(e.size == a.alloc_size, "size %llu, buffer %llu",
	      (unsigned long long)e.size, (unsigned long long)a.alloc_size);
	CHECK(!uuid_zero(e.uuid), "zero uuid");
	CHECK(fcntl(e.fd, F_GETFD) & FD_CLOEXEC, "no FD_CLOEXEC");
	CHECK(lseek(e.fd, 0, SEEK_END) == (off_t)e.size, "lseek(SEEK_END) %lld",
	      (long long)lseek(e.fd, 0, SEEK_END));
	CHECK(lseek(e.fd, 0, SEEK_SET) == 0, "lseek(SEEK_SET)");
	CHECK((fcntl(e.fd, F_GETFL) & O_ACCMODE) == O_RDWR, "not O_RDWR");

	/* exporting again: the same DMA-BUF, the same UUID */
	OK(cxla_export_dmabuf(c->fd[0], a.handle, 0, &e2));
	CHECK(!(fcntl(e2.fd, F_GETFD) & FD_CLOEXEC), "FD_CLOEXEC without flag");
	CHECK(!fstat(e.fd, &st) && !fstat(e2.fd, &st2) && st.st_ino == st2.st_ino,
	      "second export is another DMA-BUF (ino %lu vs %lu)",
	      (unsigned long)st.st_ino, (unsigned long)st2.st_ino);
	CHECK(!memcmp(e.uuid, e2.uuid, 16), "second export has another uuid");
	CHECK(sysfs_long(c->name[0], "exports") == ex0 + 1, "exports %ld, was %ld",
	      sysfs_long(c->name[0], "exports"), ex0);
	CHECK(sysfs_long(c->name[0], "exports_total") == tot0 + 1,
	      "exports_total %ld, was %ld",
	      sysfs_long(c->name[0], "exports_total"), tot0);
	bi = cxla_debugfs_dmabufs();
	CHECK(bi >= 1, "debugfs dma_buf/bufinfo lists %d cxl_accel buffers", bi);
	close(e.fd);
	CHECK(sysfs_long(c->name[0], "exports") == ex0 + 1, "closed one of two fds");
	close(e2.fd);
	CHECK(sysfs_long(c->name[0], "exports") == ex0, "exports %ld after close, was %ld",
	      sysfs_long(c->name[0], "exports"), ex0);

	/* a new export after release: the device accepted UNEXPORT */
	OK(cxla_export_dmabuf(c->fd[0], a.handle, 0, &e3));
	CHECK(memcmp(e.uuid, e3.uuid, 16), "same uuid after release");
	close(e3.fd);
	OK(cxla_free(c->fd[0], a.handle));
	uuid_str(e.uuid, us);
	DETAIL("size %llu, uuid %s, re-export same inode and uuid, FD_CLOEXEC, lseek, bufinfo %d",
	       (unsigned long long)e.size, us, bi);
	return PASS;
}

CXLA_TEST_F(devs, self_import)
{
	const size_t len = 2 * MiB;
	struct cxl_accel_dmabuf_export e;
	struct cxl_accel_dmabuf_import im;
	struct cxl_accel_alloc a;
	uint8_t *p, *ram = malloc(len);
	uint32_t crc;
	long imps0 = sysfs_long(c->name[0], "imports");

	CHECK(ram, "malloc");
	OK(cxla_alloc(c->fd[0], len, 0, &a));
	p = cxla_map(c->fd[0], &a);
	CHECK(p, "mmap: %s", strerror(errno));
	OK(cxla_export_dmabuf(c->fd[0], a.handle, CXL_ACCEL_DMABUF_CLOEXEC, &e));
	OK(cxla_import_dmabuf(c->fd[0], e.fd, &im));
	CHECK(im.kind == CXL_ACCEL_IMPORT_SELF, "kind %u", im.kind);
	CHECK(im.handle & CXL_ACCEL_HANDLE_IMPORTED, "handle %#x", im.handle);
	CHECK(im.size == len, "size %llu", (unsigned long long)im.size);
	CHECK(!memcmp(im.uuid, e.uuid, 16), "importer sees another uuid");
	CHECK(im.attach_flags & CXL_ACCEL_IMPORT_DYNAMIC, "flags %#x",
	      im.attach_flags);
	CHECK(sysfs_long(c->name[0], "imports") == imps0 + 1, "imports %ld",
	      sysfs_long(c->name[0], "imports"));
	CHECK(sysfs_long(c->name[0], "attachments") >= 1, "attachments %ld",
	      sysfs_long(c->name[0], "attachments"));

	fill_random(p, len, 11);
	OK(cxla_checksum(c->fd[0], cxla_dev(im.handle, 0), len, 0, &crc));
	CHECK(crc == crc32c(0, p, len), "checksum through import %#x, cpu %#x",
	      crc, crc32c(0, p, len));
	OK(cxla_fill(c->fd[0], cxla_dev(im.handle, 4096 + 13), 100000,
		     0x1122334455667788ULL, 0));
	CHECK(cxla_holds_pattern(p + 4096 + 13, 100000, 0x1122334455667788ULL),
	      "fill through import not seen by the CPU");
	fill_random(ram, len, 12);
	OK(cxla_copy(c->fd[0], cxla_user(ram), cxla_dev(im.handle, 0), len, 0));
	CHECK(!memcmp(p, ram, len), "copy into import differs");
	memset(ram, 0, len);
	OK(cxla_copy(c->fd[0], cxla_dev(im.handle, 8192), cxla_user(ram), len - 8192, 0));
	CHECK(!memcmp(p + 8192, ram, len - 8192), "copy out of import differs");
	close(e.fd);	/* the import keeps the DMA-BUF */
	OK(cxla_checksum(c->fd[0], cxla_dev(im.handle, 0), len, 0, &crc));
	OK(cxla_free(c->fd[0], im.handle));
	CHECK(sysfs_long(c->name[0], "imports") == imps0, "imports %ld after FREE",
	      sysfs_long(c->name[0], "imports"));
	EXPECT_ERR(cxla_free(c->fd[0], im.handle), ENOENT);
	munmap(p, len);
	OK(cxla_free(c->fd[0], a.handle));
	free(ram);
	DETAIL("%s imports its own 2 MiB: checksum, fill, copy in and out; flags %#x, %u segments",
	       c->name[0], im.attach_flags, im.nr_segments);
	return PASS;
}

CXLA_TEST_F(devs, cross_device_p2p)
{
	const size_t len = 4 * MiB;
	struct cxl_accel_dmabuf_export ea, eb;
	struct cxl_accel_dmabuf_import ia, ib;
	struct cxl_accel_alloc a, b;
	struct cxl_accel_atomic at;
	uint64_t p2p1, p2p0, d1, d0;
	uint8_t *pa, *pb;
	uint32_t crc;

	NEED2();
	OK(cxla_alloc(c->fd[0], len, 0, &a));
	OK(cxla_alloc(c->fd[1], len, 0, &b));
	pa = cxla_map(c->fd[0], &a);
	pb = cxla_map(c->fd[1], &b);
	CHECK(pa && pb, "mmap");
	OK(cxla_export_dmabuf(c->fd[0], a.handle, CXL_ACCEL_DMABUF_CLOEXEC, &ea));
	OK(cxla_import_dmabuf(c->fd[1], ea.fd, &ia));
	CHECK(ia.kind == CXL_ACCEL_IMPORT_PEER, "kind %u", ia.kind);
	if (!(ia.attach_flags & CXL_ACCEL_IMPORT_P2P) && p2p_by_kernel(c->name[0])) {
		/* dmabuf.no_p2p_fallback covers the mapping the importer got */
		DETAIL("the kernel's PCI P2PDMA refuses this topology (devices on the root bus: nothing but a switch or an allowlisted host bridge joins them; ci/run-guest.sh --switch)");
		return SKIP;
	}
	CHECK(ia.attach_flags & CXL_ACCEL_IMPORT_P2P,
	      "exporter refused a peer-to-peer attachment (flags %#x)",
	      ia.attach_flags);
	CHECK(!memcmp(ia.uuid, ea.uuid, 16), "uuid differs");
	CHECK(sysfs_long(c->name[0], "p2p_attachments") >= 1,
	      "exporter counts %ld p2p attachments",
	      sysfs_long(c->name[0], "p2p_attachments"));

	/* dev1 pushes its buffer into dev0's memory through the import */
	fill_random(pb, len, 21);
	p2p1 = p2p_bytes(c->fd[1]);
	OK(cxla_copy(c->fd[1], cxla_dev(b.handle, 0), cxla_dev(ia.handle, 0), len, 0));
	d1 = p2p_bytes(c->fd[1]) - p2p1;
	CHECK(!memcmp(pa, pb, len), "dev1 -> dev0 (import): data differs");
	CHECK(d1 == len, "dev1 counted %llu peer-to-peer bytes for a %zu byte copy",
	      (unsigned long long)d1, len);

	/* dev1 pulls from dev0's memory */
	fill_random(pa, len, 22);
	p2p1 = p2p_bytes(c->fd[1]);
	OK(cxla_copy(c->fd[1], cxla_dev(ia.handle, 0), cxla_dev(b.handle, 0), len, 0));
	CHECK(!memcmp(pa, pb, len), "dev0 (import) -> dev1: data differs");
	CHECK(p2p_bytes(c->fd[1]) - p2p1 == len, "pull counted %llu p2p bytes",
	      (unsigned long long)(p2p_bytes(c->fd[1]) - p2p1));

	/* checksum and atomics on the peer's memory */
	OK(cxla_checksum(c->fd[1], cxla_dev(ia.handle, 12345), 1 * MiB, 0, &crc));
	CHECK(crc == crc32c(0, pa + 12345, 1 * MiB), "peer checksum %#x", crc);
	*(volatile uint64_t *)(pa + 4096) = 40;
	OK(cxla_atomic(c->fd[1], cxla_dev(ia.handle, 4096),
		       CXL_ACCEL_ATOMIC_FETCH_ADD, 8, 2, 0, 1, 0, &at));
	CHECK(at.result == 40 && *(volatile uint64_t *)(pa + 4096) == 42,
	      "peer atomic: old %llu, now %llu", (unsigned long long)at.result,
	      (unsigned long long)*(volatile uint64_t *)(pa + 4096));

	/* and the other way: dev0 pushes into dev1's exported buffer */
	OK(cxla_export_dmabuf(c->fd[1], b.handle, CXL_ACCEL_DMABUF_CLOEXEC, &eb));
	OK(cxla_import_dmabuf(c->fd[0], eb.fd, &ib));
	CHECK(ib.kind == CXL_ACCEL_IMPORT_PEER && (ib.attach_flags & CXL_ACCEL_IMPORT_P2P),
	      "reverse import kind %u flags %#x", ib.kind, ib.attach_flags);
	fill_random(pa, len, 23);
	p2p0 = p2p_bytes(c->fd[0]);
	OK(cxla_copy(c->fd[0], cxla_dev(a.handle, 0), cxla_dev(ib.handle, 0), len, 0));
	d0 = p2p_bytes(c->fd[0]) - p2p0;
	CHECK(!memcmp(pa, pb, len), "dev0 -> dev1 (import): data differs");
	CHECK(d0 == len, "dev0 counted %llu p2p bytes", (unsigned long long)d0);

	OK(cxla_free(c->fd[1], ia.handle));
	OK(cxla_free(c->fd[0], ib.handle));
	close(ea.fd);
	close(eb.fd);
	munmap(pa, len);
	munmap(pb, len);
	OK(cxla_free(c->fd[0], a.handle));
	OK(cxla_free(c->fd[1], b.handle));
	DETAIL("4 MiB each way by bus address (%u and %u segments): push, pull, checksum, atomic; BYTES_P2P +%llu on %s, +%llu on %s",
	       ia.nr_segments, ib.nr_segments, (unsigned long long)d1,
	       c->name[1], (unsigned long long)d0, c->name[0]);
	return PASS;
}

CXLA_TEST_F(devs, mmap_coherency)
{
	const size_t len = 1 * MiB;
	struct cxl_accel_alloc a;
	uint8_t *p, *q, *r;
	uint32_t crc;
	int fd;

	OK(cxla_alloc(c->fd[0], len, 0, &a));
	fd = cxla_export_dmabuf_fd(c->fd[0], a.handle);
	CHECK(fd >= 0, "export: %s", strerror(-fd));
	p = map_fd(fd, len, 0);			/* the DMA-BUF */
	q = cxla_map(c->fd[0], &a);		/* the driver's own mmap */
	r = map_fd(fd, 64 * KiB, 64 * KiB);	/* a window at an offset */
	CHECK(p && q && r, "mmap: %s", strerror(errno));

	OK(cxla_sync_dmabuf(fd, DMA_BUF_SYNC_START | DMA_BUF_SYNC_RW));
	fill_random(p, len, 31);
	OK(cxla_sync_dmabuf(fd, DMA_BUF_SYNC_END | DMA_BUF_SYNC_RW));
	OK(cxla_checksum(c->fd[0], cxla_dev(a.handle, 0), len, 0, &crc));
	CHECK(crc == crc32c(0, p, len), "device crc %#x of CPU writes through the DMA-BUF, cpu %#x",
	      crc, crc32c(0, p, len));
	CHECK(!memcmp(p, q, len), "DMA-BUF and driver mappings differ");

	/* no sync at all: coherent */
	OK(cxla_fill(c->fd[0], cxla_dev(a.handle, 0), len, 0xa5a5a5a55a5a5a5aULL, 0));
	CHECK(cxla_holds_pattern(p, len, 0xa5a5a5a55a5a5a5aULL), "device fill not seen through the DMA-BUF");
	CHECK(cxla_holds_pattern(r, 64 * KiB, 0xa5a5a5a55a5a5a5aULL), "window mapping");
	q[100] = 0x77;
	CHECK(p[100] == 0x77, "CPU store through one mapping not seen in the other");
	r[5] = 0x66;
	CHECK(p[64 * KiB + 5] == 0x66, "window maps the wrong offset");

	CHECK(cxla_sync_dmabuf(fd, DMA_BUF_SYNC_START | 0x100) == -EINVAL, "bad sync flags accepted");
	CHECK(mmap_err(fd, len + 4096, 0, MAP_SHARED) == -EINVAL, "mmap beyond the size");
	CHECK(mmap_err(fd, 4096, len, MAP_SHARED) == -EINVAL, "mmap at the end");
	CHECK(mmap_err(fd, 4096, 0, MAP_PRIVATE) == -EINVAL, "MAP_PRIVATE accepted");
	munmap(r, 64 * KiB);
	munmap(q, len);
	munmap(p, len);
	close(fd);
	OK(cxla_free(c->fd[0], a.handle));
	DETAIL("CPU writes through the DMA-BUF mmap seen by the device and by the driver's mmap, device fill seen at once, offset window; bad mmaps EINVAL");
	return PASS;
}

CXLA_TEST_F(devs, close_while_mapped)
{
	const size_t len = 2 * MiB;
	long ex0 = sysfs_long(c->name[0], "exports");
	uint64_t free0 = cxla_devmem_free(c->fd[0]), f;
	struct cxl_accel_alloc a;
	int dfd, fd;
	uint8_t *p;

	dfd = open(c->path[0], O_RDWR);
	CHECK(dfd >= 0, "open");
	OK(cxla_alloc(dfd, len, 0, &a));
	fd = cxla_export_dmabuf_fd(dfd, a.handle);
	CHECK(fd >= 0, "export: %s", strerror(-fd));
	p = map_fd(fd, len, 0);
	CHECK(p, "mmap");
	fill_random(p, len, 41);
	close(fd);
	OK(cxla_free(dfd, a.handle));
	close(dfd);

	/* only the mapping is left */
	CHECK(crc32c(0, p, len) == ({ uint8_t *t = malloc(len); uint32_t x;
		fill_random(t, len, 41); x = crc32c(0, t, len); free(t); x; }),
	      "data changed after close and FREE");
	memset(p, 0x3c, len);
	f = cxla_devmem_free(c->fd[0]);
	CHECK(f == free0 - len, "device memory free %llu, expected %llu while mapped",
	      (unsigned long long)f, (unsigned long long)(free0 - len));
	CHECK(sysfs_long(c->name[0], "exports") == ex0 + 1, "exports %ld",
	      sysfs_long(c->name[0], "exports"));
	munmap(p, len);
	f = cxla_devmem_free(c->fd[0]);
	CHECK(f == free0, "device memory free %llu after munmap, expected %llu",
	      (unsigned long long)f, (unsigned long long)free0);
	CHECK(sysfs_long(c->name[0], "exports") == ex0, "exports %ld after munmap",
	      sysfs_long(c->name[0], "exports"));
	DETAIL("fd closed, handle freed, device file closed: mapping still works; munmap returned the 2 MiB");
	return PASS;
}

CXLA_TEST_F(devs, importer_keeps_alive)
{
	const size_t len = 1 * MiB;
	struct cxl_accel_dmabuf_import im;
	int i = imp_dev(c), dfd, fd;
	uint64_t free0 = cxla_devmem_free(c->fd[0]), f;
	struct cxl_accel_alloc a;
	uint32_t crc;

	dfd = open(c->path[0], O_RDWR);
	CHECK(dfd >= 0, "open");
	OK(cxla_alloc(dfd, len, 0, &a));
	fd = cxla_export_dmabuf_fd(dfd, a.handle);
	CHECK(fd >= 0, "export: %s", strerror(-fd));
	OK(cxla_import_dmabuf(c->fd[i], fd, &im));
	close(fd);
	OK(cxla_free(dfd, a.handle));
	close(dfd);

	OK(cxla_fill(c->fd[i], cxla_dev(im.handle, 0), len, 0x0102030405060708ULL, 0));
	OK(cxla_checksum(c->fd[i], cxla_dev(im.handle, 0), len, 0, &crc));
	CHECK(crc == pattern_crc(len, 0x0102030405060708ULL), "crc %#x", crc);
	f = cxla_devmem_free(c->fd[0]);
	CHECK(f == free0 - len, "exporter free %llu, expected %llu",
	      (unsigned long long)f, (unsigned long long)(free0 - len));
	OK(cxla_free(c->fd[i], im.handle));
	f = cxla_devmem_free(c->fd[0]);
	CHECK(f == free0, "exporter free %llu after the import went, expected %llu",
	      (unsigned long long)f, (unsigned long long)free0);
	DETAIL("exporter closed fd, handle and device file; %s kept using the import; memory back after FREE of the import",
	       c->name[i]);
	return PASS;
}

#define NBUFS	64

CXLA_TEST_F(devs, many_buffers)
{
	struct cxl_accel_dmabuf_import im[NBUFS];
	struct cxl_accel_alloc a[NBUFS];
	int i = imp_dev(c), k;
	long ex0 = sysfs_long(c->name[0], "exports");
	long at0 = sysfs_long(c->name[0], "attachments");
	long ip0 = sysfs_long(c->name[i], "imports");
	uint64_t free0 = cxla_devmem_free(c->fd[0]);
	const size_t len = 64 * KiB;
	uint32_t crc;

	for (k = 0; k < NBUFS; k++) {
		int fd;

		OK(cxla_alloc(c->fd[0], len, 0, &a[k]));
		fd = cxla_export_dmabuf_fd(c->fd[0], a[k].handle);
		CHECK(fd >= 0, "export %d: %s", k, strerror(-fd));
		OK(cxla_import_dmabuf(c->fd[i], fd, &im[k]));
		close(fd);
	}
	CHECK(sysfs_long(c->name[0], "exports") == ex0 + NBUFS, "exports %ld",
	      sysfs_long(c->name[0], "exports"));
	CHECK(sysfs_long(c->name[0], "attachments") == at0 + NBUFS,
	      "attachments %ld", sysfs_long(c->name[0], "attachments"));
	CHECK(sysfs_long(c->name[i], "imports") == ip0 + NBUFS, "imports %ld",
	      sysfs_long(c->name[i], "imports"));
	for (k = 0; k < NBUFS; k++)
		OK(cxla_fill(c->fd[i], cxla_dev(im[k].handle, 0), len,
			     0x0101010101010101ULL * (k + 1), 0));
	for (k = 0; k < NBUFS; k++) {
		OK(cxla_checksum(c->fd[0], cxla_dev(a[k].handle, 0), len, 0, &crc));
		CHECK(crc == pattern_crc(len, 0x0101010101010101ULL * (k + 1)),
		      "buffer %d: crc %#x", k, crc);
	}
	for (k = 0; k < NBUFS; k++) {
		OK(cxla_free(c->fd[i], im[k].handle));
		OK(cxla_free(c->fd[0], a[k].handle));
	}
	CHECK(sysfs_long(c->name[0], "exports") == ex0 &&
	      sysfs_long(c->name[0], "attachments") == at0 &&
	      sysfs_long(c->name[i], "imports") == ip0,
	      "after release: exports %ld attachments %ld imports %ld",
	      sysfs_long(c->name[0], "exports"),
	      sysfs_long(c->name[0], "attachments"),
	      sysfs_long(c->name[i], "imports"));
	CHECK(cxla_devmem_free(c->fd[0]) == free0, "device memory not all back");
	DETAIL("%d buffers exported by %s, imported and filled by %s, checked, released; counters back",
	       NBUFS, c->name[0], c->name[i]);
	return PASS;
}

static int send_fd(int sock, int fd, const void *data, size_t len)
{
	char ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = ctl, .msg_controllen = sizeof(ctl),
	};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

	memset(ctl, 0, sizeof(ctl));
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &msg, 0) == (ssize_t)len ? 0 : -1;
}

static int recv_fd(int sock, void *data, size_t len)
{
	char ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = data, .iov_len = len };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = ctl, .msg_controllen = sizeof(ctl),
	};
	struct cmsghdr *cm;
	int fd = -1;

	if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) <= 0)
		return -1;
	cm = CMSG_FIRSTHDR(&msg);
	if (cm && cm->cmsg_type == SCM_RIGHTS)
		memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	return fd;
}

/* the receiving process: import on its own device file, fill, CPU marker */
static int fd_child(int sock, const char *path)
{
	struct cxl_accel_dmabuf_import im;
	uint8_t uuid[16];
	char msg[200] = "ok";
	int fd, dfd;
	uint8_t *p;

	fd = recv_fd(sock, uuid, sizeof(uuid));
	dfd = open(path, O_RDWR);
	if (fd < 0 || dfd < 0) {
		snprintf(msg, sizeof(msg), "child: no fd (%d) or device (%d)", fd, dfd);
	} else if (cxla_import_dmabuf(dfd, fd, &im)) {
		snprintf(msg, sizeof(msg), "child: import: %s", strerror(errno));
	} else if (memcmp(im.uuid, uuid, 16)) {
		snprintf(msg, sizeof(msg), "child: uuid differs");
	} else if (cxla_fill(dfd, cxla_dev(im.handle, 0), im.size - 4096,
			     0x5151515151515151ULL, 0)) {
		snprintf(msg, sizeof(msg), "child: fill: %s", strerror(errno));
	} else if (!(p = map_fd(fd, im.size, 0))) {
		snprintf(msg, sizeof(msg), "child: mmap: %s", strerror(errno));
	} else {
		memset(p + im.size - 4096, 0xc4, 4096);
		munmap(p, im.size);
	}
	if (write(sock, msg, strlen(msg) + 1) < 0)
		return 1;
	return 0;
}

CXLA_TEST_F(devs, fd_passing)
{
	const size_t len = 1 * MiB;
	struct cxl_accel_dmabuf_export e;
	struct cxl_accel_alloc a;
	uint64_t free0 = cxla_devmem_free(c->fd[0]);
	int sv[2], st;
	char msg[200] = "";
	uint8_t *p;
	pid_t pid;

	CHECK(!socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), "socketpair");
	OK(cxla_alloc(c->fd[0], len, 0, &a));
	p = cxla_map(c->fd[0], &a);
	CHECK(p, "mmap");
	memset(p, 0, len);
	OK(cxla_export_dmabuf(c->fd[0], a.handle, CXL_ACCEL_DMABUF_CLOEXEC, &e));
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (!pid) {
		close(sv[0]);
		_exit(fd_child(sv[1], c->path[imp_dev(c)]));
	}
	close(sv[1]);
	CHECK(!send_fd(sv[0], e.fd, e.uuid, sizeof(e.uuid)), "sendmsg: %s",
	      strerror(errno));
	/* the sender lets go of everything but its mapping */
	close(e.fd);
	OK(cxla_free(c->fd[0], a.handle));
	CHECK(read(sv[0], msg, sizeof(msg) - 1) > 0, "no answer from the child");
	waitpid(pid, &st, 0);
	CHECK(!strcmp(msg, "ok"), "%s", msg);
	CHECK(WIFEXITED(st) && !WEXITSTATUS(st), "child status %#x", st);
	CHECK(cxla_holds_pattern(p, len - 4096, 0x5151515151515151ULL),
	      "the receiver's device fill is not in the buffer");
	CHECK(p[len - 1] == 0xc4 && p[len - 4096] == 0xc4,
	      "the receiver's CPU writes are not in the buffer");
	munmap(p, len);
	CHECK(cxla_devmem_free(c->fd[0]) == free0, "device memory not back after all users left");
	close(sv[0]);
	DETAIL("DMA-BUF sent over a unix socket, sender closed and freed; receiver imported it on %s, filled it and wrote through its own mmap",
	       c->name[imp_dev(c)]);
	return PASS;
}

CXLA_TEST_F(devs, udmabuf_import)
{
	const size_t len = 4 * MiB, alen = 1 * MiB;
	struct udmabuf_create uc = { 0 };
	struct cxl_accel_dmabuf_import im;
	struct cxl_accel_alloc a;
	int memfd, ufd, dfd, i = imp_dev(c);
	uint64_t p2p;
	uint8_t *m, *q;
	uint32_t crc;

	memfd = memfd_create("cxla-udmabuf", MFD_ALLOW_SEALING | MFD_CLOEXEC);
	CHECK(memfd >= 0, "memfd_create: %s", strerror(errno));
	CHECK(!ftruncate(memfd, len), "ftruncate");
	CHECK(!fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), "seal: %s", strerror(errno));
	dfd = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	CHECK(dfd >= 0, "/dev/udmabuf: %s", strerror(errno));
	uc.memfd = memfd;
	uc.flags = UDMABUF_FLAGS_CLOEXEC;
	uc.offset = 0;
	uc.size = len;
	ufd = ioctl(dfd, UDMABUF_CREATE, &uc);
	CHECK(ufd >= 0, "UDMABUF_CREATE: %s", strerror(errno));
	m = map_fd(memfd, len, 0);
	CHECK(m, "mmap memfd");
	fill_random(m, len, 51);

	OK(cxla_import_dmabuf(c->fd[i], ufd, &im));
	CHECK(im.kind == CXL_ACCEL_IMPORT_OTHER, "kind %u", im.kind);
	CHECK(im.size == len, "size %llu", (unsigned long long)im.size);
	p2p = p2p_bytes(c->fd[i]);
	OK(cxla_checksum(c->fd[i], cxla_dev(im.handle, 0), len, 0, &crc));
	CHECK(crc == crc32c(0, m, len), "device crc of the udmabuf %#x, cpu %#x",
	      crc, crc32c(0, m, len));
	OK(cxla_fill(c->fd[i], cxla_dev(im.handle, 12345), 300000, 0xdeadbeefcafef00dULL, 0));
	CHECK(cxla_holds_pattern(m + 12345, 300000, 0xdeadbeefcafef00dULL),
	      "device fill of the udmabuf not in the memfd");

	OK(cxla_alloc(c->fd[i], alen, 0, &a));
	q = cxla_map(c->fd[i], &a);
	CHECK(q, "mmap");
	fill_random(q, alen, 52);
	OK(cxla_copy(c->fd[i], cxla_dev(a.handle, 0), cxla_dev(im.handle, 2 * MiB + 4096), alen, 0));
	CHECK(!memcmp(m + 2 * MiB + 4096, q, alen), "device memory -> udmabuf differs");
	fill_random(m, len, 53);
	OK(cxla_copy(c->fd[i], cxla_dev(im.handle, 3 * MiB - 7), cxla_dev(a.handle, 0), alen, 0));
	CHECK(!memcmp(q, m + 3 * MiB - 7, alen), "udmabuf -> device memory differs");
	CHECK(p2p_bytes(c->fd[i]) == p2p, "system memory counted as peer-to-peer");
	OK(cxla_free(c->fd[i], im.handle));
	munmap(q, alen);
	munmap(m, len);
	close(ufd);
	close(dfd);
	close(memfd);
	OK(cxla_free(c->fd[i], a.handle));
	DETAIL("4 MiB memfd through /dev/udmabuf on %s (%u segments): checksum, fill, copies both ways at odd offsets",
	       c->name[i], im.nr_segments);
	return PASS;
}

CXLA_TEST_F(devs, heap_import)
{
	const size_t len = 8 * MiB, alen = 2 * MiB;
	struct dma_heap_allocation_data hd = { 0 };
	struct cxl_accel_dmabuf_import im0, im1;
	struct cxl_accel_alloc a;
	int hfd, i = imp_dev(c);
	uint8_t *m, *q;
	uint32_t crc;

	hfd = open("/dev/dma_heap/system", O_RDWR | O_CLOEXEC);
	CHECK(hfd >= 0, "/dev/dma_heap/system: %s", strerror(errno));
	hd.len = len;
	hd.fd_flags = O_RDWR | O_CLOEXEC;
	CHECK(!ioctl(hfd, DMA_HEAP_IOCTL_ALLOC, &hd), "DMA_HEAP_IOCTL_ALLOC: %s",
	      strerror(errno));
	m = map_fd(hd.fd, len, 0);
	CHECK(m, "mmap heap buffer: %s", strerror(errno));
	OK(cxla_sync_dmabuf(hd.fd, DMA_BUF_SYNC_START | DMA_BUF_SYNC_WRITE));
	fill_random(m, len, 61);
	OK(cxla_sync_dmabuf(hd.fd, DMA_BUF_SYNC_END | DMA_BUF_SYNC_WRITE));

	OK(cxla_import_dmabuf(c->fd[0], hd.fd, &im0));
	OK(cxla_import_dmabuf(c->fd[i], hd.fd, &im1));
	CHECK(im0.kind == CXL_ACCEL_IMPORT_OTHER, "kind %u", im0.kind);
	OK(cxla_checksum(c->fd[0], cxla_dev(im0.handle, 0), len, 0, &crc));
	CHECK(crc == crc32c(0, m, len), "device crc of the heap buffer %#x, cpu %#x",
	      crc, crc32c(0, m, len));
	OK(cxla_fill(c->fd[i], cxla_dev(im1.handle, 5 * MiB), 1 * MiB, 0x4848484848484848ULL, 0));
	OK(cxla_sync_dmabuf(hd.fd, DMA_BUF_SYNC_START | DMA_BUF_SYNC_READ));
	CHECK(cxla_holds_pattern(m + 5 * MiB, 1 * MiB, 0x4848484848484848ULL), "device fill of the heap buffer");
	OK(cxla_sync_dmabuf(hd.fd, DMA_BUF_SYNC_END | DMA_BUF_SYNC_READ));

	OK(cxla_alloc(c->fd[0], alen, 0, &a));
	q = cxla_map(c->fd[0], &a);
	CHECK(q, "mmap");
	fill_random(q, alen, 62);
	OK(cxla_copy(c->fd[0], cxla_dev(a.handle, 0), cxla_dev(im0.handle, 1 * MiB), alen, 0));
	CHECK(!memcmp(m + 1 * MiB, q, alen), "device memory -> heap buffer differs");
	OK(cxla_free(c->fd[0], im0.handle));
	OK(cxla_free(c->fd[i], im1.handle));
	munmap(q, alen);
	munmap(m, len);
	close(hd.fd);
	close(hfd);
	OK(cxla_free(c->fd[0], a.handle));
	DETAIL("8 MiB from /dev/dma_heap/system (%u segments) imported by %s and %s: checksum, fill, copy",
	       im0.nr_segments, c->name[0], c->name[i]);
	return PASS;
}

CXLA_TEST_F(devs, errors)
{
	struct cxl_accel_dmabuf_export e;
	struct cxl_accel_dmabuf_import im, bad;
	struct cxl_accel_alloc a;
	struct cxl_accel_atomic at;
	char *big;
	int fd, nul, memfd, n = 0;
	uint32_t crc;
	uint64_t sz;

	/* import: not a file, not a DMA-BUF */
	EXPECT_ERR(cxla_import_dmabuf(c->fd[0], -1, &im), EBADF); n++;
	EXPECT_ERR(cxla_import_dmabuf(c->fd[0], 9999, &im), EBADF); n++;
	nul = open("/dev/null", O_RDWR);
	EXPECT_ERR(cxla_import_dmabuf(c->fd[0], nul, &im), EINVAL); n++;
	close(nul);
	memfd = memfd_create("x", 0);
	EXPECT_ERR(cxla_import_dmabuf(c->fd[0], memfd, &im), EINVAL); n++;
	close(memfd);
	EXPECT_ERR(cxla_import_dmabuf(c->fd[0], c->fd[0], &im), EINVAL); n++;

	/* export: handles, flags, reserved */
	EXPECT_ERR(cxla_export_dmabuf(c->fd[0], 0, 0, &e), ENOENT); n++;
	EXPECT_ERR(cxla_export_dmabuf(c->fd[0], 12345, 0, &e), ENOENT); n++;
	OK(cxla_alloc(c->fd[0], 64 * KiB, 0, &a));
	EXPECT_ERR(cxla_export_dmabuf(c->fd[0], a.handle, 2, &e), EINVAL); n++;
	memset(&e, 0, sizeof(e));
	e.handle = a.handle;
	e.reserved = 1;
	EXPECT_ERR(cxla_ioctl(c->fd[0], CXL_ACCEL_IOC_EXPORT_DMABUF, &e), EINVAL); n++;

	fd = cxla_export_dmabuf_fd(c->fd[0], a.handle);
	CHECK(fd >= 0, "export: %s", strerror(-fd));
	memset(&bad, 0, sizeof(bad));
	bad.fd = fd;
	bad.flags = 1;
	EXPECT_ERR(cxla_ioctl(c->fd[0], CXL_ACCEL_IOC_IMPORT_DMABUF, &bad), EINVAL); n++;
	bad.flags = 0;
	bad.reserved[1] = 7;
	EXPECT_ERR(cxla_ioctl(c->fd[0], CXL_ACCEL_IOC_IMPORT_DMABUF, &bad), EINVAL); n++;
	OK(cxla_import_dmabuf(c->fd[imp_dev(c)], fd, &im));
	sz = im.size;
	/* an import cannot be exported again by the importer */
	EXPECT_ERR(cxla_export_dmabuf(c->fd[imp_dev(c)], im.handle, 0, &e), EINVAL); n++;

	/* offsets and sizes */
	big = malloc(2 * sz);
	CHECK(big, "malloc");
	EXPECT_ERR(cxla_copy(c->fd[imp_dev(c)], cxla_user(big), cxla_dev(im.handle, sz), 1, 0), EINVAL); n++;
	EXPECT_ERR(cxla_copy(c->fd[imp_dev(c)], cxla_user(big), cxla_dev(im.handle, sz - 4096), 8192, 0), EINVAL); n++;
	EXPECT_ERR(cxla_copy(c->fd[imp_dev(c)], cxla_dev(im.handle, 0), cxla_user(big), sz + 1, 0), EINVAL); n++;
	EXPECT_ERR(cxla_copy(c->fd[imp_dev(c)], cxla_dev(im.handle, ~0ULL - 10), cxla_user(big), 100, 0), EINVAL); n++;
	EXPECT_ERR(cxla_fill(c->fd[imp_dev(c)], cxla_dev(im.handle, 0), 0, 0, 0), EINVAL); n++;
	EXPECT_ERR(cxla_checksum(c->fd[imp_dev(c)], cxla_dev(im.handle, 1), sz, 0, &crc), EINVAL); n++;
	EXPECT_ERR(cxla_atomic(c->fd[imp_dev(c)], cxla_dev(im.handle, 4), CXL_ACCEL_ATOMIC_FETCH_ADD,
			       8, 1, 0, 1, 0, &at), EINVAL); n++;
	/* unknown import handles */
	EXPECT_ERR(cxla_fill(c->fd[imp_dev(c)], cxla_dev(CXL_ACCEL_HANDLE_IMPORTED | 777, 0), 8, 0, 0), ENOENT); n++;
	EXPECT_ERR(cxla_fill(c->fd[imp_dev(c)], cxla_dev(CXL_ACCEL_HANDLE_IMPORTED, 0), 8, 0, 0), ENOENT); n++;
	/* import handles are per file */
	if (c->ndev > 1)
		EXPECT_ERR(cxla_fill(c->fd[0], cxla_dev(im.handle, 0), 8, 0, 0), ENOENT);
	/* a user range that is not mapped */
	EXPECT_ERR(cxla_copy(c->fd[imp_dev(c)], cxla_dev(im.handle, 0), cxla_user((void *)4096), 4096, 0), EFAULT); n++;
	/* an import handle is not something to mmap from the device file */
	CHECK(mmap_err(c->fd[imp_dev(c)], 4096, (off_t)(uint64_t)(im.handle & ~CXL_ACCEL_HANDLE_IMPORTED) << CXL_ACCEL_MMAP_SHIFT,
		       MAP_SHARED) != 0, "mmap of an import handle's number through the device file");
	OK(cxla_free(c->fd[imp_dev(c)], im.handle));
	EXPECT_ERR(cxla_free(c->fd[imp_dev(c)], im.handle), ENOENT); n++;
	/* and what works at the edges */
	OK(cxla_import_dmabuf(c->fd[imp_dev(c)], fd, &im));
	OK(cxla_copy(c->fd[imp_dev(c)], cxla_user(big), cxla_dev(im.handle, sz - 1), 1, 0));
	OK(cxla_free(c->fd[imp_dev(c)], im.handle));
	close(fd);
	free(big);
	OK(cxla_free(c->fd[0], a.handle));
	DETAIL("%d error cases: bad fd EBADF, non-DMA-BUF fds EINVAL, bad handles ENOENT, flags/reserved/offsets/sizes EINVAL, unmapped user memory EFAULT",
	       n);
	return PASS;
}

/* -------------------------------------------------- revocation (unbind) */

struct copier {
	int fd;
	uint32_t handle;
	void *ram;
	volatile int stop;
	int err;
	long n;
};

static void *copier_thread(void *arg)
{
	struct copier *k = arg;

	while (!k->stop) {
		int r = cxla_copy(k->fd, cxla_user(k->ram), cxla_dev(k->handle, 0),
				  256 * KiB, 0);

		if (r) {
			k->err = r;
			break;
		}
		k->n++;
	}
	return NULL;
}

static int vdev_of(const char *name, char *out, size_t len)
{
	char p[256], t[256];
	ssize_t n;

	snprintf(p, sizeof(p), "/sys/class/cxl-accel/%s/device", name);
	n = readlink(p, t, sizeof(t) - 1);
	if (n <= 0)
		return -1;
	t[n] = 0;
	snprintf(out, len, "%s", strrchr(t, '/') ? strrchr(t, '/') + 1 : t);
	return 0;
}

/* the cxl-accel name bound to virtio device vdev, after a rebind */
static int name_of_vdev(const char *vdev, char *out, size_t len)
{
	struct dirent *de;
	DIR *d = opendir("/sys/class/cxl-accel");
	char v[64];
	int r = -1;

	while (d && (de = readdir(d))) {
		if (strncmp(de->d_name, "cxl-accel", 9))
			continue;
		if (!vdev_of(de->d_name, v, sizeof(v)) && !strcmp(v, vdev)) {
			snprintf(out, len, "%s", de->d_name);
			r = 0;
		}
	}
	if (d)
		closedir(d);
	return r;
}

/*
 * Bind virtio device vdev to the driver again, wait for the device it comes
 * back as (its name in again) and open it (in *fd).
 */
static int rebind(FIXTURE_DATA(devs) *c, const char *vdev, char *again, size_t len,
		  int *fd)
{
	char p[300];
	struct stat st;
	int i, r;

	r = cxla_write_str("/sys/bus/virtio/drivers/cxl_accel/bind", vdev);
	CHECK(!r, "bind %s: %s", vdev, strerror(-r));
	for (i = 0; i < 100 && name_of_vdev(vdev, again, len); i++)
		usleep(50000);
	CHECK(i < 100, "%s did not come back", vdev);
	snprintf(p, sizeof(p), "/dev/%s", again);
	for (i = 0; i < 100 && stat(p, &st); i++)
		usleep(50000);
	*fd = open(p, O_RDWR);
	CHECK(*fd >= 0, "open %s: %s", p, strerror(errno));
	return PASS;
}

/*
 * With dmabuf_p2p=0 the exporter maps its coherent pages through the DMA
 * API instead of handing out bus addresses: the other path of the exporter.
 */
#define P2P_PARAM "/sys/module/cxl_accel/parameters/dmabuf_p2p"

static int no_p2p_body(FIXTURE_DATA(devs) *c)
{
	const size_t len = 2 * MiB;
	struct cxl_accel_dmabuf_import im;
	struct cxl_accel_alloc a, b;
	long pa0 = sysfs_long(c->name[0], "p2p_attachments");
	uint8_t *pa, *pb;
	uint64_t p2p;
	int fd;

	OK(cxla_alloc(c->fd[0], len, 0, &a));
	OK(cxla_alloc(c->fd[1], len, 0, &b));
	pa = cxla_map(c->fd[0], &a);
	pb = cxla_map(c->fd[1], &b);
	CHECK(pa && pb, "mmap");
	fd = cxla_export_dmabuf_fd(c->fd[0], a.handle);
	CHECK(fd >= 0, "export: %s", strerror(-fd));
	OK(cxla_import_dmabuf(c->fd[1], fd, &im));
	CHECK(im.kind == CXL_ACCEL_IMPORT_PEER && !(im.attach_flags & CXL_ACCEL_IMPORT_P2P),
	      "kind %u flags %#x with dmabuf_p2p=0", im.kind, im.attach_flags);
	CHECK(sysfs_long(c->name[0], "p2p_attachments") == pa0, "p2p attachment counted");
	fill_random(pa, len, 81);
	p2p = p2p_bytes(c->fd[1]);
	OK(cxla_copy(c->fd[1], cxla_dev(im.handle, 0), cxla_dev(b.handle, 0), len, 0));
	CHECK(!memcmp(pa, pb, len), "copy through the DMA-API mapping differs");
	fill_random(pb, len, 82);
	OK(cxla_copy(c->fd[1], cxla_dev(b.handle, 0), cxla_dev(im.handle, 4096), len - 4096, 0));
	CHECK(!memcmp(pa + 4096, pb, len - 4096), "copy into the DMA-API mapping differs");
	p2p = p2p_bytes(c->fd[1]) - p2p;
	OK(cxla_free(c->fd[1], im.handle));
	close(fd);
	munmap(pa, len);
	munmap(pb, len);
	OK(cxla_free(c->fd[0], a.handle));
	OK(cxla_free(c->fd[1], b.handle));
	DETAIL("dmabuf_p2p=0: page-backed sg_table mapped with dma_map_sgtable (%u segments); copies both ways right; the addresses are still %s's BAR (BYTES_P2P +%llu)",
	       im.nr_segments, c->name[0], (unsigned long long)p2p);
	return PASS;
}

CXLA_TEST_F(devs, no_p2p_fallback)
{
	int rc;

	NEED2();
	CHECK(!cxla_write_str(P2P_PARAM, "0"), "cannot write %s", P2P_PARAM);
	rc = no_p2p_body(c);
	if (cxla_write_str(P2P_PARAM, "1") && rc == PASS)
		FAILF("cannot restore %s", P2P_PARAM);
	return rc;
}

/* The only module references left are DMA-BUFs: rmmod must be refused. */
static int module_refcnt(void)
{
	FILE *f = fopen("/sys/module/cxl_accel/refcnt", "r");
	int n = -1;

	if (f) {
		if (fscanf(f, "%d", &n) != 1)
			n = -1;
		fclose(f);
	}
	return n;
}

CXLA_TEST_F(devs, unload_refused)
{
	struct cxl_accel_alloc a;
	int fd, r, k, before, with;

	OK(cxla_alloc(c->fd[0], 64 * KiB, 0, &a));
	fd = cxla_export_dmabuf_fd(c->fd[0], a.handle);
	CHECK(fd >= 0, "export: %s", strerror(-fd));
	for (k = 0; k < c->ndev; k++)
		close(c->fd[k]);
	with = module_refcnt();
	r = syscall(SYS_delete_module, "cxl_accel", O_NONBLOCK) ? -errno : 0;
	CHECK(r, "the module was unloaded with a live DMA-BUF!");
	CHECK(r == -EWOULDBLOCK || r == -EBUSY, "delete_module: %s", strerror(-r));
	close(fd);	/* releases the buffer (handle freed with the file) */
	before = module_refcnt();
	CHECK(with == before + 1, "module refcnt %d with the DMA-BUF, %d without",
	      with, before);
	DETAIL("with only a DMA-BUF fd open (module refcnt %d, %d after close) delete_module fails: %s",
	       with, before, strerror(-r));
	return PASS;
}

/*
 * Unbind the importing device while it holds imports: its attachments go
 * at once (the exporter sees them go), its file gives -ENODEV, and closing
 * the file releases the imports.
 */
CXLA_TEST_F(devs, importer_unbind)
{
	struct cxl_accel_dmabuf_import ia, iu, is;
	struct udmabuf_create uc = { 0 };
	long at0 = sysfs_long(c->name[0], "attachments"), live0[3], live[3];
	struct cxl_accel_alloc a;
	char vdev[64], again[32];
	int fd, memfd, udev, ufd, r, fd1;
	uint32_t crc;

	NEED2();
	CHECK(!cxla_dmabuf_module_live(c->name[0], live0), "module_live");
	CHECK(!vdev_of(c->name[1], vdev, sizeof(vdev)), "no virtio device for %s", c->name[1]);
	OK(cxla_alloc(c->fd[0], 1 * MiB, 0, &a));
	fd = cxla_export_dmabuf_fd(c->fd[0], a.handle);
	CHECK(fd >= 0, "export: %s", strerror(-fd));
	OK(cxla_import_dmabuf(c->fd[1], fd, &ia));
	memfd = memfd_create("cxla-u", MFD_ALLOW_SEALING | MFD_CLOEXEC);
	CHECK(memfd >= 0 && !ftruncate(memfd, 1 * MiB) &&
	      !fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), "memfd");
	udev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	uc.memfd = memfd;
	uc.flags = UDMABUF_FLAGS_CLOEXEC;
	uc.size = 1 * MiB;
	ufd = ioctl(udev, UDMABUF_CREATE, &uc);
	CHECK(ufd >= 0, "UDMABUF_CREATE: %s", strerror(errno));
	OK(cxla_import_dmabuf(c->fd[1], ufd, &iu));
	OK(cxla_fill(c->fd[1], cxla_dev(ia.handle, 0), 1 * MiB, 9, 0));
	CHECK(sysfs_long(c->name[0], "attachments") == at0 + 1, "attachments %ld",
	      sysfs_long(c->name[0], "attachments"));

	r = cxla_write_str("/sys/bus/virtio/drivers/cxl_accel/unbind", vdev);
	CHECK(!r, "unbind %s: %s", vdev, strerror(-r));
	CHECK(sysfs_long(c->name[0], "attachments") == at0,
	      "the removed importer still holds %ld attachment(s)",
	      sysfs_long(c->name[0], "attachments") - at0);
	EXPECT_ERR(cxla_fill(c->fd[1], cxla_dev(ia.handle, 0), 4096, 0, 0), ENODEV);
	EXPECT_ERR(cxla_free(c->fd[1], iu.handle), ENODEV);
	/* the exporter and its DMA-BUF are unaffected */
	OK(cxla_checksum(c->fd[0], cxla_dev(a.handle, 0), 1 * MiB, 0, &crc));
	CHECK(crc == pattern_crc(1 * MiB, 9), "exporter's data %#x", crc);
	OK(cxla_import_dmabuf(c->fd[0], fd, &is));
	OK(cxla_free(c->fd[0], is.handle));
	CHECK(!cxla_dmabuf_module_live(c->name[0], live) && live[2] == live0[2] + 2,
	      "imports %ld, expected %ld while the dead file is open", live[2], live0[2] + 2);
	close(c->fd[1]);
	c->fd[1] = -1;
	CHECK(!cxla_dmabuf_module_live(c->name[0], live) && live[2] == live0[2] && live[1] == live0[1],
	      "after close: imports %ld (was %ld) attachments %ld (was %ld)",
	      live[2], live0[2], live[1], live0[1]);
	close(fd);
	close(ufd);
	close(udev);
	close(memfd);
	OK(cxla_free(c->fd[0], a.handle));

	if (rebind(c, vdev, again, sizeof(again), &fd1) != PASS)
		return FAIL;
	CHECK(cxla_devmem_free(fd1) == c->id[1].devmem_size, "%s not all free after rebind", again);
	close(fd1);
	DETAIL("%s unbound with a peer import and a udmabuf import: attachments released at once, ioctls ENODEV, imports gone at close; rebound as %s",
	       vdev, again);
	return PASS;
}

CXLA_TEST_F(devs, revoke_unbind)
{
	const size_t len = 2 * MiB;
	struct cxl_accel_dmabuf_export e;
	struct cxl_accel_dmabuf_import im, im2;
	struct cxl_accel_alloc a, b;
	struct copier k = { 0 };
	char vdev[64], again[32];
	volatile uint8_t *map;
	pthread_t th;
	double t0, t_unbind, t_stop;
	long live[3], mn0;
	uint8_t v;
	int i, r, fd2;
	uint64_t size;

	NEED2();
	CHECK(!vdev_of(c->name[0], vdev, sizeof(vdev)), "no virtio device for %s",
	      c->name[0]);
	mn0 = sysfs_long(c->name[1], "move_notify");
	OK(cxla_alloc(c->fd[0], len, 0, &a));
	OK(cxla_export_dmabuf(c->fd[0], a.handle, CXL_ACCEL_DMABUF_CLOEXEC, &e));
	map = map_fd(e.fd, len, 0);
	CHECK(map, "mmap");
	map[0] = 1;
	OK(cxla_import_dmabuf(c->fd[1], e.fd, &im));
	OK(cxla_alloc(c->fd[1], 1 * MiB, 0, &b));
	k.fd = c->fd[1];
	k.handle = im.handle;
	k.ram = malloc(256 * KiB);
	CHECK(k.ram, "malloc");
	memset(k.ram, 0x42, 256 * KiB);
	OK(cxla_copy(c->fd[1], cxla_user(k.ram), cxla_dev(im.handle, 0), 256 * KiB, 0));
	CHECK(!pthread_create(&th, NULL, copier_thread, &k), "pthread_create");
	usleep(200000);

	/* pull the exporter away while dev1 copies into its memory */
	t0 = now_sec();
	r = cxla_write_str("/sys/bus/virtio/drivers/cxl_accel/unbind", vdev);
	t_unbind = now_sec() - t0;
	for (i = 0; i < 200 && !k.err; i++)
		usleep(50000);
	t_stop = now_sec() - t0;
	k.stop = 1;
	pthread_join(th, NULL);
	CHECK(!r, "unbind %s: %s", vdev, strerror(-r));
	CHECK(k.err == -ENODEV, "copier ended with %d (%s) after %ld copies",
	      k.err, strerror(-k.err), k.n);

	/* importer: clean errors, its own work goes on */
	EXPECT_ERR(cxla_copy(c->fd[1], cxla_user(k.ram), cxla_dev(im.handle, 0), 4096, 0), ENODEV);
	EXPECT_ERR(cxla_copy(c->fd[1], cxla_dev(im.handle, 0), cxla_dev(b.handle, 0), 4096, 0), ENODEV);
	EXPECT_ERR(cxla_fill(c->fd[1], cxla_dev(im.handle, 0), 4096, 0, 0), ENODEV);
	OK(cxla_fill(c->fd[1], cxla_dev(b.handle, 0), 1 * MiB, 7, 0));
	EXPECT_ERR(cxla_import_dmabuf(c->fd[1], e.fd, &im2), ENODEV);
	CHECK(sysfs_long(c->name[1], "move_notify") > mn0, "importer got no move_notify");
	CHECK(sysfs_long(c->name[1], "imports_mapped") == 0, "import still mapped");
	/* the DMA-BUF fd: still an fd, but revoked */
	CHECK(lseek(e.fd, 0, SEEK_END) == (off_t)len, "lseek on the revoked DMA-BUF");
	CHECK(cxla_sync_dmabuf(e.fd, DMA_BUF_SYNC_START | DMA_BUF_SYNC_RW) == -ENODEV,
	      "DMA_BUF_IOCTL_SYNC on a revoked buffer: %d", cxla_sync_dmabuf(e.fd, DMA_BUF_SYNC_START));
	CHECK(mmap_err(e.fd, 4096, 0, MAP_SHARED) == -ENODEV, "new mmap of a revoked buffer");
	CHECK(cxla_probe_read(map + 4096, &v, NULL) == SIGBUS,
	      "the revoked mapping is still readable");
	EXPECT_ERR(cxla_free(c->fd[0], a.handle), ENODEV);

	/* let go of everything: nothing may stay behind */
	OK(cxla_free(c->fd[1], im.handle));
	munmap((void *)map, len);
	close(e.fd);
	close(c->fd[0]);
	c->fd[0] = -1;
	OK(cxla_free(c->fd[1], b.handle));
	size = c->id[0].devmem_size;

	/* bind again: all device memory free */
	if (rebind(c, vdev, again, sizeof(again), &fd2) != PASS)
		return FAIL;
	CHECK(cxla_devmem_free(fd2) == size, "%s: %llu of %llu bytes free after rebind", again,
	      (unsigned long long)cxla_devmem_free(fd2), (unsigned long long)size);
	close(fd2);
	snprintf(c->name[0], sizeof(c->name[0]), "%s", again);
	CHECK(!cxla_dmabuf_module_live(c->name[0], live), "module_live");
	CHECK(live[0] == 0 && live[1] == 0 && live[2] == 0,
	      "module-wide live exports %ld attachments %ld imports %ld", live[0],
	      live[1], live[2]);
	DETAIL("unbind of %s took %.2f s; %ld copies into its memory by %s, then ENODEV within %.2f s; importer's own commands fine; SYNC/mmap ENODEV, mapping SIGBUS; no leftovers; rebound as %s",
	       vdev, t_unbind, k.n, c->name[1], t_stop, again);
	return PASS;
}

CXLA_TEST_F(devs, leak_check)
{
	static const char * const zero[] = {
		"exports", "attachments", "p2p_attachments", "mappings", "pins",
		"imports", "imports_mapped",
	};
	long live[3];
	unsigned int k;
	int d, bi = cxla_debugfs_dmabufs();

	CHECK(!cxla_dmabuf_module_live(c->name[0], live), "module_live unreadable");
	CHECK(live[0] == 0 && live[1] == 0 && live[2] == 0,
	      "module-wide live exports %ld attachments %ld imports %ld",
	      live[0], live[1], live[2]);
	CHECK(bi == 0, "debugfs dma_buf/bufinfo still lists %d cxl_accel buffers", bi);
	for (d = 0; d < c->ndev; d++) {
		for (k = 0; k < sizeof(zero) / sizeof(zero[0]); k++)
			CHECK(sysfs_long(c->name[d], zero[k]) == 0, "%s dmabuf/%s = %ld",
			      c->name[d], zero[k], sysfs_long(c->name[d], zero[k]));
		CHECK(cxla_devmem_free(c->fd[d]) == c->id[d].devmem_size,
		      "%s: %llu of %llu bytes free", c->name[d],
		      (unsigned long long)cxla_devmem_free(c->fd[d]),
		      (unsigned long long)c->id[d].devmem_size);
	}
	DETAIL("no DMA-BUF, attachment, mapping, pin or import left on %d device(s), none in dma_buf/bufinfo; all device memory free",
	       c->ndev);
	return PASS;
}

/* ------------------------------------------------------------ benchmark */

enum { B_PUSH, B_PULL, B_BOUNCE, B_CPU };

struct bench_bufs {
	int fd0, fd1;
	uint32_t a, b;		/* buffers of dev0 and dev1 */
	uint32_t ia, ib;	/* dev1's import of a, dev0's import of b */
	uint8_t *pa, *pb, *ram;
	uint64_t len;
};

static int bench_step(const struct bench_bufs *x, int how)
{
	int r;

	switch (how) {
	case B_PUSH:	/* dev0: own memory -> dev1's memory, by bus address */
		return cxla_copy(x->fd0, cxla_dev(x->a, 0), cxla_dev(x->ib, 0), x->len, 0);
	case B_PULL:	/* dev1: dev0's memory -> own memory */
		return cxla_copy(x->fd1, cxla_dev(x->ia, 0), cxla_dev(x->b, 0), x->len, 0);
	case B_BOUNCE:	/* dev0 -> system RAM, then system RAM -> dev1 */
		r = cxla_copy(x->fd0, cxla_dev(x->a, 0), cxla_user(x->ram), x->len, 0);
		if (!r)
			r = cxla_copy(x->fd1, cxla_user(x->ram), cxla_dev(x->b, 0), x->len, 0);
		return r;
	default:	/* the CPU through both mappings */
		memcpy(x->pb, x->pa, x->len);
		return 0;
	}
}

/* Best MB/s over reps samples; a sample is iters steps back to back. */
static double bench_rate(const struct bench_bufs *x, int how, int reps,
			 int iters, int *err)
{
	double best = 0, t;
	int i, k;

	for (i = 0; i < reps; i++) {
		t = now_sec();
		for (k = 0; k < iters; k++) {
			*err = bench_step(x, how);
			if (*err)
				return 0;
		}
		t = now_sec() - t;
		if (x->len * (double)iters / t / 1e6 > best)
			best = x->len * (double)iters / t / 1e6;
	}
	return best;
}

static int bench(int argc, char **argv)
{
	FIXTURE_DATA(devs) cc = { 0 }, *c = &cc;
	uint64_t sizes[8] = { 2 * MiB, 32 * MiB };
	int nsizes = 2, reps = 3, k, fails = 0;
	char summary[600] = "";
	size_t sl = 0;

	cxla_detail = summary;
	for (k = 0; k < argc; k++) {
		if (!strcmp(argv[k], "--full")) {
			sizes[1] = 256 * MiB;
			reps = 5;
		} else if (atoi(argv[k]) > 0) {
			if (nsizes == 2 && sizes[0] == 2 * MiB)
				nsizes = 0;	/* sizes given: only those */
			if (nsizes < 8)
				sizes[nsizes++] = (uint64_t)atoi(argv[k]) * MiB;
		}
	}
	if (discover(c) || c->ndev < 2) {
		printf("RESULT dmabuf.bench SKIP needs two devices\n");
		return 0;
	}
	printf("DMA-BUF peer-to-peer benchmark: %s -> %s, MB/s, best of %d samples of >= 64 MiB\n",
	       c->name[0], c->name[1], reps);
	printf("  %8s  %10s  %10s  %15s  %11s  %10s\n", "size", "P2P push",
	       "P2P pull", "bounce via RAM", "CPU memcpy", "P2P/bounce");
	for (k = 0; k < nsizes; k++) {
		struct bench_bufs x = { .fd0 = c->fd[0], .fd1 = c->fd[1], .len = sizes[k] };
		int iters = x.len >= 64 * MiB ? 1 : (int)(64 * MiB / x.len);
		struct cxl_accel_dmabuf_import ia, ib;
		struct cxl_accel_alloc a, b;
		double push, pull = 0, bounce = 0, cpu;
		uint64_t p0, p1, d0, d1;
		int fa, fb, err = 0;
		uint32_t crc;

		if (cxla_alloc(c->fd[0], x.len, 0, &a) || cxla_alloc(c->fd[1], x.len, 0, &b)) {
			printf("  %4llu MiB: cannot allocate it on both devices (more device memory: --devmem-size)\n",
			       (unsigned long long)(x.len >> 20));
			fails++;
			continue;
		}
		x.a = a.handle;
		x.b = b.handle;
		x.pa = cxla_map(c->fd[0], &a);
		x.pb = cxla_map(c->fd[1], &b);
		x.ram = mmap(NULL, x.len, PROT_READ | PROT_WRITE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		fa = cxla_export_dmabuf_fd(c->fd[0], a.handle);
		fb = cxla_export_dmabuf_fd(c->fd[1], b.handle);
		if (!x.pa || !x.pb || x.ram == MAP_FAILED || fa < 0 || fb < 0 ||
		    cxla_import_dmabuf(c->fd[0], fb, &ib) || cxla_import_dmabuf(c->fd[1], fa, &ia)) {
			printf("RESULT dmabuf.bench FAIL set-up for %llu MiB failed\n",
			       (unsigned long long)(x.len >> 20));
			return 1;
		}
		x.ia = ia.handle;
		x.ib = ib.handle;
		fill_random(x.pa, x.len, 71);
		memset(x.ram, 1, x.len);

		p0 = p2p_bytes(c->fd[0]);
		p1 = p2p_bytes(c->fd[1]);
		push = bench_rate(&x, B_PUSH, reps, iters, &err);
		d0 = p2p_bytes(c->fd[0]) - p0;
		if (!err)
			pull = bench_rate(&x, B_PULL, reps, iters, &err);
		d1 = p2p_bytes(c->fd[1]) - p1;
		if (!err)
			bounce = bench_rate(&x, B_BOUNCE, reps, iters, &err);
		if (err) {
			printf("RESULT dmabuf.bench FAIL copy of %llu MiB: %s\n",
			       (unsigned long long)(x.len >> 20), strerror(-err));
			return 1;
		}
		cpu = bench_rate(&x, B_CPU, reps > 3 ? 3 : reps,
				 x.len >= 16 * MiB ? 1 : (int)(16 * MiB / x.len), &err);
		if (cxla_checksum(c->fd[1], cxla_dev(b.handle, 0), x.len, 0, &crc) ||
		    crc != crc32c(0, x.pa, x.len)) {
			printf("  %llu MiB: data differs after the copies\n",
			       (unsigned long long)(x.len >> 20));
			fails++;
		}
		/* every P2P byte went device to device, none through RAM */
		if (d0 != x.len * iters * reps || d1 != x.len * iters * reps) {
			printf("  BYTES_P2P: %s +%llu, %s +%llu, expected %llu each\n",
			       c->name[0], (unsigned long long)d0, c->name[1],
			       (unsigned long long)d1,
			       (unsigned long long)(x.len * iters * reps));
			fails++;
		}
		printf("  %4llu MiB  %10.0f  %10.0f  %15.0f  %11.0f  %9.2fx\n",
		       (unsigned long long)(x.len >> 20), push, pull, bounce, cpu,
		       push / bounce);
		sl += snprintf(summary + sl, sizeof(summary) - sl,
			       "%s%llu MiB: P2P %.0f/%.0f MB/s (push/pull), bounce %.0f MB/s",
			       sl ? "; " : "", (unsigned long long)(x.len >> 20),
			       push, pull, bounce);
		cxla_free(c->fd[0], ib.handle);
		cxla_free(c->fd[1], ia.handle);
		close(fa);
		close(fb);
		munmap(x.pa, x.len);
		munmap(x.pb, x.len);
		munmap(x.ram, x.len);
		cxla_free(c->fd[0], a.handle);
		cxla_free(c->fd[1], b.handle);
	}
	printf("  (P2P: one command, device to device by bus address through an imported DMA-BUF;\n"
	       "   bounce: the same bytes in two commands through a system-RAM buffer)\n");
	printf("RESULT dmabuf.bench %s %s; BYTES_P2P of both devices checked\n",
	       fails ? "FAIL" : "PASS", summary);
	return fails ? 1 : 0;
}

/* ------------------------------------------------------------ soak */

/*
 * --soak SECS: DMA-BUF under daemon restarts (tests/guest/host/run-soak.sh kills
 * the device workers meanwhile). Two processes, one per direction: device X
 * exports a buffer E, device Y imports it (peer-to-peer) and owns a buffer
 * L; a system-RAM buffer R. For SECS seconds random steps: CPU writes (E
 * through its handle mapping or the DMA-BUF mapping, L, R), Y's copies
 * between the import and L or R both ways, FILL, CHECKSUM (by Y through the
 * import and by X on E), fetch-add on the import, CPU reads through the
 * DMA-BUF mapping, E exported again (the old DMA-BUF released: UNEXPORT)
 * and everything made anew now and then. A command may fail with -EIO (in
 * flight when a worker died: counted), nothing else may fail. After every
 * step E, L and R are compared with their reference copies; a write that
 * failed may have written part of its destination: each byte must then be
 * the old or the new value, and the copy takes what is there. At the end
 * no DMA-BUF, attachment, mapping, pin or import may be left.
 */
#define DSOAK_PROCS	2

enum {
	DK_CPU_WRITE, DK_PULL, DK_PUSH, DK_TO_RAM, DK_FROM_RAM, DK_FILL, DK_CRC,
	DK_ATOMIC, DK_MMAP_READ, DK_REEXPORT, DK_RECREATE, DK_NOPS
};

static const char * const dk_names[DK_NOPS] = {
	"cpu-write", "pull", "push", "to-ram", "from-ram", "fill", "checksum",
	"atomic", "mmap-read", "re-export", "re-create",
};

struct dsoak_stats {		/* one per process, shared with the parent */
	long ops[DK_NOPS];
	long eio[DK_NOPS];
	long alloc_eio, export_eio;	/* while (re-)creating */
	long exports, imports, p2p_imports, partial;
	unsigned long long verified;	/* bytes compared */
	unsigned long long copied;	/* bytes moved by Y through the import */
	char fail[300];
};

struct dsoak {
	int xfd, yfd, x, y;	/* exporter and importer: fds, indices */
	size_t len;
	struct cxl_accel_alloc e, l;
	uint8_t *pe, *pl, *pr, *pdm;	/* E, L, R; E through its DMA-BUF */
	uint8_t *re, *rl, *rr;		/* reference copies */
	int efd;
	uint32_t ie;			/* Y's import of E */
	uint8_t uuid[16];
	uint64_t rnd;
	struct dsoak_stats *st;
};

#define DS_FAIL(s, ...) \
	(snprintf((s)->st->fail, sizeof((s)->st->fail), __VA_ARGS__), -1)

static int ds_cmp(struct dsoak *s, const uint8_t *p, const uint8_t *ref,
		  const char *name, const char *what)
{
	size_t i;

	s->st->verified += s->len;
	if (!memcmp(p, ref, s->len))
		return 0;
	for (i = 0; p[i] == ref[i]; i++)
		;
	return DS_FAIL(s, "after %s: %s byte %zu of %zu is %#x, expected %#x",
		       what, name, i, s->len, p[i], ref[i]);
}

static int ds_verify(struct dsoak *s, const char *what)
{
	return ds_cmp(s, s->pe, s->re, "E", what) ||
	       ds_cmp(s, s->pl, s->rl, "L", what) ||
	       ds_cmp(s, s->pr, s->rr, "R", what) ? -1 : 0;
}

/* a failed write of [off, off + n): old or new bytes, the copy takes them */
static int ds_adopt(struct dsoak *s, const uint8_t *p, uint8_t *ref,
		    size_t off, size_t n, const uint8_t *want, const char *what)
{
	bool part = false;
	size_t i;

	for (i = off; i < off + n; i++) {
		if (p[i] == ref[i])
			continue;
		if (p[i] != want[i - off])
			return DS_FAIL(s, "%s failed: byte %zu is %#x, neither old %#x nor new %#x",
				       what, i, p[i], ref[i], want[i - off]);
		ref[i] = p[i];
		part = true;
	}
	s->st->partial += part;
	return 0;
}

/* export E and import it into Y (-EIO from EXPORT: again) */
static int ds_export(struct dsoak *s)
{
	struct cxl_accel_dmabuf_export ex;
	struct cxl_accel_dmabuf_import im;
	char name[32];
	int r, tries = 0;
	bool p2p;

	while ((r = cxla_export_dmabuf(s->xfd, s->e.handle, CXL_ACCEL_DMABUF_CLOEXEC,
				       &ex)) == -EIO && tries++ < 5)
		s->st->export_eio++;
	if (r)
		return DS_FAIL(s, "EXPORT of E (dev%d, %zu bytes): %s", s->x,
			       s->len, strerror(-r));
	if (!memcmp(ex.uuid, s->uuid, 16))
		return DS_FAIL(s, "export again: same UUID");
	memcpy(s->uuid, ex.uuid, 16);
	s->efd = ex.fd;
	s->st->exports++;
	r = cxla_import_dmabuf(s->yfd, s->efd, &im);
	if (r)
		return DS_FAIL(s, "IMPORT into dev%d: %s", s->y, strerror(-r));
	/*
	 * Peer-to-peer, unless the kernel's P2PDMA refuses the topology (such as
	 * CXL host bridges, which no switch joins): then through system memory.
	 */
	snprintf(name, sizeof(name), "cxl-accel%d", s->x);
	p2p = im.attach_flags & CXL_ACCEL_IMPORT_P2P;
	if (im.kind != CXL_ACCEL_IMPORT_PEER || (!p2p && !p2p_by_kernel(name)) ||
	    im.size != s->e.alloc_size)
		return DS_FAIL(s, "import: kind %u flags %#x size %llu", im.kind,
			       im.attach_flags, (unsigned long long)im.size);
	s->ie = im.handle;
	s->st->imports++;
	s->st->p2p_imports += p2p;
	s->pdm = map_fd(s->efd, s->len, 0);
	if (!s->pdm)
		return DS_FAIL(s, "mmap of the DMA-BUF: %s", strerror(errno));
	return 0;
}

static int ds_unexport(struct dsoak *s)
{
	int r = cxla_free(s->yfd, s->ie);

	munmap(s->pdm, s->len);
	close(s->efd);		/* the last reference: release, UNEXPORT */
	return r ? DS_FAIL(s, "FREE of the import: %s", strerror(-r)) : 0;
}

static int ds_alloc(struct dsoak *s, int fd, struct cxl_accel_alloc *a,
		    uint8_t **p)
{
	int r, tries = 0;

	while ((r = cxla_alloc(fd, s->len, 0, a)) == -EIO && tries++ < 5)
		s->st->alloc_eio++;
	if (r)
		return DS_FAIL(s, "ALLOC of %zu bytes: %s", s->len, strerror(-r));
	*p = cxla_map(fd, a);
	return *p ? 0 : DS_FAIL(s, "mmap: %s", strerror(errno));
}

static int ds_create(struct dsoak *s)
{
	static const size_t sizes[] = { 64 * KiB, 256 * KiB, 1 * MiB, 2 * MiB };

	s->len = sizes[rnd64(&s->rnd) % 4];
	s->re = malloc(s->len);
	s->rl = malloc(s->len);
	s->rr = malloc(s->len);
	s->pr = mmap(NULL, s->len, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!s->re || !s->rl || !s->rr || s->pr == MAP_FAILED)
		return DS_FAIL(s, "memory");
	if (ds_alloc(s, s->xfd, &s->e, &s->pe) || ds_alloc(s, s->yfd, &s->l, &s->pl))
		return -1;
	fill_random(s->re, s->len, rnd64(&s->rnd));
	fill_random(s->rl, s->len, rnd64(&s->rnd));
	fill_random(s->rr, s->len, rnd64(&s->rnd));
	memcpy(s->pe, s->re, s->len);
	memcpy(s->pl, s->rl, s->len);
	memcpy(s->pr, s->rr, s->len);
	return ds_export(s);
}

static int ds_destroy(struct dsoak *s)
{
	int r = ds_unexport(s), r1, r2;

	munmap(s->pe, s->len);
	munmap(s->pl, s->len);
	munmap(s->pr, s->len);
	r1 = cxla_free(s->xfd, s->e.handle);
	r2 = cxla_free(s->yfd, s->l.handle);
	free(s->re);
	free(s->rl);
	free(s->rr);
	if (!r && (r1 || r2))
		r = DS_FAIL(s, "FREE of the buffers: %d, %d", r1, r2);
	return r;
}

static int ds_step(struct dsoak *s, int op, uint8_t *tmp)
{
	size_t len = s->len, so = rnd64(&s->rnd) % len, dof = rnd64(&s->rnd) % len;
	size_t n = 1 + rnd64(&s->rnd) % (len - (so > dof ? so : dof));
	uint64_t pat = rnd64(&s->rnd);
	struct cxl_accel_atomic at;
	uint8_t *dp = NULL, *dref = NULL;
	const char *what = dk_names[op];
	uint64_t old;
	uint32_t crc;
	int r = 0;
	size_t i;

	switch (op) {
	case DK_CPU_WRITE:
		switch (pat % 4) {
		case 0: dp = s->pe; dref = s->re; break;
		case 1: dp = s->pdm; dref = s->re; break;	/* same memory */
		case 2: dp = s->pl; dref = s->rl; break;
		default: dp = s->pr; dref = s->rr; break;
		}
		fill_random(dref + dof, n, pat);
		memcpy(dp + dof, dref + dof, n);
		break;
	case DK_PULL:	/* E (peer memory) -> L */
		memcpy(tmp, s->re + so, n);
		dp = s->pl;
		dref = s->rl;
		r = cxla_copy(s->yfd, cxla_dev(s->ie, so), cxla_dev(s->l.handle, dof), n, 0);
		break;
	case DK_PUSH:	/* L -> E */
		memcpy(tmp, s->rl + so, n);
		dp = s->pe;
		dref = s->re;
		r = cxla_copy(s->yfd, cxla_dev(s->l.handle, so), cxla_dev(s->ie, dof), n, 0);
		break;
	case DK_TO_RAM:	/* E -> R */
		memcpy(tmp, s->re + so, n);
		dp = s->pr;
		dref = s->rr;
		r = cxla_copy(s->yfd, cxla_dev(s->ie, so), cxla_user(s->pr + dof), n, 0);
		break;
	case DK_FROM_RAM:	/* R -> E */
		memcpy(tmp, s->rr + so, n);
		dp = s->pe;
		dref = s->re;
		r = cxla_copy(s->yfd, cxla_user(s->pr + so), cxla_dev(s->ie, dof), n, 0);
		break;
	case DK_FILL:
		for (i = 0; i < n; i++)
			tmp[i] = (uint8_t)(pat >> (8 * (i % 8)));
		dp = s->pe;
		dref = s->re;
		r = cxla_fill(s->yfd, cxla_dev(s->ie, dof), n, pat, 0);
		break;
	case DK_CRC:
		r = cxla_checksum(s->yfd, cxla_dev(s->ie, so), n, 0, &crc);
		if (!r && crc != crc32c(0, s->re + so, n))
			return DS_FAIL(s, "dev%d checksum of the import, %zu bytes at %zu: %#x, expected %#x",
				       s->y, n, so, crc, crc32c(0, s->re + so, n));
		if (r == -EIO)
			break;
		if (!r)
			r = cxla_checksum(s->xfd, cxla_dev(s->e.handle, so), n, 0, &crc);
		if (!r && crc != crc32c(0, s->re + so, n))
			return DS_FAIL(s, "dev%d checksum of E, %zu bytes at %zu: %#x, expected %#x",
				       s->x, n, so, crc, crc32c(0, s->re + so, n));
		s->st->verified += r ? 0 : 2 * n;
		break;
	case DK_ATOMIC:
		dof &= ~7UL;
		memcpy(&old, s->re + dof, 8);
		r = cxla_atomic(s->yfd, cxla_dev(s->ie, dof), CXL_ACCEL_ATOMIC_FETCH_ADD,
				8, pat, 0, 1, 0, &at);
		if (!r && at.result != old)
			return DS_FAIL(s, "fetch-add at %zu: old value %#llx, expected %#llx",
				       dof, (unsigned long long)at.result,
				       (unsigned long long)old);
		old += pat;
		memcpy(tmp, &old, 8);
		n = 8;
		dp = s->pe;
		dref = s->re;
		break;
	case DK_MMAP_READ:
		s->st->verified += len;
		if (memcmp(s->pdm, s->re, len))
			return DS_FAIL(s, "the DMA-BUF mapping differs from the buffer's");
		break;
	case DK_REEXPORT:
		if (ds_unexport(s) || ds_export(s))
			return -1;
		/* what was there is still there, seen through the new import */
		r = cxla_checksum(s->yfd, cxla_dev(s->ie, 0), len, 0, &crc);
		if (!r && crc != crc32c(0, s->re, len))
			return DS_FAIL(s, "E exported again: checksum %#x, expected %#x",
				       crc, crc32c(0, s->re, len));
		break;
	case DK_RECREATE:
		if (ds_destroy(s) || ds_create(s))
			return -1;
		break;
	}
	s->st->ops[op]++;
	if (r == -EIO && op == DK_ATOMIC) {
		uint64_t now = *(volatile uint64_t *)(s->pe + dof);

		/* one addition, done or not */
		if (now != old && now != old - pat)
			return DS_FAIL(s, "fetch-add at %zu failed: value %#llx, neither %#llx nor %#llx",
				       dof, (unsigned long long)now,
				       (unsigned long long)(old - pat),
				       (unsigned long long)old);
	}
	if (r == -EIO) {
		s->st->eio[op]++;
		if (dp && op != DK_CPU_WRITE &&
		    ds_adopt(s, dp, dref, dof, n, tmp, what))
			return -1;
	} else if (r) {
		return DS_FAIL(s, "%s (%zu bytes, %zu -> %zu, dev%d -> dev%d): %s",
			       what, n, so, dof, s->x, s->y, strerror(-r));
	} else if (dp && op != DK_CPU_WRITE) {
		memcpy(dref + dof, tmp, n);
		s->st->copied += n;
	}
	return ds_verify(s, what);
}

static int ds_proc(const FIXTURE_DATA(devs) *c, int id, int secs, struct dsoak_stats *st)
{
	static const int weight[DK_NOPS] = { 10, 12, 12, 8, 8, 8, 10, 6, 4, 6, 2 };
	struct dsoak s = { .st = st, .x = id, .y = 1 - id,
			   .rnd = 0xd5ULL * (id + 1) + (uint64_t)time(NULL) };
	double t0 = now_sec();
	uint8_t *tmp = malloc(2 * MiB);
	int k, total = 0;

	s.xfd = open(c->path[s.x], O_RDWR | O_CLOEXEC);
	s.yfd = open(c->path[s.y], O_RDWR | O_CLOEXEC);
	if (s.xfd < 0 || s.yfd < 0 || !tmp)
		return DS_FAIL(&s, "set-up: %s", strerror(errno));
	if (ds_create(&s))
		return -1;
	for (k = 0; k < DK_NOPS; k++)
		total += weight[k];
	while (now_sec() - t0 < secs) {
		int pick = (int)(rnd64(&s.rnd) % total), op = 0;

		while (pick >= weight[op])
			pick -= weight[op++];
		if (ds_step(&s, op, tmp))
			return -1;
	}
	if (ds_destroy(&s))
		return -1;
	close(s.xfd);
	close(s.yfd);
	return 0;
}

struct ds_run {
	const FIXTURE_DATA(devs) *c;
	int secs;
	struct dsoak_stats *st;
};

static int ds_child(int i, void *arg)
{
	struct ds_run *r = arg;

	return ds_proc(r->c, i, r->secs, &r->st[i]);
}

static void ds_progress(void *arg, double t)
{
	struct dsoak_stats *st = arg;
	long ops = 0, eio = 0;
	int i, k;

	for (i = 0; i < DSOAK_PROCS; i++)
		for (k = 0; k < DK_NOPS; k++) {
			ops += st[i].ops[k];
			eio += st[i].eio[k];
		}
	printf("# soak_dmabuf %.0f s: %ld steps, %ld -EIO\n", t, ops, eio);
	fflush(stdout);
}

static int dmabuf_soak(int secs)
{
	static const char * const zero[] = {
		"exports", "attachments", "p2p_attachments", "mappings", "pins",
		"imports", "imports_mapped",
	};
	struct dsoak_stats *st = mmap(NULL, DSOAK_PROCS * sizeof(*st),
				      PROT_READ | PROT_WRITE,
				      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	long ops = 0, eio = 0, op[DK_NOPS] = { 0 }, eop[DK_NOPS] = { 0 };
	long exports = 0, imports = 0, p2p_imports = 0, partial = 0, aeio = 0, xeio = 0, live[3], v;
	unsigned long long verified = 0, copied = 0;
	char why[400] = "", eios[300] = "";
	FIXTURE_DATA(devs) cc = { 0 }, *c = &cc;
	struct cxl_accel_stats sts;
	struct ds_run run = { .c = c, .secs = secs, .st = st };
	int i, k, d, status = 0;
	size_t el = 0;

	if (st == MAP_FAILED || discover(c) || c->ndev < 2) {
		printf("RESULT soak_dmabuf FAIL needs two devices (%d found)\n", c->ndev);
		return 1;
	}
	memset(st, 0, DSOAK_PROCS * sizeof(*st));
	i = cxla_soak_procs(DSOAK_PROCS, secs, ds_child, &run, ds_progress, st,
			    &status);
	if (i >= 0)
		snprintf(why, sizeof(why), "process %d (dev%d -> dev%d): %s",
			 i, i, 1 - i, st[i].fail[0] ? st[i].fail :
			 WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) :
			 "failed");
	ops = eio = 0;
	for (i = 0; i < DSOAK_PROCS; i++) {
		for (k = 0; k < DK_NOPS; k++) {
			op[k] += st[i].ops[k];
			eop[k] += st[i].eio[k];
			ops += st[i].ops[k];
			eio += st[i].eio[k];
		}
		exports += st[i].exports;
		imports += st[i].imports;
		p2p_imports += st[i].p2p_imports;
		partial += st[i].partial;
		aeio += st[i].alloc_eio;
		xeio += st[i].export_eio;
		verified += st[i].verified;
		copied += st[i].copied;
	}
	for (k = 0; k < DK_NOPS; k++)
		if (eop[k])
			el += snprintf(eios + el, sizeof(eios) - el, "%s%s %ld",
				       el ? ", " : "", dk_names[k], eop[k]);
	if (aeio)
		el += snprintf(eios + el, sizeof(eios) - el, "%salloc %ld",
			       el ? ", " : "", aeio);
	if (xeio)
		el += snprintf(eios + el, sizeof(eios) - el, "%sexport %ld",
			       el ? ", " : "", xeio);
	eio += aeio + xeio;
	/* nothing left behind: the exports were released, UNEXPORTs included */
	if (!why[0] && cxla_dmabuf_module_live(c->name[0], live))
		snprintf(why, sizeof(why), "module_live unreadable");
	if (!why[0] && (live[0] || live[1] || live[2]))
		snprintf(why, sizeof(why), "module-wide live exports %ld attachments %ld imports %ld",
			 live[0], live[1], live[2]);
	if (!why[0] && (k = cxla_debugfs_dmabufs()) != 0)
		snprintf(why, sizeof(why), "dma_buf/bufinfo lists %d cxl_accel buffers", k);
	for (d = 0; d < c->ndev && !why[0]; d++) {
		for (k = 0; k < (int)ARRAY_SIZE(zero) && !why[0]; k++)
			if ((v = sysfs_long(c->name[d], zero[k])) != 0)
				snprintf(why, sizeof(why), "%s dmabuf/%s = %ld",
					 c->name[d], zero[k], v);
		if (!why[0] && (cxla_stats(c->fd[d], &sts) ||
				sts.driver[CXL_ACCEL_DSTAT_TIMEOUTS] ||
				sts.driver[CXL_ACCEL_DSTAT_QUARANTINED]))
			snprintf(why, sizeof(why), "%s: %llu timeouts, %llu quarantined",
				 c->name[d],
				 (unsigned long long)sts.driver[CXL_ACCEL_DSTAT_TIMEOUTS],
				 (unsigned long long)sts.driver[CXL_ACCEL_DSTAT_QUARANTINED]);
	}
	if (!why[0] && !eio)
		snprintf(why, sizeof(why), "no step was interrupted: were there kills?");
	printf("RESULT soak_dmabuf %s %d processes x %d s: %ld steps (%ld exports, %ld imports of which %ld peer-to-peer, %ld copies/fills/atomics through imports moving %.1f MB, %ld checksums), %ld -EIO (%s; %ld failed writes had written part), %.1f MB verified; no DMA-BUF, attachment, mapping or import left%s%s\n",
	       why[0] ? "FAIL" : "PASS", DSOAK_PROCS, secs, ops, exports, imports, p2p_imports,
	       op[DK_PULL] + op[DK_PUSH] + op[DK_TO_RAM] + op[DK_FROM_RAM] +
	       op[DK_FILL] + op[DK_ATOMIC], copied / 1e6, op[DK_CRC], eio,
	       el ? eios : "none", partial, verified / 1e6,
	       why[0] ? "; " : "", why);
	return why[0] ? 1 : 0;
}

/* ------------------------------------------------------------ modes */

CXLA_MODE(bench, "--bench", "[--full] [MiB...]", 0)
{
	return bench(argc, argv);
}

CXLA_MODE(soak, "--soak", "SECS", 1)
{
	return dmabuf_soak(atoi(argv[0]));
}

CXLA_PROGRAM(.name = "dmabuf-tests", .prefix = "dmabuf.", .timeout_s = TEST_TIMEOUT_S);
