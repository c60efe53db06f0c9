/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: the poisoned ranges of device memory (badrange.c), which
 * every part that hands out or maps device memory looks at; poison.c
 * keeps them as the device reports them.
 */
#ifndef CXL_ACCEL_BADRANGE_H
#define CXL_ACCEL_BADRANGE_H

#include <linux/types.h>

struct cxla_dev;

/* Ranges the driver remembers; the device keeps at most as many (MAX_RULES) */
#define CXLA_BADRANGE_MAX	256

struct cxla_badrange_entry {
	u64 start;
	u64 end;		/* exclusive */
};

int cxla_badrange_init(struct cxla_dev *cd);
void cxla_badrange_free(struct cxla_dev *cd);
bool cxla_badrange_hit(struct cxla_dev *cd, u64 off, u64 len);
bool cxla_badrange_add(struct cxla_dev *cd, u64 start, u64 end);
bool cxla_badrange_remove(struct cxla_dev *cd, u64 start, u64 end);
unsigned int cxla_badrange_list(struct cxla_dev *cd,
				struct cxla_badrange_entry *r, unsigned int max);

#endif /* CXL_ACCEL_BADRANGE_H */
