/* cgroup.h - the CPU and memory limits of the cgroup this process runs in
 * (a container's --cpus and --memory, a Kubernetes pod's limits), and the
 * server defaults they imply.
 *
 * Owns: reading the limits of cgroup v2 (cpu.max, memory.max) and of
 * cgroup v1 (cpu.cfs_quota_us over cpu.cfs_period_us,
 * memory.limit_in_bytes), from the process's own cgroup up to the top of
 * the mounted hierarchy, the tightest level winning; turning a CPU quota
 * into a thread count and a memory limit into the largest cache budget
 * that fits beside the weights.
 * Does not own: applying them (serve.c); cpusets (the engine's default
 * thread count already follows the CPU affinity mask).
 * ref: Linux Documentation/admin-guide/cgroup-v2.rst (cpu.max,
 * memory.max), cgroup-v1/memory.rst, scheduler/sched-bwc.rst (CFS quota).
 */
#ifndef HYSERVE_CGROUP_H
#define HYSERVE_CGROUP_H

#include <stdint.h>

#define CGROUP_ROOT_DEFAULT "/sys/fs/cgroup"

typedef struct cgroup_limits {
    int version;                /* 2 or 1; 0: no cgroup hierarchy found */
    double cpus;                /* CPU quota / period, in CPUs; 0: no CPU limit */
    uint64_t memory_bytes;      /* memory limit; 0: no limit */
} cgroup_limits;

/* Read the limits from the hierarchy mounted at root (CGROUP_ROOT_DEFAULT,
 * or a directory laid out like one in tests) for the cgroup that
 * proc_cgroup names (the text of /proc/self/cgroup; NULL: read that file).
 * Files that are missing or unreadable mean no limit; never fails. */
void cgroup_read(const char *root, const char *proc_cgroup, cgroup_limits *out);

/* Engine threads for the CPU limit: the quota rounded down (a thread that
 * is throttled stalls every barrier of its team), at least 1, at most
 * n_cpus. 0 when there is no CPU limit: the engine takes every CPU. */
int cgroup_threads(const cgroup_limits *l, int n_cpus);

/* What a memory limit keeps back for all but the weights and the cache
 * (scratch, OpenBLAS buffers, HTTP threads, the allocator): 64 MiB and
 * an eighth of the limit. */
uint64_t cgroup_headroom_bytes(uint64_t memory_bytes);

/* The largest cache budget that fits in memory_bytes beside weight_bytes
 * and the headroom; 0 when they leave no room. */
uint64_t cgroup_cache_fit(uint64_t memory_bytes, uint64_t weight_bytes);

#endif
