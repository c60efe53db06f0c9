// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: the page copy engine of migration. Pages to copy (or to zero)
 * are grouped into naturally aligned runs of up to 2 MiB, sent as COPY_PAGES
 * commands with page lists (FILL for zero pages), a few commands in flight
 * on the device's engines. Every destination page is held by its command
 * until the device returns it (cxla_page_hold): a quarantined command
 * never writes into a page that went back to the allocator.
 */
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/sort.h>

#include "cxl_accel.h"
#include "core.h"
#include "pool.h"
#include "vq.h"
#include "xcopy.h"

#define CXLA_COPY_MAX_ORDER	(21 - PAGE_SHIFT)	/* 2 MiB pages at most */
#define CXLA_MAX_NOINTR		(30 * HZ)

/* ------------------------------------------------- page copy engine */


/* A run of xpages sent as one (large) page or one FILL segment */
struct cxla_xblock {
	u32 first;
	u32 count;
	u32 key;		/* one command per key: zero, spaces, order */
};

#define CXLA_XKEY(zero, ss, ds, order) \
	((u32)(zero) << 24 | (u32)(ss) << 16 | (u32)(ds) << 8 | (u32)(order))

struct cxla_xcmd {
	struct cxla_req *req;
	u32 b0;
	u32 nb;
	u64 expect;		/* result0 of a complete command */
	int ret;
};

static bool cxla_xnext(const struct cxla_xpage *a, const struct cxla_xpage *b,
		       unsigned int k)
{
	u64 off = (u64)k << PAGE_SHIFT;

	return b->zero == a->zero && b->sspace == a->sspace &&
	       b->dspace == a->dspace && b->dst == a->dst + off &&
	       (a->zero || b->src == a->src + off);
}

static unsigned int cxla_xblocks(const struct cxla_xpage *xp, unsigned int n,
				 struct cxla_xblock *b)
{
	unsigned int i = 0, nb = 0, run, p, end, order;

	while (i < n) {
		for (run = 1; i + run < n && cxla_xnext(&xp[i], &xp[i + run], run);
		     run++)
			;
		end = i + run;
		if (xp[i].zero) {
			/* FILL takes segments of any length */
			b[nb++] = (struct cxla_xblock){ i, run,
				CXLA_XKEY(1, 0, xp[i].dspace, 0) };
			i = end;
			continue;
		}
		for (p = i; p < end; p += 1U << order) {
			order = min_t(unsigned int, ilog2(end - p),
				      CXLA_COPY_MAX_ORDER);
			while (order &&
			       !IS_ALIGNED(xp[p].src | xp[p].dst, PAGE_SIZE << order))
				order--;
			b[nb++] = (struct cxla_xblock){ p, 1U << order,
				CXLA_XKEY(0, xp[p].sspace, xp[p].dspace, order) };
		}
		i = end;
	}
	return nb;
}

static int cxla_xblock_cmp(const void *a, const void *b)
{
	const struct cxla_xblock *x = a, *y = b;
	u64 kx = (u64)x->key << 32 | x->first, ky = (u64)y->key << 32 | y->first;

	return kx < ky ? -1 : kx > ky;
}

/* Blocks one command of this key may carry */
static unsigned int cxla_xcmd_limit(struct cxla_dev *cd, u32 key)
{
	size_t room = cd->max_request - sizeof(struct cxla_cmd_hdr);
	unsigned int order = key & 0xff;

	if (key >> 24)
		return min_t(size_t, cd->max_segments,
			     (room - sizeof(struct cxla_fill)) /
			     sizeof(struct cxla_sge));
	return min3((size_t)CXLA_MAX_PAGES,
		    (room - sizeof(struct cxla_copy_pages)) / (2 * sizeof(__le64)),
		    (size_t)(CXLA_MAX_TRANSFER >> (PAGE_SHIFT + order)));
}

static struct cxla_req *cxla_xcmd_build(struct cxla_dev *cd,
					const struct cxla_xpage *xp,
					const struct cxla_xblock *b, u32 nb,
					u64 *expect)
{
	u32 key = b[0].key, i, k, npages = 0;
	u16 sspace = (key >> 16) & 0xff, dspace = (key >> 8) & 0xff;
	struct cxla_page_hold *hold;
	struct cxla_req *req;

	for (i = 0; i < nb; i++)
		npages += b[i].count;
	hold = cxla_page_hold_alloc(npages);
	if (!hold)
		return ERR_PTR(-ENOMEM);

	if (key >> 24) {
		struct cxla_fill *f;
		struct cxla_sge *sge;

		req = cxla_req_alloc(cd, CXLA_OP_FILL, 0,
				     sizeof(*f) + nb * sizeof(*sge), 0);
		if (IS_ERR(req))
			goto err;
		f = cxla_req_payload(req);
		f->pattern = 0;
		f->nr_dst = cpu_to_le32(nb);
		sge = (struct cxla_sge *)(f + 1);
		for (i = 0; i < nb; i++) {
			sge[i].addr = cpu_to_le64(xp[b[i].first].dst);
			sge[i].len = cpu_to_le32(b[i].count << PAGE_SHIFT);
			sge[i].space = cpu_to_le16(dspace);
			sge[i].reserved = 0;
		}
		*expect = (u64)npages << PAGE_SHIFT;
	} else {
		struct cxla_copy_pages *c;
		__le64 *a;

		req = cxla_req_alloc(cd, CXLA_OP_COPY_PAGES, 0,
				     sizeof(*c) + 2 * nb * sizeof(*a), 0);
		if (IS_ERR(req))
			goto err;
		c = cxla_req_payload(req);
		c->nr_pages = cpu_to_le32(nb);
		c->page_size = cpu_to_le32(PAGE_SIZE << (key & 0xff));
		c->src_space = cpu_to_le16(sspace);
		c->dst_space = cpu_to_le16(dspace);
		c->reserved = 0;
		a = (__le64 *)(c + 1);
		for (i = 0; i < nb; i++) {
			a[i] = cpu_to_le64(xp[b[i].first].src);
			a[nb + i] = cpu_to_le64(xp[b[i].first].dst);
		}
		*expect = nb;
	}
	for (i = 0; i < nb; i++) {
		for (k = 0; k < b[i].count; k++) {
			const struct cxla_xpage *e = &xp[b[i].first + k];
			struct page *p = e->dstore ?: e->dpage;

			get_page(p);
			hold->pages[hold->n++] = p;
		}
	}
	cxla_req_set_hold(req, hold);
	return req;
err:
	kvfree(hold);
	return req;
}

static void cxla_xcmd_fail(struct cxla_xpage *xp, const struct cxla_xblock *b,
			   const struct cxla_xcmd *c)
{
	u32 i, k;

	for (i = c->b0; i < c->b0 + c->nb; i++)
		for (k = 0; k < b[i].count; k++)
			xp[b[i].first + k].failed = true;
}

/*
 * Copy (or zero) n pages with the device: COPY_PAGES and FILL commands, up
 * to engines + 1 in flight. Pages of failed commands get ->failed set.
 * Returns 0 or the first error.
 */
int cxla_xcopy(struct cxla_mig *mig, struct cxla_xpage *xp,
		      unsigned int n, unsigned int timeout_ms, bool intr)
{
	struct cxla_dev *cd = mig->cd;
	unsigned int nb, ncmd = 0, next = 0, done = 0, depth, i, g0, g1, per;
	unsigned long timeout = cxla_timeout_jiffies(timeout_ms);
	struct cxla_xblock *b;
	struct cxla_xcmd *cmds;
	int ret = 0, stop = 0;

	if (!n)
		return 0;
	if (!intr)
		timeout = min_t(unsigned long, timeout, CXLA_MAX_NOINTR);
	b = kvmalloc_array(n, sizeof(*b), GFP_KERNEL);
	cmds = kvmalloc_array(n, sizeof(*cmds), GFP_KERNEL);
	if (!b || !cmds) {
		ret = -ENOMEM;
		for (i = 0; i < n; i++)
			xp[i].failed = true;
		goto out;
	}
	nb = cxla_xblocks(xp, n, b);
	sort(b, nb, sizeof(*b), cxla_xblock_cmp, NULL);

	/* one key per command; big groups spread over the engines */
	for (g0 = 0; g0 < nb; g0 = g1) {
		for (g1 = g0 + 1; g1 < nb && b[g1].key == b[g0].key; g1++)
			;
		per = max(16U, DIV_ROUND_UP(g1 - g0, cd->num_dma_engines));
		per = min(per, cxla_xcmd_limit(cd, b[g0].key));
		for (i = g0; i < g1; i += per)
			cmds[ncmd++] = (struct cxla_xcmd){ .b0 = i,
				.nb = min(per, g1 - i) };
	}

	depth = clamp_t(unsigned int, cd->num_dma_engines + 1, 1, 8);
	while (done < ncmd) {
		while (next < ncmd && next - done < depth) {
			struct cxla_xcmd *c = &cmds[next++];
			struct cxla_req *req;
			int r;

			if (stop) {
				c->ret = stop;
				continue;
			}
			req = cxla_xcmd_build(cd, xp, b + c->b0, c->nb, &c->expect);
			if (IS_ERR(req)) {
				c->ret = PTR_ERR(req);
				continue;
			}
			atomic64_inc(&mig->stat[CXLA_MS_COPY_CMDS]);
			r = cxla_req_submit(cd, req, jiffies + timeout, intr);
			if (r) {
				cxla_req_free(cd, req);
				c->ret = r;
				stop = r;
				continue;
			}
			c->req = req;
		}

		{
			struct cxla_xcmd *c = &cmds[done++];

			if (c->req) {
				/* after a timeout, do not wait the full time again */
				int r = cxla_req_wait(cd, &c->req,
						      stop == -ETIMEDOUT ? 1 : timeout,
						      intr);

				if (c->req) {
					struct cxla_resp *resp = cxla_req_resp(c->req);

					if (!r && le64_to_cpu(resp->result0) != c->expect) {
						cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
						dev_err_ratelimited(&cd->dev,
								    "opcode %#x: result %llu, expected %llu\n",
								    c->req->opcode,
								    le64_to_cpu(resp->result0),
								    c->expect);
						r = -EIO;
					}
					cxla_req_free(cd, c->req);
					c->req = NULL;
				}
				c->ret = r;
				if (r == -EINTR || r == -ETIMEDOUT || r == -ENODEV)
					stop = stop ?: r;
			}
			if (c->ret) {
				cxla_xcmd_fail(xp, b, c);
				atomic64_inc(&mig->stat[CXLA_MS_COPY_FAIL]);
				ret = ret ?: c->ret;
			}
		}
	}
out:
	kvfree(cmds);
	kvfree(b);
	return ret;
}
