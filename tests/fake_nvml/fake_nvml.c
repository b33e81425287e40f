/*
 * A fake libnvidia-ml.so.1 for gpuctk's tests, loaded through the real pynvml.
 *
 * It serves a machine described by a line-based text profile named by FAKE_NVML_PROFILE
 * (tests/fixtures/fake_nvml.py writes it from the YAML machine profiles):
 *
 *   # comment
 *   driver 535.309.01                    driver version string
 *   cuda 12020                           CUDA driver version (major*1000 + minor*10)
 *   nvml 12.535.309.01                   optional; default "<cuda major>.<driver>"
 *   gpu index=0 minor=0 uuid=GPU-... bus=00000000:18:00.0 arch=9 cc=9.0 memory_mib=81559
 *       numa=0 mig=1 mig_capable=1 max_mig=7 name=NVIDIA H100 80GB HBM3
 *   mig slot=0 gi=7 ci=0 uuid=MIG-... gi_slices=1 ci_slices=1 memory_mib=9856
 *
 *   nvlink gpu=0 peer=1 count=12         NVLink: `count` active links from GPU 0 to GPU 1
 *   nvlink gpu=0 peer=switch count=18    ... or to the NVSwitch fabric (HGX/DGX)
 *
 * (a gpu record is one line; `name=` must come last and takes the rest of the line).
 * A GPU with no nvlink line answers NOT_SUPPORTED to the NVLink calls (a PCIe-only card).
 * GPUs are listed in index order. `numa=-` (or no numa key) makes nvmlDeviceGetNumaNodeId
 * return NVML_ERROR_NOT_SUPPORTED; `persistence=1` (or 0) is what nvmlDeviceGetPersistenceMode
 * answers (no persistence key: NVML_ERROR_NOT_SUPPORTED). `mig_capable=0` makes the MIG calls return
 * NOT_SUPPORTED (an L4, say). `mig` lines belong to the gpu line above them; `slot` is the MIG
 * handle index (slots left out answer NVML_ERROR_NOT_FOUND).
 *
 * Environment:
 *   FAKE_NVML_PROFILE     the profile file; unset or unreadable: init fails with
 *                         NVML_ERROR_DRIVER_NOT_LOADED; malformed: NVML_ERROR_UNKNOWN + stderr
 *   FAKE_NVML_INIT_ERROR  an NVML return code that init returns instead of succeeding
 *   FAKE_NVML_FAIL        "fn=code[,fn@gpu=code...]": the named entry point returns that code
 *                         (for every device, or only for GPU index `gpu` and its MIG devices)
 *   FAKE_NVML_EVENTS      a control file the test appends lines to while the process runs;
 *                         read on every device call and while nvmlEventSetWait_v2 waits:
 *                           xid gpu=3 code=79 [gi=N ci=N]   an XID event (nvmlEventTypeXidCriticalError)
 *                           lost gpu=3                      every call on GPU 3 (and its MIG
 *                                                           devices, and its handle lookups)
 *                                                           returns NVML_ERROR_GPU_IS_LOST
 *                           found gpu=3                     ... and answers again
 *                         unset: no events ever arrive (nvmlEventSetWait_v2 times out)
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_MIG 16
#define MAX_FAILURES 32
#define ARCH_UNKNOWN 0xffffffffu
#define MAX_LINKS 36 /* NVML_NVLINK_MAX_LINKS */
#define MAX_EVENTS 1024
#define NO_ID 0xffffffffu
#define EVENT_XID 0x8ull /* nvmlEventTypeXidCriticalError */
#define EVENT_SUPPORTED 0xfull /* single/double bit ECC, P-state, XID */
#define SWITCH_PEER -1

enum kind { KIND_GPU = 1, KIND_MIG = 2 };

struct fake_device {
    enum kind kind;
    struct fake_device *parent;
    unsigned index, minor, arch, max_mig;
    int cc_major, cc_minor, numa, numa_supported, mig_capable, mig_mode;
    int persistence, persistence_supported;
    unsigned domain, bus, dev;
    unsigned long long memory_mib;
    char uuid[96], name[96];
    struct fake_device *slots[MAX_MIG];
    unsigned gi, ci, gi_slices, ci_slices; /* MIG devices only */
    unsigned n_links;
    int link_peer[MAX_LINKS]; /* a GPU index, or SWITCH_PEER */
    int lost;                 /* FAKE_NVML_EVENTS: `lost gpu=N` */
};
typedef struct fake_device *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned version, domain, bus, device, pciDeviceId, pciSubSystemId, baseClass, subClass;
    char busId[32];
} nvmlPciInfoExt_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
        computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

struct failure {
    char fn[64];
    int gpu; /* -1: every device */
    int code;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static struct fake_device gpus[MAX_GPUS];
static struct fake_device migs[MAX_GPUS * MAX_MIG];
static unsigned n_gpus, n_migs;
static char driver_version[80], nvml_version[80];
static int cuda_version;
static struct failure failures[MAX_FAILURES];
static unsigned n_failures;

/* ---- profile parsing ------------------------------------------------------------------- */

static int parse_error(const char *path, int line, const char *what) {
    fprintf(stderr, "fake-nvml: %s:%d: %s\n", path, line, what);
    return NVML_ERROR_UNKNOWN;
}

static void chomp(char *s) {
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
}

/* Split "k=v k=v name=rest of line" in place; calls set(dev, key, value) for each pair. */
typedef int (*setter)(struct fake_device *, const char *, const char *);

static int parse_pairs(char *p, struct fake_device *d, setter set) {
    while (*p) {
        while (isspace((unsigned char)*p))
            p++;
        if (!*p)
            break;
        char *key = p, *eq = strchr(p, '=');
        if (!eq)
            return -1;
        *eq = 0;
        char *val = eq + 1;
        if (strcmp(key, "name") == 0) {
            p = val + strlen(val);
        } else {
            p = val + strcspn(val, " \t");
            if (*p)
                *p++ = 0;
        }
        if (set(d, key, val) != 0)
            return -1;
    }
    return 0;
}

static int copy_field(char *dst, size_t size, const char *src) {
    if (strlen(src) + 1 > size)
        return -1;
    strcpy(dst, src);
    return 0;
}

static int set_gpu(struct fake_device *d, const char *k, const char *v) {
    if (!strcmp(k, "index"))
        return (unsigned)atoi(v) == d->index ? 0 : -1;
    if (!strcmp(k, "minor"))
        d->minor = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(k, "uuid"))
        return copy_field(d->uuid, sizeof d->uuid, v);
    else if (!strcmp(k, "name"))
        return copy_field(d->name, sizeof d->name, v);
    else if (!strcmp(k, "bus"))
        return sscanf(v, "%x:%x:%x.", &d->domain, &d->bus, &d->dev) == 3 ? 0 : -1;
    else if (!strcmp(k, "arch"))
        d->arch = (unsigned)strtoul(v, NULL, 0);
    else if (!strcmp(k, "cc"))
        return sscanf(v, "%d.%d", &d->cc_major, &d->cc_minor) == 2 ? 0 : -1;
    else if (!strcmp(k, "memory_mib"))
        d->memory_mib = strtoull(v, NULL, 10);
    else if (!strcmp(k, "numa")) {
        d->numa_supported = strcmp(v, "-") != 0;
        d->numa = atoi(v);
    } else if (!strcmp(k, "persistence")) {
        d->persistence_supported = 1;
        d->persistence = atoi(v);
    } else if (!strcmp(k, "mig"))
        d->mig_mode = atoi(v);
    else if (!strcmp(k, "mig_capable"))
        d->mig_capable = atoi(v);
    else if (!strcmp(k, "max_mig")) {
        d->max_mig = (unsigned)atoi(v);
        return d->max_mig <= MAX_MIG ? 0 : -1;
    } else
        return -1;
    return 0;
}

static int set_mig(struct fake_device *d, const char *k, const char *v) {
    if (!strcmp(k, "slot"))
        d->index = (unsigned)atoi(v);
    else if (!strcmp(k, "gi"))
        d->gi = (unsigned)atoi(v);
    else if (!strcmp(k, "ci"))
        d->ci = (unsigned)atoi(v);
    else if (!strcmp(k, "uuid"))
        return copy_field(d->uuid, sizeof d->uuid, v);
    else if (!strcmp(k, "gi_slices"))
        d->gi_slices = (unsigned)atoi(v);
    else if (!strcmp(k, "ci_slices"))
        d->ci_slices = (unsigned)atoi(v);
    else if (!strcmp(k, "memory_mib"))
        d->memory_mib = strtoull(v, NULL, 10);
    else
        return -1;
    return 0;
}

static int add_mig(const char *path, int ln, char *rest) {
    if (!n_gpus)
        return parse_error(path, ln, "mig line before any gpu line");
    if (n_migs >= sizeof migs / sizeof migs[0])
        return parse_error(path, ln, "too many MIG devices");
    struct fake_device *parent = &gpus[n_gpus - 1], *m = &migs[n_migs];
    memset(m, 0, sizeof *m);
    m->kind = KIND_MIG;
    m->parent = parent;
    m->index = MAX_MIG;
    if (parse_pairs(rest, m, set_mig) != 0)
        return parse_error(path, ln, "bad mig field");
    if (m->index >= parent->max_mig || parent->slots[m->index])
        return parse_error(path, ln, "mig slot missing, out of range or used twice");
    snprintf(m->name, sizeof m->name, "%.60s MIG %ug.%llugb", parent->name, m->gi_slices,
             (m->memory_mib + 1023) / 1024);
    parent->slots[m->index] = m;
    n_migs++;
    return 0;
}

static int add_nvlink(const char *path, int ln, const char *rest) {
    unsigned gpu, count;
    char peer[16];
    if (sscanf(rest, "gpu=%u peer=%15s count=%u", &gpu, peer, &count) != 3 || gpu >= n_gpus)
        return parse_error(path, ln, "bad nvlink line (gpu=N peer=M|switch count=C, after gpu N)");
    struct fake_device *g = &gpus[gpu];
    int to = strcmp(peer, "switch") == 0 ? SWITCH_PEER : atoi(peer);
    if (g->n_links + count > MAX_LINKS || (to != SWITCH_PEER && (unsigned)to == gpu))
        return parse_error(path, ln, "too many NVLinks, or a link to itself");
    for (unsigned i = 0; i < count; i++)
        g->link_peer[g->n_links++] = to;
    return 0;
}

static int load_profile(void) {
    const char *path = getenv("FAKE_NVML_PROFILE");
    if (!path || !*path)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    FILE *f = fopen(path, "r");
    if (!f)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    n_gpus = n_migs = 0;
    cuda_version = 0;
    driver_version[0] = nvml_version[0] = 0;
    memset(gpus, 0, sizeof gpus);
    char line[1024];
    int ln = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        ln++;
        chomp(line);
        char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (!*p || *p == '#')
            continue;
        char *rest = p + strcspn(p, " \t");
        if (*rest)
            *rest++ = 0;
        while (isspace((unsigned char)*rest))
            rest++;
        if (!strcmp(p, "driver")) {
            if (copy_field(driver_version, sizeof driver_version, rest) != 0)
                rc = parse_error(path, ln, "driver version too long");
        } else if (!strcmp(p, "nvml")) {
            if (copy_field(nvml_version, sizeof nvml_version, rest) != 0)
                rc = parse_error(path, ln, "nvml version too long");
        } else if (!strcmp(p, "cuda")) {
            cuda_version = atoi(rest);
        } else if (!strcmp(p, "gpu")) {
            if (n_gpus >= MAX_GPUS) {
                rc = parse_error(path, ln, "too many GPUs");
                break;
            }
            struct fake_device *g = &gpus[n_gpus];
            g->kind = KIND_GPU;
            g->index = g->minor = n_gpus;
            g->arch = ARCH_UNKNOWN;
            g->max_mig = 7;
            if (parse_pairs(rest, g, set_gpu) != 0 || !g->uuid[0] || !g->name[0])
                rc = parse_error(path, ln, "bad gpu line (unknown key, index out of order, "
                                           "or uuid/name missing)");
            if (!g->mig_capable)
                g->max_mig = 0;
            n_gpus++;
        } else if (!strcmp(p, "mig")) {
            rc = add_mig(path, ln, rest);
        } else if (!strcmp(p, "nvlink")) {
            rc = add_nvlink(path, ln, rest);
        } else {
            rc = parse_error(path, ln,
                             "unknown record (expected driver, cuda, nvml, gpu, mig, nvlink)");
        }
    }
    fclose(f);
    for (unsigned i = 0; rc == 0 && i < n_gpus; i++)
        for (unsigned l = 0; l < gpus[i].n_links; l++)
            if (gpus[i].link_peer[l] != SWITCH_PEER && (unsigned)gpus[i].link_peer[l] >= n_gpus)
                rc = parse_error(path, 0, "nvlink peer is not a GPU of the profile");
    if (rc == 0 && !driver_version[0])
        rc = parse_error(path, 0, "no driver line");
    if (rc == 0 && !nvml_version[0])
        snprintf(nvml_version, sizeof nvml_version, "%d.%.70s", cuda_version / 1000,
                 driver_version);
    return rc;
}

static void load_failures(void) {
    n_failures = 0;
    const char *spec = getenv("FAKE_NVML_FAIL");
    if (!spec)
        return;
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n_failures < MAX_FAILURES;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            continue;
        *eq = 0;
        struct failure *fl = &failures[n_failures++];
        fl->code = atoi(eq + 1);
        fl->gpu = -1;
        char *at = strchr(tok, '@');
        if (at) {
            *at = 0;
            fl->gpu = atoi(at + 1);
        }
        snprintf(fl->fn, sizeof fl->fn, "%s", tok);
    }
}

/* ---- FAKE_NVML_EVENTS: the control file ------------------------------------------------ */

struct fake_event {
    struct fake_device *device;
    unsigned long long type, data;
    unsigned gi, ci;
};

static pthread_mutex_t control_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_event events[MAX_EVENTS];
static unsigned n_events;
static long control_offset;

/* Apply the control file's lines appended since the last call (whole lines only). */
static void poll_control(void) {
    const char *path = getenv("FAKE_NVML_EVENTS");
    if (!path || !*path)
        return;
    pthread_mutex_lock(&control_lock);
    FILE *f = fopen(path, "r");
    if (f && fseek(f, control_offset, SEEK_SET) == 0) {
        char line[256];
        while (fgets(line, sizeof line, f) && strchr(line, '\n')) {
            control_offset += (long)strlen(line);
            unsigned gpu = 0, code = 0, gi = NO_ID, ci = NO_ID;
            char verb[16];
            if (sscanf(line, "%15s gpu=%u", verb, &gpu) != 2 || gpu >= n_gpus)
                continue;
            if (!strcmp(verb, "lost") || !strcmp(verb, "found")) {
                gpus[gpu].lost = !strcmp(verb, "lost");
            } else if (!strcmp(verb, "xid") && n_events < MAX_EVENTS) {
                char *p = strstr(line, "code=");
                code = p ? (unsigned)atoi(p + 5) : 0;
                if ((p = strstr(line, "gi=")))
                    gi = (unsigned)atoi(p + 3);
                if ((p = strstr(line, "ci=")))
                    ci = (unsigned)atoi(p + 3);
                events[n_events++] = (struct fake_event){&gpus[gpu], EVENT_XID, code, gi, ci};
            }
        }
    }
    if (f)
        fclose(f);
    pthread_mutex_unlock(&control_lock);
}

/* ---- entry-point helpers --------------------------------------------------------------- */

static int valid(nvmlDevice_t d) {
    if (d >= gpus && d < gpus + n_gpus)
        return 1;
    return d >= migs && d < migs + n_migs;
}

static nvmlReturn_t enter(const char *fn, nvmlDevice_t d, int check_device) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (check_device && !valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    poll_control();
    int gpu = -1;
    if (check_device)
        gpu = (int)(d->kind == KIND_MIG ? d->parent->index : d->index);
    if (check_device && (d->kind == KIND_MIG ? d->parent : d)->lost)
        return NVML_ERROR_GPU_IS_LOST;
    for (unsigned i = 0; i < n_failures; i++)
        if (!strcmp(failures[i].fn, fn) && (failures[i].gpu < 0 || failures[i].gpu == gpu))
            return failures[i].code;
    return NVML_SUCCESS;
}

#define ENTER()                                                                            \
    do {                                                                                   \
        nvmlReturn_t r_ = enter(__func__, NULL, 0);                                        \
        if (r_)                                                                            \
            return r_;                                                                     \
    } while (0)
#define ENTER_DEVICE(d)                                                                    \
    do {                                                                                   \
        nvmlReturn_t r_ = enter(__func__, (d), 1);                                         \
        if (r_)                                                                            \
            return r_;                                                                     \
    } while (0)
#define NEED(ptr)                                                                          \
    do {                                                                                   \
        if (!(ptr))                                                                        \
            return NVML_ERROR_INVALID_ARGUMENT;                                            \
    } while (0)

static nvmlReturn_t put_str(char *dst, unsigned size, const char *src) {
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > size)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

static nvmlDevice_t gpu_of(nvmlDevice_t d) { return d->kind == KIND_MIG ? d->parent : d; }

/* ---- init and system ------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    const char *forced = getenv("FAKE_NVML_INIT_ERROR");
    if (forced && atoi(forced))
        return atoi(forced);
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refcount == 0) {
        rc = load_profile();
        load_failures();
    }
    if (rc == NVML_SUCCESS)
        refcount++;
    pthread_mutex_unlock(&lock);
    return rc;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        refcount--;
    pthread_mutex_unlock(&lock);
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    ENTER();
    return put_str(version, length, driver_version);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned length) {
    ENTER();
    return put_str(version, length, nvml_version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    ENTER();
    NEED(version);
    *version = cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    ENTER();
    NEED(version);
    *version = cuda_version;
    return NVML_SUCCESS;
}

/* ---- device handles -------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    ENTER();
    NEED(count);
    *count = n_gpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device) {
    ENTER();
    NEED(device);
    if (index >= n_gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpus[index].lost)
        return NVML_ERROR_GPU_IS_LOST;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    ENTER();
    NEED(uuid && device);
    for (unsigned i = 0; i < n_gpus; i++)
        if (!strcmp(gpus[i].uuid, uuid))
            return gpus[i].lost ? NVML_ERROR_GPU_IS_LOST : (*device = &gpus[i], NVML_SUCCESS);
    for (unsigned i = 0; i < n_migs; i++)
        if (!strcmp(migs[i].uuid, uuid))
            return migs[i].parent->lost ? NVML_ERROR_GPU_IS_LOST
                                        : (*device = &migs[i], NVML_SUCCESS);
    return NVML_ERROR_NOT_FOUND;
}

static void format_bus_id(nvmlDevice_t g, char *legacy, char *full) {
    if (legacy)
        snprintf(legacy, 16, "%04X:%02X:%02X.0", g->domain & 0xffff, g->bus, g->dev);
    snprintf(full, 32, "%08X:%02X:%02X.0", g->domain, g->bus, g->dev);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    ENTER();
    NEED(bus_id && device);
    char want[32];
    for (unsigned i = 0; i < n_gpus; i++) {
        format_bus_id(&gpus[i], NULL, want);
        if (!strcasecmp(want, bus_id))
            return *device = &gpus[i], NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- device queries -------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *index) {
    ENTER_DEVICE(d);
    NEED(index);
    if (d->kind == KIND_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned *minor) {
    ENTER_DEVICE(d);
    NEED(minor);
    if (d->kind == KIND_MIG)
        return NVML_ERROR_NOT_SUPPORTED;
    *minor = d->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned length) {
    ENTER_DEVICE(d);
    return put_str(uuid, length, d->uuid);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned length) {
    ENTER_DEVICE(d);
    return put_str(name, length, d->name);
}

static void fill_pci(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    nvmlDevice_t g = gpu_of(d);
    memset(pci, 0, sizeof *pci);
    format_bus_id(g, pci->busIdLegacy, pci->busId);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->dev;
    pci->pciDeviceId = 0x233010de;
    pci->pciSubSystemId = 0x16c110de;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    ENTER_DEVICE(d);
    NEED(pci);
    fill_pci(d, pci);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    ENTER_DEVICE(d);
    NEED(pci);
    fill_pci(d, pci);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    ENTER_DEVICE(d);
    NEED(pci);
    fill_pci(d, pci);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t d, nvmlPciInfoExt_t *pci) {
    ENTER_DEVICE(d);
    NEED(pci);
    if (pci->version != (sizeof *pci | 1u << 24))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlDevice_t g = gpu_of(d);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->dev;
    pci->pciDeviceId = 0x233010de;
    pci->pciSubSystemId = 0x16c110de;
    pci->baseClass = 3;
    pci->subClass = 2;
    format_bus_id(g, NULL, pci->busId);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned *arch) {
    ENTER_DEVICE(d);
    NEED(arch);
    *arch = gpu_of(d)->arch;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    ENTER_DEVICE(d);
    NEED(major && minor);
    *major = gpu_of(d)->cc_major;
    *minor = gpu_of(d)->cc_minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *mem) {
    ENTER_DEVICE(d);
    NEED(mem);
    mem->total = d->memory_mib << 20;
    mem->used = mem->total / 100;
    mem->free = mem->total - mem->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *mem) {
    ENTER_DEVICE(d);
    NEED(mem);
    if (mem->version != (sizeof *mem | 2u << 24))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    mem->total = d->memory_mib << 20;
    mem->reserved = mem->total / 200;
    mem->used = mem->total / 100;
    mem->free = mem->total - mem->used - mem->reserved;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned *node) {
    ENTER_DEVICE(d);
    NEED(node);
    if (d->kind == KIND_MIG || !d->numa_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)d->numa;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *mode) {
    ENTER_DEVICE(d);
    NEED(mode);
    if (d->kind == KIND_MIG || !d->persistence_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *mode = d->persistence ? 1 : 0;
    return NVML_SUCCESS;
}

/* ---- MIG ------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned *current, unsigned *pending) {
    ENTER_DEVICE(d);
    NEED(current && pending);
    if (d->kind == KIND_MIG || !d->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned)d->mig_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned *count) {
    ENTER_DEVICE(d);
    NEED(count);
    if (d->kind == KIND_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    *count = d->max_mig;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned index,
                                                 nvmlDevice_t *mig) {
    ENTER_DEVICE(d);
    NEED(mig);
    if (d->kind == KIND_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    if (index >= d->max_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_mode || !d->slots[index])
        return NVML_ERROR_NOT_FOUND;
    *mig = d->slots[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned *is_mig) {
    ENTER_DEVICE(d);
    NEED(is_mig);
    *is_mig = d->kind == KIND_MIG;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned *id) {
    ENTER_DEVICE(d);
    NEED(id);
    if (d->kind != KIND_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned *id) {
    ENTER_DEVICE(d);
    NEED(id);
    if (d->kind != KIND_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *gpu) {
    ENTER_DEVICE(d);
    NEED(gpu);
    if (d->kind != KIND_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = d->parent;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *attrs) {
    ENTER_DEVICE(d);
    NEED(attrs);
    memset(attrs, 0, sizeof *attrs);
    if (d->kind == KIND_MIG) {
        attrs->multiprocessorCount = 16 * d->ci_slices;
        attrs->sharedCopyEngineCount = d->gi_slices;
        attrs->gpuInstanceSliceCount = d->gi_slices;
        attrs->computeInstanceSliceCount = d->ci_slices;
    } else {
        attrs->multiprocessorCount = 132;
        attrs->sharedCopyEngineCount = 7;
    }
    attrs->memorySizeMB = d->memory_mib;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t d, nvmlDeviceAttributes_t *attrs) {
    return nvmlDeviceGetAttributes_v2(d, attrs);
}

/* ---- NVLink ---------------------------------------------------------------------------- */

static nvmlReturn_t nvlink_of(nvmlDevice_t d, unsigned link) {
    if (d->kind == KIND_MIG || !d->n_links)
        return NVML_ERROR_NOT_SUPPORTED;
    return link < MAX_LINKS ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned link, unsigned *active) {
    ENTER_DEVICE(d);
    NEED(active);
    nvmlReturn_t rc = nvlink_of(d, link);
    if (rc == NVML_SUCCESS)
        *active = link < d->n_links;
    return rc;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned link,
                                                 nvmlPciInfo_t *pci) {
    ENTER_DEVICE(d);
    NEED(pci);
    nvmlReturn_t rc = nvlink_of(d, link);
    if (rc != NVML_SUCCESS)
        return rc;
    if (link >= d->n_links)
        return NVML_ERROR_NOT_SUPPORTED; /* an inactive link has no remote end */
    if (d->link_peer[link] != SWITCH_PEER) {
        fill_pci(&gpus[d->link_peer[link]], pci);
        return NVML_SUCCESS;
    }
    struct fake_device nvswitch = {.domain = 0, .bus = 0xc5, .dev = 0}; /* not a GPU's bus */
    fill_pci(&nvswitch, pci);
    pci->pciDeviceId = 0x22a310de; /* an NVSwitch */
    return NVML_SUCCESS;
}

/* ---- events ---------------------------------------------------------------------------- */

typedef struct {
    unsigned long long mask[MAX_GPUS]; /* registered event types per GPU */
    unsigned next;                     /* the next event of the log to look at */
} fake_event_set;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

nvmlReturn_t nvmlEventSetCreate(fake_event_set **set) {
    ENTER();
    NEED(set);
    poll_control(); /* events from before the set was made are not its events */
    *set = calloc(1, sizeof **set);
    if (!*set)
        return NVML_ERROR_UNKNOWN;
    pthread_mutex_lock(&control_lock);
    (*set)->next = n_events;
    pthread_mutex_unlock(&control_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(fake_event_set *set) {
    ENTER();
    free(set);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    ENTER_DEVICE(d);
    NEED(types);
    if (d->kind == KIND_MIG)
        return NVML_ERROR_NOT_SUPPORTED;
    *types = EVENT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
                                      fake_event_set *set) {
    ENTER_DEVICE(d);
    NEED(set);
    if (d->kind == KIND_MIG)
        return NVML_ERROR_NOT_SUPPORTED;
    if (types & ~EVENT_SUPPORTED)
        return NVML_ERROR_NOT_SUPPORTED;
    set->mask[d->index] |= types;
    return NVML_SUCCESS;
}

static int next_event(fake_event_set *set, nvmlEventData_t *data) {
    int found = 0;
    pthread_mutex_lock(&control_lock);
    while (!found && set->next < n_events) {
        struct fake_event *e = &events[set->next++];
        if (set->mask[e->device->index] & e->type) {
            *data = (nvmlEventData_t){e->device, e->type, e->data, e->gi, e->ci};
            found = 1;
        }
    }
    pthread_mutex_unlock(&control_lock);
    return found;
}

nvmlReturn_t nvmlEventSetWait_v2(fake_event_set *set, nvmlEventData_t *data, unsigned timeout_ms) {
    ENTER();
    NEED(set && data);
    for (unsigned waited = 0;; waited += 10) {
        poll_control();
        if (next_event(set, data))
            return NVML_SUCCESS;
        if (waited >= timeout_ms)
            return NVML_ERROR_TIMEOUT;
        struct timespec step = {0, 10 * 1000 * 1000};
        nanosleep(&step, NULL);
    }
}

nvmlReturn_t nvmlEventSetWait(fake_event_set *set, nvmlEventData_t *data, unsigned timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}
