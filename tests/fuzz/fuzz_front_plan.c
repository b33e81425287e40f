/* libFuzzer harness: the shim front's reader of a front plan (hook/shimfront.c: read_plan(),
 * front_plan(), and every field the edits take from it). The input is the plan file; the
 * config.json is a fixed one whose request key the seeds' plans name. */
#include "shim.h"

static const char config[] =
	"{\"ociVersion\":\"1.0.2\",\"process\":{\"user\":{\"uid\":0,\"gid\":0},"
	"\"env\":[\"PATH=/usr/bin:/bin\",\"NVIDIA_VISIBLE_DEVICES=0\",\"CUDA_VERSION=12.2\"],"
	"\"capabilities\":{\"bounding\":[\"CAP_CHOWN\"]}},\"root\":{\"path\":\"rootfs\"},"
	"\"mounts\":[{\"destination\":\"/proc\",\"type\":\"proc\",\"source\":\"proc\"},"
	"{\"destination\":\"/usr/bin/nvidia-smi\",\"type\":\"bind\",\"source\":\"/usr/bin/true\"}],"
	"\"linux\":{\"devices\":[{\"path\":\"/dev/nvidia0\",\"type\":\"c\",\"major\":195,"
	"\"minor\":0}],\"resources\":{\"devices\":[{\"allow\":false,\"access\":\"rwm\"}]}},"
	"\"hooks\":{\"prestart\":[]},\"annotations\":{\"org.example\":\"x\"}}";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	shim_folders();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	shim_run(config, sizeof config - 1, (const char *)data, size, NULL);
	return 0;
}
