"""Two py9p clients at once, interleaving requests; each reads its own ctl reply."""
from py9p import py9p

from _common import MSIZE, check, connect, socket_arg

a = connect(socket_arg())
b = connect(socket_arg())
a.open("ctl", py9p.ORDWR)
b.open("ctl", py9p.ORDWR)
a.write(b"help")
b.write(b"invalidate")
a.pos = 0
b.pos = 0
ra = a.read(MSIZE).decode()
rb = b.read(MSIZE).decode()
check(ra.startswith("help\t"), "client a got %r" % ra)
check(rb.startswith("config reloaded"), "client b got %r" % rb)
a.close()
b.close()
check(sorted(a.ls()) == sorted(b.ls()), "listings differ")
print("a " + ra.splitlines()[0])
print("b " + rb.strip())
print("ok")
