// memcpy baseline of the `shm` suite (bench/suites/shm.ts): what one CPU copying memory to
// memory does, the ceiling of a transport that moves each byte with one copy.
//
// One thread copies BLOCK-byte blocks from a private source to a private destination, each
// WORKING_SET bytes (mmap'd, pre-touched before anything is timed), block after block
// through the whole working set and around again (block i: src + i*BLOCK -> dst + i*BLOCK),
// as the engine's 1 MiB requests cycle through its working set. Time-bounded: WARMUP
// seconds first, then SECONDS measured. GB/s = bytes copied / seconds / 1e9 (payload, as
// the engine's figures; DRAM traffic is about twice that: read src + write dst).
//
// With --shuffle L,R the blocks are the working set's BLOCK-sized pages in two seeded
// shuffles instead (block i: src + l[i]*BLOCK -> dst + r[i]*BLOCK, l and r the shuffles of
// seeds L and R), the stream of the `blocks` suite (bench/suites/blocks.ts, same LCG).
//
// With --threads N, N threads copy at once, each through a source and a destination of its
// own (WORKING_SET bytes each, pre-touched by the main thread, as the engine's regions are
// by its JS thread), block after block, from a common start to a common deadline; GB/s =
// all threads' bytes / (last thread's end - first thread's start). This is the `scale`
// suite's baseline (bench/suites/scale.ts). Its loop reads the clock once per 64 KiB
// copied rather than once per block, so that a 4 KiB block's copy is not measured with a
// clock read beside it; the one-thread form above keeps its loop as it was.
//
//   memcpy_bench [--shuffle L,R | --threads N] WORKING_SET BLOCK SECONDS [WARMUP]
//                                                     one run: one JSON line, then exit
//   memcpy_bench [--threads N] WORKING_SET BLOCK      serve: prints {"ready":...} once the
//       buffers are touched, then answers each stdin line "run SECONDS WARMUP" with one JSON
//       line {"gbps","bytes","seconds","blocks"} (with --threads also "threads",
//       "thread_gbps_min", "thread_gbps_max"); exits at EOF or on "exit"
//
// Build: gcc -O2 -pthread -o memcpy_bench memcpy_bench.c   (the suites compile it at run time)
// Adapted from /work/shared/baselines/memcpy_bench.c (same copy loop; time-bounded, one
// thread, one working set, JSON out).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static char *src, *dst;
static size_t ws, bs, off;
// The shuffled pages (--shuffle), or NULL for block after block.
static uint32_t *lpage, *rpage;
static size_t pages, at;

// A seeded shuffle of 0..n-1: the blocks suite's (Math.imul LCG, Fisher-Yates from the top).
static uint32_t *shuffled(size_t n, uint32_t seed) {
  uint32_t *a = malloc(n * sizeof *a);
  if (!a) return NULL;
  for (size_t i = 0; i < n; i++) a[i] = (uint32_t)i;
  uint32_t x = seed ? seed : 1;
  for (size_t i = n - 1; i > 0; i--) {
    x = x * 1103515245u + 12345u;
    size_t j = x % (i + 1);
    uint32_t t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
  return a;
}

// Copies blocks until `seconds` have passed; returns bytes copied, sets *secs.
static size_t copy_for(double seconds, double *secs) {
  size_t bytes = 0;
  double t0 = now(), t1 = t0, end = t0 + seconds;
  if (seconds <= 0) {
    *secs = 0;
    return 0;
  }
  for (;;) {
    if (lpage) {
      memcpy(dst + (size_t)rpage[at] * bs, src + (size_t)lpage[at] * bs, bs);
      if (++at == pages) at = 0;
    } else {
      memcpy(dst + off, src + off, bs);
      off += bs;
      if (off + bs > ws) off = 0;
    }
    __asm__ volatile("" ::: "memory");
    bytes += bs;
    t1 = now();  // ~20 ns against ~100 us per 1 MiB block
    if (t1 >= end) break;
  }
  *secs = t1 - t0;
  return bytes;
}

// --threads: one worker's buffers and what its last run measured.
struct worker {
  pthread_t tid;
  char *src, *dst;
  size_t off;
  size_t bytes;
  double t_first, t_last;
};
static struct worker *workers;
static size_t nthreads;
static double warm_end, run_end;
// Raised when a run cannot start all its workers: the ones started stop at their next clock
// read and are joined, and main reports the failure (no thread ends the process).
static atomic_int abandon;

// Copies `n` blocks of a worker's buffers, block after block through its working set.
static void copy_blocks(struct worker *w, size_t n) {
  for (size_t i = 0; i < n; i++) {
    memcpy(w->dst + w->off, w->src + w->off, bs);
    w->off += bs;
    if (w->off + bs > ws) w->off = 0;
    __asm__ volatile("" ::: "memory");
  }
}

// One worker's run: untimed copies until warm_end, then counted ones until run_end.
static void *work(void *arg) {
  struct worker *w = arg;
  // Blocks between clock reads: at least 64 KiB, so the read (~20 ns) stays out of the figure.
  size_t stride = bs >= 65536 ? 1 : 65536 / bs;
  double t = now();
  while (t < warm_end && !atomic_load_explicit(&abandon, memory_order_relaxed)) {
    copy_blocks(w, stride);
    t = now();
  }
  w->t_first = t;
  w->bytes = 0;
  while (t < run_end && !atomic_load_explicit(&abandon, memory_order_relaxed)) {
    copy_blocks(w, stride);
    w->bytes += stride * bs;
    t = now();
  }
  w->t_last = t;
  return NULL;
}

// Runs the workers; 0, or -1 (reported on stdout) when one could not be started.
static int run_threads(double seconds, double warmup) {
  // A short lead lets every thread reach the start before the (untimed) warm-up ends.
  warm_end = now() + 0.005 + warmup;
  run_end = warm_end + seconds;
  atomic_store(&abandon, 0);
  for (size_t i = 0; i < nthreads; i++) {
    if (pthread_create(&workers[i].tid, NULL, work, &workers[i]) != 0) {
      atomic_store(&abandon, 1);
      for (size_t j = 0; j < i; j++) pthread_join(workers[j].tid, NULL);
      printf("{\"error\":\"pthread_create failed\"}\n");
      fflush(stdout);
      return -1;
    }
  }
  for (size_t i = 0; i < nthreads; i++) pthread_join(workers[i].tid, NULL);
  size_t bytes = 0;
  double first = workers[0].t_first, last = workers[0].t_last, tmin = 0, tmax = 0;
  for (size_t i = 0; i < nthreads; i++) {
    struct worker *w = &workers[i];
    double rate = w->t_last > w->t_first ? w->bytes / (w->t_last - w->t_first) / 1e9 : 0;
    if (i == 0 || rate < tmin) tmin = rate;
    if (i == 0 || rate > tmax) tmax = rate;
    if (w->t_first < first) first = w->t_first;
    if (w->t_last > last) last = w->t_last;
    bytes += w->bytes;
  }
  double s = last - first;
  printf("{\"gbps\":%.4f,\"bytes\":%zu,\"seconds\":%.4f,\"blocks\":%zu,\"threads\":%zu,"
         "\"thread_gbps_min\":%.4f,\"thread_gbps_max\":%.4f}\n",
         s > 0 ? bytes / s / 1e9 : 0, bytes, s, bytes / bs, nthreads, tmin, tmax);
  fflush(stdout);
  return 0;
}

// Maps one pre-touched buffer of `ws` bytes filled with `fill`; NULL (reported) when it cannot.
static char *touched(int fill) {
  char *p = mmap(NULL, ws, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return NULL;
  }
  memset(p, fill, ws);  // every page faulted in before anything is timed
  return p;
}

// One measured run; 0, or -1 when it could not be made (reported on stdout).
static int run(double seconds, double warmup) {
  if (nthreads) return run_threads(seconds, warmup);
  double s;
  copy_for(warmup, &s);
  size_t bytes = copy_for(seconds, &s);
  printf("{\"gbps\":%.4f,\"bytes\":%zu,\"seconds\":%.4f,\"blocks\":%zu}\n", bytes / s / 1e9, bytes, s, bytes / bs);
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  unsigned lseed = 0, rseed = 0;
  if (argc > 2 && strcmp(argv[1], "--threads") == 0) {
    nthreads = strtoull(argv[2], 0, 0);
    if (nthreads < 1 || nthreads > 4096) {
      fprintf(stderr, "memcpy_bench: --threads needs 1..4096\n");
      return 2;
    }
    argv += 2;
    argc -= 2;
  }
  int shuffle = argc > 2 && strcmp(argv[1], "--shuffle") == 0;
  if (shuffle && nthreads) {
    fprintf(stderr, "memcpy_bench: --shuffle is for one thread (without --threads)\n");
    return 2;
  }
  if (shuffle) {
    if (sscanf(argv[2], "%u,%u", &lseed, &rseed) != 2) {
      fprintf(stderr, "memcpy_bench: --shuffle needs L,R (two seeds)\n");
      return 2;
    }
    argv += 2;
    argc -= 2;
  }
  if (argc < 3) {
    fprintf(stderr, "usage: %s [--shuffle L,R | --threads N] WORKING_SET BLOCK [SECONDS [WARMUP]]\n", argv[0]);
    return 2;
  }
  ws = strtoull(argv[1], 0, 0);
  bs = strtoull(argv[2], 0, 0);
  if (bs == 0 || ws < bs) {
    fprintf(stderr, "memcpy_bench: need 0 < BLOCK <= WORKING_SET\n");
    return 2;
  }
  if (nthreads) {
    workers = calloc(nthreads, sizeof *workers);
    if (!workers) {
      perror("calloc");
      return 1;
    }
    for (size_t i = 0; i < nthreads; i++) {
      workers[i].src = touched(0x5a);
      workers[i].dst = touched(0);
      if (!workers[i].src || !workers[i].dst) return 1;
    }
  } else {
    src = touched(0x5a);
    dst = touched(0);
    if (!src || !dst) return 1;
  }
  if (shuffle) {
    pages = ws / bs;
    lpage = shuffled(pages, lseed);
    rpage = shuffled(pages, rseed);
    if (!lpage || !rpage) {
      perror("malloc");
      return 1;
    }
  }
  if (argc > 3) {
    return run(atof(argv[3]), argc > 4 ? atof(argv[4]) : 0) == 0 ? 0 : 1;
  }
  printf("{\"ready\":true,\"working_set_bytes\":%zu,\"block_bytes\":%zu,\"threads\":%zu}\n", ws, bs, nthreads ? nthreads : 1);
  fflush(stdout);
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    double seconds = 0, warmup = 0;
    if (sscanf(line, "run %lf %lf", &seconds, &warmup) >= 1) {
      run(seconds, warmup);
    } else if (strncmp(line, "exit", 4) == 0) {
      break;
    } else if (line[0] != '\n') {
      printf("{\"error\":\"unknown command\"}\n");
      fflush(stdout);
    }
  }
  return 0;
}
