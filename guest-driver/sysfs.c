// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: sysfs attributes of /sys/class/cxl-accel/cxl-acceleN.
 */
#include <linux/device.h>
#include <linux/pci.h>
#include <linux/sysfs.h>

#include "cxl_accel.h"
#include "cdev.h"
#include "cxl.h"
#include "dmabuf.h"
#include "migrate.h"
#include "poison.h"
#include "ras.h"
#include "sysfs.h"
#include "vq.h"

/* a read-only attribute showing one field of struct cxla_dev */
#define CXLA_FIELD_ATTR(_name, _fmt, _field)				\
static ssize_t _name##_show(struct device *dev,				\
			    struct device_attribute *attr, char *buf)	\
{									\
	return sysfs_emit(buf, _fmt "\n", to_cxla_dev(dev)->_field);	\
}									\
static DEVICE_ATTR_RO(_name)

CXLA_FIELD_ATTR(devmem_size, "%llu", devmem_size);

static ssize_t devmem_gpa_show(struct device *dev,
			       struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%#llx\n", (u64)to_cxla_dev(dev)->devmem_gpa);
}
static DEVICE_ATTR_RO(devmem_gpa);

static ssize_t devmem_free_show(struct device *dev,
				struct device_attribute *attr, char *buf)
{
	struct cxl_accel_identify id;
	int ret;

	ret = cxla_identify(to_cxla_dev(dev), &id, true);
	if (ret)
		return ret;
	return sysfs_emit(buf, "%llu\n", id.devmem_free);
}
static DEVICE_ATTR_RO(devmem_free);

static ssize_t buffers_show(struct device *dev, struct device_attribute *attr,
			    char *buf)
{
	return sysfs_emit(buf, "%u\n", READ_ONCE(to_cxla_dev(dev)->nbufs));
}
static DEVICE_ATTR_RO(buffers);

CXLA_FIELD_ATTR(features, "%#llx", features);

static ssize_t version_show(struct device *dev, struct device_attribute *attr,
			    char *buf)
{
	return sysfs_emit(buf, "%u.%u\n", CXLA_VERSION_MAJOR,
			  to_cxla_dev(dev)->version_minor);
}
static DEVICE_ATTR_RO(version);

CXLA_FIELD_ATTR(dma_engines, "%u", num_dma_engines);
CXLA_FIELD_ATTR(device_index, "%u", device_index);

static ssize_t mem_function_show(struct device *dev,
				 struct device_attribute *attr, char *buf)
{
	struct cxla_dev *cd = to_cxla_dev(dev);

	return sysfs_emit(buf, "%s\n",
			  cd->mem_pdev ? pci_name(cd->mem_pdev) : "none");
}
static DEVICE_ATTR_RO(mem_function);

/* how device memory reaches the guest: the daemon's --attach */
static ssize_t attach_show(struct device *dev, struct device_attribute *attr,
			   char *buf)
{
	struct cxla_dev *cd = to_cxla_dev(dev);

	if (cd->features & CXLA_F_NUMA)
		return sysfs_emit(buf, "numa\n");
	return sysfs_emit(buf, "%s BAR%d\n",
			  cd->features & CXLA_F_SHMEM ? "shmem" : "bar",
			  cd->mem_bar);
}
static DEVICE_ATTR_RO(attach);

static ssize_t performance_show(struct device *dev,
				struct device_attribute *attr, char *buf)
{
	struct cxla_dev *cd = to_cxla_dev(dev);

	return sysfs_emit(buf,
			  "read_latency_ns %u\nwrite_latency_ns %u\nread_bandwidth_mbs %u\nwrite_bandwidth_mbs %u\n",
			  cd->read_latency_ns, cd->write_latency_ns,
			  cd->read_bandwidth_mbs, cd->write_bandwidth_mbs);
}
static DEVICE_ATTR_RO(performance);

#define CXLA_DSTAT_ATTR(_name, _idx)					\
static ssize_t _name##_show(struct device *dev,				\
			    struct device_attribute *attr, char *buf)	\
{									\
	return sysfs_emit(buf, "%lld\n",				\
			  atomic64_read(&to_cxla_dev(dev)->dstat[_idx])); \
}									\
static DEVICE_ATTR_RO(_name)

CXLA_DSTAT_ATTR(commands_submitted, CXL_ACCEL_DSTAT_SUBMITTED);
CXLA_DSTAT_ATTR(commands_completed, CXL_ACCEL_DSTAT_COMPLETED);
CXLA_DSTAT_ATTR(command_errors, CXL_ACCEL_DSTAT_ERRORS);
CXLA_DSTAT_ATTR(timeouts, CXL_ACCEL_DSTAT_TIMEOUTS);
CXLA_DSTAT_ATTR(interrupted, CXL_ACCEL_DSTAT_INTERRUPTED);
CXLA_DSTAT_ATTR(quarantined, CXL_ACCEL_DSTAT_QUARANTINED);
CXLA_DSTAT_ATTR(protocol_errors, CXL_ACCEL_DSTAT_PROTOCOL);
CXLA_DSTAT_ATTR(events, CXL_ACCEL_DSTAT_EVENTS);
CXLA_DSTAT_ATTR(hwpoison_faults, CXL_ACCEL_DSTAT_HWPOISON);
CXLA_DSTAT_ATTR(waits_polled, CXL_ACCEL_DSTAT_POLLED);
CXLA_DSTAT_ATTR(waits_slept, CXL_ACCEL_DSTAT_SLEPT);

/* Command queues in use (one per CPU, up to what the device offers). */
static ssize_t cmd_queues_show(struct device *dev,
			       struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%u\n", to_cxla_dev(dev)->nr_cmdq);
}
static DEVICE_ATTR_RO(cmd_queues);

static const char * const cxla_stat_names[CXLA_STAT_COUNT] = {
	[CXLA_STAT_COMMANDS] = "commands",
	[CXLA_STAT_ERRORS] = "errors",
	[CXLA_STAT_BYTES_COPIED] = "bytes_copied",
	[CXLA_STAT_BYTES_P2P] = "bytes_p2p",
	[CXLA_STAT_BYTES_FILLED] = "bytes_filled",
	[CXLA_STAT_BYTES_CHECKSUMMED] = "bytes_checksummed",
	[CXLA_STAT_ATOMIC_OPS] = "atomic_ops",
	[CXLA_STAT_PAGES_COPIED] = "pages_copied",
	[CXLA_STAT_EVENTS_SENT] = "events_sent",
	[CXLA_STAT_EVENTS_DROPPED] = "events_dropped",
	[CXLA_STAT_MEDIA_ERRORS] = "media_errors",
};

/* The device's own counters (STATS command), one "name value" per line. */
static ssize_t device_stats_show(struct device *dev,
				 struct device_attribute *attr, char *buf)
{
	struct cxla_dev *cd = to_cxla_dev(dev);
	struct cxla_stats st;
	ssize_t len = 0;
	int i, ret;

	ret = cxla_simple_cmd(cd, CXLA_OP_STATS, NULL, 0, &st, sizeof(st),
			      NULL, 0, true);
	if (ret)
		return ret;
	for (i = 0; i < CXLA_STAT_COUNT; i++) {
		if (!cxla_stat_names[i])
			continue;
		len += sysfs_emit_at(buf, len, "%s %llu\n", cxla_stat_names[i],
				     le64_to_cpu(st.counter[i]));
	}
	return len;
}
static DEVICE_ATTR_RO(device_stats);

static struct attribute *cxla_attrs[] = {
	&dev_attr_devmem_size.attr,
	&dev_attr_devmem_gpa.attr,
	&dev_attr_devmem_free.attr,
	&dev_attr_buffers.attr,
	&dev_attr_features.attr,
	&dev_attr_version.attr,
	&dev_attr_dma_engines.attr,
	&dev_attr_device_index.attr,
	&dev_attr_mem_function.attr,
	&dev_attr_attach.attr,
	&dev_attr_performance.attr,
	&dev_attr_commands_submitted.attr,
	&dev_attr_commands_completed.attr,
	&dev_attr_command_errors.attr,
	&dev_attr_timeouts.attr,
	&dev_attr_interrupted.attr,
	&dev_attr_quarantined.attr,
	&dev_attr_protocol_errors.attr,
	&dev_attr_events.attr,
	&dev_attr_hwpoison_faults.attr,
	&dev_attr_waits_polled.attr,
	&dev_attr_waits_slept.attr,
	&dev_attr_cmd_queues.attr,
	&dev_attr_device_stats.attr,
	NULL,
};

static const struct attribute_group cxla_group = {
	.attrs = cxla_attrs,
};

const struct attribute_group *cxla_groups[] = {
	&cxla_group,
	&cxla_dmabuf_group,	/* dmabuf/ (dmabuf.c) */
	&cxla_mig_group,	/* numa_node, migration (migrate.c) */
	&cxla_poison_group,	/* poison, poison_stats (poison.c) */
	&cxla_cxl_group,	/* cxl: the CXL region (cxl.c) */
	&cxla_ras_group,	/* cxl_ras, cxl_ras_mask (ras.c) */
	NULL,
};
