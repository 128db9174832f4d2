-- Checkpoint policies for g:compile{checkpoint = ...}: which activations
-- backward keeps and which it recomputes. Each constructor returns a policy
-- table that the C core (vm/plan/policy.c) decides on; a plain Lua function
-- function(t) return "save" | "recompute" end is a policy too, called once per
-- candidate with {op, scope, shape, bytes, flops, block, where}.
local M = {}

local UNITS = {B = 1, KB = 1e3, MB = 1e6, GB = 1e9, TB = 1e12, KiB = 2 ^ 10, MiB = 2 ^ 20, GiB = 2 ^ 30, TiB = 2 ^ 40}

-- "15 GiB", "512MiB", 1e9 -> bytes
function M.bytes(v)
  if type(v) == "number" then
    if v <= 0 then error("a size must be positive, got " .. v, 3) end
    return v
  end
  local n, unit = tostring(v):match("^%s*([%d.]+)%s*(%a*)%s*$")
  local f = UNITS[unit ~= "" and unit or "B"]
  if not n or not tonumber(n) or not f then
    error("not a size: '" .. tostring(v) .. "' (use bytes or a unit: 15 GiB, 512 MiB)", 3)
  end
  return tonumber(n) * f
end

function M.none() return {kind = "none"} end

-- recompute the inside of every scope that matches a pattern ('*' is one
-- dotted component): blocks{"down_blocks.2", "mid_block", "up_blocks.*.attentions.*"}
function M.blocks(patterns)
  if type(patterns) == "string" then patterns = {patterns} end
  if type(patterns) ~= "table" or #patterns == 0 then error("blocks: give a list of scope patterns", 2) end
  return {kind = "blocks", patterns = patterns}
end

-- diffusers' gradient checkpointing: every ResnetBlock2D and every
-- BasicTransformerBlock of a UNet, every double and single block of a Flux
-- transformer (the patterns of the family the model is not match nothing)
M.DIFFUSERS_BLOCKS = {
  "*.*.resnets.*", "mid_block.resnets.*",
  "*.*.attentions.*.transformer_blocks.*", "mid_block.attentions.*.transformer_blocks.*",
  "transformer_blocks.*", "single_transformer_blocks.*",
}
function M.diffusers() return {kind = "blocks", patterns = M.DIFFUSERS_BLOCKS, any = true} end

-- every n-th block of the block sequence (diffusers' blocks in forward order)
function M.every_n(n)
  if math.type(n) ~= "integer" or n < 1 then error("every_n: n must be a positive integer", 2) end
  return {kind = "every_n", n = n}
end

-- Chen et al. 2016: the block sequence cut into ceil(sqrt(n)) segments
function M.sqrt_n() return {kind = "sqrt_n"} end

-- recompute the outputs of cheap ops; keep matmul, conv and attention outputs
function M.selective(o)
  return {kind = "selective", recompute = o and o.recompute}
end

-- the least recompute FLOPs whose planned peak fits: budget("15 GiB"), budget(1e9), budget("62%") of none's peak
function M.budget(v)
  local pct = type(v) == "string" and v:match("^%s*([%d.]+)%%%s*$")
  if pct then
    local f = tonumber(pct) / 100
    if not f or f <= 0 then error("budget: bad percentage '" .. v .. "'", 2) end
    return {kind = "budget", fraction = f, label = v}
  end
  return {kind = "budget", bytes = M.bytes(v), label = tostring(v)}
end

-- budget's aim by an exact solver (CBC, vm/plan/optimal.c) within a time
-- limit: optimal("80%"), optimal("6 GiB", 300); the budget search's decision
-- when the solver finds none better in time
function M.optimal(v, seconds)
  local b = M.budget(v)
  if seconds ~= nil and (type(seconds) ~= "number" or not (seconds > 0 and seconds <= 86400)) then
    error("optimal: seconds must be a number in (0, 86400], got " .. tostring(seconds), 2)
  end
  return {kind = "optimal", bytes = b.bytes, fraction = b.fraction, seconds = seconds,
          label = b.label .. (seconds and ":" .. seconds .. "s" or "")}
end

-- no recompute if the plan fits the device with headroom, else the least
-- recompute that fits. device: its size (bytes or '24 GiB'); without one,
-- ck.fit reads the free memory of the device the run uses (g:compile needs it)
function M.auto(o)
  o = o or {}
  local headroom = o.headroom or 0.1
  if type(headroom) ~= "number" or headroom < 0 or headroom >= 1 then
    error("auto: headroom must be a number in [0, 1), got " .. tostring(o.headroom), 2)
  end
  local device = o.device ~= nil and M.bytes(o.device) or nil
  return {kind = "auto", device = device, headroom = headroom, label = o.device ~= nil and tostring(o.device) or nil}
end

-- "none", "diffusers", "selective", "sqrt_n", "every_n:2", "budget:62%", "budget:4GiB", "blocks:mid_block",
-- "auto", "auto:24GiB", "optimal:80%", "optimal:6GiB:300s"
function M.parse(s)
  local name, arg = tostring(s):match("^%s*([%w_]+)%s*:?%s*(.-)%s*$")
  if name == "none" then return M.none()
  elseif name == "diffusers" then return M.diffusers()
  elseif name == "selective" then return M.selective()
  elseif name == "sqrt_n" then return M.sqrt_n()
  elseif name == "every_n" then
    local n = arg == "" and 2 or math.tointeger(tonumber(arg))
    if not n or n < 1 then error("every_n: '" .. arg .. "' is not a positive integer", 2) end
    return M.every_n(n)
  elseif name == "budget" and arg ~= "" then return M.budget(arg)
  elseif name == "optimal" and arg ~= "" then
    local b, sec = arg:match("^(.-)%s*:%s*([%d.]+)%s*s$")
    if b then
      local n = tonumber(sec)
      if not n or n <= 0 then error("optimal: bad time limit '" .. sec .. "s'", 2) end
      return M.optimal(b, n)
    end
    return M.optimal(arg)
  elseif name == "auto" then return M.auto{device = arg ~= "" and arg or nil}
  elseif name == "blocks" and arg ~= "" then
    local pats = {}
    for p in arg:gmatch("[^,;]+") do pats[#pats + 1] = p end
    return M.blocks(pats)
  end
  error("unknown checkpoint policy '" .. tostring(s) ..
    "' (none, diffusers, selective, sqrt_n, every_n:N, budget:SIZE|PCT%, optimal:SIZE|PCT%[:SECONDSs], " ..
    "blocks:PATTERN, auto[:SIZE])", 2)
end

-- a short name for tables and reports
function M.name(p)
  if type(p) == "function" then return "function" end
  if p.shown then return p.shown end -- ck.fit's choice: a decision at a room, named as what it chose
  if p.kind == "budget" then return "budget:" .. p.label end
  if p.kind == "optimal" then return "optimal:" .. p.label end
  if p.kind == "every_n" then return "every_n:" .. p.n end
  if p.kind == "auto" then return p.label and "auto:" .. p.label or "auto" end
  if p.kind == "blocks" then
    if p.patterns == M.DIFFUSERS_BLOCKS then return "diffusers" end
    return "blocks:" .. table.concat(p.patterns, ",")
  end
  return p.kind
end

return M
