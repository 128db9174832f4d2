# scripts/generate.lua on a Flux.1 checkpoint (the tiny Flux folder of
# tests/ref/make_flow_ref.py): the family is picked from the checkpoint, the
# PNG is FluxPipeline's image with Forge's parameters text, Flux's options
# reach it, the other family's options are refused in one line, and a folder
# missing a part is named; nothing is written on a refusal.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
A="--allow-write $dir --allow-read $dir"
F=tests/data/flow/pipeline
G="scripts/generate.lua --pretrained-model-name-or-path $F --width 32 --height 24 --steps 3 --t5xxl-max-token-length 16"
params() { "$CKRUN" $A -e "local i = require('ck').image_info('$1'); io.write(i.text and i.text.parameters or '')"; }
one_line() { [ "$1" != 0 ] && [ "$(echo "$2" | grep -c .)" = 1 ] && echo "$2" | grep -q -- "$3"; }

out=$("$CKRUN" $A $G --prompt "a red fox" --seed 5 --out "$dir/a.png" 2>&1) ; rc=$?
ok $rc "generate on a Flux folder exits 0 ($out)"
info=$("$CKRUN" $A -e "local i = require('ck').image_info('$dir/a.png'); io.write(i.format, ' ', i.width, 'x', i.height)")
[ "$info" = "png 32x24" ] ; ok $? "the PNG is 32x24 ($info)"
want="a red fox
Steps: 3, Sampler: Euler, CFG scale: 1, Distilled CFG Scale: 3.5, Seed: 5, Size: 32x24, Model: pipeline"
got=$(params "$dir/a.png")
[ "$got" = "$want" ] ; ok $? "its parameters text names the embedded guidance ($got)"

OMP_NUM_THREADS=1 "$CKRUN" $A $G --prompt "a red fox" --seed 5 --out "$dir/b.png" >/dev/null 2>&1
cmp -s "$dir/a.png" "$dir/b.png" ; ok $? "the same seed on one thread writes the same file"
"$CKRUN" $A $G --prompt "a red fox" --seed 5 --guidance-scale 1.0 --out "$dir/c.png" >/dev/null 2>&1
! cmp -s "$dir/a.png" "$dir/c.png" && params "$dir/c.png" | grep -q "Distilled CFG Scale: 1, " ; ok $? "--guidance-scale 1 changes the image"
"$CKRUN" $A $G --prompt "a red fox" --seed 5 --shift 3 --out "$dir/d.png" >/dev/null 2>&1
! cmp -s "$dir/a.png" "$dir/d.png" && params "$dir/d.png" | grep -q "Shift: 3, " ; ok $? "--shift 3 changes the image and is named"
# bf16 activations: another rounding (on this random tiny model torch's bf16 differs from its fp32 as much)
out=$("$CKRUN" $A $G --prompt "a red fox" --seed 5 --mixed-precision bf16 --fp8-base --out "$dir/e.png" 2>&1) ; rc=$?
[ $rc = 0 ] && ! cmp -s "$dir/a.png" "$dir/e.png" ; ok $? "--mixed-precision bf16 --fp8-base runs, in its own rounding ($out)"
out=$("$CKRUN" $A $G --prompt "a red fox" --seed 5 --ae $F/vae --clip-l $F/text_encoder --t5xxl $F/text_encoder_2 \
  --tokenizer $F/tokenizer --t5-tokenizer $F/tokenizer_2 --out "$dir/f.png" 2>&1) ; rc=$?
[ $rc = 0 ] && cmp -s "$dir/a.png" "$dir/f.png" ; ok $? "the parts named one by one give the folder's image ($out)"

# the other family's options, sizes, missing parts: one line, nothing written
err=$("$CKRUN" $A $G --cfg-scale 4 --out "$dir/x.png" 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "--cfg-scale is SDXL's; $F is a Flux model" && [ ! -e "$dir/x.png" ] ; ok $? "--cfg-scale with Flux: one line ($err)"
for o in "--negative-prompt blurry" "--sampler euler_a" "--lora $dir/l.safetensors" "--prediction v"; do
  err=$("$CKRUN" $A $G $o --out "$dir/x.png" 2>&1 >/dev/null) ; rc=$?
  one_line $rc "$err" "${o%% *} is SDXL's" && [ ! -e "$dir/x.png" ] ; ok $? "${o%% *} with Flux: one line ($err)"
done
for o in "--guidance-scale 3" "--shift 2" "--t5xxl-max-token-length 64" "--fp8-base"; do
  err=$("$CKRUN" $A scripts/generate.lua $o --width 64 --height 32 --out "$dir/x.png" 2>&1 >/dev/null) ; rc=$?
  one_line $rc "$err" "${o%% *} applies to Flux models only" && [ ! -e "$dir/x.png" ] ; ok $? "${o%% *} with SDXL: one line ($err)"
done
err=$("$CKRUN" $A scripts/generate.lua --pretrained-model-name-or-path $F --width 30 --out "$dir/x.png" 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "width 30: Flux needs sizes that are multiples of 4 pixels" && [ ! -e "$dir/x.png" ]
ok $? "--width 30: one line ($err)"
cp -rL $F "$dir/partial"
rm -r "$dir/partial/text_encoder_2"
err=$("$CKRUN" $A scripts/generate.lua --pretrained-model-name-or-path "$dir/partial" --out "$dir/x.png" 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "partial: this Flux folder lacks a part; give T5-XXL (--t5xxl)" && [ ! -e "$dir/x.png" ]
ok $? "a folder without text_encoder_2/: one line naming the option that gives it ($err)"
out=$("$CKRUN" $A scripts/generate.lua --pretrained-model-name-or-path "$dir/partial" --t5xxl $F/text_encoder_2 \
  --width 32 --height 24 --steps 3 --t5xxl-max-token-length 16 --prompt "a red fox" --seed 5 --out "$dir/g.png" 2>&1) ; rc=$?
same_pixels() { [ "$("$CKRUN" $A -e "local ck = require 'ck'
local a, b = ck.image_load('$1'):table(), ck.image_load('$2'):table()
for i = 1, #a do if a[i] ~= b[i] then io.write('differ') return end end io.write('same')")" = same ]; }
[ $rc = 0 ] && same_pixels "$dir/a.png" "$dir/g.png" ; ok $? "--t5xxl gives the missing part: the folder's pixels ($out)"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
