/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The test harness of the cxl-accel guest test programs. A program is its
 * tests, fixtures and extra command-line modes, registered with the macros
 * below; main() and the runner are in cxla_harness.c, linked into each one.
 *
 *   FIXTURE(dev) {			data of one test, fresh in each child
 *           CXLA_DEVS;			-d device (and -P peer): c->fd, c->id...
 *           int extra;
 *   };
 *   FIXTURE_SETUP(dev) { return cxla_open_devs(&c->devs, CXLA_NO_PEER); }
 *   FIXTURE_TEARDOWN(dev) { ...; return verdict; }   (optional; after a
 *                                                    set-up that passed)
 *   CXLA_TEST_F(dev, identify) { CHECK(c->id.magic == ..., "..."); return PASS; }
 *   CXLA_TEST(crc_known) { ...; return PASS; }        (no fixture)
 *
 * Variants run every test of their fixture once each:
 *
 *   FIXTURE_VARIANT(mig) { uint32_t flags; };
 *   FIXTURE_VARIANT_ADD_DEFAULT(mig, coherent) { .flags = 0 };   "migrate"
 *   FIXTURE_VARIANT_ADD(mig, private) { .flags = PRIV };          "migrate.private"
 *
 * FIXTURE_ALIAS(peer, dev) is another fixture with the data of dev (its own
 * set-up and variants), FIXTURE_PEER(peer) marks one whose tests need -P,
 * FIXTURE_APPLIES(fx) says whether its tests run without -t (e.g. by the
 * device's mode). CXLA_PROGRAM() names the program, its default prefix,
 * the alarm and a prologue run before the first test.
 *
 * In a test, "c" is the fixture data and "variant" the variant (NULL for a
 * fixture without variants). A test returns PASS, FAIL or SKIP and says why
 * with DETAIL() (CHECK, OK and EXPECT_ERR fail with a message). Each test
 * runs in a child process of its own under an alarm (so a crash, a hang or
 * a leak in one cannot spoil the next); the runner prints one line per test:
 *
 *   RESULT <prefix><name> PASS|FAIL|SKIP <detail> [<seconds>s]
 *
 * A test whose parts depend on each other (a scenario: unplug-tests'
 * removal) may instead report each check as a result of its own with
 * cxla_result(); it then has no line of its own, unless its process dies
 * or it fails without a failed check. A prologue or a mode says what went
 * wrong the same way.
 *
 * Command line (every program): -d DEV, -P PEER-DEV, -p PREFIX, -t NAME
 * (repeatable: only these), -l (list), --peer-only (only the two-device
 * tests), plus the program's CXLA_OPTION()s and CXLA_MODE()s. A program's
 * option may take a letter of these for itself (mm-stress: -t SECONDS).
 */
#ifndef CXLA_HARNESS_H
#define CXLA_HARNESS_H

#include "cxla_test.h"

/* ------------------------------------------------------- verdicts */

/* the detail of the running test (shared with the runner), DETAIL_LEN bytes */
extern char *cxla_detail;

#define DETAIL(...)	snprintf(cxla_detail, DETAIL_LEN, __VA_ARGS__)
#define FAILF(...)	do { DETAIL(__VA_ARGS__); return FAIL; } while (0)
#define CHECK(cond, ...) do { if (!(cond)) FAILF(__VA_ARGS__); } while (0)
/* an ioctl wrapper result that must be 0 */
#define OK(expr) do {							\
	int __r = (expr);						\
	if (__r)							\
		FAILF("%s:%d: %s = %d (%s)", __func__, __LINE__, #expr,	\
		      __r, strerror(-__r));				\
} while (0)
/* an ioctl wrapper result that must be -err */
#define EXPECT_ERR(expr, err) do {					\
	int __r = (expr);						\
	if (__r != -(err))						\
		FAILF("%s:%d: %s = %d (%s), expected -%s",		\
		      __func__, __LINE__, #expr, __r,			\
		      __r ? strerror(-__r) : "ok", #err);		\
} while (0)

/* ------------------------------------------------- registered objects */

struct cxla_variant {
	const char *suffix;		/* ".suffix" after the test name, or NULL */
	const void *data;
	int line;			/* runs in source order */
	struct cxla_variant *next;
};

struct cxla_fixture {
	const char *name;
	int (*setup)(void *c, const void *variant);
	int (*teardown)(void *c, const void *variant, int verdict);
	bool (*applies)(void);		/* run without -t? (in the runner) */
	bool peer;			/* needs -P: not run without it */
	struct cxla_variant *variants;
};

struct cxla_test {
	const char *name;
	struct cxla_fixture *fixture;	/* or NULL */
	int (*run)(const struct cxla_test *t, const void *variant);
	int line;
	struct cxla_test *next;
};

/* Each program defines one, with CXLA_PROGRAM(). */
struct cxla_program {
	const char *name;		/* in the summary line */
	const char *prefix;		/* default -p */
	unsigned int timeout_s;		/* alarm() in every test */
	/* in the runner before the first test: 0, or an exit status */
	int (*prologue)(void);
};
extern const struct cxla_program cxla_program;
#define CXLA_PROGRAM(...) const struct cxla_program cxla_program = { __VA_ARGS__ }

/* A program option that takes an argument (usage: its name), or a flag. */
struct cxla_option {
	const char *name;		/* "-s" */
	const char *arg;		/* "SECS", or NULL */
	void (*set)(const char *arg);
	struct cxla_option *next;
};

/*
 * A mode: "PROG WORD ARGS..." runs fn(argc, argv) on the words after WORD
 * (at least min_args of them) instead of the tests; its exit status.
 */
struct cxla_mode {
	const char *word;		/* "--soak" */
	const char *args;		/* for the usage line */
	int min_args;
	int (*fn)(int argc, char **argv);
	struct cxla_mode *next;
};

void cxla_register_test(struct cxla_test *t);
void cxla_register_variant(struct cxla_fixture *f, struct cxla_variant *v);
void cxla_register_option(struct cxla_option *o);
void cxla_register_mode(struct cxla_mode *m);
/* setup, the test, teardown of one fixture test (in the child) */
int cxla_fixture_run(const struct cxla_fixture *f, void *c, const void *variant,
		     int (*fn)(void *c, const void *variant));

#define CXLA_CTOR(id)	static void __attribute__((constructor)) id(void)

/* ------------------------------------------------------------ macros */

#define FIXTURE_DATA(fx)		cxla_fx_##fx##_t
#define FIXTURE_VARIANT_DATA(fx)	struct cxla_fxv_##fx

#define CXLA_FIXTURE_DECL(fx)						\
	FIXTURE_VARIANT_DATA(fx);					\
	static struct cxla_fixture cxla_fixture_##fx = { .name = #fx }

/* FIXTURE(fx) { members }; */
#define FIXTURE(fx)							\
	CXLA_FIXTURE_DECL(fx);						\
	typedef struct cxla_fx_##fx FIXTURE_DATA(fx);			\
	struct cxla_fx_##fx

/* another fixture with the data of fixture of (its own set-up, variants) */
#define FIXTURE_ALIAS(fx, of)						\
	CXLA_FIXTURE_DECL(fx);						\
	typedef FIXTURE_DATA(of) FIXTURE_DATA(fx)

/* the fixture's tests need two devices (-P): left out without one */
#define FIXTURE_PEER(fx)						\
	CXLA_CTOR(cxla_peer_##fx) { cxla_fixture_##fx.peer = true; }

/* FIXTURE_SETUP(fx) { ...; return PASS (go on), FAIL or SKIP; } */
#define FIXTURE_SETUP(fx)						\
	static int cxla_setup_##fx(FIXTURE_DATA(fx) *c,			\
				   const FIXTURE_VARIANT_DATA(fx) *variant); \
	static int cxla_setup_v_##fx(void *c, const void *v)		\
	{ return cxla_setup_##fx(c, v); }				\
	CXLA_CTOR(cxla_setup_reg_##fx)					\
	{ cxla_fixture_##fx.setup = cxla_setup_v_##fx; }		\
	static int cxla_setup_##fx(FIXTURE_DATA(fx) *c,			\
				   const FIXTURE_VARIANT_DATA(fx) *variant)

/* FIXTURE_TEARDOWN(fx) { ...; return verdict (or another one); } */
#define FIXTURE_TEARDOWN(fx)						\
	static int cxla_teardown_##fx(FIXTURE_DATA(fx) *c,		\
				      const FIXTURE_VARIANT_DATA(fx) *variant, \
				      int verdict);			\
	static int cxla_teardown_v_##fx(void *c, const void *v, int r)	\
	{ return cxla_teardown_##fx(c, v, r); }				\
	CXLA_CTOR(cxla_teardown_reg_##fx)				\
	{ cxla_fixture_##fx.teardown = cxla_teardown_v_##fx; }		\
	static int cxla_teardown_##fx(FIXTURE_DATA(fx) *c,		\
				      const FIXTURE_VARIANT_DATA(fx) *variant, \
				      int verdict)

/*
 * FIXTURE_APPLIES(fx) { return whether its tests run without -t; }
 * (in the runner, once per test; e.g. the device's mode)
 */
#define FIXTURE_APPLIES(fx)						\
	static bool cxla_applies_##fx(void);				\
	CXLA_CTOR(cxla_applies_reg_##fx)				\
	{ cxla_fixture_##fx.applies = cxla_applies_##fx; }		\
	static bool cxla_applies_##fx(void)

/* FIXTURE_VARIANT(fx) { members }; */
#define FIXTURE_VARIANT(fx)	FIXTURE_VARIANT_DATA(fx)

#define CXLA_VARIANT_ADD(fx, vn, sfx)					\
	static const FIXTURE_VARIANT_DATA(fx) cxla_fxv_##fx##_##vn;	\
	static struct cxla_variant cxla_var_##fx##_##vn = {		\
		.suffix = sfx, .data = &cxla_fxv_##fx##_##vn,		\
		.line = __LINE__,					\
	};								\
	CXLA_CTOR(cxla_var_reg_##fx##_##vn)				\
	{ cxla_register_variant(&cxla_fixture_##fx, &cxla_var_##fx##_##vn); } \
	static const FIXTURE_VARIANT_DATA(fx) cxla_fxv_##fx##_##vn =

/* FIXTURE_VARIANT_ADD(fx, vn) { initializer }; tests named NAME.vn */
#define FIXTURE_VARIANT_ADD(fx, vn)	CXLA_VARIANT_ADD(fx, vn, #vn)
/* the same, but the tests keep their own names */
#define FIXTURE_VARIANT_ADD_DEFAULT(fx, vn) CXLA_VARIANT_ADD(fx, vn, NULL)

/* CXLA_TEST_F(fx, name) { body with c and variant; return PASS...; } */
#define CXLA_TEST_F(fx, tn)						\
	static int cxla_test_##tn(FIXTURE_DATA(fx) *c,			\
				  const FIXTURE_VARIANT_DATA(fx) *variant); \
	static int cxla_test_v_##tn(void *c, const void *v)		\
	{ return cxla_test_##tn(c, v); }				\
	static int cxla_run_##tn(const struct cxla_test *t, const void *v) \
	{								\
		FIXTURE_DATA(fx) data;					\
									\
		memset(&data, 0, sizeof(data));				\
		return cxla_fixture_run(t->fixture, &data, v,		\
					cxla_test_v_##tn);		\
	}								\
	static struct cxla_test cxla_reg_##tn = {			\
		.name = #tn, .fixture = &cxla_fixture_##fx,		\
		.run = cxla_run_##tn, .line = __LINE__,			\
	};								\
	CXLA_CTOR(cxla_reg_ctor_##tn) { cxla_register_test(&cxla_reg_##tn); } \
	static int cxla_test_##tn(FIXTURE_DATA(fx) *c,			\
				  const FIXTURE_VARIANT_DATA(fx) *variant)

/* CXLA_TEST(name) { body; return PASS...; }: no fixture */
#define CXLA_TEST(tn)							\
	static int cxla_test_##tn(void);				\
	static int cxla_run_##tn(const struct cxla_test *t, const void *v) \
	{ return cxla_test_##tn(); }					\
	static struct cxla_test cxla_reg_##tn = {			\
		.name = #tn, .run = cxla_run_##tn, .line = __LINE__,	\
	};								\
	CXLA_CTOR(cxla_reg_ctor_##tn) { cxla_register_test(&cxla_reg_##tn); } \
	static int cxla_test_##tn(void)

/* CXLA_OPTION(id, "-s", "SECS") { use arg; } (arg NULL for a flag) */
#define CXLA_OPTION(id, opt, argname)					\
	static void cxla_opt_##id(const char *arg);			\
	static struct cxla_option cxla_optreg_##id = {			\
		.name = opt, .arg = argname, .set = cxla_opt_##id,	\
	};								\
	CXLA_CTOR(cxla_optctor_##id) { cxla_register_option(&cxla_optreg_##id); } \
	static void cxla_opt_##id(const char *arg)

/* CXLA_MODE(id, "--soak", "SECS DEV PEER", 3) { return status; } (argc, argv) */
#define CXLA_MODE(id, w, argsdesc, min)					\
	static int cxla_mode_##id(int argc, char **argv);		\
	static struct cxla_mode cxla_modereg_##id = {			\
		.word = w, .args = argsdesc, .min_args = min,		\
		.fn = cxla_mode_##id,					\
	};								\
	CXLA_CTOR(cxla_modector_##id) { cxla_register_mode(&cxla_modereg_##id); } \
	static int cxla_mode_##id(int argc, char **argv)

/* ------------------------------------------------- for the programs */

/* the command line shared by every program */
struct cxla_opts {
	const char *dev;		/* -d, default /dev/cxl-accel0 */
	const char *peer;		/* -P, or NULL */
	const char *prefix;		/* -p */
};
extern struct cxla_opts cxla_opt;

/* the test running in this child, and its name with the variant's suffix */
extern const struct cxla_test *cxla_current;
extern const char *cxla_current_name;

/*
 * The device under test (-d) and, for two-device tests, the peer (-P):
 * CXLA_DEVS in a fixture gives it c->path, c->fd, c->id, c->peer_path,
 * c->pfd (-1 without a peer), c->pid, and c->devs for cxla_open_devs().
 */
#define CXLA_DEVS_MEMBERS						\
	const char *path;						\
	const char *peer_path;						\
	int fd;								\
	int pfd;							\
	struct cxl_accel_identify id;					\
	struct cxl_accel_identify pid
struct cxla_devs {
	CXLA_DEVS_MEMBERS;
};
#define CXLA_DEVS union { struct cxla_devs devs; struct { CXLA_DEVS_MEMBERS; }; }

enum cxla_peer {
	CXLA_NO_PEER,			/* one device */
	CXLA_PEER_IF_GIVEN,		/* and the peer when there is one */
	CXLA_NEED_PEER,			/* two devices: SKIP without -P */
};

/*
 * Open (O_CLOEXEC) and IDENTIFY -d and, as peer says, -P: PASS, or FAIL or
 * SKIP with the reason in the detail.
 */
int cxla_open_devs(struct cxla_devs *d, enum cxla_peer peer);

/*
 * One RESULT line, <prefix><name>, for a check that is a result of its own
 * (see above): counted in the runner's summary in place of the test's line.
 */
void cxla_result(const char *name, int verdict, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif /* CXLA_HARNESS_H */
