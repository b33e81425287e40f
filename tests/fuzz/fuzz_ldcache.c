/* libFuzzer harness: gpuctk-cdi-hook's ld.so.cache reader and merger (hook/ldcache.c) over a
 * hostile image's /etc/ld.so.cache: the input merged with a small stage cache of the kind
 * gpuctk.cdi.stage writes, with itself (the stage's reader is the same code), and with the
 * two parts gpuctk-hook's merge passes (entries it built, then the stage's). A merge that
 * succeeds must give a cache this reader takes again, every entry whole, no more entries than
 * the inputs hold. */
#include "fuzz.h"

static char stage[512];
static size_t stage_len;

/* A new-format cache of two entries (libcuda.so.1 and libnvidia-ml.so.1 in the stage's
 * folder), laid out as ldconfig and gpuctk.cdi.node.ldcache write it. */
static void make_stage(void)
{
	static const char *const names[] = { "libcuda.so.1", "libnvidia-ml.so.1" };
	const char *dir = "/usr/local/nvidia/lib64/";
	size_t n = sizeof names / sizeof *names, at = LDC_HEADER + n * LDC_ENTRY;
	memset(stage, 0, sizeof stage);
	memcpy(stage, LDC_MAGIC, strlen(LDC_MAGIC));
	for (size_t i = 0; i < n; i++) {
		int32_t flags = 0x0303;
		uint32_t value = (uint32_t)at, key = (uint32_t)(at + strlen(dir));
		char *e = stage + LDC_HEADER + i * LDC_ENTRY;
		memcpy(e, &flags, 4);
		memcpy(e + 4, &key, 4);
		memcpy(e + 8, &value, 4);
		at += (size_t)sprintf(stage + at, "%s%s", dir, names[i]) + 1;
	}
	uint32_t head[2] = { (uint32_t)n, (uint32_t)(at - LDC_HEADER - n * LDC_ENTRY) };
	memcpy(stage + 20, head, sizeof head);
	stage[28] = 2; /* little-endian */
	stage_len = at;
}

/* A merge's output, checked as a cache read by the same reader. */
static void check(const char *out, size_t len, uint32_t most)
{
	struct ldc_file f;
	if (ldc_open(out, len, &f) != 0 || f.nlibs > most)
		abort();
	for (uint32_t i = 0; i < f.nlibs; i++) {
		struct ldc_entry e;
		if (ldc_entry(&f, i, &e) < 0)
			abort();
	}
}

static void merge(const char *image, size_t ilen, const char *part, size_t plen)
{
	char *out = NULL;
	size_t olen = 0;
	struct ldc_file a, b;
	if (ldc_merge(image, ilen, part, plen, &out, &olen) != 0)
		return;
	if (ldc_open(image, ilen, &a) != 0 || ldc_open(part, plen, &b) != 0)
		abort(); /* merged, yet one of the two is not a cache */
	check(out, olen, a.nlibs + b.nlibs);
	const char *parts[2] = { part, image };
	size_t lens[2] = { plen, ilen };
	char *both = NULL; /* the product's allocations: fuzz_release() frees them */
	if (ldc_merge_parts(image, ilen, parts, lens, 2, &both, &olen) != 0)
		abort(); /* both merged one by one above */
	check(both, olen, a.nlibs + b.nlibs + a.nlibs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!stage_len)
		make_stage();
	char *image = fuzz_copy(data, size);
	char *part = fuzz_copy((const uint8_t *)stage, stage_len);
	merge(image, size, part, stage_len);
	merge(image, size, image, size);
	fuzz_release();
	free(image);
	free(part);
	return 0;
}
