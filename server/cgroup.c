/* cgroup.c - container limits from the cgroup filesystem.
 *
 * Owns: finding which hierarchy is mounted (v2: cgroup.controllers at the
 * root; v1: one directory per controller, "cpu,cpuacct" and "memory"),
 * the process's path in it (/proc/self/cgroup), and reading the limit
 * files at that path and every level above it.
 * Does not own: what the limits are used for (serve.c).
 *
 * Inside a container the hierarchy is usually mounted at the container's
 * own cgroup (a cgroup namespace, or a bind mount on v1) while
 * /proc/self/cgroup may still name the host's path ("/docker/<id>"):
 * levels that do not exist under the mount are skipped, and the mount's
 * root is always read, so both layouts give the container's limits.
 * ref: Linux Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/cgroups.rst.
 */
#include <dirent.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cgroup.h"

/* v1 writes "no limit" as a huge page-aligned number (LONG_MAX rounded
 * down to a page); anything this large is no limit */
#define V1_UNLIMITED (1ULL << 60)

/* Read a small text file into buf (NUL-terminated, trailing newline cut).
 * Returns 0 or -1. */
static int read_text(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t got = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[got] = '\0';
    while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == ' '))
        buf[--got] = '\0';
    return 0;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* True when the comma-separated list holds name ("cpu,cpuacct" has "cpu"). */
static bool list_has(const char *list, size_t len, const char *name)
{
    size_t nl = strlen(name);
    const char *p = list, *end = list + len;
    while (p < end) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        size_t l = c ? (size_t)(c - p) : (size_t)(end - p);
        if (l == nl && !memcmp(p, name, nl))
            return true;
        p += l + 1;
    }
    return false;
}

/* The path of this process's cgroup for a v1 controller (v2: controller
 * NULL, the "0::" line) from the text of /proc/self/cgroup, into out.
 * "/" when not found. */
static void self_path(const char *proc_cgroup, const char *controller, char *out, size_t n)
{
    snprintf(out, n, "/");
    const char *line = proc_cgroup;
    while (line && *line) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        /* hierarchy-id:controllers:path */
        const char *c1 = memchr(line, ':', len);
        const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - line)) : NULL;
        if (c2) {
            const char *ctrls = c1 + 1;
            size_t nctrl = (size_t)(c2 - ctrls);
            bool match = controller ? list_has(ctrls, nctrl, controller) : (nctrl == 0 && !strncmp(line, "0:", 2));
            if (match) {
                size_t pl = len - (size_t)(c2 + 1 - line);
                if (pl > 0 && pl < n) {
                    memcpy(out, c2 + 1, pl);
                    out[pl] = '\0';
                }
                return;
            }
        }
        line = eol ? eol + 1 : NULL;
    }
}

/* The v1 mount of a controller under root: "root/cpu", or any directory
 * whose comma-separated name holds it ("root/cpu,cpuacct"). Returns 0 or -1. */
static int v1_mount(const char *root, const char *controller, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", root, controller);
    if (is_dir(out))
        return 0;
    DIR *d = opendir(root);
    if (!d)
        return -1;
    int rc = -1;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || !list_has(de->d_name, strlen(de->d_name), controller))
            continue;
        snprintf(out, n, "%s/%s", root, de->d_name);
        if (is_dir(out)) {
            rc = 0;
            break;
        }
    }
    closedir(d);
    return rc;
}

/* One level's limit from the file of that name in dir; *found is set
 * when it holds a limit. */
typedef void (*level_reader)(const char *dir, const char *file, double *limit, bool *found);

static void min_into(double v, double *limit, bool *found)
{
    if (!*found || v < *limit)
        *limit = v;
    *found = true;
}

/* cgroup v2 cpu.max: "QUOTA PERIOD", or "max PERIOD" for none */
static void read_v2_cpu(const char *dir, const char *file, double *limit, bool *found)
{
    char path[PATH_MAX + 32], buf[128];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (read_text(path, buf, sizeof buf) || !strncmp(buf, "max", 3))
        return;
    char *end;
    double quota = strtod(buf, &end);
    double period = end != buf ? strtod(end, NULL) : 0;
    if (quota > 0 && period > 0)
        min_into(quota / period, limit, found);
}

/* cgroup v1 cpu.cfs_quota_us (-1 for none) over cpu.cfs_period_us beside it */
static void read_v1_cpu(const char *dir, const char *file, double *limit, bool *found)
{
    char path[PATH_MAX + 32], buf[64];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (read_text(path, buf, sizeof buf))
        return;
    double quota = strtod(buf, NULL);
    snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
    if (quota <= 0 || read_text(path, buf, sizeof buf))
        return;
    double period = strtod(buf, NULL);
    if (period > 0)
        min_into(quota / period, limit, found);
}

/* A byte count: v2 memory.max ("max" for none), v1 memory.limit_in_bytes
 * (a huge value for none) */
static void read_bytes(const char *dir, const char *file, double *limit, bool *found)
{
    char path[PATH_MAX + 32], buf[64];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (read_text(path, buf, sizeof buf) || !strncmp(buf, "max", 3))
        return;
    char *end;
    unsigned long long v = strtoull(buf, &end, 10);
    if (end != buf && v > 0 && v < V1_UNLIMITED)
        min_into((double)v, limit, found);
}

/* The tightest limit in file over mount + path and each level above it,
 * down to the mount itself; 0 when no level has one. */
static double walk_up(const char *mount, const char *path, const char *file, level_reader rd)
{
    char rel[PATH_MAX], dir[2 * PATH_MAX];
    double limit = 0;
    bool found = false;
    snprintf(rel, sizeof rel, "%s", path);
    for (;;) {
        size_t l = strlen(rel);
        while (l > 0 && rel[l - 1] == '/')
            rel[--l] = '\0';
        snprintf(dir, sizeof dir, "%s%s", mount, rel);
        if (is_dir(dir))
            rd(dir, file, &limit, &found);
        if (l == 0)
            break;
        char *slash = strrchr(rel, '/');
        if (!slash)
            break;
        *slash = '\0';
    }
    return found ? limit : 0;
}

void cgroup_read(const char *root, const char *proc_cgroup, cgroup_limits *out)
{
    char own[8192] = "", path[PATH_MAX], mount[PATH_MAX], probe[PATH_MAX + 32];
    memset(out, 0, sizeof *out);
    if (!root || !*root)
        root = CGROUP_ROOT_DEFAULT;
    if (!proc_cgroup) {
        if (read_text("/proc/self/cgroup", own, sizeof own))
            own[0] = '\0';
        proc_cgroup = own;
    }
    snprintf(probe, sizeof probe, "%s/cgroup.controllers", root);
    if (exists(probe)) {
        out->version = 2;
        self_path(proc_cgroup, NULL, path, sizeof path);
        out->cpus = walk_up(root, path, "cpu.max", read_v2_cpu);
        out->memory_bytes = (uint64_t)walk_up(root, path, "memory.max", read_bytes);
        return;
    }
    bool v1 = false;
    if (v1_mount(root, "cpu", mount, sizeof mount) == 0) {
        v1 = true;
        self_path(proc_cgroup, "cpu", path, sizeof path);
        out->cpus = walk_up(mount, path, "cpu.cfs_quota_us", read_v1_cpu);
    }
    if (v1_mount(root, "memory", mount, sizeof mount) == 0) {
        v1 = true;
        self_path(proc_cgroup, "memory", path, sizeof path);
        out->memory_bytes = (uint64_t)walk_up(mount, path, "memory.limit_in_bytes", read_bytes);
    }
    out->version = v1 ? 1 : 0;
}

int cgroup_threads(const cgroup_limits *l, int n_cpus)
{
    if (!l || l->cpus <= 0)
        return 0;
    int t = (int)(l->cpus + 1e-9);     /* 1.0 from 100000/100000 stays 1 */
    if (t < 1)
        t = 1;
    if (n_cpus > 0 && t > n_cpus)
        t = n_cpus;
    return t;
}

uint64_t cgroup_headroom_bytes(uint64_t memory_bytes)
{
    return (64ULL << 20) + memory_bytes / 8;
}

uint64_t cgroup_cache_fit(uint64_t memory_bytes, uint64_t weight_bytes)
{
    uint64_t keep = cgroup_headroom_bytes(memory_bytes) + weight_bytes;
    return memory_bytes > keep ? memory_bytes - keep : 0;
}
