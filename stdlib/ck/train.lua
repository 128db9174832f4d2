-- The trainer of every model family: the loop, plan mode (--plan, --json,
-- checkpoint and batch auto), data parallel (mpirun ranks, ZeRO-1), buckets,
-- resume, samples, kohya's metadata, validation, logging, and the options
-- they share, each declared once. A family module supplies what differs; a
-- training script names its family:
--
--   require("ck.train").run(args, {family = require "ck.family.sdxl",
--     about = "Train LoRA adapters ... of an SDXL UNet on cached latents.", options = {...its own...}})
--
-- The family contract (ck/family/sdxl.lua is one; nothing here asks which family runs):
--   name, noun          "sdxl", "UNet": the run's words for the model and what --full trains and writes
--   base_files          what --pretrained-model-name-or-path takes, in words
--   options             its own ck.options entries; adapter_options: those of them --full refuses
--   defaults            {resolution = {fn, shown}, batch = {fn, shown}}: the family's defaults of shared options
--   blocks              the scopes whose statistics the logger reports (log.new's blocks)
--   model(o) -> m       the model the options (all of them, the trainer's too) describe: m.size, m.label
--                       ("sdxl-tiny"), m.title (the samples' model name), m.channels (latent channels), m.factor
--                       (what latent sides are multiples of), m.vae_scale (pixels per latent pixel; default 8),
--                       m.objective_words, m.base (a base model: load takes its weights)
--   adapter(m, a)       lora.attach's options from the trainer's a = {rank, alpha, dropout, loraplus_lr_ratio}
--   adapter_words(m)    words after "LoRA rank R" in the run's first line
--   build(m, s)         the training step for s = {batch, latent = {h, w}, lora, compile}: {program, graph,
--                       adapter, inputs, objective}; objective:prepare(program, given, step) draws the
--                       step's timesteps and noise (given.rows, given.weight_scale: a rank's share; given.eval)
--   load(m, p, params)  the base model's weights into params of p; returns how many
--   text_shapes(m)      {{name, shape}, ...}: the text tensors of a sample file
--   dataset(m, src, o)  cached samples (ck.data.latents' options o)
--   settings(m)         what a state records of the model: a resumed run must match it
--   metadata(m)         optional: the family's own metadata of the files written ({ss_... = "..."})
--   refused(name)       optional: why option --name (one it does not declare) is refused, or nil
--   owner, script, model_words   "Flux's", its train script, "a Flux model": how another family's
--                       run refuses this family's options
--   swap_blocks(m, n)   optional: the names of the blocks whose frozen weights --blocks-to-swap n streams (n
--                       nil: every block, --offload weights), or nil and why the model has fewer
--   save_adapter(p, adapter, path, {format, dtype, metadata, peft_folder})   the adapter file, its naming
--   encoders(m)         the image and text encoders: :check(), :cache(plan, o), :text_program(n, share),
--                       :text(tp, captions) and :image(vp, image, sample, key, seed, epoch) -> {{input, values}},
--                       :image_program(w, h, share), .tokens
--   prompts(m, path, o), sampler(m, {prompts, encoders, lora, compile_opts, dir, stem})
--                       samples while training: ck.sampling's interface
-- A flow-matching family (Flux.1, ck/family/flux.lua) fills the same hooks:
-- build packs the latents [16, H, W] 2x2 into tokens in the graph (m.factor 2)
-- and its objective's prepare draws the sigmas (x_s = (1 - s) x0 + s eps, the
-- target eps - x0; kohya's --timestep-sampling, flux_shift from the bucket's
-- shape) and sets the guidance and position ids; text_shapes names T5's states
-- and CLIP's pooled vector; the encoders hold T5 and CLIP-L, and image() gives
-- latents alone (no time ids). tests/scripts/train_toy_flow.lua is a small such family.
local ck = require "ck"
local options = require "ck.options"
local policy = require "ck.policy"
local optim = require "ck.optim"
local state = require "ck.state"
local log = require "ck.log"
local data = require "ck.data"
local imagedata = require "ck.imagedata"
local memory = require "ck.memory"
local plan = require "ck.plan"
local kohya_config = require "ck.kohya_config"

local M = {}

-- The options every family shares, for family f (its words and defaults).
function M.options(f)
  local noun = f.noun
  local d = f.defaults or {}
  local res, batch = d.resolution or {256}, d.batch or {1}
  local full_out = "out/" .. noun:lower() .. ".safetensors" -- what --full writes
  local list = {
    -- the model and the data
    {"data", "string", "synthetic", "a folder of images with captions (kohya's layout), a folder of .safetensors " ..
     "samples, or the synthetic set", arg = "DIR|synthetic"},
    {"pretrained-model-name-or-path", "string", nil, "the base model: " .. f.base_files, arg = "PATH"},
    {"config-file", "string", nil, "kohya's training config (TOML, its sections flattened): option values, which " ..
     "the command line overrides", arg = "FILE"},
    {"dataset-config", "string", nil, "kohya's dataset config (TOML or JSON): datasets of subsets (image_dir, " ..
     "num_repeats, class_tokens, is_reg, ...), each dataset with its own resolution, buckets and batch size; in " ..
     "place of --data", arg = "FILE"},
    {"prior-loss-weight", "number", 1.0, "the loss weight of the regularization images (is_reg subsets)", min = 0},
    {"cache-latents-to-disk", "flag", false, "keep the encoded images on disk (ckrun always does: beside the images, " ..
     "or in --cache-dir)"},
    {"cache-dir", "string", nil, "where the encoded images go (default: beside the images)", arg = "DIR"},
    {"caption-fix", "choice", "ftfy", "captions cleaned before tokenizing by ftfy's fix_text (as kohya's installs do) " ..
     "or not", choices = {"ftfy", "none"}},
    {"samples", "integer", 16, "the synthetic set's size", min = 1},
    {"weights", "string", nil, "the base " .. noun .. " in diffusers key names (default: a seeded random base)",
     arg = "FILE"},
    {"resolution", "integer", res[1], "pixels per side (latents are 1/8 of it, or of the VAE's scale)", arg = "PX", shown = res.shown,
     check = function(v) return v % 64 == 0 end, says = "must be a multiple of 64 pixels",
     accept = function(v) -- kohya's W,H, where it is a square
       local w, h = tostring(v):match("^%s*(%d+)%s*,%s*(%d+)%s*$")
       if not w then return v end
       if tonumber(w) ~= tonumber(h) then
         return nil, "takes a square: kohya's W,H " .. w .. "," .. h .. " is not one (other aspect ratios come from " ..
           "--enable-bucket)"
       end
       return math.tointeger(tonumber(w))
     end},
    {"batch", "integer", batch[1], "samples per step (auto: the largest whose plan fits the device's free memory)",
     min = 1, also = {"auto"}, shown = batch.shown},
    {"steps", "integer", 300, "batches to train", min = 1},
    {"seed", "integer", 1, "the seed of weights, data, noise and timesteps", min = 0},
    {"val-every", "integer", 0, "validation loss every N steps (0: before and after only)", min = 0},
    -- the adapter
    {"full", "flag", false, "train every " .. noun .. " parameter instead of an adapter and write the " .. noun},
    {"rank", "integer", 4, "the adapters' rank", min = 1},
    {"alpha", "number", function(v) return v.rank end, "the adapters' alpha", shown = "the rank"},
    {"network-dropout", "number", 0, "dropout on each adapter's lora_down output while training", min = 0, below = 1},
    {"loraplus-lr-ratio", "number", 1, "LoRA+: lora_up learns at X times the rate", above = 0},
    {"out", "string", function(v) return v.full and full_out or "out/lora.safetensors" end,
     "the file written", arg = "FILE", shown = "out/lora.safetensors, with --full " .. full_out,
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
    {"offload", "choice", function() return ck.device == "cuda" and "auto" or "none" end,
     "saved activations in pinned host memory between their forward and backward uses: none; activations (all " ..
     "the policy keeps, kohya's --cpu_offload_checkpointing); auto (--checkpoint auto and budget: choose keep, " ..
     "recompute or offload per tensor by predicted step time; where nothing fits, with --full the optimizer " ..
     "state offloaded, then the fewest blocks streamed); weights (every block's frozen weights streamed from " ..
     "pinned host memory, with --full its trained weights and their optimizer state too; activations kept as the " ..
     "policy says)",
     choices = {"none", "weights", "activations", "auto"}, shown = "auto on a CUDA device, else none"},
    {"blocks-to-swap", "integer", 0, "the frozen weights of the last N blocks live in pinned host memory and are " ..
     "streamed in before each use (kohya's --blocks_to_swap; Flux: N // 2 double and (N - N // 2) * 2 single " ..
     "blocks; SDXL: the last N of its 7 top-level blocks); with --full their trained weights and optimizer state " ..
     "too, brought in for backward and for each update and written back after it; combines with any --offload",
     min = 0},
    {"offload-optimizer", "flag", false, "the optimizer's state (AdamW's two moments) lives in pinned host memory " ..
     "and is brought in for each parameter's update and written back after it (DeepSpeed's offload_optimizer; " ..
     "the update still runs on the device)"},
    {"gpu", "string", nil, "the card whose figures predict step times (the cost model's table: H100, A100, 4090, " ..
     "3090, ...; default: H100's on a CUDA device, the CPU's on the CPU)", arg = "NAME"},
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
    {"log-flush", "number", 1, "with --log-async: seconds between writes", above = 0},
    -- sample images
    {"sample-every", "integer", 0, "render the sample prompts every N steps (0: never)", min = 0,
     says = "must be a whole number of steps"},
    {"sample-prompts", "string", nil, "kohya's prompt file: a prompt a line, with --n NEGATIVE --w --h --s STEPS " ..
     "--l CFG --d SEED --ss SAMPLER", arg = "FILE"},
    {"sample-at-first", "flag", false, "also render the sample prompts before the first step"},
  }
  -- the image dataset's options, kohya's names (ck.imagedata); --resolution is the one above
  for _, opt in ipairs(imagedata.OPTIONS) do
    if opt[1] ~= "resolution" then list[#list + 1] = opt end
  end
  return list
end

-- the options only an adapter takes (--full trains every parameter)
M.ADAPTER_OPTIONS = {"rank", "alpha", "network-dropout", "loraplus-lr-ratio", "lora-format", "fp8-base"}

---- errors name the script's line

local function is_stdlib(source)
  return source:find("/stdlib/ck/", 1, true) or source:find("/lua/5.4/ck/", 1, true)
end

-- The trainer runs on the script's behalf, so an error raised in the stdlib
-- (here, in a family module, in a module either calls) names the script's
-- line, as the bindings name it (vm/util/where.c): a message that starts
-- with a stdlib position gets the innermost script frame's instead. Messages
-- naming the script already, or no position, are left as they are.
local function script_line(msg)
  if type(msg) ~= "string" then return msg end
  local ours, user = {}, nil
  for level = 2, 250 do
    local i = debug.getinfo(level, "Sl")
    if not i then break end
    if is_stdlib(i.source) then
      ours[i.short_src] = true
    elseif i.currentline > 0 and not user then
      user = i.short_src .. ":" .. i.currentline
    end
  end
  local chunk, rest = msg:match("^([^\n]-):%d+: (.*)$")
  if user and chunk and (ours[chunk] or is_stdlib(chunk)) then return user .. ": " .. rest end
  return msg
end

---- the run, in steps: each function below takes the run's table t

-- the declared option a command line's name k gives (its own name, kohya's
-- underscore spelling, or kohya's name for it: options.KOHYA), or nil
local function option_of(k, declared)
  if declared[k] then return k end
  local d = k:gsub("_", "-")
  if declared[d] then return d end
  local ko = options.KOHYA[(k:gsub("-", "_"))]
  if ko and declared[ko.to] and not ko.says then return ko.to end
  return nil
end

-- kohya's --config-file FILE (train_util.read_config_from_file): its keys,
-- sections flattened and each checked (ck.kohya_config), give the values of
-- the options the command line does not give, under any of their names: the
-- command line overrides the file, as kohya's argparse does.
local function with_config(args, spec, path)
  if type(path) ~= "string" then error("--config-file takes a FILE (kohya's training config, TOML)") end
  local given, from = kohya_config.options(path, spec)
  if given["config-file"] then
    error(from["config-file"] .. ": config_file names a config file inside one; give one --config-file", 0)
  end
  local declared, on_line = {}, {}
  for _, e in ipairs(spec) do if e[1] then declared[e[1]] = true end end
  for k in pairs(args) do
    if type(k) == "string" and k ~= "script" then
      local name = option_of(k, declared)
      if name then on_line[name] = true end
    end
  end
  local out = {}
  for k, v in pairs(args) do out[k] = v end
  for name, v in pairs(given) do
    if not on_line[name] then out[name] = v end
  end
  return setmetatable(out, getmetatable(args))
end

-- the families the trainer knows: an option of another one is refused as
-- that family's, not as unknown
local FAMILIES = {"ck.family.sdxl", "ck.family.flux"}

-- why --name is refused for family f: its own reason (f.refused), or another
-- family's option; nil for neither
local function refused(f, name)
  local why = f.refused and f.refused(name)
  if why then return why end
  for _, mod in ipairs(FAMILIES) do
    local other = require(mod)
    if other ~= f then
      for _, e in ipairs(other.options or {}) do
        if e[1] == name then
          return string.format("is %s (%s); %s takes no --%s", other.owner, other.script, f.model_words, name)
        end
      end
    end
  end
  return nil
end

-- the options, parsed; nil after --help. An option the family refuses by
-- name, or another family's, is refused with its reason, not as unknown.
local function parse(args, script)
  local f = script.family
  local spec = {about = script.about, kohya = true}
  local function add(heading, list)
    if #list > 0 then spec[#spec + 1] = {heading = heading} end
    for _, e in ipairs(list) do spec[#spec + 1] = e end
  end
  add("this script's", script.options or {})
  add("the " .. f.name .. " family's", f.options or {})
  add("the trainer's, every family's", M.options(f))
  do
    local declared, named = {}, {}
    for _, e in ipairs(spec) do if e[1] then declared[e[1]] = true end end
    for k in pairs(args) do
      if type(k) == "string" and k ~= "script" and not declared[k] then named[#named + 1] = k end
    end
    table.sort(named)
    for _, k in ipairs(named) do
      local why = refused(f, (k:gsub("_", "-")))
      if why then error("--" .. k .. " " .. why) end
    end
  end
  if args.help == nil then
    local cfg = args["config-file"]
    if cfg == nil then cfg = args.config_file end
    if cfg ~= nil then args = with_config(args, spec, cfg) end
  end
  return options.parse(args, spec)
end

-- the choices the options make that span several of them, checked
local function settle(t)
  local o, f = t.o, t.family
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
  t.precision = precision
  -- --full: every parameter trained, the model written (as kohya's sdxl_train.py)
  t.full = o.full
  if t.full then
    for _, list in ipairs{M.ADAPTER_OPTIONS, f.adapter_options or {}} do
      for _, name in ipairs(list) do
        if o:given(name) then error("--" .. name .. " is an adapter's option; --full trains every parameter") end
      end
    end
  end
  -- data parallel: the ranks of an mpirun job (ckrun --plan --world-size N
  -- plans one rank of N), each training its share of every global batch of
  -- --batch times N samples (as torch's DistributedSampler splits it); rank 0
  -- alone writes the logs, the adapter, the states and the samples
  t.world = ck.plan_mode and (ck.plan_world_size or 1) or ck.world_size()
  t.dp_rank = ck.plan_mode and 0 or ck.rank()
  if t.dp_rank > 0 then print = function() end end -- rank 0 speaks for the job (every module's print)
  if o["shard-optimizer"] and t.world < 2 then
    error("--shard-optimizer splits the optimizer state over the ranks of an mpirun job (or --plan --world-size N): " ..
      "this run has one")
  end
  -- a state between two updates holds the gradient sums so far, which on
  -- several ranks are each rank's own part until the update sums them: rank 0's
  -- alone would resume wrong
  if t.world > 1 and o["save-every"] > 0 and o["save-every"] % o["gradient-accumulation-steps"] ~= 0 then
    error(string.format("--save-every %d on %d ranks must be a multiple of --gradient-accumulation-steps %d: a state " ..
      "between two updates would hold rank 0's part of the gradient sums alone", o["save-every"], t.world,
      o["gradient-accumulation-steps"]))
  end
  if t.world > 1 and o["fused-backward"] then
    error(string.format("--fused-backward is not supported on several ranks yet (this job has %d)", t.world))
  end
  -- one run at a time in a state directory: a second one saving or pruning there
  -- would break the first's renames, so it stops here, before anything runs
  t.save_every, t.state_dir = o["save-every"], o["state-dir"]
  if not ck.plan_mode and t.dp_rank == 0 then
    if t.save_every > 0 then state.lock(t.state_dir) end
    local from = o.resume == true and t.state_dir or o.resume
    if from and ck.listdir(from) then state.lock(from) end -- a missing one is refused below: no saved state
  end
end

local function warn(msg)
  if io.stderr then io.stderr:write("warning: ", msg, "\n") else print("warning: " .. msg) end
end

-- kohya's dataset keys the trainer honours (kohya_config refuses any other
-- set to other than kohya's default, naming it). cache_info (kohya's cache of
-- image sizes) changes nothing here: ckrun reads each image's header.
M.DATASET_KEYS = {"image_dir", "num_repeats", "caption_extension", "class_tokens", "is_reg", "shuffle_caption",
  "keep_tokens", "keep_tokens_separator", "caption_separator", "secondary_separator", "caption_prefix", "caption_suffix",
  "caption_dropout_rate", "caption_dropout_every_n_epochs", "caption_tag_dropout_rate", "flip_aug", "random_crop",
  "cache_info", "resolution", "batch_size", "enable_bucket", "min_bucket_reso", "max_bucket_reso", "bucket_reso_steps",
  "bucket_no_upscale"}

-- the options a dataset config's keys fall back to (kohya's argparse level), by ckrun's names
local DATASET_ARGS = {"batch", "resolution", "caption-extension", "keep-tokens", "keep-tokens-separator",
  "caption-separator", "shuffle-caption", "caption-dropout-rate", "caption-tag-dropout-rate", "flip-aug", "random-crop",
  "enable-bucket", "min-bucket-reso", "max-bucket-reso", "bucket-reso-steps", "bucket-no-upscale"}

-- --dataset-config FILE: read and checked whole before anything is made or
-- written (kohya_config.dataset: kohya's defaults and inheritance, the
-- options given on the command line or in --config-file as kohya's argparse
-- level). The trainer takes one flip_aug and one random_crop for all subsets.
local function read_datasets(t)
  local o = t.o
  local path = o["dataset-config"]
  if not path then return end
  if o:given("data") then error("--data and --dataset-config both give the images: give one") end
  if o.batch == "auto" then
    error("--batch auto picks one batch size; --dataset-config gives each dataset its own (batch_size): give a number " ..
      "or leave --batch out")
  end
  local a = {}
  for _, name in ipairs(DATASET_ARGS) do
    if o:given(name) then a[name] = o[name] end
  end
  local d = kohya_config.dataset(path, {args = a, supports = M.DATASET_KEYS})
  for _, w in ipairs(d.ignored) do warn(w) end
  for _, key in ipairs{"flip_aug", "random_crop"} do
    local first = d.subsets[1]
    for _, sub in ipairs(d.subsets) do
      if sub[key] ~= first[key] then
        error(string.format("%s: %s = %s where %s has %s: ckrun's trainer takes one %s for every subset",
          sub.from[key] or sub.at, key, tostring(sub[key]), first.from[key] or first.at, tostring(first[key]), key), 0)
      end
    end
  end
  t.dcfg = d
  t.flip_aug, t.random_crop_opt = d.subsets[1].flip_aug, d.subsets[1].random_crop
end

-- the model, the schedule, the samples' prompts and the compile options
local function describe(t)
  local o, f = t.o, t.family
  if o["pretrained-model-name-or-path"] and o.weights then
    error("--weights and --pretrained-model-name-or-path both give the base " .. f.noun .. ": give one")
  end
  t.m = f.model(o)
  t.resolution = o.resolution
  t.batch, t.steps, t.seed = o.batch, o.steps, o.seed
  if t.dcfg then -- the largest dataset's side bounds every bucket's area; the largest batch_size is the run's batch
    t.resolution, t.batch = 0, 0
    for _, d in ipairs(t.dcfg.datasets) do
      t.resolution = math.max(t.resolution, d.resolution[1], d.resolution[2])
      t.batch = math.max(t.batch, d.batch_size)
    end
  end
  t.vae_scale = t.m.vae_scale or 8 -- pixels per latent pixel
  t.latent = t.resolution // t.vae_scale
  t.adapter_opts = not t.full and f.adapter(t.m, {rank = o.rank, alpha = o.alpha, dropout = o["network-dropout"],
                                                  loraplus_lr_ratio = o["loraplus-lr-ratio"]}) or false
  t.out = o.out
  -- the adapter file's dtype, as kohya's --save_precision
  t.save_dtype = ({float = "F32", fp32 = "F32", fp16 = "F16", bf16 = "BF16"})[o["save-precision"]]
  t.accumulate = o["gradient-accumulation-steps"]
  t.max_grad_norm = o["max-grad-norm"]
  -- the rate of optimizer update k (0 for the first); --steps batches make steps // accumulate updates
  t.lr_at = optim.schedule{name = o["lr-scheduler"], lr = o.lr, steps = math.max(1, t.steps // t.accumulate),
                           warmup = o["lr-warmup-steps"], cycles = o["lr-num-cycles"], power = o["lr-power"]}
  -- sample images (kohya's --sample_every_n_steps, --sample_prompts): the
  -- prompt file read now, so that a bad line stops the run before anything is made
  t.sample_every = o["sample-every"]
  if o["sample-prompts"] then
    if t.sample_every == 0 and not o["sample-at-first"] then
      error("--sample-prompts renders at --sample-every N steps or with --sample-at-first: give one")
    end
    t.sample_prompts = f.prompts(t.m, o["sample-prompts"], o)
  elseif t.sample_every > 0 or o["sample-at-first"] then
    error("--sample-every and --sample-at-first render the prompts of --sample-prompts FILE: give it")
  end
  t.checkpoint = policy.parse(o.checkpoint) -- auto is chosen once the programs can be built
  -- streamed frozen weights: --offload weights streams every block, --blocks-to-swap N the last N (the family's count)
  local swap = o["blocks-to-swap"]
  if o.offload == "weights" or swap > 0 then
    if not f.swap_blocks then error("--blocks-to-swap: the " .. f.name .. " family names no blocks to stream") end
    local names, why = f.swap_blocks(t.m, o.offload ~= "weights" and swap or nil)
    if not names then error("--blocks-to-swap " .. swap .. ": " .. why) end
    t.stream = names
  end
  t.offload = o.offload == "weights" and "none" or o.offload
  -- the optimizer's state in pinned host memory; with --full, the streamed blocks' trained weights and state too
  t.offload_optimizer = o["offload-optimizer"]
  if t.offload_optimizer and t.world > 1 then
    error("--offload-optimizer keeps one process's optimizer state in its host memory: not with data parallel " ..
      "training (" .. t.world .. " ranks)")
  end
  if t.full and t.stream and t.world > 1 then
    error("--full streams the trained weights of the blocks --blocks-to-swap names: not with data parallel " ..
      "training (" .. t.world .. " ranks)")
  end
  -- the frozen base in fp8 (e4m3, as kohya's --fp8_base): a quarter of fp32's bytes
  t.fp8_base = o["fp8-base"]
  -- what the logger will compute on its logging steps, planned into the arena
  t.log_every = o["log-every"]
  t.log_stats = log.stats_request{every = t.log_every, blocks = f.blocks}
end

-- The training step at batch size b under policy pol (plan_only: nothing
-- allocated), at latents {h, w} (default: the resolution's); share: a
-- program whose weights, optimizer state and counters this one uses.
local function build(t, b, pol, plan_only, shape, share)
  local o = t.o
  return t.family.build(t.m, {
    batch = b, latent = shape or {t.latent, t.latent}, lora = t.adapter_opts,
    compile = {optimizer = o.optimizer, lr = o.lr, weight_decay = o["weight-decay"], seed = t.seed, checkpoint = pol,
               plan_only = plan_only, precision = t.precision, frozen = t.fp8_base and "fp8" or nil,
               max_grad_norm = t.max_grad_norm, accumulate = t.accumulate, fused_backward = o["fused-backward"],
               stats = t.log_stats, share = share, world_size = t.world,
               shard_optimizer = o["shard-optimizer"] or nil, offload = t.offload, gpu = o.gpu, stream = t.stream,
               stream_trainable = t.full and t.stream ~= nil, offload_optimizer = t.offload_optimizer},
  })
end

-- the family's encoders, made once: for the images and for the samples
local function encoders(t)
  t.enc = t.enc or t.family.encoders(t.m)
  return t.enc
end

-- the samples' programs (the family's sampler), rank 0's: it renders the job's samples
local function sampler(t)
  if not (t.sample_prompts and t.dp_rank == 0) then return end
  local out = t.out
  t.sampler = t.family.sampler(t.m, {prompts = t.sample_prompts, encoders = encoders(t), lora = t.adapter_opts,
    compile_opts = {precision = t.precision, frozen = t.fp8_base and "fp8" or nil, seed = t.seed},
    dir = (out:match("^(.*)/[^/]*$") or ".") .. "/samples", stem = out:match("([^/]+)$"):gsub("%.safetensors$", "")})
end

-- --checkpoint auto, --batch auto: the cheapest policy (and the largest batch)
-- whose whole-run plan fits the device's free memory (sampling's programs
-- included: they share the arena), said in one line
local function fit_to_memory(t)
  if t.checkpoint.kind ~= "auto" and t.batch ~= "auto" then return end
  local function planned(b, pol)
    local r = build(t, b, pol, true)
    if t.sampler then t.sampler:programs_for(r.program, true) end -- the group's arena grows to them
    return r
  end
  -- the choice, or nil and the refusal ({what =, refusal =})
  local function choose()
    -- a plan-only run keeps the chosen trial's program: it is the program
    -- compile(t) would build (the same batch, policy decision, latents and streamed blocks)
    local c, no = require("ck.fit").choose{build = planned, checkpoint = t.checkpoint, batch = t.batch,
                                           headroom = t.o["fit-headroom"], keep = ck.plan_mode, soft = true}
    return c, no -- not a tail call: choose's errors name this line, which the trainer puts at the script's
  end
  local c, no = choose()
  -- Nothing fits with --offload auto and no blocks named: a number of blocks
  -- whose streamed weights (--blocks-to-swap N, the family's count) let the
  -- same search fit. Streaming moves weights out of the persistent region the
  -- policy plans around, so it is chosen here, where programs are compiled,
  -- not by the policy. A bisection over N: streaming more never raises a
  -- plan's peak, and each compile holds the plan with the weights' device
  -- copies to its budget, but ck.fit's search of budgets does not always
  -- find a fit where one exists, so N is the fewest that fits only where
  -- one more block never makes it miss.
  -- A full fine-tune (--full) that does not fit first moves the optimizer's
  -- state to pinned host memory (--offload-optimizer): for AdamW that is
  -- twice the trained weights' bytes, each state used once a step.
  local f = t.family
  local optim_said = "; the optimizer state in pinned host memory (--offload-optimizer)"
  local optim_auto = false -- auto moved it: the fit line says so
  if not c and t.offload == "auto" and t.full and not t.offload_optimizer and t.world == 1 then
    t.offload_optimizer, optim_auto = true, true
    local got, refused = choose()
    if got then
      c = got
    else
      no.refusal = string.format("%s; with the optimizer state in pinned host memory (--offload-optimizer), %s",
        no.refusal, refused.refusal)
    end
  end
  if not c and t.offload == "auto" and not t.stream and (not t.full or t.world == 1) and f.swap_blocks then
    local most = 0
    while f.swap_blocks(t.m, most + 1) do most = most + 1 end
    local function with(n)
      t.stream = f.swap_blocks(t.m, n)
      return choose()
    end
    local got, refused = with(most)
    if got then
      local lo, hi = 0, most -- lo does not fit, hi does
      while hi - lo > 1 do
        local mid = (lo + hi) // 2
        local r = with(mid)
        if r then hi, got = mid, r else lo = mid end
      end
      t.stream = f.swap_blocks(t.m, hi)
      c = got
      c.reason = string.format("%s; streaming the %s weights of the last %d blocks (--blocks-to-swap %d, " ..
        "found by bisection)", c.reason, t.full and "trained and frozen" or "frozen", hi, hi)
    else
      t.stream = nil
      no.refusal = string.format("%s; streaming every block's %s weights (--blocks-to-swap %d), %s", no.refusal,
        t.full and "trained and frozen" or "frozen", most, refused.refusal)
    end
  end
  if not c and t.full and not t.o["fused-backward"] then -- every gradient lives until the updates
    no.refusal = no.refusal .. "; --fused-backward updates each weight as soon as its gradient is complete, so " ..
      "that the gradients of the whole model are not held at once"
  end
  if not c then error(no.what .. ": " .. no.refusal, 2) end
  if optim_auto then c.reason = c.reason .. optim_said end
  t.checkpoint, t.batch, t.fit_reason, t.fit_run = c.checkpoint, c.batch, c.reason, c.run
  if not ck.plan_mode then print(t.fit_reason) end
end

-- a subset's caption settings (imagedata.caption's), and whether they draw at each use
local function caption_settings(sub)
  local c = {shuffle = sub.shuffle_caption, keep_tokens = sub.keep_tokens,
             keep_tokens_separator = sub.keep_tokens_separator ~= "" and sub.keep_tokens_separator or nil,
             separator = sub.caption_separator, secondary_separator = sub.secondary_separator,
             dropout_rate = sub.caption_dropout_rate, tag_dropout_rate = sub.caption_tag_dropout_rate,
             dropout_every_n_epochs = sub.caption_dropout_every_n_epochs, prefix = sub.caption_prefix,
             suffix = sub.caption_suffix}
  return c, c.shuffle or c.dropout_rate > 0 or c.tag_dropout_rate > 0 or c.dropout_every_n_epochs > 0
end

-- --dataset-config's datasets, as kohya's DreamBooth datasets: each subset's
-- images (those directly in image_dir) repeated num_repeats times, captioned
-- by their caption files or class_tokens; a dataset's regularization images
-- (is_reg) repeated or cut so that they are used as often as its train
-- images (imagedata.reg_repeats), their loss weighted by --prior-loss-weight;
-- each dataset with its own buckets and batch size, their batches shuffled
-- together. Everything is scanned and checked before the cache is written.
local function load_datasets(t)
  local o, f, m = t.o, t.family, t.m
  local dc = t.dcfg
  t.images = true
  t.random_crop = t.random_crop_opt
  local used, groups, group_batch = {}, {}, {} -- used: {subset, plan entry, uses, caption settings}
  t.caption_aug = false
  for di, d in ipairs(dc.datasets) do
    group_batch[di] = d.batch_size * t.world
    if d.enable_bucket and d.min_bucket_reso < 1 then
      error(string.format("%s: min_bucket_reso below bucket_reso_steps %d becomes 0 (kohya moves it down to a " ..
        "multiple of the steps), which holds no bucket: give at least %d", d.from.min_bucket_reso or d.at,
        d.bucket_reso_steps, d.bucket_reso_steps), 0)
    end
    local ok, b = pcall(imagedata.buckets, {resolution = d.resolution, enable = d.enable_bucket,
      min = d.min_bucket_reso, max = d.max_bucket_reso, steps = d.bucket_reso_steps, no_upscale = d.bucket_no_upscale})
    if not ok then error(string.format("%s: %s", d.at, (tostring(b):gsub("^.-imagedata%.buckets: ", ""))), 0) end
    local train, reg, train_count = {}, {}, 0
    for _, sub in ipairs(d.subsets) do
      if not ck.listdir(sub.image_dir) then
        error(string.format("%s: image_dir '%s' is not a folder", sub.from.image_dir or sub.at, sub.image_dir), 0)
      end
      local set = imagedata.scan(sub.image_dir, {flat = true, caption_extension = sub.caption_extension,
                                                  class_tokens = sub.class_tokens or "", repeats = sub.num_repeats})
      if #set.items == 0 then
        warn(string.format("%s: image_dir '%s' has no images (png, jpg, jpeg or webp): the subset is left out, as " ..
          "kohya does", sub.from.image_dir or sub.at, sub.image_dir))
      else
        local c, random = caption_settings(sub)
        t.caption_aug = t.caption_aug or random
        for _, e in ipairs(imagedata.assign(set, b).items) do
          local u = {sub = sub, e = e, uses = sub.num_repeats, caption = c, random = random, group = di}
          if sub.is_reg then reg[#reg + 1] = u else train[#train + 1] = u end
        end
        if not sub.is_reg then train_count = train_count + set.count end
      end
    end
    -- kohya registers the train images, then the reg images balanced against them
    local reg_count, reg_used = 0, 0
    if #reg > 0 then
      local r = {}
      for i, u in ipairs(reg) do r[i] = u.uses end
      for i, k in ipairs(imagedata.reg_repeats(train_count, r)) do
        reg[i].uses, reg[i].reg = k, true
        reg_count, reg_used = reg_count + k, reg_used + (k > 0 and 1 or 0)
      end
    end
    print(string.format("dataset %d: %d train images with repeats, %d regularization images with repeats (%d of %d " ..
      "images used), resolution %dx%d, batch %d", di, train_count, reg_count, reg_used, #reg, d.resolution[1],
      d.resolution[2], d.batch_size))
    for _, list in ipairs{train, reg} do
      for _, u in ipairs(list) do
        if u.uses > 0 then used[#used + 1] = u end
      end
    end
  end
  if #used == 0 then
    error(string.format("%s: no train images in any dataset's subsets", dc.file), 0)
  end
  -- the caption each use starts from: with settings that draw at each use
  -- the file's, else made once (prefix, suffix, secondary_separator)
  for _, u in ipairs(used) do
    if not u.random then
      u.e.caption = imagedata.caption(u.e.caption, u.caption)
      u.caption = false
    end
  end
  -- the cache, one subset at a time (beside its images, or in --cache-dir)
  local enc = encoders(t)
  m.tokens = enc.tokens
  enc:check()
  local file_of = {}
  if not (ck.plan_mode or t.random_crop) then
    local by_sub, order = {}, {}
    for _, u in ipairs(used) do
      if not by_sub[u.sub] then by_sub[u.sub], order[#order + 1] = {items = {}, of = {}}, u.sub end
      local p = by_sub[u.sub]
      p.items[#p.items + 1], p.of[#p.items + 1] = u.e, u
    end
    for _, sub in ipairs(order) do
      local p = by_sub[sub]
      local files, bound = enc:cache({items = p.items}, {cache_dir = o["cache-dir"] or sub.image_dir, seed = t.seed,
        flip_aug = t.flip_aug, progress = true, text = not t.caption_aug})
      for i, u in ipairs(p.of) do file_of[u] = files[i] end
      if bound and (not t.encode_bound or bound > t.encode_bound) then t.encode_bound = bound end
    end
  end
  local list, shp = {}, {}
  t.captions, t.entries, t.caption_opts, t.loss_weights = {}, {}, {}, {}
  local prior = o["prior-loss-weight"]
  for _, u in ipairs(used) do
    for _ = 1, u.uses do
      local i = #list + 1
      list[i] = file_of[u] or false
      t.captions[i], t.entries[i], t.caption_opts[i] = u.e.caption, u.e, u.caption
      t.loss_weights[i] = u.reg and prior or 1
      groups[i] = u.group
      shp[i] = {m.channels, u.e.bucket[2] // t.vae_scale, u.e.bucket[1] // t.vae_scale}
    end
  end
  local n = t.batch * t.world
  if list[1] then
    t.dataset = f.dataset(m, o["dataset-config"], {files = list, batch = n, groups = groups, group_batch = group_batch,
      seed = t.seed, timesteps = 1000, flip_aug = t.flip_aug, text = not t.caption_aug})
  else -- --plan, --random-crop: the buckets from the images' headers, nothing cached
    t.dataset = data.shapes_only(shp, {batch = n, seed = t.seed, groups = groups, group_batch = group_batch})
  end
  t.shapes, t.sizes = t.dataset:bucket_shapes()
end

-- The data: the synthetic set, a folder of samples, or a folder of images
-- (encoded once into the cache by the family's encoders, closed before the
-- training programs are made; with caption augmentation the latents alone,
-- the captions encoded at each step). Samples of several latent shapes are
-- aspect-ratio buckets, each trained by programs of its own.
local function load_data(t)
  local o, f, m = t.o, t.family, t.m
  local n = t.batch * t.world -- the global batch
  t.shapes, t.sizes = {{m.channels, t.latent, t.latent}}, {{n}} -- the global batches' shapes and sizes
  if t.dcfg then return load_datasets(t) end
  -- --plan reads a data folder only where there is one (a plan sized from a laptop needs none)
  local here = o.data ~= "synthetic" and (not ck.plan_mode or ck.listdir(o.data) ~= nil)
  t.images = here and require("ck.encode").is_image_folder(o.data)
  t.caption_aug = o["shuffle-caption"] or o["caption-dropout-rate"] > 0 or o["caption-tag-dropout-rate"] > 0
  t.flip_aug = o["flip-aug"]
  -- --random-crop: a crop drawn at each use cannot be cached, so the image
  -- encoder runs at each step too (as kohya's sd-scripts without latent caching)
  t.random_crop = t.images and o["random-crop"]
  if t.images then
    local io_opts = {resolution = {tostring(t.resolution)}}
    for _, opt in ipairs(imagedata.OPTIONS) do
      if opt[1] ~= "resolution" then io_opts[opt[1]] = o[opt[1]] end
    end
    t.settings_img = imagedata.settings(io_opts)
    local set = imagedata.scan(o.data, t.settings_img.scan)
    local assigned = imagedata.assign(set, imagedata.buckets(t.settings_img.buckets))
    local enc = encoders(t)
    m.tokens = enc.tokens
    enc:check()
    local files
    if not (ck.plan_mode or t.random_crop) then -- --random-crop: each use's crop encoded at its step, nothing cached
      files, t.encode_bound = enc:cache(assigned, {cache_dir = o["cache-dir"] or set.dir, seed = t.seed,
        flip_aug = o["flip-aug"], random_crop = o["random-crop"], progress = true, text = not t.caption_aug})
    end
    -- each image as often as its folder repeats it, with its caption
    local list, shp = {}, {}
    t.captions, t.entries = {}, {}
    for i, e in ipairs(assigned.items) do
      for _ = 1, e.repeats do
        list[#list + 1] = files and files[i] or false
        t.captions[#t.captions + 1] = e.caption
        t.entries[#t.entries + 1] = e
        shp[#shp + 1] = {m.channels, e.bucket[2] // t.vae_scale, e.bucket[1] // t.vae_scale}
      end
    end
    if files then
      t.dataset = f.dataset(m, o.data, {files = list, batch = n, seed = t.seed, timesteps = 1000,
                                        flip_aug = o["flip-aug"], text = not t.caption_aug})
    else -- --plan, --random-crop: the buckets from the images' headers, nothing cached
      t.dataset = data.shapes_only(shp, {batch = n, seed = t.seed})
    end
  elseif not ck.plan_mode or here then
    t.dataset = f.dataset(m, o.data, {batch = n, seed = t.seed, n = o.samples, timesteps = 1000,
                                      height = t.latent, width = t.latent})
  end
  if t.dataset then t.shapes, t.sizes = t.dataset:bucket_shapes() end
end

-- the data must fit the model: the text tensors' shapes, and latents of the
-- model's channels, sides its downsampling divides, no more latent pixels
-- than --resolution gives
local function check_data(t)
  local m, ds = t.m, t.dataset
  local s, source = {}, nil
  if ds and not t.images then
    s, source = ds:shapes()
    for _, want in ipairs(t.family.text_shapes(m)) do
      local name, shape = want[1], want[2]
      if table.concat(s[name], ",") ~= table.concat(shape, ",") then
        error(string.format("%s: tensor '%s' has shape [%s], the model expects [%s]", source, name,
          table.concat(s[name], ", "), table.concat(shape, ", ")))
      end
    end
  end
  for k, sh in ipairs(t.shapes) do
    if #sh ~= 3 or sh[1] ~= m.channels or sh[2] % m.factor ~= 0 or sh[3] % m.factor ~= 0 or
       sh[2] * sh[3] > t.latent * t.latent then
      local where = ds and ds.buckets and ds.files and ds.files[ds.buckets[k].members[1]] or source or "the images"
      error(string.format("%s: tensor 'latents' has shape [%s], the model expects [%d, H, W] with H and W " ..
        "multiples of %d and H x W at most %d x %d (--resolution %d)", where, table.concat(sh, ", "), m.channels,
        m.factor, t.latent, t.latent, t.resolution))
    end
  end
end

-- each rank takes positions rank, rank + world, ... of a global batch of n:
-- the number of them rank r has
local function share_count(t, n, r) return n > r and (n - 1 - r) // t.world + 1 or 0 end

-- the batch sizes of the programs a global batch of n needs on any rank, the
-- largest first (every rank compiles them all, so the ranks' programs and
-- plans are alike); a rank without a sample of a short batch runs one
-- padding row, weighted 0
local function rank_sizes(t, n)
  local out, seen = {}, {}
  for r = 0, t.world - 1 do
    local k = math.max(1, share_count(t, n, r))
    if not seen[k] then seen[k], out[#out + 1] = true, k end
  end
  return out
end

-- bucket k's program at batch size b (a rank's share of its batches), made
-- on first use sharing the first program's weights
local function run_for(t, k, b)
  t.runs[k] = t.runs[k] or {}
  if not t.runs[k][b] then
    t.runs[k][b] = build(t, b, t.checkpoint, ck.plan_mode, {t.shapes[k][2], t.shapes[k][3]}, t.p)
  end
  return t.runs[k][b]
end

-- Every program of the run, before the first step: every bucket's at every
-- batch size a rank's share of its batches has (runs[k][b]), the text
-- encoders' at each batch size with caption augmentation, the image
-- encoder's at each bucket with --random-crop, and the samples', all in one
-- group sharing one copy of the weights, its arena as large as the largest.
local function compile(t)
  local first = rank_sizes(t, t.sizes[1][1])[1]
  local fitted = t.fit_run and first == t.batch and t.shapes[1][2] == t.latent and t.shapes[1][3] == t.latent
  t.run = fitted and t.fit_run or build(t, first, t.checkpoint, ck.plan_mode, {t.shapes[1][2], t.shapes[1][3]})
  t.fit_run = nil
  t.p, t.g, t.adapter = t.run.program, t.run.graph, t.run.adapter
  t.runs = {[1] = {[first] = t.run}}
  t.nprograms, t.program_sizes = 0, {}
  for k = 1, #t.shapes do
    local seen = {}
    t.program_sizes[k] = {}
    for _, n in ipairs(t.sizes[k]) do
      for _, b in ipairs(rank_sizes(t, n)) do
        if not seen[b] then
          seen[b] = true
          run_for(t, k, b)
          t.program_sizes[k][#t.program_sizes[k] + 1] = b
          t.nprograms = t.nprograms + 1
        end
      end
    end
  end
  -- with caption augmentation, the text encoders at each batch size, sharing
  -- one copy of their weights: a batch's captions are made and encoded at each step
  t.text_runs, t.image_runs = {}, {}
  if (t.caption_aug or t.random_crop) and t.images and not ck.plan_mode then
    local one
    for k = 1, #t.shapes do
      for _, n in ipairs(t.program_sizes[k]) do
        if not t.text_runs[n] then
          t.text_runs[n] = t.enc:text_program(n, one and one.program or nil)
          one = one or t.text_runs[n]
        end
      end
    end
  end
  -- with --random-crop, the image encoder at each bucket (batch 1: one image
  -- at a time), sharing one copy of its weights
  if t.random_crop and not ck.plan_mode then
    local one
    for k = 1, #t.shapes do
      local s = t.vae_scale
      local key = t.shapes[k][3] * s .. "x" .. t.shapes[k][2] * s
      t.image_runs[key] = t.enc:image_program(t.shapes[k][3] * s, t.shapes[k][2] * s, one and one.program or nil)
      one = one or t.image_runs[key]
    end
  end
  if t.sampler then t.sampler:compile(t.p, ck.plan_mode) end
  t.bucket_lines = {}
  if #t.shapes > 1 then
    for k, sh in ipairs(t.shapes) do
      for _, n in ipairs(t.program_sizes[k]) do
        local pl = t.runs[k][n].program:plan()
        t.bucket_lines[#t.bucket_lines + 1] = string.format("bucket %dx%d (latents %dx%d), batch %d: %s",
          sh[3] * t.vae_scale, sh[2] * t.vae_scale, sh[3], sh[2], n, plan.fmt_bytes(pl.arena))
      end
    end
    if not ck.plan_mode then
      print(string.format("%d buckets, %d programs sharing one copy of the weights: %s arena (the largest bucket's)",
        #t.shapes, t.nprograms, plan.fmt_bytes(t.p:plan().group_arena)))
      for _, l in ipairs(t.bucket_lines) do print("  " .. l) end
    end
  end
  local all, trainable = t.g:param_count()
  t.trainable_count = trainable
  t.param_count = all - (t.adapter and t.adapter.param_count() or 0) -- the model's own parameters
end

-- --plan: what the run would take, printed (ck.plan.report), nothing run
local function report(t)
  local o = t.o
  local info = {
    {"script", t.name}, {"size", t.m.size}, {"resolution", t.resolution}, {"batch", t.batch},
    {"param_count", t.param_count}, {"trainable_param_count", t.trainable_count},
  }
  local function add(k, v) info[#info + 1] = {k, v} end
  if t.adapter then
    add("lora_param_count", t.adapter.param_count())
    add("lora_modules", #t.adapter.paths)
  end
  if t.fit_reason then add("fit", t.fit_reason) end
  if t.world > 1 then -- one rank of the job: its share of the batch, the gradient sums its buckets hold
    local pl = t.p:plan()
    add("world_size", t.world)
    add("rank_batch", rank_sizes(t, t.sizes[1][1])[1])
    add("buckets", pl.buckets)
    add("bucket_bytes", pl.bucket_bytes)
    if o["shard-optimizer"] then add("shard_optimizer", "rank 0 of " .. t.world) end
  end
  if t.sampler then -- sampling's programs share the arena: the run's is the larger of training and sampling
    add("sample_prompts", #t.sample_prompts)
    for _, kv in ipairs(t.sampler:plan_info(plan.fmt_bytes)) do info[#info + 1] = kv end
  end
  if #t.shapes > 1 then -- every bucket's program, planned into one arena (the largest of them)
    add("buckets", #t.shapes)
    add("bucket_programs", t.nprograms)
    add("group_arena", t.p:plan().group_arena)
    for k, l in ipairs(t.bucket_lines) do add("bucket_program_" .. k, l) end
  end
  plan.report{info = info, program = t.p, checkpoint = t.checkpoint, batch = t.batch,
              build = function(b, pol) return build(t, b, pol, true).program end}
end

-- base weights: --weights by diffusers key, shape-checked, or the base
-- model's through the family; otherwise the seeded init
local function load_weights(t)
  local o, p, noun = t.o, t.p, t.family.noun
  local params = {}
  for _, prm in ipairs(t.g:params()) do
    if prm.kind == "frozen" or t.full then params[#params + 1] = prm end -- the base: frozen, or trained with --full
  end
  local t0 = ck.now()
  if o.weights then
    local f <close> = ck.safetensors(o.weights)
    local map = {}
    for _, prm in ipairs(params) do map[prm.name] = prm.name end
    p:load(f, map)
    print(string.format("loaded %d tensors from %s in %.2f s", #params, o.weights, ck.now() - t0))
  elseif t.m.base then
    local n = t.family.load(t.m, p, params)
    print(string.format("loaded %d %s tensors from %s in %.2f s", n, noun, o["pretrained-model-name-or-path"],
      ck.now() - t0))
  end
end

-- this rank's samples of a global batch (positions rank, rank + world, ...),
-- their rows in it (0-based: what its noise and timesteps are keyed by), and
-- the weight of its loss: its share of the batch's rows times world, as the
-- update takes the mean over the ranks, so that a batch that does not split
-- evenly trains as one process does; a rank without a sample runs the
-- batch's first as a padding row, weighted 0
local function share_of(t, idx)
  if t.world == 1 then return idx, nil, nil end
  local mine, rows = {}, {}
  for at = t.dp_rank + 1, #idx, t.world do
    mine[#mine + 1] = idx[at]
    rows[#rows + 1] = at - 1
  end
  if #mine == 0 then return {idx[1]}, {0}, 0 end
  return mine, rows, t.world * #mine / #idx
end

-- the position in the epoch of the b-th of samples idx: on a data-parallel
-- rank (rows: their rows in the global batch of n, 0-based) the global
-- batch's, so that each sample's draws are those one process makes
local function use_of(t, idx, b, rows, n)
  if rows then return t.dataset.pos - n + rows[b] + 1 end
  return t.dataset.pos - #idx + b
end

local function set_all(r, list, row)
  for _, kv in ipairs(list) do r.program:set(r.inputs[kv[1]], kv[2], row) end
end

-- With --random-crop, the image inputs of samples idx into r's, encoded now:
-- each use's crop (random, or centered for validation) and flip (--flip-aug).
-- With caption augmentation, the text inputs: each caption as this use makes
-- it (augment: shuffled, tags dropped, as ck.imagedata.caption), or as written.
local function encode_batch(t, r, idx, augment, rows, n)
  local o, ds = t.o, t.dataset
  if t.random_crop then
    for b, i in ipairs(idx) do
      local e = t.entries[i]
      local use = use_of(t, idx, b, rows, n)
      local s = imagedata.sample(e, {random_crop = augment, flip_aug = augment and t.flip_aug, seed = t.seed,
                                     epoch = ds.epoch, index = use})
      local vp = t.image_runs[e.bucket[1] .. "x" .. e.bucket[2]]
      local image = ck.image_load(e.path, {resize = e.resized, crop = s.crop, flip = s.flip})
      set_all(r, t.enc:image(vp, image, s, 0x7AF0 + use, t.seed, ds.epoch), b)
    end
  end
  if next(t.text_runs) then
    if not t.text_runs[#idx] then -- a batch size compiled on first use (sharing the weights)
      local _, any = next(t.text_runs)
      t.text_runs[#idx] = t.enc:text_program(#idx, any.program)
    end
    local caps = {}
    for b, i in ipairs(idx) do
      -- the caption settings of i's subset (--dataset-config; false: made once), else the options'
      local settings = t.caption_opts and t.caption_opts[i]
      if settings == nil then settings = t.settings_img.caption end
      if augment and settings then
        local c = {}
        for k, v in pairs(settings) do c[k] = v end
        -- a dataset config's epochs count from 1, as kohya's (caption_dropout_every_n_epochs N drops
        -- the captions of epochs N, 2N, ...)
        c.seed, c.epoch, c.index = t.seed, ds.epoch + (t.caption_opts and 1 or 0), use_of(t, idx, b, rows, n)
        caps[b] = imagedata.caption(t.captions[i], c)
      else
        caps[b] = t.captions[i]
      end
    end
    set_all(r, t.enc:text(t.text_runs[#idx], caps))
  end
end

-- A global batch's inputs into its program (this rank's share), the step's
-- draws prepared (vstep: a validation pass's generator step). Returns the program.
local function feed(t, idx, k, eval, vstep)
  local mine, rows, weight = share_of(t, idx)
  local r = run_for(t, k, #mine)
  local given = t.dataset:load(r.program, r.inputs, mine, eval, rows)
  encode_batch(t, r, mine, not eval, rows, #idx)
  if eval then given.eval = true end
  given.rows, given.weight_scale = rows, weight
  if t.loss_weights then -- kohya's prior_loss_weight for regularization images, 1 for the others
    local w = {}
    for b, i in ipairs(mine) do w[b] = t.loss_weights[i] end
    given.loss_weights = w
  end
  r.objective:prepare(r.program, given, vstep)
  return r.program
end

-- the validation loss on fixed batches: the first samples in file order,
-- fixed noise and timesteps, no dropout
local function validate(t)
  local vb = t.dataset:validation_batches(2)
  local total = 0
  for v, b in ipairs(vb) do
    local mine = share_of(t, b.idx)
    local p = run_for(t, b.bucket, #mine).program
    p.training = false -- no dropout
    feed(t, b.idx, b.bucket, true, -v)
    total = total + p:forward()
    p.training = true
  end
  if t.world > 1 then total = ck.allreduce({total})[1] / t.world end -- the mean of the ranks' shares
  return total / #vb
end

-- every rank must train the same thing: its script, options, program and
-- starting weights are compared with rank 0's before the first step
local function same_on_all_ranks(t)
  if t.world == 1 then return end
  local p = t.p
  local parts = {ck.json_encode(t.args), tostring(t.world), tostring(p:plan().ops), tostring(p:plan().persistent)}
  for _, prm in ipairs(t.g:params()) do
    if prm.kind == "param" then parts[#parts + 1] = prm.name .. "=" .. p:checksum(prm.name) end
  end
  local same, other = ck.same_on_all_ranks(table.concat(parts, "\n"))
  if not same then
    error(string.format("rank %d's script, options or weights differ from rank 0's: every rank of a job must run " ..
      "the same training", other))
  end
end

-- The adapter as a file (with --full, the model in diffusers key names), its
-- metadata kohya's (ss_*) saying how far training went; rank 0 writes it.
local OPTIMIZER_CLASS = {adamw = "torch.optim.adamw.AdamW", adamw8bit = "bitsandbytes.optim.adamw.AdamW8bit",
                         lion = "lion_pytorch.lion_pytorch.Lion"}
local function save(t, path, at_step)
  if t.dp_rank > 0 then return end
  local o, p = t.o, t.p
  local d = path:match("^(.*)/[^/]*$")
  if d and d ~= "" then assert(ck.mkdir(d)) end
  local meta = {
    ss_learning_rate = tostring(o.lr), ss_max_train_steps = tostring(t.steps), ss_steps = tostring(at_step),
    ss_seed = tostring(t.seed), ss_lr_scheduler = o["lr-scheduler"], ss_lr_warmup_steps = tostring(o["lr-warmup-steps"]),
    ss_max_grad_norm = tostring(t.max_grad_norm), ss_gradient_accumulation_steps = tostring(t.accumulate),
    ss_optimizer = OPTIMIZER_CLASS[o.optimizer],
    ss_resolution = string.format("(%d, %d)", t.resolution, t.resolution),
    ss_gradient_checkpointing = policy.name(t.checkpoint) == "none" and "False" or "True",
    ss_fp8_base = t.fp8_base and "True" or "False", ss_mixed_precision = t.precision,
    ss_training_comment = "trained with ckrun " .. ck.version,
  }
  for k, v in pairs(t.family.metadata and t.family.metadata(t.m) or {}) do meta[k] = v end
  -- peft: the folder's adapter_config.json and adapter_model.safetensors are the final adapter's, not a snapshot's
  if not t.full then
    return t.family.save_adapter(p, t.adapter, path, {format = o["lora-format"], dtype = t.save_dtype, metadata = meta,
                                                      peft_folder = path == t.out})
  end
  local entries = {}
  for _, prm in ipairs(t.g:params()) do entries[#entries + 1] = {prm.name, prm.name} end
  meta.format = "pt"
  p:save(path, entries, {metadata = meta, dtype = t.save_dtype})
end

-- what a state records of the run: a resumed run must match it
local function settings(t)
  local o = t.o
  -- batch: the global batch, which a job of other ranks resumes
  local s = {size = t.m.size, resolution = t.resolution, batch = t.batch * t.world,
             rank = o.rank, alpha = o.alpha, seed = t.seed, full = t.full, network_dropout = o["network-dropout"],
             loraplus_lr_ratio = o["loraplus-lr-ratio"], lr = o.lr, lr_scheduler = o["lr-scheduler"],
             lr_warmup_steps = o["lr-warmup-steps"], max_grad_norm = t.max_grad_norm,
             gradient_accumulation_steps = t.accumulate, optimizer = o.optimizer, weight_decay = o["weight-decay"],
             fp8_base = t.fp8_base}
  for k, v in pairs(t.family.settings(t.m)) do s[k] = v end
  return s
end

-- resume: the saved step, adapter, optimizer state and data position
local function resume(t)
  local o = t.o
  if not o.resume then return end
  local from = o.resume == true and t.state_dir or o.resume
  local path = state.latest(from) or error("--resume: no saved state in '" .. tostring(from) .. "'")
  local meta = state.load(t.p, path, settings(t))
  t.resumed_log_dir = meta["log.dir"]
  if t.dp_rank == 0 then state.prune(from, o["keep-states"]) end
  -- the data position, read from the file: an epoch is at least one step, and
  -- a position within the epoch at most the set's size
  local ds = t.dataset
  ds.epoch = state.count(meta, "data.epoch", path, 0, t.p.steps)
  ds.pos = state.count(meta, "data.pos", path, 0, ds.n)
  ds:shuffle()
  print(string.format("resumed from %s at step %d", path, t.p.steps))
end

-- the log (a resumed run continues the one it had, without the steps after its state)
local function open_log(t)
  local o, start = t.o, t.p.steps + 1
  t.log_dir = t.dp_rank == 0 and (o["log-dir"] or t.resumed_log_dir or log.run_dir("runs")) or nil
  if start > 1 and t.log_dir then log.rewind(t.log_dir, start - 1) end
  t.logger = log.new{dir = t.log_dir, every = t.log_every, async = o["log-async"], flush_interval = o["log-flush"],
    steps = t.steps, batch = t.batch * t.world, blocks = t.family.blocks, on_nonfinite = "stop",
    stop_note = "nothing was saved", world = t.world, progress = t.dp_rank == 0}
  if start == 1 then t.logger:write{step = 0, val_loss = t.val_before} end
  if t.fit_reason then
    t.logger:write{step = start - 1, checkpoint = policy.name(t.checkpoint), batch = t.batch, fit = t.fit_reason}
  end
end

-- the samples at this step, each rendering's time logged beside the steps' (sample_time)
local function render(t, step)
  if t.sampler then
    local secs, files = t.sampler:render(step, t.logger)
    t.logger:print(string.format("step %d: %d sample%s in %.1f s (%s)", step, #files, #files == 1 and "" or "s", secs,
      t.sampler.dir))
  end
  if t.world > 1 then -- the other ranks wait for rank 0's samples: up to an hour, then the job ends
    local was = ck.dist_timeout()
    ck.dist_timeout(math.max(was, 3600))
    ck.barrier()
    ck.dist_timeout(was)
  end
end

-- One training step: the next global batch, this rank's share of it fed to
-- its bucket's program, the step run with what the logger asks for, and the
-- logger told what happened. Returns the loss (the mean over the ranks).
local function train_step(t)
  local idx, k = t.dataset:next_indices()
  local p = feed(t, idx, k, false)
  local want = t.logger:request(p, {lr = t.lr_at(t.p.updates)})
  local t0 = ck.now()
  local loss, info = p:step(want)
  -- a non-finite loss or gradient stops the run here, naming the step and the op
  return (t.logger:observe(p, loss, info, t0, ck.now()))
end

-- after step: validation, samples, the adapter's snapshots and training states, at their cadences
local function after_step(t, step)
  local o, steps = t.o, t.steps
  local val_every = o["val-every"]
  if val_every > 0 and step % val_every == 0 then
    local v = validate(t)
    t.logger:write{step = step, val_loss = v}
    t.logger:print(string.format("step %d: validation loss %.4f", step, v))
  end
  if t.sample_prompts and t.sample_every > 0 and step % t.sample_every == 0 then render(t, step) end
  local every = o["save-lora-every"]
  if every > 0 and step % every == 0 and step < steps then
    local path = (t.out:gsub("%.safetensors$", "")) .. string.format("-step%08d.safetensors", step)
    save(t, path, step)
    t.logger:print("wrote " .. path)
  end
  if t.save_every > 0 and step % t.save_every == 0 and step < steps then
    local meta = {["data.epoch"] = t.dataset.epoch, ["data.pos"] = t.dataset.pos, ["log.dir"] = t.log_dir}
    for k, v in pairs(settings(t)) do meta[k] = v end
    t.logger:flush(true) -- the log holds every step the state holds
    if t.world > 1 then ck.barrier() end -- every rank has finished the step the state holds
    state.save(t.p, t.state_dir, meta, o["keep-states"]) -- rank 0 writes it; with ZeRO-1 the others send their shares
  end
end

-- the run's memory against the plan's bound (README, "Memory outside the plan")
local function memory_line(t)
  local all = {t.p} -- every program the run holds: the buckets', the encoders', the samples'
  for _, byn in pairs(t.runs) do for _, r in pairs(byn) do if r.program ~= t.p then all[#all + 1] = r.program end end end
  for _, r in pairs(t.text_runs) do all[#all + 1] = r.program end
  for _, r in pairs(t.image_runs) do all[#all + 1] = r.program end
  for _, sp in ipairs(t.sampler and t.sampler:programs() or {}) do all[#all + 1] = sp end
  return memory.summary(t.p, t.device_before, all, t.encode_bound)
end

-- the sample prompts through the text encoders, once, before the training programs exist
local function encode_prompts(t)
  if not t.sampler or ck.plan_mode then return end
  local b = t.sampler:encode()
  if b and (not t.encode_bound or b > t.encode_bound) then t.encode_bound = b end
end

-- the run's first line: what trains, on what, how long
local function announce(t)
  local o = t.o
  print(string.format("training %s of %s (%d parameters, %d trainable), %dx%d, batch %d, %d steps, %s",
    t.full and "every parameter" or string.format("LoRA rank %d%s on %d modules", o.rank, t.family.adapter_words(t.m),
      #t.adapter.paths), t.m.label, t.param_count, t.trainable_count, t.resolution, t.resolution, t.batch, t.steps,
    t.m.objective_words))
end

-- the training losses the run ends by saying: the first, and the mean of the last 20
local function loss_summary()
  local s = {window = {}, recent = 0}
  function s.add(l)
    s.first = s.first or l
    s.window[#s.window + 1] = l
    s.recent = s.recent + l
    if #s.window > 20 then s.recent = s.recent - table.remove(s.window, 1) end
  end
  return s
end

local function train(args, script)
  local t = {args = args, family = script.family,
             name = script.name or (tostring(args.script or "train"):match("([^/]+)$"):gsub("%.lua$", ""))}
  t.o = parse(args, script)
  if not t.o then return end -- --help
  read_datasets(t)
  settle(t)
  describe(t)
  sampler(t)
  fit_to_memory(t)
  load_data(t)
  check_data(t)
  encode_prompts(t)
  t.device_before = not ck.plan_mode and memory.device_used() or nil -- a GPU's memory in use before the programs
  compile(t)
  if ck.plan_mode then return report(t) end
  load_weights(t)
  same_on_all_ranks(t)
  announce(t)
  t.val_before = validate(t)
  if t.o["val-every"] > 0 then print(string.format("step 0: validation loss %.4f", t.val_before)) end
  resume(t)
  open_log(t)
  local logger <close> = t.logger -- an error from here on closes the log whole
  local start, steps = t.p.steps + 1, t.steps
  if t.sample_prompts and t.o["sample-at-first"] and start == 1 then render(t, 0) end
  local losses, step_time = loss_summary(), 0
  for step = start, steps do
    local t0 = ck.now()
    losses.add(train_step(t))
    if step > start then step_time = step_time + (ck.now() - t0) end
    after_step(t, step)
  end
  if steps > start then
    print(string.format("step time: %.1f ms (mean of steps %d-%d, data loading included)",
      1e3 * step_time / (steps - start), start + 1, steps))
  end
  if losses.first then
    print(string.format("training loss: first step %.4f, mean of the last %d steps %.4f", losses.first,
      #losses.window, losses.recent / #losses.window))
  end
  local val_after = validate(t)
  logger:write{step = t.p.steps, val_loss = val_after}
  print(string.format("validation loss (fixed batches): before %.4f, after %.4f", t.val_before, val_after))
  logger:close()
  if t.log_dir then print("wrote logs to " .. t.log_dir) end
  save(t, t.out, t.p.steps)
  print("wrote " .. t.out)
  print(memory_line(t))
end

-- Trains as script = {family = a family module, about = the script's line
-- for --help, options = the script's own ck.options entries, name = what
-- --plan calls the script (default: its file's name)} and args (the
-- command line) say. Every error names the script's line that called run.
function M.run(args, script)
  assert(type(script) == "table" and type(script.family) == "table", "train.run(args, {family = ..., about = ...})")
  local ok, err = xpcall(train, script_line, args, script)
  if not ok then error(err, 0) end
end

return M
