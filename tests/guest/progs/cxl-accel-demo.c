// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel-demo: a short tour of one accelerator.
 *
 * Usage: cxl-accel-demo [--host-memcpy MB/s] [/dev/cxl-accelN] [copy MiB]
 *        cxl-accel-demo --memcpy [MiB]
 *
 * The copy buffers in RAM are transparent huge pages (2 MiB aligned,
 * MADV_HUGEPAGE), as a driver developer's large buffers would be. With
 * --host-memcpy (ci/demo.sh measures it on the host with --memcpy before it
 * boots the guest) the device's DMA figures are also given as a fraction of
 * the host's memcpy. --memcpy alone measures memcpy (RAM to RAM) and exits.
 */
#define _GNU_SOURCE
#include "cxla_test.h"

#define MiB (1024ULL * 1024)

/* One line of /sys/class/cxl-accel/NAME/ATTR into buf ("?" if unreadable). */
static void sysfs_line(const char *dev, const char *attr, char *buf, size_t len)
{
	const char *name = strrchr(dev, '/');
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "/sys/class/cxl-accel/%s/%s",
		 name ? name + 1 : dev, attr);
	f = fopen(path, "r");
	if (!f || !fgets(buf, len, f))
		snprintf(buf, len, "?");
	if (f)
		fclose(f);
	buf[strcspn(buf, "\n")] = 0;
}

/* len bytes of THP-backed anonymous memory, 2 MiB aligned; NULL on failure */
static uint8_t *thp_alloc(size_t len)
{
	size_t span = len + 2 * MiB;
	uint8_t *p = mmap(NULL, span, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *a;

	if (p == MAP_FAILED)
		return NULL;
	a = (uint8_t *)(((uintptr_t)p + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1));
	if (a > p)
		munmap(p, a - p);
	munmap(a + len, p + span - (a + len));
	madvise(a, len, MADV_HUGEPAGE);
	return a;
}

/* The copy buffers: ram random, ram2 zeros, both THP; -1 if out of memory */
static int ram_pair(size_t len, uint8_t **ram, uint8_t **ram2)
{
	*ram = thp_alloc(len);
	*ram2 = thp_alloc(len);
	if (!*ram || !*ram2)
		return -1;
	fill_random(*ram, len, 1);
	memset(*ram2, 0, len);
	return 0;
}

/* Best of five memcpy() of len bytes between two THP buffers, in seconds */
static double memcpy_best(uint8_t *dst, const uint8_t *src, size_t len)
{
	double best = 1e9, t0;
	int rep;

	for (rep = 0; rep < 5; rep++) {
		t0 = now_sec();
		memcpy(dst, src, len);
		if (now_sec() - t0 < best)
			best = now_sec() - t0;
	}
	return best;
}

static int die(const char *what, int err)
{
	fprintf(stderr, "cxl-accel-demo: %s: %s\n", what, strerror(err));
	return 1;
}

int main(int argc, char **argv)
{
	const char *path = "/dev/cxl-accel0";
	size_t mib = 32, len, i;
	struct cxl_accel_identify id;
	struct cxl_accel_alloc a;
	double t0, dev_copy, dev_copy_back, cpu_to_dev, cpu_ram, best, host = 0;
	uint8_t *p, *ram, *ram2;
	char attach[64], function[64];
	uint32_t crc;
	int fd, r, rep, arg = 1;

	if (argc > 1 && !strcmp(argv[1], "--memcpy")) {
		len = (argc > 2 ? strtoul(argv[2], NULL, 0) : mib) * MiB;
		if (ram_pair(len, &ram, &ram2))
			return die("mmap", ENOMEM);
		printf("memcpy %zu MiB RAM -> RAM (best of 5): %.1f MB/s\n", len >> 20,
		       len / memcpy_best(ram2, ram, len) / 1e6);
		return 0;
	}
	if (argc > 2 && !strcmp(argv[1], "--host-memcpy")) {
		host = strtod(argv[2], NULL);
		arg = 3;
	}
	if (argc > arg)
		path = argv[arg];
	if (argc > arg + 1)
		mib = strtoul(argv[arg + 1], NULL, 0);
	len = mib * MiB;

	fd = open(path, O_RDWR);
	if (fd < 0)
		return die(path, errno);
	r = cxla_identify(fd, &id);
	if (r)
		return die("IDENTIFY", -r);
	printf("%s: cxl-accel %u.%u, %llu MiB device memory at guest-physical %#llx (%llu MiB free)\n",
	       path, id.version_major, id.version_minor,
	       (unsigned long long)(id.devmem_size >> 20),
	       (unsigned long long)id.devmem_gpa,
	       (unsigned long long)(id.devmem_free >> 20));
	sysfs_line(path, "attach", attach, sizeof(attach));
	sysfs_line(path, "mem_function", function, sizeof(function));
	if (!strncmp(attach, "shmem ", 6))
		printf("  device memory is %s of PCI function %s, the virtio function itself (a VIRTIO shared memory region)\n",
		       attach + 6, function);
	else if (!strncmp(attach, "bar ", 4))
		printf("  device memory is %s of PCI function %s, an ivshmem-plain function beside the virtio one\n",
		       attach + 4, function);
	else
		printf("  device memory: %s\n", attach);
	printf("  %u DMA engines, features %#llx, NUMA node %d; advertised latency read %u ns / write %u ns, bandwidth read %u / write %u MB/s\n",
	       id.num_dma_engines, (unsigned long long)id.features, id.numa_node,
	       id.read_latency_ns, id.write_latency_ns, id.read_bandwidth_mbs,
	       id.write_bandwidth_mbs);

	if (len > id.devmem_free / 2)
		len = id.devmem_free / 2 & ~(MiB - 1);
	r = cxla_alloc(fd, len, 0, &a);
	if (r)
		return die("ALLOC", -r);
	p = mmap(NULL, a.alloc_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		 (off_t)a.mmap_offset);
	if (p == MAP_FAILED)
		return die("mmap", errno);
	printf("  allocated %zu MiB: handle %u at device offset %#llx, mapped at %p\n",
	       len >> 20, a.handle, (unsigned long long)a.offset, (void *)p);

	/* coherent CPU write, device checksum */
	snprintf((char *)p, 64, "hello from the CPU, written through mmap");
	r = cxla_checksum(fd, cxla_dev(a.handle, 0), 64, 0, &crc);
	if (r)
		return die("CHECKSUM", -r);
	printf("  CPU wrote \"%s\"; device crc32c of those 64 bytes = %#010x (CPU computes %#010x) %s\n",
	       (char *)p, crc, crc32c(0, p, 64),
	       crc == crc32c(0, p, 64) ? "- match, no flush needed" : "- MISMATCH");

	/* device fill, CPU read */
	r = cxla_fill(fd, cxla_dev(a.handle, 4096), 4096, 0x2a2a2a2a2a2a2a2aULL, 0);
	if (r)
		return die("FILL", -r);
	for (i = 0; i < 4096 && p[4096 + i] == 0x2a; i++)
		;
	printf("  device filled 4 KiB with '*'; CPU reads \"%.16s...\" %s\n",
	       (char *)p + 4096, i == 4096 ? "- all 4096 bytes right" : "- WRONG");

	/* bandwidth: device copy vs CPU memcpy, RAM in transparent huge pages */
	if (ram_pair(len, &ram, &ram2))
		return die("mmap", ENOMEM);
	memset(p, 0, len);

	best = 1e9;
	for (rep = 0; rep < 3; rep++) {
		t0 = now_sec();
		r = cxla_copy(fd, cxla_user(ram), cxla_dev(a.handle, 0), len, 0);
		if (r)
			return die("COPY", -r);
		best = best < now_sec() - t0 ? best : now_sec() - t0;
	}
	dev_copy = best;
	best = 1e9;
	for (rep = 0; rep < 3; rep++) {
		t0 = now_sec();
		r = cxla_copy(fd, cxla_dev(a.handle, 0), cxla_user(ram2), len, 0);
		if (r)
			return die("COPY", -r);
		best = best < now_sec() - t0 ? best : now_sec() - t0;
	}
	dev_copy_back = best;
	if (memcmp(ram, ram2, len))
		printf("  COPY round trip: DATA MISMATCH\n");
	cpu_to_dev = memcpy_best(p, ram, len);
	cpu_ram = memcpy_best(ram2, ram, len);
	printf("  copy %zu MiB (device: best of 3; CPU: best of 5):\n", len >> 20);
	printf("    device DMA  RAM -> device memory  %8.1f MB/s", len / dev_copy / 1e6);
	if (host > 0)
		printf("  (%.2f of the host's memcpy)", len / dev_copy / 1e6 / host);
	printf("\n    device DMA  device memory -> RAM  %8.1f MB/s",
	       len / dev_copy_back / 1e6);
	if (host > 0)
		printf("  (%.2f of the host's memcpy)", len / dev_copy_back / 1e6 / host);
	printf("\n    CPU memcpy  RAM -> device memory  %8.1f MB/s\n", len / cpu_to_dev / 1e6);
	printf("    CPU memcpy  RAM -> RAM            %8.1f MB/s (in the guest)\n",
	       len / cpu_ram / 1e6);
	if (host > 0)
		printf("    host memcpy RAM -> RAM            %8.1f MB/s (measured before the boot)\n",
		       host);

	munmap(p, a.alloc_size);
	cxla_free(fd, a.handle);
	close(fd);
	return 0;
}
