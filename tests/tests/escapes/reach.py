# Tries to reach host unix sockets (argv: datagram, seqpacket and stream socket paths) from
# the sockets a tool can make; each attempt prints "<label> <OK|ERRNO>".
import array
import socket
import sys

from t import t

DG, SEQ, ST = sys.argv[1:4]
RIGHTS = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0]))]


def pair(ty):
    return socket.socketpair(socket.AF_UNIX, ty)


t("dgram_pair", lambda: pair(socket.SOCK_DGRAM))
for ty, name in ((socket.SOCK_STREAM, "stream"), (socket.SOCK_SEQPACKET, "seq")):
    for target, tname in ((DG, "dg"), (SEQ, "seq"), (ST, "st")):
        a, b = pair(ty)
        t(f"{name}_sendto_{tname}", lambda: a.sendto(b"x", target))
        t(f"{name}_rights_{tname}", lambda: a.sendmsg([b"x"], RIGHTS, 0, target))
        t(f"{name}_connect_{tname}", lambda: a.connect(target))
        a.close()
        b.close()
a, b = pair(socket.SOCK_STREAM)
t("bind_abstract", lambda: a.bind("\0/tmp/.X11-unix/X7"))
t("bind_path", lambda: b.bind("s.sock"))
