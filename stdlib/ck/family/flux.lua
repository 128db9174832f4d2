-- The Flux.1 family for ck.train (its contract is in ck/train.lua): the
-- transformer (ck.flux, its training step with latents packed 2x2) under
-- ck.flux_lora's adapters or trained whole, flow matching with kohya's options
-- (ck.flow), weights from Black Forest Labs' single files and diffusers folders
-- (ck.flux_keys), T5-XXL, CLIP-L's pooled output and the 16-channel VAE for
-- images and captions (ck.t5, ck.clip, ck.vae: encoded once into the cache),
-- kohya's and PEFT's adapter files, and samples through ck.flux_pipeline.
local ck = require "ck"
local flux = require "ck.flux"
local flux_keys = require "ck.flux_keys"
local flux_lora = require "ck.flux_lora"
local flux_step = require "ck.flux_step"
local flow = require "ck.flow"
local data = require "ck.data"

local F = {name = "flux", noun = "transformer", blocks = flux.BLOCKS}

-- --checkpoint diffusers (kohya's --gradient_checkpointing): every double and single block
F.base_files = "a Flux.1 transformer: Black Forest Labs' single file (flux1-dev.safetensors, with or without " ..
  "model.diffusion_model.; bf16 or fp8 e4m3) or a diffusers folder (transformer/, vae/, text_encoder/, " ..
  "text_encoder_2/, tokenizer/, tokenizer_2/)"

local CONFIGS = {tiny = "flux-tiny", schnell = "flux-schnell", dev = "flux-dev"}

-- FLUX.1 (--size dev or schnell, or a base model) trains at its own scale; flux-tiny small
local function real_or_tiny(real, tiny)
  return function(v) if v.size ~= "tiny" or v["pretrained-model-name-or-path"] then return real end return tiny end
end

-- the trainer's options whose defaults are the family's
F.defaults = {
  resolution = {real_or_tiny(1024, 128), shown = "1024 with --size dev or schnell or a base model, else 128"},
  batch = {real_or_tiny(1, 2), shown = "1 with --size dev or schnell or a base model, else 2"},
}

-- the parts of a base model, as generate.lua names them (ck.flux_pipeline.open's)
local PARTS = {{"ae", "vae"}, {"clip-l", "clip_l"}, {"t5xxl", "t5xxl"}, {"tokenizer", "tokenizer"},
               {"t5-tokenizer", "t5_tokenizer"}}

F.options = {
  {"size", "choice", "tiny", "flux-tiny (134,784 parameters in FLUX.1-dev's layout) or the transformer of " ..
   "FLUX.1-schnell or FLUX.1-dev (seeded random weights: for --plan, or with --weights); with a base model, its " ..
   "config (checked against the file)", choices = {"tiny", "schnell", "dev"}},
  {"ae", "string", nil, "the VAE, a diffusers vae/ folder, or a file in its names or Black Forest Labs' " ..
   "(ae.safetensors) (default: the base folder's vae/)", arg = "PATH"},
  {"clip-l", "string", nil, "CLIP-L, a transformers folder or a file in its names such as ComfyUI's " ..
   "clip_l.safetensors (default: the base folder's text_encoder/)", arg = "PATH"},
  {"t5xxl", "string", nil, "T5-XXL's encoder, a transformers folder or a file such as t5xxl_fp16.safetensors " ..
   "(default: the base folder's text_encoder_2/)", arg = "PATH"},
  {"tokenizer", "string", nil, "CLIP's tokenizer: open_clip's bpe_simple_vocab_16e6.txt.gz, a tokenizer folder " ..
   "or a tokenizer.json (default: the base folder's tokenizer/)", arg = "FILE|DIR"},
  {"t5-tokenizer", "string", nil, "T5's tokenizer, a folder, spiece.model or tokenizer.json (default: the base " ..
   "folder's tokenizer_2/)", arg = "PATH"},
  {"t5xxl-max-token-length", "integer", nil, "T5's tokens a caption (truncated, padded), as kohya's", min = 1,
   shown = "512 for a model with a guidance embedder (dev), 256 without (schnell), 32 for flux-tiny"},
  {"apply-t5-attn-mask", "flag", false, "mask the captions' padding in T5 and in the transformer's joint " ..
   "attention, as kohya's"},
}
for _, e in ipairs(flow.OPTIONS) do F.options[#F.options + 1] = e end
for _, e in ipairs{
  {"ip-noise-gamma", "number", 0, "input perturbation: noise the model sees and the target leaves out", min = 0},
  {"targets", "string", "kohya", "the adapted modules: kohya (every Linear of the double and single blocks, " ..
   "modulation included), diffusers (train_dreambooth_lora_flux.py's), or module names (each adapted on its own; " ..
   "saved with --lora-format peft)", arg = "kohya|diffusers|a,b,c"},
} do F.options[#F.options + 1] = e end

-- of its options, those only an adapter takes (--full refuses them)
F.adapter_options = {"targets"}

-- SDXL's options this family lacks, refused by name (what a user of the SDXL
-- script may carry over), some with what Flux has in their place
local REFUSED = {
  ["sample-sampler"] = "is SDXL's: Flux samples use the flow-matching Euler sampler",
  ["max-token-length"] = "is SDXL's CLIP length: Flux's T5 takes --t5xxl-max-token-length",
  prediction = "is SDXL's: Flux's flow matching takes --model-prediction-type",
  ["min-timestep"] = "is SDXL's: Flux's sigmas come from --timestep-sampling",
  ["max-timestep"] = "is SDXL's: Flux's sigmas come from --timestep-sampling",
}
function F.refused(name) return REFUSED[name] end
-- how ck.train names the family when it refuses another's options
F.owner, F.script, F.model_words = "Flux's", "scripts/train_flux_lora.lua", "a Flux model"


-- whether the run encodes images or sample prompts (it needs the base's VAE and text encoders)
local function needs_encoders(o)
  return o["sample-prompts"] ~= nil or o["dataset-config"] ~= nil or
    (o.data ~= "synthetic" and require("ck.encode").is_image_folder(o.data))
end

-- The model the options describe: the transformer's config (a base model's,
-- or --size's seeded random one), its text length, the objective, the
-- adapter's targets, and with images or sample prompts the base's other parts
-- (ck.flux_pipeline.open's description: the VAE, CLIP-L, T5 and their
-- tokenizers), opened now so that a missing part stops the run before it starts.
function F.model(o)
  local m = {seed = o.seed, resolution = o.resolution}
  local path = o["pretrained-model-name-or-path"]
  local parts, given = {caption_fix = o["caption-fix"]}, nil
  for _, p in ipairs(PARTS) do
    parts[p[2]] = o[p[1]]
    if o[p[1]] ~= nil then given = given or p[1] end
  end
  if path then
    -- --size with a base names its config, checked against the file (a single file whose
    -- head dim is not FLUX.1's does not say its rope axes)
    parts.config = o:given("size") and CONFIGS[o.size] or nil
    m.base = flux_keys.open(path, {config = parts.config})
    m.config, m.variant = m.base.config, m.base.variant
    m.size = m.variant and m.variant:gsub("^flux%-", "") or (m.base.kind == "diffusers" and "diffusers folder" or
      "single file")
    m.base_path = path
    m.base_name = path:gsub("/+$", ""):match("([^/]+)$"):gsub("%.safetensors$", "")
  else
    if given then
      error("--" .. given .. " gives a part of a base model: give the model too (--pretrained-model-name-or-path)")
    end
    m.size, m.variant = o.size, CONFIGS[o.size]
    m.config = flux.config(m.variant)
  end
  local c = m.config
  m.label = "flux-" .. m.size
  m.title = m.base_name or (m.label .. " (trained by ckrun)") -- what the samples' parameters call the model
  m.channels = c.in_channels // 4 -- the VAE's latent channels, packed 2x2 into the transformer's
  m.factor = 2 -- latent sides are multiples of the 2x2 packing
  m.vae_scale = 8 -- FLUX.1's VAE: pixels per latent pixel
  m.tokens = o["t5xxl-max-token-length"] or
    (m.variant == "flux-tiny" and 32 or c.guidance_embeds and 512 or 256)
  m.mask = o["apply-t5-attn-mask"]
  -- the base's other parts: needed for images and samples (and refused then
  -- in one line naming what is missing), else read for the VAE's scale alone
  if path then
    if needs_encoders(o) then
      m.pipe = require("ck.flux_pipeline").open(path, parts)
    else
      local ok, d = pcall(require("ck.flux_pipeline").open, path, parts)
      m.pipe = ok and d or nil
    end
  end
  if m.pipe then
    m.vae_scale = 1 << (#m.pipe.vae.config.block_out_channels - 1)
    if m.pipe.vae.config.latent_channels ~= m.channels then
      error(string.format("%s: the VAE has %d latent channels; the transformer takes %d packed 2x2", m.pipe.vae.file,
        m.pipe.vae.config.latent_channels, m.channels))
    end
  end
  if needs_encoders(o) then
    if not m.pipe then
      error((o["sample-prompts"] and "--sample-prompts" or o["dataset-config"] and "--dataset-config" or
        "--data " .. o.data .. " (images)") .. " needs the base " ..
        "model's VAE and text encoders: give --pretrained-model-name-or-path (and the parts a single file lacks)")
    end
    -- the tokenizers now: a missing or bad file stops the run before it starts
    m.t5_tokenizer = require("ck.t5tok").load(m.pipe.t5_tokenizer)
    m.clip_tokenizer = ck.clip_tokenizer(m.pipe.tokenizer)
  end
  -- the objective: flow matching with kohya's options, checked now
  local obj = flow.from_options(o)
  obj.seed, obj.ip_noise_gamma = o.seed, o["ip-noise-gamma"]
  if o:given("guidance-scale") and not c.guidance_embeds then
    error("--guidance-scale: this model has no guidance embedding (as FLUX.1-schnell): give no guidance")
  end
  flow.objective(obj)
  m.objective = obj
  m.objective_words = string.format("flow matching (%s timesteps, %s prediction)", obj.timestep_sampling,
    obj.model_prediction_type)
  local targets = o.targets
  if targets ~= "kohya" and targets ~= "diffusers" then targets = require("ck.options").types.list(nil, targets) end
  m.targets = targets
  if type(targets) == "table" and o["lora-format"] == "kohya" and not o.full then
    error("--targets " .. o.targets .. " adapts modules one by one, which kohya's names (Black Forest Labs' fused " ..
      "qkv and linear1) cannot hold: give --lora-format peft, or --targets kohya")
  end
  -- what the encoders' programs store: T5-XXL in bf16 (fp8 with --fp8-base) where the run stores 16 bits
  m.text_storage = (o["mixed-precision"] ~= "no" or o.storage ~= "fp32") and "bf16" or nil
  m.text_frozen = o["fp8-base"] and "fp8" or nil
  return m
end

-- flux_lora.attach's options: the trainer's (rank, alpha, dropout, loraplus_lr_ratio) and the targets
-- The blocks whose frozen weights --blocks-to-swap n streams, as kohya's
-- --blocks_to_swap counts them (library/flux_models.py): n // 2 double blocks
-- and (n - n // 2) * 2 single blocks (a double block is about two single
-- ones), the last of each kind; n nil: every block (--offload weights). nil
-- and the reason when the model has fewer.
function F.swap_blocks(m, n)
  local c = m.config
  local double, single = c.num_layers, c.num_single_layers
  if n then double, single = n // 2, (n - n // 2) * 2 end
  if double > c.num_layers or single > c.num_single_layers then
    local most = 0
    while (most + 1) // 2 <= c.num_layers and (most + 1 - (most + 1) // 2) * 2 <= c.num_single_layers do most = most + 1 end
    return nil, string.format("%d blocks are %d double and %d single ones, and %s has %d double and %d single blocks: " ..
      "at most %d", n, double, single, m.label, c.num_layers, c.num_single_layers, most)
  end
  local names = {}
  for i = c.num_layers - double, c.num_layers - 1 do names[#names + 1] = "transformer_blocks." .. i end
  for i = c.num_single_layers - single, c.num_single_layers - 1 do names[#names + 1] = "single_transformer_blocks." .. i end
  return names
end

function F.adapter(m, a)
  return {rank = a.rank, alpha = a.alpha, targets = m.targets, dropout = a.dropout,
          loraplus_lr_ratio = a.loraplus_lr_ratio}
end

-- what follows "LoRA rank R" in the run's first line
function F.adapter_words(m)
  return m.targets == "kohya" and " (kohya's targets)" or m.targets == "diffusers" and " (diffusers' targets)" or ""
end

---- the training step

-- a step's draws: the flow-matching objective's (sigmas, timesteps, noise,
-- guidance), and the inputs that are constants of the program's shape (the
-- rope table, the mask's ones), set at every step: programs of one group
-- share an arena, where another may have run since
local Step = {}
Step.__index = Step

function Step:prepare(p, given, step)
  p:set(self.inputs.rope, self.rope)
  if self.inputs.joint_ones then p:set(self.inputs.joint_ones, 1) end
  return self.flow:prepare(p, given, step)
end

-- The training step (ck.flux_step.training_step) for s = {batch, latent = {h, w},
-- lora = flux_lora.attach's options or false, compile = g:compile's options}.
-- Its inputs take the sample files' names too: prompt_embeds (T5's last
-- hidden states), pooled_prompt_embeds (CLIP-L's pooled output), t5_attn_mask.
function F.build(m, s)
  local obj = flow.objective(m.objective)
  local r = flux_step.training_step{config = m.config, batch = s.batch, latent = s.latent, tokens = m.tokens,
                               mask = m.mask, lora = s.lora, objective = obj, compile = s.compile}
  obj.guidance_input = r.inputs.guidance
  r.inputs.prompt_embeds, r.inputs.pooled_prompt_embeds = r.inputs.encoder_hidden_states, r.inputs.pooled_projections
  r.objective = setmetatable({flow = obj, inputs = r.inputs, rope = r.rope_values}, Step)
  return r
end

-- The base model's transformer into params of p (by their diffusers names).
-- Returns the number of tensors loaded.
function F.load(m, p, params)
  return flux_keys.load(p, m.base, params)
end

-- The sample files' text tensors and their shapes, as the transformer takes them.
function F.text_shapes(m)
  local c = m.config
  local s = {{"prompt_embeds", {m.tokens, c.joint_attention_dim}}, {"pooled_prompt_embeds", {c.pooled_projection_dim}}}
  if m.mask then s[#s + 1] = {"t5_attn_mask", {m.tokens}} end
  return s
end

local function text_fields(m)
  local f = {"prompt_embeds", "pooled_prompt_embeds"}
  if m.mask then f[#f + 1] = "t5_attn_mask" end
  return f
end

-- Deterministic synthetic sample i: smooth latents of a few random
-- frequencies and phases per channel (as ck.data's), text states and a
-- pooled vector drawn from the generator, and a caption length (the mask's
-- ones); each value a function of (seed, i).
local function synthetic_sample(m, i, o)
  local seed, C, H, W = o.seed or 1, m.channels, o.height, o.width
  local D, P, T = m.config.joint_attention_dim, m.config.pooled_projection_dim, m.tokens
  local key = 0x5300 + i
  local function u(k) return ck.random(seed, 0, key, k) end
  local lat = {}
  for c = 0, C - 1 do
    local fy, fx = 1 + math.floor(u(4 * c) * 3), 1 + math.floor(u(4 * c + 1) * 3)
    local py, px = u(4 * c + 2) * 2 * math.pi, u(4 * c + 3) * 2 * math.pi
    for y = 0, H - 1 do
      for x = 0, W - 1 do
        lat[#lat + 1] = math.sin(2 * math.pi * fy * y / H + py) * math.cos(2 * math.pi * fx * x / W + px)
      end
    end
  end
  local pe, pooled = {}, {}
  for k = 1, T * D do pe[k] = 0.5 * ck.randn(seed, 1, key, k) end
  for k = 1, P do pooled[k] = 0.5 * ck.randn(seed, 2, key, k) end
  local s = {latents = {{C, H, W}, lat}, prompt_embeds = {{T, D}, pe}, pooled_prompt_embeds = {{P}, pooled}}
  if m.mask then
    local n, mask = 1 + math.floor(u(4 * C) * T), {}
    for k = 1, T do mask[k] = k <= n and 1 or 0 end
    s.t5_attn_mask = {{T}, mask}
  end
  return s
end

-- A set of cached samples (ck.data.latents; o as it takes them): latents
-- [16, h, w], prompt_embeds [T, 4096], pooled_prompt_embeds [768] (and
-- t5_attn_mask [T] with --apply-t5-attn-mask), or the synthetic set.
function F.dataset(m, src, o)
  o.image_fields, o.text_fields = {"latents"}, text_fields(m)
  o.sample = function(i, so) return synthetic_sample(m, i, so) end
  return data.latents(src, o)
end

-- what the run writes about the model in a state: a resumed run must match it
function F.settings(m)
  local t, obj = m.targets, m.objective
  local s = {targets = type(t) == "table" and table.concat(t, ",") or t, t5_tokens = m.tokens,
             apply_t5_attn_mask = m.mask}
  for _, e in ipairs(flow.OPTIONS) do
    local k = e[1]:gsub("%-", "_")
    s[k] = obj[k]
  end
  s.ip_noise_gamma = obj.ip_noise_gamma
  return s
end

-- Python's str() of a value, as kohya's metadata holds its arguments
local function py(v)
  if type(v) == "boolean" then return v and "True" or "False" end
  if math.type(v) == "float" and v == math.floor(v) and math.abs(v) < 1e16 then return string.format("%.1f", v) end
  return tostring(v)
end

-- kohya's Flux metadata (flux_train_network.py's update_metadata) and ModelSpec's resolution
function F.metadata(m)
  local o = m.objective
  local meta = {
    ss_apply_t5_attn_mask = py(m.mask), ss_weighting_scheme = o.weighting_scheme, ss_logit_mean = py(o.logit_mean),
    ss_logit_std = py(o.logit_std), ss_mode_scale = py(o.mode_scale), ss_guidance_scale = py(o.guidance_scale),
    ss_timestep_sampling = o.timestep_sampling, ss_sigmoid_scale = py(o.sigmoid_scale),
    ss_model_prediction_type = o.model_prediction_type, ss_discrete_flow_shift = py(o.discrete_flow_shift),
    ["modelspec.resolution"] = string.format("%dx%d", m.resolution, m.resolution),
  }
  return meta
end

-- The adapter as a file: kohya's names (default) or PEFT's (ck.flux_lora.save).
function F.save_adapter(p, adapter, path, o)
  return flux_lora.save(p, adapter, path, {format = o.format, metadata = o.metadata, dtype = o.dtype})
end

---- the encoders: images and captions to the transformer's inputs

local t5 = require "ck.t5"
local clip = require "ck.clip"
local vae = require "ck.vae"
local checkpoint = require "ck.checkpoint"
local imagedata = require "ck.imagedata"

local KEY_VAE_NOISE = 0x7AE0 -- each image's latents sample: noise keyed by (seed, epoch, key + 2 i [+ 1 flipped])

local Encoders = {}
Encoders.__index = Encoders

-- The base's VAE, CLIP-L and T5 (F.model opened them: m.pipe) with their tokenizers.
function F.encoders(m)
  local d = m.pipe
  local e = setmetatable({m = m, d = d, tokens = m.tokens, vae_config = d.vae.config}, Encoders)
  -- the identity of what encodes: a changed model, part, length, mask or fix encodes the images again
  e.id = table.concat({"flux base " .. d.file, "vae " .. d.vae.file, "clip_l " .. d.clip.file, "t5 " .. d.t5.file,
    "t5 tokenizer " .. tostring(d.t5_tokenizer), "tokens " .. m.tokens, m.mask and "t5 mask" or "no mask",
    "t5 storage " .. (m.text_storage or "fp32") .. " " .. (m.text_frozen or ""),
    "caption_fix " .. tostring(d.tokenizer.caption_fix)}, "; ")
  return e
end

-- the encoders' widths must be the transformer's
function Encoders:check()
  local c, d = self.m.config, self.d
  if d.t5.config.d_model ~= c.joint_attention_dim or d.clip.config.hidden_size ~= c.pooled_projection_dim or
     d.vae.config.latent_channels * 4 ~= c.in_channels then
    error(string.format("%s: the encoders give T5 states of %d, a pooled vector of %d and %d latent channels; the " ..
      "transformer takes %d, %d and %d packed 2x2", d.file, d.t5.config.d_model, d.clip.config.hidden_size,
      d.vae.config.latent_channels, c.joint_attention_dim, c.pooled_projection_dim, c.in_channels // 4))
  end
end

-- a part's map with its names under prefix (the program's parameters are prefix .. the part's key)
local function prefixed(part, prefix)
  local map = {}
  for k, v in pairs(part.map) do map[prefix .. k] = v end
  return {file = part.file, files = part.files, map = map}
end

-- T5 and CLIP-L at n captions in one program (share: a program whose weights
-- it uses). Returns {program, t5, clip, pe, pooled, b}.
function Encoders:text_program(n, share)
  local m, d = self.m, self.d
  local g = ck.graph()
  local te, tr = t5.build(g, d.t5.config, {batch = n, tokens = m.tokens, mask = m.mask, prefix = "t5"})
  local cc = d.clip.config
  local ce, cr = clip.build(g, cc, {batch = n, tokens = cc.max_position_embeddings, projection = false,
                                    prefix = "clip"})
  local p = g:compile{outputs = {tr.last_hidden_state, cr.pooled}, optimizer = "none", seed = m.seed, share = share,
                      storage = m.text_storage, frozen = m.text_frozen}
  if not share then
    t5.load(p, te, d.t5)
    local params = {}
    for _, prm in ipairs(g:params()) do if prm.name:match("^clip%.") then params[#params + 1] = prm end end
    checkpoint.load(p, "text_encoder", prefixed(d.clip.part, "clip."), params)
  end
  return {program = p, t5 = te, clip = ce, pe = tr.last_hidden_state, pooled = cr.pooled, b = n}
end

-- the captions' T5 states, CLIP-L's pooled vectors (and the T5 masks): the
-- training program's inputs, {{name, values}, ...}
function Encoders:text(tp, captions)
  local m, L = self.m, self.m.tokens
  local ids, masks, rows, flat_mask = {}, {}, {}, {}
  local frame = self.d.clip.config.max_position_embeddings
  for b, c in ipairs(captions) do
    ids[b], masks[b] = m.t5_tokenizer:encode(c, {max_length = L})
    rows[b] = m.clip_tokenizer:encode(c, {max_length = frame})
    table.move(masks[b], 1, L, (b - 1) * L + 1, flat_mask)
  end
  tp.t5:feed(tp.program, ids, m.mask and masks or nil)
  tp.clip:feed(tp.program, rows)
  tp.program:forward()
  local out = {{"prompt_embeds", tp.program:get(tp.pe)}, {"pooled_prompt_embeds", tp.program:get(tp.pooled)}}
  if m.mask then out[#out + 1] = {"t5_attn_mask", flat_mask} end
  return out
end

-- the VAE's encoder at w x h pixels, batch 1 (share: a program whose weights it uses)
function Encoders:image_program(w, h, share)
  local g = ck.graph()
  local _, mean, logvar = vae.build_encoder(g, self.vae_config, {batch = 1, height = h, width = w})
  local p = g:compile{outputs = {mean, logvar}, optimizer = "none", seed = self.m.seed, share = share}
  if not share then checkpoint.load(p, "vae", self.d.vae.part, g:params()) end
  return {program = p, mean = mean, logvar = logvar}
end

-- an image's latents, sampled with noise keyed by (seed, epoch, key), shifted and scaled (FLUX.1's 0.1159, 0.3611)
local function latents_of(vp, config, image, key, seed, epoch)
  local p = vp.program
  p:set("sample", image)
  p:forward()
  local mean, logvar = p:get(vp.mean), p:get(vp.logvar)
  local noise = {}
  for i = 1, #mean do noise[i] = ck.randn(seed, epoch or 0, key, i) end
  return vae.latents(mean, logvar, noise, config)
end

-- an image (s: its use, imagedata.sample's) into one row's inputs: its latents (Flux has no size conditioning)
function Encoders:image(vp, image, s, key, seed, epoch)
  return {{"latents", latents_of(vp, self.vae_config, image, key, seed, epoch)}}
end

-- whether path holds a whole cached sample of plan entry e: the latents of
-- its bucket (and mirror) and the text tensors of this run's shapes
local function cached(self, path, e, flip_aug, with_text)
  local ok, f = pcall(ck.safetensors, path)
  if not ok then return false end
  local s = self.vae_scale_of
  local function shape_is(name, want)
    if not f:has(name) then return false end
    local sh = f:shape(name)
    if #sh ~= #want then return false end
    for i = 1, #want do if sh[i] ~= want[i] then return false end end
    return true
  end
  local lat = {self.vae_config.latent_channels, e.bucket[2] // s, e.bucket[1] // s}
  local good = shape_is("latents", lat) and (not flip_aug or shape_is("latents_flipped", lat))
  if good and with_text then
    for _, t in ipairs(F.text_shapes(self.m)) do good = good and shape_is(t[1], t[2]) end
  end
  f:close()
  return good
end

-- Encodes every image of plan (imagedata.assign's) not yet in the cache, as
-- ck.encode.cache does SDXL's: o = {cache_dir, seed, flip_aug, random_crop
-- (refused), progress, text = false (latents only)}. One VAE program per
-- bucket sharing one copy of its weights and one text program, all closed
-- before the training programs are made. Returns the sample file of each
-- plan item and the bound on the process's memory while encoding.
function Encoders:cache(plan, o)
  if o.random_crop then
    error("--random-crop draws a new crop at every use, so its latents cannot be cached; leave it out", 0)
  end
  self.vae_scale_of = 1 << (#self.vae_config.block_out_channels - 1)
  local seed, with_text = o.seed or 1, o.text ~= false
  local out, todo = {}, {}
  for i, e in ipairs(plan.items) do
    local id = self.id .. (o.flip_aug and "; flip_aug" or "") .. (with_text and ("; caption " .. e.caption) or "")
    out[i] = imagedata.cache_path(e, o.cache_dir, imagedata.cache_key(e, {model_id = id}))
    if not cached(self, out[i], e, o.flip_aug, with_text) then todo[#todo + 1] = i end
  end
  if #todo == 0 then
    if o.progress then print(string.format("cache: all %d images encoded already", #plan.items)) end
    return out
  end
  local t0 = ck.now()
  local vps, first = {}, nil
  local tp = with_text and self:text_program(1) or nil
  local C, s = self.vae_config.latent_channels, self.vae_scale_of
  for n, i in ipairs(todo) do
    local e = plan.items[i]
    local bw, bh = e.bucket[1], e.bucket[2]
    local bk = bw .. "x" .. bh
    if not vps[bk] then
      vps[bk] = self:image_program(bw, bh, first and first.program or nil)
      first = first or vps[bk]
    end
    local img = ck.image_load(e.path, {resize = e.resized, crop = e.crop})
    local tensors = {{"latents", {C, bh // s, bw // s}, latents_of(vps[bk], self.vae_config, img, KEY_VAE_NOISE + 2 * i,
                                                                  seed)}}
    if o.flip_aug then
      local flipped = ck.image_load(e.path, {resize = e.resized, crop = e.crop, flip = true})
      tensors[#tensors + 1] = {"latents_flipped", {C, bh // s, bw // s},
                               latents_of(vps[bk], self.vae_config, flipped, KEY_VAE_NOISE + 2 * i + 1, seed)}
    end
    if tp then
      local shapes = {}
      for _, t in ipairs(F.text_shapes(self.m)) do shapes[t[1]] = t[2] end
      for _, kv in ipairs(self:text(tp, {e.caption})) do tensors[#tensors + 1] = {kv[1], shapes[kv[1]], kv[2]} end
    end
    local dir = out[i]:match("^(.*)/[^/]*$")
    if dir then assert(ck.mkdir(dir)) end
    ck.write_safetensors(out[i], tensors, {source = "ckrun image cache (Flux)", image = e.path, caption = e.caption})
    if o.progress and (n == 1 or n == #todo or n % 10 == 0) then
      print(string.format("cache: encoded %d/%d images (%.2f images/s) %s", n, #todo,
        n / math.max(ck.now() - t0, 1e-9), e.path))
    end
  end
  if o.progress then
    print(string.format("cache: %d image%s encoded in %.1f s, %d already there", #todo, #todo == 1 and "" or "s",
      ck.now() - t0, #plan.items - #todo))
  end
  -- the bound this phase states for the whole process, then every encoder
  -- closed before training makes its programs
  local programs = {first.program}
  for _, vp in pairs(vps) do if vp ~= first then programs[#programs + 1] = vp.program end end
  if tp then programs[#programs + 1] = tp.program end
  local _, bound = require("ck.memory").outside(first.program, programs)
  for _, q in ipairs(programs) do local closing <close> = q end
  return out, bound
end

---- samples while training (ck.flux_pipeline)

-- kohya's prompt options that Flux samples take, and those refused with why
local PROMPT_OPTIONS = {w = "width", h = "height", s = "steps", d = "seed", g = "guidance"}
local PROMPT_REFUSED = {
  n = "Flux samples have no negative prompt (no classifier-free guidance; --g sets FLUX.1-dev's guidance)",
  l = "Flux samples have no classifier-free guidance scale (--g sets FLUX.1-dev's guidance)",
  ss = "Flux samples use the flow-matching Euler sampler",
}

-- Kohya's prompt file (a prompt a line, # comments) with Flux's options: --w
-- --h (default --resolution), --s (28 for dev, 4 for schnell), --d (the run's
-- --seed), --g (FLUX.1-dev's guidance, 3.5; none for schnell); every line
-- checked by the check generate makes of its own settings (ck.flux_pipeline),
-- anything wrong one line naming the file and line.
function F.prompts(m, path, o)
  local pipe = require("ck.flux_pipeline").new{model = m.pipe, t5_max_length = m.tokens}
  local def = pipe:defaults()
  local f, why = io.open(path, "rb")
  if not f then error(string.format("%s: cannot read the prompt file (%s)", path, tostring(why)), 0) end
  local text = f:read("a")
  f:close()
  local strip = imagedata.strip
  local list, n = {}, 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    local function bad(fmt, ...) error(string.format("%s:%d: " .. fmt, path, n, ...), 0) end
    local s = strip(line)
    if s ~= "" and s:sub(1, 1) ~= "#" then
      if not utf8.len(s) then bad("the line is not UTF-8 text") end
      local parts, at = {}, 1
      while true do -- split on " --", as kohya's parser does
        local i = s:find(" --", at, true)
        parts[#parts + 1] = s:sub(at, i and i - 1 or -1)
        if not i then break end
        at = i + 3
      end
      if s:sub(1, 2) == "--" then
        parts[1] = s:sub(3)
        table.insert(parts, 1, "")
      end
      local e = {prompt = strip(parts[1]), width = o.resolution, height = o.resolution, steps = def.steps,
                 guidance = def.guidance, seed = o.seed}
      for k = 2, #parts do
        local key = (parts[k]:match("^%S+") or ""):lower()
        local value = strip(parts[k]:sub(#key + 1))
        if PROMPT_REFUSED[key] then bad("--%s: %s", key, PROMPT_REFUSED[key]) end
        local field = PROMPT_OPTIONS[key]
        if not field then bad("unknown option '--%s' (options: --d, --g, --h, --s, --w)", key:sub(1, 40)) end
        local v = tonumber(value)
        if field ~= "guidance" then v = value:match("^%d+$") and math.tointeger(v) end
        if not v then bad("--%s must be a %s, got '%s'", key, field == "guidance" and "number" or "whole number",
          value:sub(1, 40)) end
        if field == "guidance" and not m.config.guidance_embeds then
          bad("--g: this model has no guidance embedding (as FLUX.1-schnell)")
        end
        e[field] = v
      end
      local ok, st = pcall(pipe.settings, pipe, e)
      if not ok then bad("%s", type(st) == "table" and st.msg or tostring(st)) end
      st.line = n
      list[#list + 1] = st
    end
  end
  if #list == 0 then error(string.format("%s: the prompt file holds no prompt", path), 0) end
  return list
end

local Sampler = setmetatable({}, {__index = require("ck.sampling").Base})
Sampler.__index = Sampler

-- The sampler: o = {prompts, encoders, lora (flux_lora.attach's options or
-- false), compile_opts, dir, stem}. Its programs join the training program's
-- group: the transformer (with the training adapter) uses the training
-- program's weights in place; the VAE's decoder holds its own weights in the
-- group's arena above the shared ones, loaded again before each decode.
function F.sampler(m, o)
  local s = setmetatable({m = m, prompts = o.prompts, enc = o.encoders, lora = o.lora, compile_opts = o.compile_opts,
                          dir = o.dir, stem = o.stem, denoiser = "transformer"}, Sampler)
  s.denoisers, s.vaes, s.order = {}, {}, {}
  return s
end

-- Each prompt's T5 states and pooled vector (and mask) by one text program
-- closed after it, before the training programs exist; returns the bound on
-- the process while it runs.
function Sampler:encode()
  local tp = self.enc:text_program(1)
  local _, bound = require("ck.memory").outside(tp.program, {tp.program})
  local closing <close> = tp.program
  self.embeddings = {}
  for i, e in ipairs(self.prompts) do
    local t = self.enc:text(tp, {e.prompt})
    self.embeddings[i] = {t[1][2], t[2][2], mask = t[3] and t[3][2]}
  end
  return bound
end

-- The transformer and the VAE's decoder at every size for p's group,
-- returned, not kept (Base:compile keeps them)
function Sampler:programs_for(p, plan_only)
  local m = self.m
  local vc = m.pipe.vae.config
  local s = 1 << (#vc.block_out_channels - 1)
  local trs, vaes, order = {}, {}, {}
  for _, sz in ipairs(self:sizes()) do
    local w, h, key = sz[1], sz[2], sz[3]
    local lh, lw = h // s, w // s
    local model = flux.FluxTransformer2DModel(m.config)
    model:freeze()
    if self.lora then flux_lora.attach(model, self.lora) end
    local g = ck.graph()
    -- flux_pipeline.build_transformer's graph, with kohya's text mask where the run trains with it
    local x = flux.inputs(g, m.config, {batch = 1, height = lh, width = lw, tokens = m.tokens, latents = false,
                                        mask = m.mask})
    x.latents = g:input("latents", {1, m.channels, lh, lw})
    x.timestep = g:input("timestep", {1})
    local y = flux.unpack(model:forward(g, flux.pack(x.latents), x.encoder_hidden_states, x.pooled_projections,
      x.timestep, x.rope, x.guidance, flux.joint_mask(x)), lh, lw)
    local co = {outputs = {y}, optimizer = "none", share = p, plan_only = plan_only}
    for k, v in pairs(self.compile_opts or {}) do co[k] = v end
    local tp = g:compile(co)
    tp.training = false -- no adapter dropout
    trs[key] = {program = tp, out = y, inputs = x, rope = flux.rope_values(m.config, m.tokens, lh, lw)}
    local gv = ck.graph()
    local _, image = vae.build_decoder(gv, vc, {batch = 1, height = lh, width = lw, frozen = true})
    local vp = gv:compile{outputs = {image}, optimizer = "none", seed = m.seed, share = p, plan_only = plan_only}
    vaes[key] = {program = vp, image = image, params = gv:params()}
    order[#order + 1] = key
  end
  return trs, vaes, order
end

-- Every prompt at this step (sampling's Base:write), with Forge's parameters text.
function Sampler:render(step, logger)
  local t0 = ck.now()
  local fp = require "ck.flux_pipeline"
  if not self.pipe then
    self.pipe = fp.new{model = self.m.pipe, name = self.m.title, t5_max_length = self.m.tokens,
      transformer = function(w, h)
        local r = self.denoisers[w .. "x" .. h]
        -- the program's constants, set again: training ran in the group's arena since
        r.program:set(r.inputs.rope, r.rope)
        if r.inputs.t5_attn_mask then
          r.program:set(r.inputs.t5_attn_mask, self.embeddings[self.current].mask)
          r.program:set(r.inputs.joint_ones, 1)
        end
        return r
      end,
      vae = function(w, h)
        local r = self.vaes[w .. "x" .. h]
        checkpoint.load(r.program, "vae", self.m.pipe.vae.part, r.params)
        return r
      end}
  end
  return self:write(step, logger, t0, function(i, e)
    self.current = i
    local image, st = self.pipe:generate{prompt = e.prompt, width = e.width, height = e.height, steps = e.steps,
      guidance = e.guidance, seed = e.seed, embeddings = self.embeddings[i]}
    return image, fp.parameters(st)
  end)
end

return F
