# Every way to make a set-id file or directory, each printed as "<label> <OK|ERRNO>".
# Run in the workspace; leaves whatever the kernel let through for the test to find.
import ctypes
import errno
import os
import shutil

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
AT_FDCWD = -100
O_TMPFILE = 0o20200000


def sc(label, nr, *args):
    conv = [ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    r = libc.syscall(ctypes.c_long(nr), *conv)
    e = ctypes.get_errno()
    print(label, "OK" if r >= 0 else errno.errorcode.get(e, str(e)), flush=True)
    return r


def fresh(name):
    shutil.copy("/bin/true", name)
    os.chmod(name, 0o755)
    return name.encode()


for bits, tag in ((0o4000, "suid"), (0o2000, "sgid")):
    mode = 0o755 | bits
    sc(f"chmod_{tag}", 90, fresh(f"chmod_{tag}"), mode)
    fd = os.open(fresh(f"fchmod_{tag}"), os.O_RDONLY)
    sc(f"fchmod_{tag}", 91, fd, mode)
    os.close(fd)
    sc(f"fchmodat_{tag}", 268, AT_FDCWD, fresh(f"fchmodat_{tag}"), mode)
    sc(f"fchmodat2_{tag}", 452, AT_FDCWD, fresh(f"fchmodat2_{tag}"), mode, 0)
    sc(f"open_{tag}", 2, f"open_{tag}".encode(), os.O_CREAT | os.O_WRONLY, mode)
    sc(f"openat_{tag}", 257, AT_FDCWD, f"openat_{tag}".encode(), os.O_CREAT | os.O_WRONLY, mode)
    sc(f"creat_{tag}", 85, f"creat_{tag}".encode(), mode)
    sc(f"mknod_{tag}", 133, f"mknod_{tag}".encode(), 0o100000 | mode, 0)
    sc(f"mknodat_{tag}", 259, AT_FDCWD, f"mknodat_{tag}".encode(), 0o100000 | mode, 0)
    sc(f"mkdir_{tag}", 83, f"mkdir_{tag}".encode(), 0o777 | bits)
    sc(f"mkdirat_{tag}", 258, AT_FDCWD, f"mkdirat_{tag}".encode(), 0o777 | bits)
    # An unnamed file made set-id, then linked in.
    r = sc(f"tmpfile_{tag}", 257, AT_FDCWD, b".", O_TMPFILE | os.O_WRONLY, mode)
    if r >= 0:
        os.write(r, b"x")
        try:
            os.link(f"/proc/self/fd/{r}", f"tmpfile_{tag}", follow_symlinks=True)
        except OSError:
            pass
    # A plain directory made setgid/setuid afterwards.
    os.mkdir(f"dir_{tag}")
    sc(f"chmoddir_{tag}", 90, f"dir_{tag}".encode(), 0o777 | bits)
# openat2 (its mode is in a struct no filter can read) is not available at all.
how = (ctypes.c_uint64 * 3)(os.O_CREAT | os.O_WRONLY, 0o4755, 0)
r = libc.syscall(ctypes.c_long(437), ctypes.c_long(AT_FDCWD), ctypes.c_char_p(b"openat2_suid"),
                 ctypes.byref(how), ctypes.c_long(24))
print("openat2", "OK" if r >= 0 else errno.errorcode.get(ctypes.get_errno()), flush=True)
# Ordinary modes still work.
sc("chmod_plain", 90, fresh("plain"), 0o1755)
sc("open_plain", 2, b"open_plain", os.O_CREAT | os.O_WRONLY, 0o644)
sc("mkdir_sticky", 83, b"sticky", 0o1777)
