"""A blocked eventwait Tread flushed with Tflush: Rflush arrives, no Rread for the old tag.

py9p's own _flush flushes its own tag, so the Tread and Tflush are built by hand.
"""
import json

from py9p import py9p

from _common import MSIZE, check, connect, read_all, socket_arg

c = connect(socket_arg())
c.open("eventwait")
fid = c.F

rd = py9p.Fcall(py9p.Tread, tag=5)
rd.fid = fid
rd.offset = 0
rd.count = MSIZE - py9p.IOHDRSZ
c.fd.send(rd)

# While it is parked, a request on another fid is answered first.
st = py9p.Fcall(py9p.Tstat, tag=7)
st.fid = c.ROOT
c.fd.send(st)
r = c.fd.recv()
check(r.tag == 7 and r.type == py9p.Rstat, "expected Rstat tag 7, got type %d tag %d" % (r.type, r.tag))

fl = py9p.Fcall(py9p.Tflush, tag=6)
fl.oldtag = 5
c.fd.send(fl)
r = c.fd.recv()
check(r.type == py9p.Rflush and r.tag == 6, "expected Rflush tag 6, got type %d tag %d" % (r.type, r.tag))
print("rflush")

# No Rread for tag 5: the next reply is for the next request (tag 5 reused for a stat).
st = py9p.Fcall(py9p.Tstat, tag=5)
st.fid = c.ROOT
c.fd.send(st)
r = c.fd.recv()
check(r.tag == 5 and r.type == py9p.Rstat, "expected Rstat tag 5, got type %d tag %d" % (r.type, r.tag))

# The connection still works, and the flushed read did not swallow the next event:
# park a new read on the same fid, make an event from a second client, and receive it.
rd = py9p.Fcall(py9p.Tread, tag=8)
rd.fid = fid
rd.offset = 0
rd.count = MSIZE - py9p.IOHDRSZ
c.fd.send(rd)
c2 = connect(socket_arg())
c2.open("ctl", py9p.OWRITE)
c2.write(b"invalidate")
c2.close()
r = c.fd.recv()
check(r.type == py9p.Rread and r.tag == 8, "expected Rread tag 8, got type %d tag %d" % (r.type, r.tag))
ev = json.loads(r.data.decode())
check(ev["event"] == "config-reloaded", "event: %r" % ev)
print("event " + ev["event"])
c.close()
check(len(read_all(c, "backends")) > 0, "read after flush")
print("ok")
