/*
 * Prints the sizes, offsets and constants of nvml.h that agent/gpu mirrors
 * in Go, one "name value" per line; compiled by the layout test against the
 * real header (go-nvml's copy).
 */
#include <stddef.h>
#include <stdio.h>
#include "nvml.h"

#define SIZE(t) printf("sizeof %s %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(t, f))
#define CONST(c) printf("const %s %lld\n", #c, (long long)(c))

int main(void) {
	SIZE(nvmlMemory_t);
	OFF(nvmlMemory_t, total);
	OFF(nvmlMemory_t, free);
	OFF(nvmlMemory_t, used);
	SIZE(nvmlMemory_v2_t);
	OFF(nvmlMemory_v2_t, version);
	OFF(nvmlMemory_v2_t, total);
	OFF(nvmlMemory_v2_t, reserved);
	OFF(nvmlMemory_v2_t, free);
	OFF(nvmlMemory_v2_t, used);
	SIZE(nvmlUtilization_t);
	OFF(nvmlUtilization_t, gpu);
	OFF(nvmlUtilization_t, memory);
	SIZE(nvmlProcessInfo_v1_t);
	OFF(nvmlProcessInfo_v1_t, pid);
	OFF(nvmlProcessInfo_v1_t, usedGpuMemory);
	SIZE(nvmlProcessInfo_t);
	OFF(nvmlProcessInfo_t, pid);
	OFF(nvmlProcessInfo_t, usedGpuMemory);
	OFF(nvmlProcessInfo_t, gpuInstanceId);
	OFF(nvmlProcessInfo_t, computeInstanceId);
	SIZE(nvmlDevice_t);
	SIZE(nvmlReturn_t);
	SIZE(nvmlClockType_t);
	CONST(nvmlMemory_v2);
	CONST(NVML_DEVICE_UUID_V2_BUFFER_SIZE);
	CONST(NVML_DEVICE_NAME_V2_BUFFER_SIZE);
	CONST(NVML_CLOCK_SM);
	CONST(NVML_CLOCK_MEM);
	CONST(NVML_TEMPERATURE_GPU);
	CONST(NVML_SUCCESS);
	CONST(NVML_ERROR_UNINITIALIZED);
	CONST(NVML_ERROR_INVALID_ARGUMENT);
	CONST(NVML_ERROR_NOT_SUPPORTED);
	CONST(NVML_ERROR_NO_PERMISSION);
	CONST(NVML_ERROR_NOT_FOUND);
	CONST(NVML_ERROR_INSUFFICIENT_SIZE);
	CONST(NVML_ERROR_DRIVER_NOT_LOADED);
	CONST(NVML_ERROR_LIBRARY_NOT_FOUND);
	CONST(NVML_ERROR_FUNCTION_NOT_FOUND);
	CONST(NVML_ERROR_GPU_IS_LOST);
	CONST(NVML_ERROR_LIB_RM_VERSION_MISMATCH);
	CONST(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
	CONST(NVML_ERROR_UNKNOWN);
	CONST((unsigned long long)NVML_VALUE_NOT_AVAILABLE);
	return 0;
}
