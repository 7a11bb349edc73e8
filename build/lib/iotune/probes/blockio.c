/*
 * blockio.c - block-layer request profile, aggregated in the kernel.
 *
 * Purpose:     per (device, direction): exact request-size counts, issue->
 *              complete latency (log-linear, ns), insert->issue queue time
 *              (the OS queue, as biolatency -Q adds), in-flight depth at issue,
 *              sequential vs random, metadata requests, and per-interval
 *              request/byte counters for a timeline (whose sums over
 *              intervals are the totals).
 * Tracepoints: block:block_rq_issue, block:block_rq_complete and
 *              block:block_rq_requeue (rare; releases a start time);
 *              block:block_rq_insert (a request entering the I/O scheduler's
 *              queue: its insert time) and block:block_rq_merge (a queued
 *              request merged into another and freed: its insert time is
 *              dropped); attached
 *              raw (no kprobes). A raw tracepoint program gets the struct request
 *              itself, not the formatted event: the request's address keys
 *              its start time (unique while in flight, unlike the sector),
 *              and the kernel does not skip it while another BPF program runs
 *              on the CPU, as it does for tracepoint programs (the issue
 *              program used to hide completions that way). The fields are
 *              those the tracepoint prints: dev = the disk's dev_t, sector (0
 *              for passthrough), bytes = the request's data length, op and
 *              REQ_META from cmd_flags.
 * Units:       sizes in bytes, latency in ns, depth in requests, timeline
 *              buckets of BUCKET_NS from T0_NS (CLOCK_MONOTONIC, the clock of
 *              bpf_ktime_get_ns).
 * Options:     kernel layout, from the running kernel's BTF (probe.py):
 *              -DRQ_Q_OFF, -DRQ_FLAGS_OFF, -DRQ_LEN_OFF, -DRQ_SECTOR_OFF,
 *              -DQ_DISK_OFF, -DDISK_MAJOR_OFF, -DDISK_MINOR_OFF,
 *              -DREQ_OP_BITS, -DREQ_META_BIT, -DKOP_<READ|WRITE|FLUSH|DISCARD|
 *              SECURE_ERASE|DRV_IN|DRV_OUT>. Device filter: -DNDEVS=<n>
 *              -DDEV_0=<dev_t> ... -DDEV_7: these devices, compared as
 *              constants (device index 0..n-1); -DFILTER_MAP -DNDEV_SLOTS=<n>:
 *              also those in `dev_ids` (dev -> index). No filter: every
 *              device, indexed in `dev_ids` on first sight, up to
 *              -DMAX_DEVS=<n>. -DT0_NS=<u64>, -DBUCKET_NS=<u64>,
 *              -DMAX_SIZES=<n>, -DMAX_INFLIGHT=<n> (start table slots, a
 *              power of two), -DMAX_BUCKETS=<n>.
 * Overhead:    counters are per-CPU (histograms and completion counters are
 *              array rows indexed by device and op, no atomics); the start
 *              time goes to a lock-free array table, not a hash map. Per
 *              issue: 3 reads of kernel memory (request, queue, disk), one
 *              per-CPU hash lookup (timeline bucket; a second, exact size,
 *              only for sizes not a multiple of 4 KiB up to 1 MiB), one atomic
 *              add (in flight) and one table slot; per completion: one table
 *              slot and one atomic add, no reads. An issue on a device outside
 *              the filter costs the 3 reads and a few compares; its
 *              completion, one table lookup. Measured with
 *              kernel.bpf_stats_enabled (2 vCPUs, 6.18, fio 4K random reads
 *              on a loop device; medians of 5 runs): ~380 ns per traced issue,
 *              ~120 ns per traced completion, ~210 / ~115 ns per issue /
 *              completion outside the filter: ~840 ns of BPF time per request
 *              on a loop device over virtio, whose disk is filtered out (was
 *              ~1,840 ns); ~480 ns on a loop device over tmpfs (was ~1,480).
 *              Details and end-to-end ratios: docs/benchmarks.md, "Tracing
 *              overhead (issue 2)".
 * Queue time:  a request that passes through the scheduler (mq-deadline,
 *              bfq, kyber) gets block_rq_insert, then block_rq_issue: queued,
 *              with an insert->issue sample. With no scheduler ("none") blk-mq
 *              mostly issues requests directly (no insert event): those count
 *              as not queued, and their queue time is not measured (it is the
 *              time between submission and dispatch, short without a
 *              scheduler). The insert time is a hash lookup per issue and an
 *              update per insert (`queued_at`, rq -> ns).
 * Exactness:   nothing is sampled; anything that cannot be recorded is counted
 *              in `drops` (blockio.h), which iotune reports together with the
 *              events the kernel did not run the programs for. A request
 *              issued while tracing gets a latency sample, or is counted in
 *              drops (start; no_completion once its struct is issued again),
 *              or was in flight when the maps were read. A request whose
 *              completion event never comes counts as in flight for depth
 *              until its struct is issued again (at most nr_requests of them).
 */
#include <uapi/linux/ptrace.h>
#include "blockio.h"

#if !defined(RQ_Q_OFF) || !defined(RQ_FLAGS_OFF) || !defined(RQ_LEN_OFF) || \
    !defined(RQ_SECTOR_OFF) || !defined(Q_DISK_OFF) || !defined(DISK_MAJOR_OFF) || \
    !defined(DISK_MINOR_OFF) || !defined(REQ_OP_BITS) || !defined(REQ_META_BIT)
#error "struct request layout missing: iotune/trace/probe.py passes it from the kernel's BTF"
#endif
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
#define MAX_INFLIGHT 16384
#endif
#ifndef MAX_BUCKETS
#define MAX_BUCKETS 65536
#endif
#ifndef NDEVS
#define NDEVS 0
#endif
#if NDEVS > 0 || defined(FILTER_MAP)
#define FILTERED 1
#ifndef NDEV_SLOTS
#define NDEV_SLOTS NDEVS
#endif
#else
#ifndef MAX_DEVS
#define MAX_DEVS 32
#endif
#define NDEV_SLOTS MAX_DEVS
#endif
#define NROWS (NDEV_SLOTS * NOPS)
#define START_BUCKETS (MAX_INFLIGHT / START_WAYS)
#define READ_ONCE_U64(x) (*(volatile u64 *)&(x))
/* struct request from its start to the end of the last field we read */
#define MAX2(a, b) ((a) > (b) ? (a) : (b))
#define RQ_SPAN (MAX2(MAX2(RQ_Q_OFF + 8, RQ_FLAGS_OFF + 4), MAX2(RQ_LEN_OFF + 4, RQ_SECTOR_OFF + 8)))
#define DISK_LO (DISK_MAJOR_OFF < DISK_MINOR_OFF ? DISK_MAJOR_OFF : DISK_MINOR_OFF)
#define DISK_SPAN (MAX2(DISK_MAJOR_OFF, DISK_MINOR_OFF) + 4 - DISK_LO)

#ifndef DEV_0
#define DEV_0 0
#endif
#ifndef DEV_1
#define DEV_1 0
#endif
#ifndef DEV_2
#define DEV_2 0
#endif
#ifndef DEV_3
#define DEV_3 0
#endif
#ifndef DEV_4
#define DEV_4 0
#endif
#ifndef DEV_5
#define DEV_5 0
#endif
#ifndef DEV_6
#define DEV_6 0
#endif
#ifndef DEV_7
#define DEV_7 0
#endif

/* Per-CPU hash values are allocated when a key first appears (a
 * preallocated per-CPU map costs max_entries * value size on every CPU). */
#define PERCPU_HASH(name, k, v, n) BPF_F_TABLE("percpu_hash", k, v, name, n, BPF_F_NO_PREALLOC)

#if !defined(FILTERED) || defined(FILTER_MAP)
BPF_HASH(dev_ids, u32, u32, NDEV_SLOTS);
#endif
#ifndef FILTERED
BPF_ARRAY(dev_count, u64, 1);
#endif
BPF_ARRAY(dev_state, struct dev_state_t, NDEV_SLOTS);
BPF_PERCPU_ARRAY(done, struct done_t, NROWS);
BPF_PERCPU_ARRAY(lat_hist, struct lat_row_t, NROWS);
BPF_PERCPU_ARRAY(queue_hist, struct lat_row_t, NROWS);
PERCPU_HASH(queue_overflow, struct slot_key_t, u64, 4096);
BPF_HASH(queued_at, u64, u64, MAX_INFLIGHT);   /* request address -> insert time (ns) */
BPF_PERCPU_ARRAY(depth_hist, struct depth_row_t, NROWS);
BPF_PERCPU_ARRAY(size_hist, struct size_row_t, NROWS);
PERCPU_HASH(lat_overflow, struct slot_key_t, u64, 4096);
PERCPU_HASH(depth_overflow, struct slot_key_t, u64, 16384);
PERCPU_HASH(sizes, struct size_key_t, u64, MAX_SIZES);
PERCPU_HASH(size_log2_overflow, struct slot_key_t, u64, 4096);   /* only when `sizes` is full */
PERCPU_HASH(timeline, struct time_key_t, struct time_val_t, MAX_BUCKETS);
/* mmapable: the value area is page-aligned, so buckets do not straddle more
 * cache lines than they must */
BPF_F_TABLE("array", u32, struct start_slot_t, start, MAX_INFLIGHT, BPF_F_MMAPABLE);
BPF_ARRAY(drops, u64, DROP_SLOTS);

static __always_inline void count_drop(int why)
{
    u64 *d = drops.lookup(&why);
    if (d)
        __sync_fetch_and_add(d, 1);
}

/* ---------------------------------------------------------------- devices */

/* Device index of a filtered (or, without a filter, already indexed) device, else -1. */
static __always_inline int known_dev_index(u32 dev)
{
#ifdef FILTERED
    if (NDEVS > 0 && dev == DEV_0) return 0;
    if (NDEVS > 1 && dev == DEV_1) return 1;
    if (NDEVS > 2 && dev == DEV_2) return 2;
    if (NDEVS > 3 && dev == DEV_3) return 3;
    if (NDEVS > 4 && dev == DEV_4) return 4;
    if (NDEVS > 5 && dev == DEV_5) return 5;
    if (NDEVS > 6 && dev == DEV_6) return 6;
    if (NDEVS > 7 && dev == DEV_7) return 7;
#endif
#if !defined(FILTERED) || defined(FILTER_MAP)
    u32 *i = dev_ids.lookup(&dev);
    if (i)
        return *i;
#endif
    return -1;
}

/* Device index for an issue: without a filter, a new device gets the next one. */
static __always_inline int dev_index(u32 dev)
{
    int i = known_dev_index(dev);
#ifndef FILTERED
    if (i >= 0)
        return i;
    u32 zero = 0;
    u64 *next = dev_count.lookup(&zero);
    if (!next)
        return -1;
    u64 n = __sync_fetch_and_add(next, 1);
    u32 idx = n;
    if (n >= MAX_DEVS) {
        count_drop(DROP_DEVICES);
        return -1;
    }
    if (dev_ids.insert(&dev, &idx) != 0) {   /* another CPU indexed it first: idx stays unused */
        u32 *p = dev_ids.lookup(&dev);
        return p ? *p : -1;
    }
    return idx;
#else
    return i;
#endif
}

/* ---------------------------------------------------------------- the request */

struct rq_info {
    u32 dev;
    u32 op;
    u32 bytes;
    u32 meta;
    u64 sector;
};

static __always_inline u32 op_of(u32 flags)
{
    u32 op = flags & ((1U << REQ_OP_BITS) - 1);
    if (op == KOP_READ)
        return OP_READ;
    if (op == KOP_WRITE)
        return OP_WRITE;
    if (op == KOP_FLUSH)
        return OP_FLUSH;
    if (op == KOP_DISCARD || op == KOP_SECURE_ERASE)
        return OP_DISCARD;
    return OP_OTHER;
}

/* What block:block_rq_issue would print for `rq`: 0, or -1 when rq is unreadable. */
static __always_inline int read_rq(void *rq, struct rq_info *r)
{
    u8 b[RQ_SPAN];
    if (bpf_probe_read_kernel(b, sizeof(b), rq))
        return -1;
    u64 q, sector;
    u32 flags, bytes;
    __builtin_memcpy(&q, b + RQ_Q_OFF, 8);
    __builtin_memcpy(&flags, b + RQ_FLAGS_OFF, 4);
    __builtin_memcpy(&bytes, b + RQ_LEN_OFF, 4);
    __builtin_memcpy(&sector, b + RQ_SECTOR_OFF, 8);
    u64 disk = 0;
    r->dev = 0;
    if (q && bpf_probe_read_kernel(&disk, sizeof(disk), (void *)(q + Q_DISK_OFF)) == 0 && disk) {
        u8 d[DISK_SPAN];
        if (bpf_probe_read_kernel(d, sizeof(d), (void *)(disk + DISK_LO)) == 0) {
            u32 major, minor;
            __builtin_memcpy(&major, d + DISK_MAJOR_OFF - DISK_LO, 4);
            __builtin_memcpy(&minor, d + DISK_MINOR_OFF - DISK_LO, 4);
            r->dev = major << 20 | minor;   /* MKDEV */
        }
    }
    u32 kop = flags & ((1U << REQ_OP_BITS) - 1);
    r->op = op_of(flags);
    r->bytes = bytes;
    r->meta = (flags >> REQ_META_BIT) & 1;
    /* blk_rq_trace_sector: 0 for passthrough and for an unset position */
    r->sector = (kop == KOP_DRV_IN || kop == KOP_DRV_OUT || sector == (u64)-1) ? 0 : sector;
    return 0;
}

static __always_inline u64 lat_slot(u64 v)
{
    if (v < LAT_SUB)
        return v;
    u64 l = bpf_log2l(v) - 1;   /* bcc's bpf_log2l(v) is floor(log2 v) + 1 */
    return LAT_SUB + (l - LAT_SUB_BITS) * LAT_SUB + ((v >> (l - LAT_SUB_BITS)) & (LAT_SUB - 1));
}

/* ---------------------------------------------------------------- start table */

static __always_inline u32 start_base(u64 rq)
{
    return ((u32)((rq * 0x9E3779B97F4A7C15ULL) >> 32) & (START_BUCKETS - 1)) * START_WAYS;
}

/* Undo the in-flight count of a start time that no completion will take. */
static __always_inline void undo_inflight(u32 di)
{
    struct dev_state_t *ds = dev_state.lookup(&di);
    if (ds)
        __sync_fetch_and_add(&ds->inflight, -1);
}

/* Keep the issue time of `rq`. 0: kept; -1: not kept (counted). */
static __always_inline int start_insert(u64 rq, u64 now, u32 di, struct rq_info *r)
{
    u32 base = start_base(rq);
    u32 free = 0;   /* bit i: slot i of the bucket is free */
#pragma unroll
    for (int i = 0; i < START_WAYS; i++) {
        u32 idx = base + i;
        struct start_slot_t *e = start.lookup(&idx);
        if (!e)
            continue;
        u64 ts = READ_ONCE_U64(e->ts);
        if (ts == TS_FREE) {
            free |= 1 << i;
        } else if (ts >= TS_VALID && READ_ONCE_U64(e->rq) == rq &&
                   __sync_val_compare_and_swap(&e->ts, ts, TS_BUSY) == ts) {
            /* issued again with no completion event since: take the slot over */
            u32 old = e->dev_index;
            e->dev = r->dev;
            e->dev_index = di;
            e->op = r->op;
            __sync_lock_test_and_set(&e->ts, now);
            undo_inflight(old);
            count_drop(DROP_NO_COMPLETION);
            return 0;
        }
    }
#pragma unroll
    for (int i = 0; i < START_WAYS; i++) {
        u32 idx = base + i;
        struct start_slot_t *e = start.lookup(&idx);
        if (!(free & (1 << i)) || !e || __sync_val_compare_and_swap(&e->ts, TS_FREE, TS_BUSY) != TS_FREE)
            continue;
        e->rq = rq;
        e->dev = r->dev;
        e->dev_index = di;
        e->op = r->op;
        __sync_lock_test_and_set(&e->ts, now);   /* publish (a full barrier) */
        return 0;
    }
    count_drop(DROP_START);
    return -1;
}

/* Take the issue time of `rq` out of the table. 0: found. */
static __always_inline int start_take(u64 rq, struct start_slot_t *out)
{
    u32 base = start_base(rq);
#pragma unroll
    for (int i = 0; i < START_WAYS; i++) {
        u32 idx = base + i;
        struct start_slot_t *e = start.lookup(&idx);
        if (!e)
            continue;
        u64 ts = READ_ONCE_U64(e->ts);
        if (ts < TS_VALID || READ_ONCE_U64(e->rq) != rq)
            continue;
        if (__sync_val_compare_and_swap(&e->ts, ts, TS_BUSY) != ts)
            continue;   /* taken meanwhile */
        if (READ_ONCE_U64(e->rq) != rq) {   /* reused before the swap: not ours */
            __sync_lock_test_and_set(&e->ts, ts);
            continue;
        }
        out->ts = ts;
        out->dev = e->dev;
        out->dev_index = e->dev_index;
        out->op = e->op;
        __sync_lock_test_and_set(&e->ts, TS_FREE);
        return 0;
    }
    return -1;
}

/* ---------------------------------------------------------------- histograms */

static __always_inline void count_overflow(void *map_lookup_or_init_ret)
{
    u64 *c = map_lookup_or_init_ret;
    if (c)
        *c += 1;   /* per-CPU value: no atomic needed */
    else
        count_drop(DROP_OTHER);
}

static __always_inline void count_size(u32 dev, u32 op, u32 row, u32 bytes)
{
    u64 slot = bytes / SIZE_UNIT;   /* u64: the bounds check must hold for the index itself */
    if (bytes % SIZE_UNIT == 0 && slot < SIZE_SLOTS) {
        struct size_row_t *r = size_hist.lookup(&row);
        if (r) {
            r->slot[slot] += 1;
            return;
        }
    }
    u64 zero = 0;
    struct size_key_t sk = {.dev = dev, .op = op, .size_bytes = bytes};
    u64 *c = sizes.lookup(&sk);
    if (!c)
        c = sizes.lookup_or_try_init(&sk, &zero);
    if (c) {
        *c += 1;
        return;
    }
    /* sizes map full: keep the request in the log2 histogram, count the loss */
    struct slot_key_t lk = {.dev = dev, .op = op, .slot = bpf_log2l(bytes)};   /* 0 for 0 bytes; k: [2^(k-1), 2^k) */
    count_overflow(size_log2_overflow.lookup_or_try_init(&lk, &zero));
    count_drop(DROP_SIZES);
}

static __always_inline void count_depth(u32 dev, u32 op, u32 row, s64 depth)
{
    u64 slot = depth > 0 ? depth : 0;   /* u64: the bounds check must hold for the index itself */
    if (slot < DEPTH_SLOTS) {
        struct depth_row_t *r = depth_hist.lookup(&row);
        if (r)
            r->slot[slot] += 1;
        return;
    }
    u64 zero = 0;
    struct slot_key_t k = {.dev = dev, .op = op, .slot = slot};
    count_overflow(depth_overflow.lookup_or_try_init(&k, &zero));
}

static __always_inline void count_latency(u32 dev, u32 op, u32 row, u64 delta)
{
    u64 slot = lat_slot(delta);
    if (slot < LAT_SLOTS) {
        struct lat_row_t *r = lat_hist.lookup(&row);
        if (r)
            r->slot[slot] += 1;
        return;
    }
    u64 zero = 0;
    struct slot_key_t k = {.dev = dev, .op = op, .slot = slot};
    count_overflow(lat_overflow.lookup_or_try_init(&k, &zero));
}

static __always_inline void count_queue(u32 dev, u32 op, u32 row, u64 delta)
{
    struct done_t *d = done.lookup(&row);
    if (d) {
        d->queued += 1;
        d->queue_sum_ns += delta;
    }
    u64 slot = lat_slot(delta);
    if (slot < LAT_SLOTS) {
        struct lat_row_t *r = queue_hist.lookup(&row);
        if (r)
            r->slot[slot] += 1;
        return;
    }
    u64 zero = 0;
    struct slot_key_t k = {.dev = dev, .op = op, .slot = slot};
    count_overflow(queue_overflow.lookup_or_try_init(&k, &zero));
}

static __always_inline void count_interval(struct rq_info *r, u64 now, u64 seq)
{
    struct time_key_t ck = {.dev = r->dev, .op = r->op,
                            .bucket = now > T0_NS ? (now - T0_NS) / BUCKET_NS : 0};
    struct time_val_t vzero = {};
    struct time_val_t *tv = timeline.lookup(&ck);
    if (!tv)
        tv = timeline.lookup_or_try_init(&ck, &vzero);
    if (!tv) {
        count_drop(DROP_TIMELINE);
        return;
    }
    tv->requests += 1;
    tv->bytes += r->bytes;
    tv->sequential += seq;
    tv->meta += r->meta;
}

/* ---------------------------------------------------------------- programs */

/* TP_PROTO(struct request *rq) */
RAW_TRACEPOINT_PROBE(block_rq_issue)
{
    u64 rq = ctx->args[0];
    struct rq_info r = {};
    if (read_rq((void *)rq, &r))
        return 0;
    int di = dev_index(r.dev);
    if (di < 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u32 k = di;
    u32 row = k * NOPS + r.op;

    count_size(r.dev, r.op, row, r.bytes);
    u64 *inserted = queued_at.lookup(&rq);
    if (inserted) {
        u64 at = *inserted;
        queued_at.delete(&rq);
        count_queue(r.dev, r.op, row, now > at ? now - at : 0);
    }
    int kept = start_insert(rq, now, k, &r) == 0;

    /* in-flight depth on this device, this request included; sequential */
    struct dev_state_t *ds = dev_state.lookup(&k);
    s64 depth = 1;
    u64 seq = 0;
    if (ds) {
        depth = (kept ? __sync_fetch_and_add(&ds->inflight, 1) : READ_ONCE_U64(ds->inflight)) + 1;
        if (r.bytes) {
            seq = ds->last_end1 == r.sector + 1;
            ds->last_end1 = r.sector + (r.bytes >> 9) + 1;
        }
    }
    count_depth(r.dev, r.op, row, depth);
    count_interval(&r, now, seq);
    return 0;
}

/* TP_PROTO(struct request *rq): into the I/O scheduler's queue. Only traced
 * devices' requests are kept (the 3 reads of an issue). */
RAW_TRACEPOINT_PROBE(block_rq_insert)
{
    u64 rq = ctx->args[0];
    struct rq_info r = {};
    if (read_rq((void *)rq, &r) || dev_index(r.dev) < 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    if (queued_at.update(&rq, &now))
        count_drop(DROP_QUEUE);
    return 0;
}

/* TP_PROTO(struct request *rq): merged into another queued request, then
 * freed without an issue of its own. */
RAW_TRACEPOINT_PROBE(block_rq_merge)
{
    u64 rq = ctx->args[0];
    queued_at.delete(&rq);
    return 0;
}

/* TP_PROTO(struct request *rq, blk_status_t error, unsigned int nr_bytes) */
RAW_TRACEPOINT_PROBE(block_rq_complete)
{
    struct start_slot_t s = {};
    if (start_take(ctx->args[0], &s))
        return 0;   /* not traced, issued before tracing began, or its start was not kept */
    u64 now = bpf_ktime_get_ns();
    u32 di = s.dev_index;
    undo_inflight(di);

    u32 row = di * NOPS + s.op;
    struct done_t *d = done.lookup(&row);
    if (!d)
        return 0;
    u64 delta = now > s.ts ? now - s.ts : 0;
    d->completed += 1;
    d->lat_sum_ns += delta;
    if ((u8)ctx->args[1])   /* blk_status_t */
        d->errors += 1;
    count_latency(s.dev, s.op, row, delta);
    return 0;
}

/* TP_PROTO(struct request *rq): back to the queue, to be issued again; its
 * next issue is timed afresh (and counted as a request again, as the
 * block_rq_issue tracepoint shows it twice). */
RAW_TRACEPOINT_PROBE(block_rq_requeue)
{
    struct start_slot_t s = {};
    if (start_take(ctx->args[0], &s) == 0)
        undo_inflight(s.dev_index);
    return 0;
}
