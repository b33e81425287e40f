/* libFuzzer harness: the shim front's readers of a hostile config.json (hook/shimfront.c):
 * its search for the memo's request markers (no_request()), and the compiled create's reading
 * and edits: the input is the bundle's config.json; the front plan is one gpuctk writes
 * for that config's request (its key made from the config, so that the edits run; its recipes
 * name the config's first items and the plan's own, so a short list goes to Python). */
#include "shim.h"

static const char plan_head[] = "{\"format\":\"" GPUCTK_PLAN_FORMAT "\",\"key\":[";
static const char plan_tail[] =
	"],\"config\":\"" GPUCTK_DEFAULT_CONFIG "\",\"world\":[],\"prefixes\":[],"
	"\"lines\":{\"engine\":{\"\":\"time=\\\"" GPUCTK_STAMP_MARK "\\\" level=info msg=\\\""
	GPUCTK_ID_MARK ": injected nvidia.com/gpu=0\\\"\\n\"}},\"log_file\":\"\","
	"\"runtime\":\"/bin/sh\",\"chain\":[],\"log_id\":[],\"cdi_prefixes\":[\"cdi.k8s.io/\"],"
	"\"env\":[0,\"NVIDIA_VISIBLE_DEVICES=void\",1,\"PATH=/usr/local/nvidia/bin\"],"
	"\"devices\":[{\"path\":\"/dev/nvidia0\",\"type\":\"c\",\"major\":195,\"minor\":0},0],"
	"\"rules\":[{\"allow\":true,\"type\":\"c\",\"major\":195,\"minor\":0,\"access\":\"rwm\"}],"
	"\"mounts\":[0,{\"destination\":\"/usr/bin/nvidia-smi\",\"source\":\"/usr/bin/true\","
	"\"options\":[\"ro\",\"nosuid\",\"nodev\",\"bind\"]},1,{\"destination\":\"/dev/shm/x\","
	"\"source\":\"/tmp\",\"options\":[\"bind\"]}],"
	"\"hooks\":{\"createContainer\":[{\"path\":\"/usr/bin/gpuctk-cdi-hook\","
	"\"args\":[\"gpuctk-cdi-hook\",\"createContainer\"]}],\"poststop\":[]}}";

/* The plan above with `keys` (plain strings: no quote or backslash) as its key. */
static size_t keyed(const struct span *keys, size_t nkeys, char *out, size_t size)
{
	struct buf b = { 0 };
	puts_(&b, plan_head);
	for (size_t i = 0; i < nkeys; i++) {
		puts_(&b, i ? ",\"" : "\"");
		put(&b, keys[i].p, (size_t)(keys[i].end - keys[i].p));
		puts_(&b, "\"");
	}
	puts_(&b, plan_tail);
	if (b.bad)
		abort();
	size_t n = b.n <= size ? b.n : 0; /* a key too long for the buffer: an empty plan */
	memcpy(out, b.p, n);
	return n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	shim_folders();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	shim_run((const char *)data, size, NULL, 0, keyed);
	char markers[] = "NVIDIA_VISIBLE_DEVICES\tcdi.k8s.io/"; /* the default config's */
	if (no_request(shim_bundle, markers) && memmem(data, size, "cdi.k8s.io/", 11))
		abort(); /* a marker in the text: it may ask for a GPU */
	return 0;
}
