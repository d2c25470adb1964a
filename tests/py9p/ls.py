"""ls (short and long) of the root through py9p."""
from _common import check, connect, socket_arg


def s(x):
    return x.decode() if isinstance(x, bytes) else x


c = connect(socket_arg())
short = sorted(s(n) for n in c.ls())
ROOT = ["agents", "aliases", "backends", "bypass", "ctl", "eventwait", "generate", "help",
        "lasterror", "models", "session", "skills", "tools"]
check(short == ROOT, "short ls: %r" % short)
for name in short:
    print("short " + name)
c.open()
entries = c.lsdir()
c.close()
long_ = {}
for d in entries:
    d.name, d.uid, d.gid = s(d.name), s(d.uid), s(d.gid)
    long_[d.name] = d.tolstr()
check(sorted(long_) == short, "long ls: %r" % long_)
for name in short:
    print("long " + long_[name])
check(long_["ctl"].startswith("-rw------- "), "ctl line: %r" % long_["ctl"])
check(long_["help"].startswith("-r--r--r-- "), "help line: %r" % long_["help"])
# ls -l through the library's own formatting, too
lib = c.ls(long=1)
check(len(lib) == len(ROOT), "ls(long=1): %r" % lib)
# ls of one file by name
one = c.ls(long=0, args=["help"])
check(one == ["help"], "ls help: %r" % one)
print("ok")
