-- ck.pipeline against diffusers' StableDiffusionXLPipeline on the tiny SDXL
-- folder (tests/ref/make_pipeline_ref.py): prompt embeddings, each step's
-- latents and the image from the same initial latents; the same seed twice
-- gives the same image; LoRA files load at a strength; bad input is one line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local pipeline = require "ck.pipeline"
local checkpoint = require "ck.checkpoint"
local unet = require "ck.unet"
local lora = require "ck.lora"

local FOLDER = "tests/data/checkpoint/sdxl_tiny"
local REF = "tests/data/pipeline/pipeline.safetensors"
local DIR = string.format("out/test_generate.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(DIR))
local THIS = debug.getinfo(1, "S").source:gsub("^@", "")

local ref = ck.safetensors(REF)
local meta = ref:metadata()

-- max |a - b| over max |b|: the relative error of a against b
local function rel(a, b)
  if #a ~= #b then return math.huge end
  local d, m = 0, 0
  for i = 1, #b do
    d = math.max(d, math.abs(a[i] - b[i]))
    m = math.max(m, math.abs(b[i]))
  end
  return d / math.max(m, 1e-30)
end

local function join(a, b)
  local t = {}
  for i = 1, #a do t[i] = a[i] end
  for i = 1, #b do t[#a + i] = b[i] end
  return t
end

local function equal(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function unit(image) -- diffusers' (x / 2 + 0.5).clamp(0, 1)
  local t = image:table()
  for i = 1, #t do t[i] = math.min(1, math.max(0, t[i] / 2 + 0.5)) end
  return t
end

local pipe = pipeline.new{base = checkpoint.open(FOLDER)}
local W, H, STEPS = tonumber(meta.width), tonumber(meta.height), tonumber(meta.steps)
local base_opts = {prompt = meta.prompt, negative_prompt = meta.negative_prompt, width = W, height = H,
                   steps = STEPS, cfg = tonumber(meta.guidance_scale), sampler = "euler", latents = ref:read("init_latents")}
local function opts(extra)
  local t = {}
  for k, v in pairs(base_opts) do t[k] = v end
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end

local image, s = pipe:generate(opts())
T.ok(image.shape[1] == 3 and image.shape[2] == H and image.shape[3] == W, "the image is [3, H, W]")
local e = rel(s.prompt_embeds, join(ref:read("negative_prompt_embeds"), ref:read("prompt_embeds")))
T.ok(e < 1e-4, string.format("prompt embeds (negative, positive) match diffusers' (rel %.2e)", e))
e = rel(s.pooled, join(ref:read("negative_pooled_prompt_embeds"), ref:read("pooled_prompt_embeds")))
T.ok(e < 1e-4, string.format("pooled embeds match diffusers' (rel %.2e)", e))
e = rel(s.timesteps, ref:read("timesteps"))
T.ok(e == 0, "the timesteps are diffusers'")
for i = 1, STEPS do
  e = rel(s.steps_latents[i], ref:read("latents_step" .. i))
  T.ok(e < 1e-4, string.format("latents after step %d match diffusers' (rel %.2e)", i, e))
end
e = rel(image:table(), ref:read("image_raw"))
T.ok(e < 1e-4, string.format("the decoded image matches diffusers' VAE decode (rel %.2e)", e))
e = rel(unit(image), ref:read("image"))
T.ok(e < 1e-4, string.format("in [0, 1] it matches the pipeline's output (rel %.2e)", e))

-- no negative prompt: SDXL's force_zeros_for_empty_prompt gives zero embeddings
local o = opts()
o.negative_prompt = nil
local zimage, zs = pipe:generate(o)
local zeros = true
for i = 1, #zs.prompt_embeds // 2 do zeros = zeros and zs.prompt_embeds[i] == 0 end
T.ok(zeros, "without a negative prompt the unconditional half is zeros")
e = rel(unit(zimage), ref:read("image_zero_neg"))
T.ok(e < 1e-4, string.format("and the image matches diffusers' without one (rel %.2e)", e))
T.ok(not equal(zimage:table(), image:table()), "which differs from the image with the negative prompt")

-- the seed's noise: the same image twice, another seed another image
local seeded = {prompt = "a cat", width = W, height = H, steps = 3, cfg = 4.0, seed = 42, sampler = "euler_a"}
local a = pipe:generate(seeded):table()
local b = pipe:generate(seeded):table()
T.ok(equal(a, b), "the same seed gives the same image bitwise (euler_a's noise too)")
seeded.seed = 43
T.ok(not equal(a, pipe:generate(seeded):table()), "another seed gives another image")

-- pipeline.generate: a pipe made, used once and closed (the tiny random model here)
local once = {prompt = "a red circle", width = 64, height = 32, steps = 2, seed = 3, sampler = "dpmpp_2m"}
local tiny = pipeline.new{seed = 2}
local want1 = tiny:generate(once):table()
tiny:close()
once.weights_seed = 2
local got1, s1 = pipeline.generate(once)
T.ok(equal(got1:table(), want1) and s1.model == "tiny-random-seed2" and s1.sampler == "dpmpp_2m",
  "pipeline.generate is a pipe's generate, the tiny model's weights from weights_seed")

-- a LoRA file as train_sdxl_lora writes it (kohya naming, LoCon convolutions)
local cfg = pipe.models.unet_config
local model = unet.UNet2DConditionModel(cfg)
model:freeze()
local h = lora.attach(model, {rank = 2, alpha = 1, targets = "kohya", conv_rank = 2, conv_alpha = 2})
local g = ck.graph()
unet.build(g, model, {batch = 1, height = H // 8, width = W // 8, tokens = pipe.models.tokens})
local lp = g:compile{outputs = {}, optimizer = "none", seed = 5}
local r = T.rng(9)
for _, ad in ipairs(h.adapters) do
  for _, name in ipairs{ad.down, ad.up} do
    local n = 1
    for _, t in ipairs(g:params()) do
      if t.name == name then for _, d in ipairs(t.shape) do n = n * d end end
    end
    lp:set(name, T.random_values(r, n, -0.5, 0.5))
  end
end
local LORA = DIR .. "/lora.safetensors"
lora.save(lp, h, LORA)
local convs = 0
for _, ad in ipairs(h.adapters) do if ad.kind == "conv" and ad.kernel == 3 then convs = convs + 1 end end
T.ok(convs > 0, "the adapter has LoCon 3x3 convolutions (" .. convs .. ")")

local plain = pipe:generate(opts()):table()
local at0 = pipe:generate(opts{loras = {{LORA, 0.0}}}):table()
T.ok(equal(at0, plain), "the LoRA at strength 0 gives the base image bitwise" .. string.format(" (rel %.2e)", rel(at0, plain)))
local at1 = pipe:generate(opts{loras = {{LORA, 1.0}}}):table()
T.ok(not equal(at1, plain) and rel(at1, plain) > 1e-3, string.format("at strength 1 the image differs (rel %.2e)",
  rel(at1, plain)))
local at2 = pipe:generate(opts{loras = {{LORA, 0.5}, {LORA, 0.5}}}):table()
e = rel(at2, at1)
T.ok(e < 1e-4, string.format("two copies at 0.5 give the image of one at 1 (rel %.2e)", e))

-- the file saved anew (as a training script does between samples): the kept
-- program takes its new weights, as a fresh pipe would
for _, ad in ipairs(h.adapters) do
  local n = 1
  for _, t in ipairs(g:params()) do
    if t.name == ad.up then for _, d in ipairs(t.shape) do n = n * d end end
  end
  lp:set(ad.up, T.random_values(r, n, -0.5, 0.5))
end
lora.save(lp, h, LORA)
local again = pipe:generate(opts{loras = {{LORA, 1.0}}}):table()
local fresh = pipeline.new{base = checkpoint.open(FOLDER)}
local want = fresh:generate(opts{loras = {{LORA, 1.0}}}):table()
fresh:close()
T.ok(not equal(again, at1) and equal(again, want), "a file saved anew is read again: the image a fresh pipe makes")

-- sizes and LoRA sets share one copy of the base weights; each image is the
-- one a fresh pipe makes, whatever ran in between
do
  local small = opts{width = W * 2, height = H * 2, loras = {{LORA, 1.0}}, seed = 4}
  small.latents = nil -- drawn from the seed at this size
  local s1 = pipe:generate(small):table()
  local big = pipe:generate(opts()):table()
  local s2 = pipe:generate(small):table()
  local progs = {}
  for _, u in pairs(pipe.unets) do progs[#progs + 1] = u.program end
  local same_group = #progs >= 2
  for _, q in ipairs(progs) do same_group = same_group and q:plan().group_id == progs[1]:plan().group_id end
  T.ok(same_group, "the pipe's UNets of " .. #progs .. " sizes and LoRA sets are one group: one copy of the base weights")
  local vgroup = true
  local vs = {}
  for _, v in pairs(pipe.vaes) do vs[#vs + 1] = v.program end
  for _, q in ipairs(vs) do vgroup = vgroup and q:plan().group_id == vs[1]:plan().group_id end
  T.ok(#vs >= 2 and vgroup, "its VAE decoders of " .. #vs .. " sizes are one group")
  local fresh2 = pipeline.new{base = checkpoint.open(FOLDER)}
  local want_s = fresh2:generate(small):table()
  local want_b = fresh2:generate(opts()):table()
  fresh2:close()
  T.ok(equal(s1, want_s) and equal(s2, want_s) and equal(big, want_b),
    "each image is a fresh pipe's, before and after the other size ran")
end

-- one line naming the key and the file, and the calling line
local function one_line(err, ...)
  err = tostring(err)
  if err:find("\n") then return false end
  for _, s in ipairs{...} do if not err:find(s, 1, true) then return false end end
  return true
end
local f = ck.safetensors(LORA)
local tensors = {}
for _, key in ipairs(f:keys()) do tensors[#tensors + 1] = {key, f:shape(key), f:read(key)} end
f:close()
local BAD = DIR .. "/bad_key.safetensors"
local bad = {}
for i, t in ipairs(tensors) do bad[i] = t end
bad[#bad + 1] = {"lora_unet_no_such_module.lora_down.weight", {2, 4}, {0, 0, 0, 0, 0, 0, 0, 0}}
ck.write_safetensors(BAD, bad)
local ok, err = pcall(pipe.generate, pipe, opts{loras = {{BAD, 1}}})
T.ok(not ok and one_line(err, BAD, "'lora_unet_no_such_module.lora_down.weight'", "matches no module"),
  "a key matching no module is refused naming it: " .. tostring(err))
ok, err = pcall(function() local im = pipe:generate(opts{loras = {{BAD, 1}}}); return im end)
T.ok(not ok and one_line(err, THIS .. ":"), "the error names the calling script line: " .. tostring(err))

local RANK = DIR .. "/bad_rank.safetensors"
local wrong, which = {}, nil
for i, t in ipairs(tensors) do
  if not which and t[1]:match("%.lora_up%.weight$") and #t[2] == 2 then
    which = t[1]
    local vals = {}
    for k = 1, t[2][1] * 3 do vals[k] = 0.1 end
    wrong[i] = {t[1], {t[2][1], 3}, vals}
  else
    wrong[i] = t
  end
end
ck.write_safetensors(RANK, wrong)
ok, err = pcall(pipe.generate, pipe, opts{loras = {{RANK, 1}}})
T.ok(not ok and one_line(err, RANK, "'" .. which .. "'", "shape"), "a wrong rank is refused naming the key: " ..
  tostring(err))

-- sizes and samplers
ok, err = pcall(function() local t = opts{width = 60}; t.latents = nil; local im = pipe:generate(t); return im end)
T.ok(not ok and one_line(err, "width", "multiple of 8", "60", THIS .. ":"), "width 60 is refused: " .. tostring(err))
-- the check a prompt file's lines pass before a training run (read_prompts) is this one
for _, c in ipairs{{{cfg = 1e308}, "cfg 1e+308: a CFG scale must be a number from 0 to 100"},
                   {{prompt = "a\0b"}, "prompt a\\0b: holds a NUL byte"},
                   {{negative_prompt = "\255"}, "negative_prompt is not UTF-8 text (byte 1)"},
                   {{sampler = "dpmpp_2m", steps = 1000}, "steps 1000: steps must be from 1 to 999"}} do
  ok, err = pcall(function() local t = opts(c[1]); t.latents = nil; local im = pipe:generate(t); return im end)
  T.ok(not ok and one_line(err, "generate: " .. c[2], THIS .. ":"), "refused before any work: " .. tostring(err))
end
ok, err = pcall(function() local im = pipe:generate(opts{sampler = "heun"}); return im end)
T.ok(not ok and one_line(err, "unknown sampler 'heun'", "euler_a", THIS .. ":"), "an unknown sampler is refused: " ..
  tostring(err))

pipe:close()
ref:close()
for _, n in ipairs{"lora.safetensors", "bad_key.safetensors", "bad_rank.safetensors"} do os.remove(DIR .. "/" .. n) end
os.remove(DIR)
T.done()
