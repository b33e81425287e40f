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
 *     args in /etc/ld.so.conf.d/00-gpuctk.conf, as gpuctk-hook does (hook/ldcache.c): every
 *     glibc, whatever its age, finds the driver through its cache, and `ldconfig -p` (what
 *     Triton and torch.compile read) lists it;
 *   - makes the entry's links: the stage's firmware and config files, each at its own path,
 *     and its binaries at their usual paths (/usr/bin/nvidia-smi); a --link-for only when the
 *     container's NVIDIA_DRIVER_CAPABILITIES asks for CAP, as gpuctk.cdi.node.capabilities
 *     reads it;
 *   - guards the device nodes (a read-only copy of /proc/driver/nvidia/params).
 *
 * gpuctk-hook runs instead when any of these holds:
 *
 *   - another verb, any other argument, --help, --version, GPUCTK_HOOK_FRONT=off;
 *   - anything this program does not fully understand: the OCI state or config.json not the
 *     plain JSON it expects (not strict JSON, a key with an escape or a byte above 127, a key
 *     that is "root" or "path" in another case, a duplicate, more than MAX_DEPTH levels, a
 *     state over MAX_STATE bytes: gpuctk-hook still gets all of it), no openat2;
 *   - createContainer, with update-ldcache not disabled: no --folder or no --ld-cache; the
 *     image has no x86-64 glibc loader, or also a 32-bit or a musl loader; with
 *     enable-cuda-compat not disabled, /usr/local/cuda/compat holds a libcuda.so.<version>
 *     newer than GPUCTK_DRIVER_VERSION (gpuctk-hook then applies the exact forward-compat
 *     rule); the image's cache or ld.so.conf is missing, not on the root's own mount, not a
 *     cache hook/ldcache.c reads, or a compat run of gpuctk-hook left its conf file; the
 *     stage's cache is not a regular file of root's that nobody else can write; /etc cannot
 *     be written (a read-only root);
 *   - a --link that is not two plain absolute paths, or one not made here: see make_links();
 *   - the device node guard (unless disabled) could not be done here: see guard() below.
 *
 * The image is hostile: every path in it is opened with openat2(RESOLVE_IN_ROOT |
 * RESOLVE_NO_MAGICLINKS) from the root's descriptor, looked at through an O_PATH descriptor
 * before anything is opened for reading (a FIFO or device is never opened), read only when it
 * is a regular file on the root's own mount (a link of the image into the container's /proc,
 * such as /proc/kmsg, is never read), each read bounded; a folder is listed at most
 * MAX_ENTRIES names. In the root it writes only /etc/ld.so.cache and
 * /etc/ld.so.conf.d/00-gpuctk.conf (each a new file renamed into place) and the --link
 * symlinks and their missing folders, each in a folder on the root's own mount (never a
 * volume's), a link never over an existing entry; its other outcomes are the guard's
 * read-only mount over the container's /proc/driver/nvidia/params, or gpuctk-hook. Built by
 * setup.py with the host's C compiler; without one, specs name gpuctk-hook itself. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_STATE (1 << 20)
#define MAX_CONFIG (16 << 20)
#define MAX_CACHE (4 << 20) /* gpuctk.hook.ldmerge.MAX_CACHE */
#define MAX_PARAMS (64 << 10)
#define MAX_ENTRIES 4096
#define MAX_NAMES 512
#define MAX_DEPTH 64
#define MAX_LINKS 256
#define PARAMS "proc/driver/nvidia/params"
#define KEY "ModifyDeviceFiles: "

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

/* what `gpuctk install` looks for in a file it may replace (gpuctk.hook.launchers) */
__attribute__((used)) static const char launcher_mark[] = "# gpuctk launcher";

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
	snprintf(hook, sizeof hook, "%s/gpuctk-hook", exe);
	if (getenv("GPUCTK_HOOK_FRONT_TRACE"))
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
			cap *= 2;
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
 * nor a musl loader (gpuctk.hook.inroot.has_runnable_musl), 0 when not, -1 on an error that
 * is not "absent". Looked at, never read. */
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

/* 1 when /usr/local/cuda/compat holds a regular libcuda.so.<version> newer than the host's. */
static int compat_newer(int root, const long host[4])
{
	int fd = in_root(root, "/usr/local/cuda/compat", O_RDONLY | O_DIRECTORY);
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
		else if (strncmp(e->d_name, "libcuda.so.", 11) == 0 &&
			 parse_version(e->d_name + 11, v) == 0) {
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

static int mount_id(int fd, unsigned long long *id)
{
	struct statx sx;
	if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) != 0)
		return -1;
	if (!(sx.stx_mask & STATX_MNT_ID)) {
		errno = ENOSYS;
		return -1;
	}
	*id = sx.stx_mnt_id;
	return 0;
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
 * with its missing parents (0755) as gpuctk.rootfs.mkdir_p_in_root makes them: each in a folder
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

/* gpuctk.hook.inroot.create_symlinks where it is plain: each paths[i] made a symlink to
 * targets[i] (absolute container paths, checked plain by main) when its target is in the
 * root, its folders made as needed, all on the root's own mount; a link that already names
 * its target is left as it is, a target not in the root skipped. 0 done, -1 anything else (a
 * file or another link in the way, a folder on another mount, a read-only root): gpuctk-hook
 * then does them all, with its warnings. */
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
		const char *name = slash + 1;
		int rc = own_mount(dir, mnt) == 0 ? symlinkat(targets[i], dir, name) : -1;
		if (rc != 0 && errno == EEXIST) {
			char now[PATH_MAX];
			size_t want = strlen(targets[i]);
			ssize_t len = readlinkat(dir, name, now, sizeof now);
			rc = len >= 0 && (size_t)len == want && memcmp(now, targets[i], want) == 0 ? 0 : -1;
		}
		close(dir);
		if (rc != 0)
			return -1;
	}
	return 0;
}

#include "ldcache.c"

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
		size_t done = 0;
		while (done < len) {
			ssize_t put = write(fd, data + done, len - done);
			if (put < 0 && errno == EINTR)
				continue;
			if (put <= 0)
				break;
			done += (size_t)put;
		}
		rc = done == len && fchmod(fd, 0644) == 0 ? 0 : -1;
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

/* The host file `path` (the stage's own cache, which the spec names), read whole when it is a
 * regular file of root's that nobody else can write (looked at through an O_PATH descriptor,
 * the last part not followed, before it is opened): 0, -1 with errno. */
static int read_host_file(const char *path, size_t limit, char **out, size_t *len)
{
	int at = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (at < 0)
		return -1;
	struct stat st;
	int stated = fstat(at, &st) == 0;
	if (!stated || st.st_uid != 0 || (st.st_mode & 022)) {
		int saved = stated ? EPERM : errno;
		close(at);
		errno = saved;
		return -1;
	}
	return read_opened(at, limit, out, len);
}

/* The image's ld cache with the stage's libraries (hook/ldcache.c), and the stage's folders in
 * /etc/ld.so.conf.d/00-gpuctk.conf (an ldconfig the container runs later keeps them), as
 * gpuctk-hook writes them: 0 done, -1 gpuctk-hook does it (nothing written, or only what it
 * writes again the same way). `part`: the stage's cache on the host (--ld-cache); the image's
 * own cache and ld.so.conf, and the folders written, must be on the root's own mount `mnt`. */
static int merge_cache(int root, unsigned long long mnt, const char *part, const char **folders,
		       int nfolders)
{
	char *image = NULL, *stage = NULL, *out = NULL;
	size_t ilen, slen, olen;
	int rc = -1;
	struct stat st;
	/* a root a compat run of gpuctk-hook left (gpuctk.hook.cudacompat.COMPAT_CONF): only
	 * gpuctk-hook empties that file */
	int fd = in_root(root, "/etc/ld.so.conf.d/00-compat-gpuctk.conf", O_PATH);
	if (fd >= 0 || !(absent() || errno == ELOOP)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	/* the image keeps its /etc/ld.so.conf: one it lacks is gpuctk-hook's to write */
	fd = in_root(root, "/etc/ld.so.conf", O_PATH);
	if (fd < 0)
		return -1;
	int conf = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && own_mount(fd, mnt) == 0;
	close(fd);
	if (!conf || read_in_root(root, "/etc/ld.so.cache", mnt, MAX_CACHE, &image, &ilen) != 0 ||
	    read_host_file(part, MAX_CACHE, &stage, &slen) != 0 ||
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
	rc = write_in_root(root, mnt, "/etc/ld.so.conf.d", "00-gpuctk.conf", text, tlen) == 0 &&
		     write_in_root(root, mnt, "/etc", "ld.so.cache", out, olen) == 0
	     ? 0 : -1;
	free(text);
out:
	free(image);
	free(stage);
	free(out);
	return rc;
}

/* 1 when `p` has no "." or ".." part and no control byte: the kernel then resolves it as
 * runc and Python do, as text. */
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
 * line ended by \n; 0 nothing to hide, 1 made. Lines end at \n, \r or \r\n, as
 * gpuctk.hook.nodeprotect.modified (bytes.splitlines) reads them. */
static int modified(const char *text, size_t len, char *out, size_t *outlen)
{
	size_t o = 0, k = strlen(KEY);
	int changed = 0;
	for (size_t i = 0, next; i < len; i = next) {
		size_t end = i;
		while (end < len && text[end] != '\n' && text[end] != '\r')
			end++;
		next = end + (end + 1 < len && text[end] == '\r' && text[end + 1] == '\n' ? 2 : 1);
		size_t n = end - i;
		const char *line = text + i;
		if (n >= k && memcmp(line, KEY, k) == 0) {
			if (n == k + 1 && line[k] == '0')
				return 0;
			if (n == k + 1 && line[k] == '1') {
				memcpy(out + o, KEY "0\n", k + 2);
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

/* gpuctk.hook.nodeprotect.protect, the new-mount-API path only. 0 done or nothing to do,
 * -1 hand over to gpuctk-hook (which also has the older kernels' path), before any mount
 * reached the container. */
static int guard(int root)
{
	char *text;
	size_t len;
	/* under the container's own /proc (mounted over the image's): no file of the image */
	if (read_in_root(root, PARAMS, 0, MAX_PARAMS, &text, &len) != 0)
		return absent() || errno == ELOOP ? 0 : -1;
	char *copy = malloc(len + 2 * strlen(KEY) + 4);
	size_t clen = 0;
	int change = copy ? modified(text, len, copy, &clen) : -1;
	free(text);
	if (change <= 0) {
		free(copy);
		return change;
	}
	struct stat rs, ps;
	int proc = in_root(root, "/proc", O_PATH | O_DIRECTORY);
	int own = proc >= 0 && fstat(proc, &ps) == 0 && fstat(root, &rs) == 0 && ps.st_dev != rs.st_dev;
	if (proc >= 0)
		close(proc);
	if (!own) {
		free(copy);
		return proc >= 0 ? 0 : -1; /* not a container's /proc: left alone, as gpuctk-hook */
	}
	char folder[64];
	unsigned char rnd[6];
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || read(fd, rnd, sizeof rnd) != (ssize_t)sizeof rnd) {
		free(copy);
		return -1;
	}
	close(fd);
	snprintf(folder, sizeof folder, "/run/.gpuctk-params-%02x%02x%02x%02x%02x%02x", rnd[0],
		 rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
	if (mkdir(folder, 0700) != 0) {
		free(copy);
		return -1;
	}
	int rc = -1, mounted = 0, dir = -1, src = -1, clone = -1, target = -1, now = -1;
	struct mount_attr_ attr = { ATTR_RO_NOSUID_NODEV_NOEXEC, 0, 0, 0 };
	struct stat a, b;
	if (mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0700") != 0)
		goto out;
	mounted = 1;
	if (mount(NULL, folder, NULL, MS_PRIVATE, NULL) != 0)
		goto out;
	dir = open(folder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dir < 0)
		goto out;
	fd = openat(dir, "params", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
	if (fd < 0)
		goto out;
	if (write(fd, copy, clen) != (ssize_t)clen) {
		close(fd);
		goto out;
	}
	close(fd);
	src = openat(dir, "params", O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (src < 0)
		goto out;
	clone = (int)syscall(SYS_open_tree, src, "", OPEN_TREE_CLONE | O_CLOEXEC | AT_EMPTY_PATH);
	if (clone < 0)
		goto out;
	if (syscall(SYS_mount_setattr, clone, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0)
		goto out;
	target = in_root(root, PARAMS, O_PATH);
	if (target < 0)
		goto out;
	if (syscall(SYS_move_mount, clone, "", target, "", MOVE_MOUNT_F_EMPTY_PATH |
		    MOVE_MOUNT_T_EMPTY_PATH) != 0)
		goto out;
	now = in_root(root, PARAMS, O_PATH);
	if (now >= 0 && fstat(now, &a) == 0 && fstat(src, &b) == 0 && a.st_dev == b.st_dev &&
	    a.st_ino == b.st_ino)
		rc = 0;
	if (now >= 0)
		close(now);
	if (rc != 0) {
		fprintf(stderr, "gpuctk-cdi-hook: error: /%s changed while it was mounted\n", PARAMS);
		exit(1);
	}
out:
	free(copy);
	int fds[] = { dir, src, clone, target };
	for (int i = 0; i < 4; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (mounted)
		umount2(folder, MNT_DETACH);
	rmdir(folder);
	return rc;
}

/* ---- gpuctk-runtime's create ------------------------------------------------------------------ */

#include "shimfront.c"

/* ---- the container's capabilities ----------------------------------------------------------- */

/* gpuctk.cdi.node.capabilities.ALL, in its order: bit i is CAPS[i] */
static const char *const CAPS[] = { "utility", "compute", "video", "graphics", "display", "ngx",
				    "compat32" };
#define NCAPS (int)(sizeof CAPS / sizeof *CAPS)
#define CAPS_ENV "NVIDIA_DRIVER_CAPABILITIES="

static int cap_bit(const char *s, size_t n)
{
	for (int i = 0; i < NCAPS; i++)
		if (strlen(CAPS[i]) == n && memcmp(CAPS[i], s, n) == 0)
			return i;
	return -1;
}

/* The capabilities the container's NVIDIA_DRIVER_CAPABILITIES asks for, a bit each, as
 * gpuctk.cdi.node.capabilities.parse_capabilities reads the last entry of process.env: unset
 * or blank the default (utility, compute), `all` every one, other words ignored. -1 when the
 * config is not plain enough to tell (an env entry with an escape, a key in another case). */
static int container_caps(const char *doc, size_t len)
{
	struct member *top = NULL, *proc = NULL, *env = NULL, *f;
	size_t ntop, nproc, nenv;
	int rc = -1, folded;
	if (sf_items((struct span){ doc, doc + len }, 1, &top, &ntop) != 0)
		return -1;
	f = sf_member(top, ntop, "process", &folded);
	if (!f && !folded)
		rc = 1 << 0 | 1 << 1;
	if (!f || sf_kind(f->val) != '{' || sf_items(f->val, 1, &proc, &nproc) != 0)
		goto out;
	f = sf_member(proc, nproc, "env", &folded);
	if ((!f && !folded) || (f && is_null(f->val)))
		rc = 1 << 0 | 1 << 1;
	if (!f || sf_kind(f->val) != '[' || sf_items(f->val, 0, &env, &nenv) != 0)
		goto out;
	const char *value = NULL;
	size_t vlen = 0, plen = strlen(CAPS_ENV);
	for (size_t i = 0; i < nenv; i++) {
		const char *e;
		size_t n;
		if (sf_plain(env[i].val, &e, &n) != 0)
			goto out; /* an escape may spell the variable */
		if (n >= plen && memcmp(e, CAPS_ENV, plen) == 0) {
			value = e + plen;
			vlen = n - plen;
		}
	}
	rc = 0;
	int blank = 1;
	for (size_t i = 0; value && i < vlen; i++)
		blank = blank && value[i] == ' ';
	for (size_t i = 0; value && !blank && i <= vlen;) {
		size_t end = i;
		while (end < vlen && value[end] != ',')
			end++;
		size_t a = i, b = end;
		while (a < b && value[a] == ' ')
			a++;
		while (b > a && value[b - 1] == ' ')
			b--;
		if (b - a == 3 && memcmp(value + a, "all", 3) == 0)
			rc = (1 << NCAPS) - 1;
		int bit = cap_bit(value + a, b - a);
		if (bit >= 0 && rc != (1 << NCAPS) - 1)
			rc |= 1 << bit;
		i = end + 1;
	}
	if (blank) /* unset, empty or spaces */
		rc = 1 << 0 | 1 << 1;
out:
	free(top);
	free(proc);
	free(env);
	return rc;
}

/* ---- the verbs ----------------------------------------------------------------------------- */

/* What the arguments ask for; each one this program does not read goes to gpuctk-hook. */
struct hook_args {
	int create; /* createContainer, else disable-device-node-modification */
	const char *folders[16], *targets[MAX_LINKS], *part;
	char *paths[MAX_LINKS];
	int needs[MAX_LINKS]; /* a --link-for's capability bit, -1 for a --link */
	int nfolders, nlinks, nlinks_for, off_ld, off_compat, off_guard, off_links;
};

/* A --link TARGET::LINK or --link-for CAPABILITY:TARGET::LINK value, kept in `a`. */
static void parse_link(char *v, int link_for, struct hook_args *a)
{
	if (link_for) { /* CAPABILITY:TARGET::LINK */
		char *colon = strchr(v, ':');
		int bit = colon ? cap_bit(v, (size_t)(colon - v)) : -1;
		if (bit < 0 || colon[1] == ':')
			python("a --link-for only gpuctk-hook reads");
		v = colon + 1;
		a->needs[a->nlinks] = bit;
		a->nlinks_for++;
	} else {
		a->needs[a->nlinks] = -1;
	}
	char *sep = strstr(v, "::");
	if (!sep)
		python("a --link only gpuctk-hook reads");
	*sep = 0;
	int plain = plain_path(v) && plain_path(sep + 2);
	if (plain &&
	    (!(a->targets[a->nlinks] = strdup(v)) || !(a->paths[a->nlinks] = strdup(sep + 2))))
		plain = 0;
	*sep = ':'; /* argv as it came, for gpuctk-hook */
	if (!plain)
		python("a --link only gpuctk-hook reads");
	a->nlinks++;
}

/* A --disable-hook NAME. */
static void parse_disable(const char *v, struct hook_args *a)
{
	if (strcmp(v, "update-ldcache") == 0)
		a->off_ld = 1;
	else if (strcmp(v, "enable-cuda-compat") == 0)
		a->off_compat = 1;
	else if (strcmp(v, "disable-device-node-modification") == 0)
		a->off_guard = 1;
	else if (strcmp(v, "create-symlinks") == 0)
		a->off_links = 1;
	else
		python("a --disable-hook name only gpuctk-hook knows");
}

static void parse_args(int argc, char **argv, struct hook_args *a)
{
	for (int i = 2; i < argc; i++) {
		int folder = strcmp(argv[i], "--folder") == 0, link = strcmp(argv[i], "--link") == 0;
		int link_for = strcmp(argv[i], "--link-for") == 0;
		int cache = strcmp(argv[i], "--ld-cache") == 0;
		if ((!folder && !link && !link_for && !cache &&
		     strcmp(argv[i], "--disable-hook") != 0) ||
		    i + 1 >= argc)
			python("an argument only gpuctk-hook reads");
		char *v = argv[++i];
		if ((link || link_for) && (!a->create || a->nlinks == MAX_LINKS))
			python("a --link only gpuctk-hook reads");
		if (link || link_for) {
			parse_link(v, link_for, a);
		} else if (cache) {
			if (!a->create || a->part || !plain_path(v))
				python("an --ld-cache only gpuctk-hook reads");
			a->part = v;
		} else if (folder) {
			if (!a->create || a->nfolders == 16 || v[0] != '/')
				python("a --folder only gpuctk-hook reads");
			a->folders[a->nfolders++] = v;
		} else {
			parse_disable(v, a);
		}
	}
}

/* The container root named by the state's bundle's config.json, as an O_PATH descriptor; the
 * config's text in *doc. */
static int open_root(char **doc, size_t *doclen)
{
	read_state();
	char *bundle = lookup(g_state, g_state_len, "bundle", NULL);
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
	char *rootpath = lookup(*doc, *doclen, "root", "path");
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
		python("no --folder or no --ld-cache");
	if (!a->off_compat) {
		const char *ver = getenv("GPUCTK_DRIVER_VERSION");
		long host[4];
		if (!ver || parse_version(ver, host) != 0)
			python("no GPUCTK_DRIVER_VERSION");
		int newer = compat_newer(root, host);
		if (newer != 0)
			python(newer < 0 ? "/usr/local/cuda/compat could not be read"
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
	int caps = container_caps(doc, doclen), kept = 0;
	if (caps < 0)
		python("NVIDIA_DRIVER_CAPABILITIES could not be read");
	for (int i = 0; i < a->nlinks; i++)
		if (a->needs[i] < 0 || (caps >> a->needs[i] & 1)) {
			a->targets[kept] = a->targets[i];
			a->paths[kept++] = a->paths[i];
		}
	a->nlinks = kept;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "shim-create") == 0)
		return shim_create(argc, argv);
	g_argv = argv;
	if (argc < 2)
		python("no verb");
	const char *verb = argv[1];
	static struct hook_args a; /* zero; static: its arrays stay off the stack */
	a.create = strcmp(verb, "createContainer") == 0;
	if (!a.create && strcmp(verb, "disable-device-node-modification") != 0)
		python("another verb");
	const char *front = getenv("GPUCTK_HOOK_FRONT");
	if (front && strcmp(front, "off") == 0)
		python("GPUCTK_HOOK_FRONT=off");
	parse_args(argc, argv, &a);
	char *doc;
	size_t doclen;
	int root = open_root(&doc, &doclen);
	if (a.create && !a.off_ld)
		serve_ld_cache(root, &a);
	if (a.nlinks_for && !a.off_links)
		keep_asked_links(doc, doclen, &a);
	if (!a.off_links && make_links(root, a.targets, a.paths, a.nlinks) != 0)
		python("a --link gpuctk-hook makes");
	if (!a.off_guard && guard(root) != 0)
		python("the device node guard");
	return 0;
}
