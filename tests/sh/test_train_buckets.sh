# scripts/train_sdxl_lora.lua on samples of two latent shapes (aspect-ratio
# buckets): one program per bucket and batch size, all compiled before the
# first step and sharing one copy of the weights; the arena is the largest
# bucket's; --plan reports every bucket (of sample files, and of images before
# they are encoded); training runs and writes the adapter;
# a resumed run continues bitwise as one uninterrupted run.
set -u
dir=$(mktemp -d)
logs=out/.test_train_buckets.$$
trap 'rm -rf "$dir" "$logs"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
A="--allow-write $dir --allow-read $dir"
"$CKRUN" $A tests/scripts/make_bucket_data.lua "$dir/data" || { echo "FAIL making the data"; exit 1; }
S="scripts/train_sdxl_lora.lua --data $dir/data --resolution 64 --batch 2 --log-dir $logs"

out=$("$CKRUN" $A $S --steps 6 --out "$dir/lora.safetensors" 2>&1) ; rc=$?
ok $rc "training on two buckets exits 0"
echo "$out" | grep -q "^2 buckets, 3 programs sharing one copy of the weights" ; ok $? "3 programs (8x8 at batch 2 and 1, 4x8 at 2) for 2 buckets"
echo "$out" | grep -q "bucket 64x64 (latents 8x8), batch 2" ; ok $? "the 64x64 bucket at batch 2 is listed"
echo "$out" | grep -q "bucket 64x64 (latents 8x8), batch 1" ; ok $? "the 64x64 bucket's last batch (1) has a program"
echo "$out" | grep -q "bucket 64x32 (latents 8x4), batch 2" ; ok $? "the 64x32 bucket at batch 2 is listed"
[ -s "$dir/lora.safetensors" ] ; ok $? "the adapter is written"
# the group's arena is the largest program's
arena=$(echo "$out" | sed -nE 's/^2 buckets.*: ([0-9.]+) MiB arena.*/\1/p')
biggest=$(echo "$out" | sed -nE 's/^  bucket .*: ([0-9.]+) MiB$/\1/p' | sort -g | tail -1)
sum=$(echo "$out" | sed -nE 's/^  bucket .*: ([0-9.]+) MiB$/\1/p' | awk '{ s += $1 } END { print s }')
[ -n "$arena" ] && [ "$arena" = "$biggest" ] ; ok $? "the one arena ($arena MiB) is the largest bucket's ($biggest MiB)"
# the whole process: the weights are held once, so the peak RSS stays below the
# three programs' arenas added up (each holds the 32 MiB of weights)
# (not under AddressSanitizer, whose shadow memory is no part of a real run)
rss=$(echo "$out" | sed -nE 's/^memory: peak RSS ([0-9.]+) MiB.*/\1/p')
if ldd "$CKRUN" 2>/dev/null | grep -q libasan; then
  echo "skip peak RSS under AddressSanitizer ($rss MiB)"
else
  awk -v r="$rss" -v s="$sum" 'BEGIN { exit !(r > 0 && r < s) }' ; ok $? "peak RSS ($rss MiB) below the arenas added up ($sum MiB)"
fi

# --plan: every bucket's program, and the one arena
json=$("$CKRUN" $A --plan --json $S)
[ "$(echo "$json" | wc -l)" = 1 ] ; ok $? "--plan --json with buckets prints one line"
echo "$json" | grep -q '"buckets": 2,' && echo "$json" | grep -q '"bucket_programs": 3,' ; ok $? "--plan reports 2 buckets and 3 programs"
garena=$(echo "$json" | sed -nE 's/.*"group_arena": ([0-9]+),.*/\1/p')
[ -n "$garena" ] && awk -v g="$garena" -v a="$arena" 'BEGIN { exit !(g / 1048576 - a < 0.06 && a - g / 1048576 < 0.06) }' ; ok $? "--plan's group arena ($garena bytes) is the one training allocates ($arena MiB)"

# --plan of a folder of images in two buckets: the buckets from the images'
# headers (no sample files: nothing is encoded), each bucket's program
"$CKRUN" $A scripts/make_shapes_dataset.lua "$dir/shapes" 6 > /dev/null 2>&1
json=$("$CKRUN" $A --plan --json scripts/train_sdxl_lora.lua --data "$dir/shapes" --resolution 128 --enable-bucket \
  --min-bucket-reso 64 --max-bucket-reso 256 2>&1)
echo "$json" | grep -q '"buckets": 2,' && echo "$json" | grep -q '"bucket_program_2": "bucket' &&
  [ -z "$(find "$dir/shapes" -name '*.safetensors')" ]
ok $? "--plan of images in two buckets plans each bucket's program and encodes nothing ($(echo "$json" | head -c 300))"

# resume: 3 steps, then 3 more from the state, equal 6 in one go
"$CKRUN" $A $S --steps 6 --out "$dir/straight.safetensors" --save-every 3 --state-dir "$dir/s1" >/dev/null 2>&1
"$CKRUN" $A $S --steps 6 --out "$dir/first.safetensors" --save-every 3 --state-dir "$dir/s2" >/dev/null 2>&1
rm -f "$dir/first.safetensors"
"$CKRUN" $A $S --steps 6 --out "$dir/resumed.safetensors" --save-every 3 --state-dir "$dir/s2" --resume >/dev/null 2>&1 ; rc=$?
ok $rc "a resumed bucket run exits 0"
cmp -s "$dir/straight.safetensors" "$dir/resumed.safetensors" ; ok $? "resuming continues bitwise (the same adapter as one run)"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
