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
-- Options: --size tiny|full, --data DIR|synthetic, --weights FILE, --resolution PX, --full
-- (every parameter trained; the adapter's options below are refused; --out defaults to
-- out/unet.safetensors), --fused-backward (each update as soon as its gradient is complete),
-- --batch N, --steps N (batches), --rank N, --alpha X, --targets default|kohya|a,b,c,
-- --conv-rank N, --conv-alpha X (adapters on the resnets', downsamplers' and upsamplers' 3x3
-- convolutions too, as kohya's LoCon conv_dim/conv_alpha; alpha defaults to the rank),
-- --network-dropout X (dropout on each adapter's lora_down output while training, as kohya's),
-- --loraplus-lr-ratio X (lora_up learns at X times the learning rate: LoRA+, as kohya's),
-- --out FILE, --lora-format kohya|peft, --save-precision float|fp16|bf16 (the adapter file's
-- dtype, as kohya's --save_precision; float = fp32), --seed N, --prediction eps|v,
-- --noise-offset X, --ip-noise-gamma X (input perturbation), --min-timestep N, --max-timestep N
-- (timesteps drawn from [min, max), default [0, 1000)), --min-snr-gamma X, --debiased-estimation-loss,
-- --scale-v-pred-loss-like-noise-pred (kohya's loss weights), --val-every N, --samples N (synthetic set size),
-- the optimizer: --optimizer adamw|adamw8bit|lion (AdamW, torch's; adamw8bit, bitsandbytes' AdamW8bit:
-- the moments in bytes, a quarter of AdamW's state; Lion, lion-pytorch's: one moment,
-- betas 0.9/0.99; use a 3-10x smaller --lr), --lr X, --weight-decay X (AdamW 1e-2, Lion 0),
-- --max-grad-norm X (1.0: clip the gradients' global norm, as kohya and diffusers do; 0: no
-- clipping), --gradient-accumulation-steps N (1: update with the mean gradient of every N
-- batches; the schedule counts updates), --lr-scheduler NAME (constant, constant_with_warmup,
-- linear, cosine, cosine_with_restarts, polynomial: diffusers' schedules), --lr-warmup-steps N
-- (0), --lr-num-cycles X, --lr-power X,
-- --checkpoint POLICY (none, diffusers, selective, sqrt_n, every_n:N, budget:SIZE|PCT%, blocks:PATTERN),
-- --storage fp32|bf16 (bf16: activations and frozen weights stored in 16 bits, computed in fp32),
-- --fp8-base (the frozen base stored in fp8 e4m3, as kohya's --fp8_base),
-- --save-every N, --state-dir DIR (out/state), --keep-states K (3), --resume [DIR],
-- --save-lora-every N (also write the adapter every N steps, as OUT with -stepNNNNNNNN before
-- .safetensors, kohya's --save_every_n_steps naming),
-- --log-dir DIR (default runs/<time>: metrics.jsonl and a TensorBoard event file),
-- --log-every N (gradient norms and memory every N steps, activation statistics
-- every 5N; default 10; loss, lr and step time every step), --log-async (a writer
-- thread: a crash loses at most --log-flush seconds of records, default 1).
local ck = require "ck"
local unet = require "ck.unet"
local lora = require "ck.lora"
local sdxl = require "ck.sdxl"
local data = require "ck.data"
local log = require "ck.log"
local policy = require "ck.policy"
local state = require "ck.state"
local optim = require "ck.optim"

local a = args or {}
-- the adapter's options, which --full (every parameter trained) does not take
local LORA_OPTIONS = {"rank", "alpha", "conv-rank", "conv-alpha", "network-dropout", "loraplus-lr-ratio", "targets",
                      "lora-format", "fp8-base"}
local o = sdxl.options(a, {
  "size", "data", "weights", "resolution", "batch", "steps", "samples", "seed", "prediction", "noise-offset",
  "ip-noise-gamma", "min-timestep", "max-timestep", "min-snr-gamma", "debiased-estimation-loss",
  "scale-v-pred-loss-like-noise-pred", "val-every",
  "full", "rank", "alpha", "conv-rank", "conv-alpha", "network-dropout", "loraplus-lr-ratio", "targets", "out",
  "lora-format", "save-precision", "save-lora-every",
  "optimizer", "lr", "weight-decay", "max-grad-norm", "gradient-accumulation-steps", "lr-scheduler",
  "lr-warmup-steps", "lr-num-cycles", "lr-power", "fused-backward",
  "checkpoint", "storage", "fp8-base",
  "save-every", "state-dir", "keep-states", "resume",
  "log-dir", "log-every", "log-async", "log-flush",
})
local function opt(name, default) return o:get(name, default) end
-- --full: every UNet parameter trained, the UNet written (as kohya's sdxl_train.py)
local full = o:flag("full", false)
for _, name in ipairs(full and LORA_OPTIONS or {}) do
  if a[name] ~= nil then error("--" .. name .. " is an adapter's option; --full trains every parameter") end
end

local size = o:choice("size", "tiny", {"tiny", "full"})
local config = unet.config(size == "full" and "sdxl" or "sdxl-tiny")
local resolution = opt("resolution", size == "full" and 1024 or 256)
if math.type(resolution) ~= "integer" or resolution % 64 ~= 0 then
  error("--resolution must be a multiple of 64 pixels, got " .. tostring(resolution))
end
local latent = resolution // 8
local batch = opt("batch", size == "full" and 1 or 2)
local steps = opt("steps", 300)
local seed = opt("seed", 1)
local rank = opt("rank", 4)
local alpha = opt("alpha", rank)
local conv_rank = a["conv-rank"] and o:count("conv-rank")
local conv_alpha = opt("conv-alpha", conv_rank)
local network_dropout, loraplus = opt("network-dropout", 0), opt("loraplus-lr-ratio", 1)
if type(network_dropout) ~= "number" or network_dropout < 0 or network_dropout >= 1 then
  error("--network-dropout must be a number in [0, 1), got '" .. tostring(network_dropout) .. "'")
end
if type(loraplus) ~= "number" or loraplus <= 0 then
  error("--loraplus-lr-ratio must be a number > 0, got '" .. tostring(loraplus) .. "'")
end
local targets = opt("targets", "default")
if targets ~= "default" and targets ~= "kohya" then targets = o:list("targets") end
local format = o:choice("lora-format", "kohya", {"kohya", "peft"})
-- the adapter file's dtype, as kohya's --save_precision
local save_dtype = ({float = "F32", fp32 = "F32", fp16 = "F16", bf16 = "BF16"})[
  o:choice("save-precision", "float", {"float", "fp32", "fp16", "bf16"})]
local out = opt("out", full and "out/unet.safetensors" or "out/lora.safetensors")
local lr = opt("lr", 3e-3)
local lr_scheduler, lr_warmup = opt("lr-scheduler", "constant"), opt("lr-warmup-steps", 0)
local optimizer = o:choice("optimizer", "adamw", {"adamw", "adamw8bit", "lion"})
local weight_decay = opt("weight-decay", optimizer == "lion" and 0 or 1e-2)
local accumulate = opt("gradient-accumulation-steps", 1)
if math.type(accumulate) ~= "integer" or accumulate < 1 then
  error("--gradient-accumulation-steps must be a whole number >= 1, got " .. tostring(accumulate))
end
-- each update as soon as its gradient is complete (kohya's --fused_backward_pass):
-- no global-norm clipping then, unless asked (which compile refuses)
local fused_backward = o:flag("fused-backward", false)
local max_grad_norm = opt("max-grad-norm", fused_backward and 0 or 1.0)
-- the rate of optimizer update k (0 for the first); --steps batches make steps // accumulate updates
local lr_at = optim.schedule{name = lr_scheduler, lr = lr, steps = math.max(1, steps // accumulate), warmup = lr_warmup,
                             cycles = opt("lr-num-cycles", nil), power = opt("lr-power", nil)}
-- A LoRA on a randomly initialized base cannot learn epsilon prediction: the
-- full-resolution levels of the UNet have no attention, so nothing adapted can
-- pass the noise through. v-prediction's target holds the latents, which the
-- adapters can learn; so a run without --weights defaults to v.
local prediction = o:choice("prediction", a.weights and "eps" or "v", {"eps", "v"})
local noise_offset, ip_noise_gamma, min_snr_gamma = opt("noise-offset", 0), opt("ip-noise-gamma", 0),
  opt("min-snr-gamma", nil)
for name, v in pairs{["noise-offset"] = noise_offset, ["ip-noise-gamma"] = ip_noise_gamma} do
  if type(v) ~= "number" or v < 0 then error("--" .. name .. " must be a number >= 0, got '" .. tostring(v) .. "'") end
end
local min_timestep, max_timestep = o:count("min-timestep", 0, 0), o:count("max-timestep", 1000)
if min_timestep >= max_timestep or max_timestep > 1000 then
  error(string.format("--min-timestep and --max-timestep must satisfy 0 <= min < max <= 1000, got %d and %d",
    min_timestep, max_timestep))
end
if min_snr_gamma ~= nil and not (type(min_snr_gamma) == "number" and min_snr_gamma > 0) then
  error("--min-snr-gamma must be a number > 0, got '" .. tostring(min_snr_gamma) .. "'")
end
local debiased = o:flag("debiased-estimation-loss", false)
local scale_v_pred = o:flag("scale-v-pred-loss-like-noise-pred", false)
if scale_v_pred and prediction ~= "v" then
  error("--scale-v-pred-loss-like-noise-pred scales v-prediction's loss; this run predicts " .. prediction)
end
local pooled_dim = sdxl.pooled_dim(config)

local checkpoint = policy.parse(opt("checkpoint", "none"))
-- the frozen base in fp8 (e4m3, as kohya's --fp8_base): a quarter of fp32's bytes
local fp8_base = o:flag("fp8-base", false)

-- The model, its adapters, the objective and the compiled program for one
-- batch size and checkpoint policy (plan_only: nothing allocated).
local function build(batch, checkpoint, plan_only)
  return sdxl.training_step{
    config = config, batch = batch, latent = latent,
    lora = not full and {rank = rank, alpha = alpha, targets = targets, conv_rank = conv_rank, conv_alpha = conv_alpha,
                         dropout = network_dropout, loraplus_lr_ratio = loraplus},
    objective = {prediction = prediction, noise_offset = noise_offset, ip_noise_gamma = ip_noise_gamma,
                 min_timestep = min_timestep, max_timestep = max_timestep, min_snr_gamma = min_snr_gamma,
                 debiased_estimation = debiased, scale_v_pred_loss = scale_v_pred,
                 seed = seed},
    compile = {optimizer = optimizer, lr = lr, weight_decay = weight_decay, seed = seed, checkpoint = checkpoint,
               plan_only = plan_only, storage = opt("storage", "fp32"), frozen = fp8_base and "fp8" or nil,
               max_grad_norm = max_grad_norm, accumulate = accumulate, fused_backward = fused_backward},
  }
end

local run = build(batch, checkpoint, ck.plan_mode)
local adapter, objective, inputs, p, g = run.adapter, run.objective, run.inputs, run.program, run.graph
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
if a.weights then
  local f <close> = ck.safetensors(a.weights)
  local map = {}
  for _, t in ipairs(g:params()) do
    if t.kind == "frozen" or full then map[t.name] = t.name end -- the base: frozen, or trained with --full
  end
  p:load(f, map)
end

local dataset = data.latents(opt("data", "synthetic"), {batch = batch, seed = seed, n = opt("samples", 16),
  height = latent, width = latent, cross_attention_dim = config.cross_attention_dim, pooled_dim = pooled_dim})
do -- the data must fit the model
  local s, source = dataset:shapes()
  local want = {latents = {config.in_channels, latent, latent}, prompt_embeds = {sdxl.TOKENS, config.cross_attention_dim},
                pooled_prompt_embeds = {pooled_dim}}
  for name, shape in pairs(want) do
    if table.concat(s[name], ",") ~= table.concat(shape, ",") then
      error(string.format("%s: tensor '%s' has shape [%s], the model expects [%s]", source, name,
        table.concat(s[name], ", "), table.concat(shape, ", ")))
    end
  end
end

-- fixed validation batches: the first samples in file order, fixed noise and timesteps
local val_every = opt("val-every", 0)
local function validate()
  p.training = false -- no dropout
  local total, nb = 0, math.max(1, math.min(2, dataset.n // batch))
  for v = 1, nb do
    local idx = {}
    for b = 1, batch do idx[b] = (v - 1) * batch + b end
    local given = dataset:load(p, inputs, idx)
    given.eval = true
    objective:prepare(p, given, -v)
    total = total + p:forward()
  end
  p.training = true
  return total / nb
end

print(string.format("training %s of sdxl-%s (%d parameters, %d trainable), %dx%d, batch %d, %d steps, %s-prediction",
  full and "every parameter" or string.format("LoRA rank %d%s on %d modules", rank,
    conv_rank and string.format(" (convolutions %d)", conv_rank) or "", #adapter.paths),
  size, param_count, trainable_count, resolution, resolution, batch, steps, prediction))
local val_before = validate()
if val_every > 0 then print(string.format("step 0: validation loss %.4f", val_before)) end
-- resume: the saved step, adapter, optimizer state and data position
local save_every, state_dir = opt("save-every", 0), opt("state-dir", "out/state")
local save_lora_every = opt("save-lora-every", 0)
if math.type(save_lora_every) ~= "integer" or save_lora_every < 0 then
  error("--save-lora-every must be a whole number of steps, got " .. tostring(save_lora_every))
end

-- the adapter as a file (with --full, the UNet in diffusers key names), its
-- metadata saying how far training went
local function save_lora(path, at_step)
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
    ss_fp8_base = fp8_base and "True" or "False",
    ss_training_comment = "trained with ckrun " .. ck.version,
  }
  if not full then return lora.save(p, adapter, path, {format = format, dtype = save_dtype, metadata = meta}) end
  local entries = {}
  for _, t in ipairs(g:params()) do entries[#entries + 1] = {t.name, t.name} end
  meta.format = "pt"
  p:save(path, entries, {metadata = meta, dtype = save_dtype})
end
local settings = {size = size, resolution = resolution, batch = batch, rank = rank, alpha = alpha, seed = seed,
                  full = full,
                  conv_rank = conv_rank or 0, conv_alpha = conv_alpha or 0, network_dropout = network_dropout,
                  loraplus_lr_ratio = loraplus,
                  prediction = prediction, lr = lr, targets = type(targets) == "table" and table.concat(targets, ",") or targets,
                  lr_scheduler = lr_scheduler, lr_warmup_steps = lr_warmup, max_grad_norm = max_grad_norm,
                  gradient_accumulation_steps = accumulate, optimizer = optimizer, weight_decay = weight_decay,
                  fp8_base = fp8_base}
local resumed_log_dir
if a.resume then
  local from = a.resume == true and state_dir or a.resume
  local path = state.latest(from) or error("--resume: no saved state in '" .. tostring(from) .. "'")
  local meta = state.load(p, path, settings)
  resumed_log_dir = meta["log.dir"]
  state.prune(from, opt("keep-states", 3))
  dataset.epoch, dataset.pos = tonumber(meta["data.epoch"]), tonumber(meta["data.pos"])
  dataset:shuffle()
  print(string.format("resumed from %s at step %d", path, p.steps))
end
local start = p.steps + 1

local log_every = opt("log-every", 10)
if math.type(log_every) ~= "integer" or log_every < 1 then
  error("--log-every must be a positive number of steps, got " .. tostring(log_every))
end
-- a resumed run continues the log it had (without the steps after its state)
local log_dir = opt("log-dir", nil) or resumed_log_dir or log.run_dir("runs")
if start > 1 then log.rewind(log_dir, start - 1) end
local logger <close> = log.new{dir = log_dir, every = log_every, async = opt("log-async", false) and true,
  flush_interval = opt("log-flush", 1), steps = steps, batch = batch, blocks = log.unet_blocks, on_nonfinite = "stop",
  stop_note = "nothing was saved"}
if start == 1 then logger:write{step = 0, val_loss = val_before} end
local first, window, recent, step_time = nil, {}, 0, 0
for step = start, steps do
  local t0 = ck.now()
  local given = dataset:load(p, inputs, dataset:next_indices())
  objective:prepare(p, given)
  -- a non-finite loss or gradient stops the run here, naming the step and the op
  local l = logger:step(p, {lr = lr_at(p.updates)})
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
  if save_lora_every > 0 and step % save_lora_every == 0 and step < steps then
    local path = (out:gsub("%.safetensors$", "")) .. string.format("-step%08d.safetensors", step)
    save_lora(path, step)
    logger:print("wrote " .. path)
  end
  if save_every > 0 and step % save_every == 0 and step < steps then
    local meta = {["data.epoch"] = dataset.epoch, ["data.pos"] = dataset.pos, ["log.dir"] = log_dir}
    for k, v in pairs(settings) do meta[k] = v end
    logger:flush(true) -- the log holds every step the state holds
    state.save(p, state_dir, meta, opt("keep-states", 3))
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
print("wrote logs to " .. log_dir)

save_lora(out, p.steps)
print("wrote " .. out)
