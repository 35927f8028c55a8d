/*
 * A stand-in libnvidia-ml.so.1 for the bench: one GPU whose state the bench
 * sets while the fleet runs. heftbench compiles it against the real nvml.h
 * (go-nvml's copy) and starts an agent with LD_LIBRARY_PATH pointing at it,
 * so the agent's own purego binding reads it as it would a driver.
 *
 * The state is a text file named by HEFT_STANDIN_NVML_STATE, read again on
 * every query (the bench replaces it by rename), one "key value" per line:
 *   uuid     GPU-...          the GPU's UUID
 *   pids     123 456          compute processes on it (10 GiB each)
 *   reasons  0x40             clock event reason mask (nvml.h's bits)
 *   sm_clock 990              SM clock now, MHz (max: 1980)
 *   temp     61               temperature, C
 * A key left out keeps its default (no processes, no reasons, 1980 MHz).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nvml.h"

#define GIB (1024ULL * 1024 * 1024)
#define MAX_PIDS 16
#define MAX_SM 1980

struct nvmlDevice_st {
	int unused;
};
static struct nvmlDevice_st dev;
static int initialised;

struct state {
	char uuid[80];
	unsigned int pids[MAX_PIDS];
	unsigned int npids;
	unsigned long long reasons;
	unsigned int sm_clock, temp;
};

/* load reads the state file; a missing or unreadable file is the default. */
static void load(struct state *s) {
	memset(s, 0, sizeof *s);
	strcpy(s->uuid, "GPU-00000000-0000-0000-0000-000000000000");
	s->sm_clock = MAX_SM;
	s->temp = 61;
	const char *path = getenv("HEFT_STANDIN_NVML_STATE");
	FILE *f = path ? fopen(path, "r") : NULL;
	if (!f) return;
	char line[512];
	while (fgets(line, sizeof line, f)) {
		char *key = strtok(line, " \t\n");
		if (!key) continue;
		char *val = strtok(NULL, " \t\n");
		if (!val) continue;
		if (!strcmp(key, "uuid")) {
			snprintf(s->uuid, sizeof s->uuid, "%s", val);
		} else if (!strcmp(key, "pids")) {
			for (; val && s->npids < MAX_PIDS; val = strtok(NULL, " \t\n"))
				s->pids[s->npids++] = (unsigned int)strtoul(val, NULL, 10);
		} else if (!strcmp(key, "reasons")) {
			s->reasons = strtoull(val, NULL, 0);
		} else if (!strcmp(key, "sm_clock")) {
			s->sm_clock = (unsigned int)strtoul(val, NULL, 10);
		} else if (!strcmp(key, "temp")) {
			s->temp = (unsigned int)strtoul(val, NULL, 10);
		}
	}
	fclose(f);
}

static nvmlReturn_t check(nvmlDevice_t d, const void *out) {
	if (!initialised) return NVML_ERROR_UNINITIALIZED;
	if (d.handle != &dev || out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) {
	initialised = 1;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
	initialised = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
	if (!initialised) return NVML_ERROR_UNINITIALIZED;
	*n = 1;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
	if (!initialised) return NVML_ERROR_UNINITIALIZED;
	if (i != 0) return NVML_ERROR_INVALID_ARGUMENT;
	d->handle = &dev;
	return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned int len) {
	if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(buf, s);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
	nvmlReturn_t r = check(d, uuid);
	if (r != NVML_SUCCESS) return r;
	struct state s;
	load(&s);
	return copy_string(s.uuid, uuid, len);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
	nvmlReturn_t r = check(d, name);
	return r != NVML_SUCCESS ? r : copy_string("NVIDIA H200", name, len);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
	nvmlReturn_t r = check(d, m);
	if (r != NVML_SUCCESS) return r;
	if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	struct state s;
	load(&s);
	m->total = 140 * GIB;
	m->reserved = GIB / 2;
	m->used = s.npids * 10 * GIB;
	m->free = m->total - m->reserved - m->used;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, nvmlClockType_t t, unsigned int *mhz) {
	nvmlReturn_t r = check(d, mhz);
	if (r != NVML_SUCCESS) return r;
	struct state s;
	load(&s);
	switch (t) {
	case NVML_CLOCK_SM: *mhz = s.sm_clock; return NVML_SUCCESS;
	case NVML_CLOCK_MEM: *mhz = 3201; return NVML_SUCCESS;
	default: return NVML_ERROR_INVALID_ARGUMENT;
	}
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, nvmlClockType_t t, unsigned int *mhz) {
	nvmlReturn_t r = check(d, mhz);
	if (r != NVML_SUCCESS) return r;
	switch (t) {
	case NVML_CLOCK_SM: *mhz = MAX_SM; return NVML_SUCCESS;
	case NVML_CLOCK_MEM: *mhz = 3201; return NVML_SUCCESS;
	default: return NVML_ERROR_INVALID_ARGUMENT;
	}
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *mask) {
	nvmlReturn_t r = check(d, mask);
	if (r != NVML_SUCCESS) return r;
	struct state s;
	load(&s);
	*mask = s.reasons;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t t, unsigned int *c) {
	nvmlReturn_t r = check(d, c);
	if (r != NVML_SUCCESS) return r;
	if (t != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
	struct state s;
	load(&s);
	*c = s.temp;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
	nvmlReturn_t r = check(d, mw);
	if (r != NVML_SUCCESS) return r;
	*mw = 600000;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
	nvmlReturn_t r = check(d, mw);
	if (r != NVML_SUCCESS) return r;
	*mw = 700000;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
	nvmlReturn_t r = check(d, u);
	if (r != NVML_SUCCESS) return r;
	u->gpu = 95;
	u->memory = 40;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
	nvmlReturn_t r = check(d, count);
	if (r != NVML_SUCCESS) return r;
	struct state s;
	load(&s);
	if (*count < s.npids) {
		*count = s.npids;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	*count = s.npids;
	for (unsigned int i = 0; i < s.npids; i++) {
		infos[i].pid = s.pids[i];
		infos[i].usedGpuMemory = 10 * GIB;
		infos[i].gpuInstanceId = 0xFFFFFFFF;
		infos[i].computeInstanceId = 0xFFFFFFFF;
	}
	return NVML_SUCCESS;
}
