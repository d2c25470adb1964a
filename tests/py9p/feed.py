"""feed written by py9p: one value in three Twrites (then a pause), a second value at the
offset where the first ended, then clunk. Argument 2: the feed's path."""
import sys
import time

from py9p import py9p

from _common import check, connect, socket_arg

c = connect(socket_arg())
feed = sys.argv[2]
c.open(feed, py9p.OWRITE)
for chunk in (b"py9p ", b"wrote ", b"this\n"):
    check(c.write(chunk) == len(chunk), "short write")
time.sleep(2.5)
for chunk in (b"and then ", b"this\n"):
    check(c.write(chunk) == len(chunk), "short write")
c.close()
print("ok")
