# What a data-parallel job draws at random, keyed by the sample's row in the
# global batch (2 ranks under Open MPI's mpirun, oversubscribed on CI's 2
# cores, the tiny model): with --network-dropout, caption augmentation,
# --random-crop and --flip-aug, 2 ranks at --batch 1 train the samples one process trains at
# --batch 2, with the same draws: the same losses and the adapter within fp32
# summation-order tolerance. So do aspect-ratio buckets (sample folders of two
# shapes, --enable-bucket), whose short batches do not split evenly over the
# ranks, on 2 and 3 ranks. SKIPs (77) where mpirun is missing or ckrun was
# built without MPI.
. tests/sh/mpi_setup.sh
. tests/sh/mpi_compare.sh
A="--allow-write $dir --allow-read $dir"
T="scripts/train_sdxl_lora.lua --resolution 64 --log-every 1 --val-every 0 --steps 4"
# FILE FILE: the same steps, each loss within 1e-5 relative
same_losses() { "$CKRUN" $A -e "local ck = require 'ck'
local function ls(path) local t = {} for line in io.lines(path) do local r = ck.json_decode(line) if r.loss then t[#t + 1] = r.loss end end return t end
local a, b = ls('$1'), ls('$2')
assert(#a == #b and #a > 0, #a .. ' and ' .. #b .. ' steps')
local worst = 0
for i = 1, #a do
  local rel = math.abs(a[i] - b[i]) / math.abs(b[i])
  assert(rel < 1e-5, string.format('step %d: %.7f against %.7f', i, a[i], b[i]))
  if rel > worst then worst = rel end
end
io.write(string.format('%d steps, worst rel %.1e', #a, worst))"; }
# NAME EXTRA...: 2 ranks at --batch 1 against one process at --batch 2
compare() {
  local name=$1; shift
  $MPIRUN -np 2 "$CKRUN" $A $T --batch 1 "$@" --out "$dir/$name.a.safetensors" --log-dir "$dir/l$name.a" \
    > "$dir/$name.a.out" 2>&1 ; local rc=$?
  "$CKRUN" $A $T --batch 2 "$@" --out "$dir/$name.b.safetensors" --log-dir "$dir/l$name.b" > "$dir/$name.b.out" 2>&1
  same_losses "$dir/l$name.a/metrics.jsonl" "$dir/l$name.b/metrics.jsonl" > "$dir/$name.losses" 2>&1
  ok $? "$name: 2 ranks at --batch 1 have one process's losses at --batch 2 (rc $rc: $(tail -1 "$dir/$name.losses"))"
  [ $rc = 0 ] || tail -3 "$dir/$name.a.out"
  close "$dir/$name.a.safetensors" "$dir/$name.b.safetensors" > "$dir/$name.cmp" 2>&1
  ok $? "$name: and its adapter within fp32 summation-order tolerance ($(tail -1 "$dir/$name.cmp"))"
}

compare dropout --samples 8 --network-dropout 0.5
# a folder of images with captions (one bucket: 64x64, or 96 pixels a side to crop from)
"$CKRUN" $A scripts/make_shapes_dataset.lua "$dir/shapes" 4 --repeats 2 --size 64 > /dev/null &&
  "$CKRUN" $A scripts/make_shapes_dataset.lua "$dir/big" 4 --repeats 2 --size 96 > /dev/null || { echo "FAIL making the sets"; exit 1; }
compare captions --data "$dir/shapes" --shuffle-caption --caption-dropout-rate 0.25 --caption-tag-dropout-rate 0.3
compare crop --data "$dir/big" --random-crop --flip-aug
compare flip --data "$dir/shapes" --flip-aug
# aspect-ratio buckets: a bucket's short last batch of one sample leaves rank 1 without one (it runs a padding
# row weighted 0), and each rank's loss is weighted by its share of the global batch's rows
"$CKRUN" $A tests/scripts/make_bucket_data.lua "$dir/bdata" || { echo "FAIL making the bucket data"; exit 1; }
compare buckets --data "$dir/bdata"
grep -q "^2 buckets" "$dir/buckets.a.out" ; ok $? "buckets: the job trained 2 buckets ($(grep -m1 '^2 buckets' "$dir/buckets.a.out"))"
"$CKRUN" $A scripts/make_shapes_dataset.lua "$dir/odd" 5 --repeats 1 --size 64 > /dev/null || { echo "FAIL making the set"; exit 1; }
compare enable-bucket --data "$dir/odd" --enable-bucket --min-bucket-reso 32 --max-bucket-reso 128 --bucket-reso-steps 32
# 3 ranks at --batch 1 against one process at --batch 3: batches of 3, 2 and 1 over 3 ranks
$MPIRUN -np 3 "$CKRUN" $A $T --batch 1 --data "$dir/bdata" --out "$dir/b3.a.safetensors" --log-dir "$dir/lb3.a" \
  > "$dir/b3.a.out" 2>&1 ; rc=$?
"$CKRUN" $A $T --batch 3 --data "$dir/bdata" --out "$dir/b3.b.safetensors" --log-dir "$dir/lb3.b" > "$dir/b3.b.out" 2>&1
same_losses "$dir/lb3.a/metrics.jsonl" "$dir/lb3.b/metrics.jsonl" > "$dir/b3.losses" 2>&1 &&
  close "$dir/b3.a.safetensors" "$dir/b3.b.safetensors" > "$dir/b3.cmp" 2>&1
ok $? "buckets on 3 ranks: one process's losses and adapter at --batch 3 (rc $rc: $(tail -1 "$dir/b3.losses"); $(tail -1 "$dir/b3.cmp"))"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
