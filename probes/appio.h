/*
 * appio.h - map layout shared by probes/appio.c and iotune/trace/appprobe.py.
 *
 * The application-level probe: what the traced job submits (read/write
 * system calls, libaio iocbs, io_uring requests), per file. Latency slots
 * are blockio.h's log-linear slots (APP_LAT_SUB_BITS = LAT_SUB_BITS), so both layers' latency
 * histograms read the same way (iotune/model/histogram.py). Every change here
 * must be mirrored in iotune/trace/appprobe.py (map reading, APP_DROP_NAMES).
 */
#ifndef IOTUNE_APPIO_H
#define IOTUNE_APPIO_H

/* blockio.h's LAT_SUB_BITS: the same latency slots in both layers
 * (tests/trace/test_appio.py checks that they agree). */
#define APP_LAT_SUB_BITS 3
#define APP_LAT_SUB      (1 << APP_LAT_SUB_BITS)

/* Direction of an application request */
#define APP_READ  0
#define APP_WRITE 1

/* How the job submitted it */
#define IFACE_SYNC   0   /* read, write, pread64, pwrite64, readv, writev, preadv(2), pwritev(2), sendfile64,
                            copy_file_range */
#define IFACE_LIBAIO 1   /* io_submit iocbs: IOCB_CMD_PREAD/PWRITE/PREADV/PWRITEV */
#define IFACE_URING  2   /* io_uring: READ, WRITE, READV, WRITEV, READ_FIXED, WRITE_FIXED */
#define NIFACES      3

/* Kinds of start entry (start_key_t.kind) */
#define START_SYNC   0   /* ptr = thread id; tgid = the process */
#define START_LIBAIO 1   /* ptr = the iocb's user address; tgid = the process */
#define START_URING  2   /* ptr = struct io_kiocb address; tgid = 0 (completes anywhere) */
#define START_COPY   3   /* the source side of sendfile64/copy_file_range: ptr = thread id */

/*
 * Drop counters (`drops` array): what could not be seen or recorded exactly.
 *   START:      no start entry kept (map full): the request is counted, but
 *               has no latency sample and is not counted in flight.
 *   FILES:      a (file, direction, interface) row not kept (files map
 *               full): the request is missing from every count.
 *   SIZES:      exact size not kept (sizes map full); still in the totals.
 *   IOCBS:      iocbs beyond MAX_IOCBS in one io_submit: not counted.
 *   EVENTS:     io_events beyond MAX_EVENTS in one io_getevents: no latency.
 *   IOV:        iovec entries beyond MAX_IOV: their bytes not counted.
 *   FIXED:      io_uring requests on registered (fixed) files: the file is
 *               not known, so they are not counted.
 *   PROCS:      a process of the job not traced (procs map full).
 *   UNREADABLE: an iocb, iovec or io_event unreadable in user memory (not
 *               counted), or a file that could not be resolved.
 *   OTHER:      a latency or depth histogram entry not kept (map full).
 *   UNMATCHED:  a completion with no start entry (submitted before tracing
 *               began, its start was not kept, or see REUSED); not a loss by
 *               itself: it has no latency sample.
 *   REUSED:     an iocb submitted again at the same user address while its
 *               previous submission is still in flight (the kernel copies an
 *               iocb at io_submit, so that is legal, and DeepSpeed does it):
 *               counted, but with no start entry (io_events name requests by
 *               that address alone), so one of the two completions is
 *               UNMATCHED.
 */
#define APP_DROP_START      0
#define APP_DROP_FILES      1
#define APP_DROP_SIZES      2
#define APP_DROP_IOCBS      3
#define APP_DROP_EVENTS     4
#define APP_DROP_IOV        5
#define APP_DROP_FIXED      6
#define APP_DROP_PROCS      7
#define APP_DROP_UNREADABLE 8
#define APP_DROP_OTHER      9
#define APP_DROP_UNMATCHED  10
#define APP_DROP_REUSED     11
#define APP_DROP_SLOTS      12

/* A file: the filesystem's dev_t (super_block.s_dev; for a block device
 * special file, the device it opens, i_rdev) and the inode number. */
struct file_key_t {
    u64 ino;
    u32 dev;          /* kernel dev_t: major << 20 | minor */
    u8 op;            /* APP_READ / APP_WRITE */
    u8 iface;         /* IFACE_* */
    u8 blockdev;      /* 1: a block device special file (dev = the device) */
    u8 pad;
};

/* Per file, direction and interface; per CPU. */
struct file_val_t {
    u64 requests;     /* submitted */
    u64 bytes;        /* asked for at submission */
    u64 completed;    /* completions matched to their submission (latency samples) */
    u64 result_bytes; /* bytes the completions reported done */
    u64 errors;       /* completions with a negative result */
    u64 lat_sum_ns;
};

struct app_size_key_t {
    u64 ino;
    u32 dev;
    u8 op;
    u8 iface;
    u8 blockdev;
    u8 pad;
    u64 size_bytes;
};

/* Latency and depth histograms: per filesystem (dev), direction, interface. */
struct hist_key_t {
    u32 dev;
    u8 op;
    u8 iface;
    u16 pad;
    u32 slot;         /* latency: blockio.h's log-linear ns slot; depth: in flight at submission, this one included */
    u32 pad2;
};

struct flight_key_t {
    u32 dev;
    u8 op;
    u8 iface;
    u16 pad;
};

struct start_key_t {
    u32 tgid;
    u32 kind;         /* START_* */
    u64 ptr;
};

/* state: how far the submit side got (libaio: the completion may be reaped
 * by another thread before io_submit returns). */
#define ST_NEW       0   /* entered, not yet known to be submitted */
#define ST_COUNTED   1   /* submission counted, in flight */
#define ST_DONE      2   /* completed before its submission was counted */

struct start_val_t {
    u64 ts;
    struct file_key_t key;
    u64 bytes;
    u64 state;        /* ST_*; 64 bits for compare-and-swap */
};

/* io_submit / io_getevents arguments, kept from enter to exit per thread,
 * and the state of the walk over their iocbs or io_events. */
struct call_t {
    u64 ptr;          /* iocb ** or struct io_event * */
    u64 nr;           /* iocbs given, or io_events returned */
    u64 ts;           /* io_submit's entry */
    u64 next;         /* the next index to look at */
    s64 ret;          /* io_submit's return: iocbs accepted */
    s64 fd_cache;     /* the fd last resolved (-1: none) */
    s64 res_cache;    /* resolve_fd's answer for it */
    struct file_key_t key_cache;
};

#endif
