-- ck.samplers against diffusers 0.42 (tests/ref/make_sampler_ref.py made the
-- files in tests/data/samplers): each sampler's timesteps exactly, its noise
-- levels and init_noise_sigma, scale_model_input and chains of steps within
-- 1e-5 relative, for epsilon and v prediction; a whole guided Euler loop; and
-- the errors bad names, options and arguments get.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local samplers = require "ck.samplers"
local T = require "check"

local DIR = "tests/data/samplers/"
local ref
do
  local fh <close> = assert(io.open(DIR .. "schedules.json"))
  ref = ck.json_decode(fh:read("a"))
end

-- max |a - b| / max |b| over the values: relative to the tensor's scale,
-- because diffusers' float32 arithmetic itself leaves errors of a few 1e-7 of
-- the operands' size, which near a zero crossing are far more than 1e-5 of
-- the value (DPM++'s second-order term subtracts two outputs)
local function worst(a, b)
  if type(a) ~= "table" or #a ~= #b then return math.huge end
  local top, e = 0, 0
  for k = 1, #b do
    top = math.max(top, math.abs(b[k]))
    local d = math.abs(a[k] - b[k])
    if not (d <= e) then e = d end -- NaN sticks
  end
  return e / top
end
-- max |a - b| / |b| over the values (0 where both are 0): for the noise
-- levels, which span three decades and come from no cancellation
local function worst_each(a, b)
  if type(a) ~= "table" or #a ~= #b then return math.huge end
  local e = 0
  for k = 1, #b do
    local d = math.abs(a[k] - b[k])
    if d ~= 0 or a[k] ~= b[k] then
      d = d / math.abs(b[k])
      if not (d <= e) then e = d end
    end
  end
  return e
end
local TOL = 1e-5

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

local function make(case, steps)
  local c = ref.cases[case]
  local o = {steps = steps, prediction = c.prediction}
  for k, v in pairs(c.options) do o[k] = v end
  return samplers.new(c.sampler, o)
end

-- timesteps exactly (value and float/integer as diffusers' dtype), sigmas and init_noise_sigma
do
  local bad_t, bad_type, bad_sigma, bad_init, count, worst_sigma = {}, {}, {}, {}, 0, 0
  for _, key in ipairs(sorted_keys(ref.schedules)) do
    local want = ref.schedules[key]
    local case, steps = key:match("^(.-)/(%d+)$")
    local s = make(case, math.tointeger(tonumber(steps)))
    count = count + 1
    local kind = want.timesteps_dtype == "int64" and "integer" or "float"
    local same = #s.timesteps == #want.timesteps
    for i, t in ipairs(want.timesteps) do
      if s.timesteps[i] ~= t then same = false end
      if math.type(s.timesteps[i]) ~= kind then bad_type[#bad_type + 1] = key end
    end
    if not same then bad_t[#bad_t + 1] = key end
    if want.sigmas then
      local w = worst_each(s.sigmas, want.sigmas)
      worst_sigma = math.max(worst_sigma, w)
      if not (w <= TOL) then bad_sigma[#bad_sigma + 1] = key end
    else
      -- DDIM: diffusers keeps no sigmas; ours are the noise levels of its timesteps, then 0
      local ok = #s.sigmas == steps + 1 and s.sigmas[#s.sigmas] == 0
      for i, t in ipairs(s.timesteps) do
        local a = s.alphas_cumprod[t + 1]
        if math.abs(s.sigmas[i] - math.sqrt((1 - a) / a)) > 1e-6 * s.sigmas[i] then ok = false end
      end
      if not ok then bad_sigma[#bad_sigma + 1] = key end
    end
    if not (math.abs(s.init_noise_sigma - want.init_noise_sigma) <= TOL * want.init_noise_sigma) then
      bad_init[#bad_init + 1] = key
    end
  end
  T.ok(count == 48, count .. " schedules compared (16 cases at 4, 20 and 30 steps)")
  T.ok(#bad_t == 0, "timesteps exactly diffusers' (" .. table.concat(bad_t, " ") .. ")")
  T.ok(#bad_type == 0, "timesteps are floats for the Euler family, integers for DDIM and DPM++ (" ..
    table.concat(bad_type, " ") .. ")")
  T.ok(#bad_sigma == 0, string.format("sigmas within 1e-5 relative each, the final 0 included (worst %.2g) %s",
    worst_sigma, table.concat(bad_sigma, " ")))
  T.ok(#bad_init == 0, "init_noise_sigma within 1e-5 (" .. table.concat(bad_init, " ") .. ")")
end

-- chains of steps: each step from diffusers' own sample for it, in order, so
-- that DPM++ carries its previous output as diffusers does
do
  local f <close> = ck.safetensors(DIR .. "steps.safetensors")
  local failures, checked, worst_all = {}, 0, 0
  for _, case in ipairs(sorted_keys(ref.cases)) do
    if ref.cases[case].steps_saved then
      for _, run in ipairs{{4, 4}, {30, 3}} do
        local N, count = run[1], run[2]
        local s = make(case, N)
        local x = f:read(string.format("%s/%d/sample", case, N))
        for k = 1, count do
          local at = string.format("%s/%d/%d/", case, N, k)
          local calls = 0
          local noise_fn = function(n, i)
            calls = calls + 1
            if i ~= k then failures[#failures + 1] = string.format("%s (noise_fn's step %s)", at, tostring(i)) end
            if ref.cases[case].sampler ~= "euler_a" then return nil end
            if n ~= #x then failures[#failures + 1] = string.format("%s (noise_fn(%s))", at, tostring(n)) end
            return f:read(at .. "noise")
          end
          local scaled = s:scale_model_input(x, k)
          local ws = worst(scaled, f:read(at .. "scaled"))
          local y = s:step(f:read(at .. "model_output"), k, x, noise_fn)
          local want = f:read(at .. "result")
          local wr = worst(y, want)
          worst_all = math.max(worst_all, ws, wr)
          checked = checked + 1
          if not (ws <= TOL) then failures[#failures + 1] = string.format("%sscaled (%.2g)", at, ws) end
          if not (wr <= TOL) then failures[#failures + 1] = string.format("%sresult (%.2g)", at, wr) end
          if (calls == 1) ~= (ref.cases[case].sampler == "euler_a") then
            failures[#failures + 1] = at .. string.format(" (noise_fn called %d times)", calls)
          end
          x = want
        end
      end
    end
  end
  T.ok(checked == 8 * 7, checked .. " steps compared (8 cases: 4 steps of 4, 3 of 30)")
  T.ok(#failures == 0, string.format(
    "scale_model_input and step within 1e-5 relative of diffusers' for every sampler, eps and v; euler_a draws " ..
    "one noise value per latent a step, the others none (worst %.2g) %s",
    worst_all, table.concat(failures, " ")))

  -- DPM++ 2M uses the previous step's output: a step 2 with no step 1 before it is first order, and differs
  local s = samplers.new("dpmpp_2m", {steps = 4})
  local x2 = f:read("dpmpp_2m/4/1/result")
  local fresh = s:step(f:read("dpmpp_2m/4/2/model_output"), 2, x2)
  T.ok(worst(fresh, f:read("dpmpp_2m/4/2/result")) > 1e-3,
    "dpmpp_2m: a step that does not follow the one before starts a new chain (first order, unlike diffusers' 2nd)")
  -- and a chain started again from step 1 gives step 1 and 2 as the first time
  local again = samplers.new("dpmpp_2m", {steps = 4})
  again:step(f:read("dpmpp_2m/4/1/model_output"), 1, f:read("dpmpp_2m/4/sample"))
  again:step(f:read("dpmpp_2m/4/2/model_output"), 2, x2)
  again:step(f:read("dpmpp_2m/4/1/model_output"), 1, f:read("dpmpp_2m/4/sample"))
  local y = again:step(f:read("dpmpp_2m/4/2/model_output"), 2, x2)
  T.ok(worst(y, f:read("dpmpp_2m/4/2/result")) <= TOL, "dpmpp_2m: starting again at step 1 forgets the old chain")
end

-- a whole 4-step Euler loop with classifier-free guidance, as the SDXL pipeline runs it
do
  local f <close> = ck.safetensors(DIR .. "loop.safetensors")
  local s = samplers.new("euler", {steps = 4})
  local x = {}
  for k, v in ipairs(f:read("noise")) do x[k] = v * s.init_noise_sigma end
  for i = 1, #s.timesteps do
    local xin = s:scale_model_input(x, i)
    local uncond, cond = {}, {}
    for k, v in ipairs(xin) do uncond[k], cond[k] = 0.1 * v + 0.05, 0.2 * v - 0.03 end
    x = s:step(samplers.cfg(uncond, cond, 5.0), i, x)
  end
  local w = worst(x, f:read("result"))
  T.ok(w <= TOL, string.format("a guided 4-step Euler loop from the same noise ends within 1e-5 of diffusers' (%.2g)", w))
end

do
  local g = samplers.cfg({1, 2}, {3, -2}, 7.5)
  T.ok(g[1] == 1 + 7.5 * 2 and g[2] == 2 + 7.5 * -4, "cfg: uncond + scale * (cond - uncond)")
  local one = samplers.cfg({0.25, -1}, {0.5, 3}, 1)
  T.ok(one[1] == 0.5 and one[2] == 3, "cfg with scale 1 is the conditional output")
end

-- fn calls the function that should fail, so the error names this file's line
-- noise from the counter-based generator: the same for a seed and step, other for another
do
  local a, b = samplers.randn(7, 3, 5000, samplers.KEY_ANCESTRAL), samplers.noise_fn(7)(5000, 3)
  local c, d = samplers.noise_fn(7)(5000, 4), samplers.noise_fn(8)(5000, 3)
  local same, other_step, other_seed, mean, sq = true, 0, 0, 0, 0
  for k = 1, 5000 do
    if a[k] ~= b[k] or a[k] ~= ck.randn(7, 3, samplers.KEY_ANCESTRAL, k - 1) then same = false end
    if c[k] ~= a[k] then other_step = other_step + 1 end
    if d[k] ~= a[k] then other_seed = other_seed + 1 end
    mean, sq = mean + a[k] / 5000, sq + a[k] * a[k] / 5000
  end
  T.ok(same and other_step == 5000 and other_seed == 5000,
    "noise_fn(seed)(n, i) is ck.randn(seed, i, KEY_ANCESTRAL, 0 .. n - 1): repeatable, another for each step and seed")
  T.ok(math.abs(mean) < 0.05 and math.abs(sq - 1) < 0.06, string.format("and N(0, 1) (mean %.3f, E[x^2] %.3f)", mean, sq))
  local s = samplers.new("euler", {steps = 30})
  local x = s:initial_latents(7, 300)
  local ok = #x == 300
  for k = 1, 300 do
    if x[k] ~= ck.randn(7, 0, samplers.KEY_LATENTS, k - 1) * s.init_noise_sigma then ok = false end
  end
  T.ok(ok, "initial_latents(seed, n): n values of the seed's latent stream times init_noise_sigma")
end

local function fails(want, what, fn)
  local ok, err = pcall(fn)
  T.ok(not ok and tostring(err):match("test_samplers%.lua:%d+: ") and tostring(err):find(want, 1, true) ~= nil and
    not tostring(err):find("\n"), what .. " (" .. tostring(err) .. ")")
end

fails("unknown sampler 'heun' (samplers: euler, euler_a, ddim, dpmpp_2m, dpmpp_2m_karras)",
  "an unknown sampler name is one line naming it and the names, at the script's line",
  function() local r = samplers.new("heun", {steps = 4}); return r end)
fails("unknown option 'step'", "an unknown option is an error naming it",
  function() local r = samplers.new("euler", {step = 4}); return r end)
fails("option steps (the number of steps) is required", "steps are required",
  function() local r = samplers.new("euler", {}); return r end)
fails("option steps (the number of steps) is required", "options are read raw: an __index does not supply steps",
  function() local r = samplers.new("euler", setmetatable({}, {__index = {steps = 4}})); return r end)
fails("steps must be from 1 to 1000, got 0", "zero steps are refused",
  function() local r = samplers.new("euler", {steps = 0}); return r end)
fails("option steps must be an integer", "fractional steps are refused",
  function() local r = samplers.new("ddim", {steps = 2.5}); return r end)
fails("prediction must be 'eps' or 'v', got 'x0'", "an unknown prediction is refused",
  function() local r = samplers.new("ddim", {steps = 4, prediction = "x0"}); return r end)
fails("timestep_spacing must be 'leading', 'linspace' or 'trailing'", "an unknown spacing is refused",
  function() local r = samplers.new("euler", {steps = 4, timestep_spacing = "even"}); return r end)
do
  local s = samplers.new("euler_a", {steps = 4})
  local x = {0, 0, 0}
  local zeros = function(n) local z = {} for k = 1, n do z[k] = 0 end return z end
  fails("step 5 is out of range (this sampler has steps 1 .. 4)", "a step past the last is refused",
    function() local r = s:step(x, 5, x, zeros); return r end)
  fails("step 0 is out of range", "step 0 is refused (steps count from 1)",
    function() local r = s:scale_model_input(x, 0); return r end)
  fails("step: model_output holds 2 values, x holds 3", "a model output of another size is refused",
    function() local r = s:step({1, 2}, 1, x, zeros); return r end)
  fails("euler_a: step needs noise_fn(n, i)", "the ancestral sampler needs its noise",
    function() local r = s:step(x, 1, x); return r end)
  fails("noise_fn(3) must return a list of 3 numbers, got 2 values", "noise of the wrong size is refused",
    function() local r = s:step(x, 1, x, function() return {0, 0} end); return r end)
  fails("cfg: cond holds 2 values, uncond holds 3", "cfg refuses halves of different sizes",
    function() local r = samplers.cfg(x, {1, 2}, 3); return r end)
end

T.done()
