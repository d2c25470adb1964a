"""Read help and backends through py9p (msize 8192: several reads if needed)."""
from _common import check, connect, read_all, socket_arg

c = connect(socket_arg())
h = read_all(c, "help").decode()
check("eventwait" in h and "ctl commands" in h, "help: %r" % h)
st = c.stat("help")
check(st[0].length == len(h.encode()), "help length %d vs %d" % (st[0].length, len(h)))
b = read_all(c, "backends").decode()
print("backends " + b.replace("\n", " ").strip())
# the same file again, from offset 0
check(read_all(c, "help").decode() == h, "second read differs")
print("ok")
