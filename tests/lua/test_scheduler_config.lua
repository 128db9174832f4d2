-- A diffusers folder's scheduler/scheduler_config.json, as generate reads it
-- (samplers.from_config): for five configs as diffusers saves them (SDXL's
-- Euler, v-prediction trailing, DDIM on a linear 500-step schedule, DPM++ with
-- Karras sigmas, Euler ancestral with an offset) and each of ckrun's samplers
-- at two step counts, the timesteps, noise levels and initial noise scale
-- equal those of diffusers' scheduler built from the same config
-- (tests/data/samplers/configs.json, made by tests/ref/make_scheduler_config_ref.py);
-- the config's class names the default sampler; fields whose values ckrun
-- lacks are refused by name, for the samplers that read them only.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local samplers = require "ck.samplers"
local pipeline = require "ck.pipeline"

local f = assert(io.open("tests/data/samplers/configs.json", "rb"))
local ref = ck.json_decode(f:read("a"))
f:close()

local function close(a, b)
  if a == ck.json_null or b == nil or #a ~= #b then return false end
  for i = 1, #a do
    if math.abs(a[i] - b[i]) > 1e-5 * math.max(1, math.abs(a[i])) then return false end
  end
  return true
end

local n = 0
for _, c in ipairs(ref.cases) do
  local sc = samplers.from_config(c.config, c.name .. ".json")
  local what = string.format("%s, %s at %d steps", c.name, c.sampler, c.steps)
  local ok, err = pcall(sc.check, c.sampler)
  if c.config.use_karras_sigmas == true and c.sampler == "euler" then
    -- diffusers' Euler reads use_karras_sigmas; ckrun's Euler has no Karras sigmas
    T.ok(not ok and err.msg:find("'use_karras_sigmas' is true", 1, true), what .. ": refused, " .. tostring(err and err.msg))
  else
    T.ok(ok, what .. ": every field it reads is one ckrun has " .. tostring(err and err.msg or ""))
    local o = sc.options_for(c.sampler)
    o.steps, o.prediction = c.steps, sc.prediction
    local s = samplers.new(c.sampler, o)
    local good = close(c.timesteps, s.timesteps) and math.abs(c.init_noise_sigma - s.init_noise_sigma) < 1e-5 * c.init_noise_sigma
    if c.sigmas then good = good and close(c.sigmas, s.sigmas) end
    T.ok(good, what .. ": timesteps, sigmas and init_noise_sigma are diffusers'")
  end
  T.ok(sc.sampler == c.default_sampler, what .. ": the config's class stands for " .. tostring(sc.sampler))
  n = n + 1
end
T.ok(n == 50, "all 50 reference cases ran")
for _, c in ipairs(ref.cases) do
  if c.name == "v_trailing" then T.ok(samplers.from_config(c.config).prediction == "v", "v_prediction reads as v") break end
end

-- refusals: one line naming the file and the field
local base = ref.cases[1].config
local function with(k, v)
  local t = {}
  for key, val in pairs(base) do t[key] = val end
  t[k] = v
  return t
end
local function refused(cfg, sampler, want, what)
  local ok, err = pcall(function()
    local sc = samplers.from_config(cfg, "m/scheduler/scheduler_config.json")
    sc.check(sampler)
  end)
  err = type(err) == "table" and err.msg or tostring(err)
  T.ok(not ok and not err:find("\n") and err:find("m/scheduler/scheduler_config.json", 1, true) and err:find(want, 1, true),
    what .. ": " .. err)
end
refused(with("rescale_betas_zero_snr", true), "euler", "'rescale_betas_zero_snr' is true", "zero-SNR rescaling")
refused(with("beta_schedule", "squaredcos_cap_v2"), "euler", "'beta_schedule' is squaredcos_cap_v2", "a cosine schedule")
refused(with("prediction_type", "sample"), "euler", "'prediction_type' is sample", "sample prediction")
refused(with("timestep_spacing", "karras"), "euler", "'timestep_spacing' is karras", "an unknown spacing")
refused(with("use_karras_sigmas", true), "euler", "'use_karras_sigmas' is true", "Karras sigmas with Euler")
refused(with("interpolation_type", "log_linear"), "euler", "'interpolation_type' is log_linear", "log-linear interpolation")
refused(with("final_sigmas_type", "sigma_min"), "dpmpp_2m", "'final_sigmas_type' is sigma_min", "DPM's sigma_min final")
refused(with("algorithm_type", "sde-dpmsolver++"), "dpmpp_2m", "'algorithm_type' is sde-dpmsolver++", "SDE DPM")
refused(with("solver_order", 3), "dpmpp_2m", "'solver_order' is 3", "third order")
refused(with("clip_sample", true), "ddim", "'clip_sample' is true", "DDIM clipping")
refused(with("thresholding", true), "ddim", "'thresholding' is true", "dynamic thresholding")
refused(with("trained_betas", {0.1, 0.2}), "euler", "'trained_betas'", "trained betas")
refused(with("some_new_field", 1), "euler", "field 'some_new_field' is not one", "an unknown field")
refused(with("num_train_timesteps", 1.5), "euler", "'num_train_timesteps' is 1.5", "a fractional step count")
-- a field only other samplers read is left, as diffusers' from_config leaves it
local ok = pcall(function() samplers.from_config(with("clip_sample", true)).check("euler") end)
T.ok(ok, "DDIM's clip_sample does not stop Euler")
ok = pcall(function() samplers.from_config(with("use_karras_sigmas", true)).check("dpmpp_2m") end)
T.ok(ok, "DPM++'s name says whether its sigmas are Karras'")

-- through generate's settings check: a class ckrun lacks needs a sampler named
local pndm = with("_class_name", "PNDMScheduler")
local sc = samplers.from_config(pndm, "m/scheduler/scheduler_config.json")
T.ok(sc.sampler == nil, "PNDM stands for no sampler of ckrun's")
local pipe = pipeline.new{seed = 1, scheduler = sc}
local err
ok, err = pcall(function() local im = pipe:generate{prompt = "x", width = 64, height = 64, steps = 2}; return im end)
T.ok(not ok and tostring(err):find("_class_name PNDMScheduler is a scheduler ckrun lacks: name a sampler", 1, true),
  "a class ckrun lacks without --sampler is refused: " .. tostring(err))
pipe:close()
T.done()
