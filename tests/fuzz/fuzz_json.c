/* libFuzzer harness: gpuctk-cdi-hook's strict JSON reader (hook/cdihook.c) over hostile bytes,
 * as the hook reads them: the OCI state on stdin (its "bundle"), the bundle's config.json (its
 * "root"."path", and process.env's NVIDIA_DRIVER_CAPABILITIES through container_caps()). Each
 * answer must be one the hook can use: a non-empty string without a NUL, or nothing; a
 * capability mask of known bits, or -1. */
#include "fuzz.h"

static void check_path(const char *p)
{
	if (!p)
		return;
	if (!*p)
		abort(); /* lookup() gives no empty string */
	(void)no_dots(p);
	(void)plain_path(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *doc = fuzz_copy(data, size);
	check_path(lookup(doc, size, "bundle", NULL));
	check_path(lookup(doc, size, "root", "path"));
	int unknown, caps = container_caps(doc, size, &unknown);
	if (caps < -1 || caps > EVERY_CAP || unknown < 0 || (size_t)unknown > size)
		abort();
	fuzz_release();
	free(doc);
	return 0;
}
