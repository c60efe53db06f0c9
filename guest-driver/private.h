/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: device memory as MEMORY_DEVICE_PRIVATE pages (private.c),
 * where the kernel has them; without CONFIG_DEVICE_PRIVATE, stubs.
 */
#ifndef CXL_ACCEL_PRIVATE_H
#define CXL_ACCEL_PRIVATE_H

#include <linux/errno.h>
#include <linux/mm_types.h>
#include <linux/types.h>

#include "compat.h"	/* CXLA_PRIVATE_THP */

struct cxla_dev;
struct page;
struct vm_fault;

/* brings a private page of cd back to RAM on a CPU access (migrate.c) */
typedef vm_fault_t (*cxla_priv_fault_t)(struct cxla_dev *cd,
					struct vm_fault *vmf);

int cxla_page_dev_addr(struct cxla_dev *cd, struct page *page, u64 *addr,
		       u16 *space);

#ifdef CONFIG_DEVICE_PRIVATE
int cxla_priv_init(struct cxla_dev *cd, cxla_priv_fault_t fault);
bool cxla_priv_backing_poisoned(struct page *page);
void cxla_priv_teardown(struct cxla_dev *cd);
bool cxla_page_is_priv(struct cxla_dev *cd, struct page *page);
void *cxla_priv_owner(struct cxla_dev *cd);
struct page *cxla_priv_backing(struct page *page);
unsigned long cxla_priv_used(struct cxla_dev *cd);
unsigned long cxla_priv_mapped(struct cxla_dev *cd, bool skip_poisoned);
void cxla_priv_pfns(struct cxla_dev *cd, unsigned long *first,
		    unsigned long *last);
unsigned long cxla_priv_get(struct cxla_dev *cd, unsigned long n,
			    struct page **pages, struct page **backing,
			    int *err);
#ifdef CXLA_PRIVATE_THP
struct page *cxla_priv_get_huge(struct cxla_dev *cd, struct page **first);
#endif
#else
static inline int cxla_priv_init(struct cxla_dev *cd, cxla_priv_fault_t fault)
{
	return 0;
}
static inline void cxla_priv_teardown(struct cxla_dev *cd) { }
static inline bool cxla_page_is_priv(struct cxla_dev *cd, struct page *page)
{
	return false;
}
static inline void *cxla_priv_owner(struct cxla_dev *cd) { return NULL; }
static inline struct page *cxla_priv_backing(struct page *page)
{
	return page;
}
static inline unsigned long cxla_priv_used(struct cxla_dev *cd) { return 0; }
static inline unsigned long cxla_priv_mapped(struct cxla_dev *cd,
					     bool skip_poisoned)
{
	return 0;
}
static inline void cxla_priv_pfns(struct cxla_dev *cd, unsigned long *first,
				  unsigned long *last)
{
	*first = 0;
	*last = 0;
}
static inline unsigned long cxla_priv_get(struct cxla_dev *cd, unsigned long n,
					  struct page **pages,
					  struct page **backing, int *err)
{
	*err = -EOPNOTSUPP;
	return 0;
}
#endif

#endif /* CXL_ACCEL_PRIVATE_H */
