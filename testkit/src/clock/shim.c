/* The clock nemesis: an LD_PRELOAD shim that gives one redis-server a wall clock of its own,
 * stepped or sped up by a test, while its monotonic clock stays real (testkit/src/clock.rs).
 * Debian's libfaketime 0.9.10 stops redis-server 7.0 at start-up with a recursive
 * clock_gettime; this shim reads the real clocks with the raw system call instead, so it needs
 * nothing from the dynamic linker.
 *
 * The control file (REDLOCK_CLOCK_FILE) holds "<anchor ns> <offset ns> <rate>": the wall clock
 * shown is real + offset + (real - anchor) * (rate - 1) from the anchor on (real + offset
 * before it). The test replaces the file whole (rename), and the shim reads it at most once
 * per millisecond of the real monotonic clock. Without the variable or the file, the clock is
 * real. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long anchor_ns, offset_ns, checked_ns = -1000000000LL;
static double rate = 1.0;

static long long real_ns(clockid_t id) {
    struct timespec ts;
    syscall(SYS_clock_gettime, id, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void refresh(void) {
    long long mono = real_ns(CLOCK_MONOTONIC);
    if (mono - checked_ns < 1000000LL) return;
    checked_ns = mono;
    const char *path = getenv("REDLOCK_CLOCK_FILE");
    if (!path) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[128];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    long long a, o;
    double r;
    if (sscanf(buf, "%lld %lld %lf", &a, &o, &r) == 3 && r > 0) {
        anchor_ns = a;
        offset_ns = o;
        rate = r;
    }
}

static long long fake_ns(void) {
    refresh();
    long long real = real_ns(CLOCK_REALTIME);
    long long shown = real + offset_ns;
    if (real > anchor_ns) shown += (long long)((double)(real - anchor_ns) * (rate - 1.0));
    return shown;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (id != CLOCK_REALTIME && id != CLOCK_REALTIME_COARSE)
        return (int)syscall(SYS_clock_gettime, id, ts);
    long long ns = fake_ns();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    long long ns = fake_ns();
    tv->tv_sec = ns / 1000000000LL;
    tv->tv_usec = (ns % 1000000000LL) / 1000;
    return 0;
}

time_t time(time_t *out) {
    time_t t = (time_t)(fake_ns() / 1000000000LL);
    if (out) *out = t;
    return t;
}
