# scripts/train_sdxl_lora.lua end to end: build-only parameter counts, training
# that drives the validation loss well below where it started, the adapter
# files it writes, and bad input (missing dataset, wrong sample shapes, a
# truncated weights file, a non-finite loss) failing with one line, a non-zero
# exit and no damaged output.
set -u
dir=$(mktemp -d)
logs=out/.test_train_logs.$$
trap 'rm -rf "$dir" "$logs"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
S="scripts/train_sdxl_lora.lua --log-dir $logs"
# runs that read or write $dir (outside the working directory) say so to the sandbox: --allow-write "$dir"

json=$("$CKRUN" --plan --json $S --size full)
echo "$json" | grep -q '"param_count": 2567463684,' ; ok $? "full SDXL build-only: param_count 2567463684"
echo "$json" | grep -q '"trainable_param_count": 5806080,' ; ok $? "full SDXL: rank-4 default LoRA trains 5806080 parameters"
json=$("$CKRUN" --plan --json $S)
echo "$json" | grep -q '"param_count": 8011332,' ; ok $? "sdxl-tiny build-only: param_count 8011332"
[ "$(echo "$json" | wc -l)" = 1 ] ; ok $? "--plan --json prints one line"

# training: validation loss on fixed batches falls well below its start
out=$("$CKRUN" --allow-write "$dir" $S --steps 100 --targets kohya --rank 8 --samples 8 --out "$dir/lora.safetensors") ; rc=$?
ok $rc "a 100-step run exits 0"
line=$(echo "$out" | grep '^validation loss')
before=$(echo "$line" | sed -E 's/.*before ([0-9.]+),.*/\1/')
after=$(echo "$line" | sed -E 's/.*after ([0-9.]+)$/\1/')
awk -v b="$before" -v a="$after" 'BEGIN { exit !(a < 0.9 * b) }' ; ok $? "validation loss falls by more than 10% ($line)"
[ -s "$dir/lora.safetensors" ] ; ok $? "the adapter file is written"
"$CKRUN" --allow-write "$dir" -e "local ck = require 'ck'; local f = ck.safetensors('$dir/lora.safetensors')
assert(f:has('lora_unet_input_blocks_4_1_transformer_blocks_0_ff_net_0_proj.lora_up.weight'))
assert(f:metadata().ss_max_train_steps == '100')" ; ok $? "the file uses kohya names and records the run in ss_* metadata"

"$CKRUN" --allow-write "$dir" $S --steps 2 --lora-format peft --out "$dir/peft.safetensors" >/dev/null
"$CKRUN" --allow-write "$dir" -e "local ck = require 'ck'; local f = ck.safetensors('$dir/peft.safetensors')
assert(f:has('unet.mid_block.attentions.0.transformer_blocks.0.attn1.to_k.lora_A.weight'))" ; ok $? "--lora-format peft writes PEFT names"

# --save-lora-every: adapter snapshots named as kohya's --save_every_n_steps, each saying its step
"$CKRUN" --allow-write "$dir" $S --steps 5 --save-lora-every 2 --out "$dir/snap.safetensors" >/dev/null
"$CKRUN" --allow-write "$dir" -e "local ck = require 'ck'
local a <close> = ck.safetensors('$dir/snap-step00000002.safetensors')
local b <close> = ck.safetensors('$dir/snap-step00000004.safetensors')
local c <close> = ck.safetensors('$dir/snap.safetensors')
assert(a:metadata().ss_steps == '2' and b:metadata().ss_steps == '4' and c:metadata().ss_steps == '5')
local k = 'lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q.lora_up.weight'
local x, y = a:read(k), c:read(k)
assert(#x == #y and (x[1] ~= y[1] or x[7] ~= y[7]))" &&
  [ ! -e "$dir/snap-step00000006.safetensors" ]
ok $? "--save-lora-every 2 writes the adapter at steps 2 and 4 (ss_steps), then the final one"

# --optimizer lion: trains, and the file says which optimizer did
"$CKRUN" --allow-write "$dir" $S --steps 3 --optimizer lion --lr 1e-3 --out "$dir/lion.safetensors" >/dev/null &&
"$CKRUN" --allow-write "$dir" -e "local ck = require 'ck'; local f <close> = ck.safetensors('$dir/lion.safetensors')
assert(f:metadata().ss_optimizer == 'lion_pytorch.lion_pytorch.Lion')"
ok $? "--optimizer lion trains and records ss_optimizer"

# --save-precision fp16: the adapter in F16, the same values as the fp32 file rounded once
"$CKRUN" --allow-write "$dir" $S --steps 3 --save-precision fp16 --out "$dir/h.safetensors" >/dev/null &&
"$CKRUN" --allow-write "$dir" $S --steps 3 --out "$dir/f.safetensors" >/dev/null &&
"$CKRUN" --allow-write "$dir" -e "local ck = require 'ck'
local h <close> = ck.safetensors('$dir/h.safetensors')
local f <close> = ck.safetensors('$dir/f.safetensors')
local k = 'lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q.lora_down.weight'
assert(h:dtype(k) == 'F16' and f:dtype(k) == 'F32')
local a, b = h:read(k), f:read(k)
for i = 1, #b do assert(math.abs(a[i] - b[i]) <= 2 ^ -11 * math.abs(b[i]) + 2 ^ -24) end"
ok $? "--save-precision fp16 writes F16 tensors, the fp32 run's values rounded"

# --conv-rank: kohya's LoCon; the file holds the convolutions' adapters and says conv_dim
"$CKRUN" --allow-write "$dir" $S --steps 3 --conv-rank 2 --conv-alpha 1 --network-dropout 0.1 --loraplus-lr-ratio 8 \
  --out "$dir/locon.safetensors" >/dev/null &&
"$CKRUN" --allow-write "$dir" -e "local ck = require 'ck'; local f <close> = ck.safetensors('$dir/locon.safetensors')
local k = 'lora_unet_input_blocks_1_0_in_layers_2'
assert(table.concat(f:shape(k .. '.lora_down.weight'), ',') == '2,32,3,3')
assert(table.concat(f:shape(k .. '.lora_up.weight'), ',') == '32,2,1,1' and f:read(k .. '.alpha')[1] == 1)
assert(f:metadata().ss_network_args == '{\"conv_dim\": \"2\", \"conv_alpha\": \"1\"}')
assert(f:metadata().ss_network_dropout == '0.1' and f:metadata().ss_loraplus_lr_ratio == '8')"
ok $? "--conv-rank 2 --conv-alpha 1 adds the convolutions' adapters (kohya names and shapes, conv_dim in ss_network_args); --network-dropout is recorded"

# --fp8-base: the frozen base in fp8; trains, and the file says so
"$CKRUN" --allow-write "$dir" $S --steps 3 --fp8-base --storage bf16 --out "$dir/f8.safetensors" >/dev/null &&
"$CKRUN" --allow-write "$dir" -e "local ck = require 'ck'; local f <close> = ck.safetensors('$dir/f8.safetensors')
assert(f:metadata().ss_fp8_base == 'True')"
ok $? "--fp8-base with --storage bf16 trains and records ss_fp8_base"

# --full: every parameter trained (8-bit AdamW, fused updates); the UNet written in diffusers key names
out=$("$CKRUN" --allow-write "$dir" $S --full --steps 12 --optimizer adamw8bit --fused-backward --lr 1e-4 \
  --save-precision bf16 --out "$dir/unet.safetensors") &&
line=$(echo "$out" | grep '^validation loss') &&
echo "$out" | grep -q "training every parameter of sdxl-tiny (8011332 parameters, 8011332 trainable)" &&
awk -v b="$(echo "$line" | sed -E 's/.*before ([0-9.]+),.*/\1/')" -v a="$(echo "$line" | sed -E 's/.*after ([0-9.]+)$/\1/')" \
  'BEGIN { exit !(a < 0.95 * b) }' &&
"$CKRUN" --allow-write "$dir" -e "local ck = require 'ck'; local f <close> = ck.safetensors('$dir/unet.safetensors')
local want = {}
for line in io.lines('tests/data/sdxl_tiny_keys.txt') do
  local k, s = line:match('^(%S+) %[([%d,]+)%]')
  want[k] = s
end
local n = 0
for _, k in ipairs(f:keys()) do
  n = n + 1
  assert(want[k] == table.concat(f:shape(k), ','), k)
  assert(f:dtype(k) == 'BF16', k)
end
assert(n == 620 and f:metadata().format == 'pt' and f:metadata().ss_optimizer == 'bitsandbytes.optim.adamw.AdamW8bit')"
ok $? "--full trains every parameter and writes the UNet: the 620 diffusers keys and shapes, in bf16 ($line)"
"$CKRUN" $S --full --rank 8 > /dev/null 2> "$dir/full.txt"; rc=$?
[ $rc != 0 ] && grep -q "train_sdxl_lora.lua:[0-9]*: --rank is an adapter's option; --full trains every parameter" "$dir/full.txt"
ok $? "--full with an adapter's option is refused ($(head -1 "$dir/full.txt"))"
json=$("$CKRUN" --plan --json --device cuda $S --size full --full --optimizer adamw8bit --fused-backward --checkpoint diffusers)
echo "$json" | python3 -c "import json, sys; d = json.load(sys.stdin); \
  assert d['trainable_param_count'] == d['param_count'] == 2567463684 and d['peak_bytes'] < 16 * 2**30, d['peak_bytes']"
ok $? "full SDXL trained whole at 1024 (8-bit AdamW, fused, diffusers) plans under 16 GiB on the GPU"

# a dataset on disk gives the same samples as --data synthetic
"$CKRUN" --allow-write "$dir" scripts/make_synthetic_data.lua "$dir/data" 4 >/dev/null ; ok $? "make_synthetic_data writes a dataset"
a=$("$CKRUN" --allow-write "$dir" $S --steps 3 --samples 4 --out "$dir/a.safetensors" | grep '^training loss')
b=$("$CKRUN" --allow-write "$dir" $S --steps 3 --data "$dir/data" --out "$dir/b.safetensors" | grep '^training loss')
[ -n "$a" ] && [ "$a" = "$b" ] ; ok $? "training on the written dataset matches --data synthetic ($b)"

# bad input: one line on stderr, non-zero exit, nothing written or damaged
cp "$dir/lora.safetensors" "$dir/keep.safetensors"
bad() { # name, pattern, args...
  local name=$1 pattern=$2; shift 2
  "$CKRUN" --allow-write "$dir" $S "$@" --out "$dir/lora.safetensors" > /dev/null 2> "$dir/err"
  local rc=$?
  if [ $rc -ne 0 ] && [ "$(wc -l < "$dir/err")" = 1 ] && grep -qE -- "$pattern" "$dir/err" \
     && cmp -s "$dir/lora.safetensors" "$dir/keep.safetensors"; then
    pass=$((pass+1)); echo "ok   $name: $(cat "$dir/err")"
  else
    fail=$((fail+1)); echo "FAIL $name (exit $rc):"; cat "$dir/err"
  fi
}
bad "missing dataset" "cannot read directory '$dir/none'" --data "$dir/none"
mkdir "$dir/wrong"
"$CKRUN" --allow-write "$dir" -e "local ck = require 'ck'
ck.write_safetensors('$dir/wrong/000001.safetensors', {{'latents', {4, 48, 48}, (function() local t = {} for i = 1, 4 * 48 * 48 do t[i] = 0 end return t end)()},
  {'prompt_embeds', {77, 64}, (function() local t = {} for i = 1, 77 * 64 do t[i] = 0 end return t end)()},
  {'pooled_prompt_embeds', {64}, (function() local t = {} for i = 1, 64 do t[i] = 0 end return t end)()},
  {'time_ids', {6}, {1, 1, 0, 0, 1, 1}}})"
cp "$dir/wrong/000001.safetensors" "$dir/wrong/000002.safetensors"
bad "wrong sample shape names the file and the tensor" "wrong/000001.safetensors.*latents.*\[4, 48, 48\].*at most 32 x 32" --data "$dir/wrong"
"$CKRUN" --allow-write "$dir" -e "local ck = require 'ck'; local unet = require 'ck.unet'
local g = ck.graph(); local _, y = unet.build(g, 'sdxl-tiny', {batch = 1, height = 8, width = 8, frozen = true})
local p = g:compile{outputs = {y}}
local e = {}
for _, t in ipairs(g:params()) do e[#e + 1] = {t.name, t.name} end
p:set('conv_in.bias', 0 / 0)
p:save('$dir/nan.safetensors', e)
p:set('conv_in.bias', 0)
p:save('$dir/unet.safetensors', e)"
head -c 100000 "$dir/unet.safetensors" > "$dir/truncated.safetensors"
bad "truncated weights file" "truncated.safetensors: .*(truncated|size|short|end)" --weights "$dir/truncated.safetensors"
bad "a non-finite loss stops the run" "step 1: loss is not finite" --weights "$dir/nan.safetensors" --steps 3
"$CKRUN" --allow-write "$dir" $S --weights "$dir/unet.safetensors" --steps 2 --out "$dir/w.safetensors" > /dev/null ; ok $? "a complete weights file loads and trains"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
