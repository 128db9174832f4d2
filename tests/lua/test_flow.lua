-- ck.flow against kohya's sd-scripts and diffusers (tests/ref/make_flow_ref.py):
-- the training scheduler's tables; kohya's timestep sampling (uniform,
-- sigmoid, shift, flux_shift, and "sigma" with SD3's weighting schemes) on
-- torch's own draws; the draws ck's generator makes, against the formulas'
-- distributions; the loss weights; the loss and gradients in the graph for
-- each prediction type, against autograd and finite differences; FluxPipeline's
-- sigmas and timesteps at several resolutions and step counts; the objective
-- inside ck.flux_step.training_step; bad options refused in one line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local flow = require "ck.flow"
local options = require "ck.options"

local DATA = "tests/data/flow/"
local f32 = flow.f32

-- max |a - b| over max |b|
local function rel(a, b)
  if #a ~= #b then return math.huge end
  local d, m = 0, 0
  for i = 1, #b do d, m = math.max(d, math.abs(a[i] - b[i])), math.max(m, math.abs(b[i])) end
  return d / math.max(m, 1e-30)
end

local function equal(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false, i end end
  return true
end

local ref <close> = ck.safetensors(DATA .. "objective.safetensors")
local cases = ck.json_decode(ref:metadata().cases)

do -- the formulas the tools share
  T.ok(math.abs(flow.calculate_shift(256) - 0.5) < 1e-15 and math.abs(flow.calculate_shift(4096) - 1.15) < 1e-15,
    "mu is 0.5 at 256 image tokens and 1.15 at 4096 (FLUX.1-dev's calculate_shift)")
  local mu = flow.calculate_shift(1024)
  T.ok(math.abs(mu - (0.5 + 768 * 0.65 / 3840)) < 1e-15, string.format("mu is linear in the tokens: %.6f at 1024", mu))
  local e = math.exp(0.8)
  T.ok(math.abs(flow.time_shift(0.8, 1, 0.5) - e / (e + 1)) < 1e-15 and flow.time_shift(0.8, 1, 1) == 1 and
    flow.time_shift(0.8, 1, 0) == 0, "time_shift(mu, 1, t) = e^mu / (e^mu + 1/t - 1), 0 and 1 fixed")
  T.ok(flow.shift(0.5, 3) == 0.75 and flow.shift(1, 3) == 1 and flow.shift(0, 3) == 0,
    "the static shift: 3 * 0.5 / (1 + 2 * 0.5) = 0.75, 0 and 1 fixed")
end

do -- the training scheduler's tables, bit for bit
  for _, sh in ipairs{1.0, 3.0, 3.1582} do
    local t = flow.train_table(1000, sh)
    local key = string.format("table/shift%g/", sh)
    local ok1 = equal(t.sigmas, ref:read(key .. "sigmas"))
    local ok2 = equal(t.timesteps, ref:read(key .. "timesteps"))
    T.ok(ok1 and ok2, string.format("FlowMatchEulerDiscreteScheduler(shift=%g)'s 1000 sigmas and timesteps, bitwise", sh))
  end
end

do -- kohya's get_noisy_model_input_and_timesteps on torch's draws
  local names = {}
  for name in pairs(cases) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local c = cases[name]
    local o = {}
    for _, k in ipairs{"timestep_sampling", "sigmoid_scale", "discrete_flow_shift", "weighting_scheme", "logit_mean",
                       "logit_std", "mode_scale"} do
      if c[k] ~= nil then o[k] = c[k] end
    end
    local obj = flow.objective(o)
    local u, z = ref:read("draw/" .. name .. "/u"), ref:read("draw/" .. name .. "/z")
    local want_s, want_t = ref:read("draw/" .. name .. "/sigmas"), ref:read("draw/" .. name .. "/timesteps")
    local got_s, got_t = {}, {}
    for i = 1, #u do got_s[i], got_t[i] = obj:draw(u[i], z[i], c.height, c.width) end
    local es, et = rel(got_s, want_s), rel(got_t, want_t)
    -- exact where torch's arithmetic is IEEE's; sigmoid's and cos's vector code rounds its own way
    local exact = c.timestep_sampling == "uniform" or (c.timestep_sampling == "sigma" and c.weighting_scheme == "uniform")
    local tol = exact and 0 or 4e-7
    if c.timestep_sampling == "sigma" then
      T.ok(equal(got_s, want_s) and equal(got_t, want_t),
        string.format("%s: the 64 indices into the table are kohya's, so sigmas and timesteps are, bitwise", name))
    else
      T.ok(es <= tol and et <= tol, string.format("%s: 64 sigmas and timesteps as kohya's (rel %.2g, %.2g)", name, es, et))
    end
  end
end

do -- the weights of SD3's schemes, and when they apply
  local s = ref:read("draw/uniform/sigmas")
  for _, scheme in ipairs{"sigma_sqrt", "cosmap", "none"} do
    local got = {}
    for i = 1, #s do got[i] = flow.loss_weighting(scheme, s[i]) end
    local e = rel(got, ref:read("weighting/" .. scheme))
    T.ok(e < 2e-6, string.format("compute_loss_weighting_for_sd3(%s) on 64 sigmas (rel %.2g)", scheme, e))
  end
  local raw = flow.objective{model_prediction_type = "raw", weighting_scheme = "sigma_sqrt"}
  local scaled = flow.objective{model_prediction_type = "sigma_scaled", weighting_scheme = "sigma_sqrt"}
  local always = flow.objective{model_prediction_type = "raw", weighting_scheme = "cosmap", apply_weighting = "always"}
  T.ok(raw:weight(0.5) == 1 and scaled:weight(0.5) == 4 and math.abs(always:weight(0.5) - 4 / math.pi) < 1e-15,
    "kohya weights sigma_scaled predictions only (raw 1, sigma_scaled 1/sigma^2); 'always' weights raw too (cosmap)")
end

-- the draws ck's generator gives: the Kolmogorov-Smirnov distance of n
-- sigmas (each drawn as prepare draws it, rows of 8 per step) from the
-- formula's distribution function
local function ks(obj, cdf, h, w, n)
  local xs = {}
  for i = 0, n - 1 do
    xs[#xs + 1] = (obj:draw(ck.random(obj.seed, i // 8, 0x7100, i % 8), ck.randn(obj.seed, i // 8, 0x7800, i % 8), h, w))
  end
  table.sort(xs)
  local d = 0
  for i, x in ipairs(xs) do
    local F = cdf(x)
    d = math.max(d, math.abs(F - (i - 1) / #xs), math.abs(F - i / #xs))
  end
  return d
end

local function phi(x) -- the standard normal's distribution function
  local t = 1 / (1 + 0.2316419 * math.abs(x))
  local p = math.exp(-x * x / 2) / math.sqrt(2 * math.pi) *
    t * (0.319381530 + t * (-0.356563782 + t * (1.781477937 + t * (-1.821255978 + t * 1.330274429))))
  return x >= 0 and 1 - p or p
end
local function logit(p) return math.log(p / (1 - p)) end

do -- 20000 draws each: 1.63 / sqrt(20000) = 0.0115 is the distance's 1% bound
  local c = {
    {{timestep_sampling = "uniform"}, function(s) return s end, "U(0, 1)"},
    {{timestep_sampling = "sigmoid", sigmoid_scale = 2.5}, function(s) return phi(logit(s) / 2.5) end,
     "sigmoid(2.5 z)"},
    {{timestep_sampling = "shift", discrete_flow_shift = 3.1582}, function(s)
      local x = s / (3.1582 - 2.1582 * s) -- the shift's inverse
      return phi(logit(x))
    end, "shift 3.1582 of sigmoid(z)"},
    {{timestep_sampling = "flux_shift", sigmoid_scale = 1.5}, function(s)
      local mu = flow.calculate_shift(32 * 48)
      return phi(logit(1 / (1 + math.exp(mu) * (1 / s - 1))) / 1.5) -- time_shift's inverse
    end, "FLUX.1-dev's shift at 1536 tokens of sigmoid(1.5 z)"},
  }
  for i, e in ipairs(c) do
    e[1].seed = i
    local d = ks(flow.objective(e[1]), e[2], 64, 96, 20000)
    T.ok(d < 0.0115, string.format("%s: 20000 draws from ck's generator, Kolmogorov-Smirnov distance %.4f", e[3], d))
  end
  -- flux_shift moves the median from 0.5 to e^mu / (e^mu + 1): larger images are drawn noisier
  local obj = flow.objective{timestep_sampling = "flux_shift"}
  local med = {}
  for _, hw in ipairs{{32, 32}, {128, 128}} do
    local xs = {}
    for i = 0, 1999 do xs[#xs + 1] = (obj:draw(ck.random(3, i, 0x7100, 0), ck.randn(3, i, 0x7800, 0), hw[1], hw[2])) end
    table.sort(xs)
    med[#med + 1] = (xs[1000] + xs[1001]) / 2
  end
  local want = {math.exp(0.5) / (math.exp(0.5) + 1), math.exp(1.15) / (math.exp(1.15) + 1)}
  T.ok(math.abs(med[1] - want[1]) < 0.03 and math.abs(med[2] - want[2]) < 0.03,
    string.format("flux_shift's median sigma is %.3f at 256 tokens and %.3f at 4096 (the formula's %.3f, %.3f)",
      med[1], med[2], want[1], want[2]))
end

-- the toy model: prediction = noisy * w + b, w and b [1, C, 1, 1] parameters
local function toy(o)
  local obj = flow.objective(o)
  local g = ck.graph()
  local w = g:param("w", {1, 4, 1, 1})
  local b = g:param("b", {1, 4, 1, 1})
  local loss = obj:build(g, {2, 4, 2, 2}, function(noisy) return noisy * w + b end)
  local p = g:compile{loss = loss, optimizer = "none", keep_grads = true}
  p:set(obj.inputs.latents, ref:read("latents"))
  p:set(obj.inputs.noise, ref:read("noise"))
  p:set(w, ref:read("w"))
  p:set(b, ref:read("b"))
  return obj, p, w, b
end

do -- the loss and its gradients, against kohya's and diffusers' code run by autograd
  local sig = ref:read("sigmas")
  local worst_l, worst_g, bad, n = 0, 0, nil, 0
  for _, mtype in ipairs{"raw", "additive", "sigma_scaled"} do
    for _, scheme in ipairs{"none", "sigma_sqrt", "cosmap"} do
      for _, applies in ipairs{"sigma_scaled", "always"} do
        local obj, p, w, b = toy{model_prediction_type = mtype, weighting_scheme = scheme, apply_weighting = applies}
        obj:prepare(p, {sigmas = sig, noise = true})
        local l = p:step()
        local key = mtype .. "/" .. scheme .. "/" .. applies
        local want = ref:read("loss/" .. key)[1]
        local el = math.abs(l - want) / want
        local eg = math.max(rel(p:grad(w), ref:read("grad_w/" .. key)), rel(p:grad(b), ref:read("grad_b/" .. key)))
        worst_l, worst_g, n = math.max(worst_l, el), math.max(worst_g, eg), n + 1
        if (el > 2e-6 or eg > 1e-5) and not bad then bad = string.format("%s: loss rel %.2g, grads rel %.2g", key, el, eg) end
      end
    end
  end
  T.ok(n == 18 and not bad, string.format("18 settings (prediction type x scheme x when it applies): the loss as " ..
    "kohya's train_network computes it (worst rel %.2g), w's and b's gradients as autograd's (worst %.2g)%s",
    worst_l, worst_g, bad and ("; not " .. bad) or ""))
end

do -- finite differences: the loss is quadratic in w and b, so central differences are exact but for rounding
  local sig = ref:read("sigmas")
  for _, mtype in ipairs{"raw", "additive", "sigma_scaled"} do
    local obj, p, w, b = toy{model_prediction_type = mtype, weighting_scheme = "cosmap", apply_weighting = "always"}
    obj:prepare(p, {sigmas = sig, noise = true})
    p:step()
    local grads = {[w] = p:grad(w), [b] = p:grad(b)}
    local worst, top = 0, 0
    for _, t in ipairs{w, b} do
      for _, v in ipairs(grads[t]) do top = math.max(top, math.abs(v)) end
    end
    for _, t in ipairs{w, b} do
      local v, grad = p:get(t), grads[t]
      for i = 1, #v do
        local h = 0.25
        local up, down = {table.unpack(v)}, {table.unpack(v)}
        up[i], down[i] = v[i] + h, v[i] - h
        p:set(t, up)
        local lu = p:forward()
        p:set(t, down)
        local ld = p:forward()
        p:set(t, v)
        worst = math.max(worst, math.abs((lu - ld) / (2 * h) - grad[i]) / top)
      end
    end
    T.ok(worst < 1e-5, string.format("%s: the 8 gradients match central differences (worst %.2g of the largest)", mtype,
      worst))
  end
end

do -- the noisy input and the target: at sigma 0 the model sees the latents, at 1 the noise
  local seen = {}
  local obj = flow.objective{model_prediction_type = "raw"}
  local g = ck.graph()
  local loss = obj:build(g, {2, 4, 2, 2}, function(noisy) seen.t = noisy; return noisy end)
  local p = g:compile{loss = loss, outputs = {seen.t}, optimizer = "none"}
  local x0, noise = ref:read("latents"), ref:read("noise")
  p:set(obj.inputs.latents, x0)
  p:set(obj.inputs.noise, noise)
  obj:prepare(p, {sigmas = {0, 1}, noise = true})
  local l = p:forward()
  local got, want = p:get(seen.t), {}
  for i = 1, 16 do want[i] = x0[i] end
  for i = 17, 32 do want[i] = noise[i] end
  T.ok(equal(got, want), "x_t = (1 - sigma) x0 + sigma noise: the latents at sigma 0, the noise at sigma 1, exactly")
  local sum = 0
  for i = 1, 32 do sum = sum + (want[i] - (noise[i] - x0[i])) ^ 2 end
  T.ok(math.abs(l - sum / 32) < 1e-6 * sum / 32, "the target is noise - latents: mean((x_t - (noise - x0))^2)")
  local s, t = obj:prepare(p, {timesteps = {250, 750}, noise = true})
  T.ok(s[1] == 0.25 and s[2] == 0.75 and t[1] == 0.25, "given timesteps (kohya's 1000 sigma) set sigma t / 1000")
end

do -- prepare's draws: keyed by (seed, step, row), a data-parallel rank's rows as one process draws them
  local obj = flow.objective{timestep_sampling = "shift", seed = 9}
  local g = ck.graph()
  local loss = obj:build(g, {4, 4, 2, 2}, function(noisy) return noisy end)
  local p = g:compile{loss = loss, optimizer = "none"}
  local s1 = obj:prepare(p, {}, 5)
  local n1 = p:get(obj.inputs.noise)
  local s2 = obj:prepare(p, {}, 5)
  local s3 = obj:prepare(p, {}, 6)
  T.ok(equal(s1, s2) and not equal(s1, s3) and s1[1] ~= s1[2], "the same step draws the same sigmas, another step others")
  local half = flow.objective{timestep_sampling = "shift", seed = 9}
  local g2 = ck.graph()
  local l2 = half:build(g2, {2, 4, 2, 2}, function(noisy) return noisy end)
  local p2 = g2:compile{loss = l2, optimizer = "none"}
  local sh = half:prepare(p2, {rows = {1, 3}}, 5)
  local n2 = p2:get(half.inputs.noise)
  local same = sh[1] == s1[2] and sh[2] == s1[4]
  for i = 1, 16 do same = same and n2[i] == n1[16 + i] and n2[16 + i] == n1[48 + i] end
  T.ok(same, "rows {1, 3} get the sigmas and noise of rows 1 and 3 of the whole batch")
  local w = p:get(obj.inputs.weight)
  T.ok(w[1] == 1 and w[4] == 1, "sigma_scaled with the uniform scheme weighs every sample 1")
  obj:prepare(p, {weight_scale = 0.5, loss_weights = {1, 2, 1, 1}}, 5)
  w = p:get(obj.inputs.weight)
  T.ok(w[1] == 0.5 and w[2] == 1.0, "weight_scale and per-sample loss_weights multiply the weight")
end

do -- input perturbation and guidance
  local obj = flow.objective{model_prediction_type = "raw", ip_noise_gamma = 0.25, guidance_scale = 1.0}
  local g = ck.graph()
  local seen = {}
  local gi = g:input("guidance", {2})
  obj.guidance_input = gi
  local loss = obj:build(g, {2, 4, 2, 2}, function(noisy) seen.t = noisy; return noisy end)
  local p = g:compile{loss = loss, outputs = {seen.t}, optimizer = "none"}
  local x0, noise = ref:read("latents"), ref:read("noise")
  p:set(obj.inputs.latents, x0)
  p:set(obj.inputs.noise, noise)
  obj:prepare(p, {sigmas = {0.5, 0.5}, noise = true})
  p:forward()
  local ip, got = p:get(obj.inputs.ip), p:get(seen.t)
  local worst, sq = 0, 0
  for i = 1, 32 do
    worst = math.max(worst, math.abs(got[i] - (0.5 * x0[i] + 0.5 * (noise[i] + ip[i]))))
    sq = sq + ip[i] ^ 2
  end
  T.ok(sq > 0 and worst < 1e-6, "ip_noise_gamma: the model sees (1 - sigma) x0 + sigma (noise + perturbation)")
  local gv = p:get(gi)
  T.ok(gv[1] == 1.0 and gv[2] == 1.0, "prepare sets the guidance input to guidance_scale")
  obj:prepare(p, {sigmas = {0.5, 0.5}, noise = true, eval = true})
  local z = p:get(obj.inputs.ip)
  T.ok(z[1] == 0 and z[32] == 0, "an evaluation pass sees no perturbation")
end

do -- the options a training script declares, kohya's defaults, parsed into an objective
  local o = options.parse({}, flow.OPTIONS)
  local t = flow.from_options(o)
  local same = true
  for k, v in pairs(t) do same = same and flow.DEFAULTS[k] == v end
  T.ok(same and t.timestep_sampling == "sigma" and t.model_prediction_type == "sigma_scaled" and t.guidance_scale == 3.5
    and t.discrete_flow_shift == 3.0, "flow.OPTIONS' defaults are kohya's (sigma, sigma_scaled, 3.0, guidance 3.5)")
  o = options.parse({["timestep-sampling"] = "flux_shift", ["model-prediction-type"] = "raw",
                     ["guidance-scale"] = 1.0, ["weighting-scheme"] = "logit_normal"}, flow.OPTIONS)
  local obj = flow.objective(flow.from_options(o))
  T.ok(obj.timestep_sampling == "flux_shift" and obj.model_prediction_type == "raw" and obj.guidance_scale == 1.0 and
    obj.weighting_scheme == "logit_normal", "kohya's recommended command line reaches the objective")
  local ok, err = pcall(options.parse, {["timestep-sampling"] = "lognorm"}, flow.OPTIONS)
  T.ok(not ok and tostring(err):find("%-%-timestep%-sampling must be sigma or uniform"), "a bad choice is refused: " ..
    tostring(err))
end

do -- bad options: one line with this script's line
  local bad = {
    {function() local r = flow.objective{timestep_sampling = "lognorm"}; return r end, "timestep_sampling must be sigma, uniform"},
    {function() local r = flow.objective{discrete_flow_shift = 0}; return r end, "discrete_flow_shift must be a number > 0, got 0"},
    {function() local r = flow.objective{guidance_scale = -1}; return r end, "guidance_scale must be a number >= 0"},
    {function() local r = flow.objective{model_prediction_type = "v"}; return r end, "model_prediction_type must be raw"},
    {function() local r = flow.objective{timestep_samplin = "uniform"}; return r end, "unknown option 'timestep_samplin'"},
    {function() local r = flow.objective{logit_std = 0 / 0}; return r end, "logit_std must be a number > 0"},
    {function() local r = flow.schedule{steps = 0}; return r end, "steps must be a whole number from 1 to 10000, got 0"},
    {function() local r = flow.schedule{steps = 4}; return r end, "image_seq_len %(the packed image's tokens%) must be"},
    {function() local r = flow.sampler{steps = 4, image_seq_len = 16}:step({1}, 5, {1}); return r end, "step 5 is out of range"},
  }
  for i, c in ipairs(bad) do
    local ok, err = pcall(c[1])
    err = tostring(err)
    T.ok(not ok and err:find(c[2]) and err:find("test_flow.lua:%d+:") and not err:find("\n"),
      "bad input " .. i .. " refused in one line: " .. err)
  end
end

do -- FluxPipeline's schedules: diffusers' sigmas and timesteps, bitwise
  local sref <close> = ck.safetensors(DATA .. "schedule.safetensors")
  local sc = ck.json_decode(sref:metadata().cases)
  local n, bad = 0, nil
  for _, cfg in ipairs{"dev", "schnell"} do
    for _, pair in ipairs(sc[cfg]) do
      local seq, steps = pair[1], pair[2]
      local s = flow.schedule{steps = steps, image_seq_len = seq, config = flow.SCHEDULER[cfg]}
      local key = string.format("%s/%d/%d", cfg, seq, steps)
      local ok1, at1 = equal(s.sigmas, sref:read("sigmas/" .. key))
      local ok2, at2 = equal(s.timesteps, sref:read("timesteps/" .. key))
      n = n + 1
      if not (ok1 and ok2) and not bad then bad = string.format("%s (sigma %s, timestep %s)", key, at1, at2) end
    end
  end
  T.ok(n == 11 and not bad, "11 schedules (dev at 16 to 6144 tokens and 1 to 50 steps, schnell's unshifted) are " ..
    "FlowMatchEulerDiscreteScheduler's, bitwise" .. (bad and ("; not " .. bad) or ""))
  local dev = flow.schedule{steps = 28, image_seq_len = 4096}
  local flat = flow.schedule{steps = 28, image_seq_len = 4096, config = flow.SCHEDULER.schnell}
  T.ok(dev.sigmas[14] > flat.sigmas[14] and flat.sigmas[15] == f32(1 - 14 / 28) and dev.mu == 1.15 and flat.mu == nil,
    string.format("at 4096 tokens dev's shift holds sigma %.3f where schnell's is %.3f", dev.sigmas[14], flat.sigmas[14]))
  local fixed = flow.schedule{steps = 4, image_seq_len = 4096, shift = 3.0}
  T.ok(fixed.sigmas[2] == f32(f32(3 * 0.75) / f32(1 + f32(2 * 0.75))) and fixed.mu == nil,
    "a static shift given replaces the dynamic one: sigma 0.75 -> 2.25 / 2.5")
end

do -- the sampler's step is FlowMatchEulerDiscreteScheduler.step: x + (sigma_next - sigma) v, in float32
  local s = flow.sampler{steps = 3, image_seq_len = 96}
  local x, v = {0.5, -1.25, 3.0}, {0.1, 0.2, -0.3}
  local got = s:step(v, 1, x)
  local dt = f32(s.sigmas[2] - s.sigmas[1])
  local ok = true
  for k = 1, 3 do ok = ok and got[k] == f32(x[k] + f32(dt * v[k])) end
  T.ok(ok and s.model_timesteps[1] == f32(s.timesteps[1] / 1000) and s.sigmas[4] == 0,
    "step 1 moves by (sigma_2 - sigma_1) v; the model sees timesteps / 1000; the last sigma is 0")
end

do -- the objective in ck.flux_step.training_step (flux-tiny): at sigma 0 the transformer sees the clean latents
  local flux, fk = require "ck.flux", require "ck.flux_keys"
  local f <close> = ck.safetensors("tests/data/flux/ref.safetensors")
  local obj = flow.objective{model_prediction_type = "raw", guidance_scale = 1.0}
  local r = require("ck.flux_step").training_step{config = "flux-tiny", batch = 2, latent = {4, 6}, tokens = 5, lora = {rank = 4},
    objective = obj, compile = {lr = 1e-2}}
  obj.guidance_input = r.inputs.guidance
  local base = {}
  for _, t in ipairs(r.graph:params()) do if t.kind == "frozen" then base[#base + 1] = t end end
  fk.load(r.program, fk.open("tests/data/flux/transformer"), base)
  local p, x = r.program, r.inputs
  local lat, tgt = f:read("latents"), f:read("target")
  local noise = {}
  for i = 1, #lat do noise[i] = lat[i] + tgt[i] end
  for _, k in ipairs{"encoder_hidden_states", "pooled_projections"} do p:set(x[k], f:read(k)) end
  p:set(x.rope, r.rope_values)
  p:set(x.latents, lat)
  p:set(x.noise, noise)
  obj:prepare(p, {sigmas = {0, 0}, noise = true})
  -- the reference's transformer ran on the clean latents at its own timesteps and guidance
  p:set(x.timesteps, f:read("timestep"))
  p:set(x.guidance, f:read("guidance"))
  local loss, want = p:forward(), f:read("loss")[1]
  T.ok(math.abs(loss - want) < 1e-5 * want,
    string.format("ck.flux_step.training_step with flow.objective: the reference transformer's mse against noise - latents " ..
      "(%.7g, want %.7g)", loss, want))
  local first
  for step = 1, 5 do
    obj:prepare(p, {noise = true}, 1) -- the same sigmas every step, so the loss is comparable
    local l = p:step()
    first = first or l
    if step == 5 then T.ok(l < first, string.format("five LoRA steps on one batch lower the loss (%.5g -> %.5g)", first, l)) end
  end
  T.ok(p:get(x.guidance)[1] == 1.0, "the guidance input holds guidance_scale 1.0")
end

T.done()
