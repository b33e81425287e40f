/* nosyscall NR[:ERRNO][,NR...] PROGRAM [ARG...]: run PROGRAM with the listed system calls
 * failing with ENOSYS (or ERRNO: EPERM, a container engine's seccomp profile's answer), as on a
 * kernel that lacks them (a seccomp filter, installed after
 * PR_SET_NO_NEW_PRIVS, inherited by every child). The tests use it to run gpuctk's tools
 * down the paths they take on older kernels (openat2 before Linux 5.6, the mount API before
 * 5.2) without any switch in the product. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define MAX_CALLS 16

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: nosyscall NR[:ERRNO][,NR...] PROGRAM [ARG...]\n");
        return 2;
    }
    long calls[MAX_CALLS], errs[MAX_CALLS];
    int n = 0;
    for (char *tok = strtok(argv[1], ","); tok && n < MAX_CALLS; tok = strtok(NULL, ",")) {
        char *end;
        calls[n] = strtol(tok, &end, 10);
        errs[n++] = *end == ':' ? strtol(end + 1, NULL, 10) : ENOSYS;
    }
    struct sock_filter filter[3 + 2 * MAX_CALLS];
    int k = 0;
    filter[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                               offsetof(struct seccomp_data, nr));
    for (int i = 0; i < n; i++) {
        filter[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K,
                                                   (unsigned)calls[i], 0, 1);
        filter[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K,
                                                   SECCOMP_RET_ERRNO |
                                                   ((unsigned)errs[i] & SECCOMP_RET_DATA));
    }
    filter[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {.len = (unsigned short)k, .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("nosyscall: seccomp");
        return 2;
    }
    execv(argv[2], argv + 2);
    perror("nosyscall: execv");
    return 127;
}
