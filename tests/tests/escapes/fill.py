# Memory held by file descriptors (ESCAPES case 42, memfd/tmpfs variant): RLIMIT_AS does not
# count it, only a memory cgroup does. Shared by the escape suite and the toolsrv suite.
#
# fill(kind, step, total): allocates `total` bytes in `step`-byte pieces, each a file kept
# open: kind "memfd" (memfd_create + posix_fallocate) or "shm" (files in /dev/shm, the run's
# private tmpfs). After each piece it prints "held BYTES SHMEM_GROWTH" (the host's Shmem from
# /proc/meminfo, relative to the start); "stopped ERRNO" when an allocation fails, "all BYTES"
# when everything was allocated. A kill by the OOM killer prints nothing more.
import errno
import os


def shmem():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


def fill(kind, step, total):
    base = shmem()
    print("base", base, flush=True)
    fds = []
    got = 0
    try:
        while got < total:
            if kind == "memfd":
                fd = os.memfd_create("fill")
            else:
                fd = os.open("/dev/shm/fill%d" % len(fds), os.O_CREAT | os.O_RDWR, 0o600)
            fds.append(fd)
            os.posix_fallocate(fd, 0, step)
            got += step
            print("held", got, shmem() - base, flush=True)
    except OSError as e:
        print("stopped", errno.errorcode.get(e.errno, str(e.errno)), flush=True)
        return
    print("all", got, flush=True)
