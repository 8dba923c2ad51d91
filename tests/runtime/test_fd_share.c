/*
 * Descriptors handed between processes over refit's abstract Unix socket
 * (runtime/src/device/fd_share.h), the way a trainer's VMM allocations reach a
 * zero-copy generator without ptrace rights (issue: pidfd_getfd is refused
 * under Yama ptrace_scope 1 and in containers). A parent serves a memfd of
 * fresh random bytes; forked children fetch it and must read exactly those
 * bytes; a descriptor the server does not share is refused by name, a
 * process that serves nothing is named, and a child of another uid (when
 * the test runs as root) gets nothing.
 */
#include "device/fd_share.h"

#include "core/error.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

enum { kBytes = 1 << 16 };
static int shared_fd = -1;
static unsigned char want[kBytes];

static int only_shared(int fd) { return fd == shared_fd; }

/* Run `body` in a child; its exit status. */
static int in_child(int (*body)(void)) {
  fflush(NULL);
  const pid_t pid = fork();
  if (pid == 0)
    _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

static int fetch_and_read(void) {
  int fd = -1;
  if (refit_fd_fetch((int)getppid(), shared_fd, 5.0, &fd) != REFIT_OK) {
    fprintf(stderr, "fetch: %s\n", refit_last_error());
    return 1;
  }
  unsigned char *p = mmap(NULL, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return 2;
  return memcmp(p, want, kBytes) == 0 ? 0 : 3;
}

static int fetch_unshared(void) {
  int fd = -1;
  const refit_status_t st = refit_fd_fetch((int)getppid(), 0, 5.0, &fd);
  return st == REFIT_ERR_PEER && strstr(refit_last_error(), "did not hand over") ? 0 : 1;
}

static int fetch_from_nobody(void) {
  int fd = -1;
  /* pid 1 serves no refit descriptors */
  const refit_status_t st = refit_fd_fetch(1, 3, 2.0, &fd);
  return st == REFIT_ERR_PEER &&
                 strstr(refit_last_error(), "serves no memory descriptors")
             ? 0
             : 1;
}

static int fetch_as_other_user(void) {
  if (setgid(65534) != 0 || setuid(65534) != 0)
    return 4;
  int fd = -1;
  return refit_fd_fetch((int)getppid(), shared_fd, 3.0, &fd) == REFIT_ERR_PEER ? 0 : 1;
}

/* As refit's old path did: pidfd_getfd, which needs leave to ptrace. */
static int pidfd_take(int pid, int fd) {
  const int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  const int local = pidfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
  if (pidfd >= 0)
    close(pidfd);
  return local;
}

/* A server that may not be ptraced (not dumpable, as under Yama or in a
 * container): pidfd_getfd is refused, the socket still hands the memory
 * over. Both sides an unprivileged user. */
static int fetch_without_ptrace(void) {
  if (setgid(65534) != 0 || setuid(65534) != 0)
    return 4;
  prctl(PR_SET_DUMPABLE, 0);
  if (refit_fd_serve(only_shared) != REFIT_OK)
    return 5;
  fflush(NULL);
  const pid_t pid = fork();
  if (pid == 0) {
    if (pidfd_take((int)getppid(), shared_fd) >= 0)
      _exit(6); /* ptrace was allowed after all: the case proves nothing */
    _exit(fetch_and_read());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

static void test_fd_share(void **state) {
  (void)state;
  srand((unsigned)time(NULL) ^ (unsigned)getpid());
  for (int i = 0; i < kBytes; i++)
    want[i] = (unsigned char)rand();
  shared_fd = memfd_create("refit-fd-share-test", MFD_CLOEXEC);
  assert_true(shared_fd >= 0);
  assert_int_equal(ftruncate(shared_fd, kBytes), 0);
  assert_int_equal(pwrite(shared_fd, want, kBytes, 0), kBytes);
  assert_int_equal(refit_fd_serve(only_shared), REFIT_OK);
  assert_int_equal(refit_fd_serve(only_shared), REFIT_OK); /* again: a no-op */
  assert_int_equal(in_child(fetch_and_read), 0);
  assert_int_equal(in_child(fetch_and_read), 0); /* the server goes on */
  assert_int_equal(in_child(fetch_unshared), 0);
  assert_int_equal(in_child(fetch_from_nobody), 0);
  if (geteuid() == 0) {
    assert_int_equal(in_child(fetch_as_other_user), 0);
    assert_int_equal(in_child(fetch_without_ptrace), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_fd_share)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
