-- Training states for exact resume: trainable parameters, optimizer state and
-- the step in one .safetensors file per save (written atomically: temp file,
-- fsync, rename), with the data position and the run's settings as metadata.
-- The newest K files are kept; any one of them resumes the run.
local ck = require "ck"

local M = {}

local function name_of(step) return string.format("state-%09d.safetensors", step) end

-- the saved states in dir, oldest first
function M.list(dir)
  local names = ck.listdir(dir)
  local out = {}
  for _, n in ipairs(names or {}) do
    if n:match("^state%-%d+%.safetensors$") then out[#out + 1] = dir .. "/" .. n end
  end
  table.sort(out)
  return out
end

-- paths this process saved (they need no checking before a prune)
local written = {}

-- true when path is a state: it opens, and its step (metadata ck.step) is the
-- number in its name; a stray file that only has a state's name is not one
local function verified(path)
  if written[path] then return true end
  local ok, f = pcall(ck.safetensors, path)
  if not ok then return false end
  local ok2, meta = pcall(f.metadata, f)
  f:close()
  local n = path:match("state%-(%d+)%.safetensors$")
  return ok2 and type(meta) == "table" and n ~= nil and tonumber(meta["ck.step"]) == tonumber(n)
end

-- meta: a table of strings (settings, data position); keep: how many to keep
function M.save(p, dir, meta, keep)
  assert(ck.mkdir(dir))
  local entries = {}
  for _, name in ipairs(p:state_tensors()) do entries[#entries + 1] = {name, name} end
  local md = {["ck.step"] = tostring(p.steps), ["ck.updates"] = tostring(p.updates), ["ck.micro"] = tostring(p.micro)}
  for k, v in pairs(meta or {}) do md[k] = tostring(v) end
  local path = dir .. "/" .. name_of(p.steps)
  p:save(path, entries, {metadata = md})
  written[path] = true
  M.prune(dir, keep)
end

-- removes all but the newest keep states, and the temp files of saves a kill
-- cut short (a run killed between a save and its prune leaves one more; the
-- next save or resume prunes it). Only states this process wrote or that
-- verify (they open and their step is their name's) count or are removed: a
-- stray file named like a state (state-999999999.safetensors) is left alone
-- and keeps no good state from being kept.
function M.prune(dir, keep)
  local all, good = M.list(dir), {}
  for _, path in ipairs(all) do
    if verified(path) then good[#good + 1] = path end
  end
  for i = 1, #good - (keep or 3) do
    os.remove(good[i])
    written[good[i]] = nil
  end
  -- a run killed while writing a state leaves its temp file (path.tmp.<pid>);
  -- no save is under way while this one prunes, so every such file is stale
  for _, n in ipairs(ck.listdir(dir) or {}) do
    if n:match("^state%-%d+%.safetensors%.tmp%.%d+$") then os.remove(dir .. "/" .. n) end
  end
end

-- the newest state in dir that verifies (a file cut short by a crash, or a
-- stray file with a state's name, is passed over)
function M.latest(dir)
  local all = M.list(dir)
  for i = #all, 1, -1 do
    if verified(all[i]) then return all[i] end
  end
  return nil
end

-- Loads a state into p and returns its metadata; settings (a table of strings)
-- must match those saved.
function M.load(p, path, settings)
  local f <close> = ck.safetensors(path)
  local meta = f:metadata()
  for k, v in pairs(settings or {}) do
    if meta[k] ~= tostring(v) then
      error(string.format("%s: saved with %s = %s, this run has %s", path, k, tostring(meta[k]), tostring(v)), 2)
    end
  end
  local map = {}
  for _, name in ipairs(p:state_tensors()) do map[name] = name end
  p:load(f, map)
  p.steps = math.tointeger(tonumber(meta["ck.step"])) or error(path .. ": no step in the state", 2)
  -- AdamW's step count: behind the step count when a guard skipped updates
  p.updates = math.tointeger(tonumber(meta["ck.updates"])) or p.steps
  -- gradient accumulation: the steps summed into the saved gradient sums
  p.micro = math.tointeger(tonumber(meta["ck.micro"])) or 0
  return meta
end

return M
