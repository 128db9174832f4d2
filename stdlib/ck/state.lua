-- Training states for exact resume: trainable parameters, optimizer state and
-- the step in one .safetensors file per save (written atomically: temp file,
-- fsync, rename), with the data position and the run's settings as metadata.
-- The newest K files are kept; any one of them resumes the run.
local ck = require "ck"

local M = {}

-- the largest step a state can have: its name holds the step in 9 digits,
-- which keeps names in step order
M.MAX_STEP = 999999999

local function name_of(step) return string.format("state-%09d.safetensors", step) end

-- A whole number read from a file: meta[key] as decimal digits, lo..hi
-- (default when absent and one is given); else nil and a message naming the
-- file and the key
local function count_of(meta, key, path, lo, hi, default)
  local s = meta[key]
  if s == nil and default ~= nil then return default end
  local n = type(s) == "string" and #s <= 18 and s:match("^%d+$") and math.tointeger(tonumber(s))
  if n and n >= lo and n <= hi then return n end
  local shown = s == nil and "missing" or string.format("'%s'", #tostring(s) > 40 and tostring(s):sub(1, 40) .. "..." or s)
  return nil, string.format("%s: %s is %s, not a whole number from %d to %d", path, key, shown, lo, hi)
end

-- the same, raising the message at the caller's line
function M.count(meta, key, path, lo, hi, default)
  local n, err = count_of(meta, key, path, lo, hi, default)
  if not n then error(err, 2) end
  return n
end

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

-- the locks this process holds, by directory: held until the VM closes, and
-- dropped by the kernel when the process ends however it ends
local locks = {}

-- Takes dir's lock (the file dir/lock) for the rest of the run, so that two
-- runs never save into or prune the same directory: the second is refused
-- with a line naming dir and the holder's pid. Taking it again is a no-op.
function M.lock(dir)
  dir = dir:gsub("/+$", ""):gsub("^%./+", "")
  if dir == "" then dir = "." end
  if locks[dir] then return end
  assert(ck.mkdir(dir))
  local lock, pid = ck.lock(dir .. "/lock")
  if lock == nil then error(pid, 2) end
  if not lock then
    error(string.format("state directory '%s' is in use by another run%s; two runs saving into one directory " ..
      "would break each other's states", dir, pid > 0 and string.format(" (pid %d)", pid) or ""), 2)
  end
  locks[dir] = lock
end

-- true when path is a state: it opens, and its step (metadata ck.step) is the
-- number in its name; a stray file that only has a state's name is not one
local function verified(path)
  if written[path] then return true end
  local ok, f = pcall(ck.safetensors, path)
  if not ok then return false end
  local ok2, meta = pcall(f.metadata, f)
  f:close()
  local n = path:match("state%-(%d+)%.safetensors$")
  if not (ok2 and type(meta) == "table" and n ~= nil and #n <= 9) then return false end
  return count_of(meta, "ck.step", path, 0, M.MAX_STEP) == math.tointeger(tonumber(n))
end

-- meta: a table of strings (settings, data position); keep: how many to keep.
-- On a data-parallel job every rank calls it: rank 0 writes the file, and
-- under ZeRO-1 the other ranks send it the optimizer state they own, so the
-- file holds the whole job's state in an unsharded program's layout (which
-- any number of ranks, sharded or not, resumes).
function M.save(p, dir, meta, keep)
  if ck.rank() > 0 then return p:send_state() end
  if p.steps > M.MAX_STEP then error(string.format("step %d: a state's step is at most %d", p.steps, M.MAX_STEP), 2) end
  M.lock(dir)
  local entries = {}
  for _, name in ipairs(p:state_tensors()) do entries[#entries + 1] = {name, name} end
  local md = {["ck.step"] = tostring(p.steps), ["ck.updates"] = tostring(p.updates), ["ck.micro"] = tostring(p.micro)}
  for k, v in pairs(meta or {}) do md[k] = tostring(v) end
  local path = dir .. "/" .. name_of(p.steps)
  p:save(path, entries, {metadata = md, shards = true})
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
  M.lock(dir)
  local all, good = M.list(dir), {}
  for _, path in ipairs(all) do
    if verified(path) then good[#good + 1] = path end
  end
  for i = 1, #good - (keep or 3) do
    os.remove(good[i])
    written[good[i]] = nil
  end
  -- a run killed while writing a state leaves its temp file (path.tmp.<pid>);
  -- this process holds the directory's lock and saves nothing while it
  -- prunes, so every such file is stale
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
  -- every count is checked before the program takes it: a state is a file,
  -- and ck.step = 2^63-1 would overflow the step after it
  local step, err = count_of(meta, "ck.step", path, 0, M.MAX_STEP)
  local updates, micro
  -- AdamW's step count: behind the step count when a guard skipped updates
  if step then updates, err = count_of(meta, "ck.updates", path, 0, step, step) end
  -- gradient accumulation: the steps summed into the saved gradient sums
  if updates then micro, err = count_of(meta, "ck.micro", path, 0, step, 0) end
  if not micro then error(err, 2) end
  if not pcall(function() p.micro = micro end) then
    error(string.format("%s: ck.micro is %d, more steps than this run's gradient accumulation sums", path, micro), 2)
  end
  local map = {}
  for _, name in ipairs(p:state_tensors()) do map[name] = name end
  p:load(f, map)
  p.steps, p.updates = step, updates
  return meta
end

return M
