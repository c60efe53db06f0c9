// SPDX-License-Identifier: GPL-2.0
/*
 * The helpers of cxla_test.h that are more than an ioctl: reads that may
 * fault, the driver's DMA-BUFs as debugfs and sysfs count them, move_pages()
 * of a range, a CPU adder thread, the median of timings, a write to a sysfs
 * file. Linked into every guest program.
 */
#include <setjmp.h>
#include <sys/syscall.h>

#include "cxla_test.h"

#define MPOL_MF_MOVE	(1 << 1)

static sigjmp_buf fault_jmp;
static volatile sig_atomic_t fault_code;

static void on_fault(int sig, siginfo_t *si, void *uc)
{
	fault_code = si->si_code;
	siglongjmp(fault_jmp, sig);
}

int cxla_catch_fault(void (*fn)(void *arg), void *arg, int *si_code)
{
	struct sigaction sa = { .sa_sigaction = on_fault, .sa_flags = SA_SIGINFO };
	struct sigaction old_bus, old_segv;
	int sig;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &old_bus);
	sigaction(SIGSEGV, &sa, &old_segv);
	sig = sigsetjmp(fault_jmp, 1);
	if (!sig)
		fn(arg);
	else if (si_code)
		*si_code = fault_code;
	sigaction(SIGBUS, &old_bus, NULL);
	sigaction(SIGSEGV, &old_segv, NULL);
	return sig;
}

struct probe {
	const volatile uint8_t *p;
	uint8_t val;
};

static void read_byte(void *arg)
{
	struct probe *pr = arg;

	pr->val = *pr->p;
}

int cxla_probe_read(const volatile void *p, uint8_t *val, int *si_code)
{
	struct probe pr = { .p = p };
	int sig = cxla_catch_fault(read_byte, &pr, si_code);

	if (!sig)
		*val = pr.val;
	return sig;
}

int cxla_debugfs_dmabufs(void)
{
	FILE *f = fopen("/sys/kernel/debug/dma_buf/bufinfo", "r");
	char line[512];
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "cxl_accel"))
			n++;
	fclose(f);
	return n;
}

int cxla_dmabuf_module_live(const char *dev, long live[3])
{
	char p[256];
	FILE *f;
	int n;

	snprintf(p, sizeof(p), "/sys/class/cxl-accel/%s/dmabuf/module_live", dev);
	f = fopen(p, "r");
	if (!f)
		return -1;
	n = fscanf(f, "%ld %ld %ld", &live[0], &live[1], &live[2]);
	fclose(f);
	return n == 3 ? 0 : -1;
}

long cxla_move_pages(void *p, size_t len, int node)
{
	size_t n = len / 4096, i;
	void **pages = malloc(n * sizeof(*pages));
	int *nodes = malloc(n * sizeof(*nodes)), *status = malloc(n * sizeof(*status));
	long bad = 0;

	if (!pages || !nodes || !status) {
		bad = -ENOMEM;
		goto out;
	}
	for (i = 0; i < n; i++) {
		pages[i] = (uint8_t *)p + i * 4096;
		nodes[i] = node;
	}
	if (syscall(SYS_move_pages, 0, n, pages, nodes, status, MPOL_MF_MOVE) < 0)
		bad = -errno;
	else
		for (i = 0; i < n; i++)
			bad += status[i] != node;
out:
	free(pages);
	free(nodes);
	free(status);
	return bad;
}

void *cxla_cpu_adder(void *arg)
{
	struct cxla_adder *a = arg;

	while (!*a->stop) {
		__atomic_fetch_add(a->word, 1, __ATOMIC_SEQ_CST);
		a->adds++;
	}
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double cxla_median(double *v, int n)
{
	if (n <= 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int cxla_write_str(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY), r = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, s, strlen(s)) < 0)
		r = -errno;
	close(fd);
	return r;
}
