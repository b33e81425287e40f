/* gpuctk-cdi-hook: the compiled front of gpuctk-hook, named in the hook entry of gpuctk's CDI
 * specs (the default `--library-mode folder`).
 *
 *     gpuctk-cdi-hook createContainer [--link TARGET::LINK]... [--link-for CAP:TARGET::LINK]...
 *                     [--folder DIR]... [--ld-cache FILE] [--disable-hook NAME]...
 *     gpuctk-cdi-hook disable-device-node-modification [--disable-hook NAME]...
 *
 * It does what gpuctk-hook would do for the common image, in about a millisecond, and hands
 * everything else, unchanged (the same arguments, the same environment, the OCI state on
 * stdin), to `gpuctk-hook` in its own folder. For the common image (an x86-64 glibc image with
 * an ld cache of its own) it:
 *
 *   - merges the stage's own ld cache (--ld-cache: a host file of the stage, written with the
 *     stage by gpuctk.cdi.stage) into the image's /etc/ld.so.cache and lists the --folder
 *     args in /etc/ld.so.conf.d/00-gpuctk.conf (hook/ldcache.c, the one merge: gpuctk-hook
 *     and the shim run it too, as merge-ld-cache): every
 *     glibc, whatever its age, finds the driver through its cache, and `ldconfig -p` (what
 *     Triton and torch.compile read) lists it;
 *   - makes the entry's links: the stage's firmware and config files, each at its own path,
 *     and its binaries at their usual paths (/usr/bin/nvidia-smi); a --link-for only when the
 *     container's NVIDIA_DRIVER_CAPABILITIES asks for CAP (see container_caps());
 *   - guards the device nodes (a read-only copy of /proc/driver/nvidia/params mounted over
 *     it: see guard()), for every container: the guard's one implementation, which
 *     gpuctk-hook runs too (`disable-device-node-modification --root-fd N`, the root it
 *     opened passed as a descriptor: that form never hands over).
 *
 * The entry's arguments are read here alone (read_args(), split_link(): every verb of
 * gpuctk-hook, --NAME VALUE and --NAME=VALUE, the verbs' options generated from
 * gpuctk.cdi.node.facts.HOOK_OPTIONS); gpuctk-hook asks for that reading as `read-args`.
 *
 * It serves a container in a user namespace too (Kubernetes' hostUsers: false, podman's
 * --userns), where it runs inside the namespace: see root_seen() and scratch_file().
 *
 * gpuctk-hook runs instead when any of these holds:
 *
 *   - another verb, --help, --version, GPUCTK_HOOK_FRONT=off, an argument the verb does not
 *     take or one it takes that this program does not serve (--mode, --path,
 *     --ldconfig-path, --container-spec), an option without its value (the guard's verb
 *     with --root-fd, merge-ld-cache, make-links, driver-capabilities, root-seen and
 *     read-args are gpuctk-hook's own calls of the C's rules: they never hand over);
 *   - anything this program does not fully understand: the OCI state or config.json not the
 *     plain JSON it expects (not strict JSON, a key with an escape or a byte above 127, a key
 *     that is root or path in another case, a duplicate, more than MAX_DEPTH levels, a
 *     state over MAX_STATE bytes: gpuctk-hook still gets all of it), no openat2 (the guard
 *     does without);
 *   - createContainer, with update-ldcache not disabled: no --folder or no --ld-cache; the
 *     image has no x86-64 glibc loader, or also a 32-bit or a musl loader; with
 *     enable-cuda-compat not disabled, /usr/local/cuda/compat holds a libcuda.so.<version>
 *     newer than GPUCTK_DRIVER_VERSION (gpuctk-hook then applies the exact forward-compat
 *     rule); the image's cache or ld.so.conf is missing, not on the root's own mount, not a
 *     cache hook/ldcache.c reads, or a compat run of gpuctk-hook left its conf file; the
 *     stage's cache is not a regular file of root's that nobody else can write; /etc cannot
 *     be written (a read-only root);
 *   - a --link that is not two plain absolute paths, a --link-for of a capability this
 *     build does not know, or a link not made here: see make_links().
 *
 * The image is hostile: every path in it is opened with openat2(RESOLVE_IN_ROOT |
 * RESOLVE_NO_MAGICLINKS) from the root's descriptor, looked at through an O_PATH descriptor
 * before anything is opened for reading (a FIFO or device is never opened), read only when it
 * is a regular file on the root's own mount (a link of the image into the container's /proc,
 * such as /proc/kmsg, is never read), each read bounded; a folder is listed at most
 * MAX_ENTRIES names. In the root it writes only /etc/ld.so.cache and
 * /etc/ld.so.conf.d/00-gpuctk.conf (each a new file renamed into place) and the --link
 * symlinks and their missing folders, each in a folder on the root's own mount (never a
 * volume's), a link never over an existing entry, and the guard's copy in the container's
 * /dev (removed once mounted); outside it only the guard's folder in /run where the container
 * has no /dev of its own (removed once mounted); its other outcomes are the guard's read-only
 * mount over the container's /proc/driver/nvidia/params, or gpuctk-hook. Built by setup.py
 * with the host's C compiler (hook/cbuild.py). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "gpuctk_vocab.h" /* generated by hook/cvocab.py into the build's folder */

#define MAX_STATE (1 << 20)
#define MAX_CONFIG (16 << 20)
#define MAX_ENTRIES 4096
#define MAX_NAMES 512
#define MAX_DEPTH 64
#define MAX_LINKS 256

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_IN_ROOT 0x10
#define OPEN_TREE_CLONE 1
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x4
#define MOVE_MOUNT_T_EMPTY_PATH 0x40
#endif
#define ATTR_RO_NOSUID_NODEV_NOEXEC (0x1 | 0x2 | 0x4 | 0x8)

struct open_how_ { unsigned long long flags, mode, resolve; };
struct mount_attr_ { unsigned long long set, clr, propagation, userns_fd; };

/* what `gpuctk install` looks for in a file it may replace */
__attribute__((used)) static const char launcher_mark[] = GPUCTK_LAUNCHER_MARK;

static char **g_argv;
static char *g_state;
static size_t g_state_len;
static int g_more; /* stdin holds more of the state than g_state: gpuctk-hook gets it all */

/* ---- hand over to gpuctk-hook ------------------------------------------------------------ */

__attribute__((noreturn)) static void python(const char *why)
{
	char exe[PATH_MAX], hook[PATH_MAX + 16];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0) {
		fprintf(stderr, "gpuctk-cdi-hook: error: cannot find its own path: %s\n", strerror(errno));
		exit(1);
	}
	exe[n] = 0;
	char *slash = strrchr(exe, '/');
	*slash = 0;
	snprintf(hook, sizeof hook, "%s/" GPUCTK_HOOK_NAME, exe);
	if (getenv(GPUCTK_HOOK_FRONT_TRACE_ENV))
		fprintf(stderr, "gpuctk-cdi-hook: gpuctk-hook: %s\n", why);
	if (g_state) { /* the state was read: give it to gpuctk-hook on stdin again */
		int fd = (int)syscall(SYS_memfd_create, "oci-state", 1U /* MFD_CLOEXEC */);
		int ok = fd >= 0 && write(fd, g_state, g_state_len) == (ssize_t)g_state_len;
		while (ok && g_more) {
			ssize_t got = read(0, g_state, g_state_len);
			if (got < 0 && errno == EINTR)
				continue;
			ok = got >= 0 && write(fd, g_state, (size_t)got) == got;
			g_more = got > 0;
		}
		if (!ok || lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, 0) != 0) {
			fprintf(stderr, "gpuctk-cdi-hook: error: cannot pass the OCI state on: %s\n",
				strerror(errno));
			exit(1);
		}
		close(fd);
	}
	g_argv[0] = hook;
	execv(hook, g_argv);
	fprintf(stderr, "gpuctk-cdi-hook: error: cannot run %s: %s\n", hook, strerror(errno));
	exit(1);
}

/* ---- bounded reads ----------------------------------------------------------------------- */

static int read_all(int fd, size_t limit, char **out, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap + 1);
	if (!buf)
		return -1;
	for (;;) {
		if (n == cap) {
			if (cap > limit) {
				free(buf);
				errno = EFBIG;
				return -1;
			}
			cap = cap * 2 > limit + 1 ? limit + 1 : cap * 2; /* never past limit + 1 */
			char *b = realloc(buf, cap + 1);
			if (!b) {
				free(buf);
				return -1;
			}
			buf = b;
		}
		ssize_t got = read(fd, buf + n, cap - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			free(buf);
			return -1;
		}
		if (got == 0)
			break;
		n += (size_t)got;
	}
	if (n > limit) {
		free(buf);
		errno = EFBIG;
		return -1;
	}
	buf[n] = 0;
	*out = buf;
	*len = n;
	return 0;
}

static int in_root(int root, const char *path, int flags)
{
	struct open_how_ how = { (unsigned long long)(flags | O_CLOEXEC), 0,
				 RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
	return (int)syscall(SYS_openat2, root, path, &how, sizeof how);
}

/* The regular file behind the O_PATH descriptor `at` (closed here), read whole: looked at
 * through `at` first (opening a device or FIFO can act), read through that same inode once it
 * is known to be a regular file under `limit` bytes. 0, -1 with errno (EINVAL: not a regular
 * file; EFBIG: too large). */
static int read_opened(int at, size_t limit, char **out, size_t *len)
{
	int fd = -1, rc = -1;
	struct stat st;
	char self[64];
	if (fstat(at, &st) != 0)
		;
	else if (!S_ISREG(st.st_mode))
		errno = EINVAL;
	else if ((unsigned long long)st.st_size > limit)
		errno = EFBIG;
	else {
		snprintf(self, sizeof self, "/proc/self/fd/%d", at);
		fd = open(self, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
		if (fd >= 0)
			rc = read_all(fd, limit, out, len);
	}
	int saved = errno;
	if (fd >= 0)
		close(fd);
	close(at);
	errno = saved;
	return rc;
}

/* A regular file of the root, read whole (read_opened), when it lies on the mount `mnt` (0: any
 * mount; the image's files: the root's own, so that no link of the image leads this host-root
 * reader to another mount's file, such as /proc/kmsg): 0, -1 with errno (ENOENT, ENOTDIR,
 * ELOOP: absent; EXDEV: on another mount). */
static int own_mount(int fd, unsigned long long want);
static int read_in_root(int root, const char *path, unsigned long long mnt, size_t limit,
			char **out, size_t *len)
{
	int at = in_root(root, path, O_PATH);
	if (at < 0)
		return -1;
	if (mnt && own_mount(at, mnt) != 0) {
		int saved = errno;
		close(at);
		errno = saved;
		return -1;
	}
	return read_opened(at, limit, out, len);
}

static int absent(void) { return errno == ENOENT || errno == ENOTDIR; }

/* The OCI state on stdin into g_state (at most MAX_STATE bytes; more, or a read error after
 * some: gpuctk-hook gets those bytes and the rest of stdin, as if it had read stdin itself). */
static void read_state(void)
{
	char *buf = malloc(MAX_STATE + 2);
	size_t n = 0;
	if (!buf)
		python("the OCI state could not be read");
	while (n <= MAX_STATE) {
		ssize_t got = read(0, buf + n, MAX_STATE + 1 - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got == 0)
			break;
		if (got < 0) {
			if (n == 0) {
				free(buf);
				python("the OCI state could not be read");
			}
			g_state = buf;
			g_state_len = n;
			g_more = 1;
			python("the OCI state could not be read");
		}
		n += (size_t)got;
	}
	buf[n] = 0;
	g_state = buf;
	g_state_len = n;
	if (n > MAX_STATE) {
		g_more = 1;
		python("the OCI state is larger than MAX_STATE");
	}
}

/* ---- a strict reader of the JSON the runtime writes ---------------------------------------- */

struct json { const char *p, *end; int depth; };

static void ws(struct json *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

/* A string at j->p: its raw bytes, *escaped set when it holds an escape or a byte above 127;
 * 0 on success, -1 when it is not a JSON string (a control byte, an unknown escape). */
static int string(struct json *j, const char **s, size_t *n, int *escaped)
{
	if (j->p >= j->end || *j->p != '"')
		return -1;
	const char *start = ++j->p;
	*escaped = 0;
	while (j->p < j->end && *j->p != '"') {
		unsigned char c = (unsigned char)*j->p;
		if (c < 0x20)
			return -1;
		if (c >= 0x80)
			*escaped = 1;
		if (c != '\\') {
			j->p++;
			continue;
		}
		*escaped = 1;
		if (j->end - j->p < 2)
			return -1;
		c = (unsigned char)j->p[1];
		if (c == 'u') {
			if (j->end - j->p < 6)
				return -1;
			for (int i = 2; i < 6; i++)
				if (!j->p[i] || !strchr("0123456789abcdefABCDEF", j->p[i]))
					return -1;
			j->p += 6;
		} else if (c && strchr("\"\\/bfnrt", c)) {
			j->p += 2;
		} else {
			return -1;
		}
	}
	if (j->p >= j->end)
		return -1;
	*s = start;
	*n = (size_t)(j->p - start);
	j->p++;
	return 0;
}

static int value(struct json *j);
static int compound(struct json *j, const char *key, const char **found);

static int word(struct json *j, const char *w)
{
	size_t n = strlen(w);
	if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0)
		return -1;
	j->p += n;
	return 0;
}

static int digits(struct json *j)
{
	const char *start = j->p;
	while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
		j->p++;
	return j->p == start ? -1 : 0;
}

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int number(struct json *j)
{
	if (j->p < j->end && *j->p == '-')
		j->p++;
	if (j->p < j->end && *j->p == '0')
		j->p++;
	else if (digits(j))
		return -1;
	if (j->p < j->end && *j->p == '.') {
		j->p++;
		if (digits(j))
			return -1;
	}
	if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
		j->p++;
		if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
			j->p++;
		if (digits(j))
			return -1;
	}
	return 0;
}

static int value(struct json *j)
{
	ws(j);
	if (j->p >= j->end)
		return -1;
	char c = *j->p;
	if (c == '{' || c == '[')
		return compound(j, NULL, NULL) < 0 ? -1 : 0;
	if (c == '"') {
		const char *s;
		size_t n;
		int esc;
		return string(j, &s, &n, &esc);
	}
	if (c == 't')
		return word(j, "true");
	if (c == 'f')
		return word(j, "false");
	if (c == 'n')
		return word(j, "null");
	return number(j);
}

/* The object or array at j->p, checked to its end; j->p is then after it. With `key` (an object
 * only): *found is set to the value of the one member named `key` (exactly: any member whose
 * name is `key` in another case, escaped or not ASCII, a second one, or any escaped name, is an
 * error), else NULL. 1 found, 0 not there (or no key), -1 not understood. */
static int compound(struct json *j, const char *key, const char **found)
{
	ws(j);
	if (j->p >= j->end || (*j->p != '{' && (key || *j->p != '[')) || ++j->depth > MAX_DEPTH)
		return -1;
	char close = *j->p++ == '{' ? '}' : ']';
	size_t klen = key ? strlen(key) : 0;
	const char *at = NULL;
	ws(j);
	if (j->p < j->end && *j->p == close)
		j->p++;
	else
		for (;;) {
			if (close == '}') {
				const char *s;
				size_t n;
				int esc;
				ws(j);
				if (string(j, &s, &n, &esc))
					return -1;
				int named = key && n == klen && strncasecmp(s, key, n) == 0;
				if (named && (esc || memcmp(s, key, n) != 0 || at))
					return -1;
				if (key && esc)
					return -1; /* an escape may spell the key in another way */
				ws(j);
				if (j->p >= j->end || *j->p++ != ':')
					return -1;
				if (named) {
					ws(j);
					at = j->p;
				}
			}
			if (value(j))
				return -1;
			ws(j);
			if (j->p >= j->end)
				return -1;
			if (*j->p == ',') {
				j->p++;
				continue;
			}
			if (*j->p++ != close)
				return -1;
			break;
		}
	j->depth--;
	ws(j);
	if (found)
		*found = at;
	return at ? 1 : 0;
}

/* The plain string of doc[k1] (or doc[k1][k2]) as a new C string; NULL when not understood. */
static char *lookup(const char *doc, size_t len, const char *k1, const char *k2)
{
	struct json j = { doc, doc + len, 0 };
	const char *at;
	if (compound(&j, k1, &at) != 1 || j.p != j.end)
		return NULL;
	if (k2) {
		struct json inner = { at, doc + len, 0 };
		if (compound(&inner, k2, &at) != 1)
			return NULL;
	}
	struct json v = { at, doc + len, 0 };
	const char *s;
	size_t n;
	int esc;
	if (string(&v, &s, &n, &esc) || esc || n == 0 || memchr(s, 0, n))
		return NULL;
	return strndup(s, n);
}

/* ---- what the image needs ---------------------------------------------------------------- */

/* The loader: 1 when the image has an x86-64 glibc loader and neither a 32-bit glibc loader
 * nor a musl loader this machine runs (x86-64 or i386), 0 when not, -1 on an error that is
 * not absent() (no such file). Looked at, never read. */
static int loader_served(int root)
{
#if defined(__x86_64__)
	static const char *const others[] = { "/lib/ld-linux.so.2", "/lib/ld-musl-x86_64.so.1",
					      "/lib/ld-musl-i386.so.1" };
	struct stat st;
	for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
		int fd = in_root(root, others[i], O_PATH);
		if (fd >= 0) {
			close(fd);
			return 0;
		}
		if (!absent() && errno != ELOOP)
			return -1;
	}
	int fd = in_root(root, "/lib64/ld-linux-x86-64.so.2", O_PATH);
	if (fd < 0)
		return absent() || errno == ELOOP ? 0 : -1;
	int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
	close(fd);
	return ok;
#else
	(void)root;
	return 0;
#endif
}

static int parse_version(const char *s, long v[4])
{
	int parts = 0;
	memset(v, 0, 4 * sizeof *v);
	while (parts < 4) {
		char *end;
		if (*s < '0' || *s > '9')
			return -1;
		errno = 0;
		v[parts++] = strtol(s, &end, 10);
		if (errno || end - s > 9)
			return -1;
		if (*end == 0)
			return parts >= 2 ? 0 : -1;
		if (*end != '.')
			return -1;
		s = end + 1;
	}
	return -1;
}

/* 1 when the image's CUDA compat folder holds a regular libcuda.so.<version> newer than the
 * host's. */
#define LIBCUDA_LEN (sizeof GPUCTK_COMPAT_LIBCUDA - 1)
static int compat_newer(int root, const long host[4])
{
	int fd = in_root(root, GPUCTK_COMPAT_DIR, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return absent() || errno == ELOOP ? 0 : -1;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -1;
	}
	struct dirent *e;
	int seen = 0, rc = 0;
	while (rc == 0 && (e = readdir(d))) {
		long v[4];
		if (++seen > MAX_ENTRIES)
			rc = -1;
		else if (strncmp(e->d_name, GPUCTK_COMPAT_LIBCUDA, LIBCUDA_LEN) == 0 &&
			 parse_version(e->d_name + LIBCUDA_LEN, v) == 0) {
			struct stat st;
			if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
				rc = -1;
			else if (S_ISREG(st.st_mode))
				for (int i = 0; i < 4; i++)
					if (v[i] != host[i]) {
						rc = v[i] > host[i];
						break;
					}
		}
	}
	closedir(d);
	return rc;
}

/* ---- the spec's links -------------------------------------------------------------------- */

#ifndef STATX_MNT_ID
#define STATX_MNT_ID 0x1000U
#endif

/* The id of the mount `fd` is on: statx's (5.8 and later), else the mnt_id line of
 * /proc/self/fdinfo (3.15 and later). 0, -1 with errno. */
static int mount_id(int fd, unsigned long long *id)
{
	struct statx sx;
	if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) == 0 &&
	    (sx.stx_mask & STATX_MNT_ID)) {
		*id = sx.stx_mnt_id;
		return 0;
	}
	char path[64], *text, *line, *end;
	size_t len;
	snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
	int info = open(path, O_RDONLY | O_CLOEXEC);
	if (info < 0 || read_all(info, 1 << 16, &text, &len) != 0) {
		if (info >= 0)
			close(info);
		errno = ENOSYS;
		return -1;
	}
	close(info);
	int rc = -1;
	for (line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
		if (strncmp(line, "mnt_id:", 7) == 0) {
			errno = 0;
			*id = strtoull(line + 7, &end, 10);
			rc = errno || end == line + 7 ? -1 : 0;
			break;
		}
	free(text);
	if (rc != 0)
		errno = ENOSYS;
	return rc;
}

/* 0 when `fd` is on the mount `want`, else -1 (EXDEV: a bind mount or volume in the root). */
static int own_mount(int fd, unsigned long long want)
{
	unsigned long long id;
	if (mount_id(fd, &id) != 0)
		return -1;
	if (id != want) {
		errno = EXDEV;
		return -1;
	}
	return 0;
}

/* An O_PATH descriptor of the root's folder `path` (plain and absolute; "" is the root), made
 * with its missing parents (0755, one that appears meanwhile taken as it is): each in a folder
 * on the root's own mount `mnt`. -1 with errno otherwise. */
static int folder_in_root(int root, unsigned long long mnt, char *path)
{
	int fd = in_root(root, *path ? path : "/", O_PATH | O_DIRECTORY);
	if (fd >= 0 || errno != ENOENT)
		return fd;
	char *slash = strrchr(path, '/');
	if (!slash || !slash[1])
		return -1;
	*slash = 0;
	int parent = folder_in_root(root, mnt, path);
	*slash = '/';
	if (parent < 0)
		return -1;
	int ok = own_mount(parent, mnt) == 0 && (mkdirat(parent, slash + 1, 0755) == 0 ||
						 errno == EEXIST);
	close(parent);
	return ok ? in_root(root, path, O_PATH | O_DIRECTORY) : -1;
}

#define LINK_MADE 0 /* link_at(): made, or an image's other link swapped for it */
#define LINK_KEPT 1 /* it already names the target */
#define LINK_LEFT 2 /* the image's own file, folder or node: left alone */

/* The link policy, its one home: `name` in the folder `dir` made a symlink to `target`; a link
 * there that already names it kept; the image's own file, folder or node left alone (an image
 * that ships its own ICD or GLVND file keeps it); an image's link naming something else swapped
 * for the new one at once (RENAME_EXCHANGE: no moment without a link) through the temp name
 * `.NAME.gpuctk-link` (one per name: a killed run's is a link of its own, replaced the next
 * time), put back if what it swapped turns out to be no link, and unlinked only while it is
 * still the link swapped out. LINK_MADE, LINK_KEPT, LINK_LEFT; -1 with errno. */
static int link_at(int dir, const char *name, const char *target)
{
	if (symlinkat(target, dir, name) == 0)
		return LINK_MADE;
	if (errno != EEXIST)
		return -1;
	struct stat was, st;
	char now[PATH_MAX], tmp[NAME_MAX + 1];
	if (fstatat(dir, name, &was, AT_SYMLINK_NOFOLLOW) != 0)
		return -1;
	if (!S_ISLNK(was.st_mode))
		return LINK_LEFT;
	size_t want = strlen(target);
	ssize_t len = readlinkat(dir, name, now, sizeof now);
	if (len >= 0 && (size_t)len == want && memcmp(now, target, want) == 0)
		return LINK_KEPT;
	snprintf(tmp, sizeof tmp, ".%.200s.gpuctk-link", name);
	if (fstatat(dir, tmp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
		unlinkat(dir, tmp, 0); /* a killed run's */
	if (symlinkat(target, dir, tmp) != 0)
		return -1;
	if (syscall(SYS_renameat2, dir, tmp, dir, name, 2U /* RENAME_EXCHANGE */) != 0) {
		int saved = errno;
		unlinkat(dir, tmp, 0); /* still ours: the exchange did not happen */
		errno = saved;
		return -1;
	}
	if (fstatat(dir, tmp, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_ino != was.st_ino ||
	    st.st_dev != was.st_dev || !S_ISLNK(st.st_mode)) {
		syscall(SYS_renameat2, dir, tmp, dir, name, 2U); /* raced: put back, left there */
		errno = EAGAIN;
		return -1;
	}
	unlinkat(dir, tmp, 0);
	return LINK_MADE;
}

/* The entry's links, where they are plain: each paths[i] made a symlink to targets[i]
 * (absolute container paths, checked plain by main) by link_at() when its target is in the
 * root, its folders made as needed, all on the root's own mount; a target not in the root
 * skipped. 0 done, -1 anything else (a folder on another mount, a read-only root): gpuctk-hook
 * then does them all, asking link_at() through link_served(). */
static int make_links(int root, const char **targets, char **paths, int n)
{
	unsigned long long mnt;
	if (n && mount_id(root, &mnt) != 0)
		return -1;
	for (int i = 0; i < n; i++) {
		int t = in_root(root, targets[i], O_PATH);
		if (t < 0) {
			if (absent())
				continue;
			return -1;
		}
		close(t);
		char *slash = strrchr(paths[i], '/');
		*slash = 0;
		int dir = folder_in_root(root, mnt, paths[i]);
		*slash = '/';
		if (dir < 0)
			return -1;
		int rc = own_mount(dir, mnt) == 0 ? link_at(dir, slash + 1, targets[i]) : -1;
		close(dir);
		if (rc < 0)
			return -1;
	}
	return 0;
}

/* gpuctk-hook's form of the link policy, `make-links (--dir-fd N NAME TARGET)...`: each NAME in
 * the folder gpuctk-hook opened inside the root (inherited as descriptor N; its parents made,
 * its mount checked there) made a link to TARGET by link_at(); one line per link on stdout:
 * made, kept, left, or `error ERRNO` (that link not made; the next ones are). Exit 0; 2 bad
 * arguments. It never hands over: gpuctk-hook runs it. */
static int fd_arg(const char *s);
static int link_served(int argc, char **argv)
{
	int bad = argc < 6 || (argc - 2) % 4;
	for (int i = 2; !bad && i < argc; i += 4)
		bad = strcmp(argv[i], GPUCTK_DIR_FD_OPT) != 0 || fd_arg(argv[i + 1]) < 0 ||
		      !argv[i + 2][0] || strchr(argv[i + 2], '/') || !argv[i + 3][0];
	if (bad) {
		fprintf(stderr, "gpuctk-cdi-hook: error: usage: " GPUCTK_LINKS_VERB " ("
			GPUCTK_DIR_FD_OPT " FD NAME TARGET)... (gpuctk-hook runs it)\n");
		return 2;
	}
	static const char *const words[] = { "made", "kept", "left" };
	for (int i = 2; i < argc; i += 4) {
		int rc = link_at(fd_arg(argv[i + 1]), argv[i + 2], argv[i + 3]);
		if (rc < 0)
			printf("error %d\n", errno);
		else
			printf("%s\n", words[rc]);
	}
	if (fflush(stdout) == 0 && !ferror(stdout))
		return 0;
	fprintf(stderr, "gpuctk-cdi-hook: error: the links are made, but what became of each could "
		"not be written: %s\n", strerror(errno));
	return 1;
}

#include "ldcache.c"

/* `len` bytes of `data` written to `fd`: 0, -1 (a short write: errno EIO where none is set). */
static int write_all(int fd, const char *data, size_t len)
{
	size_t done = 0;
	while (done < len) {
		ssize_t put = write(fd, data + done, len - done);
		if (put < 0 && errno == EINTR)
			continue;
		if (put <= 0) {
			if (put == 0)
				errno = EIO;
			return -1;
		}
		done += (size_t)put;
	}
	return 0;
}

/* A file `data` written whole as `name` in the root's folder `folder` (made if missing, on the
 * root's own mount `mnt`), through a new file renamed into place: 0, -1 with nothing left. */
static int write_in_root(int root, unsigned long long mnt, const char *folder, const char *name,
			 const char *data, size_t len)
{
	char path[PATH_MAX], tmp[NAME_MAX + 1];
	snprintf(path, sizeof path, "%s", folder);
	int dir = folder_in_root(root, mnt, path);
	if (dir < 0)
		return -1;
	snprintf(tmp, sizeof tmp, ".%s.gpuctk-%d", name, (int)getpid());
	int rc = -1, fd = -1;
	if (own_mount(dir, mnt) == 0)
		fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd >= 0) {
		rc = write_all(fd, data, len) == 0 && fchmod(fd, 0644) == 0 ? 0 : -1;
		if (close(fd) != 0) /* closed either way */
			rc = -1;
		if (rc == 0)
			rc = renameat(dir, tmp, dir, name);
		if (rc != 0)
			unlinkat(dir, tmp, 0);
	}
	int saved = errno;
	close(dir);
	errno = saved;
	return rc;
}

#define CONF_HEAD "# written by gpuctk-cdi-hook: NVIDIA driver library folders\n"

/* The uid under which this process sees host root's files: 0, or inside a user namespace that
 * maps no host uid 0 (Kubernetes' `hostUsers: false`, podman's --userns), the kernel's
 * overflow uid, under which every owner the namespace does not map shows; NO_UID (no file's)
 * when either cannot be read. */
#define NO_UID ((unsigned long)(uid_t)-1)
static unsigned long root_seen(void)
{
	char *text, *end;
	size_t len;
	unsigned long seen = NO_UID;
	int fd = open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || read_all(fd, 1 << 16, &text, &len) != 0) {
		if (fd >= 0)
			close(fd);
		return NO_UID;
	}
	close(fd);
	for (char *line = text; *line; line = end + (*end == '\n')) {
		unsigned long inside = strtoul(line, &end, 10), outside = strtoul(end, &end, 10);
		unsigned long count = strtoul(end, &end, 10);
		end += strcspn(end, "\n");
		if (outside == 0 && count > 0)
			seen = inside;
	}
	free(text);
	if (seen != NO_UID)
		return seen;
	fd = open("/proc/sys/kernel/overflowuid", O_RDONLY | O_CLOEXEC);
	if (fd >= 0 && read_all(fd, 64, &text, &len) == 0) {
		unsigned long v = strtoul(text, &end, 10);
		if (end != text)
			seen = v;
		free(text);
	}
	if (fd >= 0)
		close(fd);
	return seen;
}

/* The host file `path` (the stage's own cache, which the spec names), read whole when it is a
 * regular file of root's (as root_seen() shows root) that nobody else can write (looked at
 * through an O_PATH descriptor, the last part not followed, before it is opened): 0, -1 with
 * errno. In a user namespace that maps no host root, an owner it does not map passes too: the
 * cache is then trusted as far as the stage's libraries beside it, which the engine mounts
 * into the container whoever owns them (`gpuctk cdi generate` names a stage only in folders
 * root alone can write). */
static int read_host_file(const char *path, size_t limit, char **out, size_t *len)
{
	int at = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (at < 0)
		return -1;
	struct stat st;
	int stated = fstat(at, &st) == 0;
	if (!stated || st.st_uid != root_seen() || (st.st_mode & 022)) {
		int saved = stated ? EPERM : errno;
		close(at);
		errno = saved;
		return -1;
	}
	return read_opened(at, limit, out, len);
}

/* The image's ld cache with the stage's libraries (hook/ldcache.c), and the stage's folders in
 * /etc/ld.so.conf.d/00-gpuctk.conf (an ldconfig the container runs later keeps them): 0 done,
 * -1 gpuctk-hook does it (nothing written, or only what it writes again the same way). `part`: the stage's cache on the host (--ld-cache); the image's
 * own cache and ld.so.conf, and the folders written, must be on the root's own mount `mnt`. */
static int merge_cache(int root, unsigned long long mnt, const char *part, const char **folders,
		       int nfolders)
{
	char *image = NULL, *stage = NULL, *out = NULL;
	size_t ilen, slen, olen;
	int rc = -1;
	struct stat st;
	/* a root a compat run of gpuctk-hook left (its conf file): only gpuctk-hook empties
	 * that file */
	int fd = in_root(root, GPUCTK_COMPAT_CONF, O_PATH);
	if (fd >= 0 || !(absent() || errno == ELOOP)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	/* the image keeps its /etc/ld.so.conf: one it lacks is gpuctk-hook's to write */
	fd = in_root(root, GPUCTK_LD_SO_CONF, O_PATH);
	if (fd < 0)
		return -1;
	int conf = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && own_mount(fd, mnt) == 0;
	close(fd);
	if (!conf || read_in_root(root, GPUCTK_LD_CACHE, mnt, GPUCTK_MAX_CACHE, &image, &ilen) != 0 ||
	    read_host_file(part, GPUCTK_MAX_CACHE, &stage, &slen) != 0 ||
	    ldc_merge(image, ilen, stage, slen, &out, &olen) != 0)
		goto out;
	size_t tlen = strlen(CONF_HEAD);
	for (int i = 0; i < nfolders; i++)
		tlen += strlen(folders[i]) + 1;
	char *text = malloc(tlen + 1);
	if (!text)
		goto out;
	strcpy(text, CONF_HEAD);
	for (int i = 0; i < nfolders; i++)
		strcat(strcat(text, folders[i]), "\n");
	rc = write_in_root(root, mnt, GPUCTK_LD_CONF_DIR, GPUCTK_LD_CONF_NAME, text, tlen) == 0 &&
		     write_in_root(root, mnt, GPUCTK_LD_CACHE_DIR, GPUCTK_LD_CACHE_NAME, out, olen) == 0
	     ? 0 : -1;
	free(text);
out:
	free(image);
	free(stage);
	free(out);
	return rc;
}

/* 1 when `p` has no "." or ".." part and no control byte: the kernel then resolves it as
 * runc and gpuctk-hook do, as text. */
static int no_dots(const char *p)
{
	for (const char *c = p; *c; c++)
		if ((unsigned char)*c < 0x20)
			return 0;
	for (const char *part = p;;) {
		const char *end = strchrnul(part, '/');
		size_t n = (size_t)(end - part);
		if ((n == 1 && part[0] == '.') || (n == 2 && part[0] == '.' && part[1] == '.'))
			return 0;
		if (!*end)
			return 1;
		part = end + 1;
	}
}

/* 1 when `p` is an absolute path of plain names: no empty, "." or ".." part, no trailing /,
 * no control byte. */
static int plain_path(const char *p)
{
	size_t n = strlen(p);
	return p[0] == '/' && n > 1 && n < PATH_MAX && p[n - 1] != '/' && !strstr(p, "//") &&
	       no_dots(p);
}

/* ---- the device node guard ------------------------------------------------------------- */

/* The params text with `ModifyDeviceFiles: 1` made 0 into out (at least len + 1 bytes), each
 * line ended by \n; 0 nothing to hide (no such line, or a `ModifyDeviceFiles: 0` line before
 * it), 1 made. A line ends at \n, \r or \r\n. */
static int modified(const char *text, size_t len, char *out, size_t *outlen)
{
	size_t o = 0, k = strlen(GPUCTK_PARAMS_KEY);
	int changed = 0;
	for (size_t i = 0, next; i < len; i = next) {
		size_t end = i;
		while (end < len && text[end] != '\n' && text[end] != '\r')
			end++;
		next = end + (end + 1 < len && text[end] == '\r' && text[end + 1] == '\n' ? 2 : 1);
		size_t n = end - i;
		const char *line = text + i;
		if (n >= k && memcmp(line, GPUCTK_PARAMS_KEY, k) == 0) {
			if (n == k + 1 && line[k] == '0')
				return 0;
			if (n == k + 1 && line[k] == '1') {
				memcpy(out + o, GPUCTK_PARAMS_KEY "0\n", k + 2);
				o += k + 2;
				changed = 1;
				continue;
			}
		}
		memcpy(out + o, line, n);
		o += n;
		out[o++] = '\n';
	}
	*outlen = o;
	return changed;
}

/* Remove the guard's copy `name` from `dev` when the name is still the file `src` (the mount
 * keeps its copy); errno kept. */
static void unlink_copy(int dev, const char *name, int src)
{
	int saved = errno;
	struct stat a, b;
	if (name[0] && src >= 0 && fstatat(dev, name, &a, AT_SYMLINK_NOFOLLOW) == 0 &&
	    fstat(src, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
		unlinkat(dev, name, 0);
	errno = saved;
}

static int g_walked_a_link; /* guard_open() met a link it does not follow */

/* The guard's `path` (absolute, plain) under `root`, resolved inside the root (openat2, tried
 * again while a rename or mount elsewhere makes it answer EAGAIN), on a kernel without openat2
 * (ENOSYS before 5.6; EPERM, a seccomp filter's answer) too: there each part is opened from the
 * folder before it and a symlink is not followed (ELOOP, g_walked_a_link set: the caller
 * refuses rather than takes it for an absent file). */
static int guard_open(int root, const char *path, int flags)
{
	int fd = -1;
	for (int i = 0; i < 64 && (fd = in_root(root, path, flags)) < 0 && errno == EAGAIN; i++)
		;
	if (fd >= 0 || (errno != ENOSYS && errno != EPERM))
		return fd;
	char part[PATH_MAX];
	int dir = dup(root);
	for (const char *p = path; dir >= 0;) {
		p += strspn(p, "/");
		size_t n = strcspn(p, "/");
		int last = p[n] == 0, saved;
		struct stat st;
		if (n == 0 || n >= sizeof part) {
			close(dir);
			errno = EINVAL;
			return -1;
		}
		memcpy(part, p, n);
		part[n] = 0;
		fd = openat(dir, part, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0 && fstat(fd, &st) == 0 && S_ISLNK(st.st_mode)) {
			g_walked_a_link = 1;
			close(fd);
			fd = -1;
			errno = ELOOP;
		} else if (fd >= 0 && (!last || (flags & O_DIRECTORY)) && !S_ISDIR(st.st_mode)) {
			close(fd);
			fd = -1;
			errno = ENOTDIR;
		} else if (fd >= 0 && last && !(flags & O_PATH)) {
			char self[64]; /* the file looked at, reopened for what the caller asks */
			snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
			int opened = open(self, (flags & ~O_NOFOLLOW) | O_CLOEXEC);
			saved = errno;
			close(fd);
			fd = opened;
			errno = saved;
		}
		saved = errno;
		close(dir);
		errno = saved;
		if (last || fd < 0)
			return fd;
		dir = fd;
		p += n;
	}
	return -1;
}

/* GPUCTK_SCRATCH_PREFIX and 12 random hex digits in `name`: 0, -1 with errno. */
static int random_name(char *name, size_t size)
{
	unsigned char rnd[6];
	ssize_t got = getrandom(rnd, sizeof rnd, 0); /* no file to open, none to fail */
	if (got != (ssize_t)sizeof rnd) {
		errno = got < 0 ? errno : EIO;
		return -1;
	}
	snprintf(name, size, GPUCTK_SCRATCH_PREFIX "%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1],
		 rnd[2], rnd[3], rnd[4], rnd[5]);
	return 0;
}

/* A new file `name` of `text` in the folder `dir` (0444): the descriptor it was written
 * through (the mount is cloned from it, never from the name, which another could swap in a
 * folder others may write); -1 with errno, nothing left. */
static int new_copy(int dir, const char *name, const char *text, size_t len)
{
	int fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
	if (fd >= 0 && write_all(fd, text, len) != 0) {
		unlink_copy(dir, name, fd);
		int saved = errno;
		close(fd);
		errno = saved;
		return -1;
	}
	return fd;
}

/* The guard's copy in the container's own /dev (the tmpfs the runtime mounts there: on
 * another mount than the root's, not the host's /dev; never the image's folder nor a volume of
 * another kind), a fresh random name: its descriptor, its name in *name and the folder's
 * descriptor in *dev (the caller unlinks it); -1 where there is no such /dev or it cannot be
 * written (full, read-only). A folder of the container's own, so that the guard serves a user
 * namespace too, where no host folder can be written. */
static int scratch_file(int root, const char *text, size_t len, char *name, size_t size, int *dev)
{
	unsigned long long rmnt;
	struct statfs sf;
	struct stat ds, hs;
	*dev = guard_open(root, "/dev", O_RDONLY | O_DIRECTORY); /* a link of the image's to it:
								  * followed inside the root */
	if (*dev < 0 || mount_id(root, &rmnt) != 0 || own_mount(*dev, rmnt) == 0 ||
	    fstatfs(*dev, &sf) != 0 || sf.f_type != GPUCTK_TMPFS_MAGIC || fstat(*dev, &ds) != 0 ||
	    stat("/dev", &hs) != 0 || hs.st_dev == ds.st_dev || random_name(name, size) != 0)
		return -1;
	int fd = new_copy(*dev, name, text, len);
	if (fd < 0)
		name[0] = 0;
	return fd;
}

/* Where the container has no such /dev (or it is full or read-only): the copy, "params", on a
 * tmpfs of its own (nosuid, nodev, noexec, private) mounted on a new empty folder of root's
 * alone in GPUCTK_SCRATCH (the hook's own /run), its path in `folder` (the caller detaches and
 * removes it); -1 with errno, nothing left. */
static int run_scratch(const char *text, size_t len, char *folder, size_t size)
{
	char name[64];
	int made = 0;
	for (int i = 0; i < 8 && !made; i++) {
		if (random_name(name, sizeof name) != 0)
			return -1;
		snprintf(folder, size, GPUCTK_SCRATCH "/%s", name);
		made = mkdir(folder, 0700) == 0;
		if (!made && errno != EEXIST)
			break;
	}
	if (!made) {
		folder[0] = 0;
		return -1;
	}
	int dir = -1, fd = -1;
	if (mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0700") == 0 &&
	    mount(NULL, folder, NULL, MS_PRIVATE, NULL) == 0)
		dir = open(folder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dir >= 0 && fchmod(dir, 0700) == 0)
		fd = new_copy(dir, "params", text, len);
	int saved = errno;
	if (dir >= 0)
		close(dir);
	if (fd < 0) {
		umount2(folder, MNT_DETACH | UMOUNT_NOFOLLOW);
		rmdir(folder);
		folder[0] = 0;
	}
	errno = saved;
	return fd;
}

/* 1 when `a` and `b` are open on the same file. */
static int same_file(int a, int b)
{
	struct stat sa, sb;
	return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

/* Bind the copy `src` over the container's params (opened inside the root). With the new mount
 * API (5.12 and later) a clone made read-only, nosuid, nodev, noexec before it is attached:
 * where the root's propagation is shared, the copies the kernel propagates to the host are
 * read-only too. Without it (ENOSYS, or EPERM: a seccomp filter's answer) a bind through
 * /proc/self/fd of both descriptors, then a read-only remount of the new mount once it is
 * checked to be the copy. 0; -1 with errno; -2 the file there is not the copy. */
static int attach(int root, int src)
{
	struct mount_attr_ attr = { ATTR_RO_NOSUID_NODEV_NOEXEC, 0, 0, 0 };
	char from[64], to[64];
	int clone = (int)syscall(SYS_open_tree, src, "", OPEN_TREE_CLONE | O_CLOEXEC | AT_EMPTY_PATH);
	if (clone >= 0 && syscall(SYS_mount_setattr, clone, "", AT_EMPTY_PATH, &attr, sizeof attr)) {
		int saved = errno;
		close(clone);
		errno = saved;
		clone = -1;
	}
	if (clone < 0 && errno != ENOSYS && errno != EPERM)
		return -1;
	int target = guard_open(root, GPUCTK_PARAMS, O_PATH), rc = -1;
	snprintf(from, sizeof from, "/proc/self/fd/%d", src);
	snprintf(to, sizeof to, "/proc/self/fd/%d", target);
	if (target >= 0 && clone >= 0)
		rc = (int)syscall(SYS_move_mount, clone, "", target, "", MOVE_MOUNT_F_EMPTY_PATH |
				  MOVE_MOUNT_T_EMPTY_PATH);
	else if (target >= 0)
		rc = mount(from, to, NULL, MS_BIND, NULL);
	int saved = errno;
	if (target >= 0)
		close(target);
	if (clone >= 0)
		close(clone);
	errno = saved;
	if (rc != 0)
		return -1;
	int now = guard_open(root, GPUCTK_PARAMS, O_PATH);
	if (now < 0 || !same_file(now, src))
		rc = -2;
	snprintf(to, sizeof to, "/proc/self/fd/%d", now);
	if (rc == 0 && clone < 0)
		rc = mount(NULL, to, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV |
			   MS_NOEXEC, NULL);
	saved = errno;
	if (now >= 0)
		close(now);
	errno = saved;
	return rc;
}

/* Exit with the guard's error line: `what` and the system's word for errno. */
__attribute__((noreturn)) static void guard_failed(const char *what)
{
	fprintf(stderr, "gpuctk-cdi-hook: error: the device node guard: %s: %s\n", what,
		strerror(errno));
	exit(1);
}

/* The device node guard, as the reference toolkit's hook of that name does it: a read-only
 * copy of the container's params, `ModifyDeviceFiles` made 0, mounted over it (see
 * scratch_file() and attach()). Its outcome in words; an error line and exit 1 when it cannot
 * be done (the container must then not start: a bind that is not the copy, or one an old
 * kernel could not make read-only, is left where it is). */
static const char *guard(int root)
{
	char *text;
	size_t len;
	const char *none = "no " GPUCTK_PARAMS " in the container: device nodes left as they are";
	/* the container's own /proc first (the runtime's, mounted over the image's folder): no
	 * file of the image is read */
	struct stat rs, ps;
	int proc = guard_open(root, "/proc", O_PATH | O_DIRECTORY);
	if (proc < 0 && (absent() || errno == ELOOP) && !g_walked_a_link)
		return none;
	if (proc < 0 || fstat(proc, &ps) != 0 || fstat(root, &rs) != 0)
		guard_failed(g_walked_a_link ? "a link on the way to /proc, which this kernel "
					       "(without openat2) does not follow here"
					     : "cannot open the container's /proc");
	close(proc);
	if (ps.st_dev == rs.st_dev) /* run by hand on a root that is no container's */
		return "no procfs at /proc in the root (not a container's): " GPUCTK_PARAMS
		       " left as it is";
	int at = guard_open(root, GPUCTK_PARAMS, O_PATH);
	if (at < 0 || read_opened(at, GPUCTK_MAX_PARAMS, &text, &len) != 0) {
		if ((absent() || errno == ELOOP) && !g_walked_a_link)
			return none;
		guard_failed(g_walked_a_link ? "a link on the way to " GPUCTK_PARAMS ", which this "
					       "kernel (without openat2) does not follow here"
					     : "cannot read " GPUCTK_PARAMS);
	}
	char *copy = malloc(len + 2 * strlen(GPUCTK_PARAMS_KEY) + 4);
	size_t clen = 0;
	int change = copy ? modified(text, len, copy, &clen) : -1;
	free(text);
	if (change < 0)
		guard_failed("out of memory");
	if (change == 0) {
		free(copy);
		return GPUCTK_PARAMS " does not let the container make device nodes";
	}
	char name[64] = "", folder[PATH_MAX] = "";
	int dev = -1;
	int src = scratch_file(root, copy, clen, name, sizeof name, &dev);
	if (src < 0)
		src = run_scratch(copy, clen, folder, sizeof folder);
	free(copy);
	int rc = src >= 0 ? attach(root, src) : -1, saved = errno;
	if (dev >= 0) {
		unlink_copy(dev, name, src);
		close(dev);
	}
	if (folder[0]) { /* the mount over params keeps the copy */
		umount2(folder, MNT_DETACH | UMOUNT_NOFOLLOW);
		rmdir(folder);
	}
	if (src >= 0)
		close(src);
	errno = saved;
	if (rc == -2) {
		fprintf(stderr, "gpuctk-cdi-hook: error: the device node guard: %s changed while "
			"it was mounted (the container must not start)\n", GPUCTK_PARAMS);
		exit(1);
	}
	if (rc != 0)
		guard_failed(src >= 0 ? "cannot mount the read-only copy over " GPUCTK_PARAMS
				      : "the container has no /dev of its own to hold the copy (a "
					"tmpfs the runtime mounts), and none could be made in "
					GPUCTK_SCRATCH);
	return GPUCTK_PARAMS " shows ModifyDeviceFiles: 0 (read-only copy)";
}

/* A descriptor number argument, whole decimal digits: the number, -1 for anything else. */
static int fd_arg(const char *s)
{
	char *end;
	errno = 0;
	long fd = strtol(s, &end, 10);
	return errno || !isdigit((unsigned char)*s) || *end || fd > INT_MAX ? -1 : (int)fd;
}

/* gpuctk-hook's form of the guard, `disable-device-node-modification --root-fd N`: the
 * container root it opened, inherited as descriptor N; the outcome in words on stdout. It
 * never hands over: gpuctk-hook runs it. */
static int guard_served(const char *arg)
{
	int fd = fd_arg(arg);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "gpuctk-cdi-hook: error: " GPUCTK_ROOT_FD_OPT " %s: not an open "
			"folder (gpuctk-hook passes the container root it opened)\n", arg);
		return 2;
	}
	const char *done = guard(fd);
	if (printf("%s\n", done) < 0 || fflush(stdout) != 0) {
		fprintf(stderr, "gpuctk-cdi-hook: error: the device node guard is done, but its "
			"outcome could not be written: %s\n", strerror(errno));
		return 1;
	}
	return 0;
}

/* gpuctk-hook's form of the ld cache merge, `merge-ld-cache --image-fd A --entries-fd B
 * [--ld-cache PART]`: the image's cache (read by gpuctk-hook inside the root, bounded) and the
 * entries to add (an ld cache gpuctk-hook built: the driver's libraries, or an image's newer
 * CUDA compat ones), each an inherited descriptor, then the stage's own cache PART (read as
 * serve_ld_cache() reads it: read_host_file()), merged by the one reader of an image's cache
 * (ldc_merge_parts), the new cache on stdout. Exit 0; GPUCTK_NOT_MERGED when one is not a
 * cache taken here (gpuctk-hook's ldconfig then builds it); 2 bad arguments; 1 another error. */
static int merge_served(int argc, char **argv)
{
	int fds[2] = { -1, -1 }, bad = argc % 2;
	const char *part = NULL;
	for (int i = 2; i + 1 < argc; i += 2) {
		int which = strcmp(argv[i], GPUCTK_IMAGE_FD_OPT) == 0 ? 0
			    : strcmp(argv[i], GPUCTK_ENTRIES_FD_OPT) == 0 ? 1 : -1;
		int fd = which < 0 ? -1 : fd_arg(argv[i + 1]);
		if (which < 0 && !part && strcmp(argv[i], GPUCTK_LD_CACHE_OPT) == 0)
			part = argv[i + 1];
		else if (fd < 0 || fds[which] != -1)
			bad = 1;
		else
			fds[which] = fd;
	}
	if (bad || fds[0] < 0 || fds[1] < 0) {
		fprintf(stderr, "gpuctk-cdi-hook: error: usage: " GPUCTK_MERGE_VERB " "
			GPUCTK_IMAGE_FD_OPT " FD " GPUCTK_ENTRIES_FD_OPT " FD [" GPUCTK_LD_CACHE_OPT
			" FILE] (gpuctk-hook runs it)\n");
		return 2;
	}
	char *data[3] = { NULL, NULL, NULL }, *out = NULL, why[PATH_MAX + 128] = "";
	size_t len[3] = { 0, 0, 0 }, olen;
	struct ldc_file f;
	int rc = GPUCTK_NOT_MERGED;
	if (read_all(fds[0], GPUCTK_MAX_CACHE, &data[0], &len[0]) != 0 ||
	    read_all(fds[1], GPUCTK_MAX_CACHE, &data[1], &len[1]) != 0) {
		snprintf(why, sizeof why, "cannot read the caches to merge: %s", strerror(errno));
		rc = 1;
	} else if (part && read_host_file(part, GPUCTK_MAX_CACHE, &data[2], &len[2]) != 0) {
		snprintf(why, sizeof why, "the stage's cache %s: %s", part,
			 errno == EPERM ? "not a regular file of root's that only root can write"
					: strerror(errno));
	} else if (ldc_open(data[0], len[0], &f) != 0) {
		snprintf(why, sizeof why, "the image's cache is not one this reader takes");
	} else if (ldc_merge_parts(data[0], len[0], (const char *const *)&data[1], &len[1],
				   part ? 2 : 1, &out, &olen) != 0) {
		snprintf(why, sizeof why, "the image's cache is past this reader's limits, or the "
			 "caches to add are not ones it takes");
	} else if (write_all(1, out, olen) != 0) {
		snprintf(why, sizeof why, "cannot write the merged cache: %s", strerror(errno));
		rc = 1;
	} else {
		rc = 0;
	}
	if (why[0])
		fprintf(stderr, "gpuctk-cdi-hook: error: %s\n", why);
	for (int i = 0; i < 3; i++)
		free(data[i]);
	free(out);
	return rc;
}

/* ---- gpuctk-runtime's create ------------------------------------------------------------------ */

#include "shimfront.c"

/* ---- the container's capabilities ----------------------------------------------------------- */

#define EVERY_CAP ((1 << GPUCTK_CAPS_COUNT) - 1)

/* A capability's bit: bit i is GPUCTK_CAPS[i]; -1 for a word that is none. */
static int cap_bit(const char *s, size_t n)
{
	for (int i = 0; i < GPUCTK_CAPS_COUNT; i++)
		if (strlen(GPUCTK_CAPS[i]) == n && memcmp(GPUCTK_CAPS[i], s, n) == 0)
			return i;
	return -1;
}

/* 1 for a byte a word of NVIDIA_DRIVER_CAPABILITIES is trimmed of. */
static int is_blank(char c)
{
	return c && strchr(GPUCTK_CAPS_BLANKS, c);
}

/* The last entry of the env list `env` that sets GPUCTK_CAPS_ENV, each entry decoded
 * (sf_decoded), walked one at a time (a list of any length a config holds): 0 with *at its
 * value and *vlen its length (*at NULL: none sets it), *kept the buffer to free (or NULL); -1
 * when the list is not plain (an entry that is not a string, bytes that are not UTF-8). */
static int caps_entry(struct span env, const char **at, size_t *vlen, char **kept)
{
	size_t n, plen = strlen(GPUCTK_CAPS_ENV "=");
	*at = NULL;
	*vlen = 0;
	*kept = NULL;
	if (sf_count(env, 0, &n) != 0) /* checked whole: each step below stays in it */
		return -1;
	struct json j = { sf_start(env) + 1, env.end, 0 };
	for (size_t i = 0; i < n; i++) {
		const char *e;
		char *buf;
		size_t len;
		int wide;
		ws(&j);
		struct span item = { j.p, NULL };
		if (value(&j) != 0)
			break;
		item.end = j.p;
		ws(&j);
		j.p++; /* a comma, or the closing bracket */
		if (sf_decoded(item, &e, &len, &wide, &buf) != 0)
			break;
		if (len >= plen && memcmp(e, GPUCTK_CAPS_ENV "=", plen) == 0) {
			free(*kept);
			*kept = buf;
			*at = e + plen;
			*vlen = len - plen;
		} else {
			free(buf);
		}
		if (i + 1 == n)
			return 0;
	}
	free(*kept);
	*kept = NULL;
	return n ? -1 : 0;
}

/* The capabilities the container's NVIDIA_DRIVER_CAPABILITIES asks for, a bit each, from the
 * last entry of process.env that sets it (each entry's escapes decoded: Go's JSON writes <, >
 * and & as escapes): a comma-separated list, each word trimmed of GPUCTK_CAPS_BLANKS; unset or
 * blank the default (utility, compute), `all` every one, other words ignored (counted in
 * *unknown). A character above 127 is a byte that no word, blank or comma is (sf_decoded). -1
 * when the config is not plain enough to tell (a key in another case, bytes that are not
 * UTF-8, no memory). The rule's one home: gpuctk-hook and the Python shim ask caps_served. */
static int container_caps(const char *doc, size_t len, int *unknown)
{
	struct member *top = NULL, *proc = NULL, *f;
	size_t ntop, nproc, vlen;
	int rc = -1, folded;
	const char *value;
	char *kept; /* the decoded text value is in, if any */
	*unknown = 0;
	if (sf_items((struct span){ doc, doc + len }, 1, &top, &ntop) != 0)
		return -1;
	f = sf_member(top, ntop, "process", &folded);
	if (!f && !folded)
		rc = GPUCTK_CAPS_DEFAULT;
	if (!f || sf_kind(f->val) != '{' || sf_items(f->val, 1, &proc, &nproc) != 0)
		goto out;
	f = sf_member(proc, nproc, "env", &folded);
	if ((!f && !folded) || (f && is_null(f->val)))
		rc = GPUCTK_CAPS_DEFAULT;
	if (!f || sf_kind(f->val) != '[' || caps_entry(f->val, &value, &vlen, &kept) != 0)
		goto out;
	rc = 0;
	int blank = 1;
	for (size_t i = 0; value && i < vlen; i++)
		blank = blank && is_blank(value[i]);
	for (size_t i = 0; value && !blank && i <= vlen;) {
		size_t end = i;
		while (end < vlen && value[end] != ',')
			end++;
		size_t a = i, b = end;
		while (a < b && is_blank(value[a]))
			a++;
		while (b > a && is_blank(value[b - 1]))
			b--;
		int every = b - a == strlen(GPUCTK_CAPS_EVERY) &&
			    memcmp(value + a, GPUCTK_CAPS_EVERY, b - a) == 0;
		int bit = cap_bit(value + a, b - a);
		if (every)
			rc = EVERY_CAP;
		else if (bit >= 0 && rc != EVERY_CAP)
			rc |= 1 << bit;
		else if (bit < 0 && a < b)
			(*unknown)++;
		i = end + 1;
	}
	if (blank) /* unset, empty or spaces */
		rc = GPUCTK_CAPS_DEFAULT;
	free(kept);
out:
	free(top);
	free(proc);
	return rc;
}

/* gpuctk-hook's and the Python shim's form, `driver-capabilities --config-fd N`: the
 * capabilities the OCI config read from the inherited descriptor N asks for (container_caps), as
 * {"asked": [NAME, ...], "unknown": COUNT}, NAME in GPUCTK_CAPS' order, COUNT the words
 * that name none. Exit 0; 1 where the config is not plain enough to tell, why on stderr; 2 bad
 * arguments. It never hands over: gpuctk-hook runs it. */
static int caps_served(int argc, char **argv)
{
	int fd = argc == 4 && strcmp(argv[2], GPUCTK_CONFIG_FD_OPT) == 0 ? fd_arg(argv[3]) : -1;
	char *doc;
	size_t len;
	int unknown, caps;
	if (fd < 0) {
		fprintf(stderr, "gpuctk-cdi-hook: error: usage: " GPUCTK_CAPS_VERB " "
			GPUCTK_CONFIG_FD_OPT " FD (gpuctk-hook runs it)\n");
		return 2;
	}
	if (read_all(fd, GPUCTK_MAX_CONFIG, &doc, &len) != 0) {
		fprintf(stderr, "gpuctk-cdi-hook: error: cannot read the OCI config: %s\n",
			strerror(errno));
		return 1;
	}
	caps = container_caps(doc, len, &unknown);
	free(doc);
	if (caps < 0) {
		fprintf(stderr, "gpuctk-cdi-hook: error: " GPUCTK_CAPS_ENV " cannot be read from this "
			"OCI config: its top level, process or process.env is not as the OCI runtime "
			"spec writes it (a key in another case or with an escape, a value of another "
			"type, an env entry that is not a UTF-8 string); fix the engine's config.json\n");
		return 1;
	}
	printf("{\"asked\":[");
	for (int i = 0, n = 0; i < GPUCTK_CAPS_COUNT; i++)
		if (caps >> i & 1)
			printf("%s\"%s\"", n++ ? "," : "", GPUCTK_CAPS[i]);
	printf("],\"unknown\":%d}\n", unknown);
	return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

/* gpuctk-hook's form `root-seen`: the uid under which host root's files show here
 * (root_seen()), on stdout; NO_UID where it cannot be told. */
static int root_seen_served(int argc)
{
	if (argc != 2) {
		fprintf(stderr, "gpuctk-cdi-hook: error: usage: " GPUCTK_ROOT_SEEN_VERB
			" (gpuctk-hook runs it)\n");
		return 2;
	}
	printf("%lu\n", root_seen());
	return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

/* ---- the entry's arguments ------------------------------------------------------------- */

/* One argument after a verb as read_args() reads it: an option of the verb (its name, without
 * the dashes, and its value) or, with no name, an argument the verb does not take. */
struct arg {
	int start, stop; /* its words: argv[start] up to argv[stop] */
	const char *name, *value;
	size_t namelen;
};

/* The verb's row of GPUCTK_HOOK_OPTIONS ("VERB NAME..."), NULL where it has none. */
static const char *verb_row(const char *verb)
{
	size_t n = strlen(verb);
	for (int i = 0; n && !strchr(verb, ' ') && i < GPUCTK_HOOK_OPTIONS_COUNT; i++)
		if (strncmp(GPUCTK_HOOK_OPTIONS[i], verb, n) == 0 &&
		    (GPUCTK_HOOK_OPTIONS[i][n] == ' ' || !GPUCTK_HOOK_OPTIONS[i][n]))
			return GPUCTK_HOOK_OPTIONS[i];
	return NULL;
}

/* Whether the words of `row` after its first (the verb) include the n bytes at `name`. */
static int row_has(const char *row, const char *name, size_t n)
{
	const char *w = strchr(row, ' ');
	while (n && w) {
		w++;
		size_t len = strcspn(w, " ");
		if (len == n && memcmp(w, name, n) == 0)
			return 1;
		w = strchr(w, ' ');
	}
	return 0;
}

/* The arguments argv[first..argc) after a verb of `row`, the one reading of them (gpuctk-hook
 * asks for it: read_args_served()): --NAME VALUE or --NAME=VALUE for each option NAME of the row
 * (each takes a value and may repeat); a flag (GPUCTK_HOOK_FLAGS) without =, skipped; any other
 * argument not taken (an unknown --NAME without = takes the next word with it when that does not
 * start with '-'). Fills out[] (argc entries) and returns how many; -1 with a usage error in
 * err where an option's value is missing. */
static int read_args(const char *row, int argc, char **argv, int first, struct arg *out,
		     char *err, size_t errsize)
{
	int n = 0;
	for (int i = first; i < argc;) {
		const char *word = argv[i++], *name = "", *eq = NULL;
		size_t len = 0;
		if (strncmp(word, "--", 2) == 0) {
			name = word + 2;
			eq = strchr(name, '=');
			len = eq ? (size_t)(eq - name) : strlen(name);
		}
		if (!eq && len && flag_at(name, len, GPUCTK_HOOK_FLAGS, GPUCTK_HOOK_FLAGS_COUNT) >= 0)
			continue;
		struct arg *a = &out[n++];
		*a = (struct arg){ .start = i - 1, .name = name, .namelen = len };
		if (row_has(row, name, len)) {
			if (!eq && i >= argc) {
				snprintf(err, errsize, "%.*s: --%.*s needs a value",
					 (int)strcspn(row, " "), row, (int)len, name);
				return -1;
			}
			a->value = eq ? eq + 1 : argv[i++];
		} else {
			if (len && !eq && i < argc && argv[i][0] != '-')
				i++; /* an unknown option's value */
			a->name = NULL;
		}
		a->stop = i;
	}
	return n;
}

/* Whether `a` is the option `opt` (its --NAME). */
static int is_opt(const struct arg *a, const char *opt)
{
	return a->name && strlen(opt) == a->namelen + 2 && memcmp(opt + 2, a->name, a->namelen) == 0;
}

/* A --link value TARGET::LINK, or with link_for a --link-for value CAPABILITY:TARGET::LINK,
 * split: the lengths of CAPABILITY (0 for a --link) and TARGET (at *target), LINK at *link;
 * -1 where it does not split so (no LINK_SEP; no CAPABILITY before CAP_SEP, or another
 * CAP_SEP right after it). The one reading of a link value: gpuctk-hook gets it from
 * read_args_served(). */
static int split_link(const char *v, int link_for, size_t *cap, const char **target,
		      size_t *target_len, const char **link)
{
	size_t cap_sep = strlen(GPUCTK_CAP_SEP), link_sep = strlen(GPUCTK_LINK_SEP);
	*cap = 0;
	if (link_for) {
		const char *colon = strstr(v, GPUCTK_CAP_SEP);
		if (!colon || colon == v || strncmp(colon + cap_sep, GPUCTK_CAP_SEP, cap_sep) == 0)
			return -1;
		*cap = (size_t)(colon - v);
		v = colon + cap_sep;
	}
	const char *sep = strstr(v, GPUCTK_LINK_SEP);
	if (!sep)
		return -1;
	*target = v;
	*target_len = (size_t)(sep - v);
	*link = sep + link_sep;
	return 0;
}

/* gpuctk-hook's form `read-args VERB [ARG]...`: the ARGs after VERB as read_args() reads them,
 * one record per argument on stdout, eight fields each ended by a NUL byte: KIND (o an option
 * of the verb, l a --link or --link-for whose value splits, i an argument the verb does not
 * take), START and STOP (its words, counted from the first ARG), NAME, VALUE, and for l the
 * CAPABILITY (empty for a --link), TARGET and LINK (split_link()), else three empty fields.
 * Exit 0; 2 with the usage error on stderr (a missing value, a verb without options). It never
 * hands over: gpuctk-hook runs it. */
static int read_args_served(int argc, char **argv)
{
	const char *row = argc > 2 ? verb_row(argv[2]) : NULL;
	struct arg *args = calloc((size_t)argc, sizeof *args);
	char err[512], num[24];
	int n = row && args ? read_args(row, argc, argv, 3, args, err, sizeof err) : -1;
	if (n < 0) {
		fprintf(stderr, "%s\n", !args ? strerror(errno) : row ? err : "usage: "
			GPUCTK_READ_ARGS_VERB " VERB [ARG]... (a verb of gpuctk-hook; gpuctk-hook "
			"runs it)");
		free(args);
		return 2;
	}
	for (int k = 0; k < n; k++) {
		const struct arg *a = &args[k];
		const char *target = "", *link = "";
		size_t cap = 0, tlen = 0;
		int l = (is_opt(a, GPUCTK_LINK_OPT) || is_opt(a, GPUCTK_LINK_FOR_OPT)) &&
			split_link(a->value, is_opt(a, GPUCTK_LINK_FOR_OPT), &cap, &target, &tlen,
				   &link) == 0;
		field(!a->name ? "i" : l ? "l" : "o", 1);
		for (int w = 0; w < 2; w++) {
			int len = snprintf(num, sizeof num, "%d", (w ? a->stop : a->start) - 3);
			field(num, (size_t)len);
		}
		field(a->name ? a->name : "", a->name ? a->namelen : 0);
		field(a->value ? a->value : "", a->value ? strlen(a->value) : 0);
		field(a->value ? a->value : "", cap);
		field(target, tlen);
		field(link, strlen(link));
	}
	free(args);
	return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

/* ---- the verbs ----------------------------------------------------------------------------- */

/* What the arguments ask for; each one this program does not serve goes to gpuctk-hook. */
struct hook_args {
	int create; /* createContainer, else disable-device-node-modification */
	const char *folders[16], *targets[MAX_LINKS], *part;
	char *paths[MAX_LINKS];
	int needs[MAX_LINKS]; /* a --link-for's capability bit, -1 for a --link */
	int nfolders, nlinks, nlinks_for, off_ld, off_compat, off_guard, off_links;
};

/* A --link or --link-for (link_for) value, kept in `a` where this program makes it. */
static void keep_link(const char *v, int link_for, struct hook_args *a)
{
	const char *target, *link;
	size_t cap, tlen;
	int bit = -1;
	if (!a->create || a->nlinks == MAX_LINKS ||
	    split_link(v, link_for, &cap, &target, &tlen, &link) != 0 ||
	    (link_for && (bit = cap_bit(v, cap)) < 0))
		python(link_for ? "a " GPUCTK_LINK_FOR_OPT " only gpuctk-hook reads"
				: "a " GPUCTK_LINK_OPT " only gpuctk-hook reads");
	char *t = strndup(target, tlen);
	if (!t || !plain_path(t) || !plain_path(link))
		python("a " GPUCTK_LINK_OPT " only gpuctk-hook reads");
	a->targets[a->nlinks] = t;
	a->paths[a->nlinks] = (char *)link;
	a->needs[a->nlinks++] = bit;
	a->nlinks_for += link_for;
}

/* A --disable-hook NAME. */
static void parse_disable(const char *v, struct hook_args *a)
{
	if (strcmp(v, GPUCTK_LDCACHE_ACTION) == 0)
		a->off_ld = 1;
	else if (strcmp(v, GPUCTK_COMPAT_ACTION) == 0)
		a->off_compat = 1;
	else if (strcmp(v, GPUCTK_GUARD_ACTION) == 0)
		a->off_guard = 1;
	else if (strcmp(v, GPUCTK_LINKS_ACTION) == 0)
		a->off_links = 1;
	else
		python("a " GPUCTK_DISABLE_OPT " name only gpuctk-hook knows");
}

/* The verb's arguments, read by read_args(), kept in `a` where this program serves them all. */
static void parse_args(int argc, char **argv, struct hook_args *a)
{
	struct arg *args = calloc((size_t)argc, sizeof *args);
	char err[512];
	int n = args ? read_args(verb_row(argv[1]), argc, argv, 2, args, err, sizeof err) : -1;
	if (n < 0)
		python("arguments gpuctk-hook refuses");
	for (int k = 0; k < n; k++) {
		const struct arg *g = &args[k];
		const char *v = g->value;
		if (is_opt(g, GPUCTK_LINK_OPT) || is_opt(g, GPUCTK_LINK_FOR_OPT)) {
			keep_link(v, is_opt(g, GPUCTK_LINK_FOR_OPT), a);
		} else if (is_opt(g, GPUCTK_LD_CACHE_OPT)) {
			if (a->part || !plain_path(v))
				python("an " GPUCTK_LD_CACHE_OPT " only gpuctk-hook reads");
			a->part = v;
		} else if (is_opt(g, GPUCTK_FOLDER_OPT)) {
			if (a->nfolders == 16 || v[0] != '/')
				python("a " GPUCTK_FOLDER_OPT " only gpuctk-hook reads");
			a->folders[a->nfolders++] = v;
		} else if (is_opt(g, GPUCTK_DISABLE_OPT)) {
			parse_disable(v, a);
		} else {
			python("an argument only gpuctk-hook reads");
		}
	}
	free(args);
}

/* The container root named by the state's bundle's config.json, as an O_PATH descriptor; the
 * config's text in *doc. */
static int open_root(char **doc, size_t *doclen)
{
	read_state();
	char *bundle = lookup(g_state, g_state_len, GPUCTK_STATE_BUNDLE, NULL);
	if (!bundle || bundle[0] != '/' || strstr(bundle, "/../") || strlen(bundle) > PATH_MAX - 16)
		python("the OCI state is not plain");
	char config[PATH_MAX + 16];
	snprintf(config, sizeof config, "%s/config.json", bundle);
	int cfd = open(config, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	if (cfd < 0 || fstat(cfd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    read_all(cfd, MAX_CONFIG, doc, doclen) != 0)
		python("config.json could not be read");
	close(cfd);
	char *rootpath = lookup(*doc, *doclen, GPUCTK_CONFIG_ROOT, "path");
	if (!rootpath || strlen(rootpath) > PATH_MAX - 16 || !no_dots(rootpath) || !no_dots(bundle))
		python("config.json's root.path is not plain");
	char rootbuf[2 * PATH_MAX + 2];
	if (rootpath[0] != '/')
		snprintf(rootbuf, sizeof rootbuf, "%s/%s", bundle, rootpath);
	else
		snprintf(rootbuf, sizeof rootbuf, "%s", rootpath);
	int root = open(rootbuf, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root < 0)
		python("the container root could not be opened");
	return root;
}

/* The stage in the image's ld cache, where the image is one this program serves. */
static void serve_ld_cache(int root, struct hook_args *a)
{
	int served = loader_served(root);
	if (served != 1)
		python(served < 0 ? "the image's loader could not be read"
				  : "not an x86-64 glibc image alone");
	if (a->nfolders == 0 || !a->part)
		python("no " GPUCTK_FOLDER_OPT " or no " GPUCTK_LD_CACHE_OPT);
	if (!a->off_compat) {
		const char *ver = getenv(GPUCTK_DRIVER_VERSION_ENV);
		long host[4];
		if (!ver || parse_version(ver, host) != 0)
			python("no " GPUCTK_DRIVER_VERSION_ENV);
		int newer = compat_newer(root, host);
		if (newer != 0)
			python(newer < 0 ? GPUCTK_COMPAT_DIR " could not be read"
					 : "a newer CUDA compat libcuda");
	}
	unsigned long long mnt;
	if (mount_id(root, &mnt) != 0 ||
	    merge_cache(root, mnt, a->part, a->folders, a->nfolders) != 0)
		python("the image's ld cache is gpuctk-hook's to write");
}

/* A --link-for of a capability the container did not ask for is left out. */
static void keep_asked_links(const char *doc, size_t doclen, struct hook_args *a)
{
	int unknown, caps = container_caps(doc, doclen, &unknown), kept = 0;
	if (caps < 0)
		python(GPUCTK_CAPS_ENV " could not be read");
	for (int i = 0; i < a->nlinks; i++)
		if (a->needs[i] < 0 || (caps >> a->needs[i] & 1)) {
			a->targets[kept] = a->targets[i];
			a->paths[kept++] = a->paths[i];
		}
	a->nlinks = kept;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], GPUCTK_RUNTIME_FRONT) == 0)
		return runtime_front(argc, argv);
	if (argc > 1 && strcmp(argv[1], GPUCTK_FRONT_KEY) == 0)
		return front_key(argc, argv);
	if (argc > 1 && strcmp(argv[1], GPUCTK_MERGE_VERB) == 0)
		return merge_served(argc, argv);
	if (argc > 1 && strcmp(argv[1], GPUCTK_LINKS_VERB) == 0)
		return link_served(argc, argv);
	if (argc > 1 && strcmp(argv[1], GPUCTK_CAPS_VERB) == 0)
		return caps_served(argc, argv);
	if (argc > 1 && strcmp(argv[1], GPUCTK_ROOT_SEEN_VERB) == 0)
		return root_seen_served(argc);
	if (argc > 1 && strcmp(argv[1], GPUCTK_READ_ARGS_VERB) == 0)
		return read_args_served(argc, argv);
	if (argc > 1 && strcmp(argv[1], GPUCTK_RUNC_ARGS_VERB) == 0)
		return runc_args_served(argc, argv);
	g_argv = argv;
	if (argc < 2)
		python("no verb");
	const char *verb = argv[1];
	static struct hook_args a; /* zero; static: its arrays stay off the stack */
	a.create = strcmp(verb, GPUCTK_HOOK_VERB) == 0;
	if (!a.create && strcmp(verb, GPUCTK_GUARD_ACTION) != 0)
		python("another verb");
	if (!a.create && argc == 4 && strcmp(argv[2], GPUCTK_ROOT_FD_OPT) == 0)
		return guard_served(argv[3]);
	const char *front = getenv(GPUCTK_HOOK_FRONT_ENV);
	if (front && strcmp(front, GPUCTK_FRONT_OFF) == 0)
		python(GPUCTK_HOOK_FRONT_ENV "=" GPUCTK_FRONT_OFF);
	parse_args(argc, argv, &a);
	char *doc;
	size_t doclen;
	int root = open_root(&doc, &doclen);
	if (a.create && !a.off_ld)
		serve_ld_cache(root, &a);
	if (a.nlinks_for && !a.off_links)
		keep_asked_links(doc, doclen, &a);
	if (!a.off_links && make_links(root, a.targets, a.paths, a.nlinks) != 0)
		python("a " GPUCTK_LINK_OPT " gpuctk-hook makes");
	if (!a.off_guard)
		guard(root);
	return 0;
}
