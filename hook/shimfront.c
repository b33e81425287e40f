/* gpuctk-runtime's front, compiled: every call of gpuctk-runtime, and its create for a request
 * the shim resolved before. Part of the gpuctk-cdi-hook binary (included by cdihook.c: one
 * program, one build, one file to install).
 *
 *     gpuctk-cdi-hook runtime-front PYTHON PYCODE SHIM [the runtime's arguments...]
 *
 * gpuctk-runtime's sh launcher (gpuctk.install.launchers) execs this for every call. It reads
 * runc's arguments and the runtime memo, and execs the low-level runtime, the Python shim, or
 * does the create itself (runtime_front() says which). The compiled create (shim_create())
 * runs for a `create` once the memo holds. It does what the Python shim would do with the
 * same result, without a Python start, when every one of these holds; otherwise it execs
 * `PYTHON -IS -c PYCODE SHIM ARGS...`, the shim itself, with the environment as given but
 * GPUCTK_FRONT_RUNTIME naming the memo's runtime (nothing written, nothing changed):
 *
 *   - the arguments are runc's usual create, the flags gpuctk.hook.shim.runcargs names for
 *     this program (in gpuctk_vocab.h) and one container id, each once: not --debug nor crun's
 *     --config; GPUCTK_SHIM_FRONT not `off`, GPUCTK_SPEC_CACHE not `0`;
 *   - BUNDLE/config.json is a regular file (not a link) of plain JSON: UTF-8, strict, the
 *     keys of each object this program reads ASCII, unescaped and unique in any case (runc
 *     folds case, and U+017F and U+212A onto s and k),
 *     what the key holds of each env entry (a keyed one whole, another's name) printable
 *     ASCII without a quote or a backslash once its escapes are decoded (Go's JSON, every
 *     engine's, writes <, > and & as escapes: the `>=` of a CUDA image's
 *     NVIDIA_REQUIRE_CUDA), each CDI annotation unescaped, no mount destination with an
 *     escape, a plain source for each that names nvidia-container-devices (the device
 *     plugin's volume-mounts), each linux.devices entry an object with an unescaped path,
 *     no field apply would refuse (a hook stage, additionalGids or netDevices of another
 *     type);
 *   - a front plan (gpuctk.hook.shim.frontplan) for the request's key: the container's env entries
 *     that start with NVIDIA_ or CUDA_VERSION, in order, whether CAP_SYS_ADMIN is in its
 *     bounding set, its uid and gid, the name of each env entry, mount destination and
 *     linux.devices path (each a plain string), the source of each mount whose destination
 *     names nvidia-container-devices, the key of each annotation that marks a Kubernetes
 *     container (and the manager's value), then the key and value of each annotation whose
 *     key starts with one of the CDI prefixes Python names in front/keyed-on (for this config
 *     file; the plan must name the same). Python writes one when it resolved that key with no
 *     note and no error and the spec's only hooks are gpuctk-cdi-hook createContainer entries.
 *     It is read only from a folder of this euid's that nobody else can write (nor any folder above
 *     it), a file of this euid's, and only while the config file, the spec dirs and files,
 *     gpuctk's own code and any device node whose numbers came from the host still have the
 *     identity (device, inode, size, mtime, ctime) it names;
 *   - every file the plan makes root use (hook files, mount sources, device host paths, the
 *     runtime, which must be the plan's, and the log-file) and each step to it from / (each
 *     folder, each link and its target's steps) is still the inode, type, mode and owner the
 *     plan names: Python checked them by gpuctk's trusted-path rules when it wrote the plan
 *     (gpuctk.hook.shim.frontplan), and nobody but root can change them unseen since; this
 *     program checks no rule of its own there;
 *   - the config's log-file (if the plan has a line for it) opens, without a link followed,
 *     as the file the plan names: the plan's lines (the shim's `injected` line, written by
 *     gpuctk.log) go there and to the engine's --log, the time and the container id filled.
 *
 * The edits are the plan's, made by gpuctk.cdi.specs.apply (CDI's rules) for a config with these
 * names: the new env, mounts and linux.devices lists as recipes (each item an index into the
 * config's list or an item of the plan's, so no rule of the merge is here), the cgroup rules
 * appended, the hooks appended to their stage. The spec's gpuctk-cdi-hook entry stays (the
 * Python shim does its work in the shim instead): it runs inside runc, does nothing for the
 * common image, and hands the rest to gpuctk-hook; it also guards /proc/driver/nvidia/params.
 * config.json is written to a new file in the bundle folder (its descriptor), mode and owner
 * kept, and renamed over. */

#define SF_MAX_ITEMS 65536 /* in a list this program reads */
#define SF_MAX_MEMBERS 4096 /* in an object this program reads */

static char **sf_argv;
static int sf_argc;

/* ---- hand over to the Python shim ---------------------------------------------------------- */

static int sf_keying; /* front-key: a refusal is an exit, not a hand-over */

__attribute__((noreturn)) static void shim_python(const char *why)
{
	if (sf_keying) {
		fprintf(stderr, "gpuctk-cdi-hook: " GPUCTK_FRONT_KEY ": no key: %s\n", why);
		exit(1);
	}
	if (getenv(GPUCTK_SHIM_FRONT_TRACE_ENV))
		fprintf(stderr, "gpuctk-runtime: front: python: %s\n", why);
	char **argv = calloc((size_t)sf_argc + 2, sizeof *argv);
	if (!argv) {
		fprintf(stderr, "gpuctk-runtime: error: out of memory\n");
		exit(1);
	}
	int n = 0;
	argv[n++] = sf_argv[2];
	argv[n++] = "-IS";
	argv[n++] = "-c";
	argv[n++] = sf_argv[3];
	for (int i = 4; i < sf_argc; i++)
		argv[n++] = sf_argv[i];
	argv[n] = NULL;
	execv(sf_argv[2], argv);
	fprintf(stderr, "gpuctk-runtime: error: cannot run %s: %s\n", sf_argv[2], strerror(errno));
	exit(1);
}

/* Go on only if `ok`; else Python, for `why`. A macro, so that a compiler sees what follows
 * runs only when `ok` holds (each variable it sets is then set). */
#define need(ok, why) ((ok) ? (void)0 : shim_python(why))

/* ---- the JSON, one level at a time ----------------------------------------------------------- */

struct span { const char *p, *end; };
struct member { struct span key, val; }; /* a value's span: from its first byte to its last */

static int sf_count(struct span s, int object, size_t *count);

static int by_folded(const void *a, const void *b)
{
	const struct span *x = *(const struct span *const *)a, *y = *(const struct span *const *)b;
	size_t xn = (size_t)(x->end - x->p), yn = (size_t)(y->end - y->p);
	int c = strncasecmp(x->p, y->p, xn < yn ? xn : yn);
	return c ? c : (xn > yn) - (xn < yn);
}

/* Whether two of the n keys are equal in any case (sorted folded, neighbours compared: the
 * work stays n log n however the keys are made). */
static int folded_twice(struct member *m, size_t n)
{
	const struct span **keys = calloc(n, sizeof *keys);
	if (!keys)
		return 1;
	for (size_t i = 0; i < n; i++)
		keys[i] = &m[i].key;
	qsort(keys, n, sizeof *keys, by_folded);
	int twice = 0;
	for (size_t i = 1; i < n && !twice; i++)
		twice = by_folded(&keys[i - 1], &keys[i]) == 0;
	free(keys);
	return twice;
}

/* The members (object) or elements (array, keys unset) of the compound at s, each value
 * checked to its end; for an object, every key plain ASCII without an escape and no two equal
 * in any case. 0, or -1 not understood (then *out is not to be freed). */
static int sf_items(struct span s, int object, struct member **out, size_t *count)
{
	size_t n;
	if (sf_count(s, object, &n) != 0 || n > (object ? SF_MAX_MEMBERS : SF_MAX_ITEMS))
		return -1;
	struct member *m = calloc(n + 1, sizeof *m);
	if (!m)
		return -1;
	struct json j = { s.p, s.end, 0 };
	ws(&j);
	j.p++; /* the bracket sf_count checked */
	for (size_t i = 0; i < n; i++) {
		ws(&j);
		if (object) {
			const char *k;
			size_t kn;
			int esc;
			if (string(&j, &k, &kn, &esc) || esc)
				goto bad;
			m[i].key.p = k;
			m[i].key.end = k + kn;
			ws(&j);
			j.p++; /* the colon sf_count checked */
			ws(&j);
		}
		m[i].val.p = j.p;
		if (value(&j))
			goto bad;
		m[i].val.end = j.p; /* compound() also took the space after it: left out */
		while (m[i].val.end > m[i].val.p && strchr(" \t\n\r", m[i].val.end[-1]))
			m[i].val.end--;
		ws(&j);
		j.p++; /* a comma, or the closing bracket */
	}
	if (object && n > 1 && folded_twice(m, n))
		goto bad;
	*out = m;
	*count = n;
	return 0;
bad:
	free(m);
	return -1;
}

/* How many items the compound at s holds, the whole compound checked strictly. */
static int sf_count(struct span s, int object, size_t *count)
{
	struct json j = { s.p, s.end, 0 };
	ws(&j);
	if (j.p >= j.end || *j.p != (object ? '{' : '['))
		return -1;
	const char *start = j.p;
	if (compound(&j, NULL, NULL) < 0)
		return -1;
	/* compound() checked it: count the top-level commas again, cheaply */
	struct json k = { start + 1, s.end, 0 };
	size_t n = 0;
	ws(&k);
	if (*k.p == (object ? '}' : ']')) {
		*count = 0;
		return 0;
	}
	for (;;) {
		if (object) {
			const char *x;
			size_t xn;
			int esc;
			ws(&k);
			if (string(&k, &x, &xn, &esc))
				return -1;
			ws(&k);
			k.p++;
		}
		if (value(&k))
			return -1;
		n++;
		ws(&k);
		if (*k.p++ != ',')
			break;
	}
	*count = n;
	return 0;
}

static int sf_is(struct span key, const char *name)
{
	size_t n = strlen(name);
	return (size_t)(key.end - key.p) == n && memcmp(key.p, name, n) == 0;
}

/* The member `name` of an object of sf_items (no two keys equal in any case): NULL when
 * absent, or when *folded is set: a key that is `name` in another case (runc's decoder folds
 * case: it would read that one). */
static struct member *sf_member(struct member *m, size_t n, const char *name, int *folded)
{
	size_t len = strlen(name);
	*folded = 0;
	for (size_t i = 0; i < n; i++) {
		if (sf_is(m[i].key, name))
			return &m[i];
		if ((size_t)(m[i].key.end - m[i].key.p) == len && strncasecmp(m[i].key.p, name, len) == 0) {
			*folded = 1;
			return NULL;
		}
	}
	return NULL;
}

/* The member `name` of an object, NULL when absent; a key in another case goes to Python. */
static struct member *sf_get(struct member *m, size_t n, const char *name)
{
	int folded;
	struct member *f = sf_member(m, n, name, &folded);
	if (folded)
		shim_python("a key in another case");
	return f;
}

static const char *sf_start(struct span v)
{
	struct json j = { v.p, v.end, 0 };
	ws(&j);
	return j.p;
}

static int sf_kind(struct span v) { return *sf_start(v); }

/* The number of elements of the list v (-1: not a list). */
static long list_len(struct span v)
{
	size_t n;
	return sf_kind(v) == '[' && sf_count(v, 0, &n) == 0 ? (long)n : -1;
}

/* The bytes of a string without an escape: 0, -1 when v is not one. */
static int sf_plain(struct span v, const char **s, size_t *n)
{
	struct json j = { sf_start(v), v.end, 0 };
	int esc;
	if (string(&j, s, n, &esc) || esc)
		return -1;
	return 0;
}

/* The length of the UTF-8 character at p (n bytes left, p[0] above 127), as Python's strict
 * decoder takes it: 2 to 4, 0 for an invalid one (a stray continuation byte, an overlong form,
 * an encoded surrogate, above U+10FFFF, cut short). */
static size_t utf8_len(const unsigned char *p, size_t n)
{
	size_t len = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : 2;
	unsigned lo = 0x80, hi = 0xbf; /* the second byte's range */
	if (p[0] < 0xc2 || p[0] > 0xf4 || n < len)
		return 0;
	if (p[0] == 0xe0)
		lo = 0xa0; /* no overlong form */
	else if (p[0] == 0xed)
		hi = 0x9f; /* no surrogate */
	else if (p[0] == 0xf0)
		lo = 0x90;
	else if (p[0] == 0xf4)
		hi = 0x8f; /* nothing above U+10FFFF */
	if (p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if ((p[i] & 0xc0) != 0x80)
			return 0;
	return len;
}

/* The string v, its escapes decoded, in *s (*n bytes): v's own text where it has no escape or
 * byte above 127, else a buffer of its own in *buf (NULL otherwise; the caller frees it). Each
 * character above 127 (its UTF-8 bytes, or a \u escape: a surrogate pair's two) and each NUL
 * becomes the one byte 0x80 and sets *wide: never a byte of a word, a blank or a separator
 * this program compares. 0, -1 when v is not a string, holds bytes that are not UTF-8 (which
 * Python's reader refuses), or there is no memory. */
static int sf_decoded(struct span v, const char **s, size_t *n, int *wide, char **buf)
{
	struct json j = { sf_start(v), v.end, 0 };
	const char *raw;
	size_t len;
	int esc;
	*wide = 0;
	*buf = NULL;
	if (string(&j, &raw, &len, &esc))
		return -1;
	*s = raw;
	*n = len;
	if (!esc)
		return 0;
	char *out = malloc(len + 1);
	if (!out)
		return -1;
	size_t o = 0;
	for (size_t i = 0; i < len; i++) {
		unsigned x = (unsigned char)raw[i];
		if (x == '\\') { /* string() checked every escape: a letter, or u and four digits */
			char c = raw[++i], hex[5] = { 0 };
			if (c == 'u') {
				memcpy(hex, raw + i + 1, 4);
				i += 4;
			}
			x = c == 'u' ? (unsigned)strtoul(hex, NULL, 16) : c == 'b' ? '\b' : c == 'f' ? '\f' :
			    c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : (unsigned char)c;
		} else if (x > 0x7f) {
			size_t u = utf8_len((const unsigned char *)raw + i, len - i);
			if (u == 0) {
				free(out);
				return -1;
			}
			i += u - 1;
		}
		if (x == 0 || x > 0x7f) {
			*wide = 1;
			x = 0x80;
		}
		out[o++] = (char)x;
	}
	out[o] = 0;
	*s = *buf = out;
	*n = o;
	return 0;
}

/* Whether JSON writes `t` as it is: printable ASCII, no quote, no backslash (a key string is
 * printed by front-key and compared with the plan's as it is). */
static int plain_text(struct span t)
{
	for (const char *p = t.p; p < t.end; p++)
		if (*p < 0x20 || *p > 0x7e || *p == '"' || *p == '\\')
			return 0;
	return 1;
}

/* The string v, without an escape or a NUL, as a C string in out (size bytes): 0, else -1. */
static int sf_cstr(struct span v, char *out, size_t size)
{
	const char *s;
	size_t n;
	if (sf_plain(v, &s, &n) != 0 || n >= size || memchr(s, 0, n))
		return -1;
	memcpy(out, s, n);
	out[n] = 0;
	return 0;
}

/* A non-negative integer literal: 0, -1 when v is not one (or too large). */
static int sf_uint(struct span v, unsigned long long *out)
{
	const char *p = sf_start(v);
	unsigned long long x = 0;
	if (p >= v.end || *p < '0' || *p > '9')
		return -1;
	for (; p < v.end && *p >= '0' && *p <= '9'; p++) {
		if (x > (~0ULL - 9) / 10)
			return -1;
		x = x * 10 + (unsigned long long)(*p - '0');
	}
	while (p < v.end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	if (p != v.end)
		return -1;
	*out = x;
	return 0;
}

static struct member *object_of(struct member *m, const char *why, size_t *n)
{
	struct member *items;
	need(m && sf_kind(m->val) == '{' && sf_items(m->val, 1, &items, n) == 0, why);
	return items;
}

static struct member *array_of(struct member *m, const char *why, size_t *n)
{
	struct member *items;
	need(m && sf_kind(m->val) == '[' && sf_items(m->val, 0, &items, n) == 0, why);
	return items;
}

/* ---- text being built -------------------------------------------------------------------------- */

struct buf { char *p; size_t n, cap; int bad; };

static void put(struct buf *b, const char *s, size_t n)
{
	if (b->bad)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->bad = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

static void put_span(struct buf *b, struct span v) { put(b, v.p, (size_t)(v.end - v.p)); }

/* ---- the plan's folder ------------------------------------------------------------------------ */

/* The O_PATH descriptor of `path` when it is a folder of this euid's that nobody else can
 * write, reached from / through folders each root's or this euid's and not group/world
 * writable unless sticky (the next one then still root's or this euid's), no link on the way
 * and no `..`; -1 for anything else. The plan is the one file this program trusts on its own
 * reading: every other file it is to use, the plan names with its identity (entries_hold). */
static int private_folder(const char *path)
{
	char rest[PATH_MAX];
	if (path[0] != '/' || strlen(path) >= sizeof rest)
		return -1;
	strcpy(rest, path);
	struct stat st;
	int cur = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	for (char *save = NULL, *name = strtok_r(rest, "/", &save); cur >= 0;
	     name = strtok_r(NULL, "/", &save)) {
		int ok = fstat(cur, &st) == 0 && S_ISDIR(st.st_mode) &&
			 (st.st_uid == 0 || st.st_uid == geteuid());
		if (ok && !name) {
			if (st.st_uid == geteuid() && !(st.st_mode & 022))
				return cur;
			ok = 0;
		}
		int next = ok && (!(st.st_mode & 022) || (st.st_mode & S_ISVTX)) && strcmp(name, "..") ?
				   openat(cur, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) :
				   -1;
		close(cur);
		cur = next;
	}
	return -1;
}

/* ---- the plan ---------------------------------------------------------------------------------- */

/* FNV-1a (64 bits) over each key string and a NUL after it: the plan's file name. */
static unsigned long long fnv(const struct span *keys, size_t n)
{
	unsigned long long h = 0xcbf29ce484222325ULL;
	for (size_t i = 0; i < n; i++) {
		for (const char *p = keys[i].p; p < keys[i].end; p++) {
			h ^= (unsigned char)*p;
			h *= 0x100000001b3ULL;
		}
		h *= 0x100000001b3ULL; /* the NUL: h ^= 0 */
	}
	return h;
}

/* Whether each entry of the plan's list `v` still holds: for the world, [path, dev, ino, size,
 * mtime_ns, ctime_ns] from stat (links followed), or [path] for a missing one; for the chain
 * (`chain` set), [path, dev, ino, mode, uid, gid] from lstat: each step the kernel takes to
 * a file root is to use, which Python checked by gpuctk's rules when it wrote the plan. */
static int entries_hold(struct span v, int chain)
{
	struct member *w;
	size_t n;
	if (sf_items(v, 0, &w, &n) != 0)
		return 0;
	int ok = 1;
	for (size_t i = 0; ok && i < n; i++) {
		struct member *f;
		size_t fn;
		if (sf_items(w[i].val, 0, &f, &fn) != 0) {
			ok = 0;
			break;
		}
		char path[PATH_MAX];
		struct stat st;
		unsigned long long v5[5], got[5];
		ok = (fn == 6 || (fn == 1 && !chain)) && sf_cstr(f[0].val, path, sizeof path) == 0 &&
		     *path;
		for (size_t k = 1; ok && k < fn; k++)
			ok = sf_uint(f[k].val, &v5[k - 1]) == 0;
		free(f);
		if (!ok)
			break;
		int res = chain ? lstat(path, &st) : stat(path, &st);
		if (fn == 1) {
			ok = res != 0 && absent();
			continue;
		}
		got[0] = (unsigned long long)st.st_dev;
		got[1] = (unsigned long long)st.st_ino;
		got[2] = chain ? st.st_mode : (unsigned long long)st.st_size;
		got[3] = chain ? st.st_uid :
				 (unsigned long long)st.st_mtim.tv_sec * 1000000000ULL +
					 (unsigned long long)st.st_mtim.tv_nsec;
		got[4] = chain ? st.st_gid :
				 (unsigned long long)st.st_ctim.tv_sec * 1000000000ULL +
					 (unsigned long long)st.st_ctim.tv_nsec;
		ok = res == 0 && memcmp(got, v5, sizeof got) == 0;
	}
	free(w);
	return ok;
}

/* The state folder: $GPUCTK_STATE_DIR, or its default where unset or empty. */
static const char *state_dir(void)
{
	const char *state = getenv(GPUCTK_STATE_DIR_ENV);
	return state && *state ? state : GPUCTK_DEFAULT_STATE_DIR;
}

/* The config file in force: $GPUCTK_CONFIG, or its default where unset or empty. */
static const char *config_file(void)
{
	const char *conf = getenv(GPUCTK_CONFIG_ENV);
	return conf && *conf ? conf : GPUCTK_DEFAULT_CONFIG;
}

/* The O_PATH descriptor of the front folder ($GPUCTK_STATE_DIR/front) if it is one this program
 * reads plans from (private_folder), else -1. */
static int front_folder(void)
{
	char folder[PATH_MAX];
	if (snprintf(folder, sizeof folder, "%s/" GPUCTK_FRONT_FOLDER, state_dir()) >= (int)sizeof folder)
		return -1;
	return private_folder(folder);
}

/* The file `name` of the front folder, read through its descriptor; NULL if none that may be
 * used. */
static char *read_front(const char *name, size_t *len)
{
	int dir = front_folder();
	if (dir < 0)
		return NULL;
	int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	close(dir);
	if (fd < 0)
		return NULL;
	struct stat st;
	char *text = NULL;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 022) || read_all(fd, GPUCTK_MAX_PLAN, &text, len) != 0)
		text = NULL;
	else
		(void)futimens(fd, NULL); /* read now: Python evicts the plans read longest ago */
	close(fd);
	return text;
}

/* The plan's file name in the front folder: the key's checksum in 16 hex digits, .json. */
static void plan_name(const struct span *keys, size_t nkeys, char name[32])
{
	snprintf(name, 32, "%016llx.json", fnv(keys, nkeys));
}

/* The front plan named by the key; NULL if none that may be used. */
static char *read_plan(const struct span *keys, size_t nkeys, size_t *len)
{
	char name[32];
	plan_name(keys, nkeys, name);
	return read_front(name, len);
}

/* Whether the list `v` holds exactly the n plain strings of `want`, in order. */
static int same_strings(struct span v, const struct span *want, size_t n)
{
	struct member *m;
	size_t k;
	if (sf_kind(v) != '[' || sf_items(v, 0, &m, &k) != 0)
		return 0;
	int same = k == n;
	for (size_t i = 0; same && i < n; i++) {
		const char *a;
		size_t an;
		same = sf_plain(m[i].val, &a, &an) == 0 && an == (size_t)(want[i].end - want[i].p) &&
		       memcmp(a, want[i].p, an) == 0;
	}
	free(m);
	return same;
}

/* Whether the object's member `name` is the plain string `want`. */
static int field_is(struct member *m, size_t n, const char *name, const char *want)
{
	struct member *f = sf_get(m, n, name);
	const char *s;
	size_t sn;
	return f && sf_plain(f->val, &s, &sn) == 0 && sn == strlen(want) && memcmp(s, want, sn) == 0;
}

/* ---- the edits ---------------------------------------------------------------------------------- */

/* The key of an env entry: up to its `=` (the whole entry without one). */
static size_t env_key(struct span s)
{
	const char *eq = memchr(s.p, '=', (size_t)(s.end - s.p));
	return (size_t)((eq ? eq : s.end) - s.p);
}

/* The string of member `name` in the object v: 0, -1 when absent or not a plain string. */
static int member_string(struct span v, const char *name, const char **s, size_t *n)
{
	struct member *m;
	size_t count;
	if (sf_kind(v) != '{' || sf_items(v, 1, &m, &count) != 0)
		return -1;
	struct member *f = sf_get(m, count, name);
	int rc = f ? sf_plain(f->val, s, n) : -1;
	free(m);
	return rc;
}

struct patch { const char *at, *end; struct buf text; };

static int by_at(const void *a, const void *b)
{
	const struct patch *x = a, *y = b;
	return x->at < y->at ? -1 : (x->at > y->at);
}

static void put_list(struct buf *b, struct span *items, size_t n)
{
	puts_(b, "[");
	for (size_t i = 0; i < n; i++) {
		if (i)
			puts_(b, ",");
		put_span(b, items[i]);
	}
	puts_(b, "]");
}

/* Patch: the object `obj` gets `"key":text,...` (the members in b) inserted first. */
static void insert_members(struct patch *p, struct span obj, struct buf *members)
{
	const char *open = sf_start(obj);
	struct json j = { open + 1, obj.end, 0 };
	ws(&j);
	p->at = p->end = open + 1;
	put(&p->text, members->p, members->n);
	if (*j.p != '}')
		puts_(&p->text, ",");
}

/* The list a recipe of the plan makes of the config's n items `cur`: each number in it the
 * config's item at that index, each string or object an item of the plan's, in the recipe's
 * order (-1 for anything else, or an index past the list).
 * Python made the recipe with gpuctk.cdi.specs.apply for a config whose names (each env
 * entry's, mount destination, device path) the key holds: the merge's rules are apply's. */
static int assemble(struct member *cur, size_t n, struct span recipe, struct buf *out)
{
	struct member *r;
	size_t nr;
	if (sf_kind(recipe) != '[' || sf_items(recipe, 0, &r, &nr) != 0)
		return -1;
	int rc = 0;
	puts_(out, "[");
	for (size_t i = 0; rc == 0 && i < nr; i++) {
		unsigned long long at;
		if (i)
			puts_(out, ",");
		int kind = sf_kind(r[i].val);
		if (kind == '"' || kind == '{')
			put_span(out, r[i].val);
		else if (sf_uint(r[i].val, &at) == 0 && at < n)
			put_span(out, cur[at].val);
		else
			rc = -1;
	}
	puts_(out, "]");
	free(r);
	return rc;
}

/* The array `cur` with the plan's list appended. */
static int edit_append(struct span cur, struct span plan, struct buf *out)
{
	struct member *a, *b;
	size_t na, nb;
	if (sf_items(cur, 0, &a, &na) != 0)
		return -1;
	if (sf_items(plan, 0, &b, &nb) != 0) {
		free(a);
		return -1;
	}
	struct span *list = calloc(na + nb + 1, sizeof *list);
	if (list) {
		for (size_t i = 0; i < na; i++)
			list[i] = a[i].val;
		for (size_t i = 0; i < nb; i++)
			list[na + i] = b[i].val;
		put_list(out, list, na + nb);
	}
	free(list);
	free(a);
	free(b);
	return list ? 0 : -1;
}

/* ---- runc's arguments ------------------------------------------------------------------------ */

/* The index of the flag `name` (n bytes) among the `count` names of `table`; -1 where none. */
static int flag_at(const char *name, size_t n, const char *const *table, int count)
{
	for (int x = 0; x < count; x++)
		if (strlen(table[x]) == n && memcmp(table[x], name, n) == 0)
			return x;
	return -1;
}

/* The n bytes at s on stdout, ended by a NUL byte: a field of a reading form's answer. */
static void field(const char *s, size_t n)
{
	fwrite(s, 1, n, stdout);
	putchar(0);
}

/* One flag in runc's arguments as read_runc() reads it. */
struct runc_flag {
	const char *token, *name, *value; /* name: the token without its dashes; value NULL: none */
	size_t namelen;
	int verb, after_id, attached; /* the verb's; after a container id; crun's -bDIR, -fFILE */
};

/* An invocation as read_runc() reads it; NULL where the arguments do not say. */
struct runc_call {
	const char *verb, *container, *bundle, *config, *log, *log_format, *no_value;
	int debug, before_verb, ids, dashdash, nflags; /* before_verb: words before a plain verb */
	struct runc_flag *flags;			/* nflags of them, in order */
};

static int is_flag_named(const struct runc_flag *f, const char *name)
{
	return strlen(name) == f->namelen && memcmp(name, f->name, f->namelen) == 0;
}

/* The flag `token`: its name without the leading dashes, and the value after '=' if any. */
static void flag_of(const char *token, struct runc_flag *f)
{
	f->token = token;
	f->name = token + strspn(token, "-");
	const char *eq = strchr(f->name, '=');
	f->namelen = eq ? (size_t)(eq - f->name) : strlen(f->name);
	f->value = eq ? eq + 1 : NULL;
}

/* runc's arguments (argv without argv[0]) read as runc (Go's flag and urfave/cli) reads them,
 * the one reading (gpuctk-runtime's Python asks for it: runc_args_served()): global flags up
 * to the verb (`--` ends them; the word after it is the verb), each in a value table
 * (gpuctk.hook.shim.runcargs) taking the next word where it has no `=VALUE`; then the verb's
 * flags and the container id (the first word that is not a flag; `--` ends them, the word
 * after it the id where none came before), crun's -bDIR and -fFILE too. `flags` has argc
 * entries. */
static void read_runc(int argc, char **argv, struct runc_call *c, struct runc_flag *flags)
{
	memset(c, 0, sizeof *c);
	c->flags = flags;
	int i = 0;
	while (i < argc) {
		const char *t = argv[i++];
		if (strcmp(t, "--") == 0) {
			c->dashdash = 1;
			if (i < argc)
				c->verb = argv[i++];
			break;
		}
		if (t[0] != '-' || strcmp(t, "-") == 0) {
			c->verb = t;
			c->before_verb = i - 1;
			break;
		}
		struct runc_flag *f = &flags[c->nflags++];
		memset(f, 0, sizeof *f);
		flag_of(t, f);
		if (!f->value && i < argc &&
		    flag_at(f->name, f->namelen, GPUCTK_GLOBAL_VALUE_FLAGS, GPUCTK_GLOBAL_VALUE_FLAGS_COUNT) >= 0)
			f->value = argv[i++];
		if (is_flag_named(f, GPUCTK_LOG_FLAG))
			c->log = f->value ? f->value : "";
		else if (is_flag_named(f, GPUCTK_LOG_FORMAT_FLAG))
			c->log_format = f->value && *f->value ? f->value : NULL;
		else if (is_flag_named(f, GPUCTK_DEBUG_FLAG))
			c->debug = !f->value || strcasecmp(f->value, "1") == 0 ||
				   strcasecmp(f->value, "t") == 0 || strcasecmp(f->value, "true") == 0;
	}
	while (c->verb && i < argc) {
		const char *t = argv[i++];
		if (strcmp(t, "--") == 0) {
			c->dashdash = 1;
			if (!(c->container && *c->container) && i < argc)
				c->container = argv[i];
			break;
		}
		if (t[0] != '-' || strcmp(t, "-") == 0) {
			if (!(c->container && *c->container))
				c->container = t;
			c->ids++;
			continue;
		}
		struct runc_flag *f = &flags[c->nflags++];
		memset(f, 0, sizeof *f);
		flag_of(t, f);
		f->verb = 1;
		f->after_id = c->ids > 0;
		int value_flag = flag_at(f->name, f->namelen, GPUCTK_ALL_VERB_VALUE_FLAGS,
					 GPUCTK_ALL_VERB_VALUE_FLAGS_COUNT) >= 0;
		if (!f->value && !value_flag && (t[1] == 'b' || t[1] == 'f') && t[2]) {
			f->name = t + 1, f->namelen = 1, f->value = t + 2, f->attached = 1;
			value_flag = 1;
		}
		if (!f->value && value_flag) {
			if (i >= argc) {
				c->no_value = t;
				break;
			}
			f->value = argv[i++];
		}
		if (f->value && (is_flag_named(f, GPUCTK_BUNDLE_FLAG) || is_flag_named(f, GPUCTK_BUNDLE_SHORT)))
			c->bundle = f->value;
		else if (f->value && flag_at(f->name, f->namelen, GPUCTK_CONFIG_FLAGS,
					     GPUCTK_CONFIG_FLAGS_COUNT) >= 0)
			c->config = f->value;
	}
}

/* The bundle of a create in runc's usual arguments (NULL: the current folder), its --log,
 * --log-format and id, from what read_runc() read of them (usual_create(): -1 for any other
 * shape; the Python shim serves every shape): the verb create after the global flags that
 * take a value and GPUCTK_GLOBAL_BOOL_FLAGS, then GPUCTK_VERB_VALUE_FLAGS and
 * GPUCTK_VERB_BOOL_FLAGS, each once, written -NAME or --NAME (a bool without =VALUE), and one
 * container id after them. */
struct call { const char *bundle, *log, *log_format, *id; };

_Static_assert(GPUCTK_GLOBAL_VALUE_FLAGS_COUNT <= 32 && GPUCTK_VERB_VALUE_FLAGS_COUNT <= 32,
	       "a flag's bit in `seen`");

/* Whether the flag `f` is one of the usual create's, given once (its bit in *seen). */
static int usual_flag(const struct runc_flag *f, unsigned long long *seen)
{
	const char *name = f->name;
	size_t n = f->namelen;
	if (!n || f->attached || f->after_id || name != f->token + (f->token[1] == '-' ? 2 : 1))
		return 0;
	if (f->verb && n == strlen(GPUCTK_BUNDLE_SHORT) && memcmp(name, GPUCTK_BUNDLE_SHORT, n) == 0)
		name = GPUCTK_BUNDLE_FLAG, n = strlen(GPUCTK_BUNDLE_FLAG); /* -b is --bundle */
	int k = f->verb ? flag_at(name, n, GPUCTK_VERB_VALUE_FLAGS, GPUCTK_VERB_VALUE_FLAGS_COUNT)
			: flag_at(name, n, GPUCTK_GLOBAL_VALUE_FLAGS, GPUCTK_GLOBAL_VALUE_FLAGS_COUNT);
	if (k >= 0) {
		unsigned long long bit = 1ULL << (k + (f->verb ? 32 : 0));
		int once = !(*seen & bit);
		*seen |= bit;
		return once && f->value;
	}
	return !f->value && (f->verb ? flag_at(name, n, GPUCTK_VERB_BOOL_FLAGS,
					       GPUCTK_VERB_BOOL_FLAGS_COUNT)
				     : flag_at(name, n, GPUCTK_GLOBAL_BOOL_FLAGS,
					       GPUCTK_GLOBAL_BOOL_FLAGS_COUNT)) >= 0;
}

static int usual_create(const struct runc_call *r, struct call *c)
{
	unsigned long long seen = 0;
	int ok = r->verb && strcmp(r->verb, GPUCTK_CREATE_VERB) == 0 && !r->dashdash &&
		 !r->no_value && r->ids == 1 && strcmp(r->container, "-") != 0;
	for (int k = 0; ok && k < r->nflags; k++)
		ok = usual_flag(&r->flags[k], &seen);
	*c = (struct call){ r->bundle, r->log, r->log_format, r->container };
	return ok ? 0 : -1;
}

/* The folder a bundle argument names: the current one where none or an empty one is given,
 * as runc and the Python shim read it. */
static const char *bundle_dir(const char *bundle)
{
	return bundle && *bundle ? bundle : ".";
}

/* gpuctk-runtime's form `runc-args ARG...`: runc's ARGs as read_runc() reads them, on stdout
 * ten fields each ended by a NUL byte (VERB, CONTAINER, BUNDLE, CONFIG, LOG, LOG_FORMAT, DEBUG
 * 1 or 0, NO_VALUE: the verb's value flag left without one, BEFORE_VERB: how many words came
 * before a plain verb, FLAGS: how many global flags follow), then the name of each global
 * flag, each ended by a NUL byte. Exit 0. It never hands over: gpuctk-runtime runs it. */
static int runc_args_served(int argc, char **argv)
{
	struct runc_flag *flags = calloc((size_t)argc, sizeof *flags);
	struct runc_call r;
	if (!flags) {
		fprintf(stderr, "gpuctk-cdi-hook: error: %s\n", strerror(errno));
		return 1;
	}
	read_runc(argc - 2, argv + 2, &r, flags);
	int globals = 0;
	while (globals < r.nflags && !flags[globals].verb)
		globals++;
	const char *text[] = { r.verb, r.container, r.bundle, r.config ? r.config : GPUCTK_CONFIG_NAME,
			       r.log, r.log_format ? r.log_format : GPUCTK_TEXT_FORMAT,
			       r.debug ? "1" : "0", r.no_value };
	for (size_t k = 0; k < sizeof text / sizeof *text; k++)
		field(text[k] ? text[k] : "", text[k] ? strlen(text[k]) : 0);
	printf("%d%c%d%c", r.before_verb, 0, globals, 0);
	for (int k = 0; k < globals; k++)
		field(flags[k].name, flags[k].namelen);
	free(flags);
	return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

/* ---- the log line ------------------------------------------------------------------------------ */

static int plan_string(struct member *plan, size_t n, const char *name, char *out, size_t size)
{
	struct member *f = sf_get(plan, n, name);
	return f ? sf_cstr(f->val, out, size) : -1;
}

/* The JSON integer v, a sign allowed, at most 24:59:59 in seconds either way (the most a
 * POSIX TZ offset can be): 0, else -1. */
static int sf_seconds(struct span v, long *out)
{
	const char *p = sf_start(v);
	int minus = p < v.end && *p == '-';
	unsigned long long x;
	if (sf_uint((struct span){ p + minus, v.end }, &x) != 0 || x > 89999)
		return -1;
	*out = minus ? -(long)x : (long)x;
	return 0;
}

/* The JSON string v, its escapes decoded, as a C string in out (size bytes): 0, else -1 (a
 * character above 127 or a NUL). */
static int sf_text(struct span v, char *out, size_t size)
{
	const char *s;
	char *buf;
	size_t n;
	int wide;
	if (sf_decoded(v, &s, &n, &wide, &buf) != 0)
		return -1;
	int ok = !wide && n < size;
	if (ok) {
		memcpy(out, s, n);
		out[n] = 0;
	}
	free(buf);
	return ok ? 0 : -1;
}

/* The shim's lines for this create (the plan's `lines`, gpuctk.log's shim_lines), their marks
 * still in them, and where they go: the engine's --log (unless that is stderr) its line for
 * the --log-format (else the "" one), opened for appending (created if missing); the config's
 * log-file its line, the file opened without a link followed and only as the file the plan
 * names (its chain holds). Python where that fails. */
struct lines {
	int engine, file;
	char etext[8192], ftext[8192];
	long offset; /* the zone the plan's time is written in: seconds east of UTC, its text */
	char zone[16];
};

/* The plan's lines' `zone` ([seconds east of UTC, its text], as gpuctk.log spells a zone)
 * into l: 0, else -1. */
static int read_zone(struct member *lines, size_t nl, struct lines *l)
{
	struct member *z = sf_get(lines, nl, "zone"), *pair;
	size_t k;
	if (!z || sf_items(z->val, 0, &pair, &k) != 0)
		return -1;
	int rc = k == 2 && sf_seconds(pair[0].val, &l->offset) == 0 &&
			 sf_cstr(pair[1].val, l->zone, sizeof l->zone) == 0 ? 0 : -1;
	free(pair);
	return rc;
}

/* The time now as the shim stamps its lines: gpuctk.log's STAMP_FORMAT in local time, then
 * the plan's zone, while the local offset is the zone's; -1 where it is not (the clocks changed
 * since the plan: Python writes the create's lines, and a plan in the new zone). */
static int stamp_now(const struct lines *l, char *out, size_t size)
{
	time_t now = time(NULL);
	struct tm t;
	if (!localtime_r(&now, &t) || t.tm_gmtoff != l->offset)
		return -1;
	size_t n = strftime(out, size, GPUCTK_STAMP_FORMAT, &t), zn = strlen(l->zone);
	if (n == 0 || n + zn >= size)
		return -1;
	memcpy(out + n, l->zone, zn + 1);
	return 0;
}

static int stderr_path(const char *log)
{
	if (!log || !*log)
		return 1;
	for (int i = 0; i < GPUCTK_STDERR_PATHS_COUNT; i++)
		if (strcmp(log, GPUCTK_STDERR_PATHS[i]) == 0)
			return 1;
	return 0;
}

static void log_lines(const struct call *c, struct member *plan, size_t n, struct lines *l)
{
	size_t nl, ne;
	struct member *lines = object_of(sf_get(plan, n, "lines"), "the front plan has no lines", &nl);
	struct member *engine = sf_get(lines, nl, "engine"), *file = sf_get(lines, nl, "file");
	l->engine = l->file = -1;
	if (!engine && !file)
		return;
	need(read_zone(lines, nl, l) == 0, "the front plan's lines have no usable zone");
	need(c->id && strspn(c->id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
				     "._:@+=-") == strlen(c->id) && strlen(c->id) < 256,
	     "a container id to quote");
	if (engine && !stderr_path(c->log)) {
		struct member *e = object_of(engine, "the front plan's lines are not plain", &ne);
		struct member *t = sf_get(e, ne, c->log_format ? c->log_format : "");
		t = t ? t : sf_get(e, ne, "");
		need(t && sf_text(t->val, l->etext, sizeof l->etext) == 0,
		     "the front plan's lines are not plain");
		l->engine = open(c->log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	}
	if (file) {
		char path[PATH_MAX];
		need(plan_string(plan, n, "log_file", path, sizeof path) == 0 && *path &&
			     sf_text(file->val, l->ftext, sizeof l->ftext) == 0,
		     "the front plan's lines are not plain");
		l->file = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
		struct member *id = sf_get(plan, n, "log_id"), *dev_ino;
		size_t k;
		unsigned long long dev, ino;
		struct stat st;
		need(l->file >= 0 && fstat(l->file, &st) == 0 && id &&
			     sf_items(id->val, 0, &dev_ino, &k) == 0,
		     "the log-file");
		int same = k == 2 && sf_uint(dev_ino[0].val, &dev) == 0 &&
			   sf_uint(dev_ino[1].val, &ino) == 0 && dev == (unsigned long long)st.st_dev &&
			   ino == (unsigned long long)st.st_ino;
		free(dev_ino);
		need(same, "the log-file is not the front plan's");
	}
}

/* `line` with each time mark the time and each id mark the id, appended to fd (then closed);
 * a log that cannot be written is left, as Python leaves it. */
static void write_line(int fd, const char *line, const char *stamp, const char *id)
{
	char out[sizeof ((struct lines *)0)->etext + 1024];
	size_t o = 0, ns = strlen(GPUCTK_STAMP_MARK), ni = strlen(GPUCTK_ID_MARK);
	if (fd < 0)
		return;
	for (const char *p = line; *p && o < sizeof out - 512;) {
		const char *with = strncmp(p, GPUCTK_STAMP_MARK, ns) == 0 ? stamp
				   : strncmp(p, GPUCTK_ID_MARK, ni) == 0    ? id
									    : NULL;
		if (with) {
			size_t wn = strlen(with);
			memcpy(out + o, with, wn); /* both under 256 bytes */
			o += wn;
			p += with == stamp ? ns : ni;
		} else {
			out[o++] = *p++;
		}
	}
	if (o && write(fd, out, o) < 0)
		o = 0;
	close(fd);
}

/* ---- create ------------------------------------------------------------------------------------- */

static int starts(struct span s, const char *prefix)
{
	size_t n = strlen(prefix);
	return (size_t)(s.end - s.p) >= n && memcmp(s.p, prefix, n) == 0;
}

static int is_null(struct span v) { return strncmp(sf_start(v), "null", 4) == 0; }

/* The fields CDI's apply refuses (a hook stage, linux.devices, linux.resources or its
 * devices that is not a list or object as the OCI spec has it) go to Python, which says so; process, process.env, linux, mounts and the lists edited are checked where read. */
static void shape(struct member *top, size_t ntop, struct member *proc, size_t nproc)
{
	size_t n;
	struct member *user = sf_get(proc, nproc, "user"), *f;
	if (user) {
		struct member *u = object_of(user, "process.user is not an object", &n);
		f = sf_get(u, n, "additionalGids");
		need(!f || is_null(f->val) || sf_kind(f->val) == '[', "a field apply refuses");
	}
	struct member *lin = sf_get(top, ntop, "linux");
	if (lin && sf_kind(lin->val) == '{') {
		struct member *l = object_of(lin, "no linux object", &n);
		f = sf_get(l, n, "netDevices");
		need(!f || is_null(f->val) || sf_kind(f->val) == '{', "a field apply refuses");
		f = sf_get(l, n, "devices");
		need(!f || is_null(f->val) || sf_kind(f->val) == '[', "a field apply refuses");
		f = sf_get(l, n, "resources");
		need(!f || is_null(f->val) || sf_kind(f->val) == '{', "a field apply refuses");
		if (f && sf_kind(f->val) == '{') {
			size_t nr;
			struct member *r = object_of(f, "a field apply refuses", &nr);
			f = sf_get(r, nr, "devices");
			need(!f || is_null(f->val) || sf_kind(f->val) == '[', "a field apply refuses");
		}
	}
	struct member *hooks = sf_get(top, ntop, "hooks");
	if (hooks) {
		struct member *h = object_of(hooks, "hooks is not an object", &n);
		for (int i = 0; i < GPUCTK_HOOK_STAGES_COUNT; i++) {
			f = sf_get(h, n, GPUCTK_HOOK_STAGES[i]);
			need(!f || is_null(f->val) || sf_kind(f->val) == '[', "a field apply refuses");
		}
	}
}

/* ---- the create, step by step: each need() that fails hands the create to Python ----------- */

/* config.json's text is UTF-8 (as Python's strict decoder reads it: Go's JSON writes a
 * character above 127 as it is) and strict JSON. Such a character is copied as it stands: the
 * key's strings and every key of an object this program reads are ASCII (sf_items, plain_text). */
static void plain_config(const char *doc, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		size_t u = (unsigned char)doc[i] < 0x80 ? 1 : utf8_len((const unsigned char *)doc + i, len - i);
		need(u > 0, "config.json is not UTF-8");
		i += u - 1;
	}
	struct json whole = { doc, doc + len, 0 };
	need(compound(&whole, NULL, NULL) >= 0 && whole.p == whole.end, "config.json is not plain JSON");
}

/* config.json, read through the bundle's descriptor `bfd`: UTF-8, strict JSON. */
static void read_config(int bfd, struct stat *cst, char **doc, size_t *len)
{
	int cfd = openat(bfd, GPUCTK_CONFIG_NAME, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	need(cfd >= 0 && fstat(cfd, cst) == 0 && S_ISREG(cst->st_mode) && cst->st_size <= GPUCTK_MAX_CONFIG &&
		     read_all(cfd, GPUCTK_MAX_CONFIG, doc, len) == 0,
	     "config.json is not a regular file that could be read");
	close(cfd);
	plain_config(*doc, *len);
}

/* Whether CAP_SYS_ADMIN is in the process's bounding set. */
static int privileged_of(struct member *proc, size_t nproc)
{
	int privileged = 0;
	struct member *caps = sf_get(proc, nproc, "capabilities");
	if (caps && sf_kind(caps->val) == '{') {
		size_t nc, nb;
		struct member *c = object_of(caps, "process.capabilities is not plain", &nc);
		struct member *bounding = sf_get(c, nc, "bounding");
		if (bounding && sf_kind(bounding->val) == '[') {
			struct member *b = array_of(bounding, "the bounding set is not plain", &nb);
			for (size_t i = 0; i < nb; i++) {
				const char *s;
				size_t sn;
				if (sf_kind(b[i].val) != '"')
					continue;
				need(sf_plain(b[i].val, &s, &sn) == 0, "an escaped capability");
				privileged |= sn == 13 && memcmp(s, "CAP_SYS_ADMIN", 13) == 0;
			}
		}
	}
	return privileged;
}

/* The CDI annotation prefixes Python keys requests on for the config file `conf`
 * (front/keyed-on: gpuctk.hook.shim.frontplan): n non-empty plain strings. */
static struct span *key_prefixes(const char *conf, size_t *n)
{
	size_t len, nd;
	char *text = read_front(GPUCTK_FRONT_PREFIXES, &len);
	need(text != NULL, "no front plan for this request (no front prefixes)");
	struct span ps = { text, text + len };
	struct member *doc;
	need(sf_kind(ps) == '{' && sf_items(ps, 1, &doc, &nd) == 0, "the front prefixes are not plain");
	need(field_is(doc, nd, "format", GPUCTK_PREFIXES_FORMAT),
	     "the front prefixes are of another format");
	need(field_is(doc, nd, GPUCTK_PLAN_CONFIG, conf), "the front prefixes are another config file's");
	struct member *list = array_of(sf_get(doc, nd, "prefixes"), "no front prefixes", n);
	struct span *pre = calloc(*n + 1, sizeof *pre);
	need(pre != NULL, "out of memory");
	for (size_t i = 0; i < *n; i++) {
		size_t sn;
		need(sf_plain(list[i].val, &pre[i].p, &sn) == 0 && sn > 0,
		     "the front prefixes are not plain");
		pre[i].end = pre[i].p + sn;
	}
	return pre;
}

/* Whether the annotation key `k` starts with one of the n prefixes. */
static int prefixed(struct span k, const struct span *pre, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		size_t sn = (size_t)(pre[i].end - pre[i].p);
		if ((size_t)(k.end - k.p) >= sn && memcmp(k.p, pre[i].p, sn) == 0)
			return 1;
	}
	return 0;
}

/* The items of linux.`name` (a list), none where linux or it is absent or null (`why` hands a
 * config over where it is something else). */
static struct member *linux_list(struct member *top, size_t ntop, const char *name,
				 const char *why, size_t *n)
{
	size_t nl;
	*n = 0;
	struct member *lin = sf_get(top, ntop, "linux");
	if (!lin || is_null(lin->val))
		return NULL;
	struct member *l = object_of(lin, "no linux object", &nl);
	struct member *list = sf_get(l, nl, name);
	return list && !is_null(list->val) ? array_of(list, why, n) : NULL;
}

/* The request's key: the env entries that start with one of GPUCTK_KEY_PREFIXES, in order, then
 * privileged=, uid= and gid= (in `w`, their text too); then the names the edits' places are
 * known by: env=N and each env entry's name (up to its `=`), mounts=N and each mount's
 * destination, then key_sources' (a device-list request's other half), devices=N and each
 * linux.devices path (where each list starts: w->at); then key_markers'; then the key and
 * value of each annotation whose key starts with one of the n `pre`fixes, in the document's
 * order. `w` also
 * holds the config's mounts, each a plain destination, and its linux.devices, each with a
 * plain path. */
struct who {
	int privileged;
	unsigned long long uid, gid;
	char text[8][32]; /* privileged=, uid=, gid=, env=, mounts=, devices=, device-list=, markers= */
	size_t at[3], count[3]; /* the names of env, mounts, devices in the key */
	struct member *mounts, *devs;
	struct span *env; /* each env entry's text, its escapes decoded */
};

/* `text` as keys[*at], *at moved past it. */
static void key_text(struct span *keys, size_t *at, char *text)
{
	keys[*at].p = text;
	keys[(*at)++].end = text + strlen(text);
}

/* Whether the plain mount destination s is one a device-list request may be read from. */
static int device_list(struct span s)
{
	size_t n = strlen(GPUCTK_DEVICE_LIST_MOUNTS);
	return memmem(s.p, (size_t)(s.end - s.p), GPUCTK_DEVICE_LIST_MOUNTS, n) != NULL;
}

/* device-list=K, then the source of each of the K mounts whose destination device_list()
 * names, in order (the volume-mounts request is read from a mount's source and destination
 * alike): appended to `keys`, each source a plain string. */
static void key_sources(struct span *keys, size_t *nkeys, struct who *w)
{
	size_t at = (*nkeys)++, k = 0; /* the count's place, written last */
	for (size_t i = 0; i < w->count[1]; i++) {
		struct span s;
		size_t sn;
		if (!device_list(keys[w->at[1] + i]))
			continue;
		need(member_string(w->mounts[i].val, "source", &s.p, &sn) == 0,
		     "a device-list mount whose source is not a plain string");
		s.end = s.p + sn;
		keys[(*nkeys)++] = s;
		k++;
	}
	snprintf(w->text[6], 32, "device-list=%zu", k);
	key_text(keys, &at, w->text[6]);
}

/* The names of the config's lists (as request_key says) appended to `keys`, each checked; after
 * the mounts' destinations, key_sources'. */
static void key_names(struct span *keys, size_t *nkeys, struct who *w)
{
	static const char *const what[3] = { "env", "mounts", "devices" };
	struct member *list[3] = { NULL, w->mounts, w->devs };
	for (int l = 0; l < 3; l++) {
		snprintf(w->text[3 + l], 32, "%s=%zu", what[l], w->count[l]);
		key_text(keys, nkeys, w->text[3 + l]);
		w->at[l] = *nkeys;
		for (size_t i = 0; i < w->count[l]; i++) {
			struct span s;
			size_t sn;
			if (l == 0) {
				s = w->env[i]; /* decoded and checked by request_key */
				s.end = s.p + env_key(s);
			} else if (l == 1) {
				need(member_string(list[l][i].val, "destination", &s.p, &sn) == 0,
				     "a mount that is not plain");
				s.end = s.p + sn;
			} else {
				need(member_string(list[l][i].val, "path", &s.p, &sn) == 0,
				     "a device that is not plain");
				s.end = s.p + sn;
			}
			keys[(*nkeys)++] = s;
		}
		if (l == 1)
			key_sources(keys, nkeys, w);
	}
}

/* markers=K, then each of the K annotations whose key is one of GPUCTK_KUBE_MARKERS or
 * GPUCTK_MANAGER, in the document's order: its key, and the manager's value (what Python reads
 * to tell a Kubernetes container, where an unprivileged env request is no grant). */
static void key_markers(struct member *a, size_t nann, struct span *keys, size_t *nkeys,
			struct who *w)
{
	size_t at = (*nkeys)++, k = 0; /* the count's place, written last */
	for (size_t i = 0; i < nann; i++) {
		int manager = sf_is(a[i].key, GPUCTK_MANAGER), marker = manager;
		for (int m = 0; m < GPUCTK_KUBE_MARKERS_COUNT && !marker; m++)
			marker = sf_is(a[i].key, GPUCTK_KUBE_MARKERS[m]);
		if (!marker)
			continue;
		k++;
		keys[(*nkeys)++] = a[i].key;
		if (manager) {
			struct span v;
			size_t vn;
			need(sf_plain(a[i].val, &v.p, &vn) == 0, "a marker annotation that is not a plain string");
			v.end = v.p + vn;
			keys[(*nkeys)++] = v;
		}
	}
	snprintf(w->text[7], 32, "markers=%zu", k);
	key_text(keys, &at, w->text[7]);
}

static struct span *request_key(struct member *top, size_t ntop, struct member *proc, size_t nproc,
				struct member *env, size_t nenv, const struct span *pre, size_t npre,
				struct who *w, size_t *nkeys)
{
	size_t nann = 0;
	w->count[0] = nenv;
	w->mounts = array_of(sf_get(top, ntop, "mounts"), "no mounts list", &w->count[1]);
	w->devs = linux_list(top, ntop, "devices", "a field apply refuses", &w->count[2]);
	struct member *ann = sf_get(top, ntop, "annotations"), *a = NULL;
	if (ann)
		a = object_of(ann, "annotations that are not plain", &nann);
	struct span *keys = calloc(2 * nenv + 9 + 2 * w->count[1] + w->count[2] + 4 * nann, sizeof *keys);
	w->env = calloc(nenv + 1, sizeof *w->env);
	need(keys != NULL && w->env != NULL, "out of memory");
	*nkeys = 0;
	for (size_t i = 0; i < nenv; i++) { /* Go's JSON writes <, > and & as escapes */
		struct span s;
		size_t sn;
		char *buf; /* kept: the key's spans are in it */
		int wide;
		need(sf_decoded(env[i].val, &s.p, &sn, &wide, &buf) == 0, "an env entry that is not a string");
		s.end = s.p + sn;
		w->env[i] = s;
		int keyed = 0;
		for (int p = 0; p < GPUCTK_KEY_PREFIXES_COUNT; p++)
			keyed = keyed || starts(s, GPUCTK_KEY_PREFIXES[p]);
		/* what the key holds of it, a keyed entry whole, another its name, as it is */
		need(plain_text(keyed ? s : (struct span){ s.p, s.p + env_key(s) }),
		     "an env entry that is not a plain string");
		if (keyed)
			keys[(*nkeys)++] = s;
	}
	w->privileged = privileged_of(proc, nproc);
	w->uid = w->gid = 0;
	struct member *user = sf_get(proc, nproc, "user");
	if (user) {
		size_t nu;
		struct member *u = object_of(user, "process.user is not an object", &nu);
		struct member *f = sf_get(u, nu, "uid");
		need(!f || sf_uint(f->val, &w->uid) == 0, "process.user.uid is not a plain number");
		f = sf_get(u, nu, "gid");
		need(!f || sf_uint(f->val, &w->gid) == 0, "process.user.gid is not a plain number");
	}
	snprintf(w->text[0], 32, "privileged=%d", w->privileged);
	snprintf(w->text[1], 32, "uid=%llu", w->uid);
	snprintf(w->text[2], 32, "gid=%llu", w->gid);
	for (int i = 0; i < 3; i++)
		key_text(keys, nkeys, w->text[i]);
	key_names(keys, nkeys, w);
	key_markers(a, nann, keys, nkeys, w);
	for (size_t i = 0; i < nann; i++) {
		if (!prefixed(a[i].key, pre, npre))
			continue;
		struct span v;
		size_t vn;
		need(sf_plain(a[i].val, &v.p, &vn) == 0, "a CDI annotation that is not a plain string");
		v.end = v.p + vn;
		keys[(*nkeys)++] = a[i].key;
		keys[(*nkeys)++] = v;
	}
	return keys;
}

/* The front plan for `keys`, written for the config file `conf`, whose world still holds. */
static struct member *front_plan(const struct span *keys, size_t nkeys, const char *conf,
				 const struct span *pre, size_t npre, size_t *nplan)
{
	size_t plen;
	char *text = read_plan(keys, nkeys, &plen);
	need(text != NULL, "no front plan for this request");
	struct span ps = { text, text + plen };
	struct member *plan;
	need(sf_kind(ps) == '{' && sf_items(ps, 1, &plan, nplan) == 0, "the front plan is not plain");
	need(field_is(plan, *nplan, "format", GPUCTK_PLAN_FORMAT), "the front plan is of another format");
	struct member *f = sf_get(plan, *nplan, "key");
	need(f && same_strings(f->val, keys, nkeys), "the front plan is another request's");
	need(field_is(plan, *nplan, GPUCTK_PLAN_CONFIG, conf), "the front plan is another config file's");
	f = sf_get(plan, *nplan, "cdi_prefixes");
	need(f && same_strings(f->val, pre, npre), "the front plan is keyed on other prefixes");
	f = sf_get(plan, *nplan, "world");
	need(f && entries_hold(f->val, 0), "the config, the specs or gpuctk changed since the front plan");
	return plan;
}

/* What only the Python shim reads: a field apply refuses, a file or runtime other than the plan
 * names. */
static void python_only(struct member *top, size_t ntop, struct member *proc, size_t nproc,
			struct member *plan, size_t nplan, const char *runtime)
{
	shape(top, ntop, proc, nproc);
	char planned[PATH_MAX];
	need(plan_string(plan, nplan, GPUCTK_PLAN_RUNTIME, planned, sizeof planned) == 0 &&
		     strcmp(planned, runtime) == 0,
	     "the runtime is not the front plan's");
	struct member *chain = sf_get(plan, nplan, "chain");
	need(chain && entries_hold(chain->val, 1),
	     "a file the front plan names changed since (a hook, a mount source, a device node, "
	     "the runtime, the log-file, or a folder on the way)");
}

/* The edits, as patches of config.json's text (a recipe the plan leaves null, or a list of
 * rules or hooks it leaves empty: untouched, as apply). */
struct edits {
	struct span all; /* the whole document */
	struct member *top, *env, *envm, *mounts;
	size_t ntop, nenv, nm;
	struct member *penv, *pmounts, *devs, *rules, *phooks; /* the plan's */
	struct patch patches[16];
	size_t np;
};

/* A recipe (a list: env, mounts) applied to the config's list `m` (n items), in place. */
static void edit_list(struct edits *e, struct member *m, struct member *cur, size_t n,
		      struct span recipe, const char *what)
{
	e->patches[e->np].at = m->val.p;
	e->patches[e->np].end = m->val.end;
	need(assemble(cur, n, recipe, &e->patches[e->np++].text) == 0, what);
}

static void edit_env_and_mounts(struct edits *e)
{
	if (!is_null(e->penv->val))
		edit_list(e, e->envm, e->env, e->nenv, e->penv->val, "the env edit");
	if (!is_null(e->pmounts->val))
		edit_list(e, sf_get(e->top, e->ntop, "mounts"), e->mounts, e->nm, e->pmounts->val,
			  "the mounts edit");
}

/* The rules appended to linux.resources.devices, made where missing (into `into_linux` where
 * linux.resources is). */
static void edit_rules(struct edits *e, struct member *linux_, size_t nl, struct buf *into_linux)
{
	size_t nr;
	struct member *res = sf_get(linux_, nl, "resources");
	if (list_len(e->rules->val) > 0 && res) {
		struct member *r = object_of(res, "linux.resources is not an object", &nr);
		struct member *rd = sf_get(r, nr, "devices");
		if (rd) {
			need(sf_kind(rd->val) == '[', "linux.resources.devices is not a list");
			e->patches[e->np].at = rd->val.p;
			e->patches[e->np].end = rd->val.end;
			need(edit_append(rd->val, e->rules->val, &e->patches[e->np++].text) == 0,
			     "the rules");
		} else {
			struct buf m = { 0 };
			puts_(&m, "\"devices\":");
			put_span(&m, e->rules->val);
			need(!m.bad, "out of memory");
			insert_members(&e->patches[e->np++], res->val, &m);
		}
	} else if (list_len(e->rules->val) > 0) {
		if (into_linux->n)
			puts_(into_linux, ",");
		puts_(into_linux, "\"resources\":{\"devices\":");
		put_span(into_linux, e->rules->val);
		puts_(into_linux, "}");
	}
}

static void edit_linux(struct edits *e)
{
	size_t nl;
	struct member *lin = sf_get(e->top, e->ntop, "linux");
	struct member *linux_ = object_of(lin, "no linux object", &nl);
	struct buf into_linux = { 0 };
	struct member *ld = sf_get(linux_, nl, "devices");
	if (!is_null(e->devs->val) && ld) {
		size_t nd;
		struct member *d = array_of(ld, "linux.devices is not a list", &nd);
		edit_list(e, ld, d, nd, e->devs->val, "the device edit");
	} else if (!is_null(e->devs->val)) {
		puts_(&into_linux, "\"devices\":");
		need(assemble(NULL, 0, e->devs->val, &into_linux) == 0, "the device edit");
	}
	edit_rules(e, linux_, nl, &into_linux);
	if (into_linux.n) {
		need(!into_linux.bad, "out of memory");
		insert_members(&e->patches[e->np++], lin->val, &into_linux);
	}
}

static void edit_hooks(struct edits *e)
{
	size_t nh, nstage;
	struct member *stages = object_of(e->phooks, "the front plan is not plain", &nstage);
	need(nstage <= 8, "the front plan is not plain");
	struct member *hooks = sf_get(e->top, e->ntop, "hooks");
	if (nstage > 0 && !hooks) {
		struct buf m = { 0 };
		puts_(&m, "\"hooks\":");
		put_span(&m, e->phooks->val);
		need(!m.bad, "out of memory");
		insert_members(&e->patches[e->np++], e->all, &m);
		return;
	}
	if (nstage == 0)
		return;
	struct member *h = object_of(hooks, "hooks is not an object", &nh);
	struct buf m = { 0 };
	for (size_t i = 0; i < nstage; i++) {
		char stage[32];
		size_t sl = (size_t)(stages[i].key.end - stages[i].key.p);
		need(sl < sizeof stage, "the front plan is not plain");
		memcpy(stage, stages[i].key.p, sl);
		stage[sl] = 0;
		struct member *have = sf_get(h, nh, stage); /* another case: Python */
		if (have) {
			need(sf_kind(have->val) == '[', "a hook stage is not a list");
			e->patches[e->np].at = have->val.p;
			e->patches[e->np].end = have->val.end;
			need(edit_append(have->val, stages[i].val, &e->patches[e->np++].text) == 0,
			     "the hooks");
			continue;
		}
		if (m.n)
			puts_(&m, ",");
		puts_(&m, "\"");
		put(&m, stages[i].key.p, (size_t)(stages[i].key.end - stages[i].key.p));
		puts_(&m, "\":");
		put_span(&m, stages[i].val);
	}
	if (m.n) {
		need(!m.bad, "out of memory");
		insert_members(&e->patches[e->np++], hooks->val, &m);
	}
}

/* The new config.json: the document with every patch applied, in the order of the text. */
static struct buf edited(struct edits *e, struct member *plan, size_t nplan)
{
	e->penv = sf_get(plan, nplan, "env");
	e->pmounts = sf_get(plan, nplan, "mounts");
	e->devs = sf_get(plan, nplan, "devices");
	e->rules = sf_get(plan, nplan, "rules");
	e->phooks = sf_get(plan, nplan, "hooks");
	need(e->penv && e->pmounts && e->devs && e->rules && e->phooks &&
		     list_len(e->rules->val) >= 0,
	     "the front plan is not plain");
	edit_env_and_mounts(e);
	edit_linux(e);
	edit_hooks(e);
	for (size_t i = 0; i < e->np; i++)
		need(!e->patches[i].text.bad, "out of memory");
	qsort(e->patches, e->np, sizeof *e->patches, by_at);
	struct buf out = { 0 };
	const char *at = e->all.p;
	for (size_t i = 0; i < e->np; i++) {
		need(e->patches[i].at >= at, "overlapping edits");
		put(&out, at, (size_t)(e->patches[i].at - at));
		put(&out, e->patches[i].text.p, e->patches[i].text.n);
		at = e->patches[i].end; /* an insertion's end is its start */
	}
	put(&out, at, (size_t)(e->all.end - at));
	need(!out.bad, "out of memory");
	return out;
}

/* config.json replaced: a new file in the bundle's folder, its mode and owner, renamed over. */
static void write_config(int bfd, const struct stat *cst, const struct buf *out)
{
	char tmp[64];
	snprintf(tmp, sizeof tmp, ".config.json.gpuctk-front-%ld", (long)getpid());
	int fd = openat(bfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	need(fd >= 0, "config.json could not be written");
	int ok = (cst->st_uid == geteuid() && cst->st_gid == getegid()) ||
		 fchown(fd, cst->st_uid == geteuid() ? (uid_t)-1 : cst->st_uid,
			cst->st_gid == getegid() ? (gid_t)-1 : cst->st_gid) == 0;
	ok = ok && fchmod(fd, cst->st_mode & 07777) == 0;
	for (size_t o = 0; ok && o < out->n;) {
		ssize_t w = write(fd, out->p + o, out->n - o);
		if (w < 0 && errno == EINTR)
			continue;
		ok = w > 0;
		o += ok ? (size_t)w : 0;
	}
	ok = close(fd) == 0 && ok;
	ok = ok && renameat(bfd, tmp, bfd, GPUCTK_CONFIG_NAME) == 0;
	if (!ok) {
		unlinkat(bfd, tmp, 0);
		shim_python("config.json could not be written");
	}
}

/* ---- gpuctk-runtime's front: the memo and the request markers ---------------------------- */

/* Exec `runtime` with the runtime's arguments (argv from 5 on: see runtime_front()), into
 * `rargv` (argc entries; NULL: allocated here), GPUCTK_FRONT_RUNTIME removed; `why` traced. */
__attribute__((noreturn)) static void run_runtime(const char *runtime, int argc, char **argv,
						  char **rargv, const char *why)
{
	if (why && getenv(GPUCTK_SHIM_FRONT_TRACE_ENV))
		fprintf(stderr, "gpuctk-runtime: front: runtime: %s\n", why);
	if (!rargv)
		rargv = calloc((size_t)argc, sizeof *rargv);
	need(rargv != NULL, "out of memory");
	unsetenv(GPUCTK_FRONT_RUNTIME_ENV);
	rargv[0] = (char *)runtime;
	for (int i = 5; i < argc; i++)
		rargv[i - 4] = argv[i];
	rargv[argc - 4] = NULL;
	execv(runtime, rargv);
	fprintf(stderr, "gpuctk-runtime: error: cannot run %s: %s\n", runtime, strerror(errno));
	exit(1);
}

/* The runtime memo gpuctk.hook.shim.memo writes, as read by memo_holds(). */
struct memo {
	char *text;
	const char *runtime;
	char *create; /* the request line, markers tab-separated */
};

/* Whether the file `f` changed after the memo `m` was written: its ctime (which nobody can set:
 * a write, chmod, chown, rename or utime sets it to now) past the memo's mtime. */
static int changed_after(const struct stat *f, const struct stat *m)
{
	return f->st_ctim.tv_sec != m->st_mtim.tv_sec ? f->st_ctim.tv_sec > m->st_mtim.tv_sec :
							  f->st_ctim.tv_nsec > m->st_mtim.tv_nsec;
}

/* Whether the memo ($GPUCTK_STATE_DIR/runtime) may be used, and then its runtime and request
 * line: a regular file of this euid's in a folder only it can write (private_folder(), the
 * rule Python wrote it under), five lines: MEMO_TAG, the config file in force
 * ($GPUCTK_CONFIG or the default), whether it is present or absent now, the runtime, the
 * request line; the config not changed after the memo (changed_after(): a config copied in
 * with its old mtime kept counts too, and a link to it switched to another file); the
 * runtime an absolute path to a regular file (not a link) of this euid's that it may execute,
 * not changed after the memo, in a folder of its that nobody else may write (or sticky:
 * nobody else may replace the file). Python checked
 * that file and each folder above it by gpuctk's trusted-path rules when it wrote the memo;
 * a runtime it later refuses, it forgets. */
static int memo_holds(struct memo *m)
{
	const char *conf = config_file();
	int dir = private_folder(state_dir());
	int fd = dir < 0 ? -1 :
			   openat(dir, GPUCTK_MEMO_NAME,
				  O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (dir >= 0)
		close(dir);
	struct stat mst, st;
	size_t len;
	int ok = fd >= 0 && fstat(fd, &mst) == 0 && S_ISREG(mst.st_mode) &&
		 mst.st_uid == geteuid() && read_all(fd, GPUCTK_MAX_MEMO, &m->text, &len) == 0;
	if (fd >= 0)
		close(fd);
	if (!ok)
		return 0;
	char *line[5], *p = m->text;
	ok = memchr(p, 0, len) == NULL && len > 0 && p[len - 1] == '\n';
	for (int k = 0; ok && k < 5; k++) {
		char *nl = memchr(p, '\n', (size_t)(m->text + len - p));
		ok = nl != NULL && (k < 4 || nl == m->text + len - 1);
		if (ok) {
			line[k] = p;
			*nl = 0;
			p = nl + 1;
		}
	}
	struct stat lst; /* a link's own: one switched to another, older file is a change */
	int present = ok ? stat(conf, &st) == 0 : 0;
	ok = ok && strcmp(line[0], GPUCTK_MEMO_TAG) == 0 && strcmp(line[1], conf) == 0 &&
	     strcmp(line[2], present ? GPUCTK_MEMO_PRESENT : GPUCTK_MEMO_ABSENT) == 0 &&
	     !(present && (changed_after(&st, &mst) ||
			   (lstat(conf, &lst) == 0 && changed_after(&lst, &mst))));
	m->runtime = ok ? line[3] : NULL;
	m->create = ok ? line[4] : NULL;
	ok = ok && m->runtime[0] == '/' && lstat(m->runtime, &st) == 0 && S_ISREG(st.st_mode) &&
	     st.st_uid == geteuid() && !changed_after(&st, &mst) &&
	     faccessat(AT_FDCWD, m->runtime, X_OK, AT_EACCESS) == 0;
	if (ok) {
		char folder[PATH_MAX];
		const char *slash = strrchr(m->runtime, '/');
		ok = snprintf(folder, sizeof folder, "%.*s/.", (int)(slash - m->runtime), m->runtime) <
			     (int)sizeof folder &&
		     stat(folder, &st) == 0 && st.st_uid == geteuid() &&
		     (!(st.st_mode & 022) || (st.st_mode & S_ISVTX));
	}
	return ok;
}

/* Whether the `\u` escape before `p` (`end` the text's) is one but Go's JSON's of <, > and &
 * (\u003c, \u003e, \u0026: encoding/json, every engine's, writes a CUDA image's
 * NVIDIA_REQUIRE_CUDA and a shell command's && so): its hex digits differ from all three
 * before the text or the line ends. */
static int other_escape(const char *p, const char *end)
{
	static const char *const go[] = { "003c", "003e", "0026" };
	for (size_t i = 0; i < 4; i++) {
		if (p + i >= end || p[i] == '\n')
			return 0;
		int some = 0;
		for (size_t g = 0; g < 3; g++)
			some |= memcmp(go[g], p, i + 1) == 0;
		if (!some)
			return 1;
	}
	return 0;
}

/* Whether BUNDLE/config.json (`bundle` NULL or empty: the current folder's, as runc and the
 * Python shim read it) cannot be asking for a GPU: a regular file, not a link, holding none
 * of the memo's request `markers` (what a request must name under the config in force, as
 * gpuctk.hook.shim.memo writes them, tab-separated; none: it may be), no `\/` escape and no
 * `\u` escape but Go's (other_escape()): no marker holds a character JSON or Go's JSON writes
 * as an escape. Matched as bytes, wherever they stand. */
static int no_request(const char *bundle, char *markers)
{
	char path[PATH_MAX];
	if (!*markers || snprintf(path, sizeof path, "%s/" GPUCTK_CONFIG_NAME, bundle_dir(bundle)) >=
				 (int)sizeof path)
		return 0;
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	struct stat st;
	char *doc;
	size_t len;
	int ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
		 read_all(fd, GPUCTK_MAX_CONFIG, &doc, &len) == 0;
	if (fd >= 0)
		close(fd);
	if (!ok)
		return 0;
	const char *end = doc + len;
	for (char *save = NULL, *mk = strtok_r(markers, "\t", &save); ok && mk;
	     mk = strtok_r(NULL, "\t", &save))
		ok = memmem(doc, len, mk, strlen(mk)) == NULL;
	for (const char *p = doc; ok && (p = memchr(p, '\\', (size_t)(end - p))) != NULL; p++)
		ok = !(p + 1 < end && (p[1] == '/' || (p[1] == 'u' && other_escape(p + 2, end))));
	free(doc);
	return ok;
}

/* The create runtime_front() hands over once the memo holds: `runtime` the memo's, `r` its
 * reading of runc's arguments. */
static int shim_create(int argc, char **argv, const char *runtime, const struct runc_call *r)
{
	const char *off = getenv(GPUCTK_SHIM_FRONT_ENV);
	need(!off || strcmp(off, GPUCTK_FRONT_OFF) != 0, GPUCTK_SHIM_FRONT_ENV "=" GPUCTK_FRONT_OFF);
	const char *cache = getenv(GPUCTK_SPEC_CACHE_ENV);
	need(!cache || strcmp(cache, GPUCTK_SPEC_CACHE_OFF) != 0,
	     GPUCTK_SPEC_CACHE_ENV "=" GPUCTK_SPEC_CACHE_OFF);
	struct call call;
	need(usual_create(r, &call) == 0, "arguments only the shim reads");
	const char *conf = config_file();

	int bfd = open(bundle_dir(call.bundle), O_PATH | O_DIRECTORY | O_CLOEXEC);
	need(bfd >= 0, "the bundle could not be opened");
	struct stat cst;
	char *doc;
	size_t len, nproc, nplan, nkeys;
	read_config(bfd, &cst, &doc, &len);
	static struct edits e; /* zero */
	e.all = (struct span){ doc, doc + len };
	need(sf_kind(e.all) == '{' && sf_items(e.all, 1, &e.top, &e.ntop) == 0,
	     "config.json is not plain JSON");
	struct member *proc = object_of(sf_get(e.top, e.ntop, "process"), "no process object", &nproc);
	e.envm = sf_get(proc, nproc, "env");
	e.env = array_of(e.envm, "no process.env list", &e.nenv);
	struct who who;
	size_t npre;
	struct span *pre = key_prefixes(conf, &npre);
	struct span *keys = request_key(e.top, e.ntop, proc, nproc, e.env, e.nenv, pre, npre, &who,
					&nkeys);
	struct member *plan = front_plan(keys, nkeys, conf, pre, npre, &nplan);
	python_only(e.top, e.ntop, proc, nproc, plan, nplan, runtime);
	e.mounts = who.mounts;
	e.nm = who.count[1];
	struct buf out = edited(&e, plan, nplan);

	char **rargv = calloc((size_t)argc, sizeof *rargv); /* before the write: after it, no Python */
	need(rargv != NULL, "out of memory");
	/* the log lines Python would write: opened now, written once config.json is */
	static struct lines lines;
	log_lines(&call, plan, nplan, &lines);
	char stamp[64] = "";
	if (lines.engine >= 0 || lines.file >= 0) /* the time zone's file read only for a line */
		need(stamp_now(&lines, stamp, sizeof stamp) == 0, "the local time's offset changed");
	write_config(bfd, &cst, &out);
	write_line(lines.engine, lines.etext, stamp, call.id);
	write_line(lines.file, lines.ftext, stamp, call.id);
	if (getenv(GPUCTK_SHIM_FRONT_TRACE_ENV))
		fprintf(stderr, "gpuctk-runtime: front: plan %016llx\n", fnv(keys, nkeys));
	run_runtime(runtime, argc, argv, rargv, NULL);
}

/* gpuctk-runtime's every call: `gpuctk-cdi-hook runtime-front PYTHON PYCODE SHIM ARGS...`, as
 * its sh front runs it (gpuctk.install.launchers). runc's ARGS are read here alone
 * (read_runc()); then:
 *
 *   - a verb but create and run, the memo holding (memo_holds()): the memo's runtime, at once;
 *   - a create or run the memo holds for, whose config.json cannot be asking for a GPU
 *     (no_request(): the bundle as runc reads --bundle/-b, neither crun's --config/-f nor an
 *     attached -bDIR, no flag left without its value): the memo's runtime, at once;
 *   - a create the memo holds for otherwise: the compiled create (shim_create()), the memo's
 *     runtime its runtime;
 *   - anything else (no verb, no memo, a run that may ask for a GPU): the shim itself,
 *     `PYTHON -IS -c PYCODE SHIM ARGS...`; where the memo holds, GPUCTK_FRONT_RUNTIME names
 *     its runtime, so that Python neither resolves it again nor rewrites the memo. Only this
 *     program sets that variable: it removes it first. */
static int runtime_front(int argc, char **argv)
{
	sf_argc = argc;
	sf_argv = argv;
	if (argc < 5) {
		fprintf(stderr, "usage: gpuctk-cdi-hook " GPUCTK_RUNTIME_FRONT " PYTHON PYCODE SHIM ARGS...\n"
				"(run by gpuctk-runtime's front: see gpuctk.install.launchers)\n");
		exit(2);
	}
	unsetenv(GPUCTK_FRONT_RUNTIME_ENV);
	struct runc_flag *flags = calloc((size_t)argc, sizeof *flags);
	struct runc_call r;
	need(flags != NULL, "out of memory");
	read_runc(argc - 5, argv + 5, &r, flags);
	need(r.verb && *r.verb, "no verb");
	static struct memo m;
	int inject = flag_at(r.verb, strlen(r.verb), GPUCTK_INJECT_VERBS, GPUCTK_INJECT_VERBS_COUNT) >= 0;
	need(memo_holds(&m), "no memo that holds");
	if (!inject)
		run_runtime(m.runtime, argc, argv, NULL, "not a create");
	int plain = !r.config && !r.no_value;
	for (int k = 0; plain && k < r.nflags; k++)
		plain = !flags[k].attached;
	size_t n = strlen(GPUCTK_MEMO_SEARCH);
	if (plain && strncmp(m.create, GPUCTK_MEMO_SEARCH, n) == 0 && m.create[n] == '\t' &&
	    no_request(r.bundle, m.create + n + 1))
		run_runtime(m.runtime, argc, argv, NULL, "no request marker");
	need(setenv(GPUCTK_FRONT_RUNTIME_ENV, m.runtime, 1) == 0, "out of memory");
	need(strcmp(r.verb, GPUCTK_CREATE_VERB) == 0, "a run");
	return shim_create(argc, argv, m.runtime, &r);
}

/* ---- the key, for Python ------------------------------------------------------------------------ */

/* The n strings as a JSON list (each plain: the compiled create took no other). */
static void print_strings(const struct span *s, size_t n)
{
	printf("[");
	for (size_t i = 0; i < n; i++)
		printf("%s\"%.*s\"", i ? "," : "", (int)(s[i].end - s[i].p), s[i].p);
	printf("]");
}

/* gpuctk-cdi-hook front-key [PREFIX...] < config.json: the key shim_create() looks a plan up by,
 * for the config's text on stdin and the CDI annotation prefixes front/keyed-on would name, as
 * {"file": NAME, "key": [...], "env": [...], "mounts": [...], "devices": [...], "privileged": 0|1,
 * "uid": N, "gid": N, "folder": 0|1} (env, mounts, devices: the names of the config's lists the
 * key holds, for the plan's recipes; folder: whether $GPUCTK_STATE_DIR/front is a folder this
 * program reads plans from, the one home of that rule); exit 1 with why where
 * shim_create() would take no plan. The Python shim writes its plans under it
 * (gpuctk.hook.shim.frontplan): the key has this one home. */
static int front_key(int argc, char **argv)
{
	sf_keying = 1;
	size_t npre = (size_t)(argc - 2), len, ntop, nproc, nenv, nkeys;
	struct span *pre = calloc(npre + 1, sizeof *pre);
	need(pre != NULL, "out of memory");
	for (size_t i = 0; i < npre; i++) {
		pre[i] = (struct span){ argv[i + 2], argv[i + 2] + strlen(argv[i + 2]) };
		need(pre[i].p < pre[i].end && plain_text(pre[i]), "a prefix that is not plain");
	}
	char *doc;
	need(read_all(0, GPUCTK_MAX_CONFIG, &doc, &len) == 0, "config.json could not be read");
	plain_config(doc, len);
	struct member *top;
	need(sf_kind((struct span){ doc, doc + len }) == '{' &&
		     sf_items((struct span){ doc, doc + len }, 1, &top, &ntop) == 0,
	     "config.json is not plain JSON");
	struct member *proc = object_of(sf_get(top, ntop, "process"), "no process object", &nproc);
	struct member *env = array_of(sf_get(proc, nproc, "env"), "no process.env list", &nenv);
	struct who w;
	struct span *keys = request_key(top, ntop, proc, nproc, env, nenv, pre, npre, &w, &nkeys);
	char name[32];
	plan_name(keys, nkeys, name);
	printf("{\"file\":\"%s\",\"key\":", name);
	print_strings(keys, nkeys);
	static const char *const lists[3] = { "env", "mounts", "devices" };
	for (int l = 0; l < 3; l++) {
		printf(",\"%s\":", lists[l]);
		print_strings(keys + w.at[l], w.count[l]);
	}
	int folder = front_folder();
	if (folder >= 0)
		close(folder);
	printf(",\"privileged\":%d,\"uid\":%llu,\"gid\":%llu,\"folder\":%d}\n", w.privileged,
	       w.uid, w.gid, folder >= 0);
	_exit(fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1); /* the kernel frees the rest */
}
