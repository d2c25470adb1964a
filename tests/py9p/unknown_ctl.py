"""An unknown ctl command fails the write with the server's one-line message."""
from py9p import py9p

from _common import check, connect, die, socket_arg

c = connect(socket_arg())
c.open("ctl", py9p.ORDWR)
try:
    c.write(b"frobnicate\n")
except py9p.RpcError as e:
    msg = str(e.args[0] if e.args else e)
    if isinstance(e.args[0], bytes):
        msg = e.args[0].decode()
    check("\n" not in msg, "not one line: %r" % msg)
    check("frobnicate" in msg and "help, invalidate, kill" in msg, "message: %r" % msg)
    print("error " + msg)
else:
    die("the write of an unknown command succeeded")
# the connection still works
c.open("help")
check(len(c.read(100)) > 0, "read after error")
c.close()
print("ok")
