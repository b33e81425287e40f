/* libFuzzer harness: the argument readers of gpuctk-cdi-hook (hook/cdihook.c's parse_args(),
 * through read_args() and split_link(): the spec's hook entry, --link and --link-for values,
 * the one reading gpuctk-hook asks for as read-args) and of gpuctk-runtime's front
 * (hook/shimfront.c's read_runc() and usual_create(): the engine's runc arguments, the one
 * reading, which runtime-front acts on and gpuctk-runtime's Python asks for as runc-args).
 * The input is the argument list, NUL between arguments; its first byte picks the hook's
 * verb. An argument the hook does not read hands it over (fuzz.h). */
#include "fuzz.h"

#define ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!size)
		return 0;
	char *copy = malloc(size); /* the arguments, each ended by a NUL */
	char *argv[ARGS + 3];
	int argc = 2;
	if (!copy)
		abort();
	memcpy(copy, data + 1, size - 1);
	copy[size - 1] = 0;
	argv[0] = "gpuctk-cdi-hook";
	argv[1] = data[0] & 1 ? GPUCTK_HOOK_VERB : GPUCTK_GUARD_ACTION;
	for (size_t at = 0; at < size && argc < ARGS + 2; at += strlen(copy + at) + 1)
		argv[argc++] = copy + at;
	argv[argc] = NULL;
	struct call call;
	struct runc_call r;
	static struct runc_flag flags[ARGS + 1];
	read_runc(argc - 2, argv + 2, &r, flags);
	if (usual_create(&r, &call) == 0 && (!call.id || call.id[0] == '-'))
		abort(); /* a create names one container id */
	g_argv = argv;
	if (setjmp(fuzz_back) == 0) {
		fuzz_armed = 1;
		static struct hook_args a;
		memset(&a, 0, sizeof a);
		a.create = data[0] & 1;
		parse_args(argc, argv, &a);
		for (int i = 0; i < a.nlinks; i++)
			if (!plain_path(a.targets[i]) || !plain_path(a.paths[i]))
				abort(); /* a link the hook makes is two plain paths */
	}
	fuzz_armed = 0;
	fuzz_release();
	free(copy);
	return 0;
}
