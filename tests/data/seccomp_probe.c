/* Loads a seccomp BPF program read from stdin, then tries ONE way of making a process (argv[1]).
   Prints "allowed" or "refused <errno>"; a bad-architecture syscall kills it with SIGSYS. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void *thread_fn(void *arg) { return arg; }

int main(int argc, char **argv) {
    static unsigned char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, stdin);
    struct sock_fprog prog = {.len = (unsigned short)(n / 8), .filter = (struct sock_filter *)buf};
    if (argc < 2 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        return 2;
    }
    const char *what = argv[1];
    long r = -1;
    errno = 0;
    if (!strcmp(what, "thread")) {
        pthread_t t;
        int e = pthread_create(&t, 0, thread_fn, 0);
        if (e == 0) {
            pthread_join(t, 0);
            printf("allowed\n");
            return 0;
        }
        printf("refused %d\n", e);
        return 0;
    } else if (!strcmp(what, "fork")) {
        r = syscall(SYS_fork);
    } else if (!strcmp(what, "vfork")) {
        r = syscall(SYS_vfork);
    } else if (!strcmp(what, "clone")) {
        r = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    } else if (!strcmp(what, "clone3")) {
        unsigned long long args[8] = {0};
        args[4] = SIGCHLD; /* exit_signal */
        r = syscall(435, args, sizeof args);
    } else if (!strcmp(what, "i386_fork")) {
        __asm__ volatile("int $0x80" : "=a"(r) : "a"(2L) : "memory"); /* i386 fork is 2 */
        if (r < 0 && r > -4096) {
            errno = (int)-r;
            r = -1;
        }
    } else if (!strcmp(what, "x32_fork")) {
        r = syscall(0x40000000L | 57); /* __X32_SYSCALL_BIT | fork */
    } else if (!strcmp(what, "memfd")) {
        r = syscall(SYS_memfd_create, "x", 0);
        if (r >= 0) {
            printf("allowed\n");
            return 0;
        }
    }
    if (r == 0) _exit(0); /* a child that should never have existed */
    if (r > 0) {
        waitpid((pid_t)r, 0, 0);
        printf("allowed\n");
        return 0;
    }
    printf("refused %d\n", errno);
    return 0;
}
