-- Sample images while training (train_sdxl_lora's --sample-every and
-- --sample-prompts, kohya's --sample_every_n_steps and --sample_prompts): the
-- prompts of a kohya prompt file rendered with the weights as they are at
-- that step, written as PNGs and logged as TensorBoard images.
--
--   local sampling = require "ck.sampling"
--   local s = sampling.new{prompts = pipeline.read_prompts(path, ...), models = encode.models{...},
--                          config = unet_config, lora = {...} | false, tokens = 77, prediction = "eps",
--                          compile_opts = {storage = "bf16", frozen = "fp8", seed = 1},
--                          dir = "out/samples", stem = "lora", name = "model"}
--   s:encode()                      the prompts through both text encoders (before p is made)
--   s:compile(p, plan_only)         the programs, joined to p's group
--   s:render(step, logger)          every prompt at this step
--
-- The programs are members of the training program's group (compile{share}):
-- the UNet at batch 2 (classifier-free guidance) with the training adapter
-- uses the training program's weights in place, adapter and base alike; the
-- VAE's decoder holds its weights of its own in the group's arena above the
-- shared region, loaded again before each decode (training overwrites them).
-- The arena is as large as the largest member needs, so the run's peak is the
-- larger of training and sampling, and the training program's op lists are
-- the ones it has without sampling. The prompts are encoded once, before the
-- training programs exist, by a text program closed after it.
local ck = require "ck"
local unet = require "ck.unet"
local lora = require "ck.lora"
local vae = require "ck.vae"
local encode = require "ck.encode"
local pipeline = require "ck.pipeline"
local checkpoint = require "ck.checkpoint"

local M = {}

-- What every family's sampler shares (SDXL's below, Flux's in
-- ck.family.flux): per size asked for, a denoiser program (self.denoisers,
-- named self.denoiser in --plan) and the VAE's decoder, made by the
-- family's programs_for; and the prompts' PNGs written and logged.
local Base = {}
Base.__index = Base
M.Base = Base

-- the sizes the prompts ask for, each once: {w, h, key}
function Base:sizes()
  local seen, out = {}, {}
  for _, e in ipairs(self.prompts) do
    local key = e.width .. "x" .. e.height
    if not seen[key] then
      seen[key] = true
      out[#out + 1] = {e.width, e.height, key}
    end
  end
  return out
end

-- The programs at every size, joined to p's group (plan_only: planned, not
-- allocated), kept by the sampler.
function Base:compile(p, plan_only)
  self.denoisers, self.vaes, self.order = self:programs_for(p, plan_only)
end

-- every program made, for ck.memory
function Base:programs()
  local out = {}
  for _, key in ipairs(self.order) do
    out[#out + 1] = self.denoisers[key].program
    out[#out + 1] = self.vaes[key].program
  end
  return out
end

-- the --plan lines: each size's two programs' arenas
function Base:plan_info(fmt)
  local info = {}
  for _, key in ipairs(self.order) do
    info[#info + 1] = {"sample_" .. self.denoiser .. "_" .. key, fmt(self.denoisers[key].program:plan().arena)}
    info[#info + 1] = {"sample_vae_decoder_" .. key, fmt(self.vaes[key].program:plan().arena)}
  end
  return info
end

local function png_bytes(path)
  local f = assert(io.open(path, "rb"))
  local b = f:read("a")
  f:close()
  return b
end

-- Every prompt at this step, each made by generate(i, prompt) (the image,
-- its parameters text): DIR/STEM_SSSSSS_II.png (the step, the prompt's
-- index from 0) with the text; one log record with sample_time (seconds
-- since t0, for them all), each image as sample/II and the files as
-- sample_files. Returns the seconds and the files.
function Base:write(step, logger, t0, generate)
  assert(ck.mkdir(self.dir))
  local images, files = {}, {}
  for i, e in ipairs(self.prompts) do
    local image, parameters = generate(i, e)
    local path = string.format("%s/%s_%06d_%02d.png", self.dir, self.stem, step, i - 1)
    ck.write_png(path, image, {text = {parameters = parameters}})
    images[string.format("%02d", i - 1)] = ck.log_image(png_bytes(path), e.width, e.height)
    files[i] = path
  end
  local secs = ck.now() - t0
  if logger then logger:write{step = step, sample_time = secs, sample = images, sample_files = files} end
  return secs, files
end

local Sampler = setmetatable({}, {__index = Base})
Sampler.__index = Sampler

function M.new(o)
  local s = setmetatable({denoiser = "unet"}, Sampler)
  for k, v in pairs(o) do s[k] = v end
  s.denoisers, s.vaes, s.order = {}, {}, {}
  return s
end

-- Each prompt's embeddings (pipe:encode_prompts' four lists), by one text
-- program closed after it; the bound on the process while it runs (nil
-- without a heap cap), as encode.cache states its own.
function Sampler:encode()
  local pipe = pipeline.new{models = self.models, unet_config = self.config} -- the encoders must fit the UNet
  local tp = encode.text_program(self.models, 1)
  local _, bound = require("ck.memory").outside(tp.program, {tp.program})
  local closing <close> = tp.program
  self.embeddings = {}
  for i, e in ipairs(self.prompts) do self.embeddings[i] = {pipe:encode_prompts(e.prompt, e.negative_prompt, tp)} end
  return bound
end

-- The UNet at batch 2 and the VAE's decoder at every size for p's group,
-- returned (UNets, decoders by "WxH", the keys in order), not kept: a
-- plan-only group's arena grows to them all the same (compile keeps them)
function Sampler:programs_for(p, plan_only)
  local c = self.config
  local unets, vaes, order = {}, {}, {}
  for _, sz in ipairs(self:sizes()) do
    local w, h, key = sz[1], sz[2], sz[3]
    local model = unet.UNet2DConditionModel(c)
    if self.lora then
      model:freeze()
      lora.attach(model, self.lora)
    end
    local g = ck.graph()
    local _, y, x = unet.build(g, model, {batch = 2, height = h // 8, width = w // 8, tokens = self.tokens})
    local co = {outputs = {y}, optimizer = "none", share = p, plan_only = plan_only}
    for k, v in pairs(self.compile_opts or {}) do co[k] = v end
    local up = g:compile(co)
    up.training = false -- no adapter dropout
    unets[key] = {program = up, out = y, inputs = x}
    local gv = ck.graph()
    local _, image = vae.build_decoder(gv, self.models.vae_config, {batch = 1, height = h // 8, width = w // 8,
                                                                   frozen = true, unscale = true})
    local vp = gv:compile{outputs = {image}, optimizer = "none", seed = self.models.seed, share = p,
                          plan_only = plan_only}
    vaes[key] = {program = vp, image = image, params = gv:params()}
    order[#order + 1] = key
  end
  return unets, vaes, order
end

-- the decoder at a size, its own weights as they were loaded (training ran
-- over them in the group's arena since the last decode)
function Sampler:decoder(w, h)
  local r = self.vaes[w .. "x" .. h]
  local base = self.models.base
  if base then
    checkpoint.load(r.program, "vae", base.vae, r.params)
  else
    r.program:init_own() -- the tiny random decoder's seeded weights
  end
  return r
end

-- Every prompt at this step (Base:write), with A1111's parameters text.
function Sampler:render(step, logger)
  local t0 = ck.now()
  if not self.pipe then
    self.pipe = pipeline.new{models = self.models, unet_config = self.config, name = self.name,
      unet = function(w, h) return self.denoisers[w .. "x" .. h] end,
      vae = function(w, h) return self:decoder(w, h) end}
  end
  return self:write(step, logger, t0, function(i, e)
    local image, st = self.pipe:generate{prompt = e.prompt, negative_prompt = e.negative_prompt, width = e.width,
      height = e.height, steps = e.steps, cfg = e.cfg, seed = e.seed, sampler = e.sampler,
      prediction = self.prediction, embeddings = self.embeddings[i]}
    return image, pipeline.parameters(st)
  end)
end

return M
