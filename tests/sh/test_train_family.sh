# ck.train runs a model family it does not know: tests/scripts/train_toy_flow.lua
# defines a toy flow-matching family (latents packed 2x2, one text tensor, no
# time_ids) and names it, and the trainer's loop, plan mode, buckets,
# validation, logging, kohya metadata, resume and options serve it as they
# serve SDXL's. Errors raised in the family's hooks name the script's line of
# the hook; errors of the trainer (and of the stdlib below it) the script's
# line that called ck.train.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
S=tests/scripts/train_toy_flow.lua
A="--allow-write $dir --allow-read $dir"
T="$S --resolution 64 --samples 8 --lr 0.01"
meta() { "$CKRUN" $A -e "local f = require('ck').safetensors('$1') io.write(tostring(f:metadata()['$2']))"; }

"$CKRUN" $A $T --steps 40 --out "$dir/a.safetensors" --log-dir "$dir/la" > "$dir/a.out" 2>&1 ; rc=$?
ok $rc "the toy family trains through ck.train ($(tail -1 "$dir/a.out"))"
grep -q "^training LoRA rank 4 on 2 modules of toy (.* parameters, .* trainable), 64x64, batch 2, 40 steps, flow matching$" \
  "$dir/a.out" ; ok $? "the run's first line is in the family's words ($(grep '^training LoRA' "$dir/a.out"))"
before=$(sed -n 's/^validation loss (fixed batches): before \([0-9.]*\), after \([0-9.]*\)$/\1/p' "$dir/a.out")
after=$(sed -n 's/^validation loss (fixed batches): before \([0-9.]*\), after \([0-9.]*\)$/\2/p' "$dir/a.out")
awk -v a="$after" -v b="$before" 'BEGIN { exit !(a != "" && a < 0.9 * b) }' ; ok $? "flow matching learns: the validation loss falls ($before to $after)"
keys=$("$CKRUN" $A -e "local f = require('ck').safetensors('$dir/a.safetensors') local k = f:keys() table.sort(k) io.write(table.concat(k, ' '))")
[ "$keys" = "unet.img_in.lora_A.weight unet.img_in.lora_B.weight unet.proj_out.lora_A.weight unet.proj_out.lora_B.weight" ]
ok $? "the adapter file has the family's names ($keys)"
[ "$(meta "$dir/a.safetensors" ss_steps)" = 40 ] && [ "$(meta "$dir/a.safetensors" ss_learning_rate)" = 0.01 ] &&
  [ "$(meta "$dir/a.safetensors" ss_optimizer)" = torch.optim.adamw.AdamW ]
ok $? "kohya's metadata is the trainer's: ss_steps, ss_learning_rate, ss_optimizer"
"$CKRUN" $A -e "local ck = require 'ck'
local n, norms = 0, 0
for line in io.lines('$dir/la/metrics.jsonl') do
  local r = ck.json_decode(line)
  if r.loss then n = n + 1 end
  if r.grad_norm then norms = norms + 1 end
end
assert(n == 40 and norms == 4, n .. ' losses, ' .. norms .. ' gradient norms')" 2>&1
ok $? "the logger observed every step: 40 losses, a gradient norm every 10 steps"

# resume: a run stopped after its state at step 20 and resumed ends with the uninterrupted run's adapter
"$CKRUN" $A $T --steps 40 --save-every 20 --state-dir "$dir/st" --out "$dir/b.safetensors" --log-dir "$dir/lb" > /dev/null 2>&1
cmp -s "$dir/a.safetensors" "$dir/b.safetensors" ; ok $? "saving states changes nothing of training"
"$CKRUN" $A $T --steps 40 --save-every 20 --state-dir "$dir/st" --resume --out "$dir/c.safetensors" \
  --log-dir "$dir/lc" > "$dir/c.out" 2>&1
grep -q "resumed from .*state-000000020.safetensors at step 20" "$dir/c.out" && cmp -s "$dir/a.safetensors" "$dir/c.safetensors"
ok $? "resumed at step 20, the adapter is the uninterrupted run's bitwise"

# kohya's spellings are the trainer's, for any family
"$CKRUN" $A $S --resolution 64 --samples 8 --steps 6 --lr 0.02 --rank 2 --batch 4 --max-grad-norm 0.5 \
  --out "$dir/d.safetensors" --log-dir "$dir/ld" > /dev/null 2>&1
"$CKRUN" $A $S --resolution 64,64 --samples 8 --max_grad_norm 0.5 --steps 6 --learning_rate 0.02 --network_dim 2 \
  --train_batch_size 4 --out "$dir/e.safetensors" --log-dir "$dir/le" > /dev/null 2>&1
cmp -s "$dir/d.safetensors" "$dir/e.safetensors" ; ok $? "kohya's --learning_rate, --network_dim, --train_batch_size, --max_grad_norm, --resolution W,W train what ckrun's names train"

# plan mode
"$CKRUN" $A --plan --json $T --batch 3 > "$dir/plan.json" 2>&1
"$CKRUN" $A -e "local ck = require 'ck'
local f = io.open('$dir/plan.json') local j = ck.json_decode(f:read('a')) f:close()
assert(j.script == 'train_toy_flow' and j.size == 'toy' and j.batch == 3 and j.lora_modules == 2 and j.peak_bytes > 0, 'plan')" 2>&1
ok $? "--plan --json plans the family's step ($(head -c 160 "$dir/plan.json"))"

# buckets: samples of two latent shapes, a program each, one copy of the weights
mkdir -p "$dir/data"
"$CKRUN" $A -e "local ck = require 'ck'
for i = 1, 6 do
  local h, w = i <= 3 and 8 or 4, i <= 3 and 8 or 12
  local lat, txt = {}, {}
  for k = 1, 4 * h * w do lat[k] = math.sin(k + i) end
  for k = 1, 3 * 8 do txt[k] = math.cos(k * i) end
  ck.write_safetensors(string.format('$dir/data/%02d.safetensors', i), {{'latents', {4, h, w}, lat}, {'text_embeds', {3, 8}, txt}})
end"
"$CKRUN" $A $S --resolution 64 --data "$dir/data" --batch 2 --steps 6 --out "$dir/f.safetensors" --log-dir "$dir/lf" > "$dir/f.out" 2>&1 ; rc=$?
[ $rc = 0 ] && grep -q "^2 buckets, 4 programs sharing one copy of the weights" "$dir/f.out"
ok $? "a folder of samples of two shapes trains as buckets ($(grep buckets "$dir/f.out"))"

# errors name the script's line: the family hook's, or the line that called the trainer
hook=$(grep -n 'error("the toy family has no base files")' $S | cut -d: -f1)
runl=$(grep -n 'require("ck.train").run' $S | cut -d: -f1)
err=$("$CKRUN" $A $T --pretrained-model-name-or-path x --out "$dir/g.safetensors" 2>&1)
[ "$err" = "ckrun: $S:$hook: the toy family has no base files" ] ; ok $? "an error in a family hook names its line ($err)"
err=$("$CKRUN" $A $T --full --rank 3 --out "$dir/g.safetensors" 2>&1)
[ "$err" = "ckrun: $S:$runl: --rank is an adapter's option; --full trains every parameter" ] ; ok $? "an error of the trainer names the script's line that called it ($err)"
err=$("$CKRUN" $A $T --data "$dir/none" --out "$dir/g.safetensors" 2>&1)
printf '%s' "$err" | grep -q "^ckrun: $S:$runl: cannot read directory '$dir/none'" ; ok $? "so does one of the stdlib below it ($err)"
err=$("$CKRUN" $A $T --lerning-rate 1 --out "$dir/g.safetensors" 2>&1)
[ "$err" = "ckrun: $S:$runl: unknown option --lerning-rate (did you mean --lr?)" ] ; ok $? "an unknown option gets the nearest name ($err)"
[ ! -e "$dir/g.safetensors" ] ; ok $? "no refused run wrote its file"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
