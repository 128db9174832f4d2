-- ck.flux_pipeline against diffusers' FluxPipeline on a tiny Flux folder
-- (tests/ref/make_flow_ref.py): T5's and CLIP-L's embeddings, the schedule,
-- the latents after the first and last steps and the decoded image from the
-- same initial latents; the seed's noise; embeddings given instead of a
-- prompt; a static shift; the single-file layout with its parts given; bad
-- input is one line naming it.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local flow = require "ck.flow"
local flux_pipeline = require "ck.flux_pipeline"

local FOLDER = "tests/data/flow/pipeline"
local ref <close> = ck.safetensors("tests/data/flow/pipeline.safetensors")
local meta = ref:metadata()

-- max |a - b| over max |b|
local function rel(a, b)
  if #a ~= #b then return math.huge end
  local d, m = 0, 0
  for i = 1, #b do d, m = math.max(d, math.abs(a[i] - b[i])), math.max(m, math.abs(b[i])) end
  return d / math.max(m, 1e-30)
end

local function equal(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local d = flux_pipeline.open(FOLDER)
T.ok(d.kind == "diffusers" and d.variant == "flux-tiny" and d.scheduler.use_dynamic_shifting == true and
  d.scheduler.shift == 3.0 and d.scheduler_file == FOLDER .. "/scheduler/scheduler_config.json" and
  d.vae.config.latent_channels == 16 and d.clip.config.hidden_size == 16 and d.t5.config.d_model == 32,
  "the folder opens: flux-tiny, FLUX.1-dev's scheduler config, the 16-channel VAE, CLIP-L and T5 at flux-tiny's widths")

local pipe <close> = flux_pipeline.new{model = d}
local W, H, STEPS = tonumber(meta.width), tonumber(meta.height), tonumber(meta.steps)
local base = {prompt = meta.prompt, width = W, height = H, steps = STEPS, guidance = tonumber(meta.guidance_scale),
              max_sequence_length = tonumber(meta.max_sequence_length), latents = ref:read("init_latents")}
local function opts(extra)
  local t = {}
  for k, v in pairs(base) do t[k] = v end
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end

local t0 = os.clock()
local image, s = pipe:generate(opts())
local secs = os.clock() - t0
T.ok(image.shape[1] == 3 and image.shape[2] == H and image.shape[3] == W, "the image is [3, H, W]")
local e = rel(s.prompt_embeds, ref:read("prompt_embeds"))
T.ok(e < 1e-5, string.format("T5's prompt embeddings match FluxPipeline.encode_prompt's (rel %.2e)", e))
e = rel(s.pooled, ref:read("pooled_prompt_embeds"))
T.ok(e < 1e-5, string.format("CLIP-L's pooled output matches (rel %.2e)", e))
T.ok(equal(s.timesteps, ref:read("timesteps")) and s.mu == flow.calculate_shift((H // 4) * (W // 4)),
  string.format("the timesteps are the pipeline's, bitwise (mu %.4f at %d image tokens)", s.mu, (H // 4) * (W // 4)))
for _, i in ipairs{1, STEPS} do
  e = rel(s.steps_latents[i], ref:read("latents_step" .. i))
  T.ok(e < 1e-5, string.format("the latents after step %d match FluxPipeline's (rel %.2e)", i, e))
end
e = rel(image:table(), ref:read("image_raw"))
T.ok(e < 1e-5, string.format("the decoded image matches the VAE's decode of z / 0.3611 + 0.1159 (rel %.2e)", e))
local unit = image:table()
for i = 1, #unit do unit[i] = math.min(1, math.max(0, unit[i] / 2 + 0.5)) end
e = rel(unit, ref:read("image"))
T.ok(e < 1e-5, string.format("in [0, 1] it is the pipeline's output (rel %.2e)", e))
T.ok(secs < 2, string.format("encoded, compiled, sampled and decoded in %.2f s", secs))

do -- the seed's noise; the embeddings of pipe:encode_prompt in place of the prompt
  local seeded = opts{latents = false, seed = 42}
  seeded.latents = nil
  local a = pipe:generate(seeded):table()
  local b = pipe:generate(seeded):table()
  T.ok(equal(a, b), "the same seed gives the same image bitwise")
  seeded.seed = 43
  T.ok(not equal(a, pipe:generate(seeded):table()), "another seed gives another image")
  local pe, pooled = pipe:encode_prompt(meta.prompt, base.max_sequence_length)
  local again = pipe:generate(opts{embeddings = {pe, pooled}, prompt = "ignored"})
  T.ok(equal(again:table(), image:table()), "the embeddings of encode_prompt give the prompt's image bitwise")
  local bad_ok, err = pcall(pipe.generate, pipe, opts{embeddings = {pe, {1, 2}}})
  T.ok(not bad_ok and tostring(err):find("embeddings must be {prompt_embeds %(32 x 32 values%), pooled %(16%)}"),
    "embeddings of the wrong widths are refused: " .. tostring(err))
end

do -- a static shift in place of the resolution-dependent one
  local _, st = pipe:generate(opts{shift = 3.0})
  local want = flow.schedule{steps = STEPS, shift = 3.0, config = d.scheduler}
  T.ok(equal(st.sigmas, want.sigmas) and st.mu == nil and not equal(st.sigmas, s.sigmas),
    "--shift 3: the sigmas are shifted 3 s / (1 + 2 s), not by mu")
  local text = flux_pipeline.parameters(st)
  T.ok(text == meta.prompt .. "\nSteps: 4, Sampler: Euler, CFG scale: 1, Distilled CFG Scale: 3.5, Shift: 3, Seed: 0, " ..
    "Size: 32x24, Model: pipeline", "the parameters text: " .. text:gsub("\n", " | "))
end

do -- Black Forest Labs' single file, its parts given one by one: the folder's image
  local single = flux_pipeline.open("tests/data/flux/bfl.safetensors", {config = "flux-tiny", vae = FOLDER .. "/vae",
    clip_l = FOLDER .. "/text_encoder", t5xxl = FOLDER .. "/text_encoder_2",
    tokenizer = FOLDER .. "/tokenizer", t5_tokenizer = FOLDER .. "/tokenizer_2"})
  T.ok(single.kind == "single" and single.scheduler.use_dynamic_shifting and single.scheduler_file == nil,
    "a single file with a guidance embedder samples with FLUX.1-dev's scheduler")
  local sp <close> = flux_pipeline.new{model = single}
  local img = sp:generate(opts())
  T.ok(equal(img:table(), image:table()), "its image is the diffusers folder's, bitwise (the same weights)")
end

do -- Black Forest Labs' ae.safetensors names (LDM's, 1x1 convs for the attention) for the VAE: the same image
  local ldm = flux_pipeline.open(FOLDER, {vae = "tests/data/flow/ae_ldm.safetensors", vae_config = "flux-tiny"})
  local lp <close> = flux_pipeline.new{model = ldm}
  T.ok(equal(lp:generate(opts()):table(), image:table()), "a VAE file in ae.safetensors' names decodes the folder's image, bitwise")
end

do -- the caller's own programs (a training script's): build_transformer's graph and the VAE's decoder
  local flux, fk, vae = require "ck.flux", require "ck.flux_keys", require "ck.vae"
  local checkpoint = require "ck.checkpoint"
  local made = {}
  local own <close> = flux_pipeline.new{model = d, transformer = function(w, h, tokens)
    local g = ck.graph()
    local model = flux.FluxTransformer2DModel(d.config)
    model:freeze()
    local out, x = flux_pipeline.build_transformer(g, model, h // 2, w // 2, tokens)
    local p = g:compile{outputs = {out}, optimizer = "none"}
    fk.load(p, d.transformer, g:params())
    p:set(x.rope, flux.rope_values(d.config, tokens, h // 2, w // 2))
    made[#made + 1] = p
    return {program = p, out = out, inputs = x}
  end, vae = function(w, h)
    local g = ck.graph()
    local _, img = vae.build_decoder(g, d.vae.config, {height = h // 2, width = w // 2})
    local p = g:compile{outputs = {img}, optimizer = "none"}
    checkpoint.load(p, "vae", d.vae.part, g:params())
    made[#made + 1] = p
    return {program = p, image = img}
  end}
  local img = own:generate(opts())
  T.ok(#made == 2 and equal(img:table(), image:table()) and next(own.transformers) == nil,
    "a pipe given the caller's transformer and VAE programs runs them, to the same image bitwise")
  for _, p in ipairs(made) do local closing <close> = p end
end

do -- bad input: one line naming the file or the option, this script's line
  local nog = flux_pipeline.open(FOLDER)
  nog.config = {}
  for k, v in pairs(d.config) do nog.config[k] = v end
  nog.config.guidance_embeds = false
  local schnell <close> = flux_pipeline.new{model = nog}
  local bad = {
    {function() local r = flux_pipeline.open("tests/data/flux/bfl.safetensors", {config = "flux-tiny"}); return r end,
     "tests/data/flux/bfl.safetensors: a single%-file Flux transformer holds no other part; give the VAE %(%-%-ae%), " ..
     "CLIP%-L %(%-%-clip%-l%), T5%-XXL %(%-%-t5xxl%), CLIP's tokenizer %(%-%-tokenizer%), T5's tokenizer %(%-%-t5%-tokenizer%)"},
    {function() local r = flux_pipeline.open(FOLDER, {clip_l = "tests/data/clip/text_encoder"}); return r end,
     "CLIP%-L's pooled output %(tests/data/clip/text_encoder%) is 32 wide, the transformer takes 16"},
    {function() local r = flux_pipeline.open(FOLDER, {clip_l = FOLDER .. "/text_encoder/model.safetensors"}); return r end,
     "a single file of CLIP%-L is read as CLIP ViT%-L/14: its pooled output %(.*model.safetensors%) is 768 wide"},
    {function() local r = flux_pipeline.open(FOLDER, {vae = "tests/data/flux/bfl.safetensors"}); return r end,
     "bfl.safetensors: not a VAE: no tensor 'decoder.conv_in.weight'"},
    {function() local r = flux_pipeline.open(FOLDER, {vae = "tests/data/flow/ae_ldm.safetensors"}); return r end,
     "ae_ldm.safetensors: tensor 'decoder.conv_in.bias' has shape %[16%]; this VAE config %(16 latent " ..
     "channels, widths 128, 256, 512, 512%) has %[512%]"},
    {function() local r = flux_pipeline.open("tests/data/checkpoint/sdxl_tiny"); return r end, "a diffusers SDXL folder"},
    {function() local r = pipe:generate(opts{width = 30}); return r end,
     "generate: width 30: Flux needs sizes that are multiples of 4 pixels"},
    {function() local r = pipe:generate(opts{steps = 0}); return r end, "generate: steps 0: a whole number from 1"},
    {function() local r = pipe:generate(opts{cfg = 3}); return r end, "generate: unknown option 'cfg'"},
    {function() local r = pipe:generate(opts{latents = {1, 2, 3}}); return r end,
     "generate: latents holds 3 values, a 32x24 image's latents are 3072"},
    {function() local r = schnell:generate(opts()); return r end,
     "guidance 3.5: this model has no guidance embedding %(as FLUX.1%-schnell%)"},
  }
  for i, c in ipairs(bad) do
    local ok, err = pcall(c[1])
    err = tostring(err)
    T.ok(not ok and err:find(c[2]) and err:find("test_flux_pipeline.lua:%d+:") and not err:find("\n"),
      "bad input " .. i .. " refused in one line: " .. err)
  end
end

T.done()
