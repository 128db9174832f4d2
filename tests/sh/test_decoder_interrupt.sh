# Ctrl-C, the callback budget and --max-memory stop the image readers and the
# safetensors header parser on hostile files that tests/c/test_image_hostile
# and test_safetensors_header write (--write DIR): a progressive 8192x8192
# JPEG repeating its AC scan 20000 times (3.8 MB: minutes of scans in one
# libjpeg call before; the 1000-scan limit now ends it after seconds), a
# 28-byte lossless 16384x16384 WebP (seconds in one libwebp call, now on a
# thread of its own), a black 16384x16384 PNG, a PNG of 2M empty chunks,
# and a safetensors header of 600000 empty tensors (37 MB, parsed in one
# call before; its two sorts are the longest stretch left unpolled, a tenth
# of a second here).
# - Started in a loop of loads, sent SIGINT after 0.5 s, each must exit
#   within 1 s more with status 130 and the interrupt message naming the
#   line (the JPEG and the WebP ran on for 2 to 20 s after it before).
# - Inside ck.call_limited under --callback-budget 1000000, each must end
#   within 5 s with the budget error naming the line.
# - Under --max-memory 256MiB each image is refused within 1 s, from its
#   header, and under 128MiB the safetensors header within 5 s, as its
#   tables grow past the limit, each in one line naming the file. A PNG declaring 2147483647x1 (69
#   bytes) is refused from its header at any memory.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
"${CK_BUILD:?}/test_image_hostile" --write "$t" && "$CK_BUILD/test_safetensors_header" --write "$t" ||
  { echo "FAIL writing the hostile files"; exit 1; }
cd "$t" || exit 1
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

loads=(
  'a JPEG of 20000 scans|ck.image_load("scans.jpg", {resize = {64, 64}})'
  'a 28-byte WebP of 16384x16384|ck.image_load("big.webp", {resize = {64, 64}})'
  'a black 16384x16384 PNG|ck.image_load("black.png", {resize = {64, 64}})'
  'a safetensors header of 600000 tensors|ck.safetensors("big.safetensors"):close()'
)

# Under make test-asan, LeakSanitizer's scan at exit reads every live block:
# the 1.8 GB that an interrupted WebP decode still holds on its thread took
# it a second. These runs measure the stop; the runs below check leaks.
for entry in "${loads[@]}"; do
  name=${entry%%|*} code=${entry#*|}
  printf 'local ck = require "ck"\nfor i = 1, 100 do %s end\n' "$code" > shape.lua
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$CK" shape.lua > out 2> err &
  pid=$!
  sleep 0.5
  sent=$(ms)
  kill -INT $pid 2>/dev/null
  waited=0
  while kill -0 $pid 2>/dev/null && [ $waited -lt 50 ]; do sleep 0.1; waited=$((waited+1)); done
  if kill -0 $pid 2>/dev/null; then kill -KILL $pid; fi
  wait $pid; rc=$?
  took=$(( $(ms) - sent ))
  [ $rc = 130 ] && [ $took -le 1000 ] && grep -q '^ckrun: shape.lua:2: interrupted$' err
  ok $? "SIGINT stops loading $name within 1 s (${took} ms, exit $rc: $(head -c 160 err))"
done

budget=("${loads[@]}" 'a PNG of 2M empty chunks|ck.image_info("chunks.png")')
for entry in "${budget[@]}"; do
  name=${entry%%|*} code=${entry#*|}
  printf 'local ck = require "ck"\nck.call_limited(function()\n  %s\nend)\nprint("escaped")\n' "$code" > budget.lua
  start=$(ms)
  timeout 5 "$CK" --callback-budget 1000000 budget.lua > out 2> err; rc=$?
  took=$(( $(ms) - start ))
  [ $rc = 1 ] && grep -q '^ckrun: budget.lua:3: callback ran past its instruction budget of 1000000 instructions$' err &&
    ! grep -q escaped out
  ok $? "the callback budget stops $name (${took} ms, exit $rc: $(head -c 160 err))"
done

# file|limit in MiB|within ms|code
refused=(
  'scans.jpg|256|1000|ck.image_load("scans.jpg", {resize = {64, 64}})'
  'big.webp|256|1000|ck.image_load("big.webp", {resize = {64, 64}})'
  'black.png|256|1000|ck.image_load("black.png", {resize = {64, 64}})'
  'big.safetensors|128|5000|ck.safetensors("big.safetensors")'
)
for entry in "${refused[@]}"; do
  IFS='|' read -r file limit within code <<< "$entry"
  printf 'local ck = require "ck"\n%s\nprint("loaded")\n' "$code" > mem.lua
  start=$(ms)
  timeout 10 "$CK" --max-memory "${limit}MiB" mem.lua > out 2> err; rc=$?
  took=$(( $(ms) - start ))
  [ $rc = 1 ] && [ $took -le "$within" ] && [ "$(wc -l < err)" = 1 ] &&
    grep -q "^ckrun: mem.lua:2: .*$file.* would pass the memory limit of $limit MiB" err && ! grep -q loaded out
  ok $? "--max-memory ${limit}MiB refuses $file within $within ms (${took} ms, exit $rc: $(head -c 200 err))"
done

printf 'local ck = require "ck"\nprint(ck.image_info("wide.png").width)\n' > wide.lua
start=$(ms)
timeout 10 "$CK" wide.lua > out 2> err; rc=$?
took=$(( $(ms) - start ))
[ $rc = 1 ] && [ $took -le 1000 ] && [ "$(stat -c %s wide.png)" -le 100 ] &&
  grep -q '^ckrun: wide.lua:2: wide.png: a png image 2147483647 pixels wide, more than the limit of 1048576$' err
ok $? "a PNG declaring 2147483647x1 is refused from its header (${took} ms, exit $rc: $(head -c 200 err))"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
