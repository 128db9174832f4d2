-- ckrun's side of the training-step comparison in bench/gpu_check.sh: one
-- SDXL-shaped UNet LoRA training step (epsilon objective, MSE, backward, AdamW)
-- compiled on the CUDA backend under each checkpoint policy; one JSON line per
-- policy on stdout, progress on stderr. bench/gpu_step_torch.py reads the lines
-- and runs the same cases in PyTorch.
--
--   ckrun --trust bench/gpu_step.lua --case tiny        sdxl-tiny, 64x64 latents (512x512 pixels)
--   ckrun --trust bench/gpu_step.lua --case full        full SDXL, 128x128 latents (1024x1024), or
--                                                       64x64 (512x512) when 128x128 does not fit
--
-- The options: ckrun --trust bench/gpu_step.lua --help.
--
-- Per policy: free device memory (cudaMemGetInfo, after the device is open, so
-- the backend's fixed bytes are already held) before the compile; the compile;
-- one step with measure = true (the arena's high-water mark, found by a
-- sentinel fill; not timed); --warmup steps; --steps timed steps (wall clock
-- around p:step(), which waits for the device to return the loss); free device
-- memory again; the program is closed before the next policy. Every program
-- starts from the same weights and sees the same inputs at each step, so the
-- losses of a recompute policy should be none's bit for bit (reported, not
-- required: cuDNN may pick another algorithm when a plan gives a convolution
-- another workspace).
--
-- The first line describes the case (event "case"); then one line per policy.
-- JSON fields: impl ("ckrun"), case, model, lora, rank, batch, latent, pixels, precision
-- (--mixed-precision: no, bf16, fp16), optimizer, fused_backward,
-- requested_latent, fallback (why the case runs smaller), policy, device,
-- params, trainable, compile_s, step_ms (median), step_ms_all, warmup, steps,
-- plan_peak, plan_persistent, plan_activation_bytes, arena, measured_peak
-- (arena high-water), peak_match, fixed (the backend's bytes outside any
-- plan), predicted_total (the arena in the driver's 2 MiB pages + fixed), cuda_free_before,
-- cuda_free_after, cuda_total, cuda_used (free before minus free after: the
-- arena and whatever the step's libraries loaded), measured_total (cuda_used
-- + fixed), graph_captures, graph_launches, graph_op_by_op (p:graphs() after
-- the steps: the lists' ranges captured, replayed, or run op by op), step_flops, recompute_flops, recompute_share (recompute FLOPs over
-- the step's FLOPs without recompute), recompute_ops, losses,
-- same_losses_as_none, error. Exits non-zero when a policy failed (its line
-- says why).
local ck = require "ck"
local unet = require "ck.unet"
local sdxl = require "ck.sdxl"
local policy = require "ck.policy"
local plan = require "ck.plan"

local options = require "ck.options"

local o = options.parse(args, {
  about = "One SDXL UNet LoRA training step per checkpoint policy on the GPU: one JSON line per policy.",
  {"case", "choice", "tiny", "sdxl-tiny or full SDXL", choices = {"tiny", "full"}},
  {"latent", "integer", function(v) return v.case == "full" and 128 or 64 end, "the latent side", min = 1,
   shown = "tiny 64, full 128"},
  {"fallback", "string", function(v) return v.case == "full" and 64 or "none" end,
   "the latent side to run at when none's planned peak plus the backend's fixed bytes and --headroom do not fit " ..
   "the free device memory", arg = "N|none", shown = "full 64, tiny none",
   check = function(v) return v == "none" or (math.tointeger(tonumber(v)) or 0) >= 1 end,
   says = "must be a latent side or none"},
  {"batch", "integer", 1, "samples per step", min = 1},
  {"lora", "flag", true, "rank --rank adapters on to_q/to_k/to_v/to_out.0 of a frozen base; false trains " ..
   "every parameter", arg = "true|false"},
  {"optimizer", "choice", "adamw", "the optimizer", choices = {"adamw", "adamw8bit"}},
  {"fused-backward", "flag", false, "each update as soon as its gradient is complete", arg = "true|false"},
  {"rank", "integer", 4, "the adapters' rank", min = 1},
  {"mixed-precision", "choice", "no", "no: fp32; bf16 or fp16: activations and frozen weights stored in 16 bits " ..
   "(compile's precision)", choices = {"no", "bf16", "fp16"}},
  {"policies", "list", "none,diffusers,budget:62%", "the checkpoint policies (a budget percentage is of none's peak)"},
  {"warmup", "integer", 1, "untimed steps after the measuring one", min = 0},
  {"steps", "integer", 5, "timed steps", min = 1},
  {"device", "choice", "cuda", "cpu: no device memory figures, for trying the script without a GPU",
   choices = {"cuda", "cpu"}},
  {"headroom", "size", "1 GiB", "device memory left free when choosing the latent side"},
  {"seed", "integer", 1, "the seed of weights and inputs", min = 0},
  {"warm", "flag", true, "on cuda, one untimed step of the first policy before anything is measured, so that " ..
   "the kernel modules CUDA loads on first use count as context", arg = "true|false"},
})
if not o then return end
local case = o.case
local model_name = case == "full" and "sdxl" or "sdxl-tiny"
local config = unet.config(model_name)
local requested = o.latent
local fallback = o.fallback ~= "none" and math.tointeger(tonumber(o.fallback)) or nil
local batch = o.batch
local use_lora = o.lora
local optimizer = o.optimizer
local fused = o["fused-backward"]
local precision = o["mixed-precision"]
local rank = o.rank
local warmup = o.warmup
local steps = o.steps
local device = o.device
local headroom = o.headroom
local seed = o.seed
local warm = o.warm
local names = o.policies
for _, n in ipairs(names) do policy.parse(n) end -- a typo fails before anything runs

local function log(fmt, ...)
  io.stderr:write(string.format("gpu_step: " .. fmt .. "\n", ...))
  io.stderr:flush()
end

if device == "cuda" then
  local usable = false
  for _, d in ipairs(ck.devices()) do usable = usable or d == "cuda" end
  if not usable then
    error("no CUDA device is usable here (no driver, no device, or a build without the CUDA backend)", 0)
  end
end

-- free, total device bytes (nil on the CPU)
local function device_memory()
  if device ~= "cuda" then return nil end
  return ck.device_memory()
end

-- one training step of the UNet (LoRA or full), compiled for `device`
local function build(latent, checkpoint, plan_only)
  return sdxl.training_step{
    config = config, batch = batch, latent = latent, lora = use_lora and {rank = rank},
    objective = {prediction = "eps", seed = seed},
    compile = {optimizer = optimizer, lr = 1e-4, weight_decay = 1e-2, seed = seed, checkpoint = checkpoint,
               plan_only = plan_only, device = device, fused_backward = fused,
               precision = precision},
  }
end

-- fresh inputs for the step about to run (keyed by the step: every program sees
-- the same ones at the same step), outside the timed region
local function prepare(r, latent)
  local p = r.program
  p:randn(r.inputs.latents, 0x7400)
  p:randn(r.inputs.prompt_embeds, 0x7500, 0.5)
  p:randn(r.inputs.pooled_prompt_embeds, 0x7600, 0.5)
  local px = latent * 8
  local ids = {}
  for _ = 1, batch do
    for _, v in ipairs({px, px, 0, 0, px, px}) do ids[#ids + 1] = v end
  end
  p:set(r.inputs.time_ids, ids)
  r.objective:prepare(p)
end

local median = plan.median

local function strip(e) return plan.strip_where(tostring(e)) end

-- ---- the latent side: the requested one if none's plan fits the free device memory
local latent, fallback_note = requested, nil
if device == "cuda" and fallback and fallback ~= requested then
  local free = device_memory()
  local ok, r = pcall(build, requested, policy.none(), true)
  local need, why
  if ok then
    local _, fixed = r.program:device()
    need = r.program:plan().peak + fixed
    why = string.format("none's planned peak + fixed bytes %d + headroom %d > free device memory %d",
                        need, headroom, free or -1)
  else
    why = "planning failed: " .. strip(r)
  end
  if not ok or not free or need + headroom > free then
    latent = fallback
    fallback_note = string.format("%dx%d pixels (%dx%d latents) does not fit: %s; ran at %dx%d pixels",
      requested * 8, requested * 8, requested, requested, why, fallback * 8, fallback * 8)
    log("%s", fallback_note)
  end
  r = nil
  collectgarbage()
  collectgarbage()
end

-- ---- one untimed step before any figure: CUDA loads kernel modules (ours,
-- cuBLAS's, cuDNN's) on their first launch, and that device memory belongs to
-- the context, not to the first policy measured
if warm and device == "cuda" then
  local t0 = ck.now()
  do
    local r = build(latent, policy.parse(names[1]), false)
    local p <close> = r.program
    prepare(r, latent)
    p:step()
  end
  collectgarbage()
  collectgarbage()
  log("warm-up step (%s) in %.1f s: kernel modules loaded before the measurements", names[1], ck.now() - t0)
end

local what = string.format("%s, %dx%d latents (%dx%d pixels), batch %d, %s", model_name, latent, latent, latent * 8,
  latent * 8, batch, use_lora and string.format("LoRA rank %d", rank) or "full fine-tune")
log("%s on %s: %d warm-up and %d timed steps per policy", what, device, warmup, steps)
-- the case first, so that the PyTorch side knows it even if no policy finishes
print(plan.json(plan.object{
  {"impl", "ckrun"}, {"event", "case"}, {"case", case}, {"model", model_name}, {"lora", use_lora},
  {"rank", use_lora and rank or nil}, {"batch", batch}, {"latent", latent}, {"pixels", latent * 8},
  {"requested_latent", requested}, {"fallback", fallback_note}, {"device", device}, {"policies", names},
  {"precision", precision}, {"optimizer", optimizer}, {"fused_backward", fused},
}))
io.stdout:flush()

local none_losses
local failed = 0
for _, name in ipairs(names) do
  collectgarbage()
  collectgarbage()
  local row = {}
  local function run()
    local free_before, total = device_memory()
    row.cuda_free_before, row.cuda_total = free_before, total
    local t0 = ck.now()
    local r = build(latent, policy.parse(name), false)
    local p <close> = r.program
    row.compile_s = ck.now() - t0
    local all, trainable = r.graph:param_count()
    row.params, row.trainable = all, trainable
    local pl = p:plan()
    local dev, fixed = p:device()
    row.device, row.fixed = dev, fixed
    row.plan_peak, row.plan_persistent, row.arena = pl.peak, pl.persistent, pl.arena
    row.plan_activation_bytes = pl.activation_bytes
    row.step_flops, row.recompute_flops, row.recompute_ops = pl.step_flops, pl.recompute_flops, pl.recompute_ops
    row.recompute_share = plan.summary(p).recompute_pct / 100
    row.predicted_total = pl.device_bytes
    log("%s: compiled in %.1f s, planned peak %d bytes, fixed %d", name, row.compile_s, pl.peak, fixed)
    local losses = {}
    prepare(r, latent)
    local info
    losses[1], info = p:step{measure = true}
    row.measured_peak = info.high_water
    row.peak_match = row.measured_peak == pl.peak
    for _ = 1, warmup do
      prepare(r, latent)
      losses[#losses + 1] = p:step()
    end
    local times = {}
    for i = 1, steps do
      prepare(r, latent)
      local s0 = ck.now()
      losses[#losses + 1] = p:step()
      times[i] = 1e3 * (ck.now() - s0)
    end
    local free_after = device_memory()
    row.cuda_free_after = free_after
    if free_before and free_after then
      row.cuda_used = free_before - free_after
      row.measured_total = row.cuda_used + fixed
    end
    row.step_ms, row.step_ms_all = median(times), times
    -- the lists' ranges over all the steps: captured as CUDA graphs and
    -- replayed, or run op by op
    local g = p:graphs()
    row.graph_captures, row.graph_launches, row.graph_op_by_op = g.captures, g.launches, g.op_by_op
    row.losses = losses
    if name == "none" then none_losses = losses end
    if none_losses and name ~= "none" then
      local same = #none_losses == #losses
      for i = 1, #losses do same = same and losses[i] == none_losses[i] end
      row.same_losses_as_none = same
    end
    log("%s: step %.2f ms (median of %d), measured peak %d (%s), device bytes used %s; CUDA graphs: %d captures, " ..
        "%d launches, %d ranges op by op", name, row.step_ms, steps, row.measured_peak,
        row.peak_match and "= plan" or "PLAN SAYS " .. pl.peak, tostring(row.cuda_used), row.graph_captures,
        row.graph_launches, row.graph_op_by_op)
  end
  local ok, err = pcall(run)
  if not ok then
    row.error = strip(err)
    failed = failed + 1
    log("%s: FAILED: %s", name, row.error)
  end
  print(plan.json(plan.object{
    {"impl", "ckrun"}, {"case", case}, {"model", model_name}, {"lora", use_lora}, {"rank", use_lora and rank or nil},
    {"batch", batch}, {"latent", latent}, {"pixels", latent * 8}, {"requested_latent", requested},
    {"fallback", fallback_note}, {"policy", name}, {"device", row.device or device},
    {"precision", precision}, {"optimizer", optimizer}, {"fused_backward", fused},
    {"params", row.params}, {"trainable", row.trainable}, {"compile_s", row.compile_s},
    {"step_ms", row.step_ms}, {"step_ms_all", row.step_ms_all}, {"warmup", warmup}, {"steps", steps},
    {"plan_peak", row.plan_peak}, {"plan_persistent", row.plan_persistent},
    {"plan_activation_bytes", row.plan_activation_bytes}, {"arena", row.arena},
    {"measured_peak", row.measured_peak}, {"peak_match", row.peak_match}, {"fixed", row.fixed},
    {"predicted_total", row.predicted_total}, {"cuda_free_before", row.cuda_free_before},
    {"cuda_free_after", row.cuda_free_after}, {"cuda_total", row.cuda_total}, {"cuda_used", row.cuda_used},
    {"measured_total", row.measured_total}, {"graph_captures", row.graph_captures},
    {"graph_launches", row.graph_launches}, {"graph_op_by_op", row.graph_op_by_op}, {"step_flops", row.step_flops}, {"recompute_flops", row.recompute_flops},
    {"recompute_share", row.recompute_share}, {"recompute_ops", row.recompute_ops}, {"losses", row.losses},
    {"same_losses_as_none", row.same_losses_as_none}, {"error", row.error},
  }))
  io.stdout:flush()
end
if failed > 0 then error(string.format("%d of %d policies failed (see the error fields)", failed, #names), 0) end
