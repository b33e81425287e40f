/* What every libFuzzer harness of tests/fuzz/ shares: the product's one translation unit
 * (hook/cdihook.c, which includes hook/ldcache.c and hook/shimfront.c) included whole, as
 * built, with three changes made here by macros, none in the product's files:
 *
 *   - its main is renamed (libFuzzer has the main);
 *   - its hand-overs (to gpuctk-hook, or to the Python shim: an execv) jump back to the harness
 *     instead, through fuzz_back, so that one input that is handed over ends that input only;
 *   - its allocations are listed, so that what a hand-over leaves is freed after each input
 *     (the real program execs or exits there);
 *   - its reads into the heap (read_all()'s buffer) leave the part of the buffer that read()
 *     did not fill poisoned for AddressSanitizer, past the one byte read_all() ends the text
 *     with: a reader that goes beyond what the file held is a report, not a read of the
 *     buffer's unused room.
 *
 * Built by tests/security/test_fuzz_harnesses.py with clang -fsanitize=fuzzer,address,undefined,
 * -I hook/ and -I a folder holding gpuctk_vocab.h (hook/cvocab.py). */
#ifndef GPUCTK_FUZZ_H
#define GPUCTK_FUZZ_H
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <sanitizer/asan_interface.h>

static jmp_buf fuzz_back;
static int fuzz_armed;

/* the product's execv: back to the harness (armed), else a crash (a hand-over nobody expects) */
static int fuzz_execv(const char *path, char *const argv[])
{
	(void)path;
	(void)argv;
	if (!fuzz_armed)
		abort();
	longjmp(fuzz_back, 1);
}

/* the product's read(): what it did not fill poisoned, after one byte (a heap buffer only) */
static ssize_t fuzz_read(int fd, void *buf, size_t count)
{
	char kind[16];
	void *region = NULL;
	size_t size = 0;
	const char *where = __asan_locate_address(buf, kind, sizeof kind, &region, &size);
	int heap = where && strcmp(where, "heap") == 0;
	if (heap)
		ASAN_UNPOISON_MEMORY_REGION(buf, count);
	ssize_t got = read(fd, buf, count);
	size_t used = got > 0 ? (size_t)got : 0;
	if (heap && count > used + 1)
		ASAN_POISON_MEMORY_REGION((char *)buf + used + 1, count - used - 1);
	return got;
}

/* the product's live allocations */
#define FUZZ_LIVE 65536
static void *fuzz_live[FUZZ_LIVE];
static size_t fuzz_nlive;

static void *fuzz_keep(void *p)
{
	if (p && fuzz_nlive < FUZZ_LIVE)
		fuzz_live[fuzz_nlive++] = p;
	return p;
}

static void fuzz_drop(void *p)
{
	for (size_t i = fuzz_nlive; p && i-- > 0;)
		if (fuzz_live[i] == p) {
			fuzz_live[i] = fuzz_live[--fuzz_nlive];
			return;
		}
}

static void *fuzz_malloc(size_t n) { return fuzz_keep(malloc(n)); }
static void *fuzz_calloc(size_t n, size_t size) { return fuzz_keep(calloc(n, size)); }
static char *fuzz_strdup(const char *s) { return fuzz_keep(strdup(s)); }
static char *fuzz_strndup(const char *s, size_t n) { return fuzz_keep(strndup(s, n)); }
static void fuzz_free(void *p)
{
	fuzz_drop(p);
	free(p);
}
static void *fuzz_realloc(void *p, size_t n)
{
	void *q = realloc(p, n);
	if (q) {
		fuzz_drop(p);
		fuzz_keep(q);
	}
	return q;
}

/* Everything the product allocated for the last input and did not free (a hand-over's). */
static void fuzz_release(void)
{
	while (fuzz_nlive)
		free(fuzz_live[--fuzz_nlive]);
}

#define main gpuctk_main
#define execv fuzz_execv
#define read fuzz_read
#define malloc fuzz_malloc
#define calloc fuzz_calloc
#define realloc fuzz_realloc
#define free fuzz_free
#define strdup fuzz_strdup
#define strndup fuzz_strndup
#include "cdihook.c"
#undef main
#undef execv
#undef read
#undef malloc
#undef calloc
#undef realloc
#undef free
#undef strdup
#undef strndup

/* The input as the product's own readers hand it on: a buffer of exactly `size` bytes (a read
 * one byte past it is a report). */
static char *fuzz_copy(const uint8_t *data, size_t size)
{
	char *p = malloc(size ? size : 1);
	if (!p)
		abort();
	if (size)
		memcpy(p, data, size);
	return p;
}

/* Descriptors the product opened for one input and left open on a hand-over: every one at or
 * above `low` that was closed before (fuzz_fds_before). */
#define FUZZ_FDS 256
static int fuzz_low;
static unsigned char fuzz_open_before[FUZZ_FDS];

static void fuzz_fds_before(void)
{
	fuzz_low = dup(0);
	if (fuzz_low < 0)
		abort();
	close(fuzz_low);
	for (int i = 0; i < FUZZ_FDS; i++)
		fuzz_open_before[i] = fcntl(fuzz_low + i, F_GETFD) != -1;
}

static void fuzz_fds_after(void)
{
	for (int i = 0; i < FUZZ_FDS; i++)
		if (!fuzz_open_before[i] && fcntl(fuzz_low + i, F_GETFD) != -1)
			close(fuzz_low + i);
}

#endif
