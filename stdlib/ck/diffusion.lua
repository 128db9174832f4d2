-- The diffusion training objective: DDPM noise schedule (scaled_linear betas),
-- epsilon or v prediction, noise offset, and the per-sample loss weights of
-- kohya's sd-scripts: min-SNR-gamma, debiased estimation, and v-prediction's
-- loss scaled like noise prediction's. The noisy
-- latents, the target and the weighted loss are ops in the graph; per-sample
-- timesteps and schedule coefficients are inputs set before each step, drawn
-- from the counter-based generator keyed by (seed, step).
local ck = require "ck"

local M = {}

-- keys of the random streams (distinct from op keys, which are node indices)
local KEY_TIMESTEP, KEY_NOISE, KEY_OFFSET, KEY_IP = 0x7100, 0x7200, 0x7300, 0x7400

-- alphas_cumprod[t + 1] for t = 0 .. n - 1; scaled_linear is linear in sqrt(beta)
function M.alphas_cumprod(schedule, n, beta_start, beta_end)
  schedule = schedule or "scaled_linear"
  n, beta_start, beta_end = n or 1000, beta_start or 0.00085, beta_end or 0.012
  local out, prod = {}, 1.0
  for i = 0, n - 1 do
    local beta
    if schedule == "scaled_linear" then
      local s = math.sqrt(beta_start) + (math.sqrt(beta_end) - math.sqrt(beta_start)) * i / (n - 1)
      beta = s * s
    elseif schedule == "linear" then
      beta = beta_start + (beta_end - beta_start) * i / (n - 1)
    else
      error("unknown noise schedule '" .. tostring(schedule) .. "' (scaled_linear, linear)", 2)
    end
    prod = prod * (1 - beta)
    out[i + 1] = prod
  end
  return out
end

local Objective = {}
Objective.__index = Objective

-- o: prediction = "eps" | "v", schedule, num_train_timesteps, beta_start, beta_end,
--    noise_offset (0), ip_noise_gamma (0: input perturbation, noise the model
--    sees but the target leaves out), min_timestep (0) and max_timestep
--    (num_train_timesteps): timesteps drawn from [min, max), as kohya's;
--    min_snr_gamma (nil), debiased_estimation (false),
--    scale_v_pred_loss (false: v's loss scaled by snr / (snr + 1), as kohya's
--    --scale_v_pred_loss_like_noise_pred); the weights multiply
function M.objective(o)
  o = o or {}
  local self = setmetatable({}, Objective)
  self.prediction = o.prediction or "eps"
  if self.prediction ~= "eps" and self.prediction ~= "v" then
    error("prediction must be 'eps' or 'v', got '" .. tostring(self.prediction) .. "'", 2)
  end
  self.n = o.num_train_timesteps or 1000
  self.abar = M.alphas_cumprod(o.schedule, self.n, o.beta_start, o.beta_end)
  self.noise_offset = o.noise_offset or 0
  self.ip_noise_gamma = o.ip_noise_gamma or 0
  self.min_timestep, self.max_timestep = o.min_timestep or 0, o.max_timestep or self.n
  if not (math.type(self.min_timestep) == "integer" and math.type(self.max_timestep) == "integer" and
          self.min_timestep >= 0 and self.min_timestep < self.max_timestep and self.max_timestep <= self.n) then
    error(string.format("timesteps must satisfy 0 <= min_timestep < max_timestep <= %d, got %s and %s", self.n,
      tostring(self.min_timestep), tostring(self.max_timestep)), 2)
  end
  self.min_snr_gamma = o.min_snr_gamma
  self.debiased_estimation = o.debiased_estimation or false
  self.scale_v_pred_loss = o.scale_v_pred_loss or false
  if self.scale_v_pred_loss and self.prediction ~= "v" then
    error("scale_v_pred_loss scales v-prediction's loss; this objective predicts " .. self.prediction, 2)
  end
  return self
end

M.eps = function(o) o = o or {}; o.prediction = "eps"; return M.objective(o) end
M.v = function(o) o = o or {}; o.prediction = "v"; return M.objective(o) end

-- Records the objective around model_fn(noisy, timesteps) -> prediction.
-- shape: the latents' shape {B, C, H, W}. Returns the loss tensor.
function Objective:build(g, shape, model_fn)
  local B = shape[1]
  local x0 = g:input("latents", shape)
  local noise = g:input("noise", shape)
  local t = g:input("timesteps", {B})
  local sa = g:input("sqrt_alpha_prod", {B, 1, 1, 1})
  local sb = g:input("sqrt_one_minus_alpha_prod", {B, 1, 1, 1})
  local w = g:input("loss_weight", {B, 1, 1, 1})
  self.inputs = {latents = x0, noise = noise, timesteps = t, sa = sa, sb = sb, weight = w}
  if self.noise_offset ~= 0 then
    local off = g:input("noise_offset", {B, shape[2], 1, 1})
    self.inputs.offset = off
    noise = noise + off
  end
  self.shape = shape
  local seen = noise
  if self.ip_noise_gamma ~= 0 then
    self.inputs.ip = g:input("ip_noise", shape)
    seen = noise + self.inputs.ip
  end
  local noisy = x0 * sa + seen * sb
  local pred = model_fn(noisy, t)
  local target = noise
  if self.prediction == "v" then target = noise * sa - x0 * sb end
  local d = pred - target
  self.loss = ck.mean(d * d * w)
  self.prediction_tensor = pred
  return self.loss
end

-- per-sample loss weight at timestep t, the product of those asked for, as
-- kohya's sd-scripts apply them: min-SNR-gamma (Hang et al. 2023), min(snr,
-- gamma) / snr (over snr + 1 for v); v's loss scaled like noise prediction's,
-- snr / (snr + 1); debiased estimation, 1 / sqrt(snr) (1 / (snr + 1) for v);
-- the last two with snr capped at 1000
function Objective:weight(t)
  local a = self.abar[t + 1]
  local snr = a / (1 - a)
  local w, v = 1, self.prediction == "v"
  if self.min_snr_gamma then w = w * math.min(snr, self.min_snr_gamma) / (v and snr + 1 or snr) end
  local s = math.min(snr, 1000)
  if self.scale_v_pred_loss then w = w * s / (s + 1) end
  if self.debiased_estimation then w = w * (v and 1 / (s + 1) or 1 / math.sqrt(s)) end
  return w
end

-- Sets timesteps, noise and coefficients for the step about to run.
-- given: optional per-sample overrides {timesteps = {..}, noise = true (already loaded)},
-- and eval = true for an evaluation pass (no input perturbation).
-- step: the generator's step (default: the program's next step).
function Objective:prepare(p, given, step)
  given = given or {}
  step = step or (p.steps + 1)
  local seed = self.seed or 0
  local B = self.shape[1]
  -- given.rows: each sample's row in the global batch (0-based), a
  -- data-parallel rank's share: its timesteps and noise are the ones one
  -- process draws for those rows
  local rows = given.rows
  -- given.weight_scale: every sample's loss weight times this (a data-parallel
  -- rank's share of a batch that does not split evenly; 0 for a padding row);
  -- given.loss_weights: each sample's own (kohya's --prior_loss_weight for
  -- regularization images), multiplying its squared error before the mean, as
  -- kohya's loss * loss_weights then loss.mean()
  local scale = given.weight_scale or 1
  local own = given.loss_weights
  local ts, sa, sb, w = {}, {}, {}, {}
  for b = 1, B do
    local t = given.timesteps and given.timesteps[b]
    if not t then
      local span = self.max_timestep - self.min_timestep
      t = self.min_timestep + math.min(span - 1, math.floor(ck.random(seed, step, KEY_TIMESTEP, rows and rows[b] or b - 1)
        * span))
    end
    t = math.max(0, math.min(self.n - 1, math.floor(t)))
    ts[b] = t
    local a = self.abar[t + 1]
    sa[b], sb[b], w[b] = math.sqrt(a), math.sqrt(1 - a), self:weight(t) * scale * (own and own[b] or 1)
  end
  p:set(self.inputs.timesteps, ts)
  p:set(self.inputs.sa, sa)
  p:set(self.inputs.sb, sb)
  p:set(self.inputs.weight, w)
  if not given.noise then p:randn(self.inputs.noise, KEY_NOISE, 1.0, step, rows) end
  if self.inputs.offset then p:randn(self.inputs.offset, KEY_OFFSET, self.noise_offset, step, rows) end
  if self.inputs.ip then
    if given.eval then p:set(self.inputs.ip, 0) else p:randn(self.inputs.ip, KEY_IP, self.ip_noise_gamma, step, rows) end
  end
  return ts
end

return M
