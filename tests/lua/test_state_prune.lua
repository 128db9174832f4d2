-- ck.state prunes only states it can trust: files this run saved, or files
-- that open and whose step (metadata ck.step) is the number in their name. A
-- stray file named like a state (garbage, an empty file, a safetensors file
-- with no step or another step, a newer number than any save) never counts
-- among the kept states, so --keep-states N keeps N good states, and
-- state.latest passes such files over.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local state = require "ck.state"
local T = require "check"

local tmp = string.format("out/test_state_prune.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))

local function build()
  local g = ck.graph()
  local x, t = g:input("x", {4, 2}), g:input("t", {4, 1})
  local loss = ck.mse_loss(ck.linear(x, g:param("w", {1, 2})), t)
  return g:compile{loss = loss, optimizer = "adamw", lr = 1e-2, seed = 1, device = "cpu"}
end

local function put(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
end

local function names(dir)
  local out = {}
  for _, n in ipairs(ck.listdir(dir) or {}) do out[#out + 1] = n end
  table.sort(out)
  return table.concat(out, " ")
end

-- each stray: a file name and how to make it in dir
local strays = {
  {"garbage", function(p) put(p, "not a safetensors file at all") end},
  {"empty", function(p) put(p, "") end},
  {"no step", function(p) ck.write_safetensors(p, {{"x", {1}, {1}}}) end},
  {"another step", function(p) ck.write_safetensors(p, {{"x", {1}, {1}}}, {["ck.step"] = "5"}) end},
}

for _, keep in ipairs({1, 2}) do
  for si, s in ipairs(strays) do
    for _, when in ipairs({"before", "between"}) do
      local dir = string.format("%s/k%d_%d_%s", tmp, keep, si, when)
      assert(ck.mkdir(dir))
      local stray = dir .. "/state-999999999.safetensors"
      local p = build()
      p:set("x", {1, 2, 3, 4, 5, 6, 7, 8})
      p:set("t", {1, 0, 1, 0})
      if when == "before" then s[2](stray) end
      for step = 1, 4 do
        p:step()
        state.save(p, dir, {run = "a"}, keep)
        if when == "between" and step == 2 then s[2](stray) end
      end
      local good = {}
      for _, path in ipairs(state.list(dir)) do
        if not path:find("999999999", 1, true) then good[#good + 1] = path:match("[^/]+$") end
      end
      local want = keep == 1 and "state-000000004.safetensors" or "state-000000003.safetensors state-000000004.safetensors"
      T.ok(table.concat(good, " ") == want,
           string.format("keep %d, a stray (%s) %s the saves: the newest %d good states stay (%s)", keep, s[1], when,
                         keep, names(dir)))
      T.ok(ck.listdir(dir) and io.open(stray) ~= nil, "the stray file itself is left alone (" .. s[1] .. ")")
      local latest = state.latest(dir)
      T.ok(latest and latest:match("state%-000000004%.safetensors$"),
           "state.latest passes the stray over: " .. tostring(latest))
      -- a later process (no memory of what it wrote) prunes the same way
      package.loaded["ck.state"] = nil
      local fresh = require "ck.state"
      fresh.prune(dir, keep)
      local after = {}
      for _, path in ipairs(fresh.list(dir)) do
        if not path:find("999999999", 1, true) then after[#after + 1] = path:match("[^/]+$") end
      end
      T.ok(table.concat(after, " ") == want, "a resumed run's prune keeps them too (" .. names(dir) .. ")")
      state = fresh
      for _, n in ipairs(ck.listdir(dir) or {}) do os.remove(dir .. "/" .. n) end
      os.remove(dir)
    end
  end
end

os.remove(tmp)
T.done()
