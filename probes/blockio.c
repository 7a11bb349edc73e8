/*
 * blockio.c - block-layer request profile, aggregated in the kernel.
 *
 * Purpose:     per (device, direction): exact request-size counts, log2 size
 *              histogram, issue->complete latency (log-linear, ns), in-flight
 *              depth at issue, sequential vs random, metadata requests, and
 *              per-interval request/byte counters for a timeline.
 * Tracepoints: block:block_rq_issue, block:block_rq_complete (no kprobes).
 * Units:       sizes in bytes (issue's `bytes` field), latency in ns, depth in
 *              requests, timeline buckets of BUCKET_NS from T0_NS
 *              (CLOCK_MONOTONIC, same clock as bpf_ktime_get_ns).
 * Options:     -DFILTER_DEVS (only devices present in `dev_filter`),
 *              -DT0_NS=<u64>, -DBUCKET_NS=<u64>, -DMAX_SIZES=<n>,
 *              -DMAX_INFLIGHT=<n>, -DMAX_BUCKETS=<n>.
 * Overhead:    two hash updates per event on the filtered path; an event for a
 *              device outside the filter costs one hash lookup. Measured in
 *              benchmarks/trace_overhead.py (docs/benchmarks.md).
 * Exactness:   nothing is sampled; anything that cannot be recorded because a
 *              map is full is counted in `drops`, which iotune reports.
 */
#include <uapi/linux/ptrace.h>
#include "blockio.h"

#ifndef T0_NS
#define T0_NS 0
#endif
#ifndef BUCKET_NS
#define BUCKET_NS 1000000000ULL
#endif
#ifndef MAX_SIZES
#define MAX_SIZES 16384
#endif
#ifndef MAX_INFLIGHT
#define MAX_INFLIGHT 65536
#endif
#ifndef MAX_BUCKETS
#define MAX_BUCKETS 65536
#endif

BPF_HASH(dev_filter, u32, u8, 1024);
BPF_HASH(sizes, struct size_key_t, u64, MAX_SIZES);
BPF_HASH(size_log2, struct slot_key_t, u64, 4096);
BPF_HASH(lat_slots, struct slot_key_t, u64, 16384);
BPF_HASH(depth_hist, struct slot_key_t, u64, 16384);
BPF_HASH(totals, struct dev_op_t, struct totals_t, 4096);
BPF_HASH(timeline, struct time_key_t, struct time_val_t, MAX_BUCKETS);
BPF_HASH(start, struct start_key_t, struct start_val_t, MAX_INFLIGHT);
BPF_HASH(inflight, u32, s64, 1024);
BPF_HASH(last_end, u32, u64, 1024);
BPF_ARRAY(drops, u64, DROP_SLOTS);

static __always_inline void count_drop(int why)
{
    u64 *d = drops.lookup(&why);
    if (d)
        __sync_fetch_and_add(d, 1);
}

static __always_inline int wanted(u32 dev)
{
#ifdef FILTER_DEVS
    return dev_filter.lookup(&dev) != 0;
#else
    return 1;
#endif
}

static __always_inline u32 op_of(const char *rwbs)
{
    int i = 0;
    /* a leading F followed by an op letter is REQ_PREFLUSH, not the op */
    if (rwbs[0] == 'F' && (rwbs[1] == 'W' || rwbs[1] == 'R' || rwbs[1] == 'D' ||
                           rwbs[1] == 'F' || rwbs[1] == 'N'))
        i = 1;
    switch (rwbs[i]) {
    case 'R': return OP_READ;
    case 'W': return OP_WRITE;
    case 'F': return OP_FLUSH;
    case 'D': return OP_DISCARD;
    }
    return OP_OTHER;
}

static __always_inline int has_meta(const char *rwbs)
{
#pragma unroll
    for (int i = 1; i < 8; i++) {
        if (rwbs[i] == 0)
            return 0;
        if (rwbs[i] == 'M')
            return 1;
    }
    return 0;
}

static __always_inline u32 lat_slot(u64 v)
{
    if (v < LAT_SUB)
        return v;
    u32 l = bpf_log2l(v) - 1;   /* bcc's bpf_log2l(v) is floor(log2 v) + 1 */
    return LAT_SUB + (l - LAT_SUB_BITS) * LAT_SUB + ((v >> (l - LAT_SUB_BITS)) & (LAT_SUB - 1));
}


TRACEPOINT_PROBE(block, block_rq_issue)
{
    u32 dev = args->dev;
    if (!wanted(dev))
        return 0;
    u64 now = bpf_ktime_get_ns();
    u32 op = op_of(args->rwbs);
    u32 bytes = args->bytes;
    u64 sector = args->sector;
    u64 zero = 0;

    struct size_key_t sk = {.dev = dev, .op = op, .size_bytes = bytes};
    u64 *c = sizes.lookup_or_try_init(&sk, &zero);
    if (c)
        __sync_fetch_and_add(c, 1);
    else
        count_drop(DROP_SIZES);

    struct slot_key_t lk = {.dev = dev, .op = op, .slot = bpf_log2l(bytes)};   /* 0 for 0 bytes; k: [2^(k-1), 2^k) */
    c = size_log2.lookup_or_try_init(&lk, &zero);
    if (c)
        __sync_fetch_and_add(c, 1);
    else
        count_drop(DROP_OTHER);

    /* in-flight depth on this device, this request included */
    s64 szero = 0;
    s64 *inf = inflight.lookup_or_try_init(&dev, &szero);
    s64 depth = 1;
    if (inf)
        depth = __sync_fetch_and_add(inf, 1) + 1;
    struct slot_key_t dk = {.dev = dev, .op = op, .slot = depth > 0 ? depth : 0};
    c = depth_hist.lookup_or_try_init(&dk, &zero);
    if (c)
        __sync_fetch_and_add(c, 1);
    else
        count_drop(DROP_OTHER);

    struct dev_op_t tk = {.dev = dev, .op = op};
    struct totals_t tzero = {};
    struct totals_t *t = totals.lookup_or_try_init(&tk, &tzero);
    if (t) {
        __sync_fetch_and_add(&t->requests, 1);
        __sync_fetch_and_add(&t->bytes, bytes);
        if (has_meta(args->rwbs))
            __sync_fetch_and_add(&t->meta, 1);
        if (bytes) {
            u64 *prev = last_end.lookup(&dev);
            if (prev && *prev == sector)
                __sync_fetch_and_add(&t->sequential, 1);
        }
    } else {
        count_drop(DROP_OTHER);
    }
    if (bytes) {
        u64 end = sector + (bytes >> 9);
        last_end.update(&dev, &end);
    }

    struct time_key_t ck = {.dev = dev, .op = op,
                            .bucket = now > T0_NS ? (now - T0_NS) / BUCKET_NS : 0};
    struct time_val_t vzero = {};
    struct time_val_t *tv = timeline.lookup_or_try_init(&ck, &vzero);
    if (tv) {
        __sync_fetch_and_add(&tv->requests, 1);
        __sync_fetch_and_add(&tv->bytes, bytes);
    } else {
        count_drop(DROP_TIMELINE);
    }

    struct start_key_t stk = {.dev = dev, .sector = sector};
    struct start_val_t sv = {.ts_ns = now, .op = op};
    if (start.update(&stk, &sv) != 0)
        count_drop(DROP_START);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
    u32 dev = args->dev;
    if (!wanted(dev))
        return 0;
    struct start_key_t stk = {.dev = dev, .sector = args->sector};
    struct start_val_t *sv = start.lookup(&stk);
    if (!sv)
        return 0;   /* issued before tracing began, or its start was dropped */
    u64 now = bpf_ktime_get_ns();
    u64 delta = now > sv->ts_ns ? now - sv->ts_ns : 0;
    u32 op = sv->op;
    start.delete(&stk);

    s64 *inf = inflight.lookup(&dev);
    if (inf)
        __sync_fetch_and_add(inf, -1);

    u64 zero = 0;
    struct slot_key_t lk = {.dev = dev, .op = op, .slot = lat_slot(delta)};
    u64 *c = lat_slots.lookup_or_try_init(&lk, &zero);
    if (c)
        __sync_fetch_and_add(c, 1);
    else
        count_drop(DROP_OTHER);

    struct dev_op_t tk = {.dev = dev, .op = op};
    struct totals_t *t = totals.lookup(&tk);
    if (t) {
        __sync_fetch_and_add(&t->completed, 1);
        __sync_fetch_and_add(&t->lat_sum_ns, delta);
        if (args->error)
            __sync_fetch_and_add(&t->errors, 1);
    }
    return 0;
}
