# Hostile tokenizer files, made here, against ckrun's limits: a bpe .txt.gz
# bomb (100 MiB of zeros in 100 KiB, its declared size true or a lie), a
# vocab.json of a million entries (21 MB) and the same as a tokenizer.json.
# Under --max-memory 64M each load ends in one line naming the script line,
# what would pass the limit and the value that allows it, with a peak RSS
# (the whole process, from wait4) far below what the file asks for; sent
# SIGINT 0.5 s into a load, ckrun exits within 1 s with the interrupt naming
# the line; inside ck.call_limited under --callback-budget 1000000 each load
# (and ck.json_decode of the 21 MB text) stops with the budget's error.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
cd "$t" || exit 1
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }
# sanitizer builds map shadow memory and keep freed blocks in quarantine
BOUND=$((200 << 20))
case "$CK" in *asan*) BOUND=$((400 << 20)) ;; esac

# run ARGS...: ckrun's stdout and stderr in out, err; its exit status in rc,
# its peak RSS in bytes in rss
run() {
  python3 - "$@" > rss 2> /dev/null <<'PY'
import os, subprocess, sys
with open("out", "wb") as o, open("err", "wb") as e:
    p = subprocess.Popen(sys.argv[1:], stdout=o, stderr=e)
    _, status, ru = os.wait4(p.pid, 0)
print(os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024)
PY
  read -r rc rss < rss
}

# the files: a bomb whose last four bytes (gzip's ISIZE) say 100 MiB, one
# whose say 4096; a folder with a 21 MB vocab.json (and merges.txt), one
# with the same vocabulary as a tokenizer.json
head -c $((100 << 20)) /dev/zero | gzip -1 > bomb.gz
cp bomb.gz liar.gz
printf '\000\020\000\000' | dd of=liar.gz bs=1 seek=$(( $(stat -c %s liar.gz) - 4 )) conv=notrunc 2> /dev/null
mkdir big big_json small
vocab() { # N: a vocab.json of N entries
  awk -v n="$1" 'BEGIN { printf "{\"<|startoftext|>\": 0, \"<|endoftext|>\": 1"
                         for (i = 2; i < n; i++) printf ", \"tok%07d\": %d", i, i
                         print "}" }'
}
vocab 1000000 > big/vocab.json
vocab 1000 > small/vocab.json
printf '#version: 0.2\n' > big/merges.txt
cp big/merges.txt small/
{ printf '{"model": {"type": "BPE", "end_of_word_suffix": "</w>", "merges": [], "vocab": '
  cat big/vocab.json; printf '}}\n'; } > big_json/tokenizer.json

cat > load.lua <<'EOF'
local ck = require "ck"
local what, path = args[1], args[2]
local t = ck.clip_tokenizer{[what] = path}
print("loaded", t.vocab_size)
EOF

# under --max-memory 64M: refused by name, the process stays small
refused() {
  local name=$1 what=$2 path=$3 phrase=$4 start=$SECONDS
  run timeout 60 "$CK" --max-memory 64M load.lua "$what" "$path"
  [ "$rc" = 1 ] && [ "$(wc -l < err)" = 1 ] &&
    grep -Eq "^ckrun: load.lua:3: (clip_tokenizer: '[^']*': )?$phrase.* would pass the memory limit of 64 MiB \(--max-memory [0-9]+[MG]iB allows it\)$" err &&
    [ "$rss" -lt "$BOUND" ]
  ok $? "--max-memory 64M: $name refused, exit $rc, peak RSS $((rss >> 20)) MiB, $((SECONDS - start)) s ($(head -c 300 err))"
}
refused "a gzip bomb that declares its 100 MiB" bpe bomb.gz "the decompressed text"
refused "a gzip bomb that declares 4 KiB" bpe liar.gz "the decompressed text"
refused "a 21 MB vocab.json" dir big "the values of its [0-9.]+ MiB of JSON"
refused "a 21 MB tokenizer.json" dir big_json "the values of its [0-9.]+ MiB of JSON"

# Ctrl-C half a second into a load: out within 1 s more
for entry in "vocab.json|dir|big" "tokenizer.json|dir|big_json"; do
  IFS='|' read -r name what path <<< "$entry"
  "$CK" load.lua "$what" "$path" > out 2> err &
  pid=$!
  sleep 0.5
  sent=$(ms)
  kill -INT $pid 2> /dev/null
  waited=0
  while kill -0 $pid 2> /dev/null && [ $waited -lt 50 ]; do sleep 0.1; waited=$((waited+1)); done
  if kill -0 $pid 2> /dev/null; then kill -KILL $pid; fi
  wait $pid; rc=$?
  took=$(( $(ms) - sent ))
  [ $rc = 130 ] && [ $took -le 1000 ] && grep -q '^ckrun: load.lua:3: interrupted$' err
  ok $? "SIGINT stops loading a 21 MB $name within 1 s (${took} ms, exit $rc: $(head -c 160 err))"
done

# the callback budget: each load (and a JSON decode) inside ck.call_limited
cat > budget.lua <<'EOF'
local ck = require "ck"
local what, path = args[1], args[2]
if what == "decode" then
  local text = assert(io.open(path, "rb")):read("a")
  ck.call_limited(function() return ck.json_decode(text) end)
else
  ck.call_limited(function() return ck.clip_tokenizer{[what] = path} end)
end
print("finished")
EOF
for entry in "a gzip bomb|bpe|liar.gz" "a 21 MB vocab.json|dir|big" "a 21 MB tokenizer.json|dir|big_json" \
             "ck.json_decode of 21 MB|decode|big/vocab.json"; do
  IFS='|' read -r name what path <<< "$entry"
  start=$(ms)
  timeout 5 "$CK" --callback-budget 1000000 budget.lua "$what" "$path" > out 2> err; rc=$?
  took=$(( $(ms) - start ))
  [ $rc = 1 ] && grep -q '^ckrun: budget.lua:[0-9]*: callback ran past its instruction budget of 1000000 instructions' err
  ok $? "--callback-budget 1000000 stops $name inside ck.call_limited (${took} ms, exit $rc: $(head -c 160 err))"
done

# and the same vocabulary, smaller, loads: the files are good ones
timeout 60 "$CK" load.lua dir small > out 2> err; rc=$?
[ $rc = 0 ] && grep -q "^loaded.1000$" out
ok $? "the generator's vocab.json of 1000 entries loads (exit $rc: $(head -c 160 err))"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
