/*
 * blockio.h - map layout shared by probes/blockio.c and iotune/trace/probe.py.
 *
 * The kernel side aggregates; user space only reads these maps. Every change
 * here must be mirrored in iotune/trace/probe.py (map reading, DROP_NAMES,
 * row and slot sizes) and iotune/model/histogram.py (slot arithmetic);
 * tests/model/test_histogram.py checks that the constants agree.
 */
#ifndef IOTUNE_BLOCKIO_H
#define IOTUNE_BLOCKIO_H

/* Direction of a request, from its REQ_OP (what rwbs shows first): read,
 * write, flush, discard (and secure erase); write-zeroes, zone and driver
 * operations are "other". */
#define OP_READ    0
#define OP_WRITE   1
#define OP_FLUSH   2
#define OP_DISCARD 3
#define OP_OTHER   4
#define NOPS       5

/*
 * Log-linear latency slots: values 0..7 ns get slots 0..7 exactly; above
 * that each power of two [2^l, 2^(l+1)) is split into 8 equal sub-slots, so a
 * slot's width is at most 1/8 of its lower bound (percentiles within 12.5%).
 * slot = 8 + (l - 3) * 8 + ((v >> (l - 3)) & 7) for v >= 8, l = floor(log2 v).
 */
#define LAT_SUB_BITS 3
#define LAT_SUB      (1 << LAT_SUB_BITS)

/*
 * Histograms are per-CPU arrays with one row per (device index, op):
 * row = dev_index * NOPS + op. Latency slots below LAT_SLOTS (latency under
 * 2^35 ns, 34 s) and depths below DEPTH_SLOTS live in the row; larger ones go
 * to the *_overflow hash maps, keyed by (dev, op, slot).
 */
#define LAT_SLOTS   264
#define DEPTH_SLOTS 128

/* Exact sizes that are multiples of SIZE_UNIT up to (SIZE_SLOTS - 1) units
 * (0 and 4 KiB .. 1 MiB) are counted in a per-CPU row, slot = bytes /
 * SIZE_UNIT; any other size in the `sizes` hash map. */
#define SIZE_UNIT  4096
#define SIZE_SLOTS 257

/*
 * Drop counters (`drops` array): what could not be recorded exactly.
 *   SIZES:    exact size not kept (a size outside the rows when the sizes
 *             map is full); the request is still in the log2 histogram
 *             (`size_log2_overflow`) and in the totals.
 *   START:    no start time kept (start table bucket full): no latency
 *             sample, not counted in flight.
 *   TIMELINE: request missing from the timeline and from the request, byte,
 *             sequential and metadata totals (timeline map full).
 *   OTHER:    a depth or latency overflow entry (map full).
 *   NO_COMPLETION: a request struct issued again while its previous
 *             issue's start time was still held: that request's completion
 *             event never came (on 6.18 the kernel emitted no block_rq_complete
 *             for 0.04-0.5% of virtio-blk requests, and of loop requests on
 *             them; or the event was skipped, see below). That request has no
 *             latency sample; its in-flight count is undone then.
 *   DEVICES:  events of devices beyond MAX_DEVS (no device filter).
 *   QUEUE:    an insert time not kept (`queued_at` full): that request's
 *             queue time is not sampled (it counts as issued directly).
 * iotune/trace/probe.py adds the kernel's own count of events it did not run
 * the programs for (fdinfo recursion_misses).
 */
#define DROP_SIZES         0
#define DROP_START         1
#define DROP_TIMELINE      2
#define DROP_OTHER         3
#define DROP_NO_COMPLETION 4
#define DROP_DEVICES       5
#define DROP_QUEUE         6
#define DROP_SLOTS         7

struct size_key_t {
    u32 dev;      /* kernel dev_t: major << 20 | minor */
    u32 op;       /* OP_* */
    u32 size_bytes;
    u32 pad;
};

struct slot_key_t {
    u32 dev;
    u32 op;
    u32 slot;
    u32 pad;
};

struct time_key_t {
    u32 dev;
    u32 op;
    u32 bucket;   /* (now - T0_NS) / BUCKET_NS */
    u32 pad;
};

/* Per interval, per CPU; the per-(dev, op) totals are sums over buckets. */
struct time_val_t {
    u64 requests;
    u64 bytes;
    u64 sequential;   /* started where the previous request on the device ended */
    u64 meta;         /* REQ_META set ('M' in rwbs): filesystem metadata */
};

/* Completion side, per row, per CPU. */
struct done_t {
    u64 completed;    /* completions timed against their issue (latency samples) */
    u64 lat_sum_ns;
    u64 errors;       /* matched completions with error != 0 */
    u64 queued;       /* issued after a block_rq_insert: waited in the OS queue (scheduler) */
    u64 queue_sum_ns; /* their insert -> issue time */
};

struct lat_row_t {
    u64 slot[LAT_SLOTS];
};

struct size_row_t {
    u64 slot[SIZE_SLOTS];
};

struct depth_row_t {
    u64 slot[DEPTH_SLOTS];   /* in flight at issue, this request included */
};

/* Per device index, shared by all CPUs. */
struct dev_state_t {
    s64 inflight;     /* issued with a start time, not yet completed */
    u64 last_end1;    /* 1 + sector after the last request with data (0: none yet) */
};

/*
 * Start table: MAX_INFLIGHT slots (a power of two) in buckets of START_WAYS
 * slots; the bucket is a hash of the request's address, which is unique among
 * requests in flight. Lock-free: a slot is claimed and released with
 * compare-and-swap on ts. A requeued request's slot is released by
 * block:block_rq_requeue; a slot still holding a request's address when that
 * struct is issued again (its completion event never came) is taken over, and
 * the old entry's in-flight count undone.
 */
#define START_WAYS    4
#define TS_FREE       0
#define TS_BUSY       1   /* being written or taken; any ts >= TS_VALID is an issue time */
#define TS_VALID      2

struct start_slot_t {
    u64 rq;           /* struct request address */
    u64 ts;           /* TS_FREE, TS_BUSY or the issue time (ns) */
    u32 dev;          /* dev_t */
    u16 dev_index;
    u16 op;
    u64 pad;          /* 32 bytes: two slots per cache line */
};

#endif
