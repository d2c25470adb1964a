"""Sessions and agents through py9p: session/new and agent/new (rdwr, per-fid reply), a
prompt, the chat with and without markers, cfg, plan, ctl, statewait woken by another
client, rename, and kill."""
import threading

from py9p import py9p

import _common
from _common import MSIZE, check, connect, socket_arg


def rdwr(c, path, data):
    return _common.rdwr(c, data, path).decode()


def write(c, path, data, mode=py9p.OWRITE):
    c.open(path, mode)
    check(c.write(data) == len(data), "short write to %s" % path)
    c.close()


def read(c, path):
    c.open(path, py9p.OREAD)
    out = b""
    while True:
        b = c.read(MSIZE)
        if not b:
            break
        out += b
    c.close()
    return out.decode()


def read_once(c, path):
    """One read at offset 0 (for blocking files, which return one value per read)."""
    c.open(path, py9p.OREAD)
    b = c.read(MSIZE)
    c.close()
    return b.decode()


sock = socket_arg()
c = connect(sock)
name = rdwr(c, "session/new", b"name=py cwd=/tmp\n").strip()
check(name == "py", "session name %r" % name)
print("session " + name)
aid = rdwr(c, "session/py/agent/new", b"name=bot\n").strip()
check(len(aid) == 36 and aid.count("-") == 4, "agent id %r" % aid)
print("agent " + aid)
check(read(c, "session/py/agent/bot/id").strip() == aid, "id file")
# The agent is reachable by id too.
check(read(c, "session/py/agent/%s/name" % aid).strip() == "bot", "walk by id")

# A prompt: the turn ends with the no-backend error, both in chat and chat.raw.
write(c, "session/py/agent/bot/prompt", b"hello from py9p\n")
for _ in range(200):
    if "no backend configured" in read(c, "session/py/agent/bot/log"):
        break
    threading.Event().wait(0.05)
raw = read(c, "session/py/agent/bot/log")
check("[[[user\nhello from py9p\n]]]\n" in raw, "chat.raw: %r" % raw)
check("[[[error\n" in raw, "error block: %r" % raw)
print("chat.raw ok")

# cfg: valid and invalid writes.
write(c, "session/py/agent/bot/cfg", b"temperature=0.5\n")
check("temperature=0.5" in read(c, "session/py/agent/bot/cfg"), "cfg set")
try:
    write(c, "session/py/agent/bot/cfg", b"colour=red\n")
    check(False, "unknown cfg key accepted")
except py9p.RpcError as e:
    msg = e.args[0] if e.args else ""
    print("cfg error " + (msg.decode() if isinstance(msg, bytes) else str(msg)))

# plan: write, truncate and rewrite.
write(c, "session/py/agent/bot/plan", b"step one\n")
check(read(c, "session/py/agent/bot/plan") == "step one\n", "plan")
write(c, "session/py/agent/bot/plan", b"two\n", py9p.OWRITE | py9p.OTRUNC)
check(read(c, "session/py/agent/bot/plan") == "two\n", "plan truncated")

# statewait blocks until another client pauses the session.
got = []


def waiter():
    w = connect(sock)
    got.append(read_once(w, "session/py/agent/bot/statewait"))


t = threading.Thread(target=waiter)
t.start()
threading.Event().wait(0.3)
check(rdwr(c, "session/py/ctl", b"pause\n") == "paused\n", "pause")
t.join(20)
check(got == ["paused\n"], "statewait got %r" % got)
print("statewait " + got[0].strip())
check(read(c, "session/py/paused").strip() == "true", "paused file")
rdwr(c, "session/py/ctl", b"resume\n")

# agent ctl, rename, kill.
check("stop" in rdwr(c, "session/py/agent/bot/ctl", b"help\n"), "agent ctl help")
write(c, "session/py/agent/bot/name", b"robot\n")
check("/session/py/agent/robot" in read(c, "aliases"), "aliases after rename")
check(rdwr(c, "session/py/agent/robot/ctl", b"kill\n") == "killed\n", "agent kill")
check(rdwr(c, "session/py/ctl", b"kill\n") == "killed\n", "session kill")
check("py\t" not in read(c, "session/idx"), "session gone")
print("ok")
