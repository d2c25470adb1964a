# The egress suite's packages, written under ROOT (the origins' document root) by the test
# before the tools ask for them: `fixtures.py ROOT PORT pip|npm`.
#   pip: a pure-Python wheel (a zip of ollie_demo/__init__.py and its dist-info) and a
#        PEP 503 simple index for it: /simple/ollie-demo/ links to /files/….whl#sha256=….
#   npm: a package tarball (package/package.json, package/index.js) and its registry
#        metadata at /ollie-demo (index.json), whose tarball URL is
#        https://registry.test:PORT/ollie-demo/-/ollie-demo-1.0.0.tgz.
import base64
import hashlib
import io
import json
import os
import sys
import tarfile
import zipfile

root, port, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def write(rel, data):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def b64(digest):
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


if what == "pip":
    dist = "ollie_demo-1.0.dist-info"
    files = {
        "ollie_demo/__init__.py": b'VALUE = "from the local index"\n',
        dist + "/METADATA": b"Metadata-Version: 2.1\nName: ollie-demo\nVersion: 1.0\n",
        dist + "/WHEEL": b"Wheel-Version: 1.0\nGenerator: ollie-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        "%s,sha256=%s,%d\n" % (p, b64(hashlib.sha256(d).digest()), len(d))
        for p, d in files.items()
    )
    files[dist + "/RECORD"] = (record + dist + "/RECORD,,\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            z.writestr(p, d)
    wheel = "ollie_demo-1.0-py3-none-any.whl"
    data = buf.getvalue()
    write("files/" + wheel, data)
    write("simple/index.html", b'<html><body><a href="ollie-demo/">ollie-demo</a></body></html>\n')
    link = '<a href="../../files/%s#sha256=%s">%s</a>' % (
        wheel,
        hashlib.sha256(data).hexdigest(),
        wheel,
    )
    write("simple/ollie-demo/index.html", ("<html><body>%s</body></html>\n" % link).encode())
elif what == "npm":
    files = {
        "package/package.json": json.dumps(
            {"name": "ollie-demo", "version": "1.0.0", "main": "index.js"}
        ).encode(),
        "package/index.js": b'module.exports = "from the local registry";\n',
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for p, d in files.items():
            info = tarfile.TarInfo(p)
            info.size = len(d)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(d))
    data = buf.getvalue()
    write("ollie-demo/-/ollie-demo-1.0.0.tgz", data)
    version = {
        "name": "ollie-demo",
        "version": "1.0.0",
        "main": "index.js",
        "dist": {
            "tarball": "https://registry.test:%d/ollie-demo/-/ollie-demo-1.0.0.tgz" % port,
            "shasum": hashlib.sha1(data).hexdigest(),
            "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
        },
    }
    meta = {
        "name": "ollie-demo",
        "dist-tags": {"latest": "1.0.0"},
        "versions": {"1.0.0": version},
    }
    write("ollie-demo/index.json", json.dumps(meta).encode())
else:
    sys.exit("fixtures.py: give pip or npm")
