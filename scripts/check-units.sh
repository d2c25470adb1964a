#!/usr/bin/env bash
# Checks the systemd units in packaging/systemd/: `systemd-analyze verify` on copies whose
# ExecStart points at the built binaries (the installed paths do not exist here; the boot test
# verifies the installed units too), and `systemd-analyze security --offline=yes` with the
# system service held to exposure 1.0 (--threshold=10 on the 0–100 scale). Prints every
# unit's exposure.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir="${OLLIE_BIN_DIR:-$PWD/target/debug}"
[ -x "$bin_dir/olliesrv" ] || { echo "check-units: $bin_dir/olliesrv is missing (cargo build --bins)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

status=0
# verify: the system and the user units, each set in a directory of its own.
for set in system user; do
  src=packaging/systemd
  [ "$set" = user ] && src=packaging/systemd/user
  mkdir -p "$tmp/$set"
  for u in "$src"/olliesrv.socket "$src"/olliesrv.service; do
    sed "s|^ExecStart=/usr/bin/|ExecStart=$bin_dir/|" "$u" > "$tmp/$set/$(basename "$u")"
  done
  args=(--man=no)
  [ "$set" = user ] && args+=(--user)
  # (a user manager needs a runtime directory, even to verify)
  [ -d "$tmp/runtime" ] || mkdir -m 0700 "$tmp/runtime"
  out=$(cd "$tmp/$set" && XDG_RUNTIME_DIR="$tmp/runtime" \
    systemd-analyze verify "${args[@]}" ./olliesrv.socket ./olliesrv.service 2>&1) || status=1
  if [ -n "$out" ]; then
    echo "check-units: verify ($set units):" >&2
    echo "$out" >&2
    status=1
  else
    echo "verify ($set units): clean"
  fi
done

# The drop-ins must merge into a unit that still verifies.
mkdir -p "$tmp/dropins/olliesrv.service.d"
cp "$tmp/system/olliesrv.socket" "$tmp/system/olliesrv.service" "$tmp/dropins/"
cp packaging/systemd/dropins/*.conf "$tmp/dropins/olliesrv.service.d/"
out=$(cd "$tmp/dropins" && systemd-analyze verify --man=no ./olliesrv.socket ./olliesrv.service 2>&1) || status=1
if [ -n "$out" ]; then
  echo "check-units: verify (system units with every drop-in):" >&2
  echo "$out" >&2
  status=1
else
  echo "verify (system units with every drop-in): clean"
fi

exposure() { XDG_RUNTIME_DIR="$tmp/runtime" systemd-analyze security --offline=yes "$@" 2>&1 | sed -n 's/.*Overall exposure level for \([^:]*\): \([0-9.]*\).*/\1 \2/p'; }
echo "exposure: system $(exposure packaging/systemd/olliesrv.service | cut -d' ' -f2)" \
  "(threshold 1.0), user $(exposure --user packaging/systemd/user/olliesrv.service | cut -d' ' -f2)"
if ! systemd-analyze security --offline=yes --threshold=10 packaging/systemd/olliesrv.service >/dev/null 2>&1; then
  echo "check-units: the system service's exposure is above 1.0:" >&2
  systemd-analyze security --offline=yes packaging/systemd/olliesrv.service 2>&1 | grep '✗' >&2 || true
  status=1
fi
exit "$status"
