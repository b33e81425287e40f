/* libFuzzer harness: the device node guard's reader of /proc/driver/nvidia/params
 * (hook/cdihook.c's modified()), read under the container's /proc: the input is the file, the
 * output buffer sized as guard() sizes it. A copy that is made holds `ModifyDeviceFiles: 0`. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = fuzz_copy(data, size);
	char *out = malloc(size + 2 * strlen(GPUCTK_PARAMS_KEY) + 4);
	size_t olen = 0;
	if (!out)
		abort();
	int made = modified(text, size, out, &olen);
	if (made < 0 || made > 1 || (made && !memmem(out, olen, GPUCTK_PARAMS_KEY "0\n",
						     strlen(GPUCTK_PARAMS_KEY) + 2)))
		abort();
	free(out);
	free(text);
	return 0;
}
