-- Flow matching (rectified flow) for Flux.1: the training objective as
-- kohya's sd-scripts (flux_train_network.py, library/flux_train_utils.py),
-- ai-toolkit and diffusers (train_dreambooth_lora_flux.py, training_utils.py)
-- train it, and the Euler sampler with the resolution-dependent shift as
-- diffusers' FluxPipeline and FlowMatchEulerDiscreteScheduler sample it.
--
-- Training (the Flux counterpart of ck.diffusion):
--   x_t = (1 - sigma) x0 + sigma noise,  target = noise - x0,
--   loss = mean(w * (prediction - target)^2)
-- with the latents x0 [B, 16, H, W]; the model's input and output are packed
-- 2x2 into 64 channels inside the graph by the family's model_fn
-- (flux_step.training_step). Per-sample sigmas, the model's timesteps and the loss
-- weights are inputs set before each step from the counter-based generator
-- keyed by (seed, step, row), as ck.diffusion draws its timesteps.
--
-- The contract with a trainer (ck.train's Flux family):
--   local flow = require "ck.flow"
--   spec entries:   flow.OPTIONS (options.parse entries, kohya's names with
--                   hyphens; their defaults are kohya's)
--   objective:      local obj = flow.objective(flow.from_options(o)) (o: the
--                   parsed values; plus seed, ip_noise_gamma from the shared
--                   options), then flux_step.training_step{objective = obj, ...}
--                   calls obj:build(g, {B, 16, H, W}, model_fn) -> loss, with
--                   model_fn(noisy, timesteps) -> prediction [B, 16, H, W]
--   guidance:       obj.guidance_input = r.inputs.guidance (flux-dev's
--                   guidance input; nil for schnell): prepare fills it with
--                   guidance_scale
--   each step:      obj:prepare(p, given [, step]) -> sigmas, timesteps.
--                   given: {noise = true (already loaded), sigmas = {..} or
--                   timesteps = {..} (kohya's t = 1000 sigma) per sample,
--                   rows = {..} (data parallel: each sample's row in the
--                   global batch), weight_scale (every sample's weight times
--                   it), loss_weights = {..} (per sample: kohya's
--                   prior_loss_weight for regularization images), eval =
--                   true (no input perturbation)}
--   after build:    obj.inputs = {latents, noise, timesteps, sigma,
--                   one_minus_sigma, weight, ip (with ip_noise_gamma)}
--
-- Sampling: flow.schedule{steps, image_seq_len, config} gives FluxPipeline's
-- sigmas and timesteps (FLUX.1-dev's scheduler shifts by mu from 0.5 at 256
-- image tokens to 1.15 at 4096; schnell's does not shift), and
-- flow.sampler's step is FlowMatchEulerDiscreteScheduler.step. Both round
-- every value to float32 as diffusers computes it, so the schedule is
-- diffusers' bit for bit.
local ck = require "ck"

local flow = {}

-- the random streams: the uniform draw is ck.diffusion's timestep stream,
-- the noise and input perturbation its streams too; the normal draw its own
local KEY_U, KEY_NOISE, KEY_IP, KEY_Z = 0x7100, 0x7200, 0x7400, 0x7800

-- the value float32 holds for x (round to nearest even)
local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end
flow.f32 = f32

local function finite(x) return type(x) == "number" and x == x and x > -math.huge and x < math.huge end

---- the pieces both tools share

-- diffusers' calculate_shift (kohya's get_lin_function): mu linear in the
-- image's token count, base_shift at base_seq_len tokens, max_shift at
-- max_seq_len. o: base_seq_len = 256, max_seq_len = 4096, base_shift = 0.5,
-- max_shift = 1.15 (FLUX.1-dev's scheduler config).
function flow.calculate_shift(seq_len, o)
  o = o or {}
  local x1, x2 = o.base_seq_len or 256, o.max_seq_len or 4096
  local y1, y2 = o.base_shift or 0.5, o.max_shift or 1.15
  local m = (y2 - y1) / (x2 - x1)
  local b = y1 - m * x1
  return seq_len * m + b
end

-- time_shift(mu, s, t) = e^mu / (e^mu + (1/t - 1)^s) (Black Forest Labs'
-- sampling.py, kohya's, diffusers' "exponential" type), in double
function flow.time_shift(mu, s, t)
  local e = math.exp(mu)
  return e / (e + (1 / t - 1) ^ s)
end

-- the static shift: shift t / (1 + (shift - 1) t) (SD3's, kohya's --discrete_flow_shift)
function flow.shift(t, shift)
  return t * shift / (1 + (shift - 1) * t)
end

local function sigmoid(x) return 1 / (1 + math.exp(-x)) end

-- compute_loss_weighting_for_sd3: sigma_sqrt 1 / sigma^2, cosmap 2 / (pi (1 -
-- 2 sigma + 2 sigma^2)), anything else 1
function flow.loss_weighting(scheme, sigma)
  if scheme == "sigma_sqrt" then return sigma ^ -2.0 end
  if scheme == "cosmap" then return 2 / (math.pi * (1 - 2 * sigma + 2 * sigma * sigma)) end
  return 1.0
end

-- compute_density_for_timestep_sampling on one sample: logit_normal
-- sigmoid(mean + std z), mode 1 - u - mode_scale (cos(pi u / 2)^2 - 1 + u),
-- anything else u. u: a U[0, 1) draw, z: an N(0, 1) draw.
function flow.density(scheme, u, z, o)
  o = o or {}
  if scheme == "logit_normal" then return sigmoid((o.logit_mean or 0.0) + (o.logit_std or 1.0) * z) end
  if scheme == "mode" then
    local c = math.cos(math.pi * u / 2)
    return 1 - u - (o.mode_scale or 1.29) * (c * c - 1 + u)
  end
  return u
end

-- The training scheduler's tables (FlowMatchEulerDiscreteScheduler's
-- constructor, kohya's copy of it, with num_train_timesteps n and a static
-- shift): sigmas[i] = shift(i / n) for i = n .. 1 and timesteps = n sigmas,
-- each value as float32 computes it. FLUX.1-dev's diffusers config shifts
-- dynamically, so its table is unshifted (shift 1).
local tables = {}
function flow.train_table(n, shift)
  n, shift = n or 1000, shift or 1.0
  local key = n .. " " .. string.format("%.17g", shift)
  if tables[key] then return tables[key] end
  local s32, d32 = f32(shift), f32(shift - 1)
  local sig, ts = {}, {}
  for i = 1, n do
    -- np.linspace(1, n, n, dtype=float32)[::-1]: whole numbers, exact
    local s = f32((n + 1 - i) / n)
    if shift ~= 1.0 then s = f32(f32(s32 * s) / f32(1 + f32(d32 * s))) end
    sig[i], ts[i] = s, f32(s * n)
  end
  tables[key] = {sigmas = sig, timesteps = ts}
  return tables[key]
end

---- the training objective

flow.TIMESTEP_SAMPLING = {"sigma", "uniform", "sigmoid", "shift", "flux_shift"}
flow.MODEL_PREDICTION_TYPES = {"raw", "additive", "sigma_scaled"}
flow.WEIGHTING_SCHEMES = {"uniform", "none", "sigma_sqrt", "logit_normal", "mode", "cosmap"}
flow.APPLY_WEIGHTING = {"sigma_scaled", "always"}

-- the objective's options and their defaults: kohya's (flux_train_utils.py's
-- add_flux_train_arguments and train_util.py's --weighting_scheme)
flow.DEFAULTS = {
  timestep_sampling = "sigma", sigmoid_scale = 1.0, discrete_flow_shift = 3.0, model_prediction_type = "sigma_scaled",
  guidance_scale = 3.5, weighting_scheme = "uniform", logit_mean = 0.0, logit_std = 1.0, mode_scale = 1.29,
  apply_weighting = "sigma_scaled", ip_noise_gamma = 0.0, num_train_timesteps = 1000, seed = 0,
}

-- The options a Flux training script declares (options.parse entries). Their
-- values go to flow.objective through flow.from_options.
flow.OPTIONS = {
  {"timestep-sampling", "choice", "sigma", "how sigma is drawn: sigma (an index into the scheduler's " ..
   "table shifted by --discrete-flow-shift, drawn by --weighting-scheme), uniform, sigmoid (of a normal times " ..
   "--sigmoid-scale), shift (sigmoid, then --discrete-flow-shift), flux_shift (sigmoid, then FLUX.1-dev's " ..
   "resolution-dependent shift); kohya recommends flux_shift or shift", choices = flow.TIMESTEP_SAMPLING},
  {"sigmoid-scale", "number", 1.0, "the normal draw's scale for sigmoid, shift and flux_shift"},
  {"discrete-flow-shift", "number", 3.0, "the shift of --timestep-sampling sigma and shift: " ..
   "shift s / (1 + (shift - 1) s)", above = 0},
  {"model-prediction-type", "choice", "sigma_scaled", "the prediction compared with noise - latents: raw (the " ..
   "model's output; kohya recommends it), additive (output + noisy latents), sigma_scaled (noisy latents - sigma " ..
   "output, SD3's, the only one --weighting-scheme's loss weights apply to unless --apply-weighting always)",
   choices = flow.MODEL_PREDICTION_TYPES},
  {"guidance-scale", "number", 3.5, "the guidance FLUX.1-dev's guidance embedding sees while training " ..
   "(kohya's default; kohya and diffusers' blog train with 1.0)", min = 0},
  {"weighting-scheme", "choice", "uniform", "SD3's scheme: the draw of --timestep-sampling sigma " ..
   "(logit_normal, mode; others uniform) and the loss weight (sigma_sqrt: 1 / sigma^2, cosmap; others 1)",
   choices = flow.WEIGHTING_SCHEMES},
  {"logit-mean", "number", 0.0, "logit_normal's mean"},
  {"logit-std", "number", 1.0, "logit_normal's standard deviation", above = 0},
  {"mode-scale", "number", 1.29, "mode's scale"},
  {"apply-weighting", "choice", "sigma_scaled", "when --weighting-scheme's loss weights apply: with sigma_scaled " ..
   "predictions only (kohya's) or always (diffusers' train_dreambooth_lora_flux.py)", choices = flow.APPLY_WEIGHTING},
}

-- flow.from_options(o) -> flow.objective's table from options.parse's values
-- of flow.OPTIONS (o["timestep-sampling"], ...)
function flow.from_options(o)
  local t = {}
  for _, e in ipairs(flow.OPTIONS) do t[(e[1]:gsub("%-", "_"))] = o[e[1]] end
  return t
end

local function one_of(v, list)
  for _, c in ipairs(list) do if v == c then return true end end
  return false
end

local Objective = {}
Objective.__index = Objective
flow.Objective = Objective

-- flow.objective(o) -> an objective: o's keys are flow.DEFAULTS' (a key it
-- lacks is refused, as is a value out of range), each defaulting to kohya's;
-- seed keys the draws, num_train_timesteps the scheduler's table.
function flow.objective(o)
  if o ~= nil and type(o) ~= "table" then error("flow.objective: give a table of options", 2) end
  local self = setmetatable({}, Objective)
  for k, v in pairs(flow.DEFAULTS) do self[k] = v end
  local unknown = {}
  for k, v in pairs(o or {}) do
    if flow.DEFAULTS[k] == nil then unknown[#unknown + 1] = tostring(k) else self[k] = v end
  end
  if #unknown > 0 then
    table.sort(unknown)
    local known = {}
    for k in pairs(flow.DEFAULTS) do known[#known + 1] = k end
    table.sort(known)
    error("flow.objective: unknown option '" .. unknown[1] .. "' (options: " .. table.concat(known, ", ") .. ")", 2)
  end
  local function bad(k, want) error(string.format("flow.objective: %s must be %s, got %s", k, want, tostring(self[k])), 3) end
  if not one_of(self.timestep_sampling, flow.TIMESTEP_SAMPLING) then
    bad("timestep_sampling", table.concat(flow.TIMESTEP_SAMPLING, ", "))
  end
  if not one_of(self.model_prediction_type, flow.MODEL_PREDICTION_TYPES) then
    bad("model_prediction_type", table.concat(flow.MODEL_PREDICTION_TYPES, ", "))
  end
  if not one_of(self.weighting_scheme, flow.WEIGHTING_SCHEMES) then
    bad("weighting_scheme", table.concat(flow.WEIGHTING_SCHEMES, ", "))
  end
  if not one_of(self.apply_weighting, flow.APPLY_WEIGHTING) then
    bad("apply_weighting", table.concat(flow.APPLY_WEIGHTING, ", "))
  end
  for _, k in ipairs{"sigmoid_scale", "logit_mean", "mode_scale"} do
    if not finite(self[k]) then bad(k, "a finite number") end
  end
  for _, k in ipairs{"discrete_flow_shift", "logit_std"} do
    if not finite(self[k]) or self[k] <= 0 then bad(k, "a number > 0") end
  end
  for _, k in ipairs{"guidance_scale", "ip_noise_gamma"} do
    if not finite(self[k]) or self[k] < 0 then bad(k, "a number >= 0") end
  end
  if math.type(self.num_train_timesteps) ~= "integer" or self.num_train_timesteps < 2 then
    bad("num_train_timesteps", "a whole number >= 2")
  end
  if math.type(self.seed) ~= "integer" then bad("seed", "an integer") end
  return self
end

-- The sigma of one sample from its draws u ~ U[0, 1) and z ~ N(0, 1), for
-- latents h x w (flux_shift's mu counts (h/2)(w/2) tokens), as kohya's
-- get_noisy_model_input_and_timesteps maps torch's draws: returns sigma and
-- kohya's timestep (1000 sigma; the scheduler's own value for "sigma"), both
-- as float32 holds them.
function Objective:draw(u, z, h, w)
  local mode, n = self.timestep_sampling, self.num_train_timesteps
  u, z = f32(u), f32(z)
  local s
  if mode == "uniform" then
    s = u
  elseif mode == "sigma" then
    local d = f32(flow.density(self.weighting_scheme, u, z, self))
    -- (u * n).long(): toward zero; a draw at the top edge (mode's u = 0, a
    -- logit-normal rounded to 1) takes the last index, where torch would fail
    local i = math.floor(f32(d * n))
    i = math.max(0, math.min(n - 1, i))
    local t = flow.train_table(n, self.discrete_flow_shift)
    return t.sigmas[i + 1], t.timesteps[i + 1]
  else
    s = f32(sigmoid(f32(z * f32(self.sigmoid_scale))))
    if mode == "shift" then
      local sh = self.discrete_flow_shift
      s = f32(f32(s * f32(sh)) / f32(1 + f32(f32(sh - 1) * s)))
    elseif mode == "flux_shift" then
      -- torch's scalar / tensor is the reciprocal times the scalar
      local e = f32(math.exp(flow.calculate_shift((h // 2) * (w // 2))))
      s = f32(f32(1 / f32(e + f32(f32(1 / s) - 1))) * e)
    end
  end
  return s, f32(s * n)
end

-- the loss weight of a sample at sigma: the scheme's where it applies, else 1
function Objective:weight(sigma)
  if self.model_prediction_type ~= "sigma_scaled" and self.apply_weighting ~= "always" then return 1.0 end
  return flow.loss_weighting(self.weighting_scheme, sigma)
end

-- Records the objective around model_fn(noisy, timesteps) -> prediction.
-- shape: the latents' {B, C, H, W}. Returns the loss tensor.
function Objective:build(g, shape, model_fn)
  if type(shape) ~= "table" or #shape ~= 4 then
    error("flow objective: the latents' shape must be {B, C, H, W}", 2)
  end
  local B = shape[1]
  local x0, noise = g:input("latents", shape), g:input("noise", shape)
  local t = g:input("timesteps", {B})
  local sigma, one = g:input("sigma", {B, 1, 1, 1}), g:input("one_minus_sigma", {B, 1, 1, 1})
  local w = g:input("loss_weight", {B, 1, 1, 1})
  self.inputs = {latents = x0, noise = noise, timesteps = t, sigma = sigma, one_minus_sigma = one, weight = w}
  self.shape = {table.unpack(shape)}
  local seen = noise
  if self.ip_noise_gamma ~= 0 then
    self.inputs.ip = g:input("ip_noise", shape)
    seen = noise + self.inputs.ip
  end
  -- (1 - sigma) x0 + sigma noise, in kohya's and diffusers' order of operations
  local noisy = x0 * one + seen * sigma
  local pred = model_fn(noisy, t)
  if self.model_prediction_type == "additive" then
    pred = pred + noisy
  elseif self.model_prediction_type == "sigma_scaled" then
    pred = noisy - pred * sigma
  end
  local d = pred - (noise - x0)
  self.loss = ck.mean(d * d * w)
  self.prediction_tensor, self.noisy_tensor = pred, noisy
  return self.loss
end

-- Sets sigmas, timesteps, loss weights, noise (and guidance) for the step
-- about to run; returns the sigmas and the model's timesteps (lists). given:
-- see the header. step: the generator's step (default: the program's next).
function Objective:prepare(p, given, step)
  if not self.inputs then error("flow objective: build it before prepare", 2) end
  given = given or {}
  step = step or (p.steps + 1)
  local B, h, w = self.shape[1], self.shape[3], self.shape[4]
  local rows, scale, n = given.rows, given.weight_scale or 1, self.num_train_timesteps
  local sig, one, ts, wt, model_t = {}, {}, {}, {}, {}
  for b = 1, B do
    local row = rows and rows[b] or b - 1
    local s, t
    if given.sigmas then
      s = f32(given.sigmas[b]); t = f32(s * n)
    elseif given.timesteps then
      t = f32(given.timesteps[b]); s = f32(t / n)
    else
      s, t = self:draw(ck.random(self.seed, step, KEY_U, row), ck.randn(self.seed, step, KEY_Z, row), h, w)
    end
    if not (s >= 0 and s <= 1) then
      error(string.format("flow objective: sample %d's sigma %s is not in [0, 1]", b, tostring(s)), 2)
    end
    sig[b], one[b], ts[b] = s, f32(1 - s), t
    -- the model sees timesteps / 1000 (kohya's call_dit, diffusers' pipeline)
    model_t[b] = f32(t / n)
    wt[b] = self:weight(s) * scale * (given.loss_weights and given.loss_weights[b] or 1)
  end
  p:set(self.inputs.sigma, sig)
  p:set(self.inputs.one_minus_sigma, one)
  p:set(self.inputs.timesteps, model_t)
  p:set(self.inputs.weight, wt)
  if not given.noise then p:randn(self.inputs.noise, KEY_NOISE, 1.0, step, rows) end
  if self.inputs.ip then
    if given.eval then p:set(self.inputs.ip, 0) else p:randn(self.inputs.ip, KEY_IP, self.ip_noise_gamma, step, rows) end
  end
  if self.guidance_input then
    local gv = {}
    for b = 1, B do gv[b] = f32(self.guidance_scale) end
    p:set(self.guidance_input, gv)
  end
  return sig, model_t
end

---- sampling

-- FlowMatchEulerDiscreteScheduler's config of FLUX.1-dev (dynamic shifting)
-- and FLUX.1-schnell (none), as their scheduler/scheduler_config.json hold them
flow.SCHEDULER = {
  dev = {num_train_timesteps = 1000, shift = 3.0, use_dynamic_shifting = true, base_shift = 0.5, max_shift = 1.15,
         base_image_seq_len = 256, max_image_seq_len = 4096, time_shift_type = "exponential"},
  schnell = {num_train_timesteps = 1000, shift = 1.0, use_dynamic_shifting = false, base_shift = 0.5,
             max_shift = 1.15, base_image_seq_len = 256, max_image_seq_len = 4096, time_shift_type = "exponential"},
}

local function nothing(x) return x == nil or x == ck.json_null end
local function falsy(x) return x == false or nothing(x) end

-- the fields of a scheduler_config.json: a check and what ckrun takes
local FIELDS = {
  num_train_timesteps = {function(x) return math.type(x) == "integer" and x >= 2 end, "a whole number >= 2"},
  shift = {function(x) return finite(x) and x > 0 end, "a number > 0"},
  use_dynamic_shifting = {function(x) return type(x) == "boolean" end, "true or false"},
  base_shift = {function(x) return nothing(x) or finite(x) end, "a number"},
  max_shift = {function(x) return nothing(x) or finite(x) end, "a number"},
  base_image_seq_len = {function(x) return math.type(x) == "integer" and x >= 1 end, "a whole number >= 1"},
  max_image_seq_len = {function(x) return math.type(x) == "integer" and x >= 1 end, "a whole number >= 1"},
  time_shift_type = {function(x) return x == "exponential" or x == "linear" end, "exponential or linear"},
  invert_sigmas = {falsy, "false (ckrun does not invert sigmas)"},
  shift_terminal = {nothing, "null (ckrun does not stretch to a terminal sigma)"},
  use_karras_sigmas = {falsy, "false"},
  use_exponential_sigmas = {falsy, "false"},
  use_beta_sigmas = {falsy, "false"},
  stochastic_sampling = {falsy, "false (ckrun's sampler is deterministic Euler)"},
}

local function sorted_keys(t)
  local k = {}
  for n in pairs(t) do k[#k + 1] = n end
  table.sort(k)
  return table.concat(k, ", ")
end

-- flow.from_config(tbl [, file]) -> a scheduler config (flow.SCHEDULER's
-- keys; what tbl leaves out takes FlowMatchEulerDiscreteScheduler's class
-- defaults): a diffusers folder's scheduler/scheduler_config.json. Another
-- class, an unknown field and a value ckrun lacks are refused in one line
-- naming the file and the field.
function flow.from_config(tbl, file)
  file = file or "scheduler_config.json"
  if type(tbl) ~= "table" then error(file .. ": not a JSON object", 2) end
  local class = rawget(tbl, "_class_name")
  if class ~= nil and class ~= "FlowMatchEulerDiscreteScheduler" then
    error(string.format("%s: _class_name %s is not FlowMatchEulerDiscreteScheduler, the scheduler of Flux's sampler",
      file, tostring(class)), 2)
  end
  -- the class's defaults (diffusers' constructor)
  local c = {num_train_timesteps = 1000, shift = 1.0, use_dynamic_shifting = false, base_shift = 0.5, max_shift = 1.15,
             base_image_seq_len = 256, max_image_seq_len = 4096, time_shift_type = "exponential"}
  for k, v in next, tbl do
    if type(k) ~= "string" then error(file .. ": a key that is not a string", 2) end
    if k:sub(1, 1) ~= "_" then
      local f = FIELDS[k]
      if not f then
        error(string.format("%s: field '%s' is not one FlowMatchEulerDiscreteScheduler's config has (fields: %s)",
          file, k, sorted_keys(FIELDS)), 2)
      end
      if not f[1](v) then
        error(string.format("%s: field '%s' is %s; ckrun takes %s", file, k,
          type(v) == "table" and ck.json_encode(v) or tostring(v), f[2]), 2)
      end
      if c[k] ~= nil and not nothing(v) then c[k] = v end
    end
  end
  return c
end

-- the time shift of a config's type on float32 sigmas, in float32 (numpy's
-- weak Python scalars: mu and e^mu rounded to float32, each operation too)
local function shift32(c, mu, s)
  local x = f32(f32(1 / s) - 1)
  if c.time_shift_type == "linear" then
    local m = f32(mu)
    return f32(m / f32(m + x))
  end
  local e = f32(math.exp(mu))
  return f32(e / f32(e + x))
end

-- numpy's linspace(a, b, num)[i] (0-based), in double
local function linspace(a, b, num, i)
  if num == 1 then return a end
  if i == num - 1 then return b end
  return i * ((b - a) / (num - 1)) + a
end

flow.MAX_STEPS = 10000

-- flow.schedule{steps, image_seq_len, config = flow.SCHEDULER.dev, mu, shift}
-- -> {sigmas (steps + 1, the last 0), timesteps (steps: 1000 sigma), mu (nil
-- without dynamic shifting), steps}: FluxPipeline's sigmas np.linspace(1,
-- 1/steps, steps) through FlowMatchEulerDiscreteScheduler.set_timesteps,
-- shifted by mu = calculate_shift(image_seq_len) under use_dynamic_shifting
-- (mu given: that one), else by the config's static shift; o.shift (a
-- number) replaces either by a static shift.
function flow.schedule(o)
  if type(o) ~= "table" then error("flow.schedule: give a table of options", 2) end
  local N = rawget(o, "steps")
  if math.type(N) ~= "integer" or N < 1 or N > flow.MAX_STEPS then
    error(string.format("flow.schedule: steps must be a whole number from 1 to %d, got %s", flow.MAX_STEPS, tostring(N)), 2)
  end
  local c = rawget(o, "config") or flow.SCHEDULER.dev
  local static = rawget(o, "shift")
  if static ~= nil and not (finite(static) and static > 0) then
    error("flow.schedule: shift must be a number > 0, got " .. tostring(static), 2)
  end
  local mu = rawget(o, "mu")
  local dynamic = c.use_dynamic_shifting and static == nil
  if dynamic and mu == nil then
    local L = rawget(o, "image_seq_len")
    if math.type(L) ~= "integer" or L < 1 then
      error("flow.schedule: image_seq_len (the packed image's tokens) must be a whole number >= 1, got " .. tostring(L), 2)
    end
    mu = flow.calculate_shift(L, {base_seq_len = c.base_image_seq_len, max_seq_len = c.max_image_seq_len,
                                  base_shift = c.base_shift, max_shift = c.max_shift})
  end
  if dynamic and not finite(mu) then error("flow.schedule: mu must be a finite number, got " .. tostring(mu), 2) end
  local n = c.num_train_timesteps
  local sh = static or c.shift
  local s32, d32 = f32(sh), f32(sh - 1)
  local sigmas, ts = {}, {}
  for k = 0, N - 1 do
    local s = f32(linspace(1.0, 1 / N, N, k))
    if dynamic then
      s = shift32(c, mu, s)
    else
      s = f32(f32(s32 * s) / f32(1 + f32(d32 * s)))
    end
    sigmas[k + 1], ts[k + 1] = s, f32(s * n)
  end
  sigmas[N + 1] = 0.0
  return {sigmas = sigmas, timesteps = ts, mu = dynamic and mu or nil, steps = N, num_train_timesteps = n}
end

local Sampler = {}
Sampler.__index = Sampler

-- flow.sampler(o) -> flow.schedule(o) with: model_timesteps[i] (what the
-- transformer's timestep input takes at step i: timesteps[i] / 1000, as
-- FluxPipeline passes it) and step(v, i, x) (FlowMatchEulerDiscreteScheduler.step:
-- x + (sigma_{i+1} - sigma_i) v, in float32)
function flow.sampler(o)
  local ok, s = pcall(flow.schedule, o)
  if not ok then error((tostring(s):gsub("^[^:]*:%d+: ", "")), 2) end
  s.model_timesteps = {}
  for i, t in ipairs(s.timesteps) do s.model_timesteps[i] = f32(t / s.num_train_timesteps) end
  return setmetatable(s, Sampler)
end

-- the latents after step i (1-based) from the model's output v at step i for
-- the latents x: a new list
function Sampler:step(v, i, x)
  if math.type(i) ~= "integer" or i < 1 or i > self.steps then
    error(string.format("flow sampler: step %s is out of range (1 .. %d)", tostring(i), self.steps), 2)
  end
  if type(v) ~= "table" or type(x) ~= "table" or #v ~= #x then
    error(string.format("flow sampler: the model's output and the latents must be lists of one length, got %s and %s",
      type(v) == "table" and #v or type(v), type(x) == "table" and #x or type(x)), 2)
  end
  local dt = f32(self.sigmas[i + 1] - self.sigmas[i])
  local r = {}
  for k = 1, #x do r[k] = f32(x[k] + f32(dt * v[k])) end
  return r
end

return flow
