# kohya's config files in the trainer (ck.train), for both families:
# --config-file gives option values (its sections flattened) and trains what
# the same options on the command line train, bitwise; the command line
# overrides the file, under ckrun's name or kohya's. --dataset-config gives
# datasets of subsets (image_dir, num_repeats, class_tokens, is_reg, ...):
# regularization images are repeated or cut to the train images' count as
# kohya's DreamBooth dataset does, and their loss is weighted by
# --prior-loss-weight (kohya's per-sample weight times the per-sample loss,
# then the mean); each dataset has its own buckets and batch size. A bad file
# is one line naming the file, its line and the key; nothing is written.
set -u
dir=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
A="--allow-write $dir --allow-read $dir"
S=scripts/train_sdxl_lora.lua
F=scripts/train_flux_lora.lua
P=tests/data/flow/pipeline # the tiny Flux folder made by diffusers
lua() { "$CKRUN" $A -e "local ck = require 'ck' $1" 2>&1; }
# the step-N loss (or grad_norm) of a run's log
logged() { lua "for line in io.lines('$1/metrics.jsonl') do local r = ck.json_decode(line)
  if r.step == $2 and r.$3 then io.write(string.format('%.9g', r.$3)) end end"; }
cached() { find "$dir/train" "$dir/reg" -name '*.safetensors' | wc -l; }

"$CKRUN" $A scripts/make_shapes_dataset.lua "$dir/train" 2 --repeats 1 --size 64 > /dev/null &&
"$CKRUN" $A scripts/make_shapes_dataset.lua "$dir/reg" 3 --repeats 1 --size 64 --seed 7 > /dev/null ||
  { echo "FAIL making the images"; exit 1; }
rm -f "$dir"/reg/1_shapes/*.txt # the reg images are captioned by class_tokens
T="$dir/train/1_shapes" R="$dir/reg/1_shapes"

# kohya's regularization balance (imagedata.reg_repeats): repeated to the train count, or cut short
r=$(lua "local id = require 'ck.imagedata'
local function s(t) return table.concat(t, ',') end
io.write(s(id.reg_repeats(4, {1, 1, 1})), ' ', s(id.reg_repeats(4, {3, 3, 3})), ' ', s(id.reg_repeats(7, {1, 2})), ' ',
  s(id.reg_repeats(0, {1, 1})))")
[ "$r" = "2,1,1 3,3,0 3,4 0,0" ] ; ok $? "reg images are repeated in turn up to the train count, or cut once it is reached ($r)"

# --config-file: sections flattened, kohya's names; the same run as its options on the command line
cat > "$dir/run.toml" <<EOF
[model_arguments]
v_parameterization = true
[training_arguments]
train_batch_size = 2
max_grad_norm = 0.5
seed = 3
steps = 2
samples = 4
resolution = "64,64"
[optimizer_arguments]
learning_rate = 0.01
optimizer_type = "Lion"
[network_arguments]
network_dim = 2
network_alpha = 1
EOF
C="--batch 2 --max-grad-norm 0.5 --seed 3 --steps 2 --samples 4 --resolution 64 --optimizer lion --rank 2 --alpha 1 --prediction v"
"$CKRUN" $A $S $C --lr 0.01 --out "$dir/cl.safetensors" --log-dir "$dir/l1" > /dev/null 2>&1
"$CKRUN" $A $S --config-file "$dir/run.toml" --out "$dir/cf.safetensors" --log-dir "$dir/l2" > "$dir/cf.out" 2>&1 ; rc=$?
ok $rc "a run from --config-file trains ($(tail -1 "$dir/cf.out"))"
cmp -s "$dir/cl.safetensors" "$dir/cf.safetensors" ; ok $? "it writes the adapter its options give on the command line, bitwise"
"$CKRUN" $A $S $C --lr 0.02 --out "$dir/cl2.safetensors" --log-dir "$dir/l3" > /dev/null 2>&1
"$CKRUN" $A $S --config_file "$dir/run" --lr 0.02 --out "$dir/o1.safetensors" --log-dir "$dir/l4" > /dev/null 2>&1
"$CKRUN" $A $S --config-file "$dir/run.toml" --learning_rate 0.02 --out "$dir/o2.safetensors" --log-dir "$dir/l5" > /dev/null 2>&1
cmp -s "$dir/cl2.safetensors" "$dir/o1.safetensors" && cmp -s "$dir/cl2.safetensors" "$dir/o2.safetensors" &&
  ! cmp -s "$dir/cl.safetensors" "$dir/o1.safetensors"
ok $? "the command line overrides the file, as --lr or kohya's --learning_rate (and --config_file FILE without .toml)"

# --dataset-config: train and reg subsets, class_tokens, kohya's counts
cat > "$dir/ds.toml" <<EOF
[general]
resolution = 64
caption_extension = ".txt"

[[datasets]]
batch_size = 2

  [[datasets.subsets]]
  image_dir = "$T"
  num_repeats = 2

  [[datasets.subsets]]
  image_dir = "$R"
  is_reg = true
  class_tokens = "a shape"
  caption_suffix = "in a picture"
EOF
D="--dataset-config $dir/ds.toml --steps 2 --seed 3"
"$CKRUN" $A $S $D --out "$dir/d1.safetensors" --log-dir "$dir/ld1" > "$dir/d1.out" 2>&1 ; rc=$?
ok $rc "the SDXL script trains from a dataset config ($(tail -1 "$dir/d1.out"))"
grep -q "^dataset 1: 4 train images with repeats, 4 regularization images with repeats (3 of 3 images used), resolution 64x64, batch 2$" "$dir/d1.out"
ok $? "2 train images repeated twice, 3 reg images balanced to 4 uses ($(grep '^dataset 1' "$dir/d1.out"))"
grep -q "^cache: 2 images encoded in" "$dir/d1.out" && grep -q "^cache: 3 images encoded in" "$dir/d1.out" &&
  [ "$(cached)" = 5 ]
ok $? "every image used is cached beside it, a subset at a time ($(cached))"
grep -q "^training LoRA .*, 64x64, batch 2, 2 steps" "$dir/d1.out" ; ok $? "the run's batch is the dataset's batch_size"
cap=$(lua "io.write(ck.safetensors('$(find "$R" -name '*.safetensors' | head -1)'):metadata().caption)")
[ "$cap" = "a shape in a picture" ] ; ok $? "a reg image without a caption file is captioned by class_tokens, and its subset's caption_suffix ($cap)"

# --prior-loss-weight: kohya's per-sample weight times the per-sample loss, then the mean. One train
# and one reg image in a batch of 2: the step's loss is (a + w b) / 2, so loss(3) = 3 loss(1) - 2 loss(0)
cat > "$dir/w.toml" <<EOF
[general]
caption_extension = ".txt"
[[datasets]]
resolution = 64
batch_size = 2
  [[datasets.subsets]]
  image_dir = "$T"
  num_repeats = 1
  [[datasets.subsets]]
  image_dir = "$R"
  is_reg = true
  num_repeats = 1
EOF
second=$(ls "$T" | grep png | sed -n 2p)
mv "$T/$second" "$dir/aside.png" # one train image
W="--dataset-config $dir/w.toml --steps 1 --log-every 1 --seed 5"
for w in 0 1 3; do
  "$CKRUN" $A $S $W --prior-loss-weight $w --out "$dir/w$w.safetensors" --log-dir "$dir/lw$w" > "$dir/w$w.out" 2>&1
done
l0=$(logged "$dir/lw0" 1 loss) l1=$(logged "$dir/lw1" 1 loss) l3=$(logged "$dir/lw3" 1 loss)
python3 -c "import sys; a, b, c = map(float, sys.argv[1:]); sys.exit(not (b > a > 0 and abs(c - (3 * b - 2 * a)) <= 1e-5 * c))" "$l0" "$l1" "$l3"
ok $? "a reg sample's loss is weighted by --prior-loss-weight: 0 -> $l0, 1 -> $l1, 3 -> $l3 = 3 x $l1 - 2 x $l0"
# a batch of one reg sample weighted 0: zero loss and zero gradient
sed -i 's/^batch_size = 2/batch_size = 1/' "$dir/w.toml"
"$CKRUN" $A $S --dataset-config "$dir/w.toml" --steps 2 --log-every 1 --prior-loss-weight 0 --out "$dir/z.safetensors" \
  --log-dir "$dir/lz" > /dev/null 2>&1
z=$(for s in 1 2; do printf '%s %s ' "$(logged "$dir/lz" $s loss)" "$(logged "$dir/lz" $s grad_norm)"; done)
python3 -c "import sys; a, b, c, d = map(float, sys.argv[1:])
sys.exit(not ((a == b == 0 and c > 0 and d > 0) or (c == d == 0 and a > 0 and b > 0)))" $z
ok $? "the epoch's reg sample, weighted 0, has zero loss and gradient; the train sample's are not ($z)"
mv "$dir/aside.png" "$T/$second"

# several datasets: each its own resolution, buckets and batch size
cat > "$dir/two.toml" <<EOF
[[datasets]]
resolution = 64
batch_size = 2
  [[datasets.subsets]]
  image_dir = "$T"
[[datasets]]
resolution = 32
batch_size = 1
  [[datasets.subsets]]
  image_dir = "$R"
  class_tokens = "a shape"
EOF
"$CKRUN" $A $S --dataset-config "$dir/two.toml" --steps 3 --out "$dir/two.safetensors" --log-dir "$dir/ltwo" > "$dir/two.out" 2>&1 ; rc=$?
ok $rc "two datasets of different resolutions and batch sizes train"
grep -q "^  bucket 64x64 (latents 8x8), batch 2: " "$dir/two.out" && grep -q "^  bucket 32x32 (latents 4x4), batch 1: " "$dir/two.out"
ok $? "each dataset has its own bucket and batch size ($(grep -c '^  bucket' "$dir/two.out") programs)"

# the Flux script: both files, a reg subset weighted
cat > "$dir/flux.toml" <<EOF
[model_arguments]
pretrained_model_name_or_path = "$P"
t5xxl_max_token_length = 8
[training_arguments]
dataset_config = "$dir/w.toml"
max_grad_norm = 0.5
EOF
sed -i 's/^batch_size = 1/batch_size = 2/' "$dir/w.toml"
mv "$T/$second" "$dir/aside.png"
for w in 0 1 3; do
  "$CKRUN" $A $F --config-file "$dir/flux.toml" --steps 1 --log-every 1 --prior-loss-weight $w \
    --out "$dir/f$w.safetensors" --log-dir "$dir/lf$w" > "$dir/f$w.out" 2>&1
done
mv "$dir/aside.png" "$T/$second"
grep -q "^dataset 1: 1 train images with repeats, 1 regularization images with repeats (1 of 3 images used)" "$dir/f1.out" &&
  [ -s "$dir/f1.safetensors" ]
ok $? "the Flux script trains from --config-file naming a --dataset-config ($(grep '^dataset 1' "$dir/f1.out"))"
l0=$(logged "$dir/lf0" 1 loss) l1=$(logged "$dir/lf1" 1 loss) l3=$(logged "$dir/lf3" 1 loss)
python3 -c "import sys; a, b, c = map(float, sys.argv[1:]); sys.exit(not (b > a > 0 and abs(c - (3 * b - 2 * a)) <= 1e-5 * c))" "$l0" "$l1" "$l3"
ok $? "Flux weights a reg sample's loss by --prior-loss-weight: $l0, $l1, $l3"

# bad files: one line naming the file, its line and the key; a non-zero exit; nothing written
before=$(cached)
refused() { # WHAT PATTERN ARGS...
  local what=$1 pat=$2; shift 2
  err=$("$CKRUN" $A "$@" --out "$dir/bad.safetensors" --log-dir "$dir/lbad" 2>&1) ; rc=$?
  [ $rc != 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && printf '%s' "$err" | grep -qE -e "$pat" &&
    [ ! -e "$dir/bad.safetensors" ] && [ ! -e "$dir/lbad" ] && [ "$(cached)" = "$before" ]
  ok $? "$what ($err)"
}
printf '[training_arguments]\nlerning_rate = 0.1\n' > "$dir/typo.toml"
refused "a config file's unknown key names its line and the nearest name" \
  "^ckrun: $dir/typo.toml:2: unknown key lerning_rate \(did you mean learning_rate, ckrun's --lr\?\)$" $S --config-file "$dir/typo.toml"
printf '[training_arguments]\nnetwork_dim = 0\n' > "$dir/range.toml"
refused "a value out of range names its line and the option" "^ckrun: $dir/range.toml:2: network_dim \(--rank\) " $F --config-file "$dir/range.toml"
sed 's/num_repeats = 2/num_repeat = 2/' "$dir/ds.toml" > "$dir/typo2.toml"
refused "a dataset config's unknown key names its line and the nearest key" \
  "^ckrun: $dir/typo2.toml:10: unknown key num_repeat in \[\[datasets.subsets\]\] \(did you mean num_repeats\?\)$" $S --dataset-config "$dir/typo2.toml"
sed 's/num_repeats = 2/color_aug = true/' "$dir/ds.toml" > "$dir/color.toml"
refused "a kohya setting the trainer cannot honour is refused, naming it" \
  "^ckrun: $dir/color.toml:10: color_aug = true is kohya's setting that ckrun's trainer does not take$" $F --dataset-config "$dir/color.toml"
sed 's/num_repeats = 2/flip_aug = true/' "$dir/ds.toml" > "$dir/flip.toml"
refused "flip_aug in one subset only is refused, naming both places" \
  "^ckrun: $dir/flip.toml:[0-9]+: flip_aug = false where $dir/flip.toml:10 has true: ckrun's trainer takes one flip_aug for every subset$" \
  $S --dataset-config "$dir/flip.toml"
sed "s#image_dir = \"$R\"#image_dir = \"$dir/nowhere\"#" "$dir/ds.toml" > "$dir/gone.toml"
refused "an image_dir that is not a folder names its line" "^ckrun: $dir/gone.toml:13: image_dir '$dir/nowhere' is not a folder$" \
  $S --dataset-config "$dir/gone.toml"
refused "--data with --dataset-config is refused" "--data and --dataset-config both give the images: give one$" \
  $S --dataset-config "$dir/ds.toml" --data "$T"
printf '[training_arguments]\nconfig_file = "x.toml"\n' > "$dir/nest.toml"
refused "a config file naming another is refused at its line" "^ckrun: $dir/nest.toml:2: config_file names a config file" \
  $S --config-file "$dir/nest.toml"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
