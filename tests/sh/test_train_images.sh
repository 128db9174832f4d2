# scripts/train_sdxl_lora.lua from a folder of images with captions, end to
# end on the tiny random model: scripts/make_shapes_dataset.lua draws the set;
# the first run encodes every image into the cache beside it and trains; a
# second run finds them all cached and trains the same adapter bitwise; a
# changed image and a changed caption re-encode only their own images;
# caption augmentation and --flip-aug train; an image smaller than the
# smallest bucket is scaled up to it, as kohya's; bad inputs (a truncated
# image, with --bucket-no-upscale an image with no bucket, a base that is not
# SDXL) end with one line naming the file and leave the cache and the adapter
# as they were.
set -u
dir=$(mktemp -d)
logs=out/.test_train_images.$$
trap 'rm -rf "$dir" "$logs"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
A="--allow-write $dir --allow-read $dir"
"$CKRUN" $A scripts/make_shapes_dataset.lua "$dir/shapes" 6 --repeats 2 --size 64 >/dev/null || { echo "FAIL making the set"; exit 1; }
S="scripts/train_sdxl_lora.lua --data $dir/shapes --resolution 64 --enable-bucket --min-bucket-reso 32 --max-bucket-reso 128 --batch 2 --steps 4 --log-dir $logs"
cached() { find "$dir/shapes" -name '*.safetensors' | sort; }

out=$("$CKRUN" $A $S --out "$dir/a.safetensors" 2>&1) ; rc=$?
ok $rc "training from a folder of images exits 0"
echo "$out" | grep -q "^cache: 6 images encoded in" ; ok $? "the first run encodes the 6 images"
echo "$out" | grep -qE "^cache: encoded 6/6 images \([0-9.]+ images/s\)" ; ok $? "encoding reports progress and images per second"
[ "$(cached | wc -l)" = 6 ] ; ok $? "one cached sample per image, beside it ($(cached | wc -l))"
[ -s "$dir/a.safetensors" ] ; ok $? "the adapter is written"
"$CKRUN" $A -e "local ck = require 'ck'
for _, path in ipairs{$(cached | head -2 | sed 's/.*/\"&\",/' | tr -d '\n')} do
  local f <close> = ck.safetensors(path)
  for _, k in ipairs{'latents', 'prompt_embeds', 'pooled_prompt_embeds', 'time_ids'} do assert(f:has(k), k) end
  local s = f:shape('prompt_embeds')
  assert(s[1] == 77 and s[2] == 64, 'prompt_embeds ' .. table.concat(s, 'x'))
  assert(#f:shape('latents') == 3 and f:shape('latents')[1] == 4)
end" ; ok $? "a cached sample holds latents, prompt_embeds [77, 64], pooled_prompt_embeds and time_ids"

before=$(cached | xargs md5sum)
out=$("$CKRUN" $A $S --out "$dir/b.safetensors" 2>&1) ; rc=$?
ok $rc "a second run exits 0"
echo "$out" | grep -q "^cache: all 6 images encoded already" ; ok $? "the second run encodes nothing"
[ "$before" = "$(cached | xargs md5sum)" ] ; ok $? "the cache is left as it was"
cmp -s "$dir/a.safetensors" "$dir/b.safetensors" ; ok $? "the same data and seed train the same adapter bitwise"

# a cached file cut short is encoded again, the others kept
victim=$(cached | head -1)
head -c 200 "$victim" > "$dir/cut" && cat "$dir/cut" > "$victim"
out=$("$CKRUN" $A $S --out "$dir/b2.safetensors" 2>&1) ; rc=$?
echo "$out" | grep -q "^cache: 1 image encoded in .*, 5 already there" && cmp -s "$dir/a.safetensors" "$dir/b2.safetensors"
ok $? "a cached file cut short is encoded again, and training is as before"

# a changed caption and a changed image: only theirs are encoded again
first=$(ls "$dir"/shapes/2_shapes/*.txt | head -1)
echo "a changed caption" > "$first"
second=$(ls "$dir"/shapes/2_shapes/*.png | sed -n 2p)
cp "$(ls "$dir"/shapes/2_shapes/*.png | sed -n 3p)" "$second"
out=$("$CKRUN" $A $S --out "$dir/c.safetensors" 2>&1) ; rc=$?
echo "$out" | grep -q "^cache: 2 images encoded in .*, 4 already there" ; ok $? "a changed caption and a changed image re-encode those 2 images only"

# augmentation: captions made and encoded at each step; mirrored latents cached
out=$("$CKRUN" $A $S --shuffle-caption --keep-tokens 1 --caption-dropout-rate 0.2 --flip-aug --out "$dir/d.safetensors" 2>&1) ; rc=$?
ok $rc "--shuffle-caption --caption-dropout-rate --flip-aug train"
"$CKRUN" $A -e "local ck = require 'ck'
local n = 0
for _, p in ipairs{$(cached | sed 's/.*/\"&\",/' | tr -d '\n')} do
  local f <close> = ck.safetensors(p)
  if f:has('latents_flipped') then n = n + 1; assert(not f:has('prompt_embeds')) end
end
assert(n == 6, n)" ; ok $? "with caption augmentation the cache holds latents and their mirror, no text"

# --random-crop: nothing cached, every use encoded at its step
rm -f $(cached)
out=$("$CKRUN" $A $S --random-crop --flip-aug --out "$dir/rc.safetensors" 2>&1) ; rc=$?
ok $rc "--random-crop --flip-aug trains"
[ "$(cached | wc -l)" = 0 ] && ! echo "$out" | grep -q "^cache:" ; ok $? "--random-crop caches nothing"
"$CKRUN" $A $S --random-crop --flip-aug --out "$dir/rc2.safetensors" >/dev/null 2>&1
cmp -s "$dir/rc.safetensors" "$dir/rc2.safetensors" ; ok $? "random crops are drawn from the seed: a second run trains the same adapter"
"$CKRUN" $A $S --out "$dir/plain.safetensors" >/dev/null 2>&1
! cmp -s "$dir/rc.safetensors" "$dir/plain.safetensors" ; ok $? "and another adapter than centered crops train"

# kohya's --max-token-length: 227 tokens a prompt, in the cache and in the UNet's input
out=$("$CKRUN" $A $S --max-token-length 225 --out "$dir/t.safetensors" 2>&1) ; rc=$?
ok $rc "--max-token-length 225 trains"
"$CKRUN" $A -e "local ck = require 'ck'
local n = 0
for _, p in ipairs{$(cached | sed 's/.*/\"&\",/' | tr -d '\n')} do
  local f <close> = ck.safetensors(p)
  if f:has('prompt_embeds') and f:shape('prompt_embeds')[1] == 227 then n = n + 1 end
end
assert(n == 6, n)" ; ok $? "its cache holds prompt_embeds of 227 tokens for every image"

# a base model as a diffusers folder (tests/data/checkpoint: a tiny SDXL made by diffusers): its UNet,
# VAE, text encoders and tokenizers, through the same path
out=$("$CKRUN" $A $S --pretrained-model-name-or-path tests/data/checkpoint/sdxl_tiny --out "$dir/base.safetensors" 2>&1) ; rc=$?
ok $rc "training on a diffusers folder's model exits 0"
echo "$out" | grep -qE "^loaded [0-9]+ UNet tensors from tests/data/checkpoint/sdxl_tiny" ; ok $? "its UNet is loaded ($(echo "$out" | grep '^loaded'))"

# --plan: the buckets from the images' headers, nothing encoded
rm -f $(cached)
json=$("$CKRUN" $A --plan --json $S)
[ "$(echo "$json" | wc -l)" = 1 ] && [ "$(cached | wc -l)" = 0 ] ; ok $? "--plan on images plans without encoding"

# bad input: one line naming the file; the adapter and the cache untouched
"$CKRUN" $A $S --out "$dir/e.safetensors" >/dev/null 2>&1
good=$(md5sum "$dir/e.safetensors")
state=$(cached | xargs md5sum)
bad=$(ls "$dir"/shapes/2_shapes/*.png | head -1)
cp "$bad" "$dir/keep.png"
head -c 100 "$dir/keep.png" > "$bad"
err=$("$CKRUN" $A $S --out "$dir/e.safetensors" 2>&1 >/dev/null) ; rc=$?
[ $rc != 0 ] && [ "$(echo "$err" | grep -c .)" = 1 ] && echo "$err" | grep -q "$bad" ; ok $? "a truncated image: one line naming it ($err)"
[ "$good" = "$(md5sum "$dir/e.safetensors")" ] && [ "$state" = "$(cached | xargs md5sum)" ] ; ok $? "the adapter and the cache are as they were"
cp "$dir/keep.png" "$bad"
"$CKRUN" $A -e "local ck = require 'ck'; ck.write_png('$dir/shapes/2_shapes/tiny.png', ck.array({3, 16, 16}, 0))"; echo tiny > "$dir/shapes/2_shapes/tiny.txt"
out=$("$CKRUN" $A $S --out "$dir/t.safetensors" 2>&1) ; rc=$?
tiny=$(find "$dir/shapes" -name 'tiny_*.safetensors')
[ $rc = 0 ] && [ -n "$tiny" ] && "$CKRUN" $A -e "local f <close> = require('ck').safetensors('$tiny')
  assert(table.concat(f:shape('latents'), 'x') == '4x8x8', table.concat(f:shape('latents'), 'x'))"
ok $? "an image smaller than the smallest bucket is scaled up to its bucket (64x64), as kohya's ($rc)"
rm -f $tiny
# (at 128, the set's own images have buckets without upscaling: their sides are 64 and more)
err=$("$CKRUN" $A ${S/--resolution 64/--resolution 128} --bucket-no-upscale --out "$dir/e.safetensors" 2>&1 >/dev/null) ; rc=$?
[ $rc != 0 ] && [ "$(echo "$err" | grep -c .)" = 1 ] && echo "$err" | grep -q "tiny.png' (16x16) has a side below --bucket-reso-steps 64" &&
  [ -z "$(find "$dir/shapes" -name 'tiny_*.safetensors')" ] && [ "$good" = "$(md5sum "$dir/e.safetensors")" ]
ok $? "with --bucket-no-upscale, an image with a side below the bucket steps: refused naming it, nothing written ($err)"
rm -f "$dir/shapes/2_shapes/tiny.png" "$dir/shapes/2_shapes/tiny.txt"
"$CKRUN" $A -e "local ck = require 'ck'; ck.write_safetensors('$dir/notsdxl.safetensors', {{'model.weight', {2}, {1, 2}}})"
err=$("$CKRUN" $A $S --pretrained-model-name-or-path "$dir/notsdxl.safetensors" --out "$dir/e.safetensors" 2>&1 >/dev/null) ; rc=$?
[ $rc != 0 ] && [ "$(echo "$err" | grep -c .)" = 1 ] && echo "$err" | grep -q "notsdxl.safetensors" ; ok $? "a checkpoint that is not SDXL: one line naming it ($err)"
[ "$good" = "$(md5sum "$dir/e.safetensors")" ] ; ok $? "the adapter is as it was"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
