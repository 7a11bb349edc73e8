/* latency_drive.c: iotune's emulated NVMe drive, a FUSE daemon.
 *
 * Purpose: serve one file, "disk", backed by a regular file (pread/pwrite),
 *   so that every request takes a known service time and at most P requests
 *   are in service at once. A loop device with direct I/O on top of "disk"
 *   then behaves like a drive with known limits:
 *       IOPS = min(inflight / (L + overhead), P / L)
 *   where the overhead (kernel block layer, loop, FUSE round trip) is not
 *   emulated; iotune measures it (iotune/model/drive.py).
 *
 * Service: P virtual servers, first come first served (P = 0: unbounded).
 *   A request arriving at time a takes the server that frees up first,
 *   starts at max(a, free_at), and completes at start + L; the worker does
 *   its pread or pwrite, then sleeps until that absolute deadline
 *   (clock_nanosleep TIMER_ABSTIME on CLOCK_MONOTONIC, timer slack 1 ns).
 *   So at most P requests are in service at any instant, as with a counting
 *   semaphore of P permits, but the schedule is arithmetic: a semaphore
 *   loses the futex wake-up of the next waiter at every hand-over, which
 *   measured 7-10% below P / L here (7,000-7,500 IOPS instead of 8,000 at
 *   L = 1 ms, P = 8); this reaches 7,980-8,000.
 *   The delay applies whatever the backing file holds: a sparse backing
 *   file reads back zeros quickly, but each read still takes L. Backing
 *   I/O slower than L makes a request late without delaying the others.
 *
 * Files: "disk" (the drive, opened with direct_io so every request reaches
 *   us, never the page cache) and "stats" (read-only text counters, one
 *   "name value" per line, read to check the drive from outside).
 *
 * Tree mode (--backing-dir=DIR): instead of one "disk" file, the mount is a
 *   passthrough of DIR (directories, regular files: create, read, write,
 *   truncate, rename, unlink), every file opened with direct_io, and every
 *   read and write served under the same service model. Mounted directly
 *   as a swap path, it stands in for a network filesystem: no block device,
 *   real O_DIRECT, known latency. Its counters are in the read-only file
 *   ".iotune-drive-stats" at the root of the mount.
 *
 * Options (besides libfuse's own, e.g. -f -o max_threads=N):
 *   --backing=PATH   the regular file holding the data (must exist)
 *   --latency-ns=N   service time per request, nanoseconds
 *   --parallelism=N  requests in service at once, 0 = unbounded
 *
 * Sizes: max_write is raised to 1 MiB (libfuse then asks the kernel for
 *   256 pages per request), so a request of up to 1 MiB is one FUSE op;
 *   "stats" reports max_request_bytes to check it. (The loop device above
 *   may still split a request whose buffer is not physically contiguous:
 *   its queue takes 128 segments, much as an NVMe drive's takes 127.)
 *   max_background is raised from 12 to 256 so the kernel keeps that many
 *   asynchronous requests in flight; iotune runs up to 256 worker threads
 *   (-o max_threads), one per request in the daemon.
 *
 * Built by iotune/volumes/emulated.py with
 *   cc -O2 latency_drive.c $(pkg-config --cflags --libs fuse3)
 */
#define FUSE_USE_VERSION 312 /* >= 312, or libfuse ignores max_threads */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define MAX_REQUEST_BYTES (1u << 20)
#define MAX_BACKGROUND 256
#define FH_DISK 1
#define FH_STATS 2

struct options {
	char *backing;
	char *backing_dir;
	unsigned long latency_ns;
	unsigned parallelism;
};

static const struct fuse_opt option_spec[] = {
	{"--backing=%s", offsetof(struct options, backing), 0},
	{"--latency-ns=%lu", offsetof(struct options, latency_ns), 0},
	{"--parallelism=%u", offsetof(struct options, parallelism), 0},
	{"--backing-dir=%s", offsetof(struct options, backing_dir), 0},
	FUSE_OPT_END,
};

static struct {
	int fd;
	off_t size;
	int64_t latency_ns;
	unsigned parallelism;
	pthread_mutex_t lock;     /* guards free_at */
	int64_t *free_at;         /* per server: when it is next free, ns */
	atomic_ulong reads, writes, read_bytes, write_bytes, wait_ns;
	atomic_ulong max_request_bytes, inflight, max_inflight;
} drive = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int tree_root = -1;      /* tree mode: the backing directory */

static void raise_max(atomic_ulong *max, unsigned long value)
{
	unsigned long seen = atomic_load(max);
	while (value > seen && !atomic_compare_exchange_weak(max, &seen, value))
		;
}

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* When a request arriving at `arrival` starts service: at once with no bound
 * on parallelism, else when the earliest-free of the P servers frees up
 * (first come, first served), which then stays busy for L. */
static int64_t claim_server(int64_t arrival)
{
	if (drive.parallelism == 0)
		return arrival;
	pthread_mutex_lock(&drive.lock);
	unsigned best = 0;
	for (unsigned k = 1; k < drive.parallelism; k++)
		if (drive.free_at[k] < drive.free_at[best])
			best = k;
	int64_t start = drive.free_at[best] > arrival ? drive.free_at[best] : arrival;
	drive.free_at[best] = start + drive.latency_ns;
	pthread_mutex_unlock(&drive.lock);
	return start;
}

/* The deadline at which a request of `bytes` arriving now completes. */
static int64_t service_begin(size_t bytes)
{
	raise_max(&drive.max_inflight, atomic_fetch_add(&drive.inflight, 1) + 1);
	raise_max(&drive.max_request_bytes, bytes);
	int64_t arrival = now_ns();
	int64_t start = claim_server(arrival);
	atomic_fetch_add(&drive.wait_ns, (unsigned long)(start - arrival));
	return start + drive.latency_ns;
}

/* Sleep until the absolute deadline. */
static void service_end(int64_t deadline)
{
	struct timespec t = {.tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
		;
	atomic_fetch_sub(&drive.inflight, 1);
}

static int format_stats(char *buf, size_t len)
{
	return snprintf(buf, len,
		"reads %lu\nwrites %lu\nread_bytes %lu\nwrite_bytes %lu\n"
		"max_request_bytes %lu\nmax_inflight %lu\nwait_ns %lu\n"
		"latency_ns %ld\nparallelism %u\n",
		atomic_load(&drive.reads), atomic_load(&drive.writes),
		atomic_load(&drive.read_bytes), atomic_load(&drive.write_bytes),
		atomic_load(&drive.max_request_bytes), atomic_load(&drive.max_inflight),
		atomic_load(&drive.wait_ns), (long)drive.latency_ns, drive.parallelism);
}

static void *drive_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	conn->max_background = MAX_BACKGROUND;
	conn->congestion_threshold = MAX_BACKGROUND * 3 / 4;
	conn->max_write = MAX_REQUEST_BYTES;
	conn->max_readahead = 0;
	if (conn->capable & FUSE_CAP_ASYNC_DIO)
		conn->want |= FUSE_CAP_ASYNC_DIO;
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	cfg->direct_io = 1;
	cfg->kernel_cache = 0;
	cfg->nullpath_ok = tree_root < 0;   /* tree mode names files by path */
	cfg->attr_timeout = 3600;
	cfg->entry_timeout = 3600;
	return NULL;
}

/* With nullpath_ok, calls on an open file may come with path NULL and the
 * file handle set: name the file from the handle then. */
static const char *name_of(const char *path, const struct fuse_file_info *fi)
{
	if (path != NULL)
		return path;
	if (fi != NULL && fi->fh == FH_DISK)
		return "/disk";
	return fi != NULL && fi->fh == FH_STATS ? "/stats" : "/";
}

static int drive_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	path = name_of(path, fi);
	memset(st, 0, sizeof(*st));
	st->st_nlink = 1;
	if (strcmp(path, "/") == 0) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
	} else if (strcmp(path, "/disk") == 0) {
		st->st_mode = S_IFREG | 0600;
		st->st_size = drive.size;
		st->st_blocks = drive.size / 512;
	} else if (strcmp(path, "/stats") == 0) {
		st->st_mode = S_IFREG | 0444;
		st->st_size = 4096;
	} else {
		return -ENOENT;
	}
	return 0;
}

static int drive_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
			 struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)path, (void)off, (void)fi, (void)flags; /* only "/" is a directory */
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	fill(buf, "disk", NULL, 0, 0);
	fill(buf, "stats", NULL, 0, 0);
	return 0;
}

static int drive_open(const char *path, struct fuse_file_info *fi)
{
	if (strcmp(path, "/disk") == 0)
		fi->fh = FH_DISK;
	else if (strcmp(path, "/stats") == 0 && (fi->flags & O_ACCMODE) == O_RDONLY)
		fi->fh = FH_STATS;
	else
		return strcmp(path, "/stats") == 0 ? -EACCES : -ENOENT;
	fi->direct_io = 1;
	fi->keep_cache = 0;
	return 0;
}

static int read_stats(char *buf, size_t size, off_t off)
{
	char text[1024];
	int len = format_stats(text, sizeof(text));
	if (off >= len)
		return 0;
	size_t n = (size_t)(len - off) < size ? (size_t)(len - off) : size;
	memcpy(buf, text + off, n);
	return (int)n;
}

static int drive_read(const char *path, char *buf, size_t size, off_t off,
		      struct fuse_file_info *fi)
{
	(void)path;
	if (fi->fh == FH_STATS)
		return read_stats(buf, size, off);
	int64_t deadline = service_begin(size);
	ssize_t n = pread(drive.fd, buf, size, off);
	int err = errno;
	service_end(deadline);
	if (n < 0)
		return -err;
	atomic_fetch_add(&drive.reads, 1);
	atomic_fetch_add(&drive.read_bytes, (unsigned long)n);
	return (int)n;
}

static int drive_write(const char *path, const char *buf, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	(void)path;
	if (fi->fh != FH_DISK)
		return -EBADF;
	int64_t deadline = service_begin(size);
	ssize_t n = pwrite(drive.fd, buf, size, off);
	int err = errno;
	service_end(deadline);
	if (n < 0)
		return -err;
	atomic_fetch_add(&drive.writes, 1);
	atomic_fetch_add(&drive.write_bytes, (unsigned long)n);
	return (int)n;
}

/* Flushes and fsyncs complete at once: the emulated drive has no volatile
 * cache to write back (the backing file's page cache is not the drive's). */
static int drive_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)path, (void)datasync, (void)fi;
	return 0;
}

static int drive_flush(const char *path, struct fuse_file_info *fi)
{
	(void)path, (void)fi;
	return 0;
}

/* Discards (the loop device punches holes) go to the backing file. */
static int drive_fallocate(const char *path, int mode, off_t off, off_t len,
			   struct fuse_file_info *fi)
{
	(void)path;
	if (fi == NULL || fi->fh != FH_DISK)
		return -EOPNOTSUPP;
	return fallocate(drive.fd, mode, off, len) == 0 ? 0 : -errno;
}

static const struct fuse_operations drive_ops = {
	.init = drive_init,
	.getattr = drive_getattr,
	.readdir = drive_readdir,
	.open = drive_open,
	.read = drive_read,
	.write = drive_write,
	.fsync = drive_fsync,
	.flush = drive_flush,
	.fallocate = drive_fallocate,
};


/* ---------------------------------------------------------------- tree mode */

#define TREE_STATS "/.iotune-drive-stats"

/* The backing path of a FUSE path, relative to tree_root ("." for "/"). */
static const char *rel(const char *path)
{
	return path[1] ? path + 1 : ".";
}

static int tree_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	if (fi != NULL && fi->fh > FH_STATS)
		return fstat((int)fi->fh - FH_STATS - 1, st) == 0 ? 0 : -errno;
	if (strcmp(path, TREE_STATS) == 0) {
		memset(st, 0, sizeof(*st));
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = 4096;
		return 0;
	}
	return fstatat(tree_root, rel(path), st, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : -errno;
}

static int tree_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
			struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)off, (void)fi, (void)flags;
	int fd = openat(tree_root, rel(path), O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (d == NULL) {
		close(fd);
		return -errno;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		fill(buf, e->d_name, NULL, 0, 0);
	closedir(d);
	return 0;
}

static int tree_mkdir(const char *path, mode_t mode)
{
	return mkdirat(tree_root, rel(path), mode) == 0 ? 0 : -errno;
}

static int tree_rmdir(const char *path)
{
	return unlinkat(tree_root, rel(path), AT_REMOVEDIR) == 0 ? 0 : -errno;
}

static int tree_unlink(const char *path)
{
	return unlinkat(tree_root, rel(path), 0) == 0 ? 0 : -errno;
}

static int tree_rename(const char *from, const char *to, unsigned int flags)
{
	if (flags)
		return -EINVAL;
	return renameat(tree_root, rel(from), tree_root, rel(to)) == 0 ? 0 : -errno;
}

static int tree_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	if (fi != NULL && fi->fh > FH_STATS)
		return ftruncate((int)fi->fh - FH_STATS - 1, size) == 0 ? 0 : -errno;
	int fd = openat(tree_root, rel(path), O_WRONLY);
	if (fd < 0)
		return -errno;
	int rc = ftruncate(fd, size) == 0 ? 0 : -errno;
	close(fd);
	return rc;
}

static int tree_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	(void)fi;
	return fchmodat(tree_root, rel(path), mode, 0) == 0 ? 0 : -errno;
}

static int tree_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	(void)fi;
	return utimensat(tree_root, rel(path), tv, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : -errno;
}

/* A file handle is FH_STATS + 1 + the backing fd (0 and FH_DISK unused here). */
static int tree_opened(struct fuse_file_info *fi, int fd)
{
	if (fd < 0)
		return -errno;
	fi->fh = (uint64_t)fd + FH_STATS + 1;
	fi->direct_io = 1;
	fi->keep_cache = 0;
	return 0;
}

static int tree_open(const char *path, struct fuse_file_info *fi)
{
	if (strcmp(path, TREE_STATS) == 0) {
		if ((fi->flags & O_ACCMODE) != O_RDONLY)
			return -EACCES;
		fi->fh = FH_STATS;
		fi->direct_io = 1;
		return 0;
	}
	int flags = fi->flags & ~(O_CREAT | O_EXCL | O_NOCTTY | O_DIRECT);
	return tree_opened(fi, openat(tree_root, rel(path), flags | O_CLOEXEC));
}

static int tree_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	int flags = (fi->flags & ~(O_NOCTTY | O_DIRECT)) | O_CREAT;
	return tree_opened(fi, openat(tree_root, rel(path), flags | O_CLOEXEC, mode));
}

static int tree_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	if (fi->fh > FH_STATS)
		close((int)fi->fh - FH_STATS - 1);
	return 0;
}

static int tree_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	if (fi->fh == FH_STATS)
		return read_stats(buf, size, off);
	int64_t deadline = service_begin(size);
	ssize_t n = pread((int)fi->fh - FH_STATS - 1, buf, size, off);
	int err = errno;
	service_end(deadline);
	if (n < 0)
		return -err;
	atomic_fetch_add(&drive.reads, 1);
	atomic_fetch_add(&drive.read_bytes, (unsigned long)n);
	return (int)n;
}

static int tree_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	if (fi->fh <= FH_STATS)
		return -EBADF;
	int64_t deadline = service_begin(size);
	ssize_t n = pwrite((int)fi->fh - FH_STATS - 1, buf, size, off);
	int err = errno;
	service_end(deadline);
	if (n < 0)
		return -err;
	atomic_fetch_add(&drive.writes, 1);
	atomic_fetch_add(&drive.write_bytes, (unsigned long)n);
	return (int)n;
}

static int tree_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
	(void)path;
	if (fi == NULL || fi->fh <= FH_STATS)
		return -EOPNOTSUPP;
	return fallocate((int)fi->fh - FH_STATS - 1, mode, off, len) == 0 ? 0 : -errno;
}

static int tree_statfs(const char *path, struct statvfs *sv)
{
	(void)path;
	return fstatvfs(tree_root, sv) == 0 ? 0 : -errno;
}

static const struct fuse_operations tree_ops = {
	.init = drive_init,
	.getattr = tree_getattr,
	.readdir = tree_readdir,
	.mkdir = tree_mkdir,
	.rmdir = tree_rmdir,
	.unlink = tree_unlink,
	.rename = tree_rename,
	.truncate = tree_truncate,
	.chmod = tree_chmod,
	.utimens = tree_utimens,
	.open = tree_open,
	.create = tree_create,
	.release = tree_release,
	.read = tree_read,
	.write = tree_write,
	.fsync = drive_fsync,
	.flush = drive_flush,
	.fallocate = tree_fallocate,
	.statfs = tree_statfs,
};

static int open_backing(const char *path)
{
	struct stat st;
	drive.fd = open(path, O_RDWR | O_CLOEXEC);
	if (drive.fd < 0 || fstat(drive.fd, &st) != 0) {
		fprintf(stderr, "latency_drive: cannot open backing file %s: %s\n", path, strerror(errno));
		return -1;
	}
	drive.size = st.st_size;
	return 0;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct options opts = {0};
	if (fuse_opt_parse(&args, &opts, option_spec, NULL) == -1)
		return 2;
	if ((opts.backing == NULL) == (opts.backing_dir == NULL)) {
		fprintf(stderr, "latency_drive: give one of --backing=FILE or --backing-dir=DIR\n");
		return 2;
	}
	if (opts.backing_dir != NULL) {
		tree_root = open(opts.backing_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (tree_root < 0) {
			fprintf(stderr, "latency_drive: cannot open backing directory %s: %s\n",
				opts.backing_dir, strerror(errno));
			return 1;
		}
	} else if (open_backing(opts.backing) != 0) {
		return 1;
	}
	drive.latency_ns = (int64_t)opts.latency_ns;
	drive.parallelism = opts.parallelism;
	drive.free_at = calloc(drive.parallelism ? drive.parallelism : 1, sizeof(int64_t));
	if (drive.free_at == NULL)
		return 1;
	/* Timer slack 1 ns (worker threads inherit it) so sleeps end on time;
	 * and the drive goes away with the process that started it. */
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
	/* Keep 1 MiB request buffers on the heap instead of mmap/munmap per request. */
	mallopt(M_MMAP_THRESHOLD, 64 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
	umask(0);
	int rc = fuse_main(args.argc, args.argv, tree_root >= 0 ? &tree_ops : &drive_ops, NULL);
	fuse_opt_free_args(&args);
	return rc;
}
