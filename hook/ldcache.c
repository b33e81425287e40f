/* The container's ld cache with the driver in it, without running ldconfig: included by
 * hook/cdihook.c (gpuctk-cdi-hook), which runs as host root on a hostile image.
 *
 * The stage (gpuctk.cdi.stage) holds ld.so.cache, an ld cache of the stage's own libraries
 * at their container paths (/usr/local/nvidia/lib64/libcuda.so.1, ...), written when the
 * stage is made: the SONAMEs and flags come from the host files' ELF headers there, never
 * from here. merge_cache() writes the image's /etc/ld.so.cache anew with the image's entries
 * and the stage's, in ldconfig's order: an image entry of the same (name, flags) as a stage
 * entry is replaced by it, glibc-hwcaps extension entries are left out, and the result is a
 * new-format ("glibc-ld.so.cache1.1") cache with no extension section. This is the one reader
 * of an image's cache: the shim and gpuctk-hook merge theirs here too (`merge-ld-cache`, with
 * the entries they built in place of the stage's cache).
 *
 * Both caches are read whole, bounded (GPUCTK_MAX_CACHE bytes), and
 * checked before anything is written: every count and offset against the file, every string
 * ended by a NUL inside the file, a name at most NAME_MAX bytes without "/". Each string an
 * entry names is copied once, in file order, and one that lies inside the string copied
 * before it (a name inside its path, as ldconfig stores them) is not copied again: what is
 * written is at most the inputs' string sections, and a container restarted on the same root
 * gets the same bytes again. Time is linear in the files' size, plus two sorts of the
 * entries, each comparison reading at most two names (2 x NAME_MAX bytes).
 * Anything this does not fully understand (an old-format cache without a new part, a
 * big-endian one, a malformed one) returns -1 before any write: the host's ldconfig, confined
 * to the root, then builds the cache (gpuctk-hook). */

#include <stdint.h>

#define LDC_MAGIC "glibc-ld.so.cache1.1"
#define LDC_OLD_MAGIC "ld.so-1.7.0"
#define LDC_HEADER 48
#define LDC_ENTRY 24
#define LDC_OLD_HEADER 16
#define LDC_OLD_ENTRY 12
#define LDC_NAME_MAX 255
#define LDC_PATH_MAX 4096
#define LDC_HWCAP_EXTENSION (1ULL << 62)

struct ldc_entry {
	int32_t flags;
	uint32_t key, value; /* file offsets in its input, then offsets in the output */
	uint64_t hwcap;
	const char *name;    /* the key's bytes (NUL-terminated inside its file) */
	size_t order;        /* position in the input: equal entries keep their order */
	int from;            /* 0 the image's, 1 the stage's */
};

struct ldc_file {
	const char *data;
	size_t len;
	size_t base, strings; /* the new-format header, the first byte after its entry table */
	uint32_t nlibs;
};

static uint32_t ldc_u32(const char *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof v);
	return v;
}

/* Where the new-format cache of `data` is: 0, -1 when there is none this reader knows. */
static int ldc_open(const char *data, size_t len, struct ldc_file *f)
{
	size_t base = 0;
	if (len >= LDC_OLD_HEADER && memcmp(data, LDC_OLD_MAGIC, strlen(LDC_OLD_MAGIC)) == 0) {
		uint32_t old = ldc_u32(data + strlen(LDC_OLD_MAGIC) + 1);
		if (old > (len - LDC_OLD_HEADER) / LDC_OLD_ENTRY)
			return -1;
		base = (LDC_OLD_HEADER + (size_t)old * LDC_OLD_ENTRY + 7) & ~(size_t)7;
	}
	if (base > len || len - base < LDC_HEADER || memcmp(data + base, LDC_MAGIC, strlen(LDC_MAGIC)))
		return -1;
	if ((data[base + 28] & 3) == 1 || (data[base + 28] & 3) == 3) /* invalid, big-endian */
		return -1;
	f->data = data;
	f->len = len;
	f->base = base;
	f->nlibs = ldc_u32(data + base + 20);
	if (f->nlibs > (len - base - LDC_HEADER) / LDC_ENTRY)
		return -1;
	f->strings = base + LDC_HEADER + (size_t)f->nlibs * LDC_ENTRY;
	return 0;
}

/* The string at header-relative offset `off` of `f`: its file offset, -1 when it does not lie
 * in the string section or is not ended by a NUL within `max` bytes; *n its length. */
static long ldc_string(const struct ldc_file *f, uint32_t off, size_t max, size_t *n)
{
	if (off >= f->len - f->base) /* f->base < f->len: ldc_open */
		return -1;
	size_t at = f->base + off;
	if (at < f->strings)
		return -1;
	size_t room = f->len - at < max + 1 ? f->len - at : max + 1;
	const char *nul = memchr(f->data + at, 0, room);
	if (!nul)
		return -1;
	*n = (size_t)(nul - (f->data + at));
	return (long)at;
}

/* Entry i of `f` into *e (its strings' file offsets): 1 kept, 0 an extension entry (left
 * out), -1 malformed. */
static int ldc_entry(const struct ldc_file *f, uint32_t i, struct ldc_entry *e)
{
	const char *p = f->data + f->base + LDC_HEADER + (size_t)i * LDC_ENTRY;
	uint32_t key = ldc_u32(p + 4), value = ldc_u32(p + 8);
	size_t kn = 0, vn = 0;
	long k = ldc_string(f, key, LDC_NAME_MAX, &kn), v = ldc_string(f, value, LDC_PATH_MAX - 1, &vn);
	if (k < 0 || v < 0 || memchr(f->data + k, '/', kn))
		return -1;
	memcpy(&e->flags, p, sizeof e->flags);
	memcpy(&e->hwcap, p + 16, sizeof e->hwcap);
	e->key = (uint32_t)k;
	e->value = (uint32_t)v;
	e->name = f->data + k;
	return e->hwcap & LDC_HWCAP_EXTENSION ? 0 : 1;
}

static int ldc_u32_order(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/* The limits of what is merged (a cache past them is left to ldconfig): the distinct strings
 * the entries name (by offset; a name counts once with the paths) at most 1.5 times the file
 * plus LDC_PATH_MAX, the names' runs of digits at most one per 16 bytes of file plus
 * LDC_NAME_MAX. 0 within them, -1 past them or out of memory. Every entry of `f` counts, those
 * left out or replaced too (its offsets checked by ldc_entry before). */
static int ldc_within_limits(const struct ldc_file *f)
{
	size_t n = f->nlibs, strings = 0, runs = 0;
	uint32_t *offs = malloc((2 * n + 1) * sizeof *offs), *keys = malloc((n + 1) * sizeof *keys);
	int rc = -1;
	if (!offs || !keys)
		goto out;
	for (size_t i = 0; i < n; i++) {
		const char *p = f->data + f->base + LDC_HEADER + i * LDC_ENTRY;
		keys[i] = offs[2 * i] = (uint32_t)(f->base + ldc_u32(p + 4));
		offs[2 * i + 1] = (uint32_t)(f->base + ldc_u32(p + 8));
	}
	qsort(offs, 2 * n, sizeof *offs, ldc_u32_order);
	qsort(keys, n, sizeof *keys, ldc_u32_order);
	for (size_t i = 0; i < 2 * n; i++)
		if (i == 0 || offs[i] != offs[i - 1])
			strings += strlen(f->data + offs[i]) + 1;
	for (size_t i = 0; i < n; i++) {
		if (i > 0 && keys[i] == keys[i - 1])
			continue;
		int digit = 0;
		for (const char *c = f->data + keys[i]; *c; c++) {
			int d = *c >= '0' && *c <= '9';
			runs += d && !digit;
			digit = d;
		}
	}
	rc = strings <= f->len + f->len / 2 + LDC_PATH_MAX && runs <= f->len / 16 + LDC_NAME_MAX
		     ? 0 : -1;
out:
	free(offs);
	free(keys);
	return rc;
}

/* glibc's _dl_cache_libcmp: bytes as the machine's `char`, a run of digits as its number (in
 * an int, modulo 2^32 and compared signed, as glibc's int has it). */
static int ldc_libcmp(const char *p1, const char *p2)
{
	while (*p1) {
		int d1 = *p1 >= '0' && *p1 <= '9', d2 = *p2 >= '0' && *p2 <= '9';
		if (d1 && d2) {
			uint32_t v1 = 0, v2 = 0;
			while (*p1 >= '0' && *p1 <= '9')
				v1 = v1 * 10 + (uint32_t)(*p1++ - '0');
			while (*p2 >= '0' && *p2 <= '9')
				v2 = v2 * 10 + (uint32_t)(*p2++ - '0');
			if (v1 != v2)
				return (int32_t)v1 < (int32_t)v2 ? -1 : 1;
		} else if (d1) {
			return 1;
		} else if (d2) {
			return -1;
		} else if (*p1 != *p2) {
			return *p1 - *p2;
		} else {
			p1++;
			p2++;
		}
	}
	return *p1 - *p2;
}

/* ldconfig's order (elf/cache.c compare): names descending, then higher flags, more hwcap
 * bits, higher hwcap; then the input order. */
static int ldc_order(const void *a, const void *b)
{
	const struct ldc_entry *x = a, *y = b;
	int c = ldc_libcmp(y->name, x->name);
	if (c)
		return c;
	if (x->flags != y->flags)
		return x->flags > y->flags ? -1 : 1;
	int bx = __builtin_popcountll(x->hwcap), by = __builtin_popcountll(y->hwcap);
	if (bx != by)
		return bx > by ? -1 : 1;
	if (x->hwcap != y->hwcap)
		return x->hwcap > y->hwcap ? -1 : 1;
	return x->order < y->order ? -1 : x->order > y->order;
}

struct ldc_ref {
	int from;
	uint32_t at;     /* file offset in its input */
	uint32_t *field; /* the entry's key or value: set to the output offset */
};

static int ldc_ref_order(const void *a, const void *b)
{
	const struct ldc_ref *x = a, *y = b;
	if (x->from != y->from)
		return x->from - y->from;
	return x->at < y->at ? -1 : x->at > y->at;
}

/* The strings the entries name, each copied once into `out` (a string that lies inside the
 * one copied before it, as ldconfig stores a name inside its path, is not copied again); the
 * entries' offsets set to theirs there, after `table` bytes. At most the inputs' string
 * sections are copied: returns the bytes written. */
static size_t ldc_strings(struct ldc_entry *all, size_t n, const struct ldc_file *files,
			  struct ldc_ref *refs, char *out, size_t table)
{
	for (size_t i = 0; i < n; i++) {
		refs[2 * i] = (struct ldc_ref){ all[i].from, all[i].key, &all[i].key };
		refs[2 * i + 1] = (struct ldc_ref){ all[i].from, all[i].value, &all[i].value };
	}
	qsort(refs, 2 * n, sizeof *refs, ldc_ref_order);
	size_t put = 0, start = 0, end = 0, copied = 0;
	int from = -1;
	for (size_t i = 0; i < 2 * n; i++) {
		const struct ldc_ref *r = &refs[i];
		if (r->from != from || r->at > end) {
			const char *s = files[r->from].data + r->at;
			size_t len = strlen(s); /* checked: a NUL inside the file */
			memcpy(out + put, s, len + 1);
			from = r->from;
			start = r->at;
			end = r->at + len;
			copied = put;
			put += len + 1;
		}
		*r->field = (uint32_t)(table + copied + (r->at - start));
	}
	return put;
}

#define LDC_MAX_PARTS 2

/* The entries of the parts (the caches to add, in their order) into all[*n]: 0, -1 malformed. */
static int ldc_part_entries(const struct ldc_file *f, int nparts, struct ldc_entry *all, size_t *n)
{
	size_t order = f[0].nlibs;
	for (int p = 1; p <= nparts; p++)
		for (uint32_t i = 0; i < f[p].nlibs; i++, order++) {
			int got = ldc_entry(&f[p], i, &all[*n]);
			if (got < 0)
				return -1;
			if (got)
				all[*n].order = order, all[*n].from = p, (*n)++;
		}
	return 0;
}

/* The new cache of `image` (the image's file) and `parts` (the caches to add: the stage's; or
 * an image's newer CUDA compat libraries, then the driver's) into *out (malloc'd), *outlen:
 * 0, or -1 when one is not a cache this reader takes (nothing made). An image entry of the
 * same (name, flags) as an added one is left out; added entries of the same order keep the
 * parts' order (the first wins in the loader, as ldconfig's first folder). */
static int ldc_merge_parts(const char *image, size_t ilen, const char *const *parts,
			   const size_t *plens, int nparts, char **out, size_t *outlen)
{
	struct ldc_file f[1 + LDC_MAX_PARTS];
	if (nparts < 1 || nparts > LDC_MAX_PARTS || ldc_open(image, ilen, &f[0]) != 0)
		return -1;
	size_t cap = f[0].nlibs, n = 0, nadded, room = f[0].len - f[0].strings;
	for (int p = 1; p <= nparts; p++) {
		if (ldc_open(parts[p - 1], plens[p - 1], &f[p]) != 0)
			return -1;
		cap += f[p].nlibs;
		room += f[p].len - f[p].strings;
	}
	struct ldc_entry *all = calloc(cap ? cap : 1, sizeof *all);
	struct ldc_ref *refs = calloc(cap ? 2 * cap : 1, sizeof *refs);
	char *buf = NULL;
	/* the added entries first, to know what they replace */
	if (!all || !refs || ldc_part_entries(f, nparts, all, &n) != 0)
		goto bad;
	nadded = n;
	for (uint32_t i = 0; i < f[0].nlibs; i++) { /* every entry checked before the limits */
		struct ldc_entry e;
		if (ldc_entry(&f[0], i, &e) < 0)
			goto bad;
	}
	if (ldc_within_limits(&f[0]) != 0)
		goto bad;
	for (uint32_t i = 0; i < f[0].nlibs; i++) {
		struct ldc_entry e;
		int got = ldc_entry(&f[0], i, &e), replaced = 0;
		if (got < 0)
			goto bad;
		for (size_t s = 0; got && s < nadded && !replaced; s++)
			replaced = all[s].flags == e.flags && strcmp(all[s].name, e.name) == 0;
		if (got && !replaced) {
			e.order = i;
			e.from = 0;
			all[n++] = e;
		}
	}
	qsort(all, n, sizeof *all, ldc_order);
	size_t table = LDC_HEADER + n * LDC_ENTRY;
	if (table + room > UINT32_MAX || !(buf = malloc(table + room)))
		goto bad;
	size_t strings = ldc_strings(all, n, f, refs, buf + table, table);
	memset(buf, 0, LDC_HEADER);
	memcpy(buf, LDC_MAGIC, strlen(LDC_MAGIC));
	uint32_t head[2] = { (uint32_t)n, (uint32_t)strings };
	memcpy(buf + 20, head, sizeof head);
	buf[28] = 2; /* little-endian */
	for (size_t i = 0; i < n; i++) {
		char *p = buf + LDC_HEADER + i * LDC_ENTRY;
		uint32_t osversion = 0;
		memcpy(p, &all[i].flags, 4);
		memcpy(p + 4, &all[i].key, 4);
		memcpy(p + 8, &all[i].value, 4);
		memcpy(p + 12, &osversion, 4);
		memcpy(p + 16, &all[i].hwcap, 8);
	}
	*out = buf;
	*outlen = table + strings;
	free(all);
	free(refs);
	return 0;
bad:
	free(all);
	free(refs);
	free(buf);
	return -1;
}

/* The new cache of `image` and `stage` (the stage's own cache): ldc_merge_parts. */
static int ldc_merge(const char *image, size_t ilen, const char *stage, size_t slen, char **out,
		     size_t *outlen)
{
	return ldc_merge_parts(image, ilen, &stage, &slen, 1, out, outlen);
}
