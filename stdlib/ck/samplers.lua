-- Samplers for SDXL image generation: the timesteps, noise levels and update
-- rules of diffusers' Euler, Euler ancestral, DDIM and DPM++ 2M (Karras)
-- schedulers, as they run from the SDXL base scheduler config, on latents
-- held as flat Lua lists (at most 4 * 128 * 128 values: host-side math).
--
--   local samplers = require "ck.samplers"
--   local s = samplers.new("dpmpp_2m_karras", {steps = 30})
--   local x = s:initial_latents(seed, 4 * 128 * 128)
--   for i, t in ipairs(s.timesteps) do
--     local xin = s:scale_model_input(x, i)
--     local eps = samplers.cfg(unet(xin, t, uncond), unet(xin, t, cond), 5.0)
--     x = s:step(eps, i, x, samplers.noise_fn(seed))
--   end
--
-- diffusers builds its schedule in float32 (betas, their cumulative product,
-- the noise levels); the schedule here rounds each of those values to float32
-- the same way and so gets diffusers' noise levels bit for bit, where float64
-- ones differ by 1.3e-5 relative at t = 0 (the last Karras level). The steps
-- themselves run in float64.
local ck = require "ck"

local M = {}

M.NAMES = {"euler", "euler_a", "ddim", "dpmpp_2m", "dpmpp_2m_karras"}
-- the family of update rules each name belongs to
local KIND = {euler = "euler", euler_a = "euler_a", ddim = "ddim", dpmpp_2m = "dpm", dpmpp_2m_karras = "dpm"}

-- the SDXL base scheduler config (stabilityai/stable-diffusion-xl-base-1.0)
M.SDXL = {
  num_train_timesteps = 1000, beta_start = 0.00085, beta_end = 0.012, beta_schedule = "scaled_linear",
  steps_offset = 1, timestep_spacing = "leading", set_alpha_to_one = false,
}
local OPTIONS = {steps = "integer", prediction = "string", num_train_timesteps = "integer", beta_start = "number",
                 beta_end = "number", beta_schedule = "string", steps_offset = "integer",
                 timestep_spacing = "string", set_alpha_to_one = "boolean"}

local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

-- x rounded to the nearest whole number, halves to even (numpy's round)
local function round_even(x)
  local r = math.floor(x + 0.5)
  if r - x == 0.5 and r % 2 ~= 0 then r = r - 1 end
  return math.tointeger(r) or r
end

local function sorted_names(t)
  local names = {}
  for k in next, t do names[#names + 1] = k end
  table.sort(names)
  return table.concat(names, ", ")
end

-- alphas_cumprod[t + 1], t = 0 .. n - 1, as diffusers makes it: betas from a
-- float32 linspace (start and end in float32, the step rounded to float32, the
-- second half counted back from the end) squared in float32 for
-- scaled_linear, their cumulative product of (1 - beta) kept in float64 and
-- each value rounded to float32
local function alphas_cumprod32(schedule, n, b0, b1)
  local s, e
  if schedule == "scaled_linear" then
    s, e = f32(math.sqrt(b0)), f32(math.sqrt(b1))
  else
    s, e = f32(b0), f32(b1)
  end
  local step, half = f32((e - s) / (n - 1)), n // 2
  local out, prod = {}, 1.0
  for i = 0, n - 1 do
    local b = i < half and f32(s + step * i) or f32(e - step * (n - 1 - i))
    if schedule == "scaled_linear" then b = f32(b * b) end
    prod = prod * f32(1 - b)
    out[i + 1] = f32(prod)
  end
  return out
end

-- numpy's linspace(a, b, num)[i] (0-based), in float64
local function linspace(a, b, num, i)
  if num == 1 then return a end
  if i == num - 1 then return b end
  return i * ((b - a) / (num - 1)) + a
end

-- np.interp(t, 0 .. n - 1, sig) for sig indexed from 1
local function interp(sig, t)
  local n = #sig
  if t <= 0 then return sig[1] end
  if t >= n - 1 then return sig[n] end
  local j = math.floor(t)
  return (sig[j + 2] - sig[j + 1]) * (t - j) + sig[j + 1]
end

-- the (fractional) timestep whose log noise level is log(sigma), linear
-- between neighbours; log_sigmas ascending, indexed from 1 (timestep + 1)
local function sigma_to_t(sigma, log_sigmas)
  local n = #log_sigmas
  local ls = math.log(math.max(sigma, 1e-10))
  -- low: the last timestep whose log noise level is at most ls (0 when none), at most n - 2
  local lo, hi = 0, n - 1
  if ls < log_sigmas[1] then
    lo = 0
  else
    while lo < hi do
      local mid = (lo + hi + 1) // 2
      if ls >= log_sigmas[mid + 1] then lo = mid else hi = mid - 1 end
    end
  end
  if lo > n - 2 then lo = n - 2 end
  local low, high = log_sigmas[lo + 1], log_sigmas[lo + 2]
  local w = (low - ls) / (low - high)
  w = math.max(0, math.min(1, w))
  return (1 - w) * lo + w * (lo + 1)
end

-- the n whole timesteps of a spacing for the Euler family and DDIM (DPM++
-- counts its own); descending
local function spaced(spacing, n, N, offset, int)
  local ts = {}
  if spacing == "leading" then
    local ratio = n // N
    for k = N - 1, 0, -1 do ts[#ts + 1] = k * ratio + offset end
  elseif spacing == "linspace" then
    for k = N - 1, 0, -1 do
      local t = linspace(0, n - 1, N, k)
      ts[#ts + 1] = int and round_even(t) or f32(t)
    end
  else -- trailing
    local ratio = n / N
    local count = math.ceil(n / ratio)
    for k = 0, count - 1 do ts[#ts + 1] = round_even(n - k * ratio) - 1 end
  end
  for k, t in ipairs(ts) do ts[k] = int and math.tointeger(t) or t + 0.0 end
  return ts
end

local Sampler = {}
Sampler.__index = Sampler

-- A sampler `name` (one of M.NAMES) for o.steps steps (an integer from 1 to
-- num_train_timesteps), predicting o.prediction = "eps" (default) or "v";
-- the other options of o override M.SDXL's. o is read raw. Fields:
-- timesteps (diffusers' scheduler.timesteps: floats for the Euler family,
-- integers for DDIM and DPM++), sigmas (diffusers' sigmas, the final 0
-- included; DDIM has none in diffusers: here its timesteps' noise levels),
-- init_noise_sigma, steps, name, prediction, alphas_cumprod (diffusers'
-- float32 values, indexed by timestep + 1).
function M.new(name, o)
  if type(name) ~= "string" or not KIND[name] then
    error(string.format("unknown sampler '%s' (samplers: %s)", tostring(name), table.concat(M.NAMES, ", ")), 2)
  end
  if o ~= nil and type(o) ~= "table" then error("samplers.new: options must be a table, got " .. type(o), 2) end
  o = o or {}
  local c = {}
  for k, v in next, M.SDXL do c[k] = v end
  for k, v in next, o do
    local want = OPTIONS[k]
    if not want then
      error(string.format("samplers.new: unknown option '%s' (options: %s)", tostring(k), sorted_names(OPTIONS)), 2)
    end
    local ok = want == "integer" and math.type(v) == "integer" or want == "number" and type(v) == "number" or
               type(v) == want
    if not ok then
      error(string.format("samplers.new: option %s must be a%s %s, got %s", k, want == "integer" and "n" or "", want,
        tostring(v)), 2)
    end
    c[k] = v
  end
  local n, N = c.num_train_timesteps, rawget(o, "steps")
  if n < 2 then error("samplers.new: num_train_timesteps must be at least 2, got " .. n, 2) end
  if N == nil then error("samplers.new: option steps (the number of steps) is required", 2) end
  local kind = KIND[name]
  local most = (kind == "dpm" and c.timestep_spacing == "leading") and n - 1 or n
  if N < 1 or N > most then
    error(string.format("samplers.new: steps must be from 1 to %d, got %d", most, N), 2)
  end
  local prediction = c.prediction or "eps"
  if prediction ~= "eps" and prediction ~= "v" then
    error("samplers.new: prediction must be 'eps' or 'v', got '" .. prediction .. "'", 2)
  end
  if c.beta_schedule ~= "scaled_linear" and c.beta_schedule ~= "linear" then
    error("samplers.new: beta_schedule must be 'scaled_linear' or 'linear', got '" .. c.beta_schedule .. "'", 2)
  end
  local spacing = c.timestep_spacing
  if spacing ~= "leading" and spacing ~= "linspace" and spacing ~= "trailing" then
    error("samplers.new: timestep_spacing must be 'leading', 'linspace' or 'trailing', got '" .. spacing .. "'", 2)
  end
  if not (c.beta_start > 0 and c.beta_end > 0 and c.beta_start < 1 and c.beta_end < 1) then
    error(string.format("samplers.new: betas must lie in (0, 1), got %s and %s", c.beta_start, c.beta_end), 2)
  end

  local self = setmetatable({name = name, kind = kind, prediction = prediction, steps = N, config = c}, Sampler)
  local acp = alphas_cumprod32(c.beta_schedule, n, c.beta_start, c.beta_end)
  local sig = {}
  for t = 1, n do sig[t] = f32(math.sqrt(f32(f32(1 - acp[t]) / acp[t]))) end
  self.alphas_cumprod = acp

  local ts, sigmas = {}, {}
  if kind == "euler" or kind == "euler_a" then
    ts = spaced(spacing, n, N, c.steps_offset, false)
    for k, t in ipairs(ts) do sigmas[k] = f32(interp(sig, t)) end
  elseif kind == "ddim" then
    ts = spaced(spacing, n, N, c.steps_offset, true)
    for k, t in ipairs(ts) do
      if t < 0 or t > n - 1 then
        error(string.format("samplers.new: DDIM's timestep %d lies outside 0 .. %d (steps_offset %d)", t, n - 1,
          c.steps_offset), 2)
      end
      sigmas[k] = sig[t + 1]
    end
  else
    if name == "dpmpp_2m_karras" then
      -- Karras et al. (2022), rho 7, between the lowest and highest noise levels
      local lo, hi = sig[1] ^ (1 / 7), sig[n] ^ (1 / 7)
      local log_sigmas = {}
      for t = 1, n do log_sigmas[t] = f32(math.log(sig[t])) end
      for k = 0, N - 1 do
        local s = (hi + linspace(0, 1, N, k) * (lo - hi)) ^ 7
        ts[k + 1] = round_even(sigma_to_t(s, log_sigmas))
        sigmas[k + 1] = f32(s)
      end
    else
      if spacing == "leading" then
        local ratio = n // (N + 1)
        for k = N, 1, -1 do ts[#ts + 1] = k * ratio + c.steps_offset end
      elseif spacing == "linspace" then
        for k = N, 1, -1 do ts[#ts + 1] = round_even(linspace(0, n - 1, N + 1, k)) end
      else
        ts = spaced("trailing", n, N, 0, true)
      end
      for k, t in ipairs(ts) do sigmas[k] = f32(interp(sig, t)) end
    end
    for k, t in ipairs(ts) do ts[k] = math.tointeger(t) end
  end
  sigmas[#ts + 1] = 0.0
  self.timesteps, self.sigmas = ts, sigmas
  self.steps = #ts
  if kind == "euler" or kind == "euler_a" then
    local top = 0
    for _, s in ipairs(sigmas) do top = math.max(top, s) end
    self.init_noise_sigma = spacing == "leading" and f32(math.sqrt(f32(f32(top * top) + 1))) or top
  else
    self.init_noise_sigma = 1.0
  end
  return self
end

---- a diffusers folder's scheduler/scheduler_config.json

-- the sampler a scheduler class stands for (DPMSolverMultistep's by its use_karras_sigmas)
local CLASS_SAMPLER = {EulerDiscreteScheduler = "euler", EulerAncestralDiscreteScheduler = "euler_a",
                       DDIMScheduler = "ddim", DPMSolverMultistepScheduler = "dpmpp_2m"}

local function is(v) return function(x) return x == v end end
local function nothing(x) return x == nil or x == ck.json_null end
local function any_boolean(x) return type(x) == "boolean" end
local function anything() return true end
local ALL = {euler = true, euler_a = true, ddim = true, dpm = true}

-- Each field diffusers' four schedulers read: which of ckrun's families read
-- it (as diffusers' classes do), and the values ckrun has. A field the chosen
-- sampler reads with another value is refused by name; one it does not read is
-- left, as diffusers' from_config leaves it.
local FIELDS = {
  num_train_timesteps = {ALL, function(x) return math.type(x) == "integer" and x >= 2 end, "a whole number >= 2"},
  beta_start = {ALL, function(x) return type(x) == "number" and x > 0 and x < 1 end, "a number in (0, 1)"},
  beta_end = {ALL, function(x) return type(x) == "number" and x > 0 and x < 1 end, "a number in (0, 1)"},
  beta_schedule = {ALL, function(x) return x == "scaled_linear" or x == "linear" end, "scaled_linear or linear"},
  trained_betas = {ALL, nothing, "null (ckrun computes betas from beta_schedule)"},
  prediction_type = {ALL, function(x) return x == "epsilon" or x == "v_prediction" end, "epsilon or v_prediction"},
  timestep_spacing = {ALL, function(x) return x == "leading" or x == "linspace" or x == "trailing" end,
                      "leading, linspace or trailing"},
  steps_offset = {ALL, function(x) return math.type(x) == "integer" and x >= 0 end, "a whole number >= 0"},
  rescale_betas_zero_snr = {ALL, function(x) return x == false or nothing(x) end, "false (ckrun has no zero-SNR rescaling)"},
  set_alpha_to_one = {{ddim = true}, any_boolean, "true or false"},
  clip_sample = {{ddim = true}, function(x) return x == false or nothing(x) end, "false (ckrun's DDIM does not clip)"},
  thresholding = {{ddim = true, dpm = true}, function(x) return x == false or nothing(x) end,
                  "false (ckrun has no dynamic thresholding)"},
  interpolation_type = {{euler = true}, is("linear"), "linear"},
  use_karras_sigmas = {{euler = true, dpm = true}, any_boolean, "true or false"},
  use_exponential_sigmas = {{euler = true, dpm = true}, function(x) return x == false or nothing(x) end, "false"},
  use_beta_sigmas = {{euler = true, dpm = true}, function(x) return x == false or nothing(x) end, "false"},
  sigma_min = {{euler = true, dpm = true}, nothing, "null"},
  sigma_max = {{euler = true, dpm = true}, nothing, "null"},
  timestep_type = {{euler = true}, is("discrete"), "discrete"},
  final_sigmas_type = {{euler = true, dpm = true}, is("zero"), "zero"},
  algorithm_type = {{dpm = true}, is("dpmsolver++"), "dpmsolver++"},
  solver_order = {{dpm = true}, is(2), "2"},
  solver_type = {{dpm = true}, is("midpoint"), "midpoint"},
  -- with a final noise level of 0 the last step is first order whatever these say
  lower_order_final = {{dpm = true}, any_boolean, "true or false"},
  euler_at_final = {{dpm = true}, any_boolean, "true or false"},
  use_lu_lambdas = {{dpm = true}, function(x) return x == false or nothing(x) end, "false"},
  use_flow_sigmas = {ALL, function(x) return x == false or nothing(x) end, "false (ckrun has no flow matching)"},
  flow_shift = {ALL, function(x) return nothing(x) or x == 1 or x == 1.0 end, "null or 1"},
  variance_type = {{dpm = true}, nothing, "null"},
  lambda_min_clipped = {{dpm = true}, function(x) return nothing(x) or x == -math.huge end, "-inf"},
  -- read only with the options above that ckrun refuses, or by no family of ckrun's
  clip_sample_range = {{}, anything}, sample_max_value = {{}, anything}, dynamic_thresholding_ratio = {{}, anything},
  skip_prk_steps = {{}, anything}, shift = {{}, anything}, time_shift_type = {{}, anything},
  use_dynamic_shifting = {ALL, function(x) return x ~= true end, "false"},
}
local OPTION_OF = {num_train_timesteps = true, beta_start = true, beta_end = true, beta_schedule = true,
                   steps_offset = true, timestep_spacing = true, set_alpha_to_one = true}
-- diffusers' class defaults of what a config leaves out (not SDXL's: a config
-- stands for its class's constructor), by family
local CLASS_DEFAULTS = {num_train_timesteps = 1000, beta_start = 0.0001, beta_end = 0.02, beta_schedule = "linear",
                        steps_offset = 0, timestep_spacing = "linspace"}
local FAMILY_DEFAULTS = {ddim = {timestep_spacing = "leading", set_alpha_to_one = true}}

-- samplers.from_config(tbl, file) -> a scheduler: {options (samplers.new's
-- options the config sets), prediction ("eps" or "v"), sampler (the name its
-- class stands for, nil for a class ckrun lacks), class, file, check(name)
-- (raises one line naming the file and a field the sampler `name` would read
-- with a value ckrun lacks), options_for(name) (samplers.new's options for
-- that sampler: the config's, and for what it leaves out the defaults of the
-- diffusers class the sampler is, as from_config gives them)}. A field no
-- diffusers scheduler of ckrun's has is refused by name.
function M.from_config(tbl, file)
  file = file or "scheduler_config.json"
  if type(tbl) ~= "table" then error(string.format("%s: not a JSON object", file), 2) end
  local sc = {options = {}, file = file, class = rawget(tbl, "_class_name")}
  for k, v in next, tbl do
    if type(k) ~= "string" then error(string.format("%s: a key that is not a string", file), 2) end
    if k:sub(1, 1) ~= "_" and not FIELDS[k] then
      error(string.format("%s: field '%s' is not one ckrun's samplers know (fields: %s)", file, k,
        sorted_names(FIELDS)), 2)
    end
    if OPTION_OF[k] and not nothing(v) then
      if FIELDS[k][2](v) then sc.options[k] = v
      else error(string.format("%s: field '%s' is %s; ckrun takes %s", file, k, tostring(v), FIELDS[k][3]), 2) end
    end
  end
  local pt = rawget(tbl, "prediction_type")
  if pt ~= nil and pt ~= ck.json_null then
    if not FIELDS.prediction_type[2](pt) then
      error(string.format("%s: field 'prediction_type' is %s; ckrun takes %s", file, tostring(pt), FIELDS.prediction_type[3]), 2)
    end
    sc.prediction = pt == "v_prediction" and "v" or "eps"
  end
  sc.sampler = CLASS_SAMPLER[sc.class]
  if sc.sampler == "dpmpp_2m" and rawget(tbl, "use_karras_sigmas") == true then sc.sampler = "dpmpp_2m_karras" end
  function sc.options_for(name)
    local o = {}
    for k, v in next, CLASS_DEFAULTS do o[k] = v end
    for k, v in next, FAMILY_DEFAULTS[KIND[name]] or {} do o[k] = v end
    for k, v in next, sc.options do o[k] = v end
    return o
  end
  function sc.check(name)
    local kind = KIND[name]
    for k, v in next, tbl do
      local f = FIELDS[k]
      -- the sampler's name says whether DPM++'s sigmas are Karras'; Euler has no Karras sigmas here
      if f and f[1][kind] and k ~= "use_karras_sigmas" and not f[2](v) then
        error({msg = string.format("%s: field '%s' is %s, which ckrun's %s lacks (it takes %s)", file, k,
          type(v) == "table" and ck.json_encode(v) or tostring(v), name, f[3])}, 0)
      end
      if k == "use_karras_sigmas" and v == true and kind == "euler" then
        error({msg = string.format("%s: field 'use_karras_sigmas' is true, which ckrun's %s lacks (its Karras sampler is " ..
          "dpmpp_2m_karras)", file, name)}, 0)
      end
    end
  end
  return sc
end

local function check_step(self, i, level)
  if math.type(i) ~= "integer" or i < 1 or i > self.steps then
    error(string.format("%s: step %s is out of range (this sampler has steps 1 .. %d)", self.name, tostring(i),
      self.steps), level + 1)
  end
end

-- x must be a list; as long as the list named `other` (n values) when n is given
local function check_list(x, what, level, n, other)
  if type(x) ~= "table" then error(string.format("%s must be a list of numbers, got %s", what, type(x)), level + 1) end
  if n and #x ~= n then
    error(string.format("%s holds %d values, %s holds %d", what, #x, other, n), level + 1)
  end
end

-- The model's input at step i: x / sqrt(sigma_i^2 + 1) for the Euler family
-- (a new list); x itself for DDIM and DPM++, whose models see the sample as is.
function Sampler:scale_model_input(x, i)
  check_step(self, i, 2)
  check_list(x, "scale_model_input: x", 2)
  if self.kind ~= "euler" and self.kind ~= "euler_a" then return x end
  local s = self.sigmas[i]
  local d = math.sqrt(s * s + 1)
  local out = {}
  for k = 1, #x do out[k] = x[k] / d end
  return out
end

local function euler_step(self, out, i, x, noise_fn)
  local s, s_to = self.sigmas[i], self.sigmas[i + 1]
  local n, r, dt, up = #x, {}, nil, 0
  if self.kind == "euler_a" then
    up = math.sqrt(s_to * s_to * (s * s - s_to * s_to) / (s * s))
    dt = math.sqrt(s_to * s_to - up * up) - s
  else
    dt = s_to - s
  end
  -- the derivative (x - x0) / sigma, x0 the predicted clean latents, in
  -- diffusers' order of operations
  if self.prediction == "eps" then
    for k = 1, n do
      local v = x[k]
      r[k] = v + (v - (v - s * out[k])) / s * dt
    end
  else
    local cm, cv = -s / math.sqrt(s * s + 1), 1 / (s * s + 1)
    for k = 1, n do
      local v = x[k]
      r[k] = v + (v - (out[k] * cm + v * cv)) / s * dt
    end
  end
  if self.kind == "euler_a" then
    if type(noise_fn) ~= "function" then
      error("euler_a: step needs noise_fn(n, i), a function returning n N(0, 1) values (samplers.noise_fn(seed) makes one)", 3)
    end
    local z = noise_fn(n, i)
    if type(z) ~= "table" or #z ~= n then
      error(string.format("euler_a: noise_fn(%d) must return a list of %d numbers, got %s", n, n,
        type(z) == "table" and (#z .. " values") or type(z)), 3)
    end
    for k = 1, n do r[k] = r[k] + z[k] * up end
  end
  return r
end

local function ddim_step(self, out, i, x)
  local c = self.config
  local t = self.timesteps[i]
  local prev = t - c.num_train_timesteps // self.steps
  local acp = self.alphas_cumprod
  local a = acp[t + 1]
  local a_prev = prev >= 0 and acp[prev + 1] or (c.set_alpha_to_one and 1.0 or acp[1])
  local sa, sb = math.sqrt(a), math.sqrt(f32(1 - a))
  local ca, cb = math.sqrt(a_prev), math.sqrt(1 - a_prev)
  local r, v_pred = {}, self.prediction == "v"
  for k = 1, #x do
    local m, v = out[k], x[k]
    local x0, eps
    if v_pred then
      x0, eps = sa * v - sb * m, sa * m + sb * v
    else
      x0, eps = (v - sb * m) / sa, m
    end
    r[k] = ca * x0 + cb * eps
  end
  return r
end

-- alpha_t, sigma_t and lambda_t = log(alpha_t / sigma_t) of noise level s
local function dpm_levels(s)
  local a = 1 / math.sqrt(s * s + 1)
  local sg = s * a
  return a, sg, math.log(a) - math.log(sg)
end

-- DPM-Solver++ (Lu et al. 2022), multistep, second order by the midpoint
-- rule; the first step of a chain and the last step are first order
local function dpm_step(self, out, i, x)
  local s0, st = self.sigmas[i], self.sigmas[i + 1]
  local a0, g0, l0 = dpm_levels(s0)
  local at, gt, lt = dpm_levels(st)
  local n, v_pred = #x, self.prediction == "v"
  local m0 = {}
  for k = 1, n do
    local m, v = out[k], x[k]
    m0[k] = v_pred and a0 * v - g0 * m or (v - g0 * m) / a0
  end
  local h = lt - l0
  local eh = math.exp(-h) - 1
  local ratio = gt / g0
  local prev = self.history
  -- the final noise level is 0, so the last step is first order (diffusers' lower_order_final)
  local first = not (prev and prev.i == i - 1) or i == self.steps
  local r = {}
  if first then
    for k = 1, n do r[k] = ratio * x[k] - at * eh * m0[k] end
  else
    local _, _, l1 = dpm_levels(self.sigmas[i - 1])
    local r0 = (l0 - l1) / h
    local m1 = prev.m
    for k = 1, n do
      local d1 = (m0[k] - m1[k]) / r0
      r[k] = ratio * x[k] - at * eh * m0[k] - 0.5 * (at * eh) * d1
    end
  end
  self.history = {i = i, m = m0}
  return r
end

-- The latents after step i (1-based) from the model's output at step i for
-- the latents x: a new list. DPM++ remembers the step's converted output for
-- the next: a step continues the chain when it follows step i - 1, and starts
-- a new one (first order) otherwise. noise_fn(n, i) -> a list of n N(0, 1)
-- values: the ancestral sampler's noise, drawn once a step (the others ignore
-- it); M.noise_fn(seed) makes one.
function Sampler:step(model_output, i, x, noise_fn)
  check_step(self, i, 2)
  check_list(x, "step: x", 2)
  check_list(model_output, "step: model_output", 2, #x, "x")
  local r -- not tail calls: the errors euler_step raises name the caller's line
  if self.kind == "ddim" then
    r = ddim_step(self, model_output, i, x)
  elseif self.kind == "dpm" then
    r = dpm_step(self, model_output, i, x)
  else
    r = euler_step(self, model_output, i, x, noise_fn)
  end
  return r
end

-- keys of sampling's random streams (training's are 0x7100 .. 0x7400)
M.KEY_LATENTS, M.KEY_ANCESTRAL = 0x7500, 0x7600

-- n N(0, 1) values of the counter-based stream (seed, step, key): the same
-- numbers on every run, machine and thread count
function M.randn(seed, step, n, key)
  for i, v in ipairs{seed, step, n, key} do
    if math.type(v) ~= "integer" then
      error(string.format("samplers.randn: argument %d must be an integer, got %s", i, tostring(v)), 2)
    end
  end
  local out = {}
  for k = 1, n do out[k] = ck.randn(seed, step, key, k - 1) end
  return out
end

-- A noise_fn for step(): step i's noise is M.randn(seed, i, n, M.KEY_ANCESTRAL)
function M.noise_fn(seed)
  return function(n, i) return M.randn(seed, i, n, M.KEY_ANCESTRAL) end
end

-- The first latents for `seed`: n N(0, 1) values (step 0 of M.KEY_LATENTS)
-- times init_noise_sigma, as diffusers' pipelines start
function Sampler:initial_latents(seed, n)
  local x = M.randn(seed, 0, n, M.KEY_LATENTS)
  local s = self.init_noise_sigma
  for k = 1, n do x[k] = x[k] * s end
  return x
end

-- Classifier-free guidance: uncond + scale * (cond - uncond), a new list
function M.cfg(uncond, cond, scale)
  check_list(uncond, "cfg: uncond", 2)
  check_list(cond, "cfg: cond", 2, #uncond, "uncond")
  if type(scale) ~= "number" then error("cfg: scale must be a number, got " .. type(scale), 2) end
  local out = {}
  for k = 1, #uncond do
    local u = uncond[k]
    out[k] = u + scale * (cond[k] - u)
  end
  return out
end

return M
