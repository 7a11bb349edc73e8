/*
 * appio.c - application-level I/O profile: what the traced job asked for,
 * aggregated in the kernel.
 *
 * Purpose:     for the traced command's processes, every read and write it
 *              submits to a file: per (file, direction, interface) exact
 *              request counts, bytes asked for, exact sizes, completions,
 *              bytes done and errors; per (filesystem, direction, interface)
 *              submit->completion latency (log-linear ns slots, as blockio.c)
 *              and requests in flight at submission.
 * Seen:        read, write, pread64, pwrite64, readv, writev, preadv,
 *              pwritev, preadv2, pwritev2 on regular files and block device
 *              files; sendfile64 and copy_file_range between two of them (a
 *              read of the source and a write of the destination, each of
 *              the call's size: Python's shutil.copyfile, so DeepSpeed's
 *              copy of the offloaded tensors into a checkpoint); libaio iocbs (IOCB_CMD_PREAD, PWRITE, PREADV, PWRITEV)
 *              submitted with io_submit, completed when io_getevents or
 *              io_pgetevents returns them (the job's reap: libaio's user-space
 *              ring peek is not seen, fio's userspace_reap=1 leaves latency
 *              unmatched); io_uring READ, WRITE, READV, WRITEV, READ_FIXED,
 *              WRITE_FIXED, from submission to the CQE being posted.
 * Not seen:    mmap'd file access, splice,
 *              fsync/fdatasync (not reads or writes), io_uring requests on
 *              registered files (counted in drops), pipes, sockets and ttys
 *              (not regular files: left out on purpose), I/O by processes
 *              outside the job.
 * Tracepoints: syscalls:sys_enter/exit_{read,write,pread64,pwrite64,readv,
 *              writev,preadv,pwritev,preadv2,pwritev2,sendfile64,
 *              copy_file_range,io_submit,io_getevents,
 *              io_pgetevents}, io_uring:io_uring_submit_req,
 *              io_uring:io_uring_complete, sched:sched_process_exit and
 *              sched_process_fork (raw: it reads the child's tgid). No kprobes.
 *              The file is resolved in the kernel from the calling task's file
 *              table (task->files->fdt->fd[fd]->f_inode): its filesystem's
 *              dev_t and inode number; user space names inodes by path.
 * Processes:   `procs` holds the traced tgids: iotune puts itself in with
 *              PROC_LAUNCHER (its own I/O is not counted), a process forked
 *              by a traced or launcher process is traced, and iotune takes
 *              itself out once the command has started. Without
 *              -DPROC_FILTER every process is traced.
 * Units:       sizes in bytes, latency in ns, depth in requests.
 * Options:     kernel layout from BTF (iotune/trace/appprobe.py):
 *              -DTASK_FILES_OFF -DTASK_PID_OFF -DTASK_TGID_OFF -DFILES_FDT_OFF
 *              -DFDT_MAX_OFF -DFDT_FD_OFF -DFILE_INODE_OFF -DI_MODE_OFF
 *              -DI_SB_OFF -DI_INO_OFF -DI_RDEV_OFF -DSB_DEV_OFF -DREQ_FLAGS_OFF
 *              -DREQ_FD_OFF -DRW_ADDR_OFF -DRW_LEN_OFF -DREQ_FIXED_BIT
 *              -DUOP_<READV|WRITEV|READ_FIXED|WRITE_FIXED|READ|WRITE>.
 *              Filesystem filter: -DNDEVS=<n> -DDEV_0=<dev_t> .. -DDEV_7
 *              (none: every file). -DPROC_FILTER. -DMAX_IOCBS (iocbs read per
 *              io_submit, default 256), -DMAX_EVENTS (io_events per reap,
 *              default 256), -DMAX_IOV (iovec entries summed, default 16),
 *              -DMAX_FILES, -DMAX_SIZES, -DMAX_STARTS, -DMAX_PROCS.
 * Overhead:    every read/write system call of every process runs an enter
 *              and an exit program (a hash lookup of the tgid; the rest only
 *              for traced processes). A traced request costs the file lookup
 *              (7 reads of kernel memory; libaio: once per run of iocbs on the
 *              same fd), a start entry insert and delete (hash map) and about
 *              five per-CPU hash updates. io_submit reads each iocb pointer
 *              twice (enter and exit) and each iocb once.
 * Exactness:   nothing is sampled; what cannot be recorded is counted in
 *              `drops` (appio.h). A libaio request is counted when io_submit
 *              returns (only the iocbs it accepted), or when reaped first.
 */
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include <linux/types.h>
#include <linux/aio_abi.h>   /* aio_context_t, used by the io_submit/io_getevents tracepoint formats */
#include <linux/fs.h>        /* rwf_t, used by the preadv2/pwritev2 formats */
#include "appio.h"

#if !defined(TASK_FILES_OFF) || !defined(FDT_FD_OFF) || !defined(FILE_INODE_OFF) || \
    !defined(I_INO_OFF) || !defined(SB_DEV_OFF) || !defined(REQ_FD_OFF) || !defined(RW_LEN_OFF)
#error "kernel layout missing: iotune/trace/appprobe.py passes it from the kernel's BTF"
#endif
#ifndef MAX_IOCBS
#define MAX_IOCBS 256
#endif
#ifndef MAX_EVENTS
#define MAX_EVENTS 256
#endif
#define CHUNK 8   /* iocbs or io_events per program; MAX_IOCBS / CHUNK must stay under 33 (tail calls) */
#ifndef MAX_IOV
#define MAX_IOV 16
#endif
#ifndef MAX_FILES
#define MAX_FILES 16384
#endif
#ifndef MAX_SIZES
#define MAX_SIZES 16384
#endif
#ifndef MAX_STARTS
#define MAX_STARTS 65536
#endif
#ifndef MAX_PROCS
#define MAX_PROCS 16384
#endif
#ifndef NDEVS
#define NDEVS 0
#endif
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

#define PROC_TRACED   1
#define PROC_LAUNCHER 2
#define IOCB_CMD_PREAD   0
#define IOCB_CMD_PWRITE  1
#define IOCB_CMD_PREADV  7
#define IOCB_CMD_PWRITEV 8
#define MODE_FMT 0170000
#define MODE_REG 0100000
#define MODE_BLK 0060000
#define MAX2(a, b) ((a) > (b) ? (a) : (b))
#define MIN2(a, b) ((a) < (b) ? (a) : (b))
#define INODE_LO MIN2(MIN2(I_MODE_OFF, I_SB_OFF), MIN2(I_INO_OFF, I_RDEV_OFF))
#define INODE_SPAN (MAX2(MAX2(I_MODE_OFF + 2, I_SB_OFF + 8), MAX2(I_INO_OFF + 8, I_RDEV_OFF + 4)) - INODE_LO)

#define PERCPU_HASH(name, k, v, n) BPF_F_TABLE("percpu_hash", k, v, name, n, BPF_F_NO_PREALLOC)

BPF_HASH(procs, u32, u32, MAX_PROCS);
PERCPU_HASH(files, struct file_key_t, struct file_val_t, MAX_FILES);
PERCPU_HASH(sizes, struct app_size_key_t, u64, MAX_SIZES);
PERCPU_HASH(lat, struct hist_key_t, u64, 16384);
PERCPU_HASH(depth, struct hist_key_t, u64, 16384);
BPF_HASH(inflight, struct flight_key_t, s64, 1024);
/* no prealloc: an entry deleted on one CPU stays readable (RCU) for a program
 * still holding it on another */
BPF_F_TABLE("hash", struct start_key_t, struct start_val_t, starts, MAX_STARTS, BPF_F_NO_PREALLOC);
BPF_HASH(calls, u32, struct call_t, 16384);     /* thread id -> io_submit / io_getevents arguments */
BPF_ARRAY(drops, u64, APP_DROP_SLOTS);

static __always_inline void count_drop(u32 why)
{
    u64 *d = drops.lookup(&why);
    if (d)
        __sync_fetch_and_add(d, 1);
}

static __always_inline void count_drops(u32 why, u64 n)
{
    u64 *d = drops.lookup(&why);
    if (d && n)
        __sync_fetch_and_add(d, n);
}

/* ---------------------------------------------------------------- processes */

static __always_inline int traced(void)
{
#ifdef PROC_FILTER
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 *p = procs.lookup(&tgid);
    return p && *p == PROC_TRACED;
#else
    return 1;
#endif
}

/* TP_PROTO(struct task_struct *parent, struct task_struct *child) */
RAW_TRACEPOINT_PROBE(sched_process_fork)
{
#ifdef PROC_FILTER
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!procs.lookup(&tgid))
        return 0;
    u32 ids[2] = {};   /* pid, tgid: adjacent pid_t fields */
    if (bpf_probe_read_kernel(&ids, sizeof(ids), (void *)(ctx->args[1] + TASK_PID_OFF)))
        return 0;
    if (ids[0] != ids[1])
        return 0;   /* a thread: its process is traced already */
    u32 v = PROC_TRACED;
    if (procs.update(&ids[1], &v))
        count_drop(APP_DROP_PROCS);
#endif
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
#ifdef PROC_FILTER
    if (args->group_dead) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        procs.delete(&tgid);
    }
#endif
    return 0;
}

/* ---------------------------------------------------------------- files */

static __always_inline int dev_wanted(u32 dev)
{
    if (NDEVS == 0) return 1;
    if (NDEVS > 0 && dev == DEV_0) return 1;
    if (NDEVS > 1 && dev == DEV_1) return 1;
    if (NDEVS > 2 && dev == DEV_2) return 1;
    if (NDEVS > 3 && dev == DEV_3) return 1;
    if (NDEVS > 4 && dev == DEV_4) return 1;
    if (NDEVS > 5 && dev == DEV_5) return 1;
    if (NDEVS > 6 && dev == DEV_6) return 1;
    if (NDEVS > 7 && dev == DEV_7) return 1;
    return 0;
}

/* The file behind `fd` in the current task: 0 and `k` filled (dev, ino,
 * blockdev) when it is a regular or block device file on a wanted
 * filesystem; 1 when it is something else (a pipe, another filesystem);
 * -1 when unreadable. */
static __always_inline int resolve_fd(u64 fd, struct file_key_t *k)
{
    u64 task = bpf_get_current_task();
    u64 files = 0, fdt = 0, arr = 0, file = 0, inode = 0;
    u32 max_fds = 0;
    if (bpf_probe_read_kernel(&files, 8, (void *)(task + TASK_FILES_OFF)) || !files)
        return -1;
    if (bpf_probe_read_kernel(&fdt, 8, (void *)(files + FILES_FDT_OFF)) || !fdt)
        return -1;
    if (bpf_probe_read_kernel(&max_fds, 4, (void *)(fdt + FDT_MAX_OFF)) || fd >= max_fds)
        return 1;   /* not an open fd: the call fails with EBADF */
    if (bpf_probe_read_kernel(&arr, 8, (void *)(fdt + FDT_FD_OFF)) || !arr)
        return -1;
    if (bpf_probe_read_kernel(&file, 8, (void *)(arr + fd * 8)) || !file)
        return 1;
    if (bpf_probe_read_kernel(&inode, 8, (void *)(file + FILE_INODE_OFF)) || !inode)
        return -1;
    u8 b[INODE_SPAN];
    if (bpf_probe_read_kernel(b, sizeof(b), (void *)(inode + INODE_LO)))
        return -1;
    u16 mode;
    u64 ino, sb;
    u32 rdev, sdev = 0;
    __builtin_memcpy(&mode, b + I_MODE_OFF - INODE_LO, 2);
    __builtin_memcpy(&ino, b + I_INO_OFF - INODE_LO, 8);
    __builtin_memcpy(&sb, b + I_SB_OFF - INODE_LO, 8);
    __builtin_memcpy(&rdev, b + I_RDEV_OFF - INODE_LO, 4);
    if ((mode & MODE_FMT) == MODE_BLK) {
        k->dev = rdev;
        k->blockdev = 1;
    } else if ((mode & MODE_FMT) == MODE_REG) {
        if (bpf_probe_read_kernel(&sdev, 4, (void *)(sb + SB_DEV_OFF)))
            return -1;
        k->dev = sdev;
        k->blockdev = 0;
    } else {
        return 1;
    }
    k->ino = ino;
    return dev_wanted(k->dev) ? 0 : 1;
}

/* ---------------------------------------------------------------- counting */

static __always_inline u64 lat_slot(u64 v)
{
    if (v < APP_LAT_SUB)
        return v;
    u64 l = bpf_log2l(v) - 1;   /* bcc's bpf_log2l(v) is floor(log2 v) + 1 */
    return APP_LAT_SUB + (l - APP_LAT_SUB_BITS) * APP_LAT_SUB + ((v >> (l - APP_LAT_SUB_BITS)) & (APP_LAT_SUB - 1));
}

static __always_inline void count_hist(void *table_lookup_or_init)
{
    u64 *c = table_lookup_or_init;
    if (c)
        *c += 1;
    else
        count_drop(APP_DROP_OTHER);
}

static __always_inline struct file_val_t *file_row(struct file_key_t *k)
{
    struct file_val_t zero = {};
    struct file_val_t *v = files.lookup(k);
    if (!v)
        v = files.lookup_or_try_init(k, &zero);
    return v;
}

/* A submitted request: counts, exact size; with `flight`, in flight and depth. */
static __always_inline void count_submit(struct file_key_t *k, u64 bytes, int flight)
{
    struct file_val_t *v = file_row(k);
    if (!v) {
        count_drop(APP_DROP_FILES);
        return;
    }
    v->requests += 1;
    v->bytes += bytes;
    u64 zero = 0;
    struct app_size_key_t sk = {.ino = k->ino, .dev = k->dev, .op = k->op, .iface = k->iface,
                                .blockdev = k->blockdev, .size_bytes = bytes};
    u64 *c = sizes.lookup(&sk);
    if (!c)
        c = sizes.lookup_or_try_init(&sk, &zero);
    if (c)
        *c += 1;
    else
        count_drop(APP_DROP_SIZES);
    if (!flight)
        return;
    struct flight_key_t fk = {.dev = k->dev, .op = k->op, .iface = k->iface};
    s64 szero = 0;
    s64 *n = inflight.lookup_or_try_init(&fk, &szero);
    s64 d = n ? __sync_fetch_and_add(n, 1) + 1 : 1;
    struct hist_key_t hk = {.dev = k->dev, .op = k->op, .iface = k->iface, .slot = d > 0 ? d : 0};
    count_hist(depth.lookup_or_try_init(&hk, &zero));
}

/* A completion matched to its start: latency, result; `flight`: it was in flight. */
static __always_inline void count_done(struct start_val_t *s, s64 res, u64 now, int flight)
{
    struct file_key_t *k = &s->key;
    struct file_val_t *v = file_row(k);
    u64 delta = now > s->ts ? now - s->ts : 0;
    if (v) {
        v->completed += 1;
        v->lat_sum_ns += delta;
        if (res < 0)
            v->errors += 1;
        else
            v->result_bytes += res;
    }
    u64 zero = 0;
    struct hist_key_t hk = {.dev = k->dev, .op = k->op, .iface = k->iface, .slot = lat_slot(delta)};
    count_hist(lat.lookup_or_try_init(&hk, &zero));
    if (flight) {
        struct flight_key_t fk = {.dev = k->dev, .op = k->op, .iface = k->iface};
        s64 *n = inflight.lookup(&fk);
        if (n)
            __sync_fetch_and_add(n, -1);
    }
}

/* Sum of iov_len over an iovec array in user memory; -1 if unreadable. */
static __always_inline s64 iov_bytes(u64 uiov, u64 n)
{
    s64 total = 0;
    if (n > MAX_IOV) {
        count_drops(APP_DROP_IOV, n - MAX_IOV);
        n = MAX_IOV;
    }
    for (u32 i = 0; i < MAX_IOV; i++) {
        if (i >= n)
            break;
        u64 len = 0;
        if (bpf_probe_read_user(&len, 8, (void *)(uiov + i * 16 + 8)))
            return -1;
        total += len;
    }
    return total;
}

/* ---------------------------------------------------------------- read/write system calls */

static __always_inline int sync_enter_as(u64 fd, s64 bytes, u8 op, u32 kind)
{
    if (!traced())
        return 0;
    struct start_val_t s = {.ts = bpf_ktime_get_ns(), .bytes = bytes > 0 ? bytes : 0, .state = ST_COUNTED};
    s.key.op = op;
    s.key.iface = IFACE_SYNC;
    int r = resolve_fd(fd, &s.key);
    if (r < 0)
        count_drop(APP_DROP_UNREADABLE);
    if (r != 0)
        return 0;
    if (bytes < 0) {
        count_drop(APP_DROP_UNREADABLE);
        return 0;
    }
    u64 id = bpf_get_current_pid_tgid();
    struct start_key_t sk = {.tgid = id >> 32, .kind = kind, .ptr = (u32)id};
    int kept = starts.update(&sk, &s) == 0;
    if (!kept)
        count_drop(APP_DROP_START);
    count_submit(&s.key, s.bytes, kept);
    return 0;
}

static __always_inline int sync_enter(u64 fd, s64 bytes, u8 op) { return sync_enter_as(fd, bytes, op, START_SYNC); }

static __always_inline int sync_exit_as(s64 ret, u32 kind)
{
    u64 id = bpf_get_current_pid_tgid();
    struct start_key_t sk = {.tgid = id >> 32, .kind = kind, .ptr = (u32)id};
    struct start_val_t *s = starts.lookup(&sk);
    if (!s)
        return 0;
    count_done(s, ret, bpf_ktime_get_ns(), 1);
    starts.delete(&sk);
    return 0;
}

static __always_inline int sync_exit(s64 ret) { return sync_exit_as(ret, START_SYNC); }

/* A copy inside the kernel: the destination's write, the source's read, each of the call's size. */
static __always_inline int copy_enter(u64 in_fd, u64 out_fd, s64 bytes)
{
    sync_enter_as(out_fd, bytes, APP_WRITE, START_SYNC);
    return sync_enter_as(in_fd, bytes, APP_READ, START_COPY);
}

static __always_inline int copy_exit(s64 ret)
{
    sync_exit_as(ret, START_SYNC);
    return sync_exit_as(ret, START_COPY);
}

TRACEPOINT_PROBE(syscalls, sys_enter_sendfile64) { return copy_enter(args->in_fd, args->out_fd, args->count); }
TRACEPOINT_PROBE(syscalls, sys_exit_sendfile64) { return copy_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_copy_file_range) { return copy_enter(args->fd_in, args->fd_out, args->len); }
TRACEPOINT_PROBE(syscalls, sys_exit_copy_file_range) { return copy_exit(args->ret); }

TRACEPOINT_PROBE(syscalls, sys_enter_read) { return sync_enter(args->fd, args->count, APP_READ); }
TRACEPOINT_PROBE(syscalls, sys_exit_read) { return sync_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_write) { return sync_enter(args->fd, args->count, APP_WRITE); }
TRACEPOINT_PROBE(syscalls, sys_exit_write) { return sync_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_pread64) { return sync_enter(args->fd, args->count, APP_READ); }
TRACEPOINT_PROBE(syscalls, sys_exit_pread64) { return sync_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_pwrite64) { return sync_enter(args->fd, args->count, APP_WRITE); }
TRACEPOINT_PROBE(syscalls, sys_exit_pwrite64) { return sync_exit(args->ret); }

#define VEC_PROBES(name, op)                                                                   \
    TRACEPOINT_PROBE(syscalls, sys_enter_##name)                                               \
    {                                                                                          \
        if (!traced())                                                                         \
            return 0;                                                                          \
        return sync_enter(args->fd, iov_bytes((u64)args->vec, args->vlen), op);                \
    }                                                                                          \
    TRACEPOINT_PROBE(syscalls, sys_exit_##name) { return sync_exit(args->ret); }

VEC_PROBES(readv, APP_READ)
VEC_PROBES(writev, APP_WRITE)
VEC_PROBES(preadv, APP_READ)
VEC_PROBES(pwritev, APP_WRITE)
VEC_PROBES(preadv2, APP_READ)
VEC_PROBES(pwritev2, APP_WRITE)

/* ---------------------------------------------------------------- libaio */

/* io_submit and io_getevents walk their iocbs and io_events CHUNK at a time;
 * a program that is not done tail-calls the next one (the verifier would not
 * accept one loop over them all). The walk's state is in `calls`. */
BPF_PROG_ARRAY(tails, 3);
#define TAIL_SUBMIT_ENTER 0
#define TAIL_SUBMIT_EXIT  1
#define TAIL_REAP_EXIT    2

/* The iocb at `uiocb`: 0 and `s` filled when it is a read or write on a
 * wanted file; 1: not one; -1: unreadable. The call's file cache spares
 * the file lookup for a run of iocbs on one fd. */
static __always_inline int read_iocb(u64 uiocb, struct start_val_t *s, struct call_t *c)
{
    u8 b[40];
    if (bpf_probe_read_user(b, sizeof(b), (void *)uiocb))
        return -1;
    u16 opcode;
    u32 fd;
    u64 buf, nbytes;
    __builtin_memcpy(&opcode, b + 16, 2);
    __builtin_memcpy(&fd, b + 20, 4);
    __builtin_memcpy(&buf, b + 24, 8);
    __builtin_memcpy(&nbytes, b + 32, 8);
    u8 op;
    s64 bytes = nbytes;
    if (opcode == IOCB_CMD_PREAD || opcode == IOCB_CMD_PREADV)
        op = APP_READ;
    else if (opcode == IOCB_CMD_PWRITE || opcode == IOCB_CMD_PWRITEV)
        op = APP_WRITE;
    else
        return 1;
    if (opcode == IOCB_CMD_PREADV || opcode == IOCB_CMD_PWRITEV)
        bytes = iov_bytes(buf, nbytes);
    if (bytes < 0)
        return -1;
    if (c->fd_cache != fd) {
        struct file_key_t k = {};
        c->res_cache = resolve_fd(fd, &k);
        c->key_cache = k;
        c->fd_cache = fd;
    }
    if (c->res_cache != 0)
        return c->res_cache;
    s->key = c->key_cache;
    s->key.op = op;
    s->key.iface = IFACE_LIBAIO;
    s->bytes = bytes;
    return 0;
}

static __always_inline struct call_t *this_call(u32 *tgid)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = id;
    *tgid = id >> 32;
    return calls.lookup(&tid);
}

static __always_inline void call_done(void)
{
    u32 tid = bpf_get_current_pid_tgid();
    calls.delete(&tid);
}

/* io_submit entered: a start entry for each iocb (the exit counts those accepted). */
static __always_inline void submit_enter_chunk(void *ctx)
{
    u32 tgid;
    struct call_t *c = this_call(&tgid);
    if (!c)
        return;
    u64 end = c->nr < MAX_IOCBS ? c->nr : MAX_IOCBS;
    for (u32 j = 0; j < CHUNK; j++) {
        u64 i = c->next;
        if (i >= end)
            return;
        c->next = i + 1;
        u64 uiocb = 0;
        if (bpf_probe_read_user(&uiocb, 8, (void *)(c->ptr + i * 8))) {
            count_drop(APP_DROP_UNREADABLE);
            continue;
        }
        struct start_val_t s = {.ts = c->ts, .state = ST_NEW};
        int r = read_iocb(uiocb, &s, c);
        if (r < 0)
            count_drop(APP_DROP_UNREADABLE);
        if (r != 0)
            continue;
        struct start_key_t sk = {.tgid = tgid, .kind = START_LIBAIO, .ptr = uiocb};
        if (starts.lookup(&sk)) {
            count_drop(APP_DROP_REUSED);   /* in flight at this address already: the exit counts it */
            continue;
        }
        starts.update(&sk, &s);   /* not kept: the exit counts it from the iocb */
    }
    if (c->next < end)
        tails.call(ctx, TAIL_SUBMIT_ENTER);
}

int submit_enter_more(void *ctx)
{
    submit_enter_chunk(ctx);
    return 0;
}

/* One accepted (i < ret) or refused iocb, at io_submit's exit. */
static __always_inline void submit_one(u32 tgid, u64 uiocb, int accepted, struct call_t *c)
{
    struct start_key_t sk = {.tgid = tgid, .kind = START_LIBAIO, .ptr = uiocb};
    struct start_val_t *s = starts.lookup(&sk);
    if (!accepted) {
        if (s && s->state == ST_NEW)
            starts.delete(&sk);
        return;
    }
    if (s && s->ts != c->ts && s->state != ST_NEW) {
        s = NULL;   /* an earlier submission at this address, still in flight (REUSED) */
    } else if (s) {
        u64 was = __sync_val_compare_and_swap(&s->state, ST_NEW, ST_COUNTED);
        if (was == ST_NEW) {
            count_submit(&s->key, s->bytes, 1);
        } else if (was == ST_DONE) {   /* reaped before io_submit returned */
            count_submit(&s->key, s->bytes, 0);
            starts.delete(&sk);
        }
        return;
    }
    /* no start entry (map full, or REUSED): count it from the iocb, without latency */
    int reused = s == NULL && starts.lookup(&sk) != NULL;
    struct start_val_t n = {};
    int r = read_iocb(uiocb, &n, c);
    if (r < 0)
        count_drop(APP_DROP_UNREADABLE);
    if (r != 0)
        return;
    if (!reused)
        count_drop(APP_DROP_START);
    count_submit(&n.key, n.bytes, 0);
}

static __always_inline void submit_exit_chunk(void *ctx)
{
    u32 tgid;
    struct call_t *c = this_call(&tgid);
    if (!c)
        return;
    u64 end = c->nr < MAX_IOCBS ? c->nr : MAX_IOCBS;
    for (u32 j = 0; j < CHUNK; j++) {
        u64 i = c->next;
        if (i >= end) {
            call_done();
            return;
        }
        c->next = i + 1;
        u64 uiocb = 0;
        if (bpf_probe_read_user(&uiocb, 8, (void *)(c->ptr + i * 8)) == 0)
            submit_one(tgid, uiocb, (s64)i < c->ret, c);
    }
    if (c->next < end)
        tails.call(ctx, TAIL_SUBMIT_EXIT);
    call_done();   /* done, or the tail call failed */
}

int submit_exit_more(void *ctx)
{
    submit_exit_chunk(ctx);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_io_submit)
{
    if (!traced())
        return 0;
    u32 tid = bpf_get_current_pid_tgid();
    struct call_t c = {.ptr = (u64)args->iocbpp, .nr = args->nr, .ts = bpf_ktime_get_ns(), .fd_cache = -1};
    if (calls.update(&tid, &c) == 0)
        submit_enter_chunk(args);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_io_submit)
{
    u32 tgid;
    struct call_t *c = this_call(&tgid);
    if (!c)
        return 0;
    s64 ret = args->ret;
    if (c->nr > MAX_IOCBS && ret > MAX_IOCBS)
        count_drops(APP_DROP_IOCBS, ret - MAX_IOCBS);
    c->ret = ret;
    c->next = 0;
    c->fd_cache = -1;
    submit_exit_chunk(args);
    return 0;
}

static __always_inline void reap_chunk(void *ctx)
{
    u32 tgid;
    struct call_t *c = this_call(&tgid);
    if (!c)
        return;
    u64 end = c->nr < MAX_EVENTS ? c->nr : MAX_EVENTS;
    u64 now = bpf_ktime_get_ns();
    for (u32 j = 0; j < CHUNK; j++) {
        u64 i = c->next;
        if (i >= end) {
            call_done();
            return;
        }
        c->next = i + 1;
        u64 ev[3] = {};   /* data, obj (the iocb), res */
        if (bpf_probe_read_user(ev, sizeof(ev), (void *)(c->ptr + i * 32))) {
            count_drop(APP_DROP_UNREADABLE);
            continue;
        }
        struct start_key_t sk = {.tgid = tgid, .kind = START_LIBAIO, .ptr = ev[1]};
        struct start_val_t *s = starts.lookup(&sk);
        if (!s) {
            count_drop(APP_DROP_UNMATCHED);
            continue;
        }
        if (__sync_val_compare_and_swap(&s->state, ST_NEW, ST_DONE) == ST_NEW) {
            count_done(s, (s64)ev[2], now, 0);   /* io_submit's exit counts the submission */
            continue;
        }
        count_done(s, (s64)ev[2], now, 1);
        starts.delete(&sk);
    }
    if (c->next < end)
        tails.call(ctx, TAIL_REAP_EXIT);
    call_done();
}

int reap_exit_more(void *ctx)
{
    reap_chunk(ctx);
    return 0;
}

static __always_inline int reap_enter(u64 events)
{
    if (!traced())
        return 0;
    u32 tid = bpf_get_current_pid_tgid();
    struct call_t c = {.ptr = events};
    calls.update(&tid, &c);
    return 0;
}

static __always_inline int reap_exit(void *ctx, s64 ret)
{
    u32 tgid;
    struct call_t *c = this_call(&tgid);
    if (!c)
        return 0;
    if (ret <= 0) {
        call_done();
        return 0;
    }
    if (ret > MAX_EVENTS)
        count_drops(APP_DROP_EVENTS, ret - MAX_EVENTS);
    c->nr = ret;
    c->next = 0;
    reap_chunk(ctx);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_io_getevents) { return reap_enter((u64)args->events); }
TRACEPOINT_PROBE(syscalls, sys_exit_io_getevents) { return reap_exit(args, args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_io_pgetevents) { return reap_enter((u64)args->events); }
TRACEPOINT_PROBE(syscalls, sys_exit_io_pgetevents) { return reap_exit(args, args->ret); }

/* ---------------------------------------------------------------- io_uring */

TRACEPOINT_PROBE(io_uring, io_uring_submit_req)
{
    if (!traced())
        return 0;
    u8 opcode = args->opcode;
    u8 op;
    if (opcode == UOP_READ || opcode == UOP_READV || opcode == UOP_READ_FIXED)
        op = APP_READ;
    else if (opcode == UOP_WRITE || opcode == UOP_WRITEV || opcode == UOP_WRITE_FIXED)
        op = APP_WRITE;
    else
        return 0;
    u64 req = (u64)args->req;
    u64 flags = 0, addr = 0;
    s32 fd = -1;
    u32 len = 0;
    if (bpf_probe_read_kernel(&flags, 8, (void *)(req + REQ_FLAGS_OFF)) ||
        bpf_probe_read_kernel(&fd, 4, (void *)(req + REQ_FD_OFF)) ||
        bpf_probe_read_kernel(&addr, 8, (void *)(req + RW_ADDR_OFF)) ||
        bpf_probe_read_kernel(&len, 4, (void *)(req + RW_LEN_OFF))) {
        count_drop(APP_DROP_UNREADABLE);
        return 0;
    }
    if (flags & (1ULL << REQ_FIXED_BIT)) {
        count_drop(APP_DROP_FIXED);
        return 0;
    }
    s64 bytes = (opcode == UOP_READV || opcode == UOP_WRITEV) ? iov_bytes(addr, len) : len;
    struct start_val_t s = {.ts = bpf_ktime_get_ns(), .bytes = bytes, .state = ST_COUNTED};
    s.key.op = op;
    s.key.iface = IFACE_URING;
    int r = bytes < 0 ? -1 : resolve_fd(fd, &s.key);
    if (r < 0)
        count_drop(APP_DROP_UNREADABLE);
    if (r != 0)
        return 0;
    struct start_key_t sk = {.tgid = 0, .kind = START_URING, .ptr = req};
    int kept = starts.update(&sk, &s) == 0;
    if (!kept)
        count_drop(APP_DROP_START);
    count_submit(&s.key, s.bytes, kept);
    return 0;
}

TRACEPOINT_PROBE(io_uring, io_uring_complete)
{
    struct start_key_t sk = {.tgid = 0, .kind = START_URING, .ptr = (u64)args->req};
    struct start_val_t *s = starts.lookup(&sk);
    if (!s)
        return 0;   /* not a traced request (every ring's completions come here) */
    count_done(s, args->res, bpf_ktime_get_ns(), 1);
    starts.delete(&sk);
    return 0;
}
