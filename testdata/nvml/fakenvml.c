/*
 * A stand-in for libnvidia-ml.so.1, compiled by agent/gpu's tests against
 * the real nvml.h (go-nvml's copy) so the compiler checks every signature.
 * It serves three GPUs:
 *   0  every query answers, five processes (one without a memory figure)
 *   1  memory info says the GPU is lost (fakeDevice1Calls counts its calls)
 *   2  no power limit, no max clocks (NOT_SUPPORTED), no processes
 * Built with -DFAKE_OLD_DRIVER it exports only the names a driver older
 * than NVML 11 had: nvmlInit, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
 * nvmlDeviceGetComputeRunningProcesses with the v1 struct, and neither
 * nvmlDeviceGetMemoryInfo_v2 nor nvmlDeviceGetCurrentClocksEventReasons.
 */
#include <string.h>
#include "nvml.h"

/* go-nvml's nvml.h wraps each handle in a one-pointer struct (for cgo);
 * NVIDIA's declares the bare pointer. Both pass in one integer register on
 * amd64 and arm64, which is why the agent passes a handle as a uintptr. */

#define GIB (1024ULL * 1024 * 1024)
#define NDEV 3

struct nvmlDevice_st {
	unsigned int index;
};
static struct nvmlDevice_st devs[NDEV] = {{0}, {1}, {2}};

static int initialised;
static nvmlReturn_t init_return = NVML_SUCCESS;
static unsigned int device1_calls, shutdowns;

/* Test hooks, found by the test through dlsym. */
void fakeSetInitReturn(int r) { init_return = (nvmlReturn_t)r; }
unsigned int fakeDevice1Calls(void) { return device1_calls; }
unsigned int fakeShutdowns(void) { return shutdowns; }

/* check validates a device handle and counts the calls made on GPU 1. */
static nvmlReturn_t check(nvmlDevice_t d, const void *out) {
	if (!initialised) return NVML_ERROR_UNINITIALIZED;
	if (d.handle != &devs[0] && d.handle != &devs[1] && d.handle != &devs[2]) return NVML_ERROR_INVALID_ARGUMENT;
	if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	if (d.handle->index == 1) device1_calls++;
	return NVML_SUCCESS;
}

static unsigned int idx(nvmlDevice_t d) { return d.handle->index; }

static nvmlReturn_t do_init(void) {
	if (init_return != NVML_SUCCESS) return init_return;
	initialised = 1;
	return NVML_SUCCESS;
}

static nvmlReturn_t do_count(unsigned int *n) {
	if (!initialised) return NVML_ERROR_UNINITIALIZED;
	*n = NDEV;
	return NVML_SUCCESS;
}

static nvmlReturn_t do_handle(unsigned int i, nvmlDevice_t *d) {
	if (!initialised) return NVML_ERROR_UNINITIALIZED;
	if (i >= NDEV) return NVML_ERROR_INVALID_ARGUMENT;
	d->handle = &devs[i];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
	initialised = 0;
	shutdowns++;
	return NVML_SUCCESS;
}

#ifdef FAKE_OLD_DRIVER
nvmlReturn_t nvmlInit(void) { return do_init(); }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return do_count(n); }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return do_handle(i, d); }
#else
nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { return do_count(n); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { return do_handle(i, d); }
#endif

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned int len) {
	if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(buf, s);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
	static const char *uuids[NDEV] = {"GPU-11111111-2222-3333-4444-000000000000",
		"GPU-11111111-2222-3333-4444-000000000001", "GPU-11111111-2222-3333-4444-000000000002"};
	nvmlReturn_t r = check(d, uuid);
	return r != NVML_SUCCESS ? r : copy_string(uuids[idx(d)], uuid, len);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
	nvmlReturn_t r = check(d, name);
	return r != NVML_SUCCESS ? r : copy_string("NVIDIA H200", name, len);
}

/* Per GPU: total 140 GiB, reserved 0.5 GiB, free 100 GiB, allocated 39.5 GiB. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	nvmlReturn_t r = check(d, m);
	if (r != NVML_SUCCESS) return r;
	if (idx(d) == 1) return NVML_ERROR_GPU_IS_LOST;
	m->total = 140 * GIB;
	m->free = 100 * GIB;
	m->used = 40 * GIB; /* v1: the reserve counts as used */
	return NVML_SUCCESS;
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
	nvmlReturn_t r = check(d, m);
	if (r != NVML_SUCCESS) return r;
	if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	if (idx(d) == 1) return NVML_ERROR_GPU_IS_LOST;
	m->total = 140 * GIB;
	m->reserved = GIB / 2;
	m->free = 100 * GIB;
	m->used = 39 * GIB + GIB / 2;
	return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, nvmlClockType_t t, unsigned int *mhz) {
	nvmlReturn_t r = check(d, mhz);
	if (r != NVML_SUCCESS) return r;
	switch (t) {
	case NVML_CLOCK_SM: *mhz = 1755 + idx(d); return NVML_SUCCESS;
	case NVML_CLOCK_MEM: *mhz = 3201; return NVML_SUCCESS;
	default: return NVML_ERROR_INVALID_ARGUMENT;
	}
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, nvmlClockType_t t, unsigned int *mhz) {
	nvmlReturn_t r = check(d, mhz);
	if (r != NVML_SUCCESS) return r;
	if (idx(d) == 2) return NVML_ERROR_NOT_SUPPORTED;
	switch (t) {
	case NVML_CLOCK_SM: *mhz = 1980; return NVML_SUCCESS;
	case NVML_CLOCK_MEM: *mhz = 3201; return NVML_SUCCESS;
	default: return NVML_ERROR_INVALID_ARGUMENT;
	}
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *mask) {
	nvmlReturn_t r = check(d, mask);
	if (r != NVML_SUCCESS) return r;
	*mask = nvmlClocksEventReasonSwPowerCap | nvmlClocksThrottleReasonHwSlowdown | (1ULL << 40);
	return NVML_SUCCESS;
}
#endif

/* A different mask, so the test can tell which call was made. */
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *mask) {
	nvmlReturn_t r = check(d, mask);
	if (r != NVML_SUCCESS) return r;
	*mask = nvmlClocksEventReasonSwThermalSlowdown;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t s, unsigned int *c) {
	nvmlReturn_t r = check(d, c);
	if (r != NVML_SUCCESS) return r;
	if (s != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
	*c = 61;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
	nvmlReturn_t r = check(d, mw);
	if (r != NVML_SUCCESS) return r;
	*mw = 512345;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
	nvmlReturn_t r = check(d, mw);
	if (r != NVML_SUCCESS) return r;
	if (idx(d) == 2) return NVML_ERROR_NOT_SUPPORTED;
	*mw = 700000;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
	nvmlReturn_t r = check(d, u);
	if (r != NVML_SUCCESS) return r;
	u->gpu = 97;
	u->memory = 40;
	return NVML_SUCCESS;
}

/* GPU 0 runs five processes; the one with pid 4243 has no memory figure. */
static const unsigned int pids[] = {4242, 4243, 999999, 5000, 5001};
#define NPROC (sizeof pids / sizeof pids[0])

static nvmlReturn_t list_processes(nvmlDevice_t d, unsigned int *count, void *infos, int v1) {
	nvmlReturn_t r = check(d, count);
	if (r != NVML_SUCCESS) return r;
	unsigned int n = idx(d) == 0 ? NPROC : 0;
	if (*count < n) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	*count = n;
	for (unsigned int i = 0; i < n; i++) {
		unsigned long long used = pids[i] == 4243 ? (unsigned long long)NVML_VALUE_NOT_AVAILABLE : (i + 1) * GIB;
		if (v1) {
			nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
			p->pid = pids[i];
			p->usedGpuMemory = used;
		} else {
			nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)infos + i;
			p->pid = pids[i];
			p->usedGpuMemory = used;
			p->gpuInstanceId = 0xFFFFFFFF;
			p->computeInstanceId = 0xFFFFFFFF;
		}
	}
	return NVML_SUCCESS;
}

#ifdef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v1_t *infos) {
	return list_processes(d, count, infos, 1);
}
#else
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
	return list_processes(d, count, infos, 0);
}
#endif
