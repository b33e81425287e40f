/* libFuzzer harness: the reader of the file names in an image's /usr/local/cuda/compat
 * (hook/cdihook.c's compat_newer(): libcuda.so.<version> through parse_version()), and of
 * GPUCTK_DRIVER_VERSION, which the same parser reads. The input is one name, as readdir() gives
 * it: at most NAME_MAX bytes, ended by a NUL. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char name[NAME_MAX + 1];
	size_t n = size < NAME_MAX ? size : NAME_MAX;
	memcpy(name, data, n);
	name[n] = 0;
	long v[4];
	if (parse_version(name, v) == 0 && (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0))
		abort(); /* digits only: no negative part */
	if (strncmp(name, GPUCTK_COMPAT_LIBCUDA, LIBCUDA_LEN) == 0)
		(void)parse_version(name + LIBCUDA_LEN, v);
	return 0;
}
