/* The shim front's create (hook/shimfront.c's shim_create) for libFuzzer harnesses, from
 * reading config.json to the edited text, with the product's own steps: read_config() of a
 * bundle folder, the request's key, front_plan() (read_plan() from a state folder of this
 * euid's, the plan's checks, its world), python_only() and edited(). Left out: the arguments
 * (fuzz_args.c), the log lines (they open files the plan names) and the write.
 *
 * The bundle and the state folder are made once under $TMPDIR. An input the front hands to
 * Python ends there (fuzz.h); an edit the front makes must be strict JSON it reads again. */
#include "fuzz.h"

static char shim_base[PATH_MAX], shim_bundle[PATH_MAX + 8], shim_state[PATH_MAX + 8],
	shim_front[2 * PATH_MAX], shim_prefixes[3 * PATH_MAX];
/* the CDI prefixes the plans are keyed on, as gpuctk.hook.shim.frontplan writes them */
static const char shim_prefix_doc[] = "{\"format\":\"" GPUCTK_PREFIXES_FORMAT "\",\"config\":\""
	GPUCTK_DEFAULT_CONFIG "\",\"prefixes\":[\"cdi.k8s.io/\"]}";

/* the folders gone at the end of the run (left where a report ends it) */
static void shim_cleanup(void)
{
	char config[sizeof shim_bundle + 16];
	snprintf(config, sizeof config, "%s/config.json", shim_bundle);
	unlink(config);
	unlink(shim_prefixes);
	rmdir(shim_front);
	rmdir(shim_state);
	rmdir(shim_bundle);
	rmdir(shim_base);
}

static void shim_write(const char *path, const char *text, size_t len);

static void shim_folders(void)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(shim_base, sizeof shim_base, "%s/gpuctk-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(shim_base))
		abort();
	snprintf(shim_bundle, sizeof shim_bundle, "%s/bundle", shim_base);
	snprintf(shim_state, sizeof shim_state, "%s/state", shim_base);
	snprintf(shim_front, sizeof shim_front, "%s/" GPUCTK_FRONT_FOLDER, shim_state);
	if (mkdir(shim_bundle, 0700) || mkdir(shim_state, 0700) || mkdir(shim_front, 0700))
		abort();
	snprintf(shim_prefixes, sizeof shim_prefixes, "%s/" GPUCTK_FRONT_PREFIXES, shim_front);
	shim_write(shim_prefixes, shim_prefix_doc, sizeof shim_prefix_doc - 1);
	atexit(shim_cleanup);
	setenv(GPUCTK_STATE_DIR_ENV, shim_state, 1);
	static char *argv[] = { "gpuctk-cdi-hook", GPUCTK_RUNTIME_FRONT, "/usr/bin/python3", "pass",
				"gpuctk-runtime", "create", "c1", NULL };
	sf_argv = argv; /* shim_python()'s command */
	sf_argc = 7;
}

static void shim_write(const char *path, const char *text, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || (len && write(fd, text, len) != (ssize_t)len) || close(fd))
		abort();
}

/* The plan for `keys`: written by `plan` (its keys and the text's length), or `text` as it is. */
typedef size_t (*plan_writer)(const struct span *keys, size_t nkeys, char *out, size_t size);

static struct edits shim_e; /* static: it outlives a hand-over's jump */
static volatile int shim_bfd = -1;
static char shim_plan[2 * PATH_MAX]; /* the plan file written, removed after the input */

/* The plan's log lines decoded and filled as the front fills them, written to /dev/null (never
 * to the log-file the plan names: an input could name any file). */
static void shim_line(struct span v)
{
	static char text[sizeof ((struct lines *)0)->etext]; /* as the front's */
	if (sf_text(v, text, sizeof text) == 0)
		write_line(open("/dev/null", O_WRONLY | O_CLOEXEC), text, "2026-01-01T00:00:00Z", "c1");
}

static void shim_lines(struct member *plan, size_t nplan)
{
	size_t nl, ne;
	struct member *lines = object_of(sf_get(plan, nplan, "lines"), "lines", &nl);
	static struct lines zoned;
	char stamp[64];
	if (read_zone(lines, nl, &zoned) == 0)
		(void)stamp_now(&zoned, stamp, sizeof stamp);
	for (size_t i = 0; i < nl; i++) {
		if (sf_kind(lines[i].val) != '{') {
			shim_line(lines[i].val);
			continue;
		}
		struct member *e = object_of(&lines[i], "engine", &ne);
		for (size_t k = 0; k < ne; k++)
			shim_line(e[k].val);
	}
}

/* One create over the config `conf` and the plan (`text`, or made by `writer`). */
static void shim_run(const char *conf, size_t clen, const char *text, size_t tlen,
		     plan_writer writer)
{
	static char made[1 << 16], config[sizeof shim_bundle + 16];
	snprintf(config, sizeof config, "%s/config.json", shim_bundle);
	shim_write(config, conf, clen);
	shim_plan[0] = 0;
	fuzz_fds_before();
	if (setjmp(fuzz_back) == 0) {
		fuzz_armed = 1;
		struct stat cst;
		char *doc;
		struct who who;
		size_t len, nproc, nplan, nkeys;
		memset(&shim_e, 0, sizeof shim_e);
		shim_bfd = open(shim_bundle, O_PATH | O_DIRECTORY | O_CLOEXEC);
		read_config(shim_bfd, &cst, &doc, &len);
		struct edits *e = &shim_e;
		e->all = (struct span){ doc, doc + len };
		need(sf_kind(e->all) == '{' && sf_items(e->all, 1, &e->top, &e->ntop) == 0, "plain");
		struct member *proc = object_of(sf_get(e->top, e->ntop, "process"), "process", &nproc);
		e->envm = sf_get(proc, nproc, "env");
		e->env = array_of(e->envm, "env", &e->nenv);
		size_t npre;
		struct span *pre = key_prefixes(GPUCTK_DEFAULT_CONFIG, &npre);
		struct span *keys = request_key(e->top, e->ntop, proc, nproc, e->env, e->nenv, pre,
						npre, &who, &nkeys);
		char name[32];
		plan_name(keys, nkeys, name);
		snprintf(shim_plan, sizeof shim_plan, "%s/%s", shim_front, name);
		if (writer)
			shim_write(shim_plan, made, writer(keys, nkeys, made, sizeof made));
		else
			shim_write(shim_plan, text, tlen);
		struct member *plan = front_plan(keys, nkeys, GPUCTK_DEFAULT_CONFIG, pre, npre, &nplan);
		python_only(e->top, e->ntop, proc, nproc, plan, nplan, "/bin/sh");
		e->mounts = who.mounts;
		e->nm = who.count[1];
		struct buf out = edited(e, plan, nplan);
		shim_lines(plan, nplan);
		struct json j = { out.p, out.p + out.n, 0 };
		if (compound(&j, NULL, NULL) < 0 || j.p != j.end)
			abort(); /* the front wrote a config it would not read */
	}
	if (shim_plan[0])
		unlink(shim_plan);
	fuzz_armed = 0;
	if (shim_bfd >= 0)
		close(shim_bfd);
	shim_bfd = -1;
	fuzz_fds_after();
	fuzz_release();
}
