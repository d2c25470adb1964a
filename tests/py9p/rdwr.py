"""rdwr on ctl: open ORDWR, write a command, read the reply from offset 0 on the same fid."""
from py9p import py9p

from _common import check, connect, rdwr, socket_arg

c = connect(socket_arg())
r = rdwr(c, b"help\n").decode()
for cmd in ("help", "invalidate", "kill"):
    check(any(l.startswith(cmd) for l in r.splitlines()), "%s missing: %r" % (cmd, r))
print("reply " + r.replace("\n", "|"))
# a plain write (OWRITE|OTRUNC), as `echo help > ctl` would do
c.open("ctl", py9p.OWRITE | py9p.OTRUNC)
check(c.write(b"help\n") == 5, "write")
c.close()
print("ok")
