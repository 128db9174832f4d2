# Sample images during training (train_sdxl_lora --sample-every,
# --sample-prompts in kohya's format), end to end on the tiny random model:
# the PNGs at each sampling step, named by step and prompt index, with A1111's
# parameters; each is the image scripts/generate.lua makes from the adapter
# saved at that step, pixel for pixel; sampling changes nothing of training
# (the same adapter bitwise) nor its op lists, and the plan's arena is the
# larger of training's and sampling's; the log records the sampling time and
# the images (TensorBoard image summaries); a bad prompt file is one line
# naming the file and line, before anything is written.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
A="--allow-write $dir --allow-read $dir"
cat > "$dir/p.txt" <<'P'
# kohya's format: a prompt a line, options after it
a red circle --n blurry --w 64 --h 32 --s 3 --l 4 --d 5 --ss k_euler

a blue square --s 4
P
T="scripts/train_sdxl_lora.lua --resolution 64 --steps 4 --batch 1 --samples 2 --lr 0.05"
params() { "$CKRUN" $A -e "local i = require('ck').image_info('$1'); io.write(i.text and i.text.parameters or '')"; }
same_pixels() {
  [ "$("$CKRUN" $A -e "local ck = require 'ck'
local a, b = ck.image_load('$1'):table(), ck.image_load('$2'):table()
if #a ~= #b then io.write('sizes differ') return end
for i = 1, #a do if a[i] ~= b[i] then io.write('differ') return end end io.write('same')")" = same ]
}

out=$("$CKRUN" $A $T --sample-every 2 --sample-at-first --sample-prompts "$dir/p.txt" --save-lora-every 2 \
  --out "$dir/a.safetensors" --log-dir "$dir/log" 2>&1) ; rc=$?
ok $rc "training with samples exits 0"
files=$(cd "$dir/samples" 2>/dev/null && ls | tr '\n' ' ')
[ "$files" = "a_000000_00.png a_000000_01.png a_000002_00.png a_000002_01.png a_000004_00.png a_000004_01.png " ]
ok $? "OUT_DIR/samples holds each prompt at steps 0 (--sample-at-first), 2 and 4 ($files)"
echo "$out" | grep -qE "^step 2: 2 samples in [0-9.]+ s" ; ok $? "the run says how long each sampling took"
want="a red circle
Negative prompt: blurry
Steps: 3, Sampler: Euler, CFG scale: 4, Seed: 5, Size: 64x32, Model: sdxl-tiny (trained by ckrun)"
got=$(params "$dir/samples/a_000002_00.png")
[ "$got" = "$want" ] ; ok $? "a sample's parameters are A1111's, with the prompt line's options ($got)"
got=$(params "$dir/samples/a_000002_01.png" | tail -1)
[ "$got" = "Steps: 4, Sampler: DDIM, CFG scale: 7.5, Seed: 1, Size: 64x64, Model: sdxl-tiny (trained by ckrun)" ]
ok $? "unset options take the defaults: --resolution, CFG 7.5, the run's seed, --sample-sampler ddim ($got)"

# each sample is what generate.lua makes from the adapter of that step
G="scripts/generate.lua --prompt 'a red circle' --negative-prompt blurry --width 64 --height 32 --steps 3 --cfg-scale 4 --seed 5 --sampler euler --prediction v"
eval "\"$CKRUN\" $A $G --lora \"$dir/a-step00000002.safetensors\" --out \"$dir/g2.png\"" >/dev/null 2>&1
same_pixels "$dir/samples/a_000002_00.png" "$dir/g2.png" ; ok $? "the step-2 sample is generate.lua's image with the step-2 adapter, pixel for pixel"
eval "\"$CKRUN\" $A $G --lora \"$dir/a.safetensors\" --out \"$dir/g4.png\"" >/dev/null 2>&1
same_pixels "$dir/samples/a_000004_00.png" "$dir/g4.png" ; ok $? "the step-4 sample is generate.lua's image with the final adapter"
eval "\"$CKRUN\" $A $G --out \"$dir/g0.png\"" >/dev/null 2>&1
same_pixels "$dir/samples/a_000000_00.png" "$dir/g0.png" ; ok $? "the step-0 sample is the base's image (a fresh adapter adds nothing)"
! same_pixels "$dir/samples/a_000000_00.png" "$dir/samples/a_000004_00.png" ; ok $? "training changes the samples"

# sampling changes nothing of training
"$CKRUN" $A $T --out "$dir/b.safetensors" --log-dir "$dir/logb" >/dev/null 2>&1
cmp -s "$dir/a.safetensors" "$dir/b.safetensors" ; ok $? "the adapter trained with samples is the one trained without, bitwise"

# the log: the sampling time beside the steps, the images as TensorBoard image summaries
"$CKRUN" $A -e "local ck = require 'ck'
local n = 0
for line in io.lines('$dir/log/metrics.jsonl') do
  local r = ck.json_decode(line)
  if r.sample_time then
    assert(r.sample_time > 0 and #r.sample_files == 2, line)
    n = n + 1
  end
end
assert(n == 3, 'sampling records: ' .. n)
local ev
for _, name in ipairs(ck.listdir('$dir/log')) do if name:match('^events') then ev = '$dir/log/' .. name end end
local events = assert(ck.read_events(ev))
local seen = 0
for _, e in ipairs(events) do
  for tag, im in pairs(e.images or {}) do
    local k = tonumber(tag:match('^sample/(%d+)$'))
    local f = assert(io.open(string.format('$dir/samples/a_%06d_%02d.png', e.step, k), 'rb'))
    assert(im.png == f:read('a'), 'the image of ' .. tag .. ' at step ' .. e.step .. ' is the file')
    f:close()
    assert(im.width == (k == 0 and 64 or 64) and im.height == (k == 0 and 32 or 64), tag)
    seen = seen + 1
  end
end
assert(seen == 6, 'images in the events: ' .. seen)" ; ok $? "metrics.jsonl holds each sampling's time; the events hold each sample as an image, its file's bytes"

# --plan: the sampling programs planned in the training program's group; its own lists unchanged
cat > "$dir/big.txt" <<'P'
a big one --w 256 --h 128
P
plan_s=$("$CKRUN" $A --plan --json $T --sample-every 2 --sample-prompts "$dir/big.txt" 2>&1)
plan_n=$("$CKRUN" $A --plan --json $T 2>&1)
"$CKRUN" $A -e "local ck = require 'ck'
local s, n = ck.json_decode([==[$plan_s]==]), ck.json_decode([==[$plan_n]==])
assert(s.ops == n.ops and s.arena_bytes == n.arena_bytes and s.peak_bytes == n.peak_bytes, 'the training lists')
assert(s.group_arena_bytes > n.group_arena_bytes, 'sampling at 256x128 needs more than training at 64')
assert(s.sample_unet_256x128 and s.sample_vae_decoder_256x128, 'each sampling program is reported')" 2>&1
ok $? "--plan: the training program's op lists and peak are the same with sampling; the run's arena is the larger"

# bad input: one line naming the file and line; nothing written
one_line() { [ "$1" != 0 ] && [ "$(echo "$2" | grep -c .)" = 1 ] && echo "$2" | grep -qF -- "$3"; }
bad() { # prompt-file text, expected text in the error
  printf '%s\n' "$1" > "$dir/bad.txt"
  rm -rf "$dir/c.safetensors" "$dir/samples.c"
  err=$("$CKRUN" $A $T --sample-every 2 --sample-prompts "$dir/bad.txt" --out "$dir/c.safetensors" \
    --log-dir "$dir/logc" 2>&1 >/dev/null) ; rc=$?
  one_line $rc "$err" "$2" && [ ! -e "$dir/c.safetensors" ] && [ ! -e "$dir/logc" ]
}
bad "$(printf 'fine\na cat --x 3')" "$dir/bad.txt:2: unknown option '--x'" ; ok $? "an unknown option: one line naming the file and line ($err)"
bad "a cat --w 60" "$dir/bad.txt:1: --w 60: a size must be a positive multiple of 8 pixels" ; ok $? "a size that is not a multiple of 8 ($err)"
bad "a cat --w 72" "$dir/bad.txt:1: --w 72: this UNet needs sizes that are multiples of 32 pixels" ; ok $? "a size the UNet cannot halve ($err)"
bad "a cat --ss heun" "$dir/bad.txt:1: unknown sampler 'heun'" ; ok $? "an unknown sampler ($err)"
bad "a cat --s many" "$dir/bad.txt:1: --s must be a whole number, got 'many'" ; ok $? "a step count that is not a number ($err)"
bad "# nothing" "$dir/bad.txt: the prompt file holds no prompt" ; ok $? "a file without a prompt ($err)"
# what the sampler itself would refuse is refused here, by the same check, before the first step
bad "a cat --l 1e308" "$dir/bad.txt:1: --l 1e+308: a CFG scale must be a number from 0 to 100" ; ok $? "a CFG scale past any use ($err)"
bad "a cat --l -1" "$dir/bad.txt:1: --l -1: a CFG scale must be" ; ok $? "a negative CFG scale ($err)"
bad "a cat --s 1000 --ss dpmsolver++" "$dir/bad.txt:1: --s 1000: steps must be from 1 to 999" ; ok $? "more steps than DPM++ has ($err)"
bad "a cat --w 32768" "$dir/bad.txt:1: --w 32768: at most 16384 pixels" ; ok $? "a size past the largest ($err)"
bad "a cat --n $(printf '\377')" "$dir/bad.txt:1: the line is not UTF-8" ; ok $? "a line that is not UTF-8 ($err)"
nul() { printf 'fine\n'; printf "$1"; }
for line in 'a c\000t\n' 'a cat --n blu\000rry\n'; do
  nul "$line" > "$dir/bad.txt"
  rm -rf "$dir/c.safetensors"
  err=$("$CKRUN" $A $T --sample-every 2 --sample-prompts "$dir/bad.txt" --out "$dir/c.safetensors" --log-dir "$dir/logc" 2>&1 >/dev/null) ; rc=$?
  one_line $rc "$err" "$dir/bad.txt:2: " && echo "$err" | grep -q "holds a NUL byte" && [ ! -e "$dir/c.safetensors" ] && [ ! -e "$dir/logc" ]
  ok $? "a NUL byte in a prompt ($line) is refused before training ($err)"
done
err=$("$CKRUN" $A $T --sample-every 2 --sample-prompts "$dir/missing.txt" --out "$dir/c.safetensors" 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "missing.txt" ; ok $? "a missing prompt file: one line naming it ($err)"
err=$("$CKRUN" $A $T --sample-every 2 --out "$dir/c.safetensors" 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "--sample-prompts FILE" ; ok $? "--sample-every without prompts is refused ($err)"
err=$("$CKRUN" $A $T --sample-every 2 --sample-prompts "$dir/p.txt" --sample-sampler heun 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "--sample-sampler" ; ok $? "an unknown --sample-sampler is refused ($err)"
err=$("$CKRUN" $A scripts/train_sdxl_lora.lua --steps 3 --steps 4 2>&1 >/dev/null) ; rc=$?
one_line $rc "$err" "--steps is given 2 times ('3', '4'): give it once" ; ok $? "an option given twice is refused ($err)"

# a sample write that fails part way (the file size limit) ends the run with one line; the sample there stays
good=$(md5sum "$dir/samples/a_000000_00.png")
err=$( (trap '' XFSZ; ulimit -f 2; "$CKRUN" $A $T --sample-every 2 --sample-at-first --sample-prompts "$dir/p.txt" \
  --out "$dir/a.safetensors" --log-dir "$dir/logf") 2>&1 >/dev/null) ; rc=$?
[ $rc != 0 ] && [ "$(echo "$err" | grep -c .)" = 1 ] && echo "$err" | grep -q "a_000000_00.png" ; ok $? "a failed sample write: one line naming the PNG ($err)"
[ "$good" = "$(md5sum "$dir/samples/a_000000_00.png")" ] && [ -z "$(ls "$dir/samples" | grep '\.png\.')" ]
ok $? "the sample already there is as it was, and no temporary file is left"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
