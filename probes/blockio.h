/*
 * blockio.h - map layout shared by probes/blockio.c and iotune/trace/collector.py.
 *
 * The kernel side aggregates; user space only reads these maps. Every change
 * here must be mirrored in iotune/trace/layout.py (slot arithmetic) and the
 * collector; tests/test_probe_layout.py checks the two agree.
 */
#ifndef IOTUNE_BLOCKIO_H
#define IOTUNE_BLOCKIO_H

/* Direction of a request, from the first letters of rwbs. */
#define OP_READ    0
#define OP_WRITE   1
#define OP_FLUSH   2
#define OP_DISCARD 3
#define OP_OTHER   4

/*
 * Log-linear latency slots: values 0..7 ns get slots 0..7 exactly; above
 * that each power of two [2^l, 2^(l+1)) is split into 8 equal sub-slots, so a
 * slot's width is at most 1/8 of its lower bound (percentiles within 12.5%).
 * slot = 8 + (l - 3) * 8 + ((v >> (l - 3)) & 7) for v >= 8, l = floor(log2 v).
 */
#define LAT_SUB_BITS 3
#define LAT_SUB      (1 << LAT_SUB_BITS)

/* Drop counters: why an event could not be recorded (map full). */
#define DROP_SIZES    0
#define DROP_START    1
#define DROP_TIMELINE 2
#define DROP_OTHER    3
#define DROP_SLOTS    4

struct dev_op_t {
    u32 dev;      /* kernel dev_t: major << 20 | minor */
    u32 op;       /* OP_* */
};

struct size_key_t {
    u32 dev;
    u32 op;
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

struct time_val_t {
    u64 requests;
    u64 bytes;
};

struct totals_t {
    u64 requests;
    u64 bytes;
    u64 sequential;   /* started where the previous request on the device ended */
    u64 meta;         /* REQ_META set ('M' in rwbs): filesystem metadata */
    u64 completed;    /* completions matched to an issue we saw */
    u64 lat_sum_ns;
    u64 errors;       /* completions with error != 0 */
};

struct start_key_t {
    u32 dev;
    u32 pad;
    u64 sector;
};

struct start_val_t {
    u64 ts_ns;
    u32 op;
    u32 pad;
};

#endif
