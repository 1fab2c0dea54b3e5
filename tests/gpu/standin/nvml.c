// Stand-in for NVIDIA's management library (libnvidia-ml.so.1), enough for nvidia-ml-py to read two
// devices with known state: the real symbol names, signatures and struct layouts (nvml.h). Device 1
// does not support power readings (NVML_ERROR_NOT_SUPPORTED) and reports XID 79 once. The
// processes holding device 0 come from STANDIN_NVML_PROCESSES="pid:bytes,pid:bytes".
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum { OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, INSUFFICIENT_SIZE = 7, TIMEOUT = 10 };

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
struct device {
    const char *name, *uuid;
    nvmlUtilization_t utilization;
    nvmlMemory_t memory;
    unsigned int power_mw;  // 0: not supported
    unsigned int clocks[3];  // by nvmlClockType_t: graphics, sm, memory
    unsigned long long ecc[2];  // corrected, uncorrected
};
typedef struct device *nvmlDevice_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef struct { int xid_pending; } *nvmlEventSet_t;

#define GIB (1024ULL * 1024 * 1024)
static struct device devices[2] = {
    {"NVIDIA H200 (stand-in)", "GPU-5a1d1e00-0000-4000-8000-000000000000", {37, 12},
     {141 * GIB, 121 * GIB, 20 * GIB}, 523000, {1980, 1980, 3201}, {5, 0}},
    {"NVIDIA L4 (stand-in)", "GPU-5a1d1e00-0000-4000-8000-000000000001", {80, 45},
     {24 * GIB, 23 * GIB, 1 * GIB}, 0, {2040, 2040, 6251}, {0, 0}},
};
static int initialized;

const char *nvmlErrorString(nvmlReturn_t result) {
    static char text[32];
    snprintf(text, sizeof(text), "stand-in NVML error %d", result);
    return text;
}
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; initialized = 1; return OK; }
nvmlReturn_t nvmlShutdown(void) { initialized = 0; return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return UNINITIALIZED;
    *count = 2;
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= 2) return INVALID_ARGUMENT;
    *device = &devices[index];
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    snprintf(name, length, "%s", d->name);
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    snprintf(uuid, length, "%s", d->uuid);
    return OK;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) { *u = d->utilization; return OK; }
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) { *m = d->memory; return OK; }
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    if (!d->power_mw) return NOT_SUPPORTED;
    *mw = d->power_mw;
    return OK;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    if (type < 0 || type > 2) return INVALID_ARGUMENT;
    *mhz = d->clocks[type];
    return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int error_type, int counter_type, unsigned long long *n) {
    (void)counter_type;
    if (error_type < 0 || error_type > 1) return INVALID_ARGUMENT;
    *n = d->ecc[error_type];
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    nvmlProcessInfo_t found[16];
    unsigned int n = 0;
    const char *spec = d == &devices[0] ? getenv("STANDIN_NVML_PROCESSES") : NULL;
    while (spec && *spec && n < 16) {
        unsigned int pid;
        unsigned long long bytes;
        if (sscanf(spec, "%u:%llu", &pid, &bytes) != 2) break;
        found[n++] = (nvmlProcessInfo_t){pid, bytes, 0xFFFFFFFF, 0xFFFFFFFF};
        spec = strchr(spec, ',');
        spec = spec ? spec + 1 : NULL;
    }
    if (!n) { *count = 0; return OK; }
    if (!infos || *count < n) { *count = n; return INSUFFICIENT_SIZE; }
    memcpy(infos, found, n * sizeof(*found));
    *count = n;
    return OK;
}
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    *set = calloc(1, sizeof(**set));
    return *set ? OK : UNINITIALIZED;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    if (d == &devices[1] && (types & 0x8)) set->xid_pending = 1;
    return OK;
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    (void)timeout_ms;
    if (!set->xid_pending) return TIMEOUT;
    set->xid_pending = 0;
    *data = (nvmlEventData_t){&devices[1], 0x8, 79, 0xFFFFFFFF, 0xFFFFFFFF};
    return OK;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { free(set); return OK; }
