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
//   memcpy_bench [--shuffle L,R] WORKING_SET BLOCK SECONDS [WARMUP]
//                                                     one run: one JSON line, then exit
//   memcpy_bench WORKING_SET BLOCK                    serve: prints {"ready":...} once the
//       buffers are touched, then answers each stdin line "run SECONDS WARMUP" with one JSON
//       line {"gbps","bytes","seconds","blocks"}; exits at EOF or on "exit"
//
// Build: gcc -O2 -o memcpy_bench memcpy_bench.c   (the suite compiles it at run time)
// Adapted from /work/shared/baselines/memcpy_bench.c (same copy loop; time-bounded, one
// thread, one working set, JSON out).
#define _GNU_SOURCE
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

static void run(double seconds, double warmup) {
  double s;
  copy_for(warmup, &s);
  size_t bytes = copy_for(seconds, &s);
  printf("{\"gbps\":%.4f,\"bytes\":%zu,\"seconds\":%.4f,\"blocks\":%zu}\n", bytes / s / 1e9, bytes, s, bytes / bs);
  fflush(stdout);
}

int main(int argc, char **argv) {
  unsigned lseed = 0, rseed = 0;
  int shuffle = argc > 2 && strcmp(argv[1], "--shuffle") == 0;
  if (shuffle) {
    if (sscanf(argv[2], "%u,%u", &lseed, &rseed) != 2) {
      fprintf(stderr, "memcpy_bench: --shuffle needs L,R (two seeds)\n");
      return 2;
    }
    argv += 2;
    argc -= 2;
  }
  if (argc < 3) {
    fprintf(stderr, "usage: %s [--shuffle L,R] WORKING_SET BLOCK [SECONDS [WARMUP]]\n", argv[0]);
    return 2;
  }
  ws = strtoull(argv[1], 0, 0);
  bs = strtoull(argv[2], 0, 0);
  if (bs == 0 || ws < bs) {
    fprintf(stderr, "memcpy_bench: need 0 < BLOCK <= WORKING_SET\n");
    return 2;
  }
  src = mmap(NULL, ws, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  dst = mmap(NULL, ws, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (src == MAP_FAILED || dst == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(src, 0x5a, ws);  // every page faulted in before anything is timed
  memset(dst, 0, ws);
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
    run(atof(argv[3]), argc > 4 ? atof(argv[4]) : 0);
    return 0;
  }
  printf("{\"ready\":true,\"working_set_bytes\":%zu,\"block_bytes\":%zu}\n", ws, bs);
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
