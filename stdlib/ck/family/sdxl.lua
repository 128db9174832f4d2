-- The SDXL family for ck.train (its contract is in ck/train.lua): the UNet
-- (ck.unet, ck.sdxl's training step) under LoRA or trained whole, DDPM's eps
-- or v objective with kohya's loss weights (ck.diffusion), weights from
-- single files and diffusers folders (ck.checkpoint), both CLIP text encoders
-- and the VAE for images and captions (ck.encode), kohya's and PEFT's adapter
-- names (ck.lora), and samples through SDXL's pipeline (ck.sampling).
local unet = require "ck.unet"
local sdxl = require "ck.sdxl"
local lora = require "ck.lora"
local log = require "ck.log"
local data = require "ck.data"

local F = {name = "sdxl", noun = "UNet", blocks = log.unet_blocks}

F.base_files = "an SDXL single-file checkpoint or a diffusers folder (UNet, VAE, text encoders, tokenizers)"

local CONFIGS = {tiny = "sdxl-tiny", mid = "sdxl-mid", full = "sdxl"}

-- a base model (--pretrained-model-name-or-path) is SDXL-sized, as --size full
local function full_or_tiny(full, tiny)
  return function(v) if v.size == "full" or v["pretrained-model-name-or-path"] then return full end return tiny end
end

-- the trainer's options whose defaults are the family's
F.defaults = {
  resolution = {full_or_tiny(1024, 256), shown = "1024 with --size full, else 256"},
  batch = {full_or_tiny(1, 2), shown = "1 with --size full, else 2"},
}

F.options = {
  {"size", "choice", "tiny", "sdxl-tiny (8M parameters), sdxl-mid (SDXL at half width, 330M parameters) " ..
   "or the real SDXL UNet", choices = {"tiny", "mid", "full"}},
  {"tokenizer", "string", nil, "CLIP's tokenizer for both encoders, in place of the base's folders: open_clip's " ..
   "bpe_simple_vocab_16e6.txt.gz, a tokenizer folder or a tokenizer.json", arg = "FILE|DIR"},
  {"max-token-length", "integer", 75, "caption tokens: 75, or kohya's 150 or 225 (encoded in chunks of 75)",
   check = function(v) return v == 75 or v == 150 or v == 225 end, says = "must be 75, 150 or 225"},
  -- the objective
  {"prediction", "choice", function(v) return (v.weights or v["pretrained-model-name-or-path"]) and "eps" or "v" end,
   "what the UNet predicts", choices = {"eps", "v"}, shown = "eps with a base model, else v"},
  {"noise-offset", "number", 0, "noise offset", min = 0},
  {"ip-noise-gamma", "number", 0, "input perturbation: noise the model sees and the target leaves out", min = 0},
  {"min-timestep", "integer", 0, "timesteps are drawn from [min, max)", min = 0},
  {"max-timestep", "integer", 1000, "timesteps are drawn from [min, max)", min = 1},
  {"min-snr-gamma", "number", nil, "kohya's min-SNR loss weight (default: none)", above = 0},
  {"debiased-estimation-loss", "flag", false, "kohya's debiased estimation loss weight"},
  {"scale-v-pred-loss-like-noise-pred", "flag", false, "kohya's v-prediction loss scale"},
  -- the adapter
  {"conv-rank", "integer", nil, "LoCon: adapt the resnets' 3x3 convolutions too, at this rank (default: none)",
   min = 1},
  {"conv-alpha", "number", function(v) return v["conv-rank"] end, "LoCon's alpha", shown = "--conv-rank"},
  {"targets", "string", "default", "the adapted modules: default (to_q,to_k,to_v,to_out.0), kohya, or a list",
   arg = "default|kohya|a,b,c"},
  -- samples
  {"sample-sampler", "string", "ddim", "the samples' sampler: euler, euler_a, ddim, dpmpp_2m, dpmpp_2m_karras " ..
   "(or kohya's k_euler, k_euler_a, dpmsolver++)", arg = "NAME",
   check = function(v) return require("ck.pipeline").sampler_name(v) ~= nil end,
   says = "must be euler, euler_a, ddim, dpmpp_2m, dpmpp_2m_karras, k_euler, k_euler_a or dpmsolver++"},
}

-- of its options, those only an adapter takes (--full refuses them)
F.adapter_options = {"conv-rank", "conv-alpha", "targets"}

-- how ck.train names the family when it refuses another's options
F.owner, F.script, F.model_words = "SDXL's", "scripts/train_sdxl_lora.lua", "an SDXL UNet"

-- The model the options describe: the UNet's config (a base model's, or
-- --size's seeded random one), the objective and the adapter's own settings.
function F.model(o)
  local m = {size = o.size, config = unet.config(CONFIGS[o.size])}
  -- the base model as users have it: a single-file SDXL checkpoint or a
  -- diffusers folder (its unet/config.json builds the UNet)
  local path = o["pretrained-model-name-or-path"]
  if path then
    if o:given("size") then error("--size picks a random base; --pretrained-model-name-or-path gives the model") end
    local ckpt = require "ck.checkpoint"
    m.base = ckpt.open(path)
    m.config = m.base.unet_config and ckpt.unet_config(m.base.unet_config, path .. "/unet/config.json")
      or unet.config("sdxl")
    m.size = m.base.kind == "single" and "single file" or "diffusers folder"
    m.base_path = path
    m.base_name = path:gsub("/+$", ""):match("([^/]+)$"):gsub("%.safetensors$", "")
  end
  m.label = "sdxl-" .. m.size
  m.title = m.base_name or (m.label .. " (trained by ckrun)") -- what the samples' parameters call the model
  m.channels = m.config.in_channels
  m.factor = 2 ^ (#m.config.block_out_channels - 1) -- the UNet's downsampling: latent sides are multiples of it
  m.pooled_dim = sdxl.pooled_dim(m.config)
  -- the text tokens a prompt has: CLIP's 77, or kohya's chunks joined (BOS, 75 a chunk, the last EOS)
  m.max_token_length = o["max-token-length"]
  m.tokens = m.max_token_length == 75 and sdxl.TOKENS or m.max_token_length + 2
  m.tokenizer, m.caption_fix = o.tokenizer, o["caption-fix"]
  m.seed = o.seed
  -- A LoRA on a randomly initialized base cannot learn epsilon prediction: the
  -- full-resolution levels of the UNet have no attention, so nothing adapted can
  -- pass the noise through. v-prediction's target holds the latents, which the
  -- adapters can learn; so a run without --weights defaults to v.
  m.prediction = o.prediction
  local lo, hi = o["min-timestep"], o["max-timestep"]
  if lo >= hi or hi > 1000 then
    error(string.format("--min-timestep and --max-timestep must satisfy 0 <= min < max <= 1000, got %d and %d", lo, hi))
  end
  if o["scale-v-pred-loss-like-noise-pred"] and m.prediction ~= "v" then
    error("--scale-v-pred-loss-like-noise-pred scales v-prediction's loss; this run predicts " .. m.prediction)
  end
  m.objective = {prediction = m.prediction, noise_offset = o["noise-offset"], ip_noise_gamma = o["ip-noise-gamma"],
                 min_timestep = lo, max_timestep = hi, min_snr_gamma = o["min-snr-gamma"],
                 debiased_estimation = o["debiased-estimation-loss"],
                 scale_v_pred_loss = o["scale-v-pred-loss-like-noise-pred"], seed = o.seed}
  m.objective_words = m.prediction .. "-prediction"
  local targets = o.targets
  if targets ~= "default" and targets ~= "kohya" then targets = require("ck.options").types.list(nil, targets) end
  m.targets, m.conv_rank, m.conv_alpha = targets, o["conv-rank"], o["conv-alpha"]
  return m
end

-- lora.attach's options: the trainer's (rank, alpha, dropout, loraplus_lr_ratio) and the family's
-- The blocks whose frozen weights --blocks-to-swap n streams: the last n of
-- the UNet's top-level blocks in the order the forward pass runs them
-- (down_blocks.0, ..., mid_block, up_blocks.0, ...; SDXL has 7), as kohya
-- swaps the last blocks of a transformer (sd-scripts has no block swap for
-- SDXL); n nil: every block (--offload weights). nil and the reason when the
-- UNet has fewer.
function F.swap_blocks(m, n)
  local levels, order = #m.config.block_out_channels, {}
  for i = 0, levels - 1 do order[#order + 1] = "down_blocks." .. i end
  order[#order + 1] = "mid_block"
  for i = 0, levels - 1 do order[#order + 1] = "up_blocks." .. i end
  n = n or #order
  if n > #order then
    return nil, string.format("%s has %d blocks (down_blocks.0-%d, mid_block, up_blocks.0-%d): at most %d", m.label,
      #order, levels - 1, levels - 1, #order)
  end
  local names = {}
  for i = #order - n + 1, #order do names[#names + 1] = order[i] end
  return names
end

function F.adapter(m, a)
  return {rank = a.rank, alpha = a.alpha, targets = m.targets, conv_rank = m.conv_rank, conv_alpha = m.conv_alpha,
          dropout = a.dropout, loraplus_lr_ratio = a.loraplus_lr_ratio}
end

-- " (convolutions N)" after "LoRA rank R" in the run's first line
function F.adapter_words(m)
  return m.conv_rank and string.format(" (convolutions %d)", m.conv_rank) or ""
end

-- The training step (ck.sdxl.training_step) for s = {batch, latent = {h, w},
-- lora = lora.attach's options or false, compile = g:compile's options}.
function F.build(m, s)
  return sdxl.training_step{
    config = m.config, batch = s.batch, latent = s.latent, tokens = m.tokens, lora = s.lora,
    objective = m.objective, compile = s.compile,
  }
end

-- The base model's UNet into params of p (by their diffusers names). Returns
-- the number of tensors loaded.
function F.load(m, p, params)
  return require("ck.checkpoint").load(p, "unet", m.base.unet, params)
end

-- The sample files' text tensors and their shapes, as the UNet takes them.
function F.text_shapes(m)
  return {{"prompt_embeds", {m.tokens, m.config.cross_attention_dim}}, {"pooled_prompt_embeds", {m.pooled_dim}}}
end

-- A set of cached samples (ck.data.latents; o as it takes them), the synthetic
-- set's text widths the UNet's.
function F.dataset(m, src, o)
  if not o.files then o.cross_attention_dim, o.pooled_dim = m.config.cross_attention_dim, m.pooled_dim end
  return data.latents(src, o)
end

-- what the run writes about the model in a state: a resumed run must match it
function F.settings(m)
  local t = m.targets
  return {conv_rank = m.conv_rank or 0, conv_alpha = m.conv_alpha or 0, prediction = m.prediction,
          targets = type(t) == "table" and table.concat(t, ",") or t}
end

-- The adapter as a file: kohya's names (default) or PEFT's (ck.lora.save).
function F.save_adapter(p, adapter, path, o)
  return lora.save(p, adapter, path, o)
end

---- the encoders: images and captions to the UNet's inputs (ck.encode)

local Encoders = {}
Encoders.__index = Encoders

-- Both text encoders and the VAE: a base model's, or the tiny random ones.
function F.encoders(m)
  local encode = require "ck.encode"
  local models = encode.models{base = m.base, seed = m.seed, tokenizer = m.tokenizer,
                               max_token_length = m.max_token_length, caption_fix = m.caption_fix}
  return setmetatable({m = m, models = models, tokens = models.tokens, encode = encode}, Encoders)
end

-- the encoders' widths must be the UNet's
function Encoders:check()
  local m, models = self.m, self.models
  local width = models.text_l.hidden_size + models.text_g.hidden_size
  if width ~= m.config.cross_attention_dim or models.text_g.projection_dim ~= m.pooled_dim then
    error(string.format("%s: the text encoders give %d channels and a pooled embedding of %d; the UNet takes %d and %d",
      m.base_path or "the tiny model", width, models.text_g.projection_dim, m.config.cross_attention_dim, m.pooled_dim))
  end
end

-- every image of plan encoded into the cache (encode.cache): the files and the memory bound
function Encoders:cache(plan, o)
  return self.encode.cache(plan, self.models, o)
end

-- both text encoders at n captions (share: a program whose weights they use)
function Encoders:text_program(n, share)
  return self.encode.text_program(self.models, n, share)
end

-- the captions' embeddings: the training program's inputs, {{name, values}, ...}
function Encoders:text(tp, captions)
  local pe, pooled = self.encode.encode_text(tp, self.models, captions)
  return {{"prompt_embeds", pe}, {"pooled_prompt_embeds", pooled}}
end

-- the VAE's encoder at w x h pixels
function Encoders:image_program(w, h, share)
  return self.encode.vae_program(self.models, w, h, share)
end

-- an image (s: its use, imagedata.sample's) into one row's inputs: its
-- latents, noise keyed by (seed, epoch, key), and SDXL's size conditioning
function Encoders:image(vp, image, s, key, seed, epoch)
  return {{"latents", self.encode.latents_of(vp, self.models, image, key, seed, epoch)}, {"time_ids", s.time_ids}}
end

---- samples while training (ck.sampling)

-- kohya's prompt file, each line checked (pipeline.read_prompts), with the
-- run's defaults: the resolution, 30 steps, CFG 7.5, the seed, the sampler
function F.prompts(m, path, o)
  local pipeline = require "ck.pipeline"
  return pipeline.read_prompts(path, {width = o.resolution, height = o.resolution, steps = 30, cfg = 7.5, seed = o.seed,
    sampler = pipeline.sampler_name(o["sample-sampler"]), config = m.config, prediction = m.prediction})
end

-- the sampler (ck.sampling's): o = {prompts, encoders, lora (lora.attach's
-- options or false), compile_opts, dir, stem}
function F.sampler(m, o)
  return require("ck.sampling").new{prompts = o.prompts, models = o.encoders.models, config = m.config,
    tokens = o.encoders.tokens, lora = o.lora, prediction = m.prediction, compile_opts = o.compile_opts,
    dir = o.dir, stem = o.stem, name = m.title}
end

return F
