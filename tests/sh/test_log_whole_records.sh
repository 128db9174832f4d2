# A log whose files cannot grow (the process's file size limit, a full
# filesystem) ends with its last whole record: the record that does not fit
# is left out or cut back, metrics.jsonl has no partial line and the event
# file no partial record, and the failure is one error line naming the file
# (and, uncaught, the script's line) with a non-zero exit; sync, async and
# fsync writers alike, with SIGXFSZ ignored or at its default (which kills);
# on the full filesystem also a JSONL-only log, so the cut-back of a line
# written partway is tried as well as that of an event.
set -u
dir=out/.test_log_whole_records.$$
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
W=tests/scripts/log_until_full.lua

# every line of metrics.jsonl parses and ends in a newline, steps 1..n; every
# event record's length and CRCs check and nothing follows the last one.
# Prints "lines events".
check() { # logdir
  python3 - "$1" <<'PY'
import glob, json, struct, sys
d = sys.argv[1]
data = open(d + "/metrics.jsonl", "rb").read()
if data and not data.endswith(b"\n"): sys.exit("the last line is partial: %r" % data[-60:])
recs = [json.loads(l) for l in data.split(b"\n")[:-1]]
if [r["step"] for r in recs] != list(range(1, len(recs) + 1)): sys.exit("steps have a gap")
T = []
for i in range(256):
    c = i
    for _ in range(8): c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    T.append(c)
def crc(b):
    c = 0xFFFFFFFF
    for x in b: c = (c >> 8) ^ T[(c ^ x) & 0xFF]
    return c ^ 0xFFFFFFFF
def masked(b):
    c = crc(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
evs = glob.glob(d + "/events.out.tfevents.*")
b, i, n = open(evs[0], "rb").read() if evs else b"", 0, 0
while i < len(b):
    if len(b) - i < 12: sys.exit("a partial record header at byte %d" % i)
    (ln,) = struct.unpack("<Q", b[i:i+8])
    if struct.unpack("<I", b[i+8:i+12])[0] != masked(b[i:i+8]): sys.exit("a bad length CRC at byte %d" % i)
    if len(b) - i < 16 + ln: sys.exit("a partial record at byte %d" % i)
    if struct.unpack("<I", b[i+12+ln:i+16+ln])[0] != masked(b[i+12:i+12+ln]): sys.exit("a bad data CRC at byte %d" % i)
    i, n = i + 16 + ln, n + 1
print(len(recs), n)
PY
}

# the file size limit: 1, 2 and 3 KiB, each writer mode, SIGXFSZ ignored or not
for kib in 1 2 3; do
  for mode in sync async fsync; do
    for xfsz in ignored default; do
      d="$dir/fsize_${kib}_${mode}_$xfsz"
      mkdir -p "$d"
      if [ "$xfsz" = ignored ]; then trap_cmd="trap '' XFSZ;"; else trap_cmd=""; fi
      out=$(bash -c "$trap_cmd ulimit -f $kib; exec \"\$0\" $W \"\$1\" $mode" "$CKRUN" "$d" 2>&1)
      rc=$?
      counts=$(check "$d" 2>&1)
      crc=$?
      lines=${counts% *}
      size=$(stat -c %s "$d/metrics.jsonl")
      [ "$rc" != 0 ] && [ "$crc" = 0 ] && [ "$lines" -gt 3 ] && [ "$size" -le $((kib * 1024)) ] &&
        [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] &&
        printf '%s\n' "$out" | grep -qE "^ckrun: $W:1[0-9]: log: cannot write '$d/(metrics\.jsonl|events\.out\.tfevents[^']*)': File too large .*the last whole record"
      ok $? "file size limit ${kib} KiB, $mode, SIGXFSZ $xfsz: exit $rc, $counts (lines, events) whole; $out"
    done
  done
done

# a full filesystem: a 64 KiB tmpfs in a mount namespace of its own, where
# writes end short (ENOSPC partway through a record) and are cut back
if [ "$(id -u)" = 0 ] && unshare -m true 2> /dev/null; then
  for mode in sync async fsync jsonl; do
    d="$dir/full_$mode"
    mkdir -p "$d"
    out=$(unshare -m bash -c 'mount -t tmpfs -o size=64k tmpfs "$1" && "$0" tests/scripts/log_until_full.lua "$1" "$2" catch; rc=$?; cp "$1"/metrics.jsonl "$1.jsonl"; cp "$1"/events.out.tfevents.* "$1.events" 2> /dev/null; exit $rc' \
      "$CKRUN" "$d" "$mode" 2>&1)
    rc=$?
    mkdir -p "$d.copy" && mv "$d.jsonl" "$d.copy/metrics.jsonl"
    [ -e "$d.events" ] && mv "$d.events" "$d.copy/events.out.tfevents.copy"
    counts=$(check "$d.copy" 2>&1)
    crc=$?
    lines=${counts% *}
    [ "$rc" = 0 ] && [ "$crc" = 0 ] && [ "$lines" -gt 100 ] &&
      printf '%s\n' "$out" | grep -qE "^write: .*log: cannot write '$d/[^']*': No space left on device; the file ends with the last whole record \| close: "
    ok $? "a full 64 KiB filesystem, $mode: $counts (lines, events) whole; $out"
  done
else
  echo "skip a full filesystem: mounting a tmpfs needs root and unshare"
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
