-- Text to image with an SDXL model, as diffusers' StableDiffusionXLPipeline:
-- both text encoders, classifier-free guidance with the UNet at batch 2
-- (negative half first), the sampler's loop (ck.samplers), the VAE decoder.
-- LoRA files in kohya's naming (what train_sdxl_lora writes, and kohya's and
-- LoCon files from elsewhere) are added to the UNet at a strength each.
--
--   local pipeline = require "ck.pipeline"
--   local pipe = pipeline.new{base = checkpoint.open(path) or nil, seed = 1}
--   local image, settings = pipe:generate{prompt = "a cat", width = 1024, height = 1024, steps = 30,
--                                         cfg = 5, seed = 7, sampler = "euler", loras = {{"a.safetensors", 0.8}}}
--   ck.write_png("out.png", image, {text = {parameters = pipeline.parameters(settings)}})
--
-- The UNet is one forward-only program per size and set of LoRAs, compiled
-- on first use and kept by the pipe, all sharing one copy of the base
-- weights (compile{share}); the VAE decoder one per size, sharing its
-- weights the same way; the text encoders one program, closed after each
-- prompt is encoded.
local ck = require "ck"
local nn = require "ck.nn"
local unet = require "ck.unet"
local lora = require "ck.lora"
local vae = require "ck.vae"
local encode = require "ck.encode"
local samplers = require "ck.samplers"
local sdxl = require "ck.sdxl"
local checkpoint = require "ck.checkpoint"

local M = {}

local Pipe = {}
Pipe.__index = Pipe

-- options generate reads (raw), and what each must be
local OPTIONS = {prompt = "string", negative_prompt = "string", width = "integer", height = "integer",
                 steps = "integer", cfg = "number", seed = "integer", sampler = "string", loras = "table",
                 latents = "table", prediction = "string", model_name = "string", embeddings = "table"}

local function sorted_keys(t)
  local k = {}
  for n in next, t do k[#k + 1] = n end
  table.sort(k)
  return table.concat(k, ", ")
end

-- whether the folder's model_index.json asks for zero embeddings in place of
-- an absent negative prompt (SDXL base's does; so does the default)
local function force_zeros(base)
  if not base or base.kind ~= "diffusers" then return true end
  local f = io.open(base.file .. "/model_index.json", "rb")
  if not f then return true end
  local text = f:read("a")
  f:close()
  local ok, j = pcall(ck.json_decode, text)
  if ok and type(j) == "table" and rawget(j, "force_zeros_for_empty_prompt") == false then return false end
  return true
end

-- pipeline.new{base = checkpoint.open's description | nil (the tiny random
-- model, weights drawn from seed), seed = 1 (the tiny model's weights),
-- tokenizer = FILE|DIR (encode.models'), name = what settings.model says,
-- models = encode.models' table to use (base, seed and tokenizer then unused),
-- unet_config = the UNet's config (default: the base's, or sdxl-tiny),
-- scheduler = samplers.from_config's (the base folder's scheduler config: its
-- schedule, prediction and default sampler; nil: SDXL's, as kohya samples),
-- unet = function(w, h) -> {program, out, inputs} (unet.build's, at batch 2)
-- and vae = function(w, h) -> {program, image}: the programs to run, made by
-- the caller (a training script's, sharing its weights; LoRA files are then
-- refused), in place of the pipe's own}
-- -> a pipe: models (encode.models' plus unet_config), generate.
function M.new(o)
  o = o or {}
  local base = rawget(o, "base")
  local models = rawget(o, "models") or
    encode.models{base = base, seed = rawget(o, "seed") or 1, tokenizer = rawget(o, "tokenizer")}
  base = models.base
  if rawget(o, "unet_config") then
    models.unet_config = rawget(o, "unet_config")
  elseif base then
    models.unet_config = base.unet_config and checkpoint.unet_config(base.unet_config, base.file .. "/unet/config.json")
      or unet.config("sdxl")
  else
    models.unet_config = unet.config("sdxl-tiny")
  end
  local c = models.unet_config
  local width = models.text_l.hidden_size + models.text_g.hidden_size
  if width ~= c.cross_attention_dim or models.text_g.projection_dim ~= sdxl.pooled_dim(c) then
    error(string.format("%s: the text encoders give %d channels and a pooled embedding of %d; the UNet takes %d and %d",
      base and tostring(base.file) or "the tiny model", width, models.text_g.projection_dim, c.cross_attention_dim,
      sdxl.pooled_dim(c)), 2)
  end
  models.force_zeros = force_zeros(base)
  local name = rawget(o, "name") or (base and tostring(base.file):match("([^/]+)/*$")) or
    ("tiny-random-seed" .. models.seed)
  return setmetatable({models = models, name = name, unets = {}, vaes = {}, make_unet = rawget(o, "unet"),
                       make_vae = rawget(o, "vae"), scheduler = rawget(o, "scheduler")}, Pipe)
end

-- pipeline.scheduler(base) -> samplers.from_config of a diffusers folder's
-- scheduler/scheduler_config.json, or nil (a single file, or a folder without one)
function M.scheduler(base)
  if not base or base.kind ~= "diffusers" then return nil end
  local file = base.file .. "/scheduler/scheduler_config.json"
  local f = io.open(file, "rb")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  local ok, j = pcall(ck.json_decode, text)
  if not ok or type(j) ~= "table" then
    error(string.format("%s: not a JSON object: %s", file, tostring(j):gsub("^[^:]*:%d+: ", "")), 2)
  end
  local sc
  ok, sc = pcall(samplers.from_config, j, file)
  if not ok then error(tostring(sc):gsub("^[^:]*:%d+: ", ""), 2) end
  return sc
end

---- LoRA files

-- the UNet's Linear and Conv2d modules by kohya name: {path, module}
local function kohya_modules(model)
  local by = {}
  for _, e in ipairs(model:named_modules("")) do
    local mt = getmetatable(e[2])
    if e[1] ~= "" and (mt == nn.Linear or mt == nn.Conv2d) then
      local ok, name = pcall(lora.kohya_name, e[1], model.config)
      if ok then by[name] = {path = e[1], module = e[2]} end
      -- the diffusers path with underscores, as some tools name SDXL's modules
      local alias = "lora_unet_" .. e[1]:gsub("%.", "_")
      by[alias] = by[alias] or {path = e[1], module = e[2]}
    end
  end
  return by
end

local errors = require "ck.errors"
local shape_str, same = errors.shape_str, errors.same_shape

-- The adapters of one kohya-named LoRA file for the model's modules: a list
-- of {path, module, key (kohya name), rank, alpha, conv, down, up (file
-- keys)}. Every key must belong to a module (NAME.lora_down.weight,
-- NAME.lora_up.weight, NAME.alpha) and every shape fit it; else one line
-- naming the key and the file.
local function read_lora(path, by, level)
  local f <close> = ck.safetensors(path)
  local groups, order = {}, {}
  for _, key in ipairs(f:keys()) do
    local name, part = key:match("^(.-)%.(lora_down)%.weight$")
    if not name then name, part = key:match("^(.-)%.(lora_up)%.weight$") end
    if not name then name, part = key:match("^(.-)%.(alpha)$") end
    if not name then
      error(string.format("%s: LoRA key '%s' is not kohya's NAME.lora_down.weight, NAME.lora_up.weight or NAME.alpha",
        path, key), level)
    end
    if not by[name] then
      local what = name:match("^lora_te[12]?_") and " (a text encoder's adapter: generate adapts the UNet only)" or ""
      error(string.format("%s: LoRA key '%s' matches no module of the UNet%s", path, key, what), level)
    end
    if not groups[name] then groups[name] = {}; order[#order + 1] = name end
    groups[name][part] = key
  end
  table.sort(order)
  local out = {}
  for _, name in ipairs(order) do
    local gp, m = groups[name], by[name].module
    if not gp.lora_down or not gp.lora_up then
      error(string.format("%s: LoRA module '%s' has no '%s'", path, name,
        name .. (gp.lora_down and ".lora_up.weight" or ".lora_down.weight")), level)
    end
    local ds, us = f:shape(gp.lora_down), f:shape(gp.lora_up)
    local r = ds[1]
    local conv = getmetatable(m) == nn.Conv2d
    local want_d, want_u
    if conv then
      want_d, want_u = {r, m.in_channels, m.kernel, m.kernel}, {m.out_channels, r, 1, 1}
    else
      want_d, want_u = {r, m.in_features}, {m.out_features, r}
    end
    if not same(ds, want_d) then
      error(string.format("%s: LoRA key '%s' has shape %s, the module %s takes %s", path, gp.lora_down,
        shape_str(ds), by[name].path, shape_str(want_d)), level)
    end
    if not same(us, want_u) then
      error(string.format("%s: LoRA key '%s' has shape %s, the module %s takes %s (rank %d from lora_down)", path,
        gp.lora_up, shape_str(us), by[name].path, shape_str(want_u), r), level)
    end
    local alpha = r
    if gp.alpha then
      local a = f:read(gp.alpha)
      if #a ~= 1 then
        error(string.format("%s: LoRA key '%s' holds %d values, an alpha is one", path, gp.alpha, #a), level)
      end
      alpha = a[1]
    end
    out[#out + 1] = {path = by[name].path, module = m, key = name, rank = r, alpha = alpha, conv = conv,
                     down = gp.lora_down, up = gp.lora_up}
  end
  return out
end

-- The module's forward with its base output plus each of its branches:
-- scale * up(down(x)), scale = strength * alpha / rank (kohya's multiplier)
local function branched(base_forward)
  return function(self, g, x)
    local y = base_forward(self, g, x)
    for _, b in ipairs(self.lora_branches) do
      local d, u
      if b.conv then
        local o = {stride = self.stride, padding = self.padding}
        d = ck.conv2d(x, g:param(b.prefix .. "lora_down.weight", {b.rank, self.in_channels, self.kernel, self.kernel},
          {trainable = false}), nil, o)
        u = ck.conv2d(d, g:param(b.prefix .. "lora_up.weight", {self.out_channels, b.rank, 1, 1}, {trainable = false}))
      else
        d = ck.linear(x, g:param(b.prefix .. "lora_down.weight", {b.rank, self.in_features}, {trainable = false}))
        u = ck.linear(d, g:param(b.prefix .. "lora_up.weight", {self.out_features, b.rank}, {trainable = false}))
      end
      y = y + u * b.scale
    end
    return y
  end
end

---- the programs

-- the pixels a size must be a multiple of for the UNet of config c: 8 (the
-- VAE) times 2 for each time the UNet halves its latents
local function size_factor(c) return 8 * (1 << (#c.block_out_channels - 1)) end

-- the largest guidance scale a sample takes (ComfyUI's bound): past it the
-- guided output overflows long before the image means anything
M.MAX_CFG = 100
-- the largest side of a sample, in pixels
M.MAX_SIZE = 16384

-- a value as an error line shows it: at most 40 characters of it
local function shown(v)
  v = tostring(v)
  if #v > 40 then v = v:sub(1, 37) .. "..." end
  return (v:gsub("%c", function(c) return string.format("\\%d", c:byte()) end)) -- one line, no NUL
end

-- The settings a sample runs with, every one checked here and nowhere else:
-- by generate before any work, and for each line of a prompt file before a
-- training run's first step (so that what passes here cannot fail when the
-- sample is made). o: generate's options (read raw); factor: size_factor of
-- the UNet; scheduler: ck.samplers' options of the model's scheduler
-- (samplers.from_config), or nil; named(key) -> how a message calls an option
-- ("width", or a prompt file's "--w"). Returns {prompt, negative_prompt,
-- width, height, steps, cfg, seed, sampler (the name), prediction, schedule
-- (the ck.samplers sampler)}; raises {msg = "NAME VALUE: what is wrong"}.
local function sample_settings(o, factor, scheduler, named, default_size)
  named = named or function(k) return k end
  local function bad(k, v, fmt, ...)
    error({msg = string.format("%s %s: " .. fmt, named(k), shown(v), ...)}, 0)
  end
  local st = {}
  for _, k in ipairs{"prompt", "negative_prompt"} do
    local v = rawget(o, k)
    if v ~= nil then
      local ok, at = utf8.len(v)
      if not ok then error({msg = string.format("%s is not UTF-8 text (byte %d)", named(k), at)}, 0) end
      -- the PNG's parameters text holds the prompts, and a text chunk ends at a NUL
      if v:find("\0", 1, true) then bad(k, v, "holds a NUL byte, which no PNG text can") end
    end
    st[k] = v
  end
  st.prompt = st.prompt or ""
  for _, k in ipairs{"width", "height"} do
    local v = rawget(o, k) or default_size
    if math.type(v) ~= "integer" or v < 8 or v % 8 ~= 0 then bad(k, v, "a size must be a positive multiple of 8 pixels") end
    if v % factor ~= 0 then bad(k, v, "this UNet needs sizes that are multiples of %d pixels", factor) end
    if v > M.MAX_SIZE then bad(k, v, "at most %d pixels", M.MAX_SIZE) end
    st[k] = v
  end
  local cfg = rawget(o, "cfg") or 5.0
  if type(cfg) ~= "number" or not (cfg >= 0 and cfg <= M.MAX_CFG) then
    bad("cfg", cfg, "a CFG scale must be a number from 0 to %d", M.MAX_CFG)
  end
  st.cfg = cfg
  local seed = rawget(o, "seed") or 0
  if math.type(seed) ~= "integer" or seed < 0 then bad("seed", seed, "a seed must be a whole number >= 0") end
  st.seed = seed
  local name = rawget(o, "sampler")
  if name == nil and scheduler and scheduler.class and not scheduler.sampler then
    error({msg = string.format("%s: _class_name %s is a scheduler ckrun lacks: name a sampler (%s)", scheduler.file,
      tostring(scheduler.class), table.concat(samplers.NAMES, ", "))}, 0)
  end
  name = name or (scheduler and scheduler.sampler) or "euler"
  if not M.sampler_name(name) or M.sampler_name(name) ~= name then
    error({msg = string.format("unknown sampler '%s' (samplers: %s)", shown(name), table.concat(samplers.NAMES, ", "))}, 0)
  end
  if scheduler then scheduler.check(name) end -- the fields this sampler reads, each one ckrun has
  st.sampler = name
  local steps = rawget(o, "steps") or 30
  local so = {steps = steps, prediction = rawget(o, "prediction") or (scheduler and scheduler.prediction)}
  for k, v in pairs(scheduler and scheduler.options_for(name) or {}) do so[k] = v end
  local ok, sch = pcall(samplers.new, name, so)
  if not ok then bad("steps", steps, "%s", (tostring(sch):gsub("^[^:]*:%d+: ", ""):gsub("^samplers%.new: ", ""))) end
  st.steps, st.prediction, st.schedule = steps, sch.prediction, sch
  return st
end

-- the LoRA weights of files (read_lora's lists, one per lora) into p
local function load_loras(p, loras, files)
  for k, ads in ipairs(files) do
    local f <close> = ck.safetensors(loras[k][1])
    local map = {}
    for _, ad in ipairs(ads) do map[ad.down_param], map[ad.up_param] = ad.down, ad.up end
    p:load(f, map)
  end
end

-- The UNet at batch 2 with the LoRAs, compiled and loaded, kept per size and
-- LoRA set. The files are read again at each call: the same modules, ranks,
-- alphas and strengths reuse the program with the files' current weights (a
-- training script's adapter saved anew); anything else compiles a new one in
-- the old one's place.
function Pipe:unet_program(w, h, loras, level)
  local key = {w, "x", h}
  for _, l in ipairs(loras) do key[#key + 1] = " " .. l[1] end
  key = table.concat(key)
  local models, c = self.models, self.models.unet_config
  local model = unet.UNet2DConditionModel(c)
  model:freeze()
  local by = kohya_modules(model)
  local files, sig = {}, {}
  for k, l in ipairs(loras) do
    local ads = read_lora(l[1], by, level + 1)
    local prefix = "lora" .. k .. "."
    for _, ad in ipairs(ads) do
      ad.prefix, ad.scale = prefix, l[2] * ad.alpha / ad.rank
      ad.down_param, ad.up_param = ad.path .. "." .. prefix .. "lora_down.weight", ad.path .. "." .. prefix .. "lora_up.weight"
      sig[#sig + 1] = string.format("%d %s %d %.17g", k, ad.key, ad.rank, ad.scale)
    end
    files[k] = ads
  end
  sig = table.concat(sig, "\n")
  local had = self.unets[key]
  if had and had.sig == sig then
    load_loras(had.program, loras, files)
    return had
  elseif had then
    self.unets[key] = nil
    local closing <close> = had.program
  end
  for _, ads in ipairs(files) do
    for _, ad in ipairs(ads) do
      local m = ad.module
      if not m.lora_branches then
        m.lora_branches = {}
        m.updateOutput = branched(getmetatable(m).updateOutput)
      end
      m.lora_branches[#m.lora_branches + 1] = {conv = ad.conv, rank = ad.rank, prefix = ad.prefix, scale = ad.scale}
    end
  end
  local g = ck.graph()
  local _, y, x = unet.build(g, model, {batch = 2, height = h // 8, width = w // 8, tokens = models.tokens,
                                        frozen = true})
  -- every size's UNet in one group: one copy of the base weights (an adapter's
  -- that the group's programs lack lie above them, loaded again at each call)
  local _, other = next(self.unets)
  local p = g:compile{outputs = {y}, optimizer = "none", seed = models.seed, share = other and other.program}
  if models.base and not other then
    local params = {}
    for _, t in ipairs(g:params()) do
      if not t.name:match("%.lora%d+%.lora_[a-z]+%.weight$") then params[#params + 1] = t end
    end
    checkpoint.load(p, "unet", models.base.unet, params)
  end
  load_loras(p, loras, files)
  local r = {program = p, out = y, inputs = x, sig = sig}
  self.unets[key] = r
  return r
end

function Pipe:vae_program(w, h)
  local key = w .. "x" .. h
  if self.vaes[key] then return self.vaes[key] end
  local models = self.models
  local g = ck.graph()
  local _, image = vae.build_decoder(g, models.vae_config, {batch = 1, height = h // 8, width = w // 8, frozen = true,
                                                              unscale = true})
  local _, other = next(self.vaes) -- every size's decoder sharing one copy of its weights
  local p = g:compile{outputs = {image}, optimizer = "none", seed = models.seed, share = other and other.program}
  if models.base and not other then checkpoint.load(p, "vae", models.base.vae, g:params()) end
  local r = {program = p, image = image}
  self.vaes[key] = r
  return r
end

-- prompt_embeds and pooled of the negative (zeros when absent and the model
-- forces zeros) and positive prompts, each half as flat lists; tp: a text
-- program (encode.text_program at batch 1) to run, else one made and closed
function Pipe:encode_prompts(prompt, negative, tp)
  local models = self.models
  local own = not tp and encode.text_program(models, 1) or nil
  tp = tp or own
  local closing <close> = own and own.program or nil
  local pe, pooled = encode.encode_text(tp, models, {prompt})
  local npe, npooled
  if negative == nil and models.force_zeros then
    npe, npooled = {}, {}
    for i = 1, #pe do npe[i] = 0.0 end
    for i = 1, #pooled do npooled[i] = 0.0 end
  else
    npe, npooled = encode.encode_text(tp, models, {negative or ""})
  end
  return pe, pooled, npe, npooled
end

local function join(a, b)
  local t = {}
  for i = 1, #a do t[i] = a[i] end
  for i = 1, #b do t[#a + i] = b[i] end
  return t
end

-- pipe:generate{prompt, negative_prompt (nil: zeros where the model forces
-- them, as diffusers), width, height (multiples of 8; and of the UNet's
-- downsampling times 8), steps = 30, cfg = 5 (diffusers' guidance_scale; at
-- 1 or less the positive half alone), seed = 0, sampler = "euler",
-- loras = {{path, strength}, ...}, latents (N(0, 1) values of the initial
-- latents [4, h/8, w/8], diffusers' latents=; default: drawn from seed),
-- prediction = "eps"} -> image (a ck.array [3, H, W], the decoder's output,
-- roughly in [-1, 1], not clamped) and the settings (prompt, negative_prompt,
-- steps, sampler, cfg, seed, width, height, model, loras, timesteps, steps_latents
-- (each step's latents), prompt_embeds, pooled (both halves, negative first)).
local function run(self, o, lv)
  if type(o) ~= "table" then error("generate: give a table of options", lv) end
  for k, v in next, o do
    local want = OPTIONS[k]
    if not want then error(string.format("generate: unknown option '%s' (options: %s)", tostring(k),
      sorted_keys(OPTIONS)), lv) end
    local ok = want == "integer" and math.type(v) == "integer" or want == "number" and type(v) == "number" or
      type(v) == want
    if not ok then error(string.format("generate: option %s must be a%s %s, got %s", k,
      want == "integer" and "n" or "", want, tostring(v)), lv) end
  end
  local models, c = self.models, self.models.unet_config
  local ok, st = pcall(sample_settings, o, size_factor(c), self.scheduler, nil, c.sample_size * 8)
  if not ok then error(type(st) == "table" and "generate: " .. st.msg or st, lv) end
  local prompt, negative, w, h = st.prompt, st.negative_prompt, st.width, st.height
  local steps, scale, seed, name, s = st.steps, st.cfg, st.seed, st.sampler, st.schedule
  local loras = {}
  for i, l in ipairs(rawget(o, "loras") or {}) do
    local path, strength = type(l) == "table" and rawget(l, 1), type(l) == "table" and (rawget(l, 2) or 1.0)
    if type(path) ~= "string" or type(strength) ~= "number" then
      error(string.format("generate: loras[%d] must be {path, strength}", i), lv)
    end
    loras[i] = {path, strength}
  end
  local n = c.in_channels * (h // 8) * (w // 8)
  local x
  local given = rawget(o, "latents")
  if given then
    if #given ~= n then
      error(string.format("generate: latents holds %d values, a %dx%d image's latents are %d", #given, w, h, n), lv)
    end
    x = {}
    for k = 1, n do x[k] = given[k] * s.init_noise_sigma end
  else
    x = s:initial_latents(seed, n)
  end

  local pe, pooled, npe, npooled
  local given_e = rawget(o, "embeddings")
  if given_e then -- pipe:encode_prompts' four lists, made once for a prompt used often
    pe, pooled, npe, npooled = given_e[1], given_e[2], given_e[3], given_e[4]
  else
    pe, pooled, npe, npooled = self:encode_prompts(prompt, negative)
  end
  local u
  if self.make_unet then
    if #loras > 0 then error("generate: this pipe runs its caller's UNet, which takes no LoRA files", lv) end
    u = self.make_unet(w, h)
  else
    u = self:unet_program(w, h, loras, lv + 1)
  end
  local p, inp = u.program, u.inputs
  local emb, pool = join(npe, pe), join(npooled, pooled)
  p:set(inp.encoder_hidden_states, emb)
  p:set(inp.text_embeds, pool)
  p:set(inp.time_ids, {h, w, 0, 0, h, w, h, w, 0, 0, h, w})
  local noise_fn = samplers.noise_fn(seed)
  local per_step = {}
  for i, t in ipairs(s.timesteps) do
    local xin = s:scale_model_input(x, i)
    p:set(inp.sample, join(xin, xin))
    p:set(inp.timesteps, {t, t})
    p:forward()
    local out = p:get(u.out)
    local un, co = {}, {}
    for k = 1, n do un[k], co[k] = out[k], out[n + k] end
    local eps = scale > 1 and samplers.cfg(un, co, scale) or co
    x = s:step(eps, i, x, noise_fn)
    per_step[i] = x
  end
  local vp = self.make_vae and self.make_vae(w, h) or self:vae_program(w, h)
  vp.program:set("latents", x)
  vp.program:forward()
  local image = vp.program:array(vp.image):reshape{3, h, w}
  local settings = {prompt = prompt, negative_prompt = negative, steps = steps, sampler = name, cfg = scale,
                    seed = seed, width = w, height = h, model = rawget(o, "model_name") or self.name, loras = loras,
                    timesteps = s.timesteps, steps_latents = per_step, prompt_embeds = emb, pooled = pool}
  return image, settings
end

function Pipe:generate(o)
  local image, settings = run(self, o, 3)
  return image, settings
end

-- Closes the pipe's programs (also on leaving a `local pipe <close>`).
function Pipe:close()
  for _, t in ipairs{self.unets, self.vaes} do
    for k, r in pairs(t) do
      local closing <close> = r.program
      t[k] = nil
    end
  end
end
Pipe.__close = Pipe.close

-- pipeline.generate(o): pipeline.new(o.models-like options: base, seed as
-- the tiny model's weight seed given as weights_seed, tokenizer) then one
-- pipe:generate(o) with the rest; the pipe is closed after.
function M.generate(o)
  if type(o) ~= "table" then error("pipeline.generate: give a table of options", 2) end
  local mo, go = {}, {}
  for k, v in next, o do
    if k == "base" or k == "tokenizer" or k == "name" then mo[k] = v
    elseif k == "weights_seed" then mo.seed = v
    else go[k] = v end
  end
  local pipe <close> = M.new(mo)
  local image, settings = run(pipe, go, 3)
  return image, settings
end

-- A1111's "parameters" text of a generate's settings:
-- PROMPT\nNegative prompt: NEG\nSteps: N, Sampler: S, CFG scale: C, Seed: X, Size: WxH, Model: M
-- (the Negative prompt line left out without one; Lora hashes are not given)
local A1111_SAMPLER = {euler = "Euler", euler_a = "Euler a", ddim = "DDIM", dpmpp_2m = "DPM++ 2M",
                       dpmpp_2m_karras = "DPM++ 2M Karras"}
function M.parameters(s)
  local lines = {s.prompt}
  for _, l in ipairs(s.loras or {}) do
    local stem = l[1]:match("([^/]+)$"):gsub("%.safetensors$", "")
    lines[1] = lines[1] .. string.format(" <lora:%s:%g>", stem, l[2])
  end
  if s.negative_prompt and s.negative_prompt ~= "" then lines[#lines + 1] = "Negative prompt: " .. s.negative_prompt end
  lines[#lines + 1] = string.format("Steps: %d, Sampler: %s, CFG scale: %g, Seed: %d, Size: %dx%d, Model: %s",
    s.steps, A1111_SAMPLER[s.sampler] or s.sampler, s.cfg, s.seed, s.width, s.height, s.model)
  return table.concat(lines, "\n")
end

---- kohya's prompt files (--sample-prompts)

-- sampler names as kohya's --sample_sampler gives them, to ck.samplers'
M.SAMPLER_ALIASES = {k_euler = "euler", k_euler_a = "euler_a", ["dpmsolver++"] = "dpmpp_2m", dpmsolver = "dpmpp_2m"}

-- a sampler name of ck.samplers or kohya's, as ck.samplers names it; nil if neither
function M.sampler_name(name)
  name = M.SAMPLER_ALIASES[name] or name
  for _, n in ipairs(samplers.NAMES) do if n == name then return n end end
  return nil
end

local PROMPT_OPTIONS = {n = "negative_prompt", w = "width", h = "height", s = "steps", l = "cfg", d = "seed",
                        ss = "sampler"}
local PROMPT_FLAGS = {prompt = "the prompt"}
for flag, field in pairs(PROMPT_OPTIONS) do PROMPT_FLAGS[field] = "--" .. flag end

local strip = require("ck.imagedata").strip

-- pipeline.read_prompts(path, {width, height, steps, cfg, seed, sampler (the
-- defaults), config (the UNet's: sizes must be multiples of 8 times its
-- downsampling), prediction, scheduler (samplers.from_config's)}) -> a list of
-- generate's options plus line (the file's line number), one per prompt:
-- kohya's format, a prompt a line with --n NEGATIVE, --w WIDTH, --h HEIGHT,
-- --s STEPS, --l CFG, --d SEED, --ss SAMPLER after it; empty lines and lines
-- starting with # skipped. Each prompt's settings are checked by the function
-- generate checks its own with, so a file read here cannot fail at a sample;
-- anything wrong (an unknown option, a value that is not one, a size the UNet
-- cannot take, an unknown sampler, a step count the sampler lacks, a NUL) is
-- one line naming the file and line. Linear in the file's length.
function M.read_prompts(path, o)
  o = o or {}
  local f, why = io.open(path, "rb")
  if not f then error(string.format("%s: cannot read the prompt file (%s)", path, tostring(why)), 2) end
  local text = f:read("a")
  f:close()
  local factor = o.config and size_factor(o.config) or 8
  local out, n = {}, 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    local function bad(fmt, ...) error(string.format("%s:%d: " .. fmt, path, n, ...), 0) end
    local stripped = strip(line) -- a trailing \r with it
    if stripped ~= "" and stripped:sub(1, 1) ~= "#" then
      if not utf8.len(stripped) then bad("the line is not UTF-8 text") end
      local parts, at = {}, 1
      while true do -- split on " --", as kohya's parser does
        local i = stripped:find(" --", at, true)
        parts[#parts + 1] = stripped:sub(at, i and i - 1 or -1)
        if not i then break end
        at = i + 3
      end
      if stripped:sub(1, 2) == "--" then -- a line that is options alone: the prompt is empty
        parts[1] = stripped:sub(3)
        table.insert(parts, 1, "")
      end
      local e = {prompt = strip(parts[1]), width = o.width, height = o.height, steps = o.steps, cfg = o.cfg,
                 seed = o.seed, sampler = o.sampler, prediction = o.prediction}
      for k = 2, #parts do
        local key = parts[k]:match("^%S+")
        local value = key and strip(parts[k]:sub(#key + 1)) or ""
        local field = key and PROMPT_OPTIONS[key:lower()]
        if not field then
          local known = {}
          for name in pairs(PROMPT_OPTIONS) do known[#known + 1] = "--" .. name end
          table.sort(known)
          bad("unknown option '--%s' (options: %s)", shown(key or parts[k]), table.concat(known, ", "))
        end
        if value == "" and field ~= "negative_prompt" then bad("option '--%s' needs a value", key) end
        if field == "negative_prompt" then
          e.negative_prompt = value
        elseif field == "sampler" then
          e.sampler = M.sampler_name(value)
          if not e.sampler then
            bad("unknown sampler '%s' (samplers: %s, or kohya's k_euler, k_euler_a, dpmsolver++)", shown(value),
              table.concat(samplers.NAMES, ", "))
          end
        elseif field == "cfg" then
          local v = tonumber(value)
          if not v then bad("--l must be a CFG scale from 0 to %d, got '%s'", M.MAX_CFG, shown(value)) end
          e.cfg = v
        else
          local v = value:match("^%d+$") and math.tointeger(tonumber(value))
          if not v then bad("--%s must be a whole number, got '%s'", key, shown(value)) end
          e[field] = v
        end
      end
      local ok, st = pcall(sample_settings, e, factor, o.scheduler, function(k) return PROMPT_FLAGS[k] end)
      if not ok then bad("%s", type(st) == "table" and st.msg or tostring(st)) end
      e.line = n
      out[#out + 1] = e
    end
  end
  if #out == 0 then error(string.format("%s: the prompt file holds no prompt", path), 0) end
  return out
end

return M
