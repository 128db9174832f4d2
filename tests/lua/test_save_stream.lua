-- p:save reads each tensor from the program only as it writes it: the file is
-- byte for byte what ck.write_safetensors (the copying writer) makes of the
-- values p:get returns, in F32, F16 and BF16, for fp32 tensors (read in place)
-- and bf16-stored frozen weights (read through the program's host copy of one
-- tensor at a time); the entries are read raw, so metamethods on them never
-- run; and p:load reads the file back into the arena exactly.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local tmp = string.format("out/test_save_stream.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local function path(name) return tmp .. "/" .. name end

local function bytes(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function build(frozen)
  local g = ck.graph()
  local x = g:input("x", {2, 3})
  local w = g:param("lin.weight", {4, 3})
  local b = g:param("lin.bias", {4}, {init = "normal", std = 3})
  local f1 = g:param("base.a", {5, 3}, {trainable = false, init = "normal", std = 100})
  local f2 = g:param("base.b", {5, 7}, {trainable = false, init = "uniform", a = -1e-3, b = 1e-3})
  local y1, y2 = ck.matmul(ck.linear(x, f1), f2), ck.linear(x, w, b)
  return g, g:compile{outputs = {y1, y2}, seed = 3, frozen = frozen, device = "cpu"}, {w, b, f1, f2}
end

for _, frozen in ipairs({"fp32", "bf16"}) do
  local _, p, params = build(frozen ~= "fp32" and frozen or nil)
  for _, dtype in ipairs({"F32", "F16", "BF16"}) do
    local entries, list = {{"step", value = 7}}, {{"step", {}, {7}}}
    for _, t in ipairs(params) do
      entries[#entries + 1] = {t.name, t}
      list[#list + 1] = {t.name, t.shape, p:get(t)}
    end
    local meta = {kind = "test", dtype = dtype}
    p:save(path("saved.safetensors"), entries, {metadata = meta, dtype = dtype})
    ck.write_safetensors(path("copied.safetensors"), list, meta, dtype)
    T.ok(bytes(path("saved.safetensors")) == bytes(path("copied.safetensors")),
      string.format("p:save of %s weights as %s is byte for byte the copying writer's file", frozen, dtype))
  end
  local _, q = build(frozen ~= "fp32" and frozen or nil)
  local entries, map = {}, {}
  for _, t in ipairs(params) do
    entries[#entries + 1] = {t.name, t}
    map[t.name] = t.name
  end
  p:save(path("f32.safetensors"), entries)
  local f <close> = ck.safetensors(path("f32.safetensors"))
  q:load(f, map)
  local same = true
  for _, t in ipairs(params) do
    local a, b = p:get(t.name), q:get(t.name)
    for i = 1, #a do same = same and a[i] == b[i] end
  end
  T.ok(same, string.format("p:load reads a saved %s program back exactly", frozen))
end

do -- metamethods on the entries are never consulted: only raw fields count
  local _, p, params = build()
  local entries = setmetatable({}, {
    __index = function(_, k) error("__index ran for " .. tostring(k)) end,
    __len = function() error("__len ran") end,
  })
  entries[1] = setmetatable({params[1].name, params[1]}, {__index = function() error("__index ran on an entry") end})
  entries[2] = {params[2].name, params[2].name}
  local ok, err = pcall(p.save, p, path("raw.safetensors"), entries)
  T.ok(ok, "p:save reads its entries raw: " .. tostring(err))
  local f <close> = ck.safetensors(path("raw.safetensors"))
  local keys = f:keys()
  T.ok(#keys == 2 and f:has("lin.weight") and f:has("lin.bias"), "the file holds exactly the raw entries")
end

for _, n in ipairs(ck.listdir(tmp) or {}) do os.remove(tmp .. "/" .. n) end
os.remove(tmp)
T.done()
