-- The diffusion objective (ck.diffusion) against formulas computed here: the
-- scaled_linear schedule (diffusers' DDPMScheduler with SDXL's betas), the
-- loss weights kohya's sd-scripts apply (min-SNR-gamma, v's loss scaled like
-- noise prediction's, debiased estimation, alone and together), and the loss
-- the graph computes: mean(w * (prediction - target)^2) with target the noise
-- (eps) or sqrt(abar) noise - sqrt(1 - abar) x0 (v); input perturbation
-- (noise the model sees and the target leaves out) and the timestep range.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local diffusion = require "ck.diffusion"

local function close(a, b, tol) return math.abs(a - b) <= (tol or 1e-12) * math.max(1, math.abs(b)) end

-- the schedule: betas linear in sqrt from 0.00085 to 0.012 over 1000 steps
local abar, prod = {}, 1
for i = 0, 999 do
  local s = math.sqrt(0.00085) + (math.sqrt(0.012) - math.sqrt(0.00085)) * i / 999
  prod = prod * (1 - s * s)
  abar[i] = prod
end
local got = diffusion.alphas_cumprod()
T.ok(#got == 1000 and close(got[1], 0.99915) and close(got[1000], abar[999]) and close(got[501], abar[500]),
  string.format("scaled_linear alphas_cumprod: %.6f at t=0, %.6f at t=999", got[1], got[1000]))
T.ok(math.abs(got[1000] - 0.0047) < 1e-4, "SDXL's last alphas_cumprod is about 0.0047: " .. got[1000])

local function snr(t) return abar[t] / (1 - abar[t]) end

-- weights at t = 0 (snr above 1000), 100 (between 5 and 1000), 999 (below 1)
local cases = {
  {{}, function() return 1 end, "no weighting"},
  {{min_snr_gamma = 5}, function(t) return math.min(snr(t), 5) / snr(t) end, "min-SNR-gamma 5, eps"},
  {{min_snr_gamma = 5, prediction = "v"}, function(t) return math.min(snr(t), 5) / (snr(t) + 1) end,
   "min-SNR-gamma 5, v"},
  {{debiased_estimation = true}, function(t) return 1 / math.sqrt(math.min(snr(t), 1000)) end, "debiased, eps"},
  {{debiased_estimation = true, prediction = "v"}, function(t) return 1 / (math.min(snr(t), 1000) + 1) end,
   "debiased, v"},
  {{scale_v_pred_loss = true, prediction = "v"}, function(t) local s = math.min(snr(t), 1000); return s / (s + 1) end,
   "v scaled like noise prediction"},
  {{min_snr_gamma = 5, scale_v_pred_loss = true, debiased_estimation = true, prediction = "v"}, function(t)
    local s = math.min(snr(t), 1000)
    return math.min(snr(t), 5) / (snr(t) + 1) * s / (s + 1) / (s + 1)
  end, "all three, v: the product"},
}
for _, c in ipairs(cases) do
  local o = diffusion.objective(c[1])
  local worst = 0
  for _, t in ipairs{0, 100, 999} do worst = math.max(worst, math.abs(o:weight(t) - c[2](t)) / c[2](t)) end
  T.ok(worst < 1e-12, string.format("%s: weights at t = 0, 100, 999 as the formula (worst %.2g)", c[3], worst))
end
T.ok(snr(0) > 1000 and snr(100) > 5 and snr(100) < 1000 and snr(999) < 1, "the three timesteps cover each clamp")

local ok, err = pcall(function() local o = diffusion.objective{scale_v_pred_loss = true}; return o end)
T.ok(not ok and err:match("test_diffusion%.lua:%d+:") and err:match("v%-prediction"),
  "scaling v's loss in an eps objective is refused: " .. tostring(err))

-- the loss the graph computes, with the model's prediction the noisy latents themselves
for _, pred in ipairs{"eps", "v"} do
  local o = diffusion.objective{prediction = pred, min_snr_gamma = 5, debiased_estimation = true}
  local g = ck.graph()
  local loss = o:build(g, {2, 1, 2, 2}, function(noisy) return noisy end)
  local p = g:compile{loss = loss, optimizer = "none"}
  local x0, noise = {0.5, -1, 2, 0.25, 1, 1, -0.5, 0}, {0.1, 0.2, -0.3, 0.4, -1, 0.5, 0.5, 2}
  p:set(o.inputs.latents, x0)
  p:set(o.inputs.noise, noise)
  local ts = o:prepare(p, {timesteps = {300, 999}, noise = true})
  local want = 0
  for b = 1, 2 do
    local a, w = abar[ts[b]], o:weight(ts[b])
    for i = 4 * b - 3, 4 * b do
      local noisy = math.sqrt(a) * x0[i] + math.sqrt(1 - a) * noise[i]
      local target = pred == "v" and math.sqrt(a) * noise[i] - math.sqrt(1 - a) * x0[i] or noise[i]
      want = want + w * (noisy - target) ^ 2 / 8
    end
  end
  local l = p:forward()
  T.ok(ts[1] == 300 and ts[2] == 999 and close(l, want, 1e-5),
    string.format("%s: the graph's weighted loss %.7f, the formula's %.7f", pred, l, want))
end

-- input perturbation: the model sees x0 sa + (noise + ip) sb, the target is the noise;
-- an evaluation pass sees no perturbation; the draws are gamma times a normal
do
  local o = diffusion.objective{prediction = "eps", ip_noise_gamma = 0.5}
  local g = ck.graph()
  local loss = o:build(g, {1, 1, 2, 2}, function(noisy) return noisy end)
  local p = g:compile{loss = loss, optimizer = "none"}
  local x0, noise = {0.5, -1, 2, 0.25}, {0.1, 0.2, -0.3, 0.4}
  p:set(o.inputs.latents, x0)
  p:set(o.inputs.noise, noise)
  o:prepare(p, {timesteps = {400}, noise = true})
  local ip, a = p:get(o.inputs.ip), abar[400]
  local want, sq = 0, 0
  for i = 1, 4 do
    local noisy = math.sqrt(a) * x0[i] + math.sqrt(1 - a) * (noise[i] + ip[i])
    want = want + (noisy - noise[i]) ^ 2 / 4
    sq = sq + ip[i] ^ 2
  end
  T.ok(sq > 0 and close(p:forward(), want, 1e-5), "ip_noise_gamma: the model sees the perturbed noise, the target is the noise")
  o:prepare(p, {timesteps = {400}, noise = true, eval = true})
  local zero = p:get(o.inputs.ip)
  T.ok(zero[1] == 0 and zero[4] == 0, "an evaluation pass sees no perturbation")
  -- the perturbation's scale: 4096 draws of 0.5 * N(0, 1)
  local o2 = diffusion.objective{ip_noise_gamma = 0.5}
  local g2 = ck.graph()
  o2:build(g2, {1, 1, 64, 64}, function(noisy) return noisy end)
  local p2 = g2:compile{loss = o2.loss, optimizer = "none"}
  o2:prepare(p2, {timesteps = {1}})
  local s2 = 0
  for _, v in ipairs(p2:get(o2.inputs.ip)) do s2 = s2 + v * v end
  local sd = math.sqrt(s2 / 4096)
  T.ok(math.abs(sd - 0.5) < 0.03, string.format("the perturbation's standard deviation is gamma: %.3f", sd))
end

-- timesteps from [min_timestep, max_timestep): 64 steps of batch 8 stay inside and reach both ends' tenths
do
  local o = diffusion.objective{min_timestep = 200, max_timestep = 300}
  local g = ck.graph()
  o:build(g, {8, 1, 1, 1}, function(noisy) return noisy end)
  local p = g:compile{loss = o.loss, optimizer = "none"}
  local lo, hi, inside = 1000, -1, true
  for s = 1, 64 do
    for _, t in ipairs(o:prepare(p, nil, s)) do
      inside = inside and t >= 200 and t < 300
      lo, hi = math.min(lo, t), math.max(hi, t)
    end
  end
  T.ok(inside and lo < 210 and hi >= 290, string.format("timesteps drawn in [200, 300): %d to %d", lo, hi))
  local ok, err = pcall(function() local x = diffusion.objective{min_timestep = 500, max_timestep = 500}; return x end)
  T.ok(not ok and err:match("test_diffusion%.lua:%d+:") and err:match("min_timestep < max_timestep"),
    "an empty timestep range is refused: " .. tostring(err))
end

T.done()
