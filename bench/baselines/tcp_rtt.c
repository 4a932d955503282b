// Round-trip baseline of the `tcp` suite (bench/suites/tcp-rtt.ts): what one small request
// and its answer cost over a loopback TCP connection with nothing in between, the floor of
// a transport that sends a 4 KiB WRITE and waits for its acknowledgement.
//
// Two processes (fork), as Ferry's initiator and target are: a server that answers each
// REQUEST-byte request with ANSWER bytes, and a client that sends a request, waits for the
// whole answer, and times that, one request at a time. Two processes rather than two
// threads because a wake-up across processes (another address space, another mm for the
// scheduler) is what Ferry pays; threads of one process would flatter the floor. Both
// sockets have TCP_NODELAY.
//
// How the client waits for the answer:
//   blocking (default)  plain blocking read() until the answer is in (sleeps in the kernel;
//                        the answer's arrival wakes it)
//   --poll               a non-blocking socket, busy-polled with recv(MSG_DONTWAIT) until
//                        the answer is in (never sleeps: no wake-up on the client's side)
// The server always waits in a blocking read(), as Ferry's target waits in epoll.
//
// Time-bounded: WARMUP seconds of untimed round trips, then SECONDS timed ones. Prints one
// JSON line: {"mode","ops","seconds","avg_us","p50_us","p99_us","min_us","max_us",
// "request_bytes","answer_bytes","processes"}; on failure {"error": "..."} and exit 1.
//
//   tcp_rtt [--poll] SECONDS [WARMUP [REQUEST_BYTES [ANSWER_BYTES]]]   (4096 and 16 by default)
//
// Build: cc -O2 -o tcp_rtt tcp_rtt.c   (the suite compiles it at run time)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Reports what failed (with errno) as the run's JSON line; main returns its result (1).
static int failed(const char *what) {
  printf("{\"error\":\"%s: %s\"}\n", what, strerror(errno));
  fflush(stdout);
  return 1;
}

static int fcntl_nonblock(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static int nodelay(int fd) {
  int one = 1;
  return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Writes all `len` bytes; on a non-blocking socket it retries while the send buffer is full.
static int send_all(int fd, const char *p, size_t len) {
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

// Reads exactly `len` bytes, sleeping in read(). 0 on success, 1 at EOF, -1 on error.
static int recv_blocking(int fd, char *p, size_t len) {
  while (len > 0) {
    ssize_t n = read(fd, p, len);
    if (n == 0) return 1;
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

// Reads exactly `len` bytes by spinning on recv(MSG_DONTWAIT). 0, 1 at EOF, -1 on error.
static int recv_polling(int fd, char *p, size_t len) {
  while (len > 0) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n == 0) return 1;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

// The server (the forked child; its main returns what this returns): answers every request
// until the client closes the connection.
static int serve(int listener, size_t req, size_t ans) {
  int fd = accept(listener, NULL, NULL);
  if (fd < 0) return 1;
  close(listener);
  if (nodelay(fd) != 0) return 1;
  char *in = malloc(req), *out = calloc(1, ans);
  if (!in || !out) return 1;
  while (recv_blocking(fd, in, req) == 0) {
    if (send_all(fd, out, ans) != 0) break;
  }
  return 0;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int poll_mode = argc > 1 && strcmp(argv[1], "--poll") == 0;
  if (poll_mode) {
    argv++;
    argc--;
  }
  if (argc < 2) {
    fprintf(stderr, "usage: %s [--poll] SECONDS [WARMUP [REQUEST_BYTES [ANSWER_BYTES]]]\n", argv[0]);
    return 2;
  }
  double seconds = atof(argv[1]);
  double warmup = argc > 2 ? atof(argv[2]) : 0;
  size_t req = argc > 3 ? strtoull(argv[3], 0, 0) : 4096;
  size_t ans = argc > 4 ? strtoull(argv[4], 0, 0) : 16;
  if (!(seconds > 0) || warmup < 0 || req == 0 || ans == 0) {
    fprintf(stderr, "tcp_rtt: need SECONDS > 0, WARMUP >= 0, sizes > 0\n");
    return 2;
  }

  int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return failed("socket");
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof addr;
  if (bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0) return failed("bind");
  if (listen(listener, 1) != 0) return failed("listen");
  if (getsockname(listener, (struct sockaddr *)&addr, &alen) != 0) return failed("getsockname");

  fflush(stdout);  // nothing buffered for the child to print again when it returns
  pid_t server = fork();
  if (server < 0) return failed("fork");
  if (server == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the client
    return serve(listener, req, ans);
  }
  close(listener);

  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return failed("socket");
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) return failed("connect");
  if (nodelay(fd) != 0) return failed("setsockopt TCP_NODELAY");
  if (poll_mode && fcntl_nonblock(fd) != 0) return failed("fcntl O_NONBLOCK");

  char *out = calloc(1, req), *in = malloc(ans);
  size_t cap = 1 << 20, ops = 0;
  double *us = malloc(cap * sizeof *us);
  if (!out || !in || !us) return failed("malloc");
  int (*wait_answer)(int, char *, size_t) = poll_mode ? recv_polling : recv_blocking;

  double t = now(), warm_end = t + warmup, end = warm_end + seconds, t_first = 0;
  int timed = 0;
  for (;;) {
    double t0 = now();
    if (!timed && t0 >= warm_end) {
      timed = 1;
      t_first = t0;
    }
    if (timed && t0 >= end) break;
    if (send_all(fd, out, req) != 0) return failed("send");
    int r = wait_answer(fd, in, ans);
    if (r != 0) {
      if (r > 0) errno = ECONNRESET;
      return failed("recv");
    }
    double t1 = now();
    if (!timed) continue;
    if (ops == cap) {
      cap *= 2;
      us = realloc(us, cap * sizeof *us);
      if (!us) return failed("realloc");
    }
    us[ops++] = (t1 - t0) * 1e6;
  }
  double elapsed = now() - t_first;
  close(fd);
  waitpid(server, NULL, 0);
  if (ops == 0) {
    printf("{\"error\":\"no round trip completed\"}\n");
    return 1;
  }

  double sum = 0;
  for (size_t i = 0; i < ops; i++) sum += us[i];
  qsort(us, ops, sizeof *us, by_value);
  // Nearest rank: the smallest sample with at least p of the samples at or below it.
  size_t p50 = (ops * 50 + 99) / 100, p99 = (ops * 99 + 99) / 100;
  printf("{\"mode\":\"%s\",\"ops\":%zu,\"seconds\":%.4f,\"avg_us\":%.3f,\"p50_us\":%.3f,\"p99_us\":%.3f,"
         "\"min_us\":%.3f,\"max_us\":%.3f,\"request_bytes\":%zu,\"answer_bytes\":%zu,\"processes\":2}\n",
         poll_mode ? "polling" : "blocking", ops, elapsed, sum / ops, us[p50 - 1], us[p99 - 1], us[0], us[ops - 1],
         req, ans);
  return 0;
}
