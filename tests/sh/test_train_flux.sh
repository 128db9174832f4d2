# scripts/train_flux_lora.lua end to end on flux-tiny (ck.train with the Flux
# family): the loss falls under kohya's recommended flow-matching settings;
# the adapter file is kohya's Flux layout with kohya's metadata and loads back
# through ck.flux_lora, as the PEFT layout does, both holding the same adapter;
# recompute (--checkpoint diffusers: every block) trains the same adapter;
# a resumed run ends with the uninterrupted run's adapter bitwise; a folder of
# images goes through the tiny Flux pipeline's VAE, T5 and CLIP-L into the
# cache (a second run encodes nothing); samples while training are
# generate.lua's images; --plan plans FLUX.1-dev without allocating it; bad
# input (another family's file or option, an unknown Flux variant, a missing
# T5 tokenizer, a bad prompt line) is one line, a non-zero exit and nothing
# written.
set -u
dir=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
A="--allow-write $dir --allow-read $dir"
S=scripts/train_flux_lora.lua
T="$S --resolution 64 --t5xxl-max-token-length 8"
P=tests/data/flow/pipeline # a tiny Flux folder made by diffusers (flux-tiny, T5, CLIP-L, a 2-level VAE)
lua() { "$CKRUN" $A -e "local ck = require 'ck' $1" 2>&1; }
meta() { lua "io.write(tostring(ck.safetensors('$1'):metadata()['$2']))"; }

# the loss falls: kohya's recommended settings (docs/flux_train_network.md), 200 steps
K="--timestep-sampling shift --discrete-flow-shift 3.1582 --model-prediction-type raw --guidance-scale 1.0"
"$CKRUN" $A $T $K --steps 200 --out "$dir/a.safetensors" --log-dir "$dir/la" > "$dir/a.out" 2>&1 ; rc=$?
ok $rc "flux-tiny trains on the synthetic set ($(tail -1 "$dir/a.out"))"
grep -q "^training LoRA rank 4 (kohya's targets) on 40 modules of flux-tiny (134784 parameters, 16384 trainable), 64x64, batch 2, 200 steps, flow matching (shift timesteps, raw prediction)$" "$dir/a.out"
ok $? "the run's first line is in the family's words ($(grep '^training LoRA' "$dir/a.out"))"
out=$(lua "local l = {}
for line in io.lines('$dir/la/metrics.jsonl') do local r = ck.json_decode(line) if r.loss then l[#l + 1] = r.loss end end
local function mean(a, b) local s = 0 for i = a, b do s = s + l[i] end return s / (b - a + 1) end
local first, last = mean(1, 40), mean(#l - 39, #l)
io.write(string.format('%d losses, mean of the first 40 %.4f, of the last 40 %.4f', #l, first, last))
assert(#l == 200 and last < 0.85 * first)")
ok $? "the training loss falls by more than 15% ($out)"
before=$(sed -n 's/^validation loss (fixed batches): before \([0-9.]*\), after \([0-9.]*\)$/\1/p' "$dir/a.out")
after=$(sed -n 's/^validation loss (fixed batches): before \([0-9.]*\), after \([0-9.]*\)$/\2/p' "$dir/a.out")
awk -v a="$after" -v b="$before" 'BEGIN { exit !(a != "" && a < 0.85 * b) }' ; ok $? "so does the validation loss on fixed batches ($before to $after)"

# kohya's file: every Linear of the double and single blocks, BFL's names
out=$(lua "local f = ck.safetensors('$dir/a.safetensors')
local want = {}
for b = 0, 1 do
  for _, s in ipairs{'img', 'txt'} do
    for _, m in ipairs{'mod_lin', 'attn_qkv', 'attn_proj', 'mlp_0', 'mlp_2'} do want[#want + 1] = 'double_blocks_' .. b .. '_' .. s .. '_' .. m end
  end
  for _, m in ipairs{'linear1', 'linear2', 'modulation_lin'} do want[#want + 1] = 'single_blocks_' .. b .. '_' .. m end
end
local keys = {}
for _, m in ipairs(want) do
  for _, k in ipairs{'.lora_down.weight', '.lora_up.weight', '.alpha'} do keys[#keys + 1] = 'lora_unet_' .. m .. k end
end
table.sort(keys)
local have = f:keys()
table.sort(have)
assert(table.concat(have, ' ') == table.concat(keys, ' '), 'keys: ' .. table.concat(have, ' '))
local function shape(k) return table.concat(f:shape(k), 'x') end
assert(shape('lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight') == '96x4')
assert(shape('lora_unet_single_blocks_1_linear1.lora_up.weight') == '224x4')
assert(shape('lora_unet_double_blocks_1_txt_mod_lin.lora_up.weight') == '192x4')
assert(f:read('lora_unet_single_blocks_0_linear2.alpha')[1] == 4)
io.write(#have .. ' keys')")
ok $? "the file holds kohya's Flux keys, 26 modules (double blocks' img/txt mod, qkv, proj, mlp; single blocks' linear1, linear2, modulation) ($out)"
[ "$(meta "$dir/a.safetensors" ss_network_module)" = networks.lora_flux ] &&
  [ "$(meta "$dir/a.safetensors" ss_base_model_version)" = flux1 ] &&
  [ "$(meta "$dir/a.safetensors" modelspec.architecture)" = flux-1/lora ] &&
  [ "$(meta "$dir/a.safetensors" ss_timestep_sampling)" = shift ] &&
  [ "$(meta "$dir/a.safetensors" ss_discrete_flow_shift)" = 3.1582 ] &&
  [ "$(meta "$dir/a.safetensors" ss_model_prediction_type)" = raw ] &&
  [ "$(meta "$dir/a.safetensors" ss_guidance_scale)" = 1.0 ] &&
  [ "$(meta "$dir/a.safetensors" ss_apply_t5_attn_mask)" = False ] &&
  [ "$(meta "$dir/a.safetensors" ss_steps)" = 200 ] && [ "$(meta "$dir/a.safetensors" ss_network_dim)" = 4 ]
ok $? "its metadata is kohya's: networks.lora_flux, flux1, ModelSpec flux-1/lora, the flow-matching options, ss_steps"
# the same run in PEFT's layout: the same adapter, named as diffusers names it
"$CKRUN" $A $T $K --steps 200 --lora-format peft --out "$dir/p.safetensors" --log-dir "$dir/lp" > /dev/null 2>&1
out=$(lua "local flux, fl = require 'ck.flux', require 'ck.flux_lora'
local r = require('ck.flux_step').training_step{config = 'flux-tiny', batch = 1, latent = 8, tokens = 8, lora = {rank = 4}}
local k, p = ck.safetensors('$dir/a.safetensors'), ck.safetensors('$dir/p.safetensors')
fl.load(r.program, r.adapter, '$dir/a.safetensors')
local n = 0
for _, ad in ipairs(r.adapter.adapters) do
  local down, up = r.program:get(ad.down), r.program:get(ad.up)
  local fd, fu = k:read(ad.kohya .. '.lora_down.weight'), k:read(ad.kohya .. '.lora_up.weight')
  for i = 1, #fd do assert(fd[i] == down[i], ad.kohya .. ' down') end
  for i = 1, #fu do assert(fu[i] == up[i], ad.kohya .. ' up') end
  for _, part in ipairs(ad.parts) do -- PEFT: the shared down, and the part's rows of the up
    local a, b = p:read('transformer.' .. part.path .. '.lora_A.weight'), p:read('transformer.' .. part.path .. '.lora_B.weight')
    for i = 1, #a do assert(a[i] == down[i], part.path .. ' lora_A') end
    for i = 1, #b do assert(b[i] == up[(part.first - 1) * 4 + i], part.path .. ' lora_B') end
    n = n + 1
  end
end
fl.load(r.program, r.adapter, '$dir/p.safetensors')
io.write(n .. ' PEFT modules')")
ok $? "the kohya file loads back through flux_lora.load, and the PEFT file holds the same adapter and loads too ($out)"
[ "$(meta "$dir/p.safetensors" format)" = pt ] && meta "$dir/p.safetensors" lora_adapter_metadata | grep -q '"transformer.r": 4'
ok $? "the PEFT file has diffusers' lora_adapter_metadata"

# recompute is exact: every block checkpointed (kohya's --gradient_checkpointing) trains the same adapter
"$CKRUN" $A $T --steps 6 --out "$dir/c0.safetensors" --log-dir "$dir/lc0" > /dev/null 2>&1
"$CKRUN" $A $T --steps 6 --gradient_checkpointing --out "$dir/c1.safetensors" --log-dir "$dir/lc1" > /dev/null 2>&1
out=$(lua "local a, b = ck.safetensors('$dir/c0.safetensors'), ck.safetensors('$dir/c1.safetensors')
for _, k in ipairs(a:keys()) do local x, y = a:read(k), b:read(k) for i = 1, #x do assert(x[i] == y[i], k) end end
io.write(b:metadata().ss_gradient_checkpointing)")
[ "$out" = True ] ; ok $? "--gradient_checkpointing (every double and single block recomputed) trains the adapter bitwise"

# resume: stopped after its state at step 10 and resumed, the uninterrupted run's adapter
R="$T --steps 20 --samples 8"
"$CKRUN" $A $R --save-every 10 --state-dir "$dir/st" --out "$dir/r1.safetensors" --log-dir "$dir/lr1" > /dev/null 2>&1
"$CKRUN" $A $R --save-every 10 --state-dir "$dir/st" --resume --out "$dir/r2.safetensors" --log-dir "$dir/lr2" > "$dir/r2.out" 2>&1
grep -q "resumed from .*state-000000010.safetensors at step 10" "$dir/r2.out" && cmp -s "$dir/r1.safetensors" "$dir/r2.safetensors"
ok $? "resumed at step 10, the adapter is the uninterrupted run's bitwise"
err=$("$CKRUN" $A $R --timestep-sampling sigmoid --save-every 10 --state-dir "$dir/st" --resume --out "$dir/r3.safetensors" 2>&1)
printf '%s' "$err" | grep -q "saved with timestep_sampling = sigma, this run has sigmoid" && [ ! -e "$dir/r3.safetensors" ]
ok $? "a resume with another objective is refused ($err)"

# a folder of images through the tiny pipeline's encoders into the cache
"$CKRUN" $A scripts/make_shapes_dataset.lua "$dir/shapes" 4 --repeats 2 --size 64 > /dev/null
cached() { find "$dir/shapes" -name '*.safetensors' | sort; }
I="$S --pretrained-model-name-or-path $P --data $dir/shapes --resolution 64"
"$CKRUN" $A $I --steps 4 --out "$dir/i1.safetensors" --log-dir "$dir/li1" > "$dir/i1.out" 2>&1 ; rc=$?
[ $rc = 0 ] && grep -q "^cache: 4 images encoded in" "$dir/i1.out" && [ "$(cached | wc -l)" = 4 ]
ok $? "a folder of images is encoded by the base's VAE, T5 and CLIP-L into the cache, one sample an image"
out=$(lua "local f = ck.safetensors('$(cached | head -1)')
local s = {}
for _, k in ipairs{'latents', 'prompt_embeds', 'pooled_prompt_embeds'} do s[#s + 1] = k .. ' ' .. table.concat(f:shape(k), 'x') end
io.write(table.concat(s, ', '))")
[ "$out" = "latents 16x32x32, prompt_embeds 32x32, pooled_prompt_embeds 16" ]
ok $? "a cached sample holds 16-channel latents (the VAE's scale 2), 32 T5 states of 32, CLIP-L's pooled 16 ($out)"
before=$(cached | xargs md5sum)
"$CKRUN" $A $I --steps 4 --out "$dir/i2.safetensors" --log-dir "$dir/li2" > "$dir/i2.out" 2>&1
grep -q "^cache: all 4 images encoded already" "$dir/i2.out" && [ "$before" = "$(cached | xargs md5sum)" ] &&
  cmp -s "$dir/i1.safetensors" "$dir/i2.safetensors"
ok $? "a second run encodes nothing and trains the same adapter bitwise"
"$CKRUN" $A $I --steps 4 --apply-t5-attn-mask --out "$dir/i3.safetensors" --log-dir "$dir/li3" > "$dir/i3.out" 2>&1 ; rc=$?
out=$(lua "local n = 0
for _, path in ipairs{$(cached | sed 's/.*/"&",/' | tr -d '\n')} do
  local f = ck.safetensors(path)
  if f:has('t5_attn_mask') then
    local m = f:read('t5_attn_mask')
    assert(#m == 32 and m[1] == 1 and m[32] == 0)
    n = n + 1
  end
end
io.write(n)")
[ $rc = 0 ] && grep -q "^cache: 4 images encoded in .*, 0 already there" "$dir/i3.out" && [ "$out" = 4 ]
ok $? "--apply-t5-attn-mask encodes the captions again, with T5's mask cached beside them"

# samples while training: at step 0 the adapter is zero, so the sample is generate.lua's image
printf 'a red circle --w 64 --h 64 --s 3 --d 5 --g 2.5\n# a comment\na blue square --w 32 --h 64 --s 2\n' > "$dir/prompts.txt"
"$CKRUN" $A $I --steps 2 --sample-every 2 --sample-at-first --sample-prompts "$dir/prompts.txt" --out "$dir/s.safetensors" \
  --log-dir "$dir/ls" > "$dir/s.out" 2>&1 ; rc=$?
ls "$dir/samples" > "$dir/s.list" 2>&1
[ $rc = 0 ] && [ "$(tr '\n' ' ' < "$dir/s.list")" = "s_000000_00.png s_000000_01.png s_000002_00.png s_000002_01.png " ]
ok $? "--sample-every renders every prompt before the first step and every 2 steps ($(tr '\n' ' ' < "$dir/s.list"))"
"$CKRUN" $A scripts/generate.lua --pretrained-model-name-or-path $P --prompt "a red circle" --width 64 --height 64 \
  --steps 3 --seed 5 --guidance-scale 2.5 --t5xxl-max-token-length 32 --out "$dir/g.png" > /dev/null 2>&1
cmp -s "$dir/g.png" "$dir/samples/s_000000_00.png" && ! cmp -s "$dir/samples/s_000000_00.png" "$dir/samples/s_000002_00.png"
ok $? "the step-0 sample is generate.lua's PNG byte for byte; the step-2 one differs (the adapter trained)"

# plan mode: flux-tiny with samples, and FLUX.1-dev without allocating it (--max-memory 256MiB)
"$CKRUN" $A --plan --json $I --batch 2 --sample-every 2 --sample-prompts "$dir/prompts.txt" > "$dir/plan.json" 2>&1
out=$(lua "local f = io.open('$dir/plan.json') local j = ck.json_decode(f:read('a')) f:close()
assert(j.script == 'train_flux_lora' and j.size == 'tiny' and j.batch == 2 and j.peak_bytes > 0, 'plan')
assert(j.sample_transformer_64x64 and j.sample_vae_decoder_32x64, 'sampling programs')
io.write(j.sample_transformer_64x64)")
ok $? "--plan --json plans the Flux step and the samples' programs (sample_transformer_64x64 $out)"
"$CKRUN" --max-memory 256MiB --plan --json $S --size dev --resolution 1024 --mixed-precision bf16 --fp8-base \
  --checkpoint diffusers > "$dir/dev.json" 2>&1 ; rc=$?
out=$(lua "local f = io.open('$dir/dev.json') local j = ck.json_decode(f:read('a')) f:close()
assert(j.size == 'dev' and j.param_count == 11901408320 and j.peak_bytes > 11 * 2 ^ 30, 'dev')
io.write(string.format('%.2f GiB', j.peak_bytes / 2 ^ 30))")
[ $rc = 0 ] ; ok $? "FLUX.1-dev (11,901,408,320 parameters) plans in 256 MiB of ckrun's memory: nothing allocated ($out)"
# the block sequence is the double and single blocks: the budget search, sqrt_n
# and every_n plan with them as diffusers' checkpointing does (FLUX.1-dev, 512
# pixels, batch 2, fp8 base)
D="$S --size dev --resolution 512 --batch 2 --mixed-precision bf16 --fp8-base"
plan() { "$CKRUN" --max-memory 256MiB --plan --json $D --checkpoint "$1" > "$dir/p_$2.json" 2>&1 ; }
plan none none && plan diffusers diffusers && plan sqrt_n sqrt && plan every_n:2 every2 &&
  peak=$(lua "local f = io.open('$dir/p_diffusers.json') io.write(math.tointeger(ck.json_decode(f:read('a')).peak_bytes)) f:close()") &&
  plan "budget:$peak" budget ; rc=$?
out=$(lua "local function p(n) local f = io.open('$dir/p_' .. n .. '.json') local j = ck.json_decode(f:read('a')).policies[1] f:close() return j end
local none, d, sq, e2, b = p('none'), p('diffusers'), p('sqrt'), p('every2'), p('budget')
assert(d.name == 'diffusers' and d.recompute_ops > 0, 'diffusers recomputes')
assert(b.peak_bytes <= d.peak_bytes and b.recompute_flops <= d.recompute_flops, 'budget at diffusers peak')
assert(sq.peak_bytes < none.peak_bytes and e2.peak_bytes < none.peak_bytes, 'sqrt_n, every_n')
io.write(string.format('none %.2f, diffusers %.2f, sqrt_n %.2f, every_n:2 %.2f GiB; budget at diffusers peak %.2f GiB recomputing %.1f%% against %.1f%%',
  none.peak_bytes / 2 ^ 30, d.peak_bytes / 2 ^ 30, sq.peak_bytes / 2 ^ 30, e2.peak_bytes / 2 ^ 30, b.peak_bytes / 2 ^ 30, b.recompute_pct, d.recompute_pct))")
[ $rc = 0 ] ; ok $? "FLUX.1-dev's blocks are the policies' block sequence ($out)"

# bad input: one line naming the file or option, a non-zero exit, nothing written
bad() { # WHAT PATTERN ARGS...: the run fails with one line matching PATTERN and writes nothing
  local what=$1 pattern=$2
  shift 2
  local err rc
  err=$("$CKRUN" $A "$@" --out "$dir/bad.safetensors" --log-dir "$dir/lbad" 2>&1) ; rc=$?
  [ $rc != 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && printf '%s' "$err" | grep -q -- "$pattern" &&
    [ ! -e "$dir/bad.safetensors" ] && [ ! -e "$dir/lbad" ]
  ok $? "$what ($err)"
}
bad "an SDXL checkpoint given to the Flux script" "sdxl_tiny.safetensors: an SDXL checkpoint" \
  $T --pretrained-model-name-or-path tests/data/checkpoint/sdxl_tiny.safetensors
bad "a Flux file given to the SDXL script" "bfl.safetensors: a Flux transformer" \
  scripts/train_sdxl_lora.lua --pretrained-model-name-or-path tests/data/flux/bfl.safetensors
lua "local z = {} for i = 1, 32 * 384 do z[i] = 0 end ck.write_safetensors('$dir/fill.safetensors', {{'img_in.weight', {32, 384}, z}})"
bad "an unknown Flux variant, by its img_in width" "fill.safetensors: tensor 'img_in.weight' has shape \[32, 384\]: an input width of 384 is FLUX.1 Fill" \
  $T --pretrained-model-name-or-path "$dir/fill.safetensors"
B="--pretrained-model-name-or-path tests/data/flux/bfl.safetensors --size tiny --ae tests/data/flux/vae --clip-l $P/text_encoder --t5xxl $P/text_encoder_2 --tokenizer $P/tokenizer"
before=$(cached | xargs md5sum)
bad "a single file's parts without T5's tokenizer, for images" "bfl.safetensors: .*give T5's tokenizer (--t5-tokenizer)" \
  $S $B --data "$dir/shapes" --resolution 64 --apply-t5-attn-mask --flip-aug
bad "a T5 tokenizer that is not there" "cannot open '$dir/none/spiece.model'" \
  $S $B --t5-tokenizer "$dir/none/spiece.model" --data "$dir/shapes" --resolution 64 --flip-aug
[ "$before" = "$(cached | xargs md5sum)" ] ; ok $? "the refused runs left the cache as it was"
bad "an SDXL option given to the Flux script" "--conv-rank is SDXL's (scripts/train_sdxl_lora.lua)" $T --conv-rank 4
bad "a Flux option given to the SDXL script" "--t5xxl is Flux's (scripts/train_flux_lora.lua)" scripts/train_sdxl_lora.lua --t5xxl x
printf 'a cat --w 64 --n blurry\n' > "$dir/bad_prompts.txt"
bad "a prompt line with SDXL's negative prompt" "bad_prompts.txt:1: --n: Flux samples have no negative prompt" \
  $I --sample-every 2 --sample-prompts "$dir/bad_prompts.txt"
bad "guidance for a model without a guidance embedder" "--guidance-scale: this model has no guidance embedding" \
  $T --size schnell --guidance-scale 1.0

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
