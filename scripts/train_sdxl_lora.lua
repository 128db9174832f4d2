-- Train a LoRA adapter on an SDXL UNet with the diffusion objective on cached
-- latents and text embeddings; write it as .safetensors in kohya's naming (what
-- ComfyUI, A1111 and diffusers load) or diffusers/PEFT naming. With --full, train
-- every UNet parameter instead and write the UNet in diffusers key names, as
-- kohya's sdxl_train.py.
--
--   ckrun scripts/train_sdxl_lora.lua                      sdxl-tiny, synthetic data
--   ckrun scripts/train_sdxl_lora.lua --size full --data DIR --weights unet.safetensors
--   ckrun --plan --json scripts/train_sdxl_lora.lua --size full
--   ckrun --device cuda scripts/train_sdxl_lora.lua ...   on the GPU (the default where one is present)
--
--   ckrun scripts/train_sdxl_lora.lua --help              the options
local ck = require "ck"
local unet = require "ck.unet"
local lora = require "ck.lora"
local sdxl = require "ck.sdxl"
local data = require "ck.data"
local log = require "ck.log"
local policy = require "ck.policy"
local state = require "ck.state"
local optim = require "ck.optim"
local fit = require "ck.fit"

local options = require "ck.options"

local imagedata = require "ck.imagedata"
local ckpt = require "ck.checkpoint"

-- a base model (--pretrained-model-name-or-path) is SDXL-sized, as --size full
local function full_or_tiny(full, tiny)
  return function(v) if v.size == "full" or v["pretrained-model-name-or-path"] then return full end return tiny end
end
local spec = {
  about = "Train LoRA adapters (or, with --full, every parameter) of an SDXL UNet on cached latents.",
  -- the model and the data
  {"size", "choice", "tiny", "sdxl-tiny (8M parameters), sdxl-mid (SDXL at half width, 330M parameters) " ..
   "or the real SDXL UNet", choices = {"tiny", "mid", "full"}},
  {"data", "string", "synthetic", "a folder of images with captions (kohya's layout), a folder of .safetensors " ..
   "samples, or the synthetic set", arg = "DIR|synthetic"},
  {"pretrained-model-name-or-path", "string", nil, "the base model: an SDXL single-file checkpoint or a diffusers " ..
   "folder (UNet, VAE, text encoders, tokenizers)", arg = "PATH"},
  {"tokenizer", "string", nil, "CLIP's tokenizer for both encoders, in place of the base's folders: open_clip's " ..
   "bpe_simple_vocab_16e6.txt.gz, a tokenizer folder or a tokenizer.json", arg = "FILE|DIR"},
  {"caption-fix", "choice", "ftfy", "captions cleaned before tokenizing by ftfy's fix_text (as kohya's installs do) " ..
   "or not", choices = {"ftfy", "none"}},
  {"cache-latents-to-disk", "flag", false, "keep the encoded images on disk (ckrun always does: beside the images, " ..
   "or in --cache-dir)"},
  {"cache-dir", "string", nil, "where the encoded images go (default: beside the images)", arg = "DIR"},
  {"max-token-length", "integer", 75, "caption tokens: 75, or kohya's 150 or 225 (encoded in chunks of 75)",
   check = function(v) return v == 75 or v == 150 or v == 225 end, says = "must be 75, 150 or 225"},
  {"samples", "integer", 16, "the synthetic set's size", min = 1},
  {"weights", "string", nil, "the base UNet in diffusers key names (default: a seeded random base)", arg = "FILE"},
  {"resolution", "integer", full_or_tiny(1024, 256), "pixels per side (latents are 1/8 of it)", arg = "PX",
   shown = "1024 with --size full, else 256", check = function(v) return v % 64 == 0 end,
   says = "must be a multiple of 64 pixels"},
  {"batch", "integer", full_or_tiny(1, 2), "samples per step (auto: the largest whose plan fits the device's free memory)",
   min = 1, also = {"auto"}, shown = "1 with --size full, else 2"},
  {"steps", "integer", 300, "batches to train", min = 1},
  {"seed", "integer", 1, "the seed of weights, data, noise and timesteps", min = 0},
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
  {"val-every", "integer", 0, "validation loss every N steps (0: before and after only)", min = 0},
  -- the adapter
  {"full", "flag", false, "train every UNet parameter instead of an adapter and write the UNet"},
  {"rank", "integer", 4, "the adapters' rank", min = 1},
  {"alpha", "number", function(v) return v.rank end, "the adapters' alpha", shown = "the rank"},
  {"conv-rank", "integer", nil, "LoCon: adapt the resnets' 3x3 convolutions too, at this rank (default: none)",
   min = 1},
  {"conv-alpha", "number", function(v) return v["conv-rank"] end, "LoCon's alpha", shown = "--conv-rank"},
  {"network-dropout", "number", 0, "dropout on each adapter's lora_down output while training", min = 0, below = 1},
  {"loraplus-lr-ratio", "number", 1, "LoRA+: lora_up learns at X times the rate", above = 0},
  {"targets", "string", "default", "the adapted modules: default (to_q,to_k,to_v,to_out.0), kohya, or a list",
   arg = "default|kohya|a,b,c"},
  {"out", "string", function(v) return v.full and "out/unet.safetensors" or "out/lora.safetensors" end,
   "the file written", arg = "FILE", shown = "out/lora.safetensors, with --full out/unet.safetensors",
   check = options.file_to_write, says = options.FILE_TO_WRITE},
  {"lora-format", "choice", "kohya", "the adapter file's key names", choices = {"kohya", "peft"}},
  {"save-precision", "choice", "float", "the file's dtype (float: fp32)", choices = {"float", "fp32", "fp16", "bf16"}},
  {"save-lora-every", "integer", 0, "also write the adapter every N steps (OUT-stepNNNNNNNN.safetensors)", min = 0,
   says = "must be a whole number of steps"},
  -- the optimizer
  {"optimizer", "choice", "adamw", "AdamW, bitsandbytes' AdamW8bit or Lion", choices = {"adamw", "adamw8bit", "lion"}},
  {"lr", "number", 3e-3, "the learning rate"},
  {"weight-decay", "number", function(v) return v.optimizer == "lion" and 0 or 1e-2 end, "weight decay",
   shown = "1e-2, with lion 0"},
  {"fused-backward", "flag", false, "each update as soon as its gradient is complete (no global-norm clipping)"},
  {"shard-optimizer", "flag", false, "ZeRO stage 1 on several ranks: each parameter's optimizer state on one rank, " ..
   "which updates it and sends it to the others"},
  {"max-grad-norm", "number", function(v) return v["fused-backward"] and 0 or 1.0 end,
   "clip the gradients' global norm (0: no clipping)", min = 0, shown = "1.0, with --fused-backward 0"},
  {"gradient-accumulation-steps", "integer", 1, "update with the mean gradient of every N batches", min = 1,
   says = "must be a whole number >= 1"},
  {"lr-scheduler", "string", "constant", "diffusers' schedules: constant, constant_with_warmup, linear, cosine, " ..
   "cosine_with_restarts, polynomial", arg = "NAME"},
  {"lr-warmup-steps", "integer", 0, "updates of warmup", min = 0},
  {"lr-num-cycles", "number", nil, "cycles of cosine_with_restarts (default: the schedule's)"},
  {"lr-power", "number", nil, "the power of polynomial (default: the schedule's)"},
  -- memory
  {"checkpoint", "string", function() return ck.device == "cuda" and ck.device_memory() and "auto" or "none" end,
   "the checkpoint policy: none, diffusers, selective, sqrt_n, every_n:N, budget:SIZE|PCT%, blocks:PATTERN, " ..
   "auto[:SIZE] (none if the run fits the device's free memory or SIZE, else the least recompute that fits)",
   arg = "POLICY", shown = "auto on a CUDA device, else none"},
  {"fit-headroom", "number", 0.1, "with auto: the share of the free memory left out of the plan", min = 0, below = 1},
  {"mixed-precision", "choice", "no", "bf16 or fp16: activations, their gradients and frozen weights stored in 16 " ..
   "bits (fp16 with dynamic loss scaling); no: fp32", choices = {"no", "bf16", "fp16"}},
  {"storage", "choice", "fp32", "the same choice by its other name (fp32 is no)", choices = {"fp32", "bf16", "fp16"}},
  {"fp8-base", "flag", false, "the frozen base stored in fp8 e4m3"},
  -- training states and logs
  {"save-every", "integer", 0, "write a training state every N steps", min = 0},
  {"state-dir", "string", "out/state", "where training states go", arg = "DIR"},
  {"keep-states", "integer", 3, "training states kept", min = 1},
  {"resume", "flag-or-string", false, "continue from the latest state in DIR (default DIR: --state-dir)",
   arg = "[DIR]"},
  {"log-dir", "string", nil, "the run's log: metrics.jsonl and a TensorBoard event file (default: runs/<time>)",
   arg = "DIR"},
  {"log-every", "integer", 10, "gradient norms and memory every N steps, activation statistics every 5N", min = 1,
   says = "must be a positive number of steps"},
  {"log-async", "flag", false, "a writer thread writes the log"},
  -- sample images
  {"sample-every", "integer", 0, "render the sample prompts every N steps (0: never)", min = 0,
   says = "must be a whole number of steps"},
  {"sample-prompts", "string", nil, "kohya's prompt file: a prompt a line, with --n NEGATIVE --w --h --s STEPS " ..
   "--l CFG --d SEED --ss SAMPLER", arg = "FILE"},
  {"sample-sampler", "string", "ddim", "the samples' sampler: euler, euler_a, ddim, dpmpp_2m, dpmpp_2m_karras " ..
   "(or kohya's k_euler, k_euler_a, dpmsolver++)", arg = "NAME",
   check = function(v) return require("ck.pipeline").sampler_name(v) ~= nil end,
   says = "must be euler, euler_a, ddim, dpmpp_2m, dpmpp_2m_karras, k_euler, k_euler_a or dpmsolver++"},
  {"sample-at-first", "flag", false, "also render the sample prompts before the first step"},
  {"log-flush", "number", 1, "with --log-async: seconds between writes", above = 0},
}
-- the image dataset's options, kohya's names (ck.imagedata); --resolution is the one above
for _, opt in ipairs(imagedata.OPTIONS) do
  if opt[1] ~= "resolution" then spec[#spec + 1] = opt end
end
local o = options.parse(args, spec)
if not o then return end
-- --mixed-precision (kohya's and diffusers' name) and --storage name one choice
local precision = o["mixed-precision"]
if o:given("storage") then
  local as = o.storage == "fp32" and "no" or o.storage
  if o:given("mixed-precision") and as ~= precision then
    error(string.format("--mixed-precision %s and --storage %s differ (they name one choice): give one", precision,
      o.storage))
  end
  precision = as
end
if precision == "fp16" and o["fused-backward"] then
  error("--mixed-precision fp16 scales the loss and skips updates whose gradients overflow, which --fused-backward " ..
    "applies inside backward before all are checked: use bf16, or no --fused-backward")
end
-- the adapter's options, which --full (every parameter trained) does not take
local LORA_OPTIONS = {"rank", "alpha", "conv-rank", "conv-alpha", "network-dropout", "loraplus-lr-ratio", "targets",
                      "lora-format", "fp8-base"}
-- --full: every UNet parameter trained, the UNet written (as kohya's sdxl_train.py)
local full = o.full
for _, name in ipairs(full and LORA_OPTIONS or {}) do
  if o:given(name) then error("--" .. name .. " is an adapter's option; --full trains every parameter") end
end

-- data parallel: the ranks of an mpirun job (ckrun --plan --world-size N
-- plans one rank of N), each training its share of every global batch of
-- --batch times N samples (as torch's DistributedSampler splits it); rank 0
-- alone writes the logs, the adapter, the states and the samples
local world = ck.plan_mode and (ck.plan_world_size or 1) or ck.world_size()
local dp_rank = ck.plan_mode and 0 or ck.rank()
if dp_rank > 0 then print = function() end end -- rank 0 speaks for the job
if o["shard-optimizer"] and world < 2 then
  error("--shard-optimizer splits the optimizer state over the ranks of an mpirun job (or --plan --world-size N): " ..
    "this run has one")
end
-- a state between two updates holds the gradient sums so far, which on
-- several ranks are each rank's own part until the update sums them: rank 0's
-- alone would resume wrong
if world > 1 and o["save-every"] > 0 and o["save-every"] % o["gradient-accumulation-steps"] ~= 0 then
  error(string.format("--save-every %d on %d ranks must be a multiple of --gradient-accumulation-steps %d: a state " ..
    "between two updates would hold rank 0's part of the gradient sums alone", o["save-every"], world,
    o["gradient-accumulation-steps"]))
end
if world > 1 then
  for _, name in ipairs{"fused-backward"} do
    if o:given(name) and o[name] ~= false and o[name] ~= 0 then
      error(string.format("--%s is not supported on several ranks yet (this job has %d)", name, world))
    end
  end
end

-- one run at a time in a state directory: a second one saving or pruning there
-- would break the first's renames, so it stops here, before anything runs
local save_every, state_dir = o["save-every"], o["state-dir"]
if not ck.plan_mode and dp_rank == 0 then
  if save_every > 0 then state.lock(state_dir) end
  local from = o.resume == true and state_dir or o.resume
  if from and ck.listdir(from) then state.lock(from) end -- a missing one is refused below: no saved state
end

local size = o.size
local config = unet.config(({tiny = "sdxl-tiny", mid = "sdxl-mid", full = "sdxl"})[size])
-- the base model as users have it: a single-file SDXL checkpoint or a
-- diffusers folder (its unet/config.json builds the UNet)
local base_path = o["pretrained-model-name-or-path"]
local base
if base_path then
  if o.weights then error("--weights and --pretrained-model-name-or-path both give the base UNet: give one") end
  if o:given("size") then error("--size picks a random base; --pretrained-model-name-or-path gives the model") end
  base = ckpt.open(base_path)
  config = base.unet_config and ckpt.unet_config(base.unet_config, base_path .. "/unet/config.json")
    or unet.config("sdxl")
  size = base.kind == "single" and "single file" or "diffusers folder"
end
local resolution = o.resolution
local latent = resolution // 8
local batch = o.batch
local steps = o.steps
local seed = o.seed
local rank = o.rank
local alpha = o.alpha
local conv_rank = o["conv-rank"]
local conv_alpha = o["conv-alpha"]
local network_dropout, loraplus = o["network-dropout"], o["loraplus-lr-ratio"]
local targets = o.targets
if targets ~= "default" and targets ~= "kohya" then targets = options.types.list(nil, targets) end
local format = o["lora-format"]
-- the adapter file's dtype, as kohya's --save_precision
local save_dtype = ({float = "F32", fp32 = "F32", fp16 = "F16", bf16 = "BF16"})[o["save-precision"]]
local out = o.out
local lr = o.lr
local lr_scheduler, lr_warmup = o["lr-scheduler"], o["lr-warmup-steps"]
local optimizer = o.optimizer
local weight_decay = o["weight-decay"]
local accumulate = o["gradient-accumulation-steps"]
-- each update as soon as its gradient is complete (kohya's --fused_backward_pass):
-- no global-norm clipping then, unless asked (which compile refuses)
local fused_backward = o["fused-backward"]
local max_grad_norm = o["max-grad-norm"]
-- the rate of optimizer update k (0 for the first); --steps batches make steps // accumulate updates
local lr_at = optim.schedule{name = lr_scheduler, lr = lr, steps = math.max(1, steps // accumulate), warmup = lr_warmup,
                             cycles = o["lr-num-cycles"], power = o["lr-power"]}
-- A LoRA on a randomly initialized base cannot learn epsilon prediction: the
-- full-resolution levels of the UNet have no attention, so nothing adapted can
-- pass the noise through. v-prediction's target holds the latents, which the
-- adapters can learn; so a run without --weights defaults to v.
local prediction = o.prediction
local noise_offset, ip_noise_gamma, min_snr_gamma = o["noise-offset"], o["ip-noise-gamma"], o["min-snr-gamma"]
local min_timestep, max_timestep = o["min-timestep"], o["max-timestep"]
if min_timestep >= max_timestep or max_timestep > 1000 then
  error(string.format("--min-timestep and --max-timestep must satisfy 0 <= min < max <= 1000, got %d and %d",
    min_timestep, max_timestep))
end
local debiased = o["debiased-estimation-loss"]
local scale_v_pred = o["scale-v-pred-loss-like-noise-pred"]
if scale_v_pred and prediction ~= "v" then
  error("--scale-v-pred-loss-like-noise-pred scales v-prediction's loss; this run predicts " .. prediction)
end
local pooled_dim = sdxl.pooled_dim(config)
-- the text tokens a prompt has: CLIP's 77, or kohya's chunks joined (BOS, 75 a chunk, the last EOS)
local max_token_length = o["max-token-length"]
local tokens = max_token_length == 75 and sdxl.TOKENS or max_token_length + 2

-- sample images (kohya's --sample_every_n_steps, --sample_prompts): the prompt
-- file read now, so that a bad line stops the run before anything is made
local sample_every = o["sample-every"]
local sample_prompts
if o["sample-prompts"] then
  if sample_every == 0 and not o["sample-at-first"] then
    error("--sample-prompts renders at --sample-every N steps or with --sample-at-first: give one")
  end
  sample_prompts = require("ck.pipeline").read_prompts(o["sample-prompts"], {width = resolution, height = resolution,
    steps = 30, cfg = 7.5, seed = seed, sampler = require("ck.pipeline").sampler_name(o["sample-sampler"]),
    config = config, prediction = prediction})
elseif sample_every > 0 or o["sample-at-first"] then
  error("--sample-every and --sample-at-first render the prompts of --sample-prompts FILE: give it")
end

local checkpoint = policy.parse(o.checkpoint) -- auto is chosen below, once build is defined
-- the frozen base in fp8 (e4m3, as kohya's --fp8_base): a quarter of fp32's bytes
local fp8_base = o["fp8-base"]

-- what the logger will compute on its logging steps, planned into the arena
local log_every = o["log-every"]
local log_stats = log.stats_request{every = log_every, blocks = log.unet_blocks}

-- The model, its adapters, the objective and the compiled program for one
-- batch size and checkpoint policy (plan_only: nothing allocated), at latents
-- of shape {h, w} (default: the resolution's); share: a program whose weights,
-- optimizer state and counters this one uses (another bucket's).
local function build(batch, checkpoint, plan_only, shape, share)
  return sdxl.training_step{
    config = config, batch = batch, latent = shape or {latent, latent}, tokens = tokens,
    lora = not full and {rank = rank, alpha = alpha, targets = targets, conv_rank = conv_rank, conv_alpha = conv_alpha,
                         dropout = network_dropout, loraplus_lr_ratio = loraplus},
    objective = {prediction = prediction, noise_offset = noise_offset, ip_noise_gamma = ip_noise_gamma,
                 min_timestep = min_timestep, max_timestep = max_timestep, min_snr_gamma = min_snr_gamma,
                 debiased_estimation = debiased, scale_v_pred_loss = scale_v_pred,
                 seed = seed},
    compile = {optimizer = optimizer, lr = lr, weight_decay = weight_decay, seed = seed, checkpoint = checkpoint,
               plan_only = plan_only, precision = precision, frozen = fp8_base and "fp8" or nil,
               max_grad_norm = max_grad_norm, accumulate = accumulate, fused_backward = fused_backward,
               stats = log_stats, share = share, world_size = world,
               shard_optimizer = o["shard-optimizer"] or nil},
  }
end

-- the samples' programs (ck.sampling), with the encoders they need: a base
-- model's, or the tiny random ones
local sampler, models
if sample_prompts and dp_rank == 0 then -- rank 0 renders the job's samples
  models = require("ck.encode").models{base = base, seed = seed, tokenizer = o.tokenizer,
                                       max_token_length = max_token_length, caption_fix = o["caption-fix"]}
  sampler = require("ck.sampling").new{prompts = sample_prompts, models = models, config = config,
    tokens = models.tokens,
    lora = not full and {rank = rank, alpha = alpha, targets = targets, conv_rank = conv_rank, conv_alpha = conv_alpha,
                         dropout = network_dropout, loraplus_lr_ratio = loraplus},
    prediction = prediction, compile_opts = {precision = precision, frozen = fp8_base and "fp8" or nil, seed = seed},
    dir = (out:match("^(.*)/[^/]*$") or ".") .. "/samples", stem = out:match("([^/]+)$"):gsub("%.safetensors$", ""),
    name = base_path and base_path:gsub("/+$", ""):match("([^/]+)$"):gsub("%.safetensors$", "") or
      ("sdxl-" .. size .. " (trained by ckrun)")}
end

-- --checkpoint auto, --batch auto: the cheapest policy (and the largest batch)
-- whose whole-run plan fits the device's free memory (sampling's programs
-- included: they share the arena), said in one line
local fit_reason
if checkpoint.kind == "auto" or batch == "auto" then
  local function planned(b, pol)
    local pp = build(b, pol, true).program
    if sampler then sampler:programs_for(pp, true) end -- the group's arena grows to them
    return pp
  end
  local c = fit.choose{build = planned, checkpoint = checkpoint,
                       batch = batch, headroom = o["fit-headroom"]}
  checkpoint, batch, fit_reason = c.checkpoint, c.batch, c.reason
  if not ck.plan_mode then print(fit_reason) end
end

-- the data; samples of several latent shapes are aspect-ratio buckets, each
-- trained by a program of its own (at each batch size its batches have), all
-- compiled before the first step and sharing one set of weights
local dataset
local shapes, sizes = {{config.in_channels, latent, latent}}, {{batch * world}} -- the global batches' sizes
-- a folder of images: encoded once into the cache (the VAE and both text
-- encoders as programs of their own, closed before the UNet's are made), or
-- with caption augmentation the latents alone, the captions encoded at each step
local encode = require "ck.encode"
-- --plan reads a data folder only where there is one (a plan sized from a laptop needs none)
local data_here = o.data ~= "synthetic" and (not ck.plan_mode or ck.listdir(o.data) ~= nil)
local images = data_here and encode.is_image_folder(o.data)
local caption_aug = o["shuffle-caption"] or o["caption-dropout-rate"] > 0 or o["caption-tag-dropout-rate"] > 0
-- --random-crop: a crop drawn at each use cannot be cached, so the VAE runs
-- at each step too (as kohya's sd-scripts without latent caching)
local random_crop = images and o["random-crop"]
local captions, entries, encode_bound, text_runs
local vae_runs = {}
local settings_img
if images then
  local io_opts = {resolution = {tostring(resolution)}}
  for _, opt in ipairs(imagedata.OPTIONS) do
    if opt[1] ~= "resolution" then io_opts[opt[1]] = o[opt[1]] end
  end
  settings_img = imagedata.settings(io_opts)
  local set = imagedata.scan(o.data, settings_img.scan)
  local plan = imagedata.assign(set, imagedata.buckets(settings_img.buckets))
  models = models or encode.models{base = base, seed = seed, tokenizer = o.tokenizer, max_token_length = max_token_length,
                                   caption_fix = o["caption-fix"]}
  tokens = models.tokens
  -- the encoders' widths must be the UNet's
  local width = models.text_l.hidden_size + models.text_g.hidden_size
  if width ~= config.cross_attention_dim or models.text_g.projection_dim ~= pooled_dim then
    error(string.format("%s: the text encoders give %d channels and a pooled embedding of %d; the UNet takes %d and %d",
      base_path or "the tiny model", width, models.text_g.projection_dim, config.cross_attention_dim, pooled_dim))
  end
  local files
  if ck.plan_mode or random_crop then
    files = nil -- --random-crop: each use's crop encoded at its step, nothing cached
  else
    files, encode_bound = encode.cache(plan, models, {cache_dir = o["cache-dir"] or set.dir, seed = seed,
      flip_aug = o["flip-aug"], random_crop = o["random-crop"], progress = true, text = not caption_aug})
  end
  -- each image as often as its folder repeats it, with its caption
  local list, caps, shp = {}, {}, {}
  entries = {}
  for i, e in ipairs(plan.items) do
    for _ = 1, e.repeats do
      list[#list + 1] = files and files[i] or false
      caps[#caps + 1] = e.caption
      entries[#entries + 1] = e
      shp[#shp + 1] = {config.in_channels, e.bucket[2] // 8, e.bucket[1] // 8}
    end
  end
  captions = caps
  if files then
    dataset = data.latents(o.data, {files = list, batch = batch * world, seed = seed, timesteps = 1000, flip_aug = o["flip-aug"],
                                    text = not caption_aug})
  else -- --plan, --random-crop: the buckets from the images' headers, nothing cached
    dataset = data.shapes_only(shp, {batch = batch * world, seed = seed})
  end
elseif not ck.plan_mode or data_here then
  dataset = data.latents(o.data, {batch = batch * world, seed = seed, n = o.samples, timesteps = 1000,
    height = latent, width = latent, cross_attention_dim = config.cross_attention_dim, pooled_dim = pooled_dim})
end
if dataset then shapes, sizes = dataset:bucket_shapes() end
do -- the data must fit the model
  local s, source = {}, nil
  if dataset and not images then s, source = dataset:shapes() end
  local want = {prompt_embeds = {tokens, config.cross_attention_dim}, pooled_prompt_embeds = {pooled_dim}}
  for name, shape in pairs(dataset and not images and want or {}) do
    if table.concat(s[name], ",") ~= table.concat(shape, ",") then
      error(string.format("%s: tensor '%s' has shape [%s], the model expects [%s]", source, name,
        table.concat(s[name], ", "), table.concat(shape, ", ")))
    end
  end
  -- latents: the model's channels; sides the UNet's downsampling divides; no
  -- more latent pixels than --resolution gives
  local factor = 2 ^ (#config.block_out_channels - 1)
  for k, sh in ipairs(shapes) do
    local where = dataset and dataset.buckets and dataset.files[dataset.buckets[k].members[1]] or source
    if #sh ~= 3 or sh[1] ~= config.in_channels or sh[2] % factor ~= 0 or sh[3] % factor ~= 0 or
       sh[2] * sh[3] > latent * latent then
      error(string.format("%s: tensor 'latents' has shape [%s], the model expects [%d, H, W] with H and W " ..
        "multiples of %d and H x W at most %d x %d (--resolution %d)", where, table.concat(sh, ", "), config.in_channels,
        factor, latent, latent, resolution))
    end
  end
end

-- the sample prompts through both text encoders, once, before the training
-- programs exist
if sampler and not ck.plan_mode then
  local b = sampler:encode()
  if b and (not encode_bound or b > encode_bound) then encode_bound = b end
end

local memory = require "ck.memory"
local device_before = not ck.plan_mode and memory.device_used() or nil -- a GPU's memory in use before the program
-- each rank takes positions rank, rank + world, ... of a global batch of n:
-- the number of them rank r has
local function share_count(n, r) return n > r and (n - 1 - r) // world + 1 or 0 end
-- the batch sizes of the programs a global batch of n needs on any rank, the
-- largest first (every rank compiles them all, so the ranks' programs and
-- plans are alike); a rank without a sample of a short batch runs one
-- padding row, weighted 0
local function rank_sizes(n)
  local t, seen = {}, {}
  for r = 0, world - 1 do
    local m = math.max(1, share_count(n, r))
    if not seen[m] then seen[m], t[#t + 1] = true, m end
  end
  return t
end
local run = build(rank_sizes(sizes[1][1])[1], checkpoint, ck.plan_mode, {shapes[1][2], shapes[1][3]})
local adapter, objective, inputs, p, g = run.adapter, run.objective, run.inputs, run.program, run.graph
-- every bucket's program at every batch size a rank's share of its batches
-- has: runs[k][m]
local runs = {[1] = {[rank_sizes(sizes[1][1])[1]] = run}}
local function run_for(k, m)
  runs[k] = runs[k] or {}
  if not runs[k][m] then runs[k][m] = build(m, checkpoint, ck.plan_mode, {shapes[k][2], shapes[k][3]}, p) end
  return runs[k][m]
end
local nprograms = 0
local program_sizes = {} -- per bucket, the batch sizes of its programs
for k = 1, #shapes do
  local seen = {}
  program_sizes[k] = {}
  for _, n in ipairs(sizes[k]) do
    for _, m in ipairs(rank_sizes(n)) do
      if not seen[m] then
        seen[m] = true
        run_for(k, m)
        program_sizes[k][#program_sizes[k] + 1] = m
        nprograms = nprograms + 1
      end
    end
  end
end
-- with caption augmentation, both text encoders at each batch size, sharing
-- one copy of their weights: a batch's captions are made and encoded at each step
text_runs = {}
if (caption_aug or random_crop) and images and not ck.plan_mode then
  local first
  for k = 1, #shapes do
    for _, n in ipairs(program_sizes[k]) do
      if not text_runs[n] then
        text_runs[n] = encode.text_program(models, n, first and first.program or nil)
        first = first or text_runs[n]
      end
    end
  end
end
-- with --random-crop, the VAE's encoder at each bucket (batch 1: one image at
-- a time), sharing one copy of its weights
if random_crop and not ck.plan_mode then
  local first
  for k = 1, #shapes do
    local key = shapes[k][3] * 8 .. "x" .. shapes[k][2] * 8
    vae_runs[key] = encode.vae_program(models, shapes[k][3] * 8, shapes[k][2] * 8, first and first.program or nil)
    first = first or vae_runs[key]
  end
end
-- the position in the epoch of the b-th of samples idx: on a data-parallel
-- rank (rows: their rows in the global batch of n, 0-based) the global
-- batch's, so that each sample's draws are those one process makes
local function use_of(idx, b, rows, n)
  if rows then return dataset.pos - n + rows[b] + 1 end
  return dataset.pos - #idx + b
end
-- the latents and time ids of samples idx into r's inputs, encoded now: each
-- use's crop (random, or centered for validation) and flip (--flip-aug)
local function set_latents(r, idx, augment, rows, n)
  if not random_crop then return end
  for b, i in ipairs(idx) do
    local e = entries[i]
    local use = use_of(idx, b, rows, n)
    local s = imagedata.sample(e, {random_crop = augment, flip_aug = augment and o["flip-aug"], seed = seed,
                                   epoch = dataset.epoch, index = use})
    local vp = vae_runs[e.bucket[1] .. "x" .. e.bucket[2]]
    local lat = encode.latents_of(vp, models, ck.image_load(e.path, {resize = e.resized, crop = s.crop, flip = s.flip}),
      0x7AF0 + use, seed, dataset.epoch)
    r.program:set(r.inputs.latents, lat, b)
    r.program:set(r.inputs.time_ids, s.time_ids, b)
  end
end
-- the text embeddings of samples idx into r's inputs: each caption as this
-- use makes it (augment: shuffled, tags dropped, as ck.imagedata.caption), or as written
local function set_text(r, idx, augment, rows, n)
  if not next(text_runs) then return end -- the text is in the samples
  if not text_runs[#idx] then -- a batch size compiled on first use (sharing the weights)
    local _, any = next(text_runs)
    text_runs[#idx] = encode.text_program(models, #idx, any.program)
  end
  local caps = {}
  for b, i in ipairs(idx) do
    if augment then
      local c = {}
      for k, v in pairs(settings_img.caption) do c[k] = v end
      c.seed, c.epoch, c.index = seed, dataset.epoch, use_of(idx, b, rows, n)
      caps[b] = imagedata.caption(captions[i], c)
    else
      caps[b] = captions[i]
    end
  end
  local pe, pooled = encode.encode_text(text_runs[#idx], models, caps)
  r.program:set(r.inputs.prompt_embeds, pe)
  r.program:set(r.inputs.pooled_prompt_embeds, pooled)
end
-- the sampling programs, in the training programs' group: the arena grows
-- to the largest of them all, before the first step
if sampler then sampler:compile(p, ck.plan_mode) end
local bucket_lines = {}
if #shapes > 1 then
  for k, sh in ipairs(shapes) do
    for _, n in ipairs(program_sizes[k]) do
      local pl = runs[k][n].program:plan()
      bucket_lines[#bucket_lines + 1] = string.format("bucket %dx%d (latents %dx%d), batch %d: %s", sh[3] * 8, sh[2] * 8,
        sh[3], sh[2], n, require("ck.plan").fmt_bytes(pl.arena))
    end
  end
  if not ck.plan_mode then
    print(string.format("%d buckets, %d programs sharing one copy of the weights: %s arena (the largest bucket's)",
      #shapes, nprograms, require("ck.plan").fmt_bytes(p:plan().group_arena)))
    for _, l in ipairs(bucket_lines) do print("  " .. l) end
  end
end
local all_count, trainable_count = g:param_count()
local param_count = all_count - (adapter and adapter.param_count() or 0) -- the UNet's own parameters

if ck.plan_mode then
  local info = {
    {"script", "train_sdxl_lora"}, {"size", size}, {"resolution", resolution}, {"batch", batch},
    {"param_count", param_count}, {"trainable_param_count", trainable_count},
  }
  if adapter then
    info[#info + 1] = {"lora_param_count", adapter.param_count()}
    info[#info + 1] = {"lora_modules", #adapter.paths}
  end
  if fit_reason then info[#info + 1] = {"fit", fit_reason} end
  if world > 1 then -- one rank of the job: its share of the batch, the gradient sums its buckets hold
    local pl = p:plan()
    info[#info + 1] = {"world_size", world}
    info[#info + 1] = {"rank_batch", rank_sizes(sizes[1][1])[1]}
    info[#info + 1] = {"buckets", pl.buckets}
    info[#info + 1] = {"bucket_bytes", pl.bucket_bytes}
    if o["shard-optimizer"] then info[#info + 1] = {"shard_optimizer", "rank 0 of " .. world} end
  end
  if sampler then -- sampling's programs share the arena: the run's is the larger of training and sampling
    info[#info + 1] = {"sample_prompts", #sample_prompts}
    for _, kv in ipairs(sampler:plan_info(require("ck.plan").fmt_bytes)) do info[#info + 1] = kv end
  end
  if #shapes > 1 then -- every bucket's program, planned into one arena (the largest of them)
    info[#info + 1] = {"buckets", #shapes}
    info[#info + 1] = {"bucket_programs", nprograms}
    info[#info + 1] = {"group_arena", p:plan().group_arena}
    for k, l in ipairs(bucket_lines) do info[#info + 1] = {"bucket_program_" .. k, l} end
  end
  require("ck.plan").report{
    info = info,
    program = p,
    checkpoint = checkpoint,
    batch = batch,
    build = function(b, pol) return build(b, pol, true).program end,
  }
  return
end

-- base weights: by diffusers key, shape-checked; otherwise the seeded init
if o.weights then
  local t0 = ck.now()
  local f <close> = ck.safetensors(o.weights)
  local map, n = {}, 0
  for _, t in ipairs(g:params()) do
    if t.kind == "frozen" or full then map[t.name], n = t.name, n + 1 end -- the base: frozen, or trained with --full
  end
  p:load(f, map)
  print(string.format("loaded %d tensors from %s in %.2f s", n, o.weights, ck.now() - t0))
elseif base then
  local t0 = ck.now()
  local params = {}
  for _, t in ipairs(g:params()) do
    if t.kind == "frozen" or full then params[#params + 1] = t end
  end
  local n = ckpt.load(p, "unet", base.unet, params)
  print(string.format("loaded %d UNet tensors from %s in %.2f s", n, base_path, ck.now() - t0))
end


-- fixed validation batches: the first samples in file order, fixed noise and timesteps
local val_every = o["val-every"]
-- this rank's samples of a global batch (positions rank, rank + world, ...),
-- their rows in it (0-based: what its noise and timesteps are keyed by), and
-- the weight of its loss: its share of the batch's rows times world, as the
-- update takes the mean over the ranks, so that a batch that does not split
-- evenly trains as one process does; a rank without a sample runs the
-- batch's first as a padding row, weighted 0
local function share_of(idx)
  if world == 1 then return idx, nil, nil end
  local mine, rows = {}, {}
  for at = dp_rank + 1, #idx, world do
    mine[#mine + 1] = idx[at]
    rows[#rows + 1] = at - 1
  end
  if #mine == 0 then return {idx[1]}, {0}, 0 end
  return mine, rows, world * #mine / #idx
end
local function validate()
  local vb = dataset:validation_batches(2)
  local total = 0
  for v, b in ipairs(vb) do
    local mine, rows, weight = share_of(b.idx)
    local r = run_for(b.bucket, #mine)
    r.program.training = false -- no dropout
    local given = dataset:load(r.program, r.inputs, mine, true, rows)
    set_latents(r, mine, false, rows, #b.idx)
    set_text(r, mine, false, rows, #b.idx)
    given.eval = true
    given.rows, given.weight_scale = rows, weight
    r.objective:prepare(r.program, given, -v)
    total = total + r.program:forward()
    r.program.training = true
  end
  if world > 1 then total = ck.allreduce({total})[1] / world end -- the mean of the ranks' shares
  return total / #vb
end

-- every rank must train the same thing: its script, options, program and
-- starting weights are compared with rank 0's before the first step
if world > 1 then
  local parts = {ck.json_encode(args), tostring(world), tostring(p:plan().ops), tostring(p:plan().persistent)}
  for _, t in ipairs(g:params()) do
    if t.kind == "param" then parts[#parts + 1] = t.name .. "=" .. p:checksum(t.name) end
  end
  local same, other = ck.same_on_all_ranks(table.concat(parts, "\n"))
  if not same then
    error(string.format("rank %d's script, options or weights differ from rank 0's: every rank of a job must run " ..
      "the same training", other))
  end
end
print(string.format("training %s of sdxl-%s (%d parameters, %d trainable), %dx%d, batch %d, %d steps, %s-prediction",
  full and "every parameter" or string.format("LoRA rank %d%s on %d modules", rank,
    conv_rank and string.format(" (convolutions %d)", conv_rank) or "", #adapter.paths),
  size, param_count, trainable_count, resolution, resolution, batch, steps, prediction))
local val_before = validate()
if val_every > 0 then print(string.format("step 0: validation loss %.4f", val_before)) end
-- resume: the saved step, adapter, optimizer state and data position
local save_lora_every = o["save-lora-every"]

-- the adapter as a file (with --full, the UNet in diffusers key names), its
-- metadata saying how far training went
local function save_lora(path, at_step)
  if dp_rank > 0 then return end -- rank 0 writes the job's files
  local d = path:match("^(.*)/[^/]*$")
  if d and d ~= "" then assert(ck.mkdir(d)) end
  local meta = {
    ss_learning_rate = tostring(lr), ss_max_train_steps = tostring(steps), ss_steps = tostring(at_step),
    ss_seed = tostring(seed), ss_lr_scheduler = lr_scheduler, ss_lr_warmup_steps = tostring(lr_warmup),
    ss_max_grad_norm = tostring(max_grad_norm), ss_gradient_accumulation_steps = tostring(accumulate),
    ss_optimizer = ({lion = "lion_pytorch.lion_pytorch.Lion", adamw8bit = "bitsandbytes.optim.adamw.AdamW8bit"})[optimizer]
      or "torch.optim.adamw.AdamW",
    ss_resolution = string.format("(%d, %d)", resolution, resolution),
    ss_gradient_checkpointing = policy.name(checkpoint) == "none" and "False" or "True",
    ss_fp8_base = fp8_base and "True" or "False", ss_mixed_precision = precision,
    ss_training_comment = "trained with ckrun " .. ck.version,
  }
  -- peft: the folder's adapter_config.json and adapter_model.safetensors are the final adapter's, not a snapshot's
  if not full then
    return lora.save(p, adapter, path, {format = format, dtype = save_dtype, metadata = meta, peft_folder = path == out})
  end
  local entries = {}
  for _, t in ipairs(g:params()) do entries[#entries + 1] = {t.name, t.name} end
  meta.format = "pt"
  p:save(path, entries, {metadata = meta, dtype = save_dtype})
end
local settings = {size = size, resolution = resolution, batch = batch * world, -- the global batch: a job of other ranks resumes it
                  rank = rank, alpha = alpha, seed = seed,
                  full = full,
                  conv_rank = conv_rank or 0, conv_alpha = conv_alpha or 0, network_dropout = network_dropout,
                  loraplus_lr_ratio = loraplus,
                  prediction = prediction, lr = lr, targets = type(targets) == "table" and table.concat(targets, ",") or targets,
                  lr_scheduler = lr_scheduler, lr_warmup_steps = lr_warmup, max_grad_norm = max_grad_norm,
                  gradient_accumulation_steps = accumulate, optimizer = optimizer, weight_decay = weight_decay,
                  fp8_base = fp8_base}
local resumed_log_dir
if o.resume then
  local from = o.resume == true and state_dir or o.resume
  local path = state.latest(from) or error("--resume: no saved state in '" .. tostring(from) .. "'")
  local meta = state.load(p, path, settings)
  resumed_log_dir = meta["log.dir"]
  if dp_rank == 0 then state.prune(from, o["keep-states"]) end
  -- the data position, read from the file: an epoch is at least one step, and
  -- a position within the epoch at most the set's size
  dataset.epoch = state.count(meta, "data.epoch", path, 0, p.steps)
  dataset.pos = state.count(meta, "data.pos", path, 0, dataset.n)
  dataset:shuffle()
  print(string.format("resumed from %s at step %d", path, p.steps))
end
local start = p.steps + 1

-- a resumed run continues the log it had (without the steps after its state)
local log_dir = dp_rank == 0 and (o["log-dir"] or resumed_log_dir or log.run_dir("runs")) or nil
if start > 1 and log_dir then log.rewind(log_dir, start - 1) end
local logger <close> = log.new{dir = log_dir, every = log_every, async = o["log-async"],
  flush_interval = o["log-flush"], steps = steps, batch = batch * world, blocks = log.unet_blocks, on_nonfinite = "stop",
  stop_note = "nothing was saved", world = world, progress = dp_rank == 0}
if start == 1 then logger:write{step = 0, val_loss = val_before} end
if fit_reason then logger:write{step = start - 1, checkpoint = policy.name(checkpoint), batch = batch, fit = fit_reason} end
-- the samples: each rendering's time logged beside the steps' (sample_time)
local function render(step)
  if sampler then
    local secs, files = sampler:render(step, logger)
    logger:print(string.format("step %d: %d sample%s in %.1f s (%s)", step, #files, #files == 1 and "" or "s", secs,
      sampler.dir))
  end
  if world > 1 then -- the other ranks wait for rank 0's samples: up to an hour, then the job ends
    local t = ck.dist_timeout()
    ck.dist_timeout(math.max(t, 3600))
    ck.barrier()
    ck.dist_timeout(t)
  end
end
if sample_prompts and o["sample-at-first"] and start == 1 then render(0) end
local first, window, recent, step_time = nil, {}, 0, 0
for step = start, steps do
  local t0 = ck.now()
  local idx, k = dataset:next_indices()
  local mine, rows, weight = share_of(idx)
  local r = run_for(k, #mine)
  local given = dataset:load(r.program, r.inputs, mine, false, rows)
  set_latents(r, mine, true, rows, #idx)
  set_text(r, mine, true, rows, #idx)
  given.rows, given.weight_scale = rows, weight
  r.objective:prepare(r.program, given)
  -- a non-finite loss or gradient stops the run here, naming the step and the op
  local l = logger:step(r.program, {lr = lr_at(p.updates)})
  if step > start then step_time = step_time + (ck.now() - t0) end
  first = first or l
  window[#window + 1] = l
  recent = recent + l
  if #window > 20 then recent = recent - table.remove(window, 1) end
  if val_every > 0 and step % val_every == 0 then
    local v = validate()
    logger:write{step = step, val_loss = v}
    logger:print(string.format("step %d: validation loss %.4f", step, v))
  end
  if sample_prompts and sample_every > 0 and step % sample_every == 0 then render(step) end
  if save_lora_every > 0 and step % save_lora_every == 0 and step < steps then
    local path = (out:gsub("%.safetensors$", "")) .. string.format("-step%08d.safetensors", step)
    save_lora(path, step)
    logger:print("wrote " .. path)
  end
  if save_every > 0 and step % save_every == 0 and step < steps then
    local meta = {["data.epoch"] = dataset.epoch, ["data.pos"] = dataset.pos, ["log.dir"] = log_dir}
    for k, v in pairs(settings) do meta[k] = v end
    logger:flush(true) -- the log holds every step the state holds
    if world > 1 then ck.barrier() end -- every rank has finished the step the state holds
    state.save(p, state_dir, meta, o["keep-states"]) -- rank 0 writes it; with ZeRO-1 the others send their shares
  end
end
if steps > start then
  print(string.format("step time: %.1f ms (mean of steps %d-%d, data loading included)", 1e3 * step_time / (steps - start),
    start + 1, steps))
end
if first then
  print(string.format("training loss: first step %.4f, mean of the last %d steps %.4f", first, #window, recent / #window))
end
local val_after = validate()
logger:write{step = p.steps, val_loss = val_after}
print(string.format("validation loss (fixed batches): before %.4f, after %.4f", val_before, val_after))
logger:close()
if log_dir then print("wrote logs to " .. log_dir) end

save_lora(out, p.steps)
print("wrote " .. out)
-- the whole run's memory against the plan's bound (README, "Memory outside the plan")
local all = {p} -- every program the run holds: the buckets', the text encoders'
for _, byn in pairs(runs) do for _, rr in pairs(byn) do if rr.program ~= p then all[#all + 1] = rr.program end end end
for _, tr in pairs(text_runs) do all[#all + 1] = tr.program end
for _, vr in pairs(vae_runs) do all[#all + 1] = vr.program end
for _, sp in ipairs(sampler and sampler:programs() or {}) do all[#all + 1] = sp end
print(memory.summary(p, device_before, all, encode_bound))
