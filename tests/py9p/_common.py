"""Shared helpers for the py9p interop scripts (run by tests/tests/py9p.rs).

Every script takes the server's unix socket path as its first argument, prints what it saw,
and exits 0 on success or 1 with a message on stderr.
"""
import os
import pwd
import socket
import sys

from py9p import py9p

MSIZE = 8192


def die(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        die(msg)


def user():
    return pwd.getpwuid(os.getuid()).pw_name


def connect(path, uname=None):
    """A py9p client (Tversion msize 8192, Tauth refused, attach with NOFID)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(path)
    return py9p.Client(s, py9p.Credentials(uname or user()), msize=MSIZE)


def read_all(c, path, mode=py9p.OREAD):
    c.open(path, mode)
    out = b""
    while True:
        b = c.read(MSIZE)
        if not b:
            break
        out += b
    c.close()
    return out


def rdwr(c, cmd, path="ctl"):
    """Opens path (ctl by default) ORDWR, writes cmd, reads the reply from offset 0 on the
    same fid."""
    c.open(path, py9p.ORDWR)
    n = c.write(cmd)
    check(n == len(cmd), "short write %d of %d" % (n, len(cmd)))
    c.pos = 0
    out = b""
    while True:
        b = c.read(MSIZE)
        if not b:
            break
        out += b
    c.close()
    return out


def socket_arg():
    if len(sys.argv) < 2:
        print("usage: %s SOCKET" % sys.argv[0], file=sys.stderr)
        sys.exit(2)
    return sys.argv[1]
