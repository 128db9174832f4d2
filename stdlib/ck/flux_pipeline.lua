-- Text to image with a Flux.1 model, as diffusers' FluxPipeline: T5's
-- last hidden states and CLIP-L's pooled output of the prompt, the
-- transformer at each step of the flow-matching Euler sampler with the
-- resolution-dependent shift (ck.flow), FLUX.1-dev's guidance through its
-- guidance embedding (no classifier-free guidance), the 16-channel VAE's
-- decoder on z / scale + shift.
--
--   local flux_pipeline = require "ck.flux_pipeline"
--   local pipe <close> = flux_pipeline.new{model = flux_pipeline.open("FLUX.1-dev")}
--   local image, settings = pipe:generate{prompt = "a cat", width = 1024, height = 1024, steps = 28,
--                                         guidance = 3.5, seed = 7}
--   ck.write_png("out.png", image, {text = {parameters = flux_pipeline.parameters(settings)}})
--
-- The text encoders are programs of their own, made for a prompt and closed
-- before the transformer's program is built (pipe:encode_prompt returns the
-- embeddings for a caller to keep: a training script encodes its sample
-- prompts before its own transformer exists). The transformer is one
-- forward-only program per size and text length, compiled on first use and
-- kept by the pipe, all sharing one copy of the weights (compile{share});
-- the VAE decoder one per size, sharing its weights the same way.
local ck = require "ck"
local flux = require "ck.flux"
local flux_keys = require "ck.flux_keys"
local flow = require "ck.flow"
local vae = require "ck.vae"
local clip = require "ck.clip"
local t5 = require "ck.t5"
local t5tok = require "ck.t5tok"
local samplers = require "ck.samplers"
local checkpoint = require "ck.checkpoint"

local M = {}

local errors = require "ck.errors"
local fail, public = errors.fail, errors.public

local function unplaced(e) return (tostring(type(e) == "table" and e.msg or e):gsub("^[^:]*:%d+: ", "")) end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function read_json(path)
  local f, err = io.open(path, "rb")
  if not f then fail("%s", tostring(err)) end
  local text = f:read("a")
  f:close()
  local ok, v = pcall(ck.json_decode, text)
  if not ok or type(v) ~= "table" then fail("%s: not a JSON object", path) end
  return v
end

-- a call of another module whose errors name no file: its message as ours
local function call(f, ...)
  local r = table.pack(pcall(f, ...))
  if not r[1] then fail("%s", unplaced(r[2])) end
  return table.unpack(r, 2, r.n)
end

---- the model's parts

-- the 16-channel VAE: a diffusers vae/ folder (config.json), or one file in
-- diffusers' names or in Black Forest Labs' (ae.safetensors: LDM's names,
-- mapped by ck.checkpoint's rules) whose config is `config` (FLUX.1's)
local function open_vae(path, config)
  if ck.listdir(path) then
    local cfile = path .. "/config.json"
    if not exists(cfile) then fail("%s: no config.json (a diffusers VAE folder has one)", path) end
    local raw = read_json(cfile)
    local ok, c = pcall(vae.config, raw)
    if not ok then fail("%s: %s", cfile, unplaced(c)) end
    return {config = c, part = call(checkpoint.folder_weights, path, "diffusion_pytorch_model"), file = path}
  end
  local ok, c = pcall(vae.config, config or "flux")
  if not ok then fail("%s: the VAE's config: %s", path, unplaced(c)) end
  local f <close> = call(ck.safetensors, path)
  local keys, map = f:keys(), {}
  local names = call(checkpoint.parameter_names, "vae", c)
  if f:has("decoder.conv_in.weight") and f:has("decoder.up.0.block.0.conv1.weight") then
    local levels = 0
    for _, k in ipairs(keys) do
      local lv = k:match("^encoder%.down%.(%d+)%.") or k:match("^decoder%.up%.(%d+)%.")
      if lv then levels = math.max(levels, tonumber(lv) + 1) end
    end
    for _, k in ipairs(keys) do
      local name, reshape = checkpoint.vae_name(k, levels, f:shape(k))
      if not name then fail("%s: tensor '%s' is no VAE key of Black Forest Labs' (LDM's) names", path, k) end
      map[name] = reshape and {key = k, reshape = true} or k
    end
  elseif f:has("decoder.conv_in.weight") then
    for _, k in ipairs(keys) do map[k] = k end
  else
    fail("%s: not a VAE: no tensor 'decoder.conv_in.weight'", path)
  end
  -- every key a parameter of the config with its shape, every parameter a key
  local g = ck.graph()
  local f8 = 1 << (#c.block_out_channels - 1)
  vae.build_encoder(g, c, {height = 2 * f8, width = 2 * f8})
  vae.build_decoder(g, c, {height = 2, width = 2})
  local shapes = {}
  for _, t in ipairs(g:params()) do shapes[t.name] = t.shape end
  local sorted = {}
  for name in pairs(map) do sorted[#sorted + 1] = name end
  table.sort(sorted)
  for _, name in ipairs(sorted) do
    local src = map[name]
    local key = type(src) == "table" and src.key or src
    if not names[name] then fail("%s: tensor '%s' is no parameter of this VAE config", path, key) end
    local fs, want, same = f:shape(key), shapes[name], true
    for i = 1, #want do same = same and fs[i] == want[i] end
    for i = #want + 1, #fs do same = same and fs[i] == 1 end -- a 1x1 conv read as a Linear
    if not same or #fs < #want then
      fail("%s: tensor '%s' has shape [%s]; this VAE config (%s latent channels, widths %s) has [%s]", path, key,
        table.concat(fs, ", "), c.latent_channels, table.concat(c.block_out_channels, ", "), table.concat(want, ", "))
    end
  end
  local absent = {}
  for name in pairs(shapes) do if not map[name] then absent[#absent + 1] = name end end
  table.sort(absent)
  if #absent > 0 then fail("%s: no tensor for the VAE's '%s' (%d missing)", path, absent[1], #absent) end
  return {config = c, part = {file = path, map = map}, file = path}
end

-- CLIP-L's text model: a transformers folder (config.json) or a file in
-- transformers' names (ComfyUI's clip_l.safetensors: CLIP ViT-L/14's config)
local function open_clip(path)
  local c, part
  if ck.listdir(path) then
    local cfile = path .. "/config.json"
    if not exists(cfile) then fail("%s: no config.json (a CLIP text encoder's folder has one)", path) end
    local ok
    ok, c = pcall(clip.config, read_json(cfile))
    if not ok then fail("%s: %s", cfile, unplaced(c)) end
    part = call(checkpoint.folder_weights, path, "model")
  else
    c = clip.config("sdxl-l")
    local f <close> = call(ck.safetensors, path)
    local map = {}
    for _, k in ipairs(f:keys()) do map[k] = k end
    if not f:has("text_model.embeddings.token_embedding.weight") then
      fail("%s: not a CLIP text model in transformers' names: no tensor 'text_model.embeddings.token_embedding.weight'",
        path)
    end
    part = {file = path, map = map}
  end
  return {config = c, part = part, file = path}
end

-- CLIP's tokenizer options for a path: a folder, a tokenizer.json, or a bpe .txt.gz
local function clip_tokenizer_at(path, fix)
  if ck.listdir(path) then return {dir = path, caption_fix = fix} end
  if path:match("%.json$") then return {json = path, caption_fix = fix} end
  return {bpe = path, caption_fix = fix}
end

-- flux_pipeline.open(path [, parts]) -> a model description: the transformer
-- (ck.flux_keys' description: a Black Forest Labs single file, with or
-- without ComfyUI's prefix, bf16 or fp8, or a diffusers folder) and its other
-- parts: a diffusers folder's vae/, text_encoder/ (CLIP-L), text_encoder_2/
-- (T5), tokenizer/, tokenizer_2/ and scheduler/scheduler_config.json, each
-- replaced by the part given in parts: vae (a diffusers VAE folder, or a
-- file in diffusers' names or Black Forest Labs' ae.safetensors names),
-- clip_l (a CLIP-L folder or file in transformers' names), t5xxl (ck.t5.open's
-- path), tokenizer (CLIP's: a folder, tokenizer.json or bpe .txt.gz),
-- vae_config (a single VAE file's ck.vae config; default FLUX.1's),
-- t5_tokenizer (ck.t5tok.load's path), caption_fix ("ftfy" or "none", CLIP's),
-- config (the transformer's, for a single file whose shapes do not say it).
-- A single file's parts must all be given; a single file's scheduler is
-- FLUX.1-dev's for a model with a guidance embedder, schnell's without.
-- Returns {file, kind, transformer, config, variant, vae, clip, t5,
-- tokenizer, t5_tokenizer, scheduler (ck.flow's config), scheduler_file}.
-- What is missing or wrong is one line naming the file.
M.open = public(function(path, parts)
  if type(path) ~= "string" then fail("flux_pipeline.open: path must be a string, got %s", type(path)) end
  parts = parts or {}
  path = path:gsub("(.)/+$", "%1")
  local d = {file = path, kind = ck.listdir(path) and "diffusers" or "single"}
  d.transformer = call(flux_keys.open, path, {config = parts.config})
  d.config, d.variant = d.transformer.config, d.transformer.variant
  local folder = d.kind == "diffusers" and d.transformer.kind == "diffusers" and path or nil
  local function sub(name) return folder and ck.listdir(folder .. "/" .. name) and folder .. "/" .. name or nil end
  local missing = {}
  local vae_path = parts.vae or sub("vae")
  if vae_path then d.vae = open_vae(vae_path, parts.vae_config) else missing[#missing + 1] = "the VAE (--ae)" end
  local clip_path = parts.clip_l or sub("text_encoder")
  if clip_path then d.clip = open_clip(clip_path) else missing[#missing + 1] = "CLIP-L (--clip-l)" end
  local t5_path = parts.t5xxl or sub("text_encoder_2")
  if t5_path then d.t5 = call(t5.open, t5_path) else missing[#missing + 1] = "T5-XXL (--t5xxl)" end
  local tok = parts.tokenizer or sub("tokenizer")
  if tok then
    d.tokenizer = clip_tokenizer_at(tok, parts.caption_fix or "ftfy")
  else
    missing[#missing + 1] = "CLIP's tokenizer (--tokenizer)"
  end
  d.t5_tokenizer = parts.t5_tokenizer or sub("tokenizer_2")
  if not d.t5_tokenizer then missing[#missing + 1] = "T5's tokenizer (--t5-tokenizer)" end
  if #missing > 0 then
    fail("%s: %s; give %s", path, folder and "this Flux folder lacks a part" or
      "a single-file Flux transformer holds no other part", table.concat(missing, ", "))
  end
  local sfile = folder and folder .. "/scheduler/scheduler_config.json"
  if sfile and exists(sfile) then
    local ok, c = pcall(flow.from_config, read_json(sfile), sfile)
    if not ok then fail("%s", unplaced(c)) end
    d.scheduler, d.scheduler_file = c, sfile
  else
    d.scheduler = d.config.guidance_embeds and flow.SCHEDULER.dev or flow.SCHEDULER.schnell
  end
  -- the widths the parts hand each other
  local c = d.config
  local function mismatch(what, a, b)
    fail("%s: %s is %d wide, the transformer takes %d", path, what, a, b)
  end
  if d.clip.config.hidden_size ~= c.pooled_projection_dim then
    mismatch((ck.listdir(d.clip.file) and "CLIP-L's" or "a single file of CLIP-L is read as CLIP ViT-L/14: its") ..
      " pooled output (" .. d.clip.file .. ")", d.clip.config.hidden_size, c.pooled_projection_dim)
  end
  if d.t5.config.d_model ~= c.joint_attention_dim then
    mismatch("T5's hidden state (" .. d.t5.file .. ")", d.t5.config.d_model, c.joint_attention_dim)
  end
  if d.vae.config.latent_channels * 4 ~= c.in_channels then
    mismatch("the VAE's latents packed 2x2 (" .. d.vae.file .. ")", d.vae.config.latent_channels * 4, c.in_channels)
  end
  return d
end)

---- the pipe

local Pipe = {}
Pipe.__index = Pipe

-- the pixels per latent pixel (diffusers' vae_scale_factor: 2 per VAE level
-- after the first)
local function vae_scale(vc) return 1 << (#vc.block_out_channels - 1) end

-- flux_pipeline.new{model = flux_pipeline.open's description, seed = 1
-- (compile's seed), name = what settings.model says, precision = "no" |
-- "bf16" (compile's, the transformer's and the text encoders'), frozen = nil
-- | "fp8" (the transformer's and T5's frozen weights), t5_max_length
-- (T5's tokens: 512 for a model with guidance (dev), 256 without (schnell),
-- as kohya and Black Forest Labs sample), transformer = function(w, h,
-- tokens) -> {program, out, inputs} (flux_pipeline.build_transformer's
-- graph, compiled, its rope set) and vae = function(w, h) -> {program,
-- image} (vae.build_decoder's): programs the caller made (a training
-- script's, sharing its weights), in place of the pipe's own} -> a pipe.
function M.new(o)
  o = o or {}
  local d = rawget(o, "model")
  if type(d) ~= "table" or type(d.transformer) ~= "table" then
    error("flux_pipeline.new: model must be flux_pipeline.open's description", 2)
  end
  local prec = rawget(o, "precision") or "no"
  if prec ~= "no" and prec ~= "bf16" then
    error("flux_pipeline.new: precision must be 'no' or 'bf16', got '" .. tostring(prec) .. "'", 2)
  end
  local frozen = rawget(o, "frozen")
  if frozen ~= nil and frozen ~= "fp8" and frozen ~= "bf16" then
    error("flux_pipeline.new: frozen must be nil, 'bf16' or 'fp8', got '" .. tostring(frozen) .. "'", 2)
  end
  local L = rawget(o, "t5_max_length") or t5tok.max_length[d.config.guidance_embeds and "dev" or "schnell"]
  if math.type(L) ~= "integer" or L < 1 then
    error("flux_pipeline.new: t5_max_length must be a whole number >= 1, got " .. tostring(L), 2)
  end
  local name = rawget(o, "name") or tostring(d.file):match("([^/]+)/*$"):gsub("%.safetensors$", "")
  return setmetatable({model = d, config = d.config, seed = rawget(o, "seed") or 1, name = name, precision = prec,
                       frozen = frozen, t5_max_length = L, transformers = {}, vaes = {},
                       make_transformer = rawget(o, "transformer"), make_vae = rawget(o, "vae")}, Pipe)
end

-- pipe:encode_prompt(prompt [, tokens]) -> prompt_embeds (T5's last hidden
-- state, [tokens, joint_attention_dim]) and pooled (CLIP-L's pooled output,
-- [pooled_projection_dim]) as flat lists: FluxPipeline.encode_prompt, each
-- encoder a program made for the prompt and closed after it
function Pipe:encode_prompt(prompt, tokens)
  local d = self.model
  tokens = tokens or self.t5_max_length
  local ok, tok = pcall(t5tok.load, d.t5_tokenizer)
  if not ok then error(unplaced(tok), 2) end
  local ids = tok:encode(prompt, {max_length = tokens}) -- truncated, </s> last, padded (FluxPipeline's)
  local pe
  do
    local storage = self.precision == "bf16" and "bf16" or nil
    local e <close> = t5.encoder{weights = d.t5, tokens = tokens, storage = storage, frozen = self.frozen == "fp8" and "fp8"
      or nil, seed = self.seed}
    pe = e:encode({ids}):table()
  end
  local ctok = ck.clip_tokenizer(d.tokenizer)
  local c = d.clip.config
  local row = ctok:encode(prompt, {max_length = c.max_position_embeddings})
  local pooled
  do
    local g = ck.graph()
    local enc, r = clip.build(g, c, {batch = 1, tokens = c.max_position_embeddings, projection = false})
    local p <close> = g:compile{outputs = {r.pooled}, optimizer = "none", seed = self.seed}
    checkpoint.load(p, "text_encoder", d.clip.part, g:params())
    enc:feed(p, {row})
    p:forward()
    pooled = p:get(r.pooled)
  end
  return pe, pooled
end

-- flux_pipeline.build_transformer(g, model, lh, lw, tokens) -> out, inputs:
-- the graph a sampling step runs, for latents lh x lw (latent pixels, even)
-- and `tokens` text tokens. inputs: latents [1, C, lh, lw] (packed 2x2 in the
-- graph), timestep [1], encoder_hidden_states, pooled_projections, rope (set
-- it to flux.rope_values), guidance (dev); out: the prediction unpacked to
-- [1, C, lh, lw]. A training script builds its sampling program with it on
-- its own model (its adapters attached) and hands the pipe that program.
function M.build_transformer(g, model, lh, lw, tokens)
  local c = model.config
  local x = flux.inputs(g, c, {batch = 1, height = lh, width = lw, tokens = tokens, latents = false})
  x.latents = g:input("latents", {1, c.in_channels // 4, lh, lw})
  x.timestep = g:input("timestep", {1})
  local y = model:forward(g, flux.pack(x.latents), x.encoder_hidden_states, x.pooled_projections, x.timestep, x.rope,
                          x.guidance)
  return flux.unpack(y, lh, lw), x
end

-- The transformer for latents lh x lw and `tokens` text tokens, compiled and
-- loaded, kept per size
function Pipe:transformer_program(lh, lw, tokens)
  local key = lh .. "x" .. lw .. "x" .. tokens
  if self.transformers[key] then return self.transformers[key] end
  local c = self.config
  local g = ck.graph()
  local model = flux.FluxTransformer2DModel(c)
  model:freeze()
  local out, x = M.build_transformer(g, model, lh, lw, tokens)
  -- every size's transformer in one group: one copy of the weights
  local _, other = next(self.transformers)
  local p = g:compile{outputs = {out}, optimizer = "none", seed = self.seed, share = other and other.program,
                      precision = self.precision, frozen = self.frozen}
  if not other then flux_keys.load(p, self.model.transformer, g:params()) end
  p:set(x.rope, flux.rope_values(c, tokens, lh, lw))
  local r = {program = p, out = out, inputs = x}
  self.transformers[key] = r
  return r
end

function Pipe:vae_program(lh, lw)
  local key = lh .. "x" .. lw
  if self.vaes[key] then return self.vaes[key] end
  local g = ck.graph()
  local _, image = vae.build_decoder(g, self.model.vae.config, {batch = 1, height = lh, width = lw, frozen = true})
  local _, other = next(self.vaes)
  local p = g:compile{outputs = {image}, optimizer = "none", seed = self.seed, share = other and other.program}
  if not other then checkpoint.load(p, "vae", self.model.vae.part, g:params()) end
  local r = {program = p, image = image}
  self.vaes[key] = r
  return r
end

-- the largest side of an image, in pixels
M.MAX_SIZE = 16384
-- the largest guidance FLUX.1-dev's embedding is given
M.MAX_GUIDANCE = 100

local OPTIONS = {prompt = "string", width = "integer", height = "integer", steps = "integer", guidance = "number",
                 seed = "integer", shift = "number", latents = "table", embeddings = "table", model_name = "string",
                 max_sequence_length = "integer"}

local function sorted_keys(t)
  local k = {}
  for n in next, t do k[#k + 1] = n end
  table.sort(k)
  return table.concat(k, ", ")
end

-- a value as an error line shows it: at most 40 characters, one line
local function shown(v)
  v = tostring(v)
  if #v > 40 then v = v:sub(1, 37) .. "..." end
  return (v:gsub("%c", function(ch) return string.format("\\%d", ch:byte()) end))
end

-- pipe:defaults() -> {width, height, steps, guidance}: FluxPipeline's (1024
-- px with FLUX.1's VAE; 28 steps and guidance 3.5 for dev, 4 steps for schnell)
function Pipe:defaults()
  local size = 128 * vae_scale(self.model.vae.config)
  local dev = self.config.guidance_embeds
  return {width = size, height = size, steps = dev and 28 or 4, guidance = dev and 3.5 or nil}
end

-- The settings of a generation, every one checked before any work; raises
-- {msg = "NAME VALUE: what is wrong"}.
function Pipe:settings(o)
  local function bad(k, v, fmt, ...) error({msg = string.format("%s %s: " .. fmt, k, shown(v), ...)}, 0) end
  local st, def = {}, self:defaults()
  local prompt = rawget(o, "prompt") or ""
  local okl, at = utf8.len(prompt)
  if not okl then error({msg = string.format("prompt is not UTF-8 text (byte %d)", at)}, 0) end
  if prompt:find("\0", 1, true) then bad("prompt", prompt, "holds a NUL byte, which no PNG text can") end
  st.prompt = prompt
  local factor = 2 * vae_scale(self.model.vae.config)
  for _, k in ipairs{"width", "height"} do
    local v = rawget(o, k) or def[k]
    if math.type(v) ~= "integer" or v < factor or v % factor ~= 0 then
      bad(k, v, "Flux needs sizes that are multiples of %d pixels (the VAE's %d, packed 2x2)", factor, factor // 2)
    end
    if v > M.MAX_SIZE then bad(k, v, "at most %d pixels", M.MAX_SIZE) end
    st[k] = v
  end
  local steps = rawget(o, "steps") or def.steps
  if math.type(steps) ~= "integer" or steps < 1 or steps > flow.MAX_STEPS then
    bad("steps", steps, "a whole number from 1 to %d", flow.MAX_STEPS)
  end
  st.steps = steps
  local guidance = rawget(o, "guidance")
  if self.config.guidance_embeds then
    guidance = guidance or def.guidance
    if type(guidance) ~= "number" or not (guidance >= 0 and guidance <= M.MAX_GUIDANCE) then
      bad("guidance", guidance, "a guidance from 0 to %d", M.MAX_GUIDANCE)
    end
  elseif guidance ~= nil then
    bad("guidance", guidance, "this model has no guidance embedding (as FLUX.1-schnell): give no guidance")
  end
  st.guidance = guidance
  local seed = rawget(o, "seed") or 0
  if math.type(seed) ~= "integer" or seed < 0 then bad("seed", seed, "a seed must be a whole number >= 0") end
  st.seed = seed
  local shift = rawget(o, "shift")
  if shift ~= nil and not (type(shift) == "number" and shift > 0 and shift < math.huge) then
    bad("shift", shift, "a shift must be a number > 0")
  end
  st.shift = shift
  local L = rawget(o, "max_sequence_length") or self.t5_max_length
  if math.type(L) ~= "integer" or L < 1 then bad("max_sequence_length", L, "a whole number >= 1") end
  st.tokens = L
  return st
end

local function run(self, o, lv)
  if type(o) ~= "table" then error("generate: give a table of options", lv) end
  for k, v in next, o do
    local want = OPTIONS[k]
    if not want then
      error(string.format("generate: unknown option '%s' (options: %s)", tostring(k), sorted_keys(OPTIONS)), lv)
    end
    local ok = want == "integer" and math.type(v) == "integer" or want == "number" and type(v) == "number" or
      type(v) == want
    if not ok then
      error(string.format("generate: option %s must be a%s %s, got %s", k, want == "integer" and "n" or "", want,
        tostring(v)), lv)
    end
  end
  local ok, st = pcall(self.settings, self, o)
  if not ok then error(type(st) == "table" and "generate: " .. st.msg or st, lv) end
  local c, vc = self.config, self.model.vae.config
  local f = vae_scale(vc)
  local lh, lw = st.height // f, st.width // f
  local C = c.in_channels // 4
  local n = C * lh * lw
  local s = flow.sampler{steps = st.steps, image_seq_len = (lh // 2) * (lw // 2), config = self.model.scheduler,
                         shift = st.shift}
  local x
  local given = rawget(o, "latents")
  if given then
    if #given ~= n then
      error(string.format("generate: latents holds %d values, a %dx%d image's latents are %d", #given, st.width,
        st.height, n), lv)
    end
    x = {}
    for k = 1, n do x[k] = flow.f32(given[k]) end
  else
    x = samplers.randn(st.seed, 0, n, samplers.KEY_LATENTS)
  end
  local pe, pooled
  local e = rawget(o, "embeddings")
  if e then -- pipe:encode_prompt's two lists, made once for a prompt used often
    pe, pooled = e[1], e[2]
    if type(pe) ~= "table" or type(pooled) ~= "table" or #pe ~= st.tokens * c.joint_attention_dim or
      #pooled ~= c.pooled_projection_dim then
      error(string.format("generate: embeddings must be {prompt_embeds (%d x %d values), pooled (%d)}", st.tokens,
        c.joint_attention_dim, c.pooled_projection_dim), lv)
    end
  else
    pe, pooled = self:encode_prompt(st.prompt, st.tokens)
  end
  local tr = self.make_transformer and self.make_transformer(st.width, st.height, st.tokens) or
    self:transformer_program(lh, lw, st.tokens)
  local p, inp = tr.program, tr.inputs
  p:set(inp.encoder_hidden_states, pe)
  p:set(inp.pooled_projections, pooled)
  if inp.guidance then p:set(inp.guidance, {flow.f32(st.guidance)}) end
  local per_step = {}
  for i = 1, s.steps do
    p:set(inp.latents, x)
    p:set(inp.timestep, {s.model_timesteps[i]})
    p:forward()
    x = s:step(p:get(tr.out), i, x)
    per_step[i] = x
  end
  local vp = self.make_vae and self.make_vae(st.width, st.height) or self:vae_program(lh, lw)
  vp.program:set("latents", vae.unscale(x, vc))
  vp.program:forward()
  local image = vp.program:array(vp.image):reshape{3, st.height, st.width}
  local settings = {prompt = st.prompt, steps = st.steps, guidance = st.guidance, seed = st.seed, width = st.width,
                    height = st.height, shift = st.shift, mu = s.mu, tokens = st.tokens,
                    model = rawget(o, "model_name") or self.name, sampler = "euler", timesteps = s.timesteps,
                    sigmas = s.sigmas, steps_latents = per_step, prompt_embeds = pe, pooled = pooled}
  return image, settings
end

-- pipe:generate{prompt, width, height (multiples of 16 pixels with FLUX.1's
-- VAE; 1024), steps (28 for dev, 4 for schnell), guidance (FLUX.1-dev's
-- embedded guidance, 3.5; none for schnell), seed = 0, shift (a static shift
-- in place of the resolution-dependent one), max_sequence_length (T5's
-- tokens; the pipe's t5_max_length), latents (N(0, 1) values of the initial
-- latents [16, h, w], unpacked; default: drawn from seed), embeddings
-- ({prompt_embeds, pooled} of pipe:encode_prompt)} -> image (a ck.array [3,
-- H, W], roughly in [-1, 1], not clamped) and the settings (prompt, steps,
-- guidance, seed, width, height, shift, mu, model, timesteps, sigmas,
-- steps_latents (each step's latents, unpacked), prompt_embeds, pooled).
function Pipe:generate(o)
  local image, settings = run(self, o, 3)
  return image, settings
end

-- Closes the pipe's programs (also on leaving a `local pipe <close>`).
function Pipe:close()
  for _, t in ipairs{self.transformers, self.vaes} do
    for k, r in pairs(t) do
      local closing <close> = r.program
      t[k] = nil
    end
  end
end
Pipe.__close = Pipe.close

-- A1111's "parameters" text of a generation's settings, as Forge writes
-- Flux's: PROMPT\nSteps: N, Sampler: Euler, CFG scale: 1, Distilled CFG
-- Scale: G, Seed: X, Size: WxH, Model: M (no Distilled CFG Scale without
-- guidance; "Shift: S" when a static shift replaced the dynamic one)
function M.parameters(s)
  local parts = {string.format("Steps: %d", s.steps), "Sampler: Euler", "CFG scale: 1"}
  if s.guidance then parts[#parts + 1] = string.format("Distilled CFG Scale: %g", s.guidance) end
  if s.shift then parts[#parts + 1] = string.format("Shift: %g", s.shift) end
  parts[#parts + 1] = string.format("Seed: %d", s.seed)
  parts[#parts + 1] = string.format("Size: %dx%d", s.width, s.height)
  parts[#parts + 1] = "Model: " .. s.model
  return s.prompt .. "\n" .. table.concat(parts, ", ")
end

return M
