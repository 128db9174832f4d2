-- Optimizer settings for g:compile: AdamW (decoupled weight decay, bias
-- correction, as torch.optim.AdamW) and SGD. The updates themselves are ops
-- in the program's op list; state lives in the program's arena.
local M = {}

function M.adamw(o)
  o = o or {}
  return {optimizer = "adamw", lr = o.lr or 1e-4, betas = o.betas or {0.9, 0.999}, eps = o.eps or 1e-8,
          weight_decay = o.weight_decay or 1e-2}
end

function M.sgd(o)
  o = o or {}
  return {optimizer = "sgd", lr = o.lr or 1e-3, weight_decay = o.weight_decay or 0}
end

-- Learning-rate schedules, as diffusers' and transformers' get_scheduler:
-- M.schedule{name =, lr =, steps = T, warmup = W, cycles =, power =, lr_end =}
-- returns lr(k), the rate of optimizer step k (k = 0 for the first step, as a
-- LambdaLR stepped after each optimizer step gives it). After a linear warmup
-- from 0 over W steps: "constant" (also without warmup), "constant_with_warmup",
-- "linear" (to 0 at step T), "cosine" (half a cosine to 0 at T; cycles = 0.5),
-- "cosine_with_restarts" (cycles = 1 hard restarts), "polynomial" (to lr_end =
-- 1e-7 at T, power = 1).
M.SCHEDULES = {"constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial"}

local function factor(o, k)
  local W, T = o.warmup or 0, o.steps
  if o.name == "constant" and W == 0 then return 1 end
  if k < W then return k / math.max(1, W) end
  if o.name == "constant" or o.name == "constant_with_warmup" then return 1 end
  local progress = (k - W) / math.max(1, T - W)
  if o.name == "linear" then return math.max(0, (T - k) / math.max(1, T - W)) end
  if o.name == "cosine" then
    return math.max(0, 0.5 * (1 + math.cos(math.pi * (o.cycles or 0.5) * 2 * progress)))
  end
  if o.name == "cosine_with_restarts" then
    if progress >= 1 then return 0 end
    return math.max(0, 0.5 * (1 + math.cos(math.pi * (((o.cycles or 1) * progress) % 1))))
  end
  -- polynomial
  local lr_end, power = o.lr_end or 1e-7, o.power or 1
  if k > T then return lr_end / o.lr end
  local remaining = 1 - (k - W) / math.max(1, T - W)
  return ((o.lr - lr_end) * remaining ^ power + lr_end) / o.lr
end

function M.schedule(o)
  local known = false
  for _, n in ipairs(M.SCHEDULES) do known = known or n == o.name end
  if not known then
    error("unknown learning-rate schedule '" .. tostring(o.name) .. "' (" .. table.concat(M.SCHEDULES, ", ") .. ")", 2)
  end
  if type(o.lr) ~= "number" or o.lr <= 0 then error("a schedule needs a positive lr, got " .. tostring(o.lr), 2) end
  if math.type(o.warmup or 0) ~= "integer" or (o.warmup or 0) < 0 then
    error("warmup must be a whole number of steps >= 0, got " .. tostring(o.warmup), 2)
  end
  if o.name ~= "constant" and o.name ~= "constant_with_warmup" and (math.type(o.steps) ~= "integer" or o.steps < 1) then
    error("schedule '" .. o.name .. "' needs the number of training steps, got " .. tostring(o.steps), 2)
  end
  return function(k) return o.lr * factor(o, k) end
end

-- merges optimizer settings into a compile table
function M.apply(opt, compile)
  for k, v in pairs(opt) do compile[k] = v end
  return compile
end

return M
