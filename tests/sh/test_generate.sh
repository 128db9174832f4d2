# scripts/generate.lua end to end on the tiny random model: a PNG whose tEXt
# "parameters" holds the settings in A1111's format; the same seed gives the
# same file at any thread count; an adapter train_sdxl_lora wrote (LoCon)
# loads at a strength; the diffusers folder's model generates; bad input is
# one line naming it; a failed write leaves an existing PNG as it was.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
A="--allow-write $dir --allow-read $dir"
G="scripts/generate.lua --width 64 --height 32 --steps 3"
params() { "$CKRUN" $A -e "local i = require('ck').image_info('$1'); io.write(i.text and i.text.parameters or '')"; }

out=$("$CKRUN" $A $G --prompt "a red circle" --negative-prompt "blurry" --seed 5 --sampler euler_a --cfg-scale 4.5 \
  --out "$dir/a.png" 2>&1) ; rc=$?
ok $rc "generate exits 0 ($out)"
info=$("$CKRUN" $A -e "local i = require('ck').image_info('$dir/a.png'); io.write(i.format, ' ', i.width, 'x', i.height)")
[ "$info" = "png 64x32" ] ; ok $? "the PNG is 64x32 ($info)"
want="a red circle
Negative prompt: blurry
Steps: 3, Sampler: Euler a, CFG scale: 4.5, Seed: 5, Size: 64x32, Model: tiny-random-seed1"
got=$(params "$dir/a.png")
[ "$got" = "$want" ] ; ok $? "its tEXt parameters are A1111's ($got)"

OMP_NUM_THREADS=1 "$CKRUN" $A $G --prompt "a red circle" --negative-prompt "blurry" --seed 5 --sampler euler_a \
  --cfg-scale 4.5 --out "$dir/b.png" >/dev/null 2>&1
cmp -s "$dir/a.png" "$dir/b.png" ; ok $? "the same seed on one thread writes the same file"
"$CKRUN" $A $G --prompt "a red circle" --negative-prompt "blurry" --seed 6 --sampler euler_a --cfg-scale 4.5 \
  --out "$dir/c.png" >/dev/null 2>&1
! cmp -s "$dir/a.png" "$dir/c.png" ; ok $? "another seed writes another image"

"$CKRUN" $A $G --prompt "a red circle" --negative-prompt "blurry" --seed 5 --sampler euler_a --cfg-scale 4.5 \
  --prediction v --out "$dir/v.png" >/dev/null 2>&1 && ! cmp -s "$dir/a.png" "$dir/v.png" ; ok $? "--prediction v runs and reads the output as v"

# an adapter as train_sdxl_lora writes it (kohya naming, LoCon convolutions)
"$CKRUN" $A scripts/train_sdxl_lora.lua --resolution 64 --steps 2 --batch 1 --samples 2 --conv-rank 2 \
  --targets kohya --lr 0.05 --out "$dir/l.safetensors" --log-dir "$dir/logs" >/dev/null 2>&1 || echo "FAIL training"
"$CKRUN" $A $G --prompt "a red circle" --out "$dir/p.png" >/dev/null 2>&1
out=$("$CKRUN" $A $G --prompt "a red circle" --lora "$dir/l.safetensors:0.7" --out "$dir/q.png" 2>&1) ; rc=$?
ok $rc "generate with --lora FILE:0.7 exits 0 ($out)"
params "$dir/q.png" | head -1 | grep -qx "a red circle <lora:l:0.7>" ; ok $? "the prompt line names the LoRA ($(params "$dir/q.png" | head -1))"
! cmp -s "$dir/p.png" "$dir/q.png" ; ok $? "the adapter changes the image"
"$CKRUN" $A $G --prompt "a red circle" --lora "$dir/l.safetensors:0" --out "$dir/r.png" >/dev/null 2>&1
[ "$("$CKRUN" $A -e "local ck = require 'ck'
local a, b = ck.image_load('$dir/p.png'):table(), ck.image_load('$dir/r.png'):table()
for i = 1, #a do if a[i] ~= b[i] then io.write('differ') return end end io.write('same')")" = same ] ; ok $? "at strength 0 the pixels are the base's"

# --lora again for each file: the same as one comma-separated list
"$CKRUN" $A $G --prompt "a red circle" --lora "$dir/l.safetensors:0.4,$dir/l.safetensors:0.3" --out "$dir/s.png" >/dev/null 2>&1
"$CKRUN" $A $G --prompt "a red circle" --lora "$dir/l.safetensors:0.4" --lora "$dir/l.safetensors:0.3" \
  --out "$dir/t.png" >/dev/null 2>&1
cmp -s "$dir/s.png" "$dir/t.png" && params "$dir/t.png" | head -1 | grep -qx "a red circle <lora:l:0.4> <lora:l:0.3>"
ok $? "--lora given twice adds both adapters, as a comma-separated list does ($(params "$dir/t.png" | head -1))"
! cmp -s "$dir/s.png" "$dir/q.png" ; ok $? "two adapters at 0.4 and 0.3 are not one at 0.7's file"

# the diffusers folder's model (its own tokenizers, encoders, UNet and VAE)
out=$("$CKRUN" $A $G --pretrained-model-name-or-path tests/data/checkpoint/sdxl_tiny --prompt "the cat" \
  --sampler dpmpp_2m_karras --out "$dir/f.png" 2>&1) ; rc=$?
ok $rc "generate on the diffusers folder exits 0 ($out)"
params "$dir/f.png" | tail -1 | grep -q "Sampler: DPM++ 2M Karras, .*Model: sdxl_tiny$" ; ok $? "its parameters name the model ($(params "$dir/f.png" | tail -1))"
# its scheduler/scheduler_config.json: the class's sampler by default; a field ckrun lacks refused by name, before any work
out=$("$CKRUN" $A $G --pretrained-model-name-or-path tests/data/checkpoint/sdxl_tiny --prompt "the cat" --out "$dir/g.png" 2>&1) ; rc=$?
[ $rc = 0 ] && params "$dir/g.png" | tail -1 | grep -q "Sampler: Euler, " ; ok $? "without --sampler, the folder's EulerDiscreteScheduler ($out)"
cp -r tests/data/checkpoint/sdxl_tiny "$dir/zsnr"
sed -i 's/"rescale_betas_zero_snr": false/"rescale_betas_zero_snr": true/' "$dir/zsnr/scheduler/scheduler_config.json"
err=$("$CKRUN" $A $G --pretrained-model-name-or-path "$dir/zsnr" --prompt "the cat" --out "$dir/z.png" 2>&1 >/dev/null) ; rc=$?
[ $rc != 0 ] && [ "$(echo "$err" | grep -c .)" = 1 ] && echo "$err" | grep -q "zsnr/scheduler/scheduler_config.json: field 'rescale_betas_zero_snr' is true" && [ ! -e "$dir/z.png" ]
ok $? "a scheduler field ckrun lacks: one line naming the file and the field, nothing written ($err)"

# bad input: one line naming it, non-zero, the PNG already there untouched
good=$(md5sum "$dir/a.png")
one_line() { [ "$1" != 0 ] && [ "$(echo "$2" | grep -c .)" = 1 ] && echo "$2" | grep -q -- "$3"; }
err=$("$CKRUN" $A $G --lora "$dir/missing.safetensors" --out "$dir/a.png" 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "missing.safetensors" ; ok $? "a missing LoRA file: one line naming it ($err)"
"$CKRUN" $A -e "local ck = require 'ck'
ck.write_safetensors('$dir/stray.safetensors', {{'lora_unet_nowhere.lora_down.weight', {2, 4}, {0,0,0,0,0,0,0,0}}})"
err=$("$CKRUN" $A $G --lora "$dir/stray.safetensors" --out "$dir/a.png" 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "stray.safetensors: LoRA key 'lora_unet_nowhere.lora_down.weight' matches no module" ; ok $? "a key matching no module: one line naming it and the file ($err)"
err=$("$CKRUN" $A scripts/generate.lua --width 60 --height 32 --steps 3 --out "$dir/a.png" 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "width 60: a size must be a positive multiple of 8 pixels" ; ok $? "--width 60: one line ($err)"
err=$("$CKRUN" $A $G --sampler heun --out "$dir/a.png" 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "sampler" ; ok $? "--sampler heun: one line ($err)"
[ "$good" = "$(md5sum "$dir/a.png")" ] ; ok $? "the PNG already there is as it was"

# a write that fails part way (the file size limit; SIGXFSZ ignored so the write returns an error)
size=$(stat -c %s "$dir/a.png")
err=$( (trap '' XFSZ; ulimit -f 1; "$CKRUN" $A scripts/generate.lua --width 256 --height 256 --steps 2 --seed 9 \
  --out "$dir/a.png") 2>&1 >/dev/null) ; rc=$?
[ $rc != 0 ] && [ "$(echo "$err" | grep -c .)" = 1 ] && echo "$err" | grep -q "a.png" ; ok $? "a failed write: one line naming the PNG ($err)"
[ "$good" = "$(md5sum "$dir/a.png")" ] ; ok $? "and the PNG already there ($size bytes) is as it was"
[ -z "$(ls "$dir" | grep '^a\.png\.')" ] ; ok $? "no temporary file is left beside it ($(ls "$dir" | grep '^a\.png\.' | tr '\n' ' '))"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
