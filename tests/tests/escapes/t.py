# Probe helpers for the escape suite, copied into each workspace as t.py.
# Every probe prints one line: "<label> <OK|ERRNO-NAME|ExceptionName>".
import ctypes
import errno
import fcntl
import os
import socket
import sys

libc = ctypes.CDLL(None, use_errno=True)


def t(name, f):
    try:
        f()
        print(name, "OK")
    except socket.gaierror as e:
        print(name, "gaierror")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, str(e.errno)))
    except Exception as e:  # noqa: BLE001 - the class name is the result
        print(name, type(e).__name__)
    sys.stdout.flush()


def sc(name, nr, *args):
    """Raw syscall with integer arguments; prints OK or the errno name."""
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    print(name, "OK" if r >= 0 else errno.errorcode.get(e, str(e)))
    sys.stdout.flush()


def write(path, mode="w"):
    with open(path, mode) as f:
        f.write("x")


def sock(family, kind, proto=0):
    s = socket.socket(family, kind, proto)
    s.close()


def watch(path):
    """inotify_add_watch on `path` (all events); raises OSError like the os module does."""
    fd = libc.inotify_init1(0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    r = libc.inotify_add_watch(fd, os.fsencode(path), 0xFFF)
    e = ctypes.get_errno()
    os.close(fd)
    if r < 0:
        raise OSError(e, "inotify_add_watch")
