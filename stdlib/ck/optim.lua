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

-- merges optimizer settings into a compile table
function M.apply(opt, compile)
  for k, v in pairs(opt) do compile[k] = v end
  return compile
end

return M
