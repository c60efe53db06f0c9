// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: guest driver for the emulated CXL Type-2 style accelerator.
 *
 * The device is a virtio function (device ID 21, queue 0 commands, queue 1
 * events) plus an ivshmem-plain function in the same PCI slot whose BAR2 is
 * the accelerator's coherent memory. This file binds the virtio function,
 * checks what it is, and ties the parts together.
 */
#include <linux/idr.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ring.h>

#include "cxl_accel.h"
#include "cdev.h"
#include "core.h"
#include "cxl.h"
#include "cxlfw.h"
#include "devmem.h"
#include "dmabuf.h"
#include "evict.h"
#include "migrate.h"
#include "numa.h"
#include "poison.h"
#include "ras.h"
#include "pool.h"
#include "private.h"
#include "ramblk.h"
#include "sysfs.h"
#include "test_hmm.h"
#include "vq.h"

static unsigned int cxla_cmd_queues;
module_param_named(cmd_queues, cxla_cmd_queues, uint, 0444);
MODULE_PARM_DESC(cmd_queues,
		 "Command queues to use at most (0 = one per CPU, as many as the device offers)");

static DEFINE_IDA(cxla_ida);

static void cxla_dev_release(struct device *dev)
{
	struct cxla_dev *cd = to_cxla_dev(dev);

	cancel_work_sync(&cd->reap_work);
	cxla_poison_free(cd);
	cxla_cmdq_free(cd);
	cxla_mig_free(cd);
	kfree(cd->evt_bufs);
	if (cd->minor >= 0)
		ida_free(&cxla_ida, cd->minor);
	kfree(cd);
}

static int cxla_read_config(struct cxla_dev *cd)
{
	struct virtio_device *vdev = cd->vdev;
	u16 major, minor;
	u32 magic;

	virtio_cread_le(vdev, struct cxla_config, magic, &magic);
	virtio_cread_le(vdev, struct cxla_config, version_major, &major);
	virtio_cread_le(vdev, struct cxla_config, version_minor, &minor);
	if (magic != CXLA_MAGIC || major != CXLA_VERSION_MAJOR) {
		dev_err(&vdev->dev,
			"refusing virtio device %u: config magic %#x version %u.%u, this driver needs magic %#x (\"CXLA\") version %u.x\n",
			vdev->id.device, magic, major, minor, CXLA_MAGIC,
			CXLA_VERSION_MAJOR);
		return -ENODEV;
	}
	cd->version_minor = minor;
	virtio_cread_le(vdev, struct cxla_config, features, &cd->features);
	virtio_cread_le(vdev, struct cxla_config, devmem_size, &cd->devmem_size);
	virtio_cread_le(vdev, struct cxla_config, num_dma_engines,
			&cd->num_dma_engines);
	virtio_cread_le(vdev, struct cxla_config, max_segments,
			&cd->max_segments);
	virtio_cread_le(vdev, struct cxla_config, read_latency_ns,
			&cd->read_latency_ns);
	virtio_cread_le(vdev, struct cxla_config, write_latency_ns,
			&cd->write_latency_ns);
	virtio_cread_le(vdev, struct cxla_config, read_bandwidth_mbs,
			&cd->read_bandwidth_mbs);
	virtio_cread_le(vdev, struct cxla_config, write_bandwidth_mbs,
			&cd->write_bandwidth_mbs);
	virtio_cread_le(vdev, struct cxla_config, device_index,
			&cd->device_index);
	virtio_cread_le(vdev, struct cxla_config, page_size, &cd->page_size);
	virtio_cread_le(vdev, struct cxla_config, max_request, &cd->max_request);
	cd->num_cmd_queues = 1;
	if (minor >= 1)	/* 1.0 devices have one command queue, and 0 there */
		virtio_cread_le(vdev, struct cxla_config, num_cmd_queues,
				&cd->num_cmd_queues);
	cd->num_cmd_queues = clamp(cd->num_cmd_queues, 1U, CXLA_MAX_CMD_QUEUES);

	if (!cd->max_segments || cd->max_segments > CXLA_MAX_SEGMENTS)
		cd->max_segments = CXLA_MAX_SEGMENTS;
	if (!cd->max_request || cd->max_request > CXLA_MAX_REQUEST)
		cd->max_request = CXLA_MAX_REQUEST;
	if (cd->max_segments < 16 || cd->max_request < 4096) {
		dev_err(&vdev->dev,
			"device limits too small: %u segments, %u bytes per request\n",
			cd->max_segments, cd->max_request);
		return -ENODEV;
	}
	if (!cd->num_dma_engines)
		cd->num_dma_engines = 1;
	/* NUMA mode: the kernel owns device memory, the device allocates none */
	if (!(cd->features & (CXLA_F_ALLOC | CXLA_F_NUMA))) {
		dev_err(&vdev->dev, "device cannot allocate its memory (features %#llx)\n",
			cd->features);
		return -ENODEV;
	}
	return 0;
}

/*
 * One command queue per CPU, as many as the device offers (command queue k
 * is virtqueue 0 for k = 0, else k + 1), and the event queue.
 */
static int cxla_init_vqs(struct cxla_dev *cd)
{
	struct virtqueue_info info[CXLA_MAX_CMD_QUEUES + 1] = {};
	struct virtqueue *vqs[CXLA_MAX_CMD_QUEUES + 1], *cmd[CXLA_MAX_CMD_QUEUES];
	unsigned int ncmd = min(cd->num_cmd_queues, num_possible_cpus());
	bool events = cd->features & CXLA_F_EVENTS;
	unsigned int nvqs, k;
	int ret;

	if (cxla_cmd_queues)
		ncmd = min(ncmd, cxla_cmd_queues);
	/*
	 * Command queue 1 is virtqueue 2, behind the event queue: without the
	 * event queue the transport would number it 1 (unnamed entries get no
	 * index).
	 */
	if (!events)
		ncmd = 1;
	nvqs = ncmd > 1 ? ncmd + 1 : 1 + events;
	info[CXLA_QUEUE_CMD] = (struct virtqueue_info){ "command", cxla_cmd_done };
	if (events)	/* a NULL name leaves the queue alone */
		info[CXLA_QUEUE_EVENT] = (struct virtqueue_info){ "event", cxla_evt_done };
	for (k = 1; k < ncmd; k++)
		info[k + 1] = (struct virtqueue_info){ "command", cxla_cmd_done };

	ret = virtio_find_vqs(cd->vdev, nvqs, vqs, info, NULL);
	if (ret)
		return ret;
	cmd[0] = vqs[CXLA_QUEUE_CMD];
	for (k = 1; k < ncmd; k++)
		cmd[k] = vqs[k + 1];
	ret = cxla_cmdq_init(cd, cmd, ncmd);
	if (ret) {
		cd->vdev->config->del_vqs(cd->vdev);
		return ret;
	}
	cd->indirect = virtio_has_feature(cd->vdev, VIRTIO_RING_F_INDIRECT_DESC);
	cd->evt_vq = events ? vqs[CXLA_QUEUE_EVENT] : NULL;
	return 0;
}

/*
 * Stop everything that can touch memory or wait on the device: used by
 * remove and by probe's error path (after the queues exist).
 */
static void cxla_shutdown(struct cxla_dev *cd)
{
	struct virtio_device *vdev = cd->vdev;
	bool orphan;

	/* no new ioctls, mappings, page handouts or resets */
	down_write(&cd->map_sem);
	WRITE_ONCE(cd->dead, true);
	up_write(&cd->map_sem);
	/* a reset under way (the PCI core's, cxl.c's, a RAS recovery) ends first */
	if (cxla_reset_wait(cd, &cd->resetting))
		dev_warn(&cd->dev, "removal: a function reset did not end\n");
	wake_up_all(&cd->evt_wait);
	/* DMA-BUFs of this memory: importers told, CPU mappings zapped */
	cxla_dmabuf_revoke_exports(cd);
	cxla_zap_mappings(cd);
	/* migrated process pages back to system RAM while the device copies */
	cxla_mig_evict_all(cd);
	cxla_devmem_free_all(cd);

	cxla_cmdq_stop(cd);
	/* shared memory: the reset takes device memory away: out with it first */
	if (cxla_devmem_before_reset(cd)) {
		cxla_mig_teardown(cd);
		cxla_devmem_reset_grace(cd);
	}
	virtio_reset_device(vdev);
	/* no event comes any more: poison.c is done with the pool and files */
	cxla_poison_stop(cd);
	cxla_ras_stop(cd);
	/* the device touches no request any more: wake waiters, reap */
	cxla_cancel_all(cd);
	flush_work(&cd->reap_work);
	/* no request uses an import any more: release the attachments */
	cxla_dmabuf_detach_imports(cd);
	/* migrated pages that were busy: CPU copy, then the pool's chunks go */
	cxla_mig_teardown(cd);
	cxla_priv_teardown(cd);

	orphan = cxla_devmem_teardown(cd);
	vdev->config->del_vqs(vdev);
	if (!orphan)	/* else the last page released does it */
		cxla_devmem_release_pci(cd);
}

static int cxla_probe(struct virtio_device *vdev)
{
	struct cxl_accel_identify id;
	struct cxla_dev *cd;
	int ret;

	if (!vdev->config->get) {
		dev_err(&vdev->dev, "no config space access\n");
		return -EINVAL;
	}

	cd = kzalloc(sizeof(*cd), GFP_KERNEL);
	if (!cd)
		return -ENOMEM;
	device_initialize(&cd->dev);
	cd->dev.release = cxla_dev_release;
	cd->minor = -1;
	cd->vdev = vdev;
	spin_lock_init(&cd->cmd_lock);
	INIT_LIST_HEAD(&cd->reap_list);
	INIT_WORK(&cd->reap_work, cxla_reap_work);
	spin_lock_init(&cd->evt_lock);
	init_waitqueue_head(&cd->evt_wait);
	init_waitqueue_head(&cd->deferred_wait);
	init_waitqueue_head(&cd->unpaused);
	init_rwsem(&cd->map_sem);
	mutex_init(&cd->buf_lock);
	INIT_LIST_HEAD(&cd->bufs);
	mutex_init(&cd->files_lock);
	INIT_LIST_HEAD(&cd->files);
	cxla_dmabuf_init_dev(cd);
	cxla_devmem_init_dev(cd);
	ret = cxla_mig_init(cd);
	if (!ret)
		ret = cxla_poison_init(cd);
	if (ret)
		goto err_put;

	ret = cxla_read_config(cd);
	if (ret)
		goto err_put;

	ret = ida_alloc_max(&cxla_ida, CXLA_MAX_DEVICES - 1, GFP_KERNEL);
	if (ret < 0)
		goto err_put;
	cd->minor = ret;
	ret = dev_set_name(&cd->dev, CXLA_NAME "%d", cd->minor);
	if (ret)
		goto err_put;
	cxla_cdev_init_dev(cd);
	cd->dev.groups = cxla_groups;

	vdev->priv = cd;
	ret = cxla_init_vqs(cd);
	if (ret) {
		dev_err(&vdev->dev, "cannot set up virtqueues: %d\n", ret);
		goto err_put;
	}
	virtio_device_ready(vdev);

	/*
	 * Whatever an earlier driver instance or a crashed guest left on the
	 * device (buffers, undelivered events) belongs to nobody now.
	 */
	ret = cxla_simple_cmd(cd, CXLA_OP_RESET, NULL, 0, NULL, 0, NULL, 0,
			      false);
	if (ret) {
		dev_err(&vdev->dev, "RESET failed: %d\n", ret);
		goto err_shutdown;
	}

	if (cd->evt_vq) {
		ret = cxla_evt_init(cd);
		if (ret)
			goto err_shutdown;
	}

	if (cd->features & CXLA_F_NUMA)
		ret = cxla_numa_init(cd);	/* numa.c: no ivshmem function */
	else
		ret = cxla_devmem_init(cd);
	if (!ret && !(cd->features & CXLA_F_NUMA)) {
		cxla_dmabuf_p2p_init(cd);
		cxla_mig_register(cd, cd->devmem_gpa, cd->devmem_size, true,
				  dev_to_node(&cd->mem_pdev->dev));
	}
	if (!ret)
		ret = cxla_priv_init(cd, cxla_mig_priv_fault);	/* where the kernel can */
	if (ret)
		goto err_shutdown;

	ret = cxla_identify(cd, &id, false);
	if (ret) {
		dev_err(&vdev->dev, "IDENTIFY failed: %d\n", ret);
		goto err_shutdown;
	}
	if (id.magic != CXLA_MAGIC || id.devmem_size != cd->devmem_size ||
	    id.devmem_gpa != cd->devmem_gpa) {
		dev_err(&vdev->dev,
			"IDENTIFY disagrees with config: magic %#x size %llu gpa %#llx (config: size %llu, BAR at %#llx)\n",
			id.magic, id.devmem_size, id.devmem_gpa,
			cd->devmem_size, (u64)cd->devmem_gpa);
		ret = -EIO;
		goto err_shutdown;
	}

	/* a CXL endpoint (7.3): the CXL core enumerates it and its region */
	cxla_cxl_probe(cd);
	ret = cxla_ras_init(cd);
	if (ret)
		goto err_shutdown;

	ret = cxla_cdev_add(cd);
	if (ret) {
		dev_err(&vdev->dev, "cannot add character device: %d\n", ret);
		goto err_shutdown;
	}

	if (cd->features & CXLA_F_NUMA)
		dev_info(&cd->dev,
			 "%llu MiB device memory at %#llx is NUMA node %d, %u DMA engines, features %#llx, device index %u\n",
			 cd->devmem_size >> 20, (u64)cd->devmem_gpa,
			 cd->mig->node, cd->num_dma_engines, cd->features,
			 cd->device_index);
	else
		dev_info(&cd->dev,
			 "%llu MiB coherent device memory at %#llx (%s BAR%d), %u DMA engines, features %#llx, device index %u\n",
			 cd->devmem_size >> 20, (u64)cd->devmem_gpa,
			 pci_name(cd->mem_pdev), cd->mem_bar,
			 cd->num_dma_engines, cd->features, cd->device_index);
	return 0;

err_shutdown:
	cxla_shutdown(cd);
err_put:
	vdev->priv = NULL;
	cd->vdev = NULL;
	put_device(&cd->dev);
	return ret;
}

static void cxla_remove(struct virtio_device *vdev)
{
	struct cxla_dev *cd = vdev->priv;

	/* no new opens, sysfs gone; open files see -ENODEV from now on */
	cxla_cdev_del(cd);
	cxla_shutdown(cd);
	dev_info(&vdev->dev, "%s removed\n", dev_name(&cd->dev));
	vdev->priv = NULL;
	cd->vdev = NULL;
	put_device(&cd->dev);
}

#ifdef CXLA_HAVE_VIRTIO_RESET
/*
 * A function reset (FLR: sysfs reset, a VFIO user; cxl.c's CXL Reset),
 * which virtio-pci brackets with these two. The device forgets its
 * virtqueues; device memory stays (the daemon's file; with CXL the CXL.mem
 * state too, CXL r3.1 9.5, so the region survives), but the guest cannot
 * reach it for a while: QEMU takes the BAR away while memory decoding is
 * off, and a shared memory region until the daemon maps it again. So
 * first faults wait and CPU mappings of device memory are zapped, migrated
 * pages go back to RAM while the device still copies, then commands wait,
 * those in flight get the command timeout to come back (the rest end with
 * -EIO), and the virtqueues go. reset_done builds them again, has the
 * device confirm its memory (SET_DEVMEM_BASE, as at probe) and lets the
 * waiters on.
 */
static int cxla_reset_prepare(struct virtio_device *vdev)
{
	struct cxla_dev *cd = vdev->priv;
	unsigned long t0 = jiffies;
	unsigned int busy;

	/*
	 * Not during probe, nor once removal began: it sets dead under
	 * map_sem, then waits for a reset that set resetting before.
	 */
	if (!cd || !cd->cmdq)
		return -ENODEV;
	down_write(&cd->map_sem);
	if (cd->dead) {
		up_write(&cd->map_sem);
		return -ENODEV;
	}
	WRITE_ONCE(cd->resetting, true);
	up_write(&cd->map_sem);
	cxla_zap_mappings(cd);
	cxla_dmabuf_zap(cd, 0, U64_MAX);
	cxla_mig_pause(cd);

	busy = cxla_cmdq_hold(cd, cxla_timeout_jiffies(0));
	virtio_reset_device(vdev);
	/* the reaper may submit (a FREE): it waits for reset_done, unflushed */
	cxla_cancel_all(cd);
	cxla_cmdq_detach(cd);
	cd->evt_vq = NULL;
	vdev->config->del_vqs(vdev);
	dev_info(&cd->dev,
		 "function reset: device quiet after %u ms%s\n",
		 jiffies_to_msecs(jiffies - t0),
		 busy ? ", commands in flight cancelled" : "");
	return 0;
}

static int cxla_reset_done(struct virtio_device *vdev)
{
	struct cxla_dev *cd = vdev->priv;
	int ret;

	ret = cxla_init_vqs(cd);
	if (!ret) {
		virtio_device_ready(vdev);
		cxla_cmdq_restart(cd);	/* for reset_owner only until released */
		if (cd->evt_vq)
			ret = cxla_evt_init(cd);
	}
	if (!ret)
		cxla_cxl_after_reset(cd);	/* the region's decoder, if it went */
	if (!ret && cd->mem_pdev) {
		/* before anyone else: a shared memory region is back only then */
		WRITE_ONCE(cd->reset_owner, current);
		ret = cxla_set_devmem_base(cd);
		WRITE_ONCE(cd->reset_owner, NULL);
	}
	if (ret) {
		/* commands fail (-ENODEV) from now on; removal still works */
		cxla_cmdq_stop(cd);
		dev_err(&cd->dev,
			"function reset: cannot set up the device again (%d); bind the driver again\n",
			ret);
	}
	down_write(&cd->map_sem);
	WRITE_ONCE(cd->resetting, false);
	up_write(&cd->map_sem);
	/* wakes whoever waits for either flag */
	cxla_cmdq_release(cd);
	if (!ret)
		dev_info(&cd->dev, "function reset: serving again\n");
	return ret;
}
#endif

static const struct virtio_device_id cxla_id_table[] = {
	{ CXLA_VIRTIO_ID, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, cxla_id_table);

static struct virtio_driver cxla_driver = {
	.driver.name = KBUILD_MODNAME,
	.id_table = cxla_id_table,
	.probe = cxla_probe,
	.remove = cxla_remove,
#ifdef CXLA_HAVE_VIRTIO_RESET
	.reset_prepare = cxla_reset_prepare,
	.reset_done = cxla_reset_done,
#endif
};

static int __init cxla_init(void)
{
	int ret;

	ret = cxla_core_init();
	if (ret)
		return ret;
	/* first in, last out: every migration back to RAM may use it */
	ret = cxla_ram_reserve_init();
	if (ret)
		goto err_wq;
	ret = cxla_chrdev_init();
	if (ret)
		goto err_reserve;
	ret = cxla_devmem_notifier_register();
	if (ret)
		goto err_chrdev;
	/* what platform firmware would have done for CXL functions (cxlfw.c) */
	cxla_cxl_firmware();
	ret = register_virtio_driver(&cxla_driver);
	if (ret)
		goto err_notifier;
	ret = cxla_test_hmm_init();
	if (ret)
		goto err_driver;
	return 0;

err_driver:
	unregister_virtio_driver(&cxla_driver);
err_notifier:
	cxla_devmem_notifier_unregister();
err_chrdev:
	cxla_chrdev_exit();
err_reserve:
	cxla_ram_reserve_exit();
err_wq:
	cxla_core_exit();
	return ret;
}

static void __exit cxla_exit(void)
{
	cxla_test_hmm_exit();
	/* removals wait for their pages instead of leaving them behind */
	WRITE_ONCE(cxla_unloading, true);
	unregister_virtio_driver(&cxla_driver);
	/* the CXL registrations outlive unbinds, not the module */
	cxla_cxl_exit();
	cxla_devmem_notifier_unregister();
	/* no device is left to migrate: the reserve and its refill (on cxla_wq) go */
	cxla_ram_reserve_exit();
	/* buffer frees deferred past removal hold device references */
	cxla_core_exit();
	cxla_chrdev_exit();
	ida_destroy(&cxla_ida);
}

module_init(cxla_init);
module_exit(cxla_exit);

MODULE_DESCRIPTION("Guest driver for the cxl-accel emulated CXL Type-2 style accelerator");
MODULE_AUTHOR("cxl-accel project");
MODULE_LICENSE("GPL");
