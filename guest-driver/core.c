// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: the bottom layer every other file uses. The module's
 * workqueue, the default command timeout, and deferred work counted per
 * device (frees, reaping, poison and RAS events run on the workqueue; a
 * caller that reports exact counts waits for its own device's first).
 */
#include <linux/jiffies.h>
#include <linux/module.h>
#include <linux/sched/signal.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include "cxl_accel.h"
#include "core.h"

unsigned int cxla_cmd_timeout_ms = 5000;
module_param_named(cmd_timeout_ms, cxla_cmd_timeout_ms, uint, 0644);
MODULE_PARM_DESC(cmd_timeout_ms,
		 "Default time a command may take before it fails with -ETIMEDOUT (ms)");

struct workqueue_struct *cxla_wq;

int cxla_core_init(void)
{
	/* no CPU affinity needed (7.x warns when neither is said) */
	cxla_wq = alloc_workqueue("cxl_accel", WQ_UNBOUND, 0);
	return cxla_wq ? 0 : -ENOMEM;
}

void cxla_core_exit(void)
{
	destroy_workqueue(cxla_wq);
}

/* A command's timeout in jiffies: timeout_ms, 0 for the module's default */
unsigned long cxla_timeout_jiffies(unsigned int timeout_ms)
{
	if (!timeout_ms)
		timeout_ms = READ_ONCE(cxla_cmd_timeout_ms);
	return msecs_to_jiffies(max(timeout_ms, 1U));
}

/*
 * Work queued on the module's workqueue (frees, reaping, poison), counted
 * per device: IDENTIFY and HMM_INFO wait for their own device's (exact
 * counts), never for another device's, which may be stalled or gone.
 */
void cxla_defer(struct cxla_dev *cd, struct work_struct *work)
{
	atomic_inc(&cd->deferred);
	if (!queue_work(cxla_wq, work))
		cxla_deferred_done(cd);
}

void cxla_defer_delayed(struct cxla_dev *cd, struct delayed_work *dwork,
			unsigned long delay)
{
	atomic_inc(&cd->deferred);
	if (!queue_delayed_work(cxla_wq, dwork, delay))
		cxla_deferred_done(cd);
}

void cxla_deferred_done(struct cxla_dev *cd)
{
	if (atomic_dec_and_test(&cd->deferred))
		wake_up_all(&cd->deferred_wait);
}

/*
 * Until this device's deferred work ran (each piece ends: its commands time
 * out), for at most four command timeouts: on a device other processes keep
 * busy the count may never reach zero, and the caller then reports counts a
 * little behind. A signal ends the wait when intr (-ERESTARTSYS).
 */
int cxla_deferred_wait(struct cxla_dev *cd, bool intr)
{
	unsigned long limit = 4 * cxla_timeout_jiffies(0);
	long left;

	if (!intr) {
		wait_event_timeout(cd->deferred_wait,
				   !atomic_read(&cd->deferred), limit);
		return 0;
	}
	left = wait_event_interruptible_timeout(cd->deferred_wait,
						!atomic_read(&cd->deferred),
						limit);
	return left < 0 ? left : 0;
}

/* How long a fault, migration or command waits for a function reset to end */
#define CXLA_RESET_WAIT_MS	60000

/*
 * Wait, killable, until a function reset clears *held (cd->resetting or
 * cd->cmds_held): 0 then, -EINTR on a fatal signal, -ETIMEDOUT when the
 * reset did not end in CXLA_RESET_WAIT_MS.
 */
int cxla_reset_wait(struct cxla_dev *cd, const bool *held)
{
	long left;

	left = wait_event_killable_timeout(cd->unpaused, !READ_ONCE(*held),
					   msecs_to_jiffies(CXLA_RESET_WAIT_MS));
	if (left < 0)
		return -EINTR;
	return left ? 0 : -ETIMEDOUT;
}
