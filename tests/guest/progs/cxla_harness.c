// SPDX-License-Identifier: GPL-2.0
/*
 * The runner of the guest test programs (see cxla_harness.h): the command
 * line, the list, and each test (with each variant of its fixture) in a
 * child process of its own, one RESULT line each.
 */
#include <stdarg.h>

#include "cxla_harness.h"

#define MAX_ONLY	128

struct cxla_opts cxla_opt = { .dev = "/dev/cxl-accel0" };
const struct cxla_test *cxla_current;
const char *cxla_current_name;

/* What a test's process tells the runner, in memory both see */
struct shared {
	char detail[DETAIL_LEN + 1];
	int reported[SKIP + 1];		/* cxla_result() lines, by verdict */
};

/* until the runner maps the shared one: for the modes and the prologue */
static struct shared early;
static struct shared *shared = &early;
char *cxla_detail = early.detail;

static struct cxla_test *tests;
static struct cxla_option *options;
static struct cxla_mode *modes;

static const char *only[MAX_ONLY];	/* -t */
static int nonly;
static bool peer_only;

/* registration runs in constructors, whose order is not promised: sort by line */
void cxla_register_test(struct cxla_test *t)
{
	struct cxla_test **p = &tests;

	while (*p && (*p)->line < t->line)
		p = &(*p)->next;
	t->next = *p;
	*p = t;
}

void cxla_register_variant(struct cxla_fixture *f, struct cxla_variant *v)
{
	struct cxla_variant **p = &f->variants;

	while (*p && (*p)->line < v->line)
		p = &(*p)->next;
	v->next = *p;
	*p = v;
}

/* (these only for the usage message: any order will do) */
void cxla_register_option(struct cxla_option *o)
{
	o->next = options;
	options = o;
}

void cxla_register_mode(struct cxla_mode *m)
{
	m->next = modes;
	modes = m;
}

int cxla_fixture_run(const struct cxla_fixture *f, void *c, const void *variant,
		     int (*fn)(void *c, const void *variant))
{
	int r = f->setup ? f->setup(c, variant) : PASS;

	/* the teardown undoes a set-up that went through */
	if (r != PASS)
		return r;
	r = fn(c, variant);
	return f->teardown ? f->teardown(c, variant, r) : r;
}

int cxla_open_devs(struct cxla_devs *d, enum cxla_peer peer)
{
	d->path = cxla_opt.dev;
	d->peer_path = peer != CXLA_NO_PEER ? cxla_opt.peer : NULL;
	d->fd = -1;
	d->pfd = -1;
	if (peer == CXLA_NEED_PEER && !d->peer_path) {
		DETAIL("needs a second device (-P)");
		return SKIP;
	}
	d->fd = open(d->path, O_RDWR | O_CLOEXEC);
	if (d->fd < 0 || cxla_identify(d->fd, &d->id)) {
		DETAIL("open/IDENTIFY %s: %s", d->path, strerror(errno));
		return FAIL;
	}
	if (!d->peer_path)
		return PASS;
	d->pfd = open(d->peer_path, O_RDWR | O_CLOEXEC);
	if (d->pfd < 0 || cxla_identify(d->pfd, &d->pid)) {
		DETAIL("open/IDENTIFY %s: %s", d->peer_path, strerror(errno));
		return FAIL;
	}
	return PASS;
}

static void print_result(const char *prefix, const char *name, int verdict,
			 const char *detail, double secs)
{
	const char *v = verdict == PASS ? "PASS" : verdict == SKIP ? "SKIP" : "FAIL";

	if (secs >= 0)
		printf("RESULT %s%s %s %s [%.1fs]\n", prefix, name, v,
		       detail && detail[0] ? detail : "-", secs);
	else
		printf("RESULT %s%s %s %s\n", prefix, name, v,
		       detail && detail[0] ? detail : "-");
	fflush(stdout);
}

void cxla_result(const char *name, int verdict, const char *fmt, ...)
{
	char detail[DETAIL_LEN];
	va_list ap;

	if (verdict != PASS && verdict != SKIP)
		verdict = FAIL;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	print_result(cxla_opt.prefix, name, verdict, detail, -1);
	__sync_fetch_and_add(&shared->reported[verdict], 1);
}

static void full_name(char *buf, size_t len, const struct cxla_test *t,
		      const struct cxla_variant *v)
{
	snprintf(buf, len, "%s%s%s", t->name, v && v->suffix ? "." : "",
		 v && v->suffix ? v->suffix : "");
}

static bool named(const char *name)
{
	int i;

	for (i = 0; i < nonly; i++)
		if (!strcmp(only[i], name))
			return true;
	return false;
}

/* Without -t: every test that applies (two-device ones only with -P). */
static bool selected(const struct cxla_test *t, const char *name)
{
	const struct cxla_fixture *f = t->fixture;
	bool peer = f && f->peer;

	if (peer_only && !peer)
		return false;
	if (nonly)
		return named(name);
	if (peer && !cxla_opt.peer)
		return false;
	return !f || !f->applies || f->applies();
}

/*
 * One test in a child process: counts[verdict] gets its verdict, or those of
 * the results it reported itself.
 */
static void run_one(const struct cxla_test *t, const struct cxla_variant *v,
		    const char *name, int counts[SKIP + 1])
{
	double t0 = now_sec();
	int status, rc = FAIL, i, reported = 0;
	bool ended = false;		/* by itself, with a verdict */
	pid_t pid;

	memset(shared, 0, sizeof(*shared));
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		snprintf(cxla_detail, DETAIL_LEN, "fork: %s", strerror(errno));
	} else if (!pid) {
		cxla_current = t;
		cxla_current_name = name;
		alarm(cxla_program.timeout_s);
		_exit(t->run(t, v ? v->data : NULL));
	} else {
		waitpid(pid, &status, 0);
		if (WIFEXITED(status) && WEXITSTATUS(status) <= SKIP) {
			rc = WEXITSTATUS(status);
			ended = true;
		} else if (WIFSIGNALED(status)) {
			/* the child's last words are part of the new detail */
			char last[DETAIL_LEN];

			snprintf(last, sizeof(last), "%s",
				 cxla_detail[0] ? cxla_detail : "no detail");
			snprintf(cxla_detail, DETAIL_LEN, "killed by signal %d%s (%s)",
				 WTERMSIG(status),
				 WTERMSIG(status) == SIGALRM ? ", timeout" : "",
				 last);
		}
	}
	for (i = PASS; i <= SKIP; i++) {
		counts[i] += shared->reported[i];
		reported += shared->reported[i];
	}
	/* the checks it reported speak for it, if they tell its end */
	if (reported && ended && (rc != FAIL || shared->reported[FAIL]))
		return;
	print_result(cxla_opt.prefix, name, rc, cxla_detail, now_sec() - t0);
	counts[rc]++;
}

/* the program's option of that name: it goes before a shared one */
static const struct cxla_option *option(const char *name)
{
	const struct cxla_option *o;

	for (o = options; o && strcmp(o->name, name); o = o->next)
		;
	return o;
}

static void usage(const char *argv0)
{
	const struct cxla_option *o;
	const struct cxla_mode *m;

	fprintf(stderr, "usage: %s [-d dev] [-P peer-dev] [-p prefix]%s [-l] [--peer-only]",
		argv0, option("-t") ? "" : " [-t test]...");
	for (o = options; o; o = o->next)
		fprintf(stderr, " [%s%s%s]", o->name, o->arg ? " " : "",
			o->arg ? o->arg : "");
	fprintf(stderr, "\n");
	for (m = modes; m; m = m->next)
		fprintf(stderr, "       %s %s %s\n", argv0, m->word, m->args);
}

static void list(void)
{
	const struct cxla_test *t;
	const struct cxla_variant *v;
	char name[200];

	for (t = tests; t; t = t->next) {
		const struct cxla_fixture *f = t->fixture;

		v = f ? f->variants : NULL;
		do {
			full_name(name, sizeof(name), t, v);
			printf("%s%s\n", name, f && f->peer ? " (two devices)" : "");
		} while (v && (v = v->next));
	}
}

/* whether a -t name is one of the tests */
static bool known(const char *want)
{
	const struct cxla_test *t;
	const struct cxla_variant *v;
	char name[200];

	for (t = tests; t; t = t->next) {
		v = t->fixture ? t->fixture->variants : NULL;
		do {
			full_name(name, sizeof(name), t, v);
			if (!strcmp(name, want))
				return true;
		} while (v && (v = v->next));
	}
	return false;
}

int main(int argc, char **argv)
{
	const struct cxla_test *t;
	const struct cxla_variant *v;
	int i, counts[SKIP + 1] = { 0 }, r;
	double t0 = now_sec();
	char name[200];
	void *mem;

	cxla_opt.prefix = cxla_program.prefix ? cxla_program.prefix : "";
	for (i = 1; i < argc; i++) {
		const struct cxla_option *o = option(argv[i]);
		const struct cxla_mode *m;
		const char *a = argv[i];
		bool more = i + 1 < argc;

		if (o && (!o->arg || more)) {
			o->set(o->arg ? argv[++i] : NULL);
		} else if (!strcmp(a, "-d") && more) {
			cxla_opt.dev = argv[++i];
		} else if (!strcmp(a, "-P") && more) {
			cxla_opt.peer = argv[++i];
		} else if (!strcmp(a, "-p") && more) {
			cxla_opt.prefix = argv[++i];
		} else if (!strcmp(a, "-t") && more && nonly < MAX_ONLY) {
			only[nonly++] = argv[++i];
		} else if (!strcmp(a, "-l")) {
			list();
			return 0;
		} else if (!strcmp(a, "--peer-only")) {
			peer_only = true;
		} else {
			for (m = modes; m && strcmp(m->word, a); m = m->next)
				;
			if (m && argc - i - 1 >= m->min_args) {
				return m->fn(argc - i - 1, argv + i + 1);
			} else {
				usage(argv[0]);
				return 2;
			}
		}
	}
	for (i = 0; i < nonly; i++)
		if (!known(only[i]))
			fprintf(stderr, "%s: no test %s\n", cxla_program.name, only[i]);

	/* the children write their detail where the runner reads it */
	mem = mmap(NULL, sizeof(*shared), PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		return 2;
	shared = mem;
	cxla_detail = shared->detail;
	if (cxla_program.prologue) {
		r = cxla_program.prologue();
		if (r)
			return r;
	}
	for (t = tests; t; t = t->next) {
		v = t->fixture ? t->fixture->variants : NULL;
		do {
			full_name(name, sizeof(name), t, v);
			if (!selected(t, name))
				continue;
			run_one(t, v, name, counts);
		} while (v && (v = v->next));
	}
	printf("# %s %s%s%s: %d passed, %d failed, %d skipped in %.1f s\n",
	       cxla_program.name, cxla_opt.dev, cxla_opt.peer ? " with " : "",
	       cxla_opt.peer ? cxla_opt.peer : "", counts[PASS], counts[FAIL],
	       counts[SKIP], now_sec() - t0);
	return counts[FAIL] ? 1 : 0;
}
